//! The node's GPUs as the ResourceSlice publishes them: each GPU ([`HostGpu`]: index, UUID, memory) with
//! what a claim selects on beside its memory — its product name, architecture and compute capability, and
//! the driver's version and the CUDA version it supports — read from NVML in one go. A rescan compares
//! these whole, so a driver upgrade is republished like a changed GPU. Not here: how they are written in
//! the slice (`crate::slice`).

use vgpu_host::nvml::{GpuModel, HostGpu, Nvml, NvmlError};

/// One GPU of the node and what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeGpu {
    pub gpu: HostGpu,
    pub model: GpuModel,
    /// The driver's version as NVML writes it ("580.65.06").
    pub driver_version: Option<String>,
    /// The CUDA version the driver supports, NVML's number (13000 for 13.0).
    pub cuda_driver_version: Option<u32>,
}

/// Every GPU NVML lists, in its order, with its model and the driver's versions.
pub fn read(nvml: &dyn Nvml) -> Result<Vec<NodeGpu>, NvmlError> {
    let driver_version = nvml.driver_version()?;
    let cuda_driver_version = nvml.cuda_driver_version()?;
    nvml.devices()?
        .into_iter()
        .map(|gpu| {
            Ok(NodeGpu {
                model: nvml.model(gpu.index)?,
                gpu,
                driver_version: driver_version.clone(),
                cuda_driver_version,
            })
        })
        .collect()
}

/// The GPUs alone (what the plugin's prepare needs).
pub fn host_gpus(gpus: &[NodeGpu]) -> Vec<HostGpu> {
    gpus.iter().map(|g| g.gpu.clone()).collect()
}

/// A version as a DRA `version` attribute takes it (semantic versioning 2.0.0: three numbers, no leading
/// zeros): the driver's "580.65.06" is 580.65.6, "550.54" is 550.54.0. None when it is not two or three
/// dot-separated numbers (the attribute is then left out rather than refused by the API server).
pub fn semver(version: &str) -> Option<String> {
    let parts: Vec<u64> = version
        .split('.')
        .map(|p| {
            (!p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
                .then(|| p.parse().ok())
                .flatten()
        })
        .collect::<Option<_>>()?;
    match parts.as_slice() {
        [a, b] => Some(format!("{a}.{b}.0")),
        [a, b, c] => Some(format!("{a}.{b}.{c}")),
        _ => None,
    }
}

/// NVML's CUDA version number as a version: 13000 is 13.0.0, 12080 is 12.8.0.
pub fn cuda_semver(v: u32) -> String {
    format!("{}.{}.0", v / 1000, (v % 1000) / 10)
}

#[cfg(test)]
mod tests;
