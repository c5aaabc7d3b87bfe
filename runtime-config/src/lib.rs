//! vgpuctl: the operator's tool. `engines` configures container engines for vgpu (and takes it back);
//! `status` shows quotas and usage per container and GPU from the state root, read-only; `doctor` checks a
//! node's setup, one line per check; `update` changes a running container's quota and share live. The `cdi`
//! verb's spec is `vgpu_host::cdi`'s (the DRA driver writes it too); the `monitor` verb is the
//! `vgpu_monitor` crate's.
pub mod clidocs;
pub mod containers;
pub mod doctor;
pub mod engines;
pub mod fsutil;
pub mod status;
pub mod update;
