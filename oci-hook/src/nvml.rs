//! The host's GPUs as NVML sees them: index, UUID, memory size and device-node minor number.
//! Not here: which of them a container gets (`crate::gpus`).
//!
//! NVML is loaded at run time (`nvml_library` in the config) so the shim and hook run on nodes without a
//! GPU driver until a container actually asks for a quota.

use anyhow::{anyhow, bail, Context, Result};
use libloading::{Library, Symbol};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

/// One GPU of the host.
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

type NvmlDevice = *mut c_void;

#[repr(C)]
#[derive(Default)]
struct NvmlMemory {
    total: u64,
    free: u64,
    used: u64,
}

const NVML_SUCCESS: c_int = 0;
const UUID_BUFFER: usize = 96;

/// Lists the host's GPUs through the NVML library `lib` (a soname or a path).
pub fn list_gpus(lib: &str) -> Result<Vec<HostGpu>> {
    // SAFETY: loading NVML runs its initialisers; it is the vendor library the configuration names,
    // loaded the same way every NVML user loads it.
    let nvml =
        unsafe { Library::new(lib) }.map_err(|e| anyhow!("cannot load NVML ({lib}): {e}"))?;
    let api = Api::new(&nvml).with_context(|| format!("NVML library {lib}"))?;
    // SAFETY: the symbols have NVML's documented signatures; nvmlInit_v2 takes no arguments.
    let rc = unsafe { (api.init)() };
    if rc != NVML_SUCCESS {
        bail!("NVML ({lib}) failed to initialise: {}", api.error(rc));
    }
    let out = api.devices();
    // SAFETY: paired with the successful nvmlInit_v2 above.
    unsafe { (api.shutdown)() };
    out
}

/// `nvmlSetMemoryLimits_v1_t` (nvml.h of r615+; the same layout as NVIDIA's own Python bindings).
#[repr(C)]
struct SetMemoryLimits {
    name_space: *const c_char,
    soft: u64,
    hard: u64,
}

const NVML_ERROR_NOT_SUPPORTED: c_int = 3;
const NVML_ERROR_FUNCTION_NOT_FOUND: c_int = 13;

/// Sets each GPU's hard (and soft) memory limit for the cgroup `cgroup` (its full sysfs path) with
/// `nvmlDeviceSetMemoryLimits_v1`. Ok(false): the driver has no such call (older than r615), nothing set.
pub fn set_memory_limits(lib: &str, cgroup: &CStr, limits: &[(String, u64)]) -> Result<bool> {
    // SAFETY: as in `list_gpus`.
    let nvml =
        unsafe { Library::new(lib) }.map_err(|e| anyhow!("cannot load NVML ({lib}): {e}"))?;
    let api = Api::new(&nvml).with_context(|| format!("NVML library {lib}"))?;
    type SetFn = unsafe extern "C" fn(NvmlDevice, *const SetMemoryLimits) -> c_int;
    type ByUuid = unsafe extern "C" fn(*const c_char, *mut NvmlDevice) -> c_int;
    // SAFETY: the types match nvml.h's prototypes.
    let (set, by_uuid) = unsafe {
        (
            nvml.get::<SetFn>(b"nvmlDeviceSetMemoryLimits_v1\0").ok(),
            nvml.get::<ByUuid>(b"nvmlDeviceGetHandleByUUID\0")
                .map_err(|_| anyhow!("NVML ({lib}): missing symbol nvmlDeviceGetHandleByUUID"))?,
        )
    };
    let Some(set) = set else { return Ok(false) };
    // SAFETY: nvmlInit_v2 takes no arguments.
    let rc = unsafe { (api.init)() };
    if rc != NVML_SUCCESS {
        bail!("NVML ({lib}) failed to initialise: {}", api.error(rc));
    }
    let result = (|| {
        for (uuid, bytes) in limits {
            let c_uuid = std::ffi::CString::new(uuid.as_str())?;
            let mut dev: NvmlDevice = std::ptr::null_mut();
            // SAFETY: a NUL-terminated UUID and a valid out-pointer.
            let rc = unsafe { by_uuid(c_uuid.as_ptr(), &mut dev) };
            if rc != NVML_SUCCESS {
                bail!("nvmlDeviceGetHandleByUUID({uuid}): {}", api.error(rc));
            }
            let l = SetMemoryLimits {
                name_space: cgroup.as_ptr(),
                soft: *bytes,
                hard: *bytes,
            };
            // SAFETY: `l` has nvmlSetMemoryLimits_v1_t's layout; its string outlives the call.
            match unsafe { set(dev, &l) } {
                NVML_SUCCESS => {}
                NVML_ERROR_NOT_SUPPORTED | NVML_ERROR_FUNCTION_NOT_FOUND => return Ok(false),
                rc => bail!(
                    "nvmlDeviceSetMemoryLimits_v1({uuid}, {}): {}",
                    cgroup.to_string_lossy(),
                    api.error(rc)
                ),
            }
        }
        Ok(true)
    })();
    // SAFETY: paired with the successful nvmlInit_v2 above.
    unsafe { (api.shutdown)() };
    result
}

struct Api<'l> {
    init: Symbol<'l, unsafe extern "C" fn() -> c_int>,
    shutdown: Symbol<'l, unsafe extern "C" fn() -> c_int>,
    count: Symbol<'l, unsafe extern "C" fn(*mut c_uint) -> c_int>,
    by_index: Symbol<'l, unsafe extern "C" fn(c_uint, *mut NvmlDevice) -> c_int>,
    uuid: Symbol<'l, unsafe extern "C" fn(NvmlDevice, *mut c_char, c_uint) -> c_int>,
    memory: Symbol<'l, unsafe extern "C" fn(NvmlDevice, *mut NvmlMemory) -> c_int>,
    minor: Option<Symbol<'l, unsafe extern "C" fn(NvmlDevice, *mut c_uint) -> c_int>>,
    error_string: Option<Symbol<'l, unsafe extern "C" fn(c_int) -> *const c_char>>,
}

impl<'l> Api<'l> {
    fn new(l: &'l Library) -> Result<Self> {
        // SAFETY (every `get` below): the Rust types match the C prototypes in nvml.h.
        unsafe {
            let sym = |n: &str| anyhow!("missing symbol {n}");
            Ok(Api {
                init: l.get(b"nvmlInit_v2\0").map_err(|_| sym("nvmlInit_v2"))?,
                shutdown: l.get(b"nvmlShutdown\0").map_err(|_| sym("nvmlShutdown"))?,
                count: l
                    .get(b"nvmlDeviceGetCount_v2\0")
                    .map_err(|_| sym("nvmlDeviceGetCount_v2"))?,
                by_index: l
                    .get(b"nvmlDeviceGetHandleByIndex_v2\0")
                    .map_err(|_| sym("nvmlDeviceGetHandleByIndex_v2"))?,
                uuid: l
                    .get(b"nvmlDeviceGetUUID\0")
                    .map_err(|_| sym("nvmlDeviceGetUUID"))?,
                memory: l
                    .get(b"nvmlDeviceGetMemoryInfo\0")
                    .map_err(|_| sym("nvmlDeviceGetMemoryInfo"))?,
                minor: l.get(b"nvmlDeviceGetMinorNumber\0").ok(),
                error_string: l.get(b"nvmlErrorString\0").ok(),
            })
        }
    }

    fn error(&self, rc: c_int) -> String {
        if let Some(f) = &self.error_string {
            // SAFETY: nvmlErrorString returns a static NUL-terminated string or NULL.
            let p = unsafe { f(rc) };
            if !p.is_null() {
                // SAFETY: non-NULL, NUL-terminated, static (per nvml.h).
                return format!(
                    "{} (error {rc})",
                    unsafe { CStr::from_ptr(p) }.to_string_lossy()
                );
            }
        }
        format!("error {rc}")
    }

    fn devices(&self) -> Result<Vec<HostGpu>> {
        let mut n: c_uint = 0;
        // SAFETY: `n` is a valid out-pointer.
        let rc = unsafe { (self.count)(&mut n) };
        if rc != NVML_SUCCESS {
            bail!("nvmlDeviceGetCount_v2: {}", self.error(rc));
        }
        let mut out = Vec::with_capacity(n as usize);
        for index in 0..n {
            let mut dev: NvmlDevice = std::ptr::null_mut();
            // SAFETY: `dev` is a valid out-pointer; index < count.
            let rc = unsafe { (self.by_index)(index, &mut dev) };
            if rc != NVML_SUCCESS {
                bail!("nvmlDeviceGetHandleByIndex_v2({index}): {}", self.error(rc));
            }
            let mut buf = [0 as c_char; UUID_BUFFER];
            // SAFETY: `buf` holds UUID_BUFFER bytes, the size passed.
            let rc = unsafe { (self.uuid)(dev, buf.as_mut_ptr(), UUID_BUFFER as c_uint) };
            if rc != NVML_SUCCESS {
                bail!("nvmlDeviceGetUUID({index}): {}", self.error(rc));
            }
            // SAFETY: NVML NUL-terminates within the buffer; the last byte is never written past.
            buf[UUID_BUFFER - 1] = 0;
            let uuid = unsafe { CStr::from_ptr(buf.as_ptr()) }
                .to_string_lossy()
                .into_owned();
            let mut mem = NvmlMemory::default();
            // SAFETY: `mem` has nvmlMemory_t's layout.
            let rc = unsafe { (self.memory)(dev, &mut mem) };
            if rc != NVML_SUCCESS {
                bail!("nvmlDeviceGetMemoryInfo({index}): {}", self.error(rc));
            }
            let minor = self.minor.as_ref().and_then(|f| {
                let mut m: c_uint = 0;
                // SAFETY: `m` is a valid out-pointer.
                (unsafe { f(dev, &mut m) } == NVML_SUCCESS).then_some(m)
            });
            out.push(HostGpu {
                index,
                uuid,
                total_memory: mem.total,
                minor,
            });
        }
        Ok(out)
    }
}
