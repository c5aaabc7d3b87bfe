//! The driver calls the compute share makes around a launch: events to time it (and a stream of its own
//! for `overlap`'s epoch), whether its stream is
//! capturing a graph, and the thread's capture mode around the queries (`streams::Relaxed`). Each goes to the driver's own
//! function, never back into the hooks.

use super::trace::{count, NOT_READY, QUERIES, READS, RECORDS};
use crate::ffi::*;
use crate::real_symbols::{real, Lib};

pub(super) use crate::streams::Relaxed;

pub(super) const CUDA_ERROR_NOT_READY: CUresult = 600;

const CU_EVENT_DEFAULT: u32 = 0;

pub(super) fn event_create(e: &mut CUevent) -> CUresult {
    match real!(
        Lib::Cuda,
        "cuEventCreate",
        unsafe extern "C" fn(*mut CUevent, u32) -> CUresult
    ) {
        // SAFETY: a valid out-pointer; default flags (timing enabled).
        Some(f) => unsafe { f(e, CU_EVENT_DEFAULT) },
        None => CUDA_ERROR_NOT_FOUND,
    }
}

pub(super) fn event_record(e: CUevent, s: CUstream) -> CUresult {
    count(&RECORDS);
    match real!(
        Lib::Cuda,
        "cuEventRecord",
        unsafe extern "C" fn(CUevent, CUstream) -> CUresult
    ) {
        // SAFETY: an event we created, the launch's own stream.
        Some(f) => unsafe { f(e, s) },
        None => CUDA_ERROR_NOT_FOUND,
    }
}

/// Whether `s` is capturing a graph. An error does not count: the launch is then timed, and when its
/// events cannot be recorded it is charged unmeasured.
pub(super) fn capturing(s: CUstream) -> bool {
    let Some(f) = real!(
        Lib::Cuda,
        "cuStreamIsCapturing",
        unsafe extern "C" fn(CUstream, *mut u32) -> CUresult
    ) else {
        return false;
    };
    let mut status = 0u32;
    // SAFETY: a valid out-pointer; the launch's own stream.
    let r = unsafe { f(s, &mut status) };
    r == CUDA_SUCCESS && status != 0
}

/// Waits for an event of ours (a context about to go, the process exiting).
pub(super) fn event_wait(e: CUevent) -> CUresult {
    match real!(
        Lib::Cuda,
        "cuEventSynchronize",
        unsafe extern "C" fn(CUevent) -> CUresult
    ) {
        // SAFETY: an event we created.
        Some(f) => unsafe { f(e) },
        None => CUDA_ERROR_NOT_FOUND,
    }
}

pub(super) fn event_query(e: CUevent) -> CUresult {
    count(&QUERIES);
    let r = match real!(
        Lib::Cuda,
        "cuEventQuery",
        unsafe extern "C" fn(CUevent) -> CUresult
    ) {
        // SAFETY: an event we created.
        Some(f) => unsafe { f(e) },
        None => CUDA_ERROR_NOT_FOUND,
    };
    if r == CUDA_ERROR_NOT_READY {
        count(&NOT_READY);
    }
    r
}

/// Whether everything queued on `s` has finished (`cuStreamQuery`); an error or work still running:
/// false. Asked before a group's end is recorded late (`Timer::record_closing`).
pub(super) fn stream_idle(s: CUstream) -> bool {
    count(&QUERIES);
    // A query in global capture mode would invalidate a capture another stream has going.
    let _relaxed = Relaxed::enter();
    match real!(
        Lib::Cuda,
        "cuStreamQuery",
        unsafe extern "C" fn(CUstream) -> CUresult
    ) {
        // SAFETY: the stream an application's launch was queued on; groups on it close before it is
        // destroyed (`sync::stream_ending`).
        Some(f) => (unsafe { f(s) }) == CUDA_SUCCESS,
        None => false,
    }
}

/// A stream of ours that does not synchronise with the legacy default stream (`CU_STREAM_NON_BLOCKING`):
/// where the share records what only dates (`overlap`'s epoch), behind none of the application's work.
pub(super) fn stream_create(s: &mut CUstream) -> CUresult {
    match real!(
        Lib::Cuda,
        "cuStreamCreate",
        unsafe extern "C" fn(*mut CUstream, u32) -> CUresult
    ) {
        // SAFETY: a valid out-pointer; CU_STREAM_NON_BLOCKING.
        Some(f) => unsafe { f(s, 1) },
        None => CUDA_ERROR_NOT_FOUND,
    }
}

/// Where completed event `b` lies from completed event `a` (ns, negative before it): `overlap`'s
/// position of an interval's end against the epoch.
pub(super) fn position_ns(a: CUevent, b: CUevent) -> Option<i64> {
    type Elapsed = unsafe extern "C" fn(*mut f32, CUevent, CUevent) -> CUresult;
    let f = real!(Lib::Cuda, "cuEventElapsedTime_v2", Elapsed)
        .or_else(|| real!(Lib::Cuda, "cuEventElapsedTime", Elapsed))?;
    count(&READS);
    let mut ms = 0f32;
    // SAFETY: a valid out-pointer and two events of ours of one context.
    let r = unsafe { f(&mut ms, a, b) };
    (r == CUDA_SUCCESS && ms.is_finite()).then_some((ms as f64 * 1e6) as i64)
}

/// The time between two completed events of ours. `cuEventElapsedTime_v2` (CUDA 12.8 on; what cuda.h 13
/// names `cuEventElapsedTime`) where the driver has it: on an H100 (driver 580) the unversioned export
/// took 462 ns a call, `_v2` 68–117 (tests/gpu/launch_cost.cu).
pub(super) fn elapsed_ns(a: CUevent, b: CUevent) -> Option<u64> {
    position_ns(a, b).and_then(|ns| u64::try_from(ns).ok())
}
