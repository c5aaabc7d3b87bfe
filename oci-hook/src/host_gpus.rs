//! The host's GPUs as the shim and the hook plan and admit against them: index, UUID, memory size and
//! device-node minor number, from the host tools' one NVML binding (`vgpu_host::nvml`, a trait with a
//! fake). Not here: which of them a container gets (`crate::gpus`).
//!
//! NVML is loaded when a container actually asks for a quota (config key `nvml_library`), so the shim and
//! the hook run on nodes without a GPU driver.

pub use vgpu_host::nvml::{open, Fake, HostGpu, Nvml, NvmlError};

/// Lists the host's GPUs through the NVML library `lib` (a soname or a path); NVML is shut down after.
pub fn list_gpus(lib: &str) -> Result<Vec<HostGpu>, NvmlError> {
    open(lib)?.devices()
}
