//! Stream capture, as far as the compute share meets it: `cuStreamBeginCapture_v2` / `cuStreamEndCapture`,
//! `cuStreamIsCapturing`, each thread's capture mode (`cuThreadExchangeStreamCaptureMode`), and the rule
//! that breaks applications: while a capture is going on, a thread whose mode forbids it calling a
//! "potentially unsafe" function (`cuEventQuery`, `cuEventSynchronize`) gets
//! CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the capture, whose end then fails with
//! CUDA_ERROR_STREAM_CAPTURE_INVALIDATED. Modes as cuda.h: global (0, every thread's default), thread-local
//! (1), relaxed (2). Kernels launched into a capturing stream become the captured graph's kernel nodes.

use crate::driver::*;
use crate::types::*;
use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{c_int, c_uint};
use std::sync::Mutex;

pub const STREAM_CAPTURE_UNSUPPORTED: CUresult = 900;
pub const STREAM_CAPTURE_INVALIDATED: CUresult = 901;
const GLOBAL: c_int = 0;
const RELAXED: c_int = 2;

struct Capture {
    mode: c_int,
    thread: u64,
    invalidated: bool,
    nodes: Vec<Node>,
}

static CAPTURES: Mutex<Option<HashMap<Handle, Capture>>> = Mutex::new(None);

thread_local! {
    static MODE: Cell<c_int> = const { Cell::new(GLOBAL) };
}

fn thread_id() -> u64 {
    // SAFETY: pthread_self has no preconditions.
    unsafe { libc::pthread_self() as u64 }
}

fn with<T>(f: impl FnOnce(&mut HashMap<Handle, Capture>) -> T) -> T {
    f(lock(&CAPTURES).get_or_insert_with(HashMap::new))
}

/// Whether `stream` is capturing.
pub fn capturing(stream: Handle) -> bool {
    with(|c| c.contains_key(&stream))
}

/// A kernel launched into `stream`: true when it was captured (a node), not run.
pub fn captured(stream: Handle, func: Handle, grid: [u32; 3], block: [u32; 3]) -> bool {
    with(|c| match c.get_mut(&stream) {
        Some(cap) => {
            cap.nodes.push(Node::Kernel { func, grid, block });
            true
        }
        None => false,
    })
}

/// A potentially unsafe call: refused, invalidating the captures that forbid it, when this thread's mode
/// and a capture going on say so.
pub fn unsafe_call() -> R {
    let mode = MODE.with(|m| m.get());
    if mode == RELAXED {
        return Ok(());
    }
    let me = thread_id();
    with(|c| {
        let mut refused = false;
        for cap in c.values_mut() {
            let own = cap.thread == me && cap.mode != RELAXED;
            let others = mode == GLOBAL && cap.thread != me && cap.mode == GLOBAL;
            if own || others {
                cap.invalidated = true;
                refused = true;
            }
        }
        if refused {
            Err(STREAM_CAPTURE_UNSUPPORTED)
        } else {
            Ok(())
        }
    })
}

cu_fn! {
fn cuStreamBeginCapture_v2(s: Handle, mode: c_int) {
    let d = drv()?;
    if !(GLOBAL..=RELAXED).contains(&mode) { return Err(INVALID_VALUE); }
    // The default streams cannot be captured.
    if s <= 2 { return Err(STREAM_CAPTURE_UNSUPPORTED); }
    stream_phys(d, &lock(&d.objs), s)?;
    with(|c| {
        if c.contains_key(&s) { return Err(INVALID_VALUE); }
        c.insert(s, Capture { mode, thread: thread_id(), invalidated: false, nodes: Vec::new() });
        Ok(())
    })
}

fn cuStreamEndCapture(s: Handle, graph: *mut Handle) {
    let d = drv()?;
    if graph.is_null() { return Err(INVALID_VALUE); }
    let cap = with(|c| c.remove(&s)).ok_or(INVALID_VALUE)?;
    if cap.invalidated { return Err(STREAM_CAPTURE_INVALIDATED); }
    let h = new_handle();
    let nodes = cap.nodes.into_iter().map(|n| (new_handle(), n)).collect();
    lock(&d.objs).graphs.insert(h, nodes);
    out(graph, h)
}

fn cuStreamIsCapturing(s: Handle, status: *mut c_uint) {
    let d = drv()?;
    stream_phys(d, &lock(&d.objs), s)?;
    let st = with(|c| c.get(&s).map_or(0, |cap| if cap.invalidated { 2 } else { 1 }));
    out(status, st)
}

fn cuThreadExchangeStreamCaptureMode(mode: *mut c_int) {
    if mode.is_null() { return Err(INVALID_VALUE); }
    let new = *mode;
    if !(GLOBAL..=RELAXED).contains(&new) { return Err(INVALID_VALUE); }
    *mode = MODE.with(|m| m.replace(new));
    Ok(())
}
}

cu_alias! {
    cuStreamBeginCapture_v2_ptsz => cuStreamBeginCapture_v2(s: Handle, mode: c_int);
    cuStreamEndCapture_ptsz => cuStreamEndCapture(s: Handle, graph: *mut Handle);
    cuStreamIsCapturing_ptsz => cuStreamIsCapturing(s: Handle, status: *mut c_uint);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unsafe_call_beside_a_global_capture_invalidates_it_unless_relaxed() {
        with(|c| {
            c.insert(
                77,
                Capture {
                    mode: GLOBAL,
                    thread: 0,
                    invalidated: false,
                    nodes: Vec::new(),
                },
            );
        });
        let mut m = RELAXED;
        // SAFETY: a valid out-pointer.
        assert_eq!(
            unsafe { cuThreadExchangeStreamCaptureMode(&mut m) },
            SUCCESS
        );
        assert_eq!(unsafe_call(), Ok(()));
        assert!(with(|c| !c[&77].invalidated));
        let mut m = GLOBAL;
        // SAFETY: as above.
        assert_eq!(
            unsafe { cuThreadExchangeStreamCaptureMode(&mut m) },
            SUCCESS
        );
        assert_eq!(m, RELAXED);
        assert_eq!(unsafe_call(), Err(STREAM_CAPTURE_UNSUPPORTED));
        assert!(with(|c| c.remove(&77).unwrap().invalidated));
    }
}
