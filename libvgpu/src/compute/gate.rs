//! The gate before a launch timed from a start event of its own on an idle stream (`sample::Position::Idle`,
//! or behind an untimed launch that finished): a host function (`cuLaunchHostFunc`, empty) queued on the
//! stream before the start event.
//!
//! Why: on an idle stream the GPU reaches a start event as soon as it is submitted, before the host has
//! even called the launch after it, and the driver hands a launch to the GPU late in its call, so the
//! interval (start → end) took in the host's time to submit the launch. On an H200
//! (driver 580, batch-1 decode, eager: kernels of ~2.9 µs, the GPU idle between launches) such intervals
//! read 7.5–8.3 µs, and the untimed launches (87%), charged their position's average, were charged about
//! the program's wall time. A host function holds the stream until the driver's thread has run it and
//! let the stream go on (a round trip through the host, its thread woken and the GPU told: expected to
//! take longer than a launch takes to submit; on an H200 it removed about half of it: an event pair
//! around a 3 µs launch on an idle stream read 9.0 µs bare, 6.0 behind a host function), so the start
//! event completes after the launch was submitted, just before its kernel starts, as a start chained on a
//! previous launch's end does.
//!
//! Why no program can steer it: the interval is still from an event queued on the stream *before* the
//! launch to one queued *after* it, so the GPU orders it around the kernel whatever any host thread does:
//! it is never shorter than the kernel's time. The gate only moves the start later when the launch was
//! submitted in time; a thread delayed by a signal, CPU contention, the host's timing of its own calls
//! or anything else the program does makes the interval *longer* (the start reached before the launch
//! arrives), never shorter. No host clock is read to date the interval: a start dated from the host's
//! time just before the launch call would keep the driver's own time in the call (most of the gap), and
//! one whose mapping of the host's clock onto the GPU's erred late would undercharge.
//!
//! Only launches whose charge teaches their position's average are gated (`InFlight::drawn`: the idle
//! ones drawn once their work is known, at most about `sample::IDLE_TIMED_PER_S` a second, and each while
//! it is learned), so that what the untimed ones are charged is their kernels' time. The round trip is the
//! process's CPU time (the driver's thread wakes: ~25 µs a gate on an H200 with the process pinned to one
//! CPU), hence the rate's bound. A launch always timed (the first after a
//! synchronisation, which opens the span a later synchronisation dates, `flight::Span`) is not: a program
//! that synchronises after every launch would wait a round trip at each, and that launch's own charge
//! keeps the host's submit time (charged more, as before). On a stream with work queued no gate is
//! queued: its host function would hold the GPU idle after that work.
//!
//! The residual: when the launch takes longer to submit than the host function's round trip, the rest is
//! in the interval, as before (charged more, never less); the GPU's own latency from the start event to
//! the kernel, as for a chained launch. The cost: two driver calls (`cuStreamQuery`, `cuLaunchHostFunc`)
//! for each gated launch, and its kernel starts a round trip later (its stream was idle: the GPU had
//! nothing of the stream to run).

use std::ffi::c_void;

use super::events::stream_idle;
use crate::ffi::*;
use crate::real_symbols::{real, Lib};

/// The gate's function: nothing to do; the round trip is the gate.
extern "C" fn opened(_: *mut c_void) {}

/// Queues the gate on `stream` when it has nothing left to run; true when queued.
pub(super) fn gate(stream: CUstream) -> bool {
    stream_idle(stream) && host_func(stream, opened) == CUDA_SUCCESS
}

fn host_func(stream: CUstream, f: extern "C" fn(*mut c_void)) -> CUresult {
    match real!(
        Lib::Cuda,
        "cuLaunchHostFunc",
        unsafe extern "C" fn(CUstream, extern "C" fn(*mut c_void), *mut c_void) -> CUresult
    ) {
        // SAFETY: the launch's own stream (not capturing: `throttled` forwards a capture's launches
        // before any timing), a function that touches nothing, no data.
        Some(h) => unsafe { h(stream, f, std::ptr::null_mut()) },
        None => CUDA_ERROR_NOT_FOUND,
    }
}
