//! What the host tools ask NVML, as a trait ([`Nvml`]), and what it answers. Not here: the binding
//! (`library`), the fake (`fake`).

use std::ffi::CStr;

/// One GPU of the host, as the hook plans and admits against it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostGpu {
    /// NVML index on the host.
    pub index: u32,
    /// `GPU-…` UUID.
    pub uuid: String,
    /// Physical memory in bytes.
    pub total_memory: u64,
    /// Minor number of its `/dev/nvidiaN` node, when NVML reports one.
    pub minor: Option<u32>,
}

/// One GPU as NVML reports it now, for the monitor.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuReading {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub total: u64,
    /// `nvmlDeviceGetMemoryInfo`'s used: what processes allocated and the driver's reserve together.
    pub used: u64,
    /// The part of `used` the driver and firmware reserve for themselves (`nvmlDeviceGetMemoryInfo_v2`'s
    /// `reserved`); `None` when NVML has no such call.
    pub reserved: Option<u64>,
    /// 0.0–1.0; `None` when NVML cannot tell.
    pub utilization: Option<f64>,
    /// Compute processes: (host PID, bytes); `None` when the list could not be read.
    pub processes: Option<Vec<(u32, u64)>>,
    /// The graphics and MPS client processes NVML lists beside them: (host PID, bytes), a PID possibly
    /// also in `processes` (a process that does both); `None` when NVML has neither list.
    pub other_processes: Option<Vec<(u32, u64)>>,
    /// Processes NVML listed with no figure (`NVML_VALUE_NOT_AVAILABLE`, as under some virtualisations):
    /// left out of the lists above, so their memory is no per-process figure's.
    pub unmeasured_processes: usize,
    /// Each process's SM utilisation 0.0–1.0 (its latest sample); `None` when NVML cannot tell.
    pub process_utilization: Option<Vec<(u32, f64)>>,
}

/// Whether a GPU's kernels can reach the host's pageable memory (plain `malloc`/`mmap`), as
/// `nvmlDeviceGetAddressingMode` reports it (nvml.h, r575+). Under HMM or ATS the driver may migrate such
/// memory into device memory with no allocation call the interposer sees (docs/libvgpu.md, "Pageable
/// memory: HMM and ATS").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressingMode {
    /// Neither HMM nor ATS is active.
    None,
    /// Heterogeneous Memory Management: the driver mirrors the CPU's page tables on the GPU.
    Hmm,
    /// Address Translation Services: the CPU's and the GPU's page tables are one (Grace).
    Ats,
}

impl AddressingMode {
    /// `none`, `hmm` or `ats` (status's words, `--json` included).
    pub fn name(self) -> &'static str {
        match self {
            AddressingMode::None => "none",
            AddressingMode::Hmm => "hmm",
            AddressingMode::Ats => "ats",
        }
    }
}

/// What a GPU is, beyond its memory: what a Kubernetes DRA claim selects on (the DRA driver publishes it as
/// the device's attributes). Each part is `None` where the driver has no such call or says it is not
/// supported there.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuModel {
    /// NVML's product name (`nvmlDeviceGetName`, "NVIDIA H100 80GB HBM3").
    pub name: Option<String>,
    /// The architecture's name ([`architecture_name`] of `nvmlDeviceGetArchitecture`'s number).
    pub architecture: Option<String>,
    /// CUDA compute capability, (major, minor) (`nvmlDeviceGetCudaComputeCapability`, (9, 0) on Hopper).
    pub compute_capability: Option<(u32, u32)>,
}

/// The name of `nvmlDeviceArchitecture_t` `arch` (nvml.h's `NVML_DEVICE_ARCH_*`), as NVIDIA's own tools
/// (go-nvlib) write it; None for an unknown number (`NVML_DEVICE_ARCH_UNKNOWN`, a newer one).
pub fn architecture_name(arch: u32) -> Option<&'static str> {
    Some(match arch {
        2 => "Kepler",
        3 => "Maxwell",
        4 => "Pascal",
        5 => "Volta",
        6 => "Turing",
        7 => "Ampere",
        8 => "Ada Lovelace",
        9 => "Hopper",
        10 => "Blackwell",
        11 => "Orin",
        _ => return None,
    })
}

/// Why NVML could not answer: one line naming the library or the call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NvmlError {
    #[error("cannot load NVML ({lib}): {error}")]
    Load { lib: String, error: String },
    #[error("NVML ({lib}): missing symbol {symbol}")]
    MissingSymbol { lib: String, symbol: &'static str },
    #[error("NVML ({lib}) failed to initialise: {error}")]
    Init { lib: String, error: String },
    /// A call that failed, with its arguments (`nvmlDeviceGetUUID(1)`) and NVML's error.
    #[error("{call}: {error}")]
    Call { call: String, error: String },
}

/// The host's NVML, loaded and initialised (shut down when dropped).
pub trait Nvml: Send + Sync {
    /// Every GPU's index, UUID, memory and device minor, in NVML's order.
    fn devices(&self) -> Result<Vec<HostGpu>, NvmlError>;

    /// The driver's version (`nvmlSystemGetDriverVersion`, "580.65.06"); `Ok(None)`: NVML has no such call.
    fn driver_version(&self) -> Result<Option<String>, NvmlError>;

    /// The CUDA version the driver supports (`nvmlSystemGetCudaDriverVersion_v2`, 13000 for 13.0);
    /// `Ok(None)`: NVML has no such call.
    fn cuda_driver_version(&self) -> Result<Option<u32>, NvmlError>;

    /// What GPU `index` is: its product name, architecture and compute capability.
    fn model(&self, index: u32) -> Result<GpuModel, NvmlError>;

    /// Whether the driver can limit a cgroup's GPU memory (`nvmlDeviceSetMemoryLimits_v1`, r615+): what
    /// `driver_memory_limit` needs.
    fn has_memory_limits(&self) -> bool;

    /// Every GPU's name, memory use, utilisation and compute processes, in NVML's order. A GPU that
    /// cannot be read is an error for the whole reading (the caller tries again at the next one).
    fn readings(&self) -> Result<Vec<GpuReading>, NvmlError>;

    /// Sets each GPU's (by UUID) hard and soft memory limit for the cgroup `cgroup` (its full sysfs path)
    /// with `nvmlDeviceSetMemoryLimits_v1` (r615+). Ok(false): the driver has no such call, nothing set.
    fn set_memory_limits(&self, cgroup: &CStr, limits: &[(String, u64)])
        -> Result<bool, NvmlError>;

    /// Whether HMM or ATS lets GPU `index`'s kernels reach pageable host memory. `Ok(None)`: the driver
    /// has no `nvmlDeviceGetAddressingMode` (before r575), or says the query is not supported there.
    fn addressing_mode(&self, index: u32) -> Result<Option<AddressingMode>, NvmlError>;
}
