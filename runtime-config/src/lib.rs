//! vgpuctl: the operator's tool. `engines` configures container engines for vgpu (and takes it back);
//! `status` shows quotas and usage per container and GPU from the state root, read-only; `monitor` exports
//! them to Prometheus with NVML's truth and runs the watchdog.
pub mod clidocs;
pub mod engines;
pub mod fsutil;
pub mod monitor;
pub mod status;
