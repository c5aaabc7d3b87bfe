//! Fake `libnvidia-ml.so.1`: the NVML calls a GPU memory quota touches, reading the same device
//! state file as the fake `libcuda.so.1` (see `tests/fake-driver.md`). Devices are in physical
//! order: NVML ignores `CUDA_VISIBLE_DEVICES`, like the real one.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use fake_gpu::config::{env_size, mig_devices, mig_uuid_string, pci_bus_id, uuid_string};
use fake_gpu::{Config, Shared};
use std::ffi::{c_char, c_int, c_uint, CStr};
use std::sync::Mutex;

mod unlisted;
mod utilisation;

type Ret = c_uint;
type R = Result<(), Ret>;
type Device = *const u8;

const SUCCESS: Ret = 0;
const UNINITIALIZED: Ret = 1;
const INVALID_ARGUMENT: Ret = 2;
const NOT_FOUND: Ret = 6;
const INSUFFICIENT_SIZE: Ret = 7;
const ARGUMENT_VERSION_MISMATCH: Ret = 25;
const UNKNOWN: Ret = 999;

const DRIVER_VERSION: &str = "580.65.06";
const CUDA_DRIVER_VERSION: c_int = 13000;

static ERRORS: &[(Ret, &str)] = &[
    (0, "Success\0"),
    (1, "Uninitialized\0"),
    (2, "Invalid Argument\0"),
    (3, "Not Supported\0"),
    (4, "Insufficient Permissions\0"),
    (5, "Already Initialized\0"),
    (6, "Not Found\0"),
    (7, "Insufficient Size\0"),
    (9, "Driver Not Loaded\0"),
    (13, "Function Not Found\0"),
    (25, "Argument version mismatch\0"),
    (999, "Unknown Error\0"),
];

struct Nvml {
    refs: u32,
    shared: Option<Shared>,
    reserved: u64,
}

static NVML: Mutex<Nvml> = Mutex::new(Nvml {
    refs: 0,
    shared: None,
    reserved: 0,
});
/// Device handles point into this array: handle i is &HANDLES[i].
static HANDLES: [u8; fake_gpu::MAX_DEVICES] = [0; fake_gpu::MAX_DEVICES];
/// The MIG instance of physical device i (`FAKE_CUDA_MIG`) is &MIG_HANDLES[i].
static MIG_HANDLES: [u8; fake_gpu::MAX_DEVICES] = [0; fake_gpu::MAX_DEVICES];

/// Physical index of a MIG instance handle.
fn mig_index(dev: Device) -> Option<usize> {
    let i = (dev as usize).wrapping_sub(MIG_HANDLES.as_ptr() as usize);
    (i < fake_gpu::MAX_DEVICES && mig_devices().contains(&i)).then_some(i)
}

fn guard(f: impl FnOnce() -> R) -> Ret {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => UNKNOWN,
    }
}

/// Runs `f` with the open state file; NVML_ERROR_UNINITIALIZED before nvmlInit.
/// Device `i`'s memory in use (after reclaiming dead processes): what is charged to it, plus the managed
/// pages the processes active on it pulled in from the host (the fake CUDA's paging model), at most the
/// device, as a real GPU's used memory shows what is resident.
fn device_used(s: &Shared, i: usize) -> u64 {
    s.snapshot();
    let since = fake_gpu::monotonic_ns().saturating_sub(fake_gpu::config::paging_window_ns());
    unlisted::device_used(s, i, since)
}

fn with<T>(f: impl FnOnce(&Shared, u64) -> Result<T, Ret>) -> Result<T, Ret> {
    let n = NVML.lock().unwrap_or_else(|e| e.into_inner());
    match (&n.shared, n.refs) {
        (Some(s), r) if r > 0 => f(s, n.reserved),
        _ => Err(UNINITIALIZED),
    }
}

/// Physical index of a device handle.
fn index(dev: Device) -> Result<usize, Ret> {
    let base = HANDLES.as_ptr() as usize;
    let i = (dev as usize).wrapping_sub(base);
    let n = with(|s, _| Ok(s.ndev()))?;
    if i < n {
        Ok(i)
    } else {
        Err(INVALID_ARGUMENT)
    }
}

unsafe fn out<T>(p: *mut T, v: T) -> R {
    if p.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: non-null out-pointer from the caller.
    unsafe { p.write(v) };
    Ok(())
}

/// Copies `s` NUL-terminated into `buf` of `len` bytes; NVML_ERROR_INSUFFICIENT_SIZE if it does not fit.
unsafe fn copy_str(buf: *mut c_char, len: c_uint, s: &str) -> R {
    if buf.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    if (len as usize) < s.len() + 1 {
        return Err(INSUFFICIENT_SIZE);
    }
    // SAFETY: the buffer holds len >= s.len() + 1 bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr() as *const c_char, buf, s.len());
        *buf.add(s.len()) = 0;
    }
    Ok(())
}

fn init() -> R {
    let mut n = NVML.lock().unwrap_or_else(|e| e.into_inner());
    if n.shared.is_none() {
        let cfg = Config::from_env().map_err(|e| {
            eprintln!("fake-nvml: {e}");
            UNKNOWN
        })?;
        n.shared = Some(Shared::open(&cfg).map_err(|e| {
            eprintln!("fake-nvml: {e}");
            UNKNOWN
        })?);
        n.reserved = env_size("FAKE_NVML_RESERVED_BYTES", 0);
    }
    n.refs += 1;
    Ok(())
}

/// Defines exported NVML functions whose bodies return `R`.
macro_rules! nvml_fn {
    ($(fn $name:ident($($a:ident: $t:ty),* $(,)?) $body:block)*) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> Ret {
            guard(|| -> R { $body })
        }
    )*};
}

mod addressing;
mod architecture;

#[repr(C)]
pub struct PciInfo {
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_subsystem_id: c_uint,
    bus_id: [c_char; 32],
}

#[repr(C)]
pub struct Memory {
    total: u64,
    free: u64,
    used: u64,
}

#[repr(C)]
pub struct MemoryV2 {
    version: c_uint,
    total: u64,
    reserved: u64,
    free: u64,
    used: u64,
}

/// nvmlMemory_v2: the struct size in the low bits, the version in the high byte.
const MEMORY_V2: c_uint = std::mem::size_of::<MemoryV2>() as c_uint | (2 << 24);

#[repr(C)]
pub struct ProcessUtilization {
    pid: c_uint,
    time_stamp: u64,
    sm: c_uint,
    mem: c_uint,
    enc: c_uint,
    dec: c_uint,
}

#[repr(C)]
pub struct Utilization {
    gpu: c_uint,
    memory: c_uint,
}

#[repr(C)]
pub struct ProcessV1 {
    pid: c_uint,
    used: u64,
}

#[repr(C)]
pub struct ProcessV2 {
    pid: c_uint,
    used: u64,
    gpu_instance: c_uint,
    compute_instance: c_uint,
}

fn fill_str<const N: usize>(s: &str) -> [c_char; N] {
    let mut a = [0 as c_char; N];
    for (i, b) in s.bytes().take(N - 1).enumerate() {
        a[i] = b as c_char;
    }
    a
}

/// Live processes with memory on device `i`: (pid, bytes). Like the real NVML, which names processes
/// by host PID, each is named by the PID the caller sees: a process in the caller's own PID namespace
/// by the PID it recorded, one in a namespace below (a container, seen from the host) by its PID in
/// the caller's `/proc`; one the caller cannot see keeps the PID it recorded. A process's bytes are what
/// is charged to the device for it; with `FAKE_NVML_PROCESS_MANAGED_PAGES=1` in the caller's environment
/// also the managed pages its work pulled in (`Shared::paged_in`, the paging model), as a GPU whose
/// process list shows what is resident (the monitor's tests set it; the library's truth-up never sees it).
/// With `FAKE_NVML_PROCESS_OMITS_MANAGED=1` a process's figure leaves its managed memory out (`unlisted`).
fn processes(i: usize) -> Result<Vec<(u32, u64)>, Ret> {
    let pages = std::env::var("FAKE_NVML_PROCESS_MANAGED_PAGES").is_ok_and(|v| v.trim() == "1");
    let since = fake_gpu::monotonic_ns().saturating_sub(fake_gpu::config::paging_window_ns());
    let procs = with(|s, _| Ok(unlisted::processes_on(s, i, pages.then_some(since))))?;
    Ok(host_pids(procs))
}

/// The processes whose fake kernels kept the GPU busy within the last second, with their SM utilisation
/// in percent (`utilisation`): (host PID, percent).
fn busy(i: usize) -> Result<Vec<(u32, u64)>, Ret> {
    let now = fake_gpu::monotonic_ns();
    let work = with(|s, _| Ok(s.work_done(now)))?;
    Ok(host_pids(utilisation::percents(i, now, &work)))
}

/// (PID as each process sees it, its PID namespace, value) as NVML reports them: host PIDs.
fn host_pids(procs: Vec<(u32, u64, u64)>) -> Vec<(u32, u64)> {
    let own = fake_gpu::state::own_pid_ns();
    // What the last scan of /proc found, checked again before use (a PID may have been reused).
    static SEEN: Mutex<Vec<(u64, u32, u32)>> = Mutex::new(Vec::new());
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    let mut scanned = false;
    procs
        .into_iter()
        .map(|(pid, ns, used)| {
            if ns == 0 || ns == own {
                return (pid, used);
            }
            let find = |t: &[(u64, u32, u32)]| {
                t.iter()
                    .find(|&&(n, inner, outer)| n == ns && inner == pid && still(outer, n, inner))
                    .map(|&(_, _, outer)| outer)
            };
            let host = find(&seen).or_else(|| {
                if scanned {
                    return None;
                }
                scanned = true;
                *seen = visible_processes();
                find(&seen)
            });
            (host.unwrap_or(pid), used)
        })
        .collect()
}

/// True when `/proc/<outer>` still lives in namespace `ns` (one stat: this runs for every process at
/// every call; a PID reused inside that namespace is the remaining, accepted, blind spot of the fake).
fn still(outer: u32, ns: u64, _inner: u32) -> bool {
    std::fs::metadata(format!("/proc/{outer}/ns/pid"))
        .is_ok_and(|m| std::os::unix::fs::MetadataExt::ino(&m) == ns)
}

/// (PID namespace inode, PID in it) of `/proc/<outer>`.
fn proc_entry(outer: u32) -> Option<(u64, u32)> {
    let ns = std::fs::metadata(format!("/proc/{outer}/ns/pid")).ok()?;
    let status = std::fs::read_to_string(format!("/proc/{outer}/status")).ok()?;
    let inner = status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()?;
    Some((std::os::unix::fs::MetadataExt::ino(&ns), inner))
}

/// Every process in the caller's `/proc`: (PID namespace inode, PID in that namespace, PID here),
/// the inner PID being the last of the `NSpid` line of its status.
fn visible_processes() -> Vec<(u64, u32, u32)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    dir.filter_map(|e| {
        let outer: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let (ns, inner) = proc_entry(outer)?;
        Some((ns, inner, outer))
    })
    .collect()
}

/// The NVML process-list protocol: report the count; fill only when the buffer is big enough.
unsafe fn list<T>(
    dev: Device,
    count: *mut c_uint,
    infos: *mut T,
    make: impl Fn(u32, u64) -> T,
) -> R {
    let procs = processes(index(dev)?)?;
    if count.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: non-null in/out count from the caller.
    let room = unsafe { *count } as usize;
    // SAFETY: as above.
    unsafe { *count = procs.len() as c_uint };
    if room < procs.len() {
        return Err(INSUFFICIENT_SIZE);
    }
    if !procs.is_empty() && infos.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    for (k, (pid, used)) in procs.into_iter().enumerate() {
        // SAFETY: the caller's buffer holds `room` >= len entries.
        unsafe { infos.add(k).write(make(pid, used)) };
    }
    Ok(())
}

unsafe fn handle_by(dev: *mut Device, pred: impl Fn(usize) -> bool) -> R {
    let n = with(|s, _| Ok(s.ndev()))?;
    let i = (0..n).find(|&i| pred(i)).ok_or(NOT_FOUND)?;
    // SAFETY: out-pointer from the caller, checked by out().
    unsafe { out(dev, HANDLES.as_ptr().add(i)) }
}

/// An index past the device count is an invalid argument (not "not found"), as in NVML.
unsafe fn by_index(i: c_uint, dev: *mut Device) -> R {
    let n = with(|s, _| Ok(s.ndev()))?;
    if i as usize >= n {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: out-pointer from the caller, checked by handle_by.
    unsafe { handle_by(dev, |k| k == i as usize) }
}

fn arg_str(p: *const c_char) -> Result<String, Ret> {
    if p.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: non-null C string from the caller.
    Ok(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// `nvmlSetMemoryLimits_v1_t` (NVML r615+): a cgroup's soft and hard limit on a device.
#[repr(C)]
pub struct SetMemoryLimits {
    name_space: *const c_char,
    soft: u64,
    hard: u64,
}

/// `nvmlGetMemoryLimits_v1_t`.
#[repr(C)]
pub struct GetMemoryLimits {
    name_space: *const c_char,
    soft: u64,
    hard: u64,
    current_used: u64,
}

/// Where the fake keeps a cgroup's limits on device `i`: a file per (device, cgroup) in the state folder,
/// `<state_dir>/memlimit-<i>-<cgroup path with '/' as '_'>`, holding "soft hard". Recorded, not enforced.
fn memlimit_file(i: usize, ns: &str) -> Result<std::path::PathBuf, Ret> {
    let dir = Config::from_env().map_err(|_| UNKNOWN)?.state_dir;
    Ok(std::path::Path::new(&dir).join(format!("memlimit-{i}-{}", ns.replace('/', "_"))))
}

nvml_fn! {
fn nvmlInit_v2() { init() }
fn nvmlInit() { init() }
fn nvmlInitWithFlags(_flags: c_uint) { init() }

fn nvmlShutdown() {
    let mut n = NVML.lock().unwrap_or_else(|e| e.into_inner());
    if n.refs == 0 { return Err(UNINITIALIZED); }
    n.refs -= 1;
    Ok(())
}

fn nvmlSystemGetDriverVersion(buf: *mut c_char, len: c_uint) {
    with(|_, _| Ok(()))?;
    copy_str(buf, len, DRIVER_VERSION)
}

fn nvmlSystemGetNVMLVersion(buf: *mut c_char, len: c_uint) {
    copy_str(buf, len, "12.580.65.06")
}

fn nvmlSystemGetCudaDriverVersion(v: *mut c_int) { out(v, CUDA_DRIVER_VERSION) }
fn nvmlSystemGetCudaDriverVersion_v2(v: *mut c_int) { out(v, CUDA_DRIVER_VERSION) }

fn nvmlDeviceGetCount_v2(n: *mut c_uint) { out(n, with(|s, _| Ok(s.ndev()))? as c_uint) }
fn nvmlDeviceGetCount(n: *mut c_uint) { out(n, with(|s, _| Ok(s.ndev()))? as c_uint) }

fn nvmlDeviceGetHandleByIndex_v2(i: c_uint, dev: *mut Device) { by_index(i, dev) }
fn nvmlDeviceGetHandleByIndex(i: c_uint, dev: *mut Device) { by_index(i, dev) }

fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, dev: *mut Device) {
    let u = arg_str(uuid)?;
    let n = with(|s, _| Ok(s.ndev()))?;
    if let Some(i) = mig_devices().into_iter().find(|&i| i < n && mig_uuid_string(i).eq_ignore_ascii_case(&u)) {
        // SAFETY: i < MAX_DEVICES: a pointer into MIG_HANDLES; out() checks the caller's pointer.
        return unsafe { out(dev, MIG_HANDLES.as_ptr().add(i)) };
    }
    handle_by(dev, |k| uuid_string(k).eq_ignore_ascii_case(&u))
}

fn nvmlDeviceIsMigDeviceHandle(dev: Device, is_mig: *mut c_uint) {
    with(|_, _| Ok(()))?;
    match mig_index(dev) {
        Some(_) => out(is_mig, 1),
        None => { index(dev)?; out(is_mig, 0) }
    }
}

fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig: Device, dev: *mut Device) {
    with(|_, _| Ok(()))?;
    let i = mig_index(mig).ok_or(INVALID_ARGUMENT)?;
    // SAFETY: i < MAX_DEVICES: a pointer into HANDLES; out() checks the caller's pointer.
    unsafe { out(dev, HANDLES.as_ptr().add(i)) }
}

fn nvmlDeviceGetHandleByPciBusId_v2(id: *const c_char, dev: *mut Device) {
    let want = arg_str(id)?.to_ascii_uppercase();
    let want = want.trim_start_matches('0').to_string();
    handle_by(dev, |k| pci_bus_id(k).trim_start_matches('0') == want)
}

fn nvmlDeviceGetHandleByPciBusId(id: *const c_char, dev: *mut Device) {
    let want = arg_str(id)?.to_ascii_uppercase();
    let want = want.trim_start_matches('0').to_string();
    handle_by(dev, |k| pci_bus_id(k).trim_start_matches('0') == want)
}

fn nvmlDeviceGetUUID(dev: Device, buf: *mut c_char, len: c_uint) {
    if let Some(i) = mig_index(dev) {
        with(|_, _| Ok(()))?;
        return copy_str(buf, len, &mig_uuid_string(i));
    }
    copy_str(buf, len, &uuid_string(index(dev)?))
}

fn nvmlDeviceGetName(dev: Device, buf: *mut c_char, len: c_uint) {
    let i = index(dev)?;
    let total = with(|s, _| Ok(s.total(i)))?;
    let name = if total % (1 << 30) == 0 { format!("NVIDIA H100 (fake, {} GiB)", total >> 30) } else { format!("NVIDIA H100 (fake, {} MiB)", total >> 20) };
    copy_str(buf, len, &name)
}

fn nvmlDeviceGetIndex(dev: Device, i: *mut c_uint) { out(i, index(dev)? as c_uint) }
fn nvmlDeviceGetMinorNumber(dev: Device, i: *mut c_uint) { out(i, index(dev)? as c_uint) }

fn nvmlDeviceGetCudaComputeCapability(dev: Device, major: *mut c_int, minor: *mut c_int) {
    index(dev)?;
    out(major, 9)?;
    out(minor, 0)
}

fn nvmlDeviceGetPciInfo_v3(dev: Device, pci: *mut PciInfo) { pci_info(dev, pci) }
fn nvmlDeviceGetPciInfo_v2(dev: Device, pci: *mut PciInfo) { pci_info(dev, pci) }

fn nvmlDeviceSetMemoryLimits_v1(dev: Device, l: *const SetMemoryLimits) {
    let i = index(dev)?;
    if l.is_null() { return Err(INVALID_ARGUMENT); }
    let ns = arg_str((*l).name_space)?;
    let path = memlimit_file(i, &ns)?;
    std::fs::write(path, format!("{} {}\n", (*l).soft, (*l).hard)).map_err(|_| UNKNOWN)
}

fn nvmlDeviceGetMemoryLimits_v1(dev: Device, l: *mut GetMemoryLimits) {
    let i = index(dev)?;
    if l.is_null() { return Err(INVALID_ARGUMENT); }
    let ns = arg_str((*l).name_space)?;
    let text = std::fs::read_to_string(memlimit_file(i, &ns)?).unwrap_or_default();
    let mut v = text.split_whitespace().map(|x| x.parse::<u64>().unwrap_or(0));
    (*l).soft = v.next().unwrap_or(0);
    (*l).hard = v.next().unwrap_or(u64::MAX);
    (*l).current_used = 0;
    Ok(())
}

fn nvmlDeviceGetMemoryInfo(dev: Device, m: *mut Memory) {
    let i = index(dev)?;
    let (total, used, reserved) = with(|s, r| Ok((s.total(i), device_used(s, i), r)))?;
    let used = (used + reserved).min(total);
    out(m, Memory { total, free: total - used, used })
}

fn nvmlDeviceGetMemoryInfo_v2(dev: Device, m: *mut MemoryV2) {
    let i = index(dev)?;
    if m.is_null() { return Err(INVALID_ARGUMENT); }
    if (*m).version != MEMORY_V2 { return Err(ARGUMENT_VERSION_MISMATCH); }
    let (total, used, reserved) = with(|s, r| Ok((s.total(i), device_used(s, i), r)))?;
    let reserved = reserved.min(total);
    let used = used.min(total - reserved);
    out(m, MemoryV2 { version: MEMORY_V2, total, reserved, free: total - reserved - used, used })
}

fn nvmlDeviceGetComputeRunningProcesses_v3(dev: Device, count: *mut c_uint, infos: *mut ProcessV2) {
    list(dev, count, infos, |pid, used| ProcessV2 { pid, used, gpu_instance: u32::MAX, compute_instance: u32::MAX })
}

fn nvmlDeviceGetComputeRunningProcesses_v2(dev: Device, count: *mut c_uint, infos: *mut ProcessV2) {
    list(dev, count, infos, |pid, used| ProcessV2 { pid, used, gpu_instance: u32::MAX, compute_instance: u32::MAX })
}

fn nvmlDeviceGetComputeRunningProcesses(dev: Device, count: *mut c_uint, infos: *mut ProcessV1) {
    list(dev, count, infos, |pid, used| ProcessV1 { pid, used })
}

fn nvmlDeviceGetGraphicsRunningProcesses_v3(dev: Device, count: *mut c_uint, _infos: *mut ProcessV2) {
    index(dev)?;
    out(count, 0)
}

// One sample per process holding memory on the device or whose kernels kept it busy within the last
// second (processes publish their queues), SM the share of the time since the caller's previous call
// that its work ran (`busy`), else 0; none: NOT_FOUND, as the real NVML answers when it has no sample.
fn nvmlDeviceGetProcessUtilization(dev: Device, samples: *mut ProcessUtilization, count: *mut c_uint, _last_seen: u64) {
    let i = index(dev)?;
    if utilisation::no_new_sample(i, fake_gpu::monotonic_ns()) { if !count.is_null() { *count = 0; } return Err(NOT_FOUND); }
    let mut procs: Vec<(u32, c_uint)> = busy(i)?.into_iter().map(|(p, pct)| (p, pct as c_uint)).collect();
    for (pid, _) in processes(i)? {
        if !procs.iter().any(|p| p.0 == pid) { procs.push((pid, 0)); }
    }
    if count.is_null() { return Err(INVALID_ARGUMENT); }
    if procs.is_empty() { *count = 0; return Err(NOT_FOUND); }
    let room = *count as usize;
    *count = procs.len() as c_uint;
    if samples.is_null() || room < procs.len() { return Err(INSUFFICIENT_SIZE); }
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64);
    for (k, (pid, sm)) in procs.into_iter().enumerate() {
        samples.add(k).write(ProcessUtilization { pid, time_stamp: now, sm, mem: 0, enc: 0, dec: 0 });
    }
    Ok(())
}

// The fake runs no kernels: 0 % busy, memory bandwidth 0 %.
fn nvmlDeviceGetUtilizationRates(dev: Device, u: *mut Utilization) {
    index(dev)?;
    out(u, Utilization { gpu: 0, memory: 0 })
}
}

unsafe fn pci_info(dev: Device, pci: *mut PciInfo) -> R {
    let i = index(dev)?;
    let id = pci_bus_id(i);
    // SAFETY: out-pointer checked by out().
    unsafe {
        out(
            pci,
            PciInfo {
                bus_id_legacy: fill_str(&id[4..]),
                domain: 0,
                bus: 0x18 + i as c_uint * 0x10,
                device: 0,
                pci_device_id: 0x2330_10de,
                pci_subsystem_id: 0x16c1_10de,
                bus_id: fill_str(&id),
            },
        )
    }
}

/// nvmlErrorString: a static description of a return code.
#[no_mangle]
pub extern "C" fn nvmlErrorString(r: Ret) -> *const c_char {
    let s = ERRORS
        .iter()
        .find(|e| e.0 == r)
        .map_or("Unknown Error\0", |e| e.1);
    s.as_ptr() as *const c_char
}
