//! The one NVML binding of the host tools (the shim's and the hook's planning and admission, the driver's
//! per-cgroup limit, `vgpuctl status` and the monitor), behind the [`Nvml`] trait so that each can be
//! tested with the [`Fake`], as the interposer's `Driver` seam is. Not here: which GPUs a container gets
//! (`vgpu_oci::gpus`), which container a process belongs to (the monitor's `watchdog`).
//!
//! * [`api`]: the trait, what it answers ([`HostGpu`], [`GpuReading`]) and its errors.
//! * [`library`]: the real library, loaded by name or path at run time.
//! * [`fake`]: GPUs in memory, for tests.

pub mod api;
pub mod fake;
pub mod library;

pub use api::{architecture_name, AddressingMode, GpuModel, GpuReading, HostGpu, Nvml, NvmlError};
pub use fake::Fake;
pub use library::Library;

/// Loads and initialises the NVML library `lib` (a soname for the loader or a path), as the trait.
pub fn open(lib: &str) -> Result<Box<dyn Nvml>, NvmlError> {
    Ok(Box::new(Library::load(lib)?))
}
