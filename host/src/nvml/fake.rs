//! NVML in memory, for the tests of the host tools: GPUs whose readings the test sets, and the per-cgroup
//! limits they were given. Not here: the real library (`library`); the project's fake
//! `libnvidia-ml.so.1` (tests/fake-nvml), which the e2e suites load through the real binding.

use super::api::{AddressingMode, GpuModel, GpuReading, HostGpu, Nvml, NvmlError};
use std::ffi::CStr;
use std::sync::Mutex;

/// GPUs in memory.
#[derive(Debug, Default)]
pub struct Fake {
    /// What `readings` answers; `devices` answers their index, UUID and total (minor = index).
    pub gpus: Vec<GpuReading>,
    /// The driver has the per-cgroup limit call (r615+).
    pub memory_limits: bool,
    /// What `driver_version` answers (`None`: NVML without the call).
    pub driver_version: Option<String>,
    /// Limits set: (cgroup, GPU UUID, bytes).
    pub limits_set: Mutex<Vec<(String, String, u64)>>,
    /// Every call fails with this error (a broken driver).
    pub fail: Option<String>,
    /// What `addressing_mode` answers for every GPU (None: a driver without the call).
    pub addressing: Option<AddressingMode>,
    /// What `cuda_driver_version` answers (`Fake::gpus`: 13000, CUDA 13.0).
    pub cuda_version: Option<u32>,
    /// The architecture and compute capability `model` answers for every GPU, its name being the
    /// reading's (`Fake::gpus`: Hopper, 9.0).
    pub model: GpuModel,
}

impl Fake {
    /// `n` idle GPUs of `total` bytes each, UUIDs `GPU-fa4ec0de-0000-4000-8000-00000000000<i>` (as the
    /// fake libnvidia-ml names them).
    pub fn gpus(n: u32, total: u64) -> Fake {
        Fake {
            gpus: (0..n)
                .map(|i| GpuReading {
                    index: i,
                    uuid: format!("GPU-fa4ec0de-0000-4000-8000-{i:012}"),
                    name: "Fake GPU".into(),
                    total,
                    processes: Some(vec![]),
                    ..Default::default()
                })
                .collect(),
            driver_version: Some("580.65.06".into()),
            cuda_version: Some(13000),
            model: GpuModel {
                name: None,
                architecture: Some("Hopper".into()),
                compute_capability: Some((9, 0)),
            },
            ..Default::default()
        }
    }

    fn check(&self, call: &str) -> Result<(), NvmlError> {
        match &self.fail {
            Some(e) => Err(NvmlError::Call {
                call: call.into(),
                error: e.clone(),
            }),
            None => Ok(()),
        }
    }
}

impl Nvml for Fake {
    fn devices(&self) -> Result<Vec<HostGpu>, NvmlError> {
        self.check("nvmlDeviceGetCount_v2")?;
        Ok(self
            .gpus
            .iter()
            .map(|g| HostGpu {
                index: g.index,
                uuid: g.uuid.clone(),
                total_memory: g.total,
                minor: Some(g.index),
            })
            .collect())
    }

    fn driver_version(&self) -> Result<Option<String>, NvmlError> {
        self.check("nvmlSystemGetDriverVersion")?;
        Ok(self.driver_version.clone())
    }

    fn cuda_driver_version(&self) -> Result<Option<u32>, NvmlError> {
        self.check("nvmlSystemGetCudaDriverVersion_v2")?;
        Ok(self.cuda_version)
    }

    fn model(&self, index: u32) -> Result<GpuModel, NvmlError> {
        self.check("nvmlDeviceGetName")?;
        let g = self
            .gpus
            .iter()
            .find(|g| g.index == index)
            .ok_or_else(|| NvmlError::Call {
                call: format!("nvmlDeviceGetHandleByIndex_v2({index})"),
                error: "Invalid Argument (error 2)".into(),
            })?;
        Ok(GpuModel {
            name: Some(g.name.clone()),
            ..self.model.clone()
        })
    }

    fn has_memory_limits(&self) -> bool {
        self.memory_limits
    }

    fn readings(&self) -> Result<Vec<GpuReading>, NvmlError> {
        self.check("nvmlDeviceGetCount_v2")?;
        Ok(self.gpus.clone())
    }

    fn set_memory_limits(
        &self,
        cgroup: &CStr,
        limits: &[(String, u64)],
    ) -> Result<bool, NvmlError> {
        self.check("nvmlDeviceSetMemoryLimits_v1")?;
        if !self.memory_limits {
            return Ok(false);
        }
        let mut set = self.limits_set.lock().unwrap_or_else(|e| e.into_inner());
        for (uuid, bytes) in limits {
            if !self.gpus.iter().any(|g| &g.uuid == uuid) {
                return Err(NvmlError::Call {
                    call: format!("nvmlDeviceGetHandleByUUID({uuid})"),
                    error: "Not Found (error 6)".into(),
                });
            }
            set.push((cgroup.to_string_lossy().into_owned(), uuid.clone(), *bytes));
        }
        Ok(true)
    }

    fn addressing_mode(&self, index: u32) -> Result<Option<AddressingMode>, NvmlError> {
        self.check("nvmlDeviceGetAddressingMode")?;
        if !self.gpus.iter().any(|g| g.index == index) {
            return Err(NvmlError::Call {
                call: format!("nvmlDeviceGetHandleByIndex_v2({index})"),
                error: "Invalid Argument (error 2)".into(),
            });
        }
        Ok(self.addressing)
    }
}
