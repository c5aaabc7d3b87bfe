//! vgpuctl: the operator's tool. `engines` configures container engines for vgpu (and takes it back);
//! `status` shows quotas and usage per container and GPU from the state root, read-only. The `monitor`
//! verb is the `vgpu_monitor` crate's.
pub mod clidocs;
pub mod engines;
pub mod fsutil;
pub mod status;
