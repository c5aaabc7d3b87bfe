//! The real NVML, loaded at run time with `libloading` from the name or path the config gives
//! (`nvml_library`; the e2e suites point it at the project's fake `libnvidia-ml.so.1`), initialised once
//! and shut down when dropped. Loading at run time lets the shim and the hook run on nodes without a GPU
//! driver until a container actually asks for a quota. Not here: the trait (`api`).
//!
//! A binding of our own rather than the `nvml-wrapper` crate (0.13 read), for three calls it does not have
//! or makes differently: it has no `nvmlDeviceSetMemoryLimits_v1` (r615+, the driver's per-cgroup limit);
//! its `memory_info` calls `nvmlDeviceGetMemoryInfo_v2`, where vgpu compares against v1's figures (those
//! the interposer's NVML answers and the fake NVML's v1/v2 split are built on: changing it would change
//! what the monitor reports); and its process list is `_v3` (`_v2` behind a feature), never the
//! unversioned list the monitor falls back to on older drivers. `nvmlDeviceGetMemoryInfo_v2` is asked
//! beside v1 only for its `reserved` (the driver's own part of v1's used), and the graphics and MPS client
//! lists beside the compute list, so the monitor can tell memory no process's figure shows
//! (`vgpu_monitor::unattributed`). The binding is 23 symbols; every optional one is asked for by name and
//! its absence is an answer (no minor number, no utilisation, no process list, no reserve), never a
//! failure to load.

use super::api::{
    architecture_name, AddressingMode, GpuModel, GpuReading, HostGpu, Nvml, NvmlError,
};
use std::ffi::{c_char, c_int, c_uint, CStr, CString};

use lists::{samples, Device, Lister, UtilFn, SUCCESS};
const NOT_SUPPORTED: c_int = 3;
const FUNCTION_NOT_FOUND: c_int = 13;
/// Room for a UUID or a name (NVML's own buffer sizes are 80 and 96).
const BUF: usize = 96;

/// nvmlMemory_t.
#[repr(C)]
#[derive(Default)]
struct Memory {
    total: u64,
    free: u64,
    used: u64,
}

/// nvmlMemory_v2_t: `used` without the driver's reserve, which is `reserved`.
#[repr(C)]
struct MemoryV2 {
    version: c_uint,
    total: u64,
    reserved: u64,
    free: u64,
    used: u64,
}

/// `nvmlMemory_v2`: NVML_STRUCT_VERSION(Memory, 2), the struct's size with the version in the high byte.
const MEMORY_V2: c_uint = std::mem::size_of::<MemoryV2>() as c_uint | (2 << 24);

/// nvmlUtilization_t.
#[repr(C)]
#[derive(Default)]
struct Utilization {
    gpu: c_uint,
    memory: c_uint,
}

/// `nvmlDeviceAddressingMode_v1_t` (nvml.h of r575+): a struct version, then one of
/// `nvmlDeviceAddressingModeType_t` (0 none, 1 HMM, 2 ATS).
#[repr(C)]
struct AddressingModeV1 {
    version: c_uint,
    value: c_uint,
}

/// `nvmlDeviceAddressingMode_v1`: NVML_STRUCT_VERSION(DeviceAddressingMode, 1), the struct's size with
/// the version in the high byte.
const ADDRESSING_MODE_V1: c_uint = std::mem::size_of::<AddressingModeV1>() as c_uint | (1 << 24);

/// `nvmlSetMemoryLimits_v1_t` (nvml.h of r615+; the same layout as NVIDIA's own Python bindings).
#[repr(C)]
struct SetMemoryLimits {
    name_space: *const c_char,
    soft: u64,
    hard: u64,
}

type StringFn = unsafe extern "C" fn(Device, *mut c_char, c_uint) -> c_int;
type SetFn = unsafe extern "C" fn(Device, *const SetMemoryLimits) -> c_int;
type AddressingFn = unsafe extern "C" fn(Device, *mut AddressingModeV1) -> c_int;
type SystemStringFn = unsafe extern "C" fn(*mut c_char, c_uint) -> c_int;
type ArchitectureFn = unsafe extern "C" fn(Device, *mut c_uint) -> c_int;
type CapabilityFn = unsafe extern "C" fn(Device, *mut c_int, *mut c_int) -> c_int;
type CudaVersionFn = unsafe extern "C" fn(*mut c_int) -> c_int;

/// NVML, loaded and initialised.
pub struct Library {
    lib: String,
    count: unsafe extern "C" fn(*mut c_uint) -> c_int,
    by_index: unsafe extern "C" fn(c_uint, *mut Device) -> c_int,
    by_uuid: Option<unsafe extern "C" fn(*const c_char, *mut Device) -> c_int>,
    uuid: StringFn,
    name: Option<StringFn>,
    memory: unsafe extern "C" fn(Device, *mut Memory) -> c_int,
    memory_v2: Option<unsafe extern "C" fn(Device, *mut MemoryV2) -> c_int>,
    minor: Option<unsafe extern "C" fn(Device, *mut c_uint) -> c_int>,
    utilization: Option<unsafe extern "C" fn(Device, *mut Utilization) -> c_int>,
    process_utilization: Option<UtilFn>,
    lister: Option<Lister>,
    /// The graphics and MPS client lists (each where NVML has it).
    other_listers: Vec<Lister>,
    set_limits: Option<SetFn>,
    addressing: Option<AddressingFn>,
    driver_version: Option<SystemStringFn>,
    cuda_version: Option<CudaVersionFn>,
    architecture: Option<ArchitectureFn>,
    capability: Option<CapabilityFn>,
    error_string: Option<unsafe extern "C" fn(c_int) -> *const c_char>,
    shutdown: unsafe extern "C" fn() -> c_int,
    /// nvmlInit_v2 succeeded: dropping shuts NVML down.
    initialised: bool,
    /// Per GPU index, the newest process-utilisation sample's timestamp seen so far: the next reading asks
    /// only for samples after it (see `samples`).
    util_seen: std::sync::Mutex<std::collections::HashMap<u32, u64>>,
    // Last: the function pointers above live as long as the library stays loaded.
    _lib: libloading::Library,
}

// SAFETY: NVML is thread-safe (nvml.h: "all NVML functions are thread-safe"); the pointers are code.
unsafe impl Send for Library {}
// SAFETY: as above.
unsafe impl Sync for Library {}

/// libloading's error with its cause: its `Display` says only "dlopen failed"; dlopen's own reason
/// (`dlerror()`: the file not found, a missing dependency, the wrong ELF class) is its `source`.
fn with_cause(e: &libloading::Error) -> String {
    match std::error::Error::source(e) {
        Some(cause) => format!("{e}: {cause}"),
        None => e.to_string(),
    }
}

impl Library {
    /// Loads and initialises NVML from `lib` (a soname or a path).
    pub fn load(lib: &str) -> Result<Library, NvmlError> {
        // SAFETY: loading the vendor library the configuration names runs its initialisers, as for any
        // NVML user.
        let l = unsafe { libloading::Library::new(lib) }.map_err(|e| NvmlError::Load {
            lib: lib.into(),
            error: with_cause(&e),
        })?;
        let missing = |symbol| NvmlError::MissingSymbol {
            lib: lib.into(),
            symbol,
        };
        // SAFETY (every `get`): the Rust types match the prototypes in nvml.h; the pointers are used only
        // while `l` is loaded (it is kept in the struct).
        let n = unsafe {
            macro_rules! need {
                ($n:literal) => {
                    *l.get(concat!($n, "\0").as_bytes())
                        .map_err(|_| missing($n))?
                };
            }
            macro_rules! maybe {
                ($n:literal) => {
                    l.get(concat!($n, "\0").as_bytes()).ok().map(|s| *s)
                };
            }
            let lister = match maybe!("nvmlDeviceGetComputeRunningProcesses_v3")
                .or(maybe!("nvmlDeviceGetComputeRunningProcesses_v2"))
            {
                Some(f) => Some(Lister::V2(f)),
                None => maybe!("nvmlDeviceGetComputeRunningProcesses").map(Lister::V1),
            };
            let graphics = match maybe!("nvmlDeviceGetGraphicsRunningProcesses_v3")
                .or(maybe!("nvmlDeviceGetGraphicsRunningProcesses_v2"))
            {
                Some(f) => Some(Lister::V2(f)),
                None => maybe!("nvmlDeviceGetGraphicsRunningProcesses").map(Lister::V1),
            };
            let mps = match maybe!("nvmlDeviceGetMPSComputeRunningProcesses_v3")
                .or(maybe!("nvmlDeviceGetMPSComputeRunningProcesses_v2"))
            {
                Some(f) => Some(Lister::V2(f)),
                None => maybe!("nvmlDeviceGetMPSComputeRunningProcesses").map(Lister::V1),
            };
            let init: unsafe extern "C" fn() -> c_int = need!("nvmlInit_v2");
            let n = Library {
                lib: lib.into(),
                count: need!("nvmlDeviceGetCount_v2"),
                by_index: need!("nvmlDeviceGetHandleByIndex_v2"),
                by_uuid: maybe!("nvmlDeviceGetHandleByUUID"),
                uuid: need!("nvmlDeviceGetUUID"),
                name: maybe!("nvmlDeviceGetName"),
                memory: need!("nvmlDeviceGetMemoryInfo"),
                memory_v2: maybe!("nvmlDeviceGetMemoryInfo_v2"),
                minor: maybe!("nvmlDeviceGetMinorNumber"),
                utilization: maybe!("nvmlDeviceGetUtilizationRates"),
                process_utilization: maybe!("nvmlDeviceGetProcessUtilization"),
                lister,
                other_listers: graphics.into_iter().chain(mps).collect(),
                set_limits: maybe!("nvmlDeviceSetMemoryLimits_v1"),
                addressing: maybe!("nvmlDeviceGetAddressingMode"),
                driver_version: maybe!("nvmlSystemGetDriverVersion"),
                cuda_version: maybe!("nvmlSystemGetCudaDriverVersion_v2")
                    .or(maybe!("nvmlSystemGetCudaDriverVersion")),
                architecture: maybe!("nvmlDeviceGetArchitecture"),
                capability: maybe!("nvmlDeviceGetCudaComputeCapability"),
                error_string: maybe!("nvmlErrorString"),
                shutdown: need!("nvmlShutdown"),
                initialised: false,
                util_seen: Default::default(),
                _lib: l,
            };
            let mut n = n;
            let rc = init();
            if rc != SUCCESS {
                return Err(NvmlError::Init {
                    lib: lib.into(),
                    error: n.error(rc),
                });
            }
            n.initialised = true;
            n
        };
        Ok(n)
    }

    /// NVML's words for `rc`, with the number.
    fn error(&self, rc: c_int) -> String {
        if let Some(f) = self.error_string {
            // SAFETY: nvmlErrorString returns a static NUL-terminated string or NULL.
            let p = unsafe { f(rc) };
            if !p.is_null() {
                // SAFETY: non-NULL, NUL-terminated, static (per nvml.h).
                let s = unsafe { CStr::from_ptr(p) }.to_string_lossy();
                return format!("{s} (error {rc})");
            }
        }
        format!("error {rc}")
    }

    fn call(&self, call: impl Into<String>, rc: c_int) -> Result<(), NvmlError> {
        match rc {
            SUCCESS => Ok(()),
            rc => Err(NvmlError::Call {
                call: call.into(),
                error: self.error(rc),
            }),
        }
    }

    fn count(&self) -> Result<u32, NvmlError> {
        let mut n: c_uint = 0;
        // SAFETY: valid out-pointer.
        self.call("nvmlDeviceGetCount_v2", unsafe { (self.count)(&mut n) })?;
        Ok(n)
    }

    fn handle(&self, index: u32) -> Result<Device, NvmlError> {
        let mut dev: Device = std::ptr::null_mut();
        // SAFETY: valid out-pointer; index < count.
        let rc = unsafe { (self.by_index)(index, &mut dev) };
        self.call(format!("nvmlDeviceGetHandleByIndex_v2({index})"), rc)?;
        Ok(dev)
    }

    fn uuid_and_memory(&self, index: u32, dev: Device) -> Result<(String, Memory), NvmlError> {
        // SAFETY: `b` holds `l` bytes (`string`).
        let uuid = string(|b, l| unsafe { (self.uuid)(dev, b, l) }).map_err(|rc| {
            self.call(format!("nvmlDeviceGetUUID({index})"), rc)
                .unwrap_err()
        })?;
        let mut mem = Memory::default();
        // SAFETY: `mem` has nvmlMemory_t's layout.
        let rc = unsafe { (self.memory)(dev, &mut mem) };
        self.call(format!("nvmlDeviceGetMemoryInfo({index})"), rc)?;
        Ok((uuid, mem))
    }

    fn reading(&self, index: u32) -> Result<GpuReading, NvmlError> {
        let dev = self.handle(index)?;
        let (uuid, mem) = self.uuid_and_memory(index, dev)?;
        // SAFETY (closure): `b` holds `l` bytes.
        let name = self
            .name
            .and_then(|f| string(|b, l| unsafe { f(dev, b, l) }).ok())
            .unwrap_or_default();
        let utilization = self.utilization.and_then(|f| {
            let mut u = Utilization::default();
            // SAFETY: `u` has nvmlUtilization_t's layout.
            (unsafe { f(dev, &mut u) } == SUCCESS).then(|| f64::from(u.gpu.min(100)) / 100.0)
        });
        let reserved = self.memory_v2.and_then(|f| {
            let mut m = MemoryV2 {
                version: MEMORY_V2,
                total: 0,
                reserved: 0,
                free: 0,
                used: 0,
            };
            // SAFETY: `m` has nvmlMemory_v2_t's layout, its version set.
            (unsafe { f(dev, &mut m) } == SUCCESS).then_some(m.reserved.min(mem.used))
        });
        let mut unmeasured_processes = 0;
        let mut listed = |l: &Lister| {
            let (ps, unmeasured) = l.list(dev)?;
            unmeasured_processes += unmeasured;
            Some(ps)
        };
        let processes = self.lister.as_ref().and_then(&mut listed);
        let others: Vec<_> = self.other_listers.iter().filter_map(&mut listed).collect();
        let other_processes = (!others.is_empty()).then(|| others.concat());
        let hint = processes.as_ref().map_or(0, |p| p.len());
        let process_utilization = self.process_utilization.and_then(|f| {
            let mut seen = self.util_seen.lock().unwrap_or_else(|p| p.into_inner());
            let since = seen.get(&index).copied().unwrap_or(0);
            let (fractions, newest) = samples(dev, f, hint, since)?;
            seen.insert(index, newest.max(since));
            Some(fractions)
        });
        Ok(GpuReading {
            index,
            uuid,
            name,
            total: mem.total,
            used: mem.used,
            reserved,
            utilization,
            processes,
            other_processes,
            unmeasured_processes,
            process_utilization,
        })
    }
}

impl Nvml for Library {
    fn devices(&self) -> Result<Vec<HostGpu>, NvmlError> {
        (0..self.count()?)
            .map(|index| {
                let dev = self.handle(index)?;
                let (uuid, mem) = self.uuid_and_memory(index, dev)?;
                let minor = self.minor.and_then(|f| {
                    let mut m: c_uint = 0;
                    // SAFETY: `m` is a valid out-pointer.
                    (unsafe { f(dev, &mut m) } == SUCCESS).then_some(m)
                });
                Ok(HostGpu {
                    index,
                    uuid,
                    total_memory: mem.total,
                    minor,
                })
            })
            .collect()
    }

    fn driver_version(&self) -> Result<Option<String>, NvmlError> {
        let Some(f) = self.driver_version else {
            return Ok(None);
        };
        // SAFETY: `b` holds `l` bytes (`string`).
        string(|b, l| unsafe { f(b, l) })
            .map(Some)
            .map_err(|rc| self.call("nvmlSystemGetDriverVersion", rc).unwrap_err())
    }

    fn cuda_driver_version(&self) -> Result<Option<u32>, NvmlError> {
        let Some(f) = self.cuda_version else {
            return Ok(None);
        };
        let mut v: c_int = 0;
        // SAFETY: a valid out-pointer.
        self.call("nvmlSystemGetCudaDriverVersion_v2", unsafe { f(&mut v) })?;
        Ok(u32::try_from(v).ok())
    }

    fn model(&self, index: u32) -> Result<GpuModel, NvmlError> {
        let dev = self.handle(index)?;
        // An answer of NOT_SUPPORTED (or no such call) is no figure; any other failure is an error.
        let answered = |call: &str, rc: c_int| match rc {
            NOT_SUPPORTED | FUNCTION_NOT_FOUND => Ok(false),
            rc => self.call(format!("{call}({index})"), rc).map(|()| true),
        };
        let name = match self.name {
            // SAFETY: `b` holds `l` bytes (`string`).
            Some(f) => match string(|b, l| unsafe { f(dev, b, l) }) {
                Ok(n) => Some(n),
                Err(rc) => {
                    answered("nvmlDeviceGetName", rc)?;
                    None
                }
            },
            None => None,
        };
        let architecture = match self.architecture {
            Some(f) => {
                let mut a: c_uint = 0;
                // SAFETY: a valid out-pointer.
                let rc = unsafe { f(dev, &mut a) };
                answered("nvmlDeviceGetArchitecture", rc)?
                    .then(|| architecture_name(a).map(str::to_string))
                    .flatten()
            }
            None => None,
        };
        let compute_capability = match self.capability {
            Some(f) => {
                let (mut major, mut minor): (c_int, c_int) = (0, 0);
                // SAFETY: valid out-pointers.
                let rc = unsafe { f(dev, &mut major, &mut minor) };
                answered("nvmlDeviceGetCudaComputeCapability", rc)?
                    .then(|| Some((u32::try_from(major).ok()?, u32::try_from(minor).ok()?)))
                    .flatten()
            }
            None => None,
        };
        Ok(GpuModel {
            name: name.filter(|n| !n.is_empty()),
            architecture,
            compute_capability,
        })
    }

    fn has_memory_limits(&self) -> bool {
        self.set_limits.is_some()
    }

    fn readings(&self) -> Result<Vec<GpuReading>, NvmlError> {
        (0..self.count()?).map(|i| self.reading(i)).collect()
    }

    fn set_memory_limits(
        &self,
        cgroup: &CStr,
        limits: &[(String, u64)],
    ) -> Result<bool, NvmlError> {
        let Some(set) = self.set_limits else {
            return Ok(false);
        };
        let by_uuid = self.by_uuid.ok_or(NvmlError::MissingSymbol {
            lib: self.lib.clone(),
            symbol: "nvmlDeviceGetHandleByUUID",
        })?;
        for (uuid, bytes) in limits {
            let by = format!("nvmlDeviceGetHandleByUUID({uuid})");
            let c_uuid = CString::new(uuid.as_str()).map_err(|_| NvmlError::Call {
                call: by.clone(),
                error: "the UUID holds a NUL byte".into(),
            })?;
            let mut dev: Device = std::ptr::null_mut();
            // SAFETY: a NUL-terminated UUID and a valid out-pointer.
            self.call(by, unsafe { by_uuid(c_uuid.as_ptr(), &mut dev) })?;
            let l = SetMemoryLimits {
                name_space: cgroup.as_ptr(),
                soft: *bytes,
                hard: *bytes,
            };
            // SAFETY: `l` has nvmlSetMemoryLimits_v1_t's layout; its string outlives the call.
            match unsafe { set(dev, &l) } {
                NOT_SUPPORTED | FUNCTION_NOT_FOUND => return Ok(false),
                rc => self.call(
                    format!(
                        "nvmlDeviceSetMemoryLimits_v1({uuid}, {})",
                        cgroup.to_string_lossy()
                    ),
                    rc,
                )?,
            }
        }
        Ok(true)
    }

    fn addressing_mode(&self, index: u32) -> Result<Option<AddressingMode>, NvmlError> {
        let Some(f) = self.addressing else {
            return Ok(None);
        };
        let dev = self.handle(index)?;
        let mut m = AddressingModeV1 {
            version: ADDRESSING_MODE_V1,
            value: 0,
        };
        // SAFETY: `m` has nvmlDeviceAddressingMode_v1_t's layout, its version set.
        match unsafe { f(dev, &mut m) } {
            NOT_SUPPORTED | FUNCTION_NOT_FOUND => Ok(None),
            rc => {
                self.call(format!("nvmlDeviceGetAddressingMode({index})"), rc)?;
                match m.value {
                    0 => Ok(Some(AddressingMode::None)),
                    1 => Ok(Some(AddressingMode::Hmm)),
                    2 => Ok(Some(AddressingMode::Ats)),
                    v => Err(NvmlError::Call {
                        call: format!("nvmlDeviceGetAddressingMode({index})"),
                        error: format!("unknown addressing mode {v}"),
                    }),
                }
            }
        }
    }
}

impl Drop for Library {
    fn drop(&mut self) {
        if self.initialised {
            // SAFETY: paired with the successful nvmlInit_v2 of `load`.
            unsafe { (self.shutdown)() };
        }
    }
}

/// A string NVML writes into a buffer of ours; Err: NVML's return code.
fn string(f: impl FnOnce(*mut c_char, c_uint) -> c_int) -> Result<String, c_int> {
    let mut buf = [0 as c_char; BUF];
    let rc = f(buf.as_mut_ptr(), BUF as c_uint);
    if rc != SUCCESS {
        return Err(rc);
    }
    buf[BUF - 1] = 0;
    // SAFETY: NUL-terminated within the buffer (last byte forced).
    Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned())
}

mod lists;

#[cfg(test)]
mod tests;
