//! vgpuctl: the operator's tool. `engines` configures container engines for vgpu (and takes it back);
//! `status` shows quotas and usage per container and GPU from the state root, read-only; `cdi` writes vgpu's
//! devices as a Container Device Interface spec; `doctor` checks a node's setup, one line per check; `update` changes a running container's quota
//! and share live. The `monitor`
//! verb is the `vgpu_monitor` crate's.
pub mod cdi;
pub mod clidocs;
pub mod doctor;
pub mod engines;
pub mod fsutil;
pub mod status;
pub mod update;
