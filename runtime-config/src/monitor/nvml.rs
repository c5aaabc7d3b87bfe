//! The host's NVML for the monitor: each GPU's name, memory, utilisation and compute processes (host PIDs
//! with their memory). NVML is loaded at run time with `libloading` and stays loaded and initialised for the
//! monitor's life. Not here: which container a process belongs to (`procs`, `watchdog`).

use anyhow::{anyhow, bail, Result};
use libloading::Library;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

type Device = *mut c_void;
const SUCCESS: c_int = 0;
const INSUFFICIENT_SIZE: c_int = 7;
const BUF: usize = 96;

/// One GPU as NVML reports it now.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuReading {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub total: u64,
    pub used: u64,
    /// 0.0–1.0; `None` when NVML cannot tell.
    pub utilization: Option<f64>,
    /// Compute processes: (host PID, bytes); `None` when the list could not be read.
    pub processes: Option<Vec<(u32, u64)>>,
    /// Each process's SM utilisation 0.0–1.0 (its latest sample); `None` when NVML cannot tell.
    pub process_utilization: Option<Vec<(u32, f64)>>,
}

#[repr(C)]
#[derive(Default)]
struct Memory {
    total: u64,
    free: u64,
    used: u64,
}

#[repr(C)]
#[derive(Default)]
struct Utilization {
    gpu: c_uint,
    memory: c_uint,
}

/// nvmlProcessInfo_v2_t (the `_v2` and `_v3` lists).
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct ProcessV2 {
    pid: c_uint,
    used: u64,
    gpu_instance: c_uint,
    compute_instance: c_uint,
}

/// nvmlProcessUtilizationSample_t.
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct UtilSample {
    pid: c_uint,
    time_stamp: u64,
    sm: c_uint,
    mem: c_uint,
    enc: c_uint,
    dec: c_uint,
}

type UtilFn = unsafe extern "C" fn(Device, *mut UtilSample, *mut c_uint, u64) -> c_int;

/// nvmlProcessInfo_v1_t (the list without a version suffix).
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct ProcessV1 {
    pid: c_uint,
    used: u64,
}

type ListFn<T> = unsafe extern "C" fn(Device, *mut c_uint, *mut T) -> c_int;

enum Lister {
    V2(ListFn<ProcessV2>),
    V1(ListFn<ProcessV1>),
}

/// NVML, loaded and initialised.
pub struct Nvml {
    count: unsafe extern "C" fn(*mut c_uint) -> c_int,
    by_index: unsafe extern "C" fn(c_uint, *mut Device) -> c_int,
    uuid: unsafe extern "C" fn(Device, *mut c_char, c_uint) -> c_int,
    name: Option<unsafe extern "C" fn(Device, *mut c_char, c_uint) -> c_int>,
    memory: unsafe extern "C" fn(Device, *mut Memory) -> c_int,
    utilization: Option<unsafe extern "C" fn(Device, *mut Utilization) -> c_int>,
    process_utilization: Option<UtilFn>,
    lister: Lister,
    shutdown: unsafe extern "C" fn() -> c_int,
    // Last: the function pointers above live as long as the library stays loaded.
    _lib: Library,
}

// SAFETY: NVML is thread-safe (nvml.h: "all NVML functions are thread-safe"); the pointers are code.
unsafe impl Send for Nvml {}
// SAFETY: as above.
unsafe impl Sync for Nvml {}

impl Nvml {
    /// Loads and initialises NVML from `lib` (a soname or a path).
    pub fn load(lib: &str) -> Result<Nvml> {
        // SAFETY: loading the vendor library the configuration names runs its initialisers, as for any
        // NVML user.
        let l =
            unsafe { Library::new(lib) }.map_err(|e| anyhow!("cannot load NVML ({lib}): {e}"))?;
        // SAFETY (every `get`): the Rust types match the prototypes in nvml.h; the pointers are used only
        // while `l` is loaded (it is kept in the struct).
        unsafe {
            macro_rules! need {
                ($n:literal) => {
                    *l.get(concat!($n, "\0").as_bytes())
                        .map_err(|_| anyhow!("NVML ({lib}): missing symbol {}", $n))?
                };
            }
            macro_rules! maybe {
                ($n:literal) => {
                    l.get(concat!($n, "\0").as_bytes()).ok().map(|s| *s)
                };
            }
            let init: unsafe extern "C" fn() -> c_int = need!("nvmlInit_v2");
            let lister = match maybe!("nvmlDeviceGetComputeRunningProcesses_v3")
                .or(maybe!("nvmlDeviceGetComputeRunningProcesses_v2"))
            {
                Some(f) => Lister::V2(f),
                None => Lister::V1(need!("nvmlDeviceGetComputeRunningProcesses")),
            };
            let n = Nvml {
                count: need!("nvmlDeviceGetCount_v2"),
                by_index: need!("nvmlDeviceGetHandleByIndex_v2"),
                uuid: need!("nvmlDeviceGetUUID"),
                name: maybe!("nvmlDeviceGetName"),
                memory: need!("nvmlDeviceGetMemoryInfo"),
                utilization: maybe!("nvmlDeviceGetUtilizationRates"),
                process_utilization: maybe!("nvmlDeviceGetProcessUtilization"),
                lister,
                shutdown: need!("nvmlShutdown"),
                _lib: l,
            };
            let rc = init();
            if rc != SUCCESS {
                bail!("NVML ({lib}) failed to initialise (error {rc})");
            }
            Ok(n)
        }
    }

    /// Every GPU, in NVML's order. A GPU that cannot be read is an error for the whole reading (the
    /// caller reports it and tries again at the next one).
    pub fn read(&self) -> Result<Vec<GpuReading>> {
        let mut n: c_uint = 0;
        // SAFETY: valid out-pointer.
        let rc = unsafe { (self.count)(&mut n) };
        if rc != SUCCESS {
            bail!("nvmlDeviceGetCount_v2: error {rc}");
        }
        (0..n).map(|i| self.gpu(i)).collect()
    }

    fn gpu(&self, index: u32) -> Result<GpuReading> {
        let mut dev: Device = std::ptr::null_mut();
        // SAFETY: valid out-pointer, index < count.
        let rc = unsafe { (self.by_index)(index, &mut dev) };
        if rc != SUCCESS {
            bail!("nvmlDeviceGetHandleByIndex_v2({index}): error {rc}");
        }
        let uuid = string(|b, l| unsafe { (self.uuid)(dev, b, l) })
            .ok_or_else(|| anyhow!("nvmlDeviceGetUUID({index}) failed"))?;
        // SAFETY (closures): `b` holds `l` bytes.
        let name = self
            .name
            .and_then(|f| string(|b, l| unsafe { f(dev, b, l) }))
            .unwrap_or_default();
        let mut mem = Memory::default();
        // SAFETY: `mem` has nvmlMemory_t's layout.
        let rc = unsafe { (self.memory)(dev, &mut mem) };
        if rc != SUCCESS {
            bail!("nvmlDeviceGetMemoryInfo({index}): error {rc}");
        }
        let utilization = self.utilization.and_then(|f| {
            let mut u = Utilization::default();
            // SAFETY: `u` has nvmlUtilization_t's layout.
            (unsafe { f(dev, &mut u) } == SUCCESS).then(|| f64::from(u.gpu.min(100)) / 100.0)
        });
        let processes = match self.lister {
            Lister::V2(f) => list(dev, f, |p: &ProcessV2| (p.pid, p.used)),
            Lister::V1(f) => list(dev, f, |p: &ProcessV1| (p.pid, p.used)),
        };
        let hint = processes.as_ref().map_or(0, |p| p.len());
        let process_utilization = self.process_utilization.and_then(|f| samples(dev, f, hint));
        Ok(GpuReading {
            index,
            uuid,
            name,
            total: mem.total,
            used: mem.used,
            utilization,
            processes,
            process_utilization,
        })
    }
}

impl Drop for Nvml {
    fn drop(&mut self) {
        // SAFETY: paired with the successful nvmlInit_v2 of `load`.
        unsafe { (self.shutdown)() };
    }
}

/// A string NVML writes into a buffer of ours.
fn string(f: impl FnOnce(*mut c_char, c_uint) -> c_int) -> Option<String> {
    let mut buf = [0 as c_char; BUF];
    if f(buf.as_mut_ptr(), BUF as c_uint) != SUCCESS {
        return None;
    }
    buf[BUF - 1] = 0;
    // SAFETY: NUL-terminated within the buffer (last byte forced).
    Some(
        unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned(),
    )
}

/// Per-process SM utilisation: the latest sample of each PID (NVML keeps a buffer of samples; asked
/// from timestamp 0, it returns all of them).
fn samples(dev: Device, f: UtilFn, hint: usize) -> Option<Vec<(u32, f64)>> {
    // Sized from the process list first (one call), grown on INSUFFICIENT_SIZE.
    let mut buf = vec![UtilSample::default(); hint + 16];
    for _ in 0..3 {
        let mut n = buf.len() as c_uint;
        // SAFETY: `buf` holds `n` samples.
        match unsafe { f(dev, buf.as_mut_ptr(), &mut n, 0) } {
            SUCCESS => {
                buf.truncate(n as usize);
                buf.sort_by_key(|s| (s.pid, std::cmp::Reverse(s.time_stamp)));
                buf.dedup_by_key(|s| s.pid);
                return Some(
                    buf.iter()
                        .map(|s| (s.pid, f64::from(s.sm.min(100)) / 100.0))
                        .collect(),
                );
            }
            INSUFFICIENT_SIZE => buf = vec![UtilSample::default(); n as usize + 16],
            _ => return None,
        }
    }
    None
}

/// NVML's list protocol: grow the buffer while it answers INSUFFICIENT_SIZE (processes come and go).
fn list<T: Default + Clone>(
    dev: Device,
    f: ListFn<T>,
    get: impl Fn(&T) -> (u32, u64),
) -> Option<Vec<(u32, u64)>> {
    let mut buf: Vec<T> = vec![T::default(); 64];
    for _ in 0..4 {
        let mut n = buf.len() as c_uint;
        // SAFETY: `buf` holds `n` entries of the struct the function fills.
        let rc = unsafe { f(dev, &mut n, buf.as_mut_ptr()) };
        if rc == SUCCESS {
            buf.truncate(n as usize);
            // NVML reports u64::MAX ("not available") under some virtualisations: no figure to compare.
            return Some(buf.iter().map(&get).filter(|p| p.1 != u64::MAX).collect());
        }
        if rc != INSUFFICIENT_SIZE {
            return None;
        }
        buf = vec![T::default(); n as usize + 64];
    }
    None
}
