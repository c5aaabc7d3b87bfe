//! NVML's list protocols, as the binding (`library`) calls them: the process lists (compute, graphics, MPS
//! clients; a buffer grown while NVML answers INSUFFICIENT_SIZE, processes without a figure counted
//! apart) and the per-process utilisation samples, with the C structs they fill. Not here: loading the
//! library and the other calls (`library`).

use std::ffi::{c_int, c_uint, c_void};

pub(super) type Device = *mut c_void;
pub(super) const SUCCESS: c_int = 0;
pub(super) const INSUFFICIENT_SIZE: c_int = 7;
pub(super) const NOT_FOUND: c_int = 6;

/// nvmlProcessInfo_v2_t (the `_v2` and `_v3` lists).
#[repr(C)]
#[derive(Default, Clone, Copy)]
pub(super) struct ProcessV2 {
    pub(super) pid: c_uint,
    pub(super) used: u64,
    pub(super) gpu_instance: c_uint,
    pub(super) compute_instance: c_uint,
}

/// nvmlProcessInfo_v1_t (the list without a version suffix).
#[repr(C)]
#[derive(Default, Clone, Copy)]
pub(super) struct ProcessV1 {
    pub(super) pid: c_uint,
    pub(super) used: u64,
}

/// nvmlProcessUtilizationSample_t.
#[repr(C)]
#[derive(Default, Clone, Copy)]
pub(super) struct UtilSample {
    pub(super) pid: c_uint,
    pub(super) time_stamp: u64,
    pub(super) sm: c_uint,
    pub(super) mem: c_uint,
    pub(super) enc: c_uint,
    pub(super) dec: c_uint,
}

pub(super) type ListFn<T> = unsafe extern "C" fn(Device, *mut c_uint, *mut T) -> c_int;
pub(super) type UtilFn = unsafe extern "C" fn(Device, *mut UtilSample, *mut c_uint, u64) -> c_int;

/// A process list: the `_v3`/`_v2` struct, or the unversioned one of older drivers.
pub(super) enum Lister {
    V2(ListFn<ProcessV2>),
    V1(ListFn<ProcessV1>),
}

impl Lister {
    /// Device `dev`'s processes with a figure, and how many NVML listed without one (`list`).
    pub(super) fn list(&self, dev: Device) -> Option<(Vec<(u32, u64)>, usize)> {
        match *self {
            Lister::V2(f) => list(dev, f, |p: &ProcessV2| (p.pid, p.used)),
            Lister::V1(f) => list(dev, f, |p: &ProcessV1| (p.pid, p.used)),
        }
    }
}

/// Per-process SM utilisation since the previous reading: NVML keeps a buffer of samples (one per process
/// per sampling period) and returns those newer than `since`; each process's figure is the mean of its
/// samples, a process with none is absent (it did not run). Asking from the last timestamp seen, not from
/// 0, is what keeps an idle or frozen process from being read at its last busy sample, which the buffer
/// still holds for seconds (the compute share wall would freeze it again for work it no longer does).
/// Returns the fractions and the newest timestamp among the samples; NOT_FOUND (no sample since) is an
/// empty list, any other error `None` (unknown).
pub(super) fn samples(
    dev: Device,
    f: UtilFn,
    hint: usize,
    since: u64,
) -> Option<(Vec<(u32, f64)>, u64)> {
    // Sized from the process list first (one call), grown on INSUFFICIENT_SIZE.
    let mut buf = vec![UtilSample::default(); hint * 8 + 16];
    for _ in 0..3 {
        let mut n = buf.len() as c_uint;
        // SAFETY: `buf` holds `n` samples.
        match unsafe { f(dev, buf.as_mut_ptr(), &mut n, since) } {
            SUCCESS => {
                buf.truncate(n as usize);
                return Some(mean_per_pid(&buf, since));
            }
            NOT_FOUND => return Some((Vec::new(), since)),
            INSUFFICIENT_SIZE => buf = vec![UtilSample::default(); n as usize + 16],
            _ => return None,
        }
    }
    None
}

/// Each PID's mean SM fraction over the samples newer than `since` (NVML may return older ones too), and
/// the newest timestamp.
pub(super) fn mean_per_pid(buf: &[UtilSample], since: u64) -> (Vec<(u32, f64)>, u64) {
    let mut sums: std::collections::BTreeMap<u32, (f64, u32)> = Default::default();
    let mut newest = since;
    for s in buf.iter().filter(|s| s.time_stamp > since || since == 0) {
        let e = sums.entry(s.pid).or_default();
        e.0 += f64::from(s.sm.min(100)) / 100.0;
        e.1 += 1;
        newest = newest.max(s.time_stamp);
    }
    let fractions = sums
        .into_iter()
        .map(|(pid, (sum, n))| (pid, sum / f64::from(n)))
        .collect();
    (fractions, newest)
}

/// NVML's list protocol: grow the buffer while it answers INSUFFICIENT_SIZE (processes come and go). The
/// processes with a figure, and how many NVML listed without one.
pub(super) fn list<T: Default + Clone>(
    dev: Device,
    f: ListFn<T>,
    get: impl Fn(&T) -> (u32, u64),
) -> Option<(Vec<(u32, u64)>, usize)> {
    let mut buf: Vec<T> = vec![T::default(); 64];
    for _ in 0..4 {
        let mut n = buf.len() as c_uint;
        // SAFETY: `buf` holds `n` entries of the struct the function fills.
        let rc = unsafe { f(dev, &mut n, buf.as_mut_ptr()) };
        if rc == SUCCESS {
            buf.truncate(n as usize);
            // NVML reports u64::MAX ("not available") under some virtualisations: no figure to compare.
            let all: Vec<(u32, u64)> = buf.iter().map(&get).collect();
            let measured: Vec<(u32, u64)> =
                all.iter().copied().filter(|p| p.1 != u64::MAX).collect();
            let unmeasured = all.len() - measured.len();
            return Some((measured, unmeasured));
        }
        if rc != INSUFFICIENT_SIZE {
            return None;
        }
        buf = vec![T::default(); n as usize + 64];
    }
    None
}
