//! Where a stream's work runs: its context and that context's device, asked of the driver
//! (`cuStreamGetCtx`, then `cuCtxGetDevice_v2`). The legacy and per-thread default streams (0,
//! `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD`) belong to the calling thread's current context, and the
//! driver answers so for them. Work queued on a stream runs there whatever context is current when it is
//! queued (a `CUkernel` launched with no context current, a function of another context), so a policy
//! that charges work to a device must take the device from the stream, never from the current context.
//! Used by the compute share's launches and the turn gate; the memory hooks may use it for stream-ordered
//! calls. Also the thread's relaxed capture mode (`Relaxed`) the library's own queries run in.

use std::ffi::c_void;

use crate::ffi::*;
use crate::real_symbols::{real, Lib};
use crate::records;

/// `CU_STREAM_PER_THREAD`: the per-thread default stream's special handle.
pub const STREAM_PER_THREAD: usize = 2;

const CUDA_ERROR_INVALID_CONTEXT: CUresult = 201;
/// `CU_STREAM_CAPTURE_MODE_RELAXED`.
const CAPTURE_MODE_RELAXED: u32 = 2;

/// The stream an entry point's `stream` argument names: a `_ptsz` entry point's stream 0 is the calling
/// thread's per-thread default stream.
pub fn named(stream: CUstream, ptsz: bool) -> CUstream {
    if ptsz && stream.is_null() {
        STREAM_PER_THREAD as CUstream
    } else {
        stream
    }
}

/// (device, context) of the work queued on `stream` (as `named` gives it), or the driver's error: a
/// default stream while no context is current, a stream that is gone, a driver that cannot say.
pub fn home(stream: CUstream) -> Result<(CUdevice, usize), CUresult> {
    let ctx = context(stream)?;
    if let Some(d) = records::cached_device(ctx) {
        return Ok((d, ctx));
    }
    let generation = records::generation();
    let dev = device(ctx)?;
    records::remember_device(ctx, dev, generation);
    Ok((dev, ctx))
}

/// The context of `stream` (never 0).
pub fn context(stream: CUstream) -> Result<usize, CUresult> {
    let f = real!(
        Lib::Cuda,
        "cuStreamGetCtx",
        unsafe extern "C" fn(CUstream, *mut CUcontext) -> CUresult
    )
    .ok_or(CUDA_ERROR_NOT_FOUND)?;
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; the caller's stream handle, as the caller passed it to the driver.
    match unsafe { f(stream, &mut ctx) } {
        CUDA_SUCCESS if !ctx.is_null() => Ok(ctx as usize),
        CUDA_SUCCESS => Err(CUDA_ERROR_INVALID_CONTEXT),
        e => Err(e),
    }
}

/// The device of context `ctx`: `cuCtxGetDevice_v2` (CUDA 12.8+), else `ctx` pushed current for
/// `cuCtxGetDevice` and popped again.
pub fn device(ctx: usize) -> Result<CUdevice, CUresult> {
    let mut dev: CUdevice = 0;
    if let Some(f) = real!(
        Lib::Cuda,
        "cuCtxGetDevice_v2",
        unsafe extern "C" fn(*mut CUdevice, CUcontext) -> CUresult
    ) {
        // SAFETY: a valid out-pointer and a context the driver just named.
        return match unsafe { f(&mut dev, ctx as CUcontext) } {
            CUDA_SUCCESS => Ok(dev),
            e => Err(e),
        };
    }
    let get = real!(
        Lib::Cuda,
        "cuCtxGetDevice",
        unsafe extern "C" fn(*mut CUdevice) -> CUresult
    )
    .ok_or(CUDA_ERROR_NOT_FOUND)?;
    in_context(ctx, || {
        // SAFETY: a valid out-pointer.
        match unsafe { get(&mut dev) } {
            CUDA_SUCCESS => Ok(dev),
            e => Err(e),
        }
    })?
}

/// Runs `f` with `ctx` current on this thread (pushed and popped again when another one is current).
pub fn in_context<T>(ctx: usize, f: impl FnOnce() -> T) -> Result<T, CUresult> {
    let (Some(get), Some(push), Some(pop)) = (
        real!(
            Lib::Cuda,
            "cuCtxGetCurrent",
            unsafe extern "C" fn(*mut CUcontext) -> CUresult
        ),
        real!(
            Lib::Cuda,
            "cuCtxPushCurrent_v2",
            unsafe extern "C" fn(CUcontext) -> CUresult
        ),
        real!(
            Lib::Cuda,
            "cuCtxPopCurrent_v2",
            unsafe extern "C" fn(*mut CUcontext) -> CUresult
        ),
    ) else {
        return Err(CUDA_ERROR_NOT_FOUND);
    };
    let mut cur: CUcontext = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    if unsafe { get(&mut cur) } == CUDA_SUCCESS && cur as usize == ctx {
        return Ok(f());
    }
    // SAFETY: a context the driver named; popped again below, leaving the thread's stack as it was.
    match unsafe { push(ctx as *mut c_void) } {
        CUDA_SUCCESS => {}
        e => return Err(e),
    }
    let r = f();
    let mut popped: CUcontext = std::ptr::null_mut();
    // SAFETY: pops what was pushed above.
    unsafe { pop(&mut popped) };
    Ok(r)
}

/// The calling thread in relaxed stream-capture mode while it lives, its own mode restored after: the
/// library's event queries and synchronisations are then never the "potentially unsafe" call that
/// invalidates a capture another stream of the application has going in global mode (PyTorch's default).
pub struct Relaxed(Option<u32>);

impl Relaxed {
    pub fn enter() -> Relaxed {
        Relaxed(exchange(CAPTURE_MODE_RELAXED))
    }
}

impl Drop for Relaxed {
    fn drop(&mut self) {
        if let Some(m) = self.0 {
            exchange(m);
        }
    }
}

/// Sets this thread's capture mode; the previous one (None: the driver cannot).
fn exchange(mode: u32) -> Option<u32> {
    let f = real!(
        Lib::Cuda,
        "cuThreadExchangeStreamCaptureMode",
        unsafe extern "C" fn(*mut u32) -> CUresult
    )?;
    let mut m = mode;
    // SAFETY: a valid in/out pointer.
    (unsafe { f(&mut m) } == CUDA_SUCCESS).then_some(m)
}
