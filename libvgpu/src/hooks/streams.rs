//! Stream and event calls where the compute share's open groups end (`compute::sync`): the queries (polling
//! may be how an application waits), stream destroys, capture beginnings and `cuStreamWaitEvent` (a stream
//! that waits for an event recorded in a capture joins it). A group's end is recorded on its stream when the
//! group closes: never on a destroyed stream, never into a capture. The blocking synchronisations, which
//! also reconcile pools, are `pools`'.
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_uint, c_void};

use super::common::hook;
use crate::ffi::*;
use crate::real_symbols::forward;

// A query may be how the application waits (polling): the compute share's open groups end first
// (`compute::sync::polling`).
hook!(cuStreamQuery(s: CUstream) { crate::compute::sync::polling(); forward!("cuStreamQuery", fn(CUstream), s) });
hook!(cuStreamQuery_ptsz(s: CUstream) { crate::compute::sync::polling(); forward!("cuStreamQuery_ptsz", fn(CUstream), s) });
hook!(cuEventQuery(ev: CUevent) { crate::compute::sync::polling(); forward!("cuEventQuery", fn(CUevent), ev) });
// A capture about to begin on a stream, or a stream about to wait for an event (it joins the event's capture
// when the event was recorded in one): the compute share's open groups end first, while no capture can take
// their end events (`compute::sync::capture_beginning`). The CUDA 10.0 entry points take no mode.
hook!(cuStreamBeginCapture(s: CUstream) { crate::compute::sync::capture_beginning(); forward!("cuStreamBeginCapture", fn(CUstream), s) });
hook!(cuStreamBeginCapture_ptsz(s: CUstream) { crate::compute::sync::capture_beginning(); forward!("cuStreamBeginCapture_ptsz", fn(CUstream), s) });
hook!(cuStreamBeginCapture_v2(s: CUstream, mode: c_uint) { crate::compute::sync::capture_beginning(); forward!("cuStreamBeginCapture_v2", fn(CUstream, c_uint), s, mode) });
hook!(cuStreamBeginCapture_v2_ptsz(s: CUstream, mode: c_uint) { crate::compute::sync::capture_beginning(); forward!("cuStreamBeginCapture_v2_ptsz", fn(CUstream, c_uint), s, mode) });
hook!(cuStreamBeginCaptureToGraph(s: CUstream, g: CUgraph, deps: *const CUgraphNode, data: *const c_void, n: usize, mode: c_uint) { crate::compute::sync::capture_beginning(); forward!("cuStreamBeginCaptureToGraph", fn(CUstream, CUgraph, *const CUgraphNode, *const c_void, usize, c_uint), s, g, deps, data, n, mode) });
hook!(cuStreamBeginCaptureToGraph_ptsz(s: CUstream, g: CUgraph, deps: *const CUgraphNode, data: *const c_void, n: usize, mode: c_uint) { crate::compute::sync::capture_beginning(); forward!("cuStreamBeginCaptureToGraph_ptsz", fn(CUstream, CUgraph, *const CUgraphNode, *const c_void, usize, c_uint), s, g, deps, data, n, mode) });
hook!(cuStreamWaitEvent(s: CUstream, e: CUevent, flags: c_uint) { crate::compute::sync::capture_beginning(); forward!("cuStreamWaitEvent", fn(CUstream, CUevent, c_uint), s, e, flags) });
hook!(cuStreamWaitEvent_ptsz(s: CUstream, e: CUevent, flags: c_uint) { crate::compute::sync::capture_beginning(); forward!("cuStreamWaitEvent_ptsz", fn(CUstream, CUevent, c_uint), s, e, flags) });
// A stream about to go: the compute share's open groups end while it lives (`compute::sync::stream_ending`).
hook!(cuStreamDestroy(s: CUstream) { crate::compute::sync::stream_ending(); forward!("cuStreamDestroy", fn(CUstream), s) });
hook!(cuStreamDestroy_v2(s: CUstream) { crate::compute::sync::stream_ending(); forward!("cuStreamDestroy_v2", fn(CUstream), s) });
