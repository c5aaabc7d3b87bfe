//! Initialisation, versions, error strings, contexts, streams and events.

use crate::api_pool::release_pools;
use crate::driver::*;
use crate::errors::ERRORS;
use crate::types::*;
use std::ffi::{c_char, c_int, c_uint, c_void};

/// What cuDriverGetVersion reports (CUDA 13.0).
pub const DRIVER_VERSION: c_int = 13000;

/// Sets a context's stack size, printf FIFO or malloc heap (`limit` 0..=2). They are device memory, taken
/// (or given back) now: per thread × every resident thread for the stack. What is above the defaults is
/// charged to the device.
pub fn set_limit(d: &Driver, objs: &mut Objs, h: Handle, phys: usize, limit: usize, v: u64) -> R {
    let cost = |l: &[u64; 3]| {
        let per = [RESIDENT_THREADS, 1, 1];
        (0..3)
            .map(|i| {
                l[i].saturating_sub(DEFAULT_LIMITS[i])
                    .saturating_mul(per[i])
            })
            .sum::<u64>()
    };
    let ctx = objs.ctxs.get_mut(&h).ok_or(INVALID_CONTEXT)?;
    let mut limits = ctx.limits;
    limits[limit] = v;
    let bytes = cost(&limits);
    if bytes > ctx.limit_bytes {
        d.charge(phys, bytes - ctx.limit_bytes)?;
    } else {
        d.refund(phys, ctx.limit_bytes - bytes);
    }
    ctx.limits = limits;
    ctx.limit_bytes = bytes;
    Ok(())
}

cu_fn! {
fn cuInit(flags: c_uint) { init(flags) }

fn cuDriverGetVersion(v: *mut c_int) { out(v, DRIVER_VERSION) }

fn cuGetErrorName(e: CUresult, s: *mut *const c_char) {
    let (_, name, _) = ERRORS.iter().find(|x| x.0 == e).ok_or(INVALID_VALUE)?;
    out(s, leak_cstr(name))
}

fn cuGetErrorString(e: CUresult, s: *mut *const c_char) {
    let (_, _, text) = ERRORS.iter().find(|x| x.0 == e).ok_or(INVALID_VALUE)?;
    out(s, leak_cstr(text))
}

fn cuCtxCreate_v2(pctx: *mut Handle, flags: c_uint, dev: CUdevice) {
    let d = drv()?;
    if pctx.is_null() { return Err(INVALID_VALUE); }
    let h = d.create_ctx(&mut lock(&d.objs), dev, flags, false)?;
    stack_push(h);
    out(pctx, h)
}

fn cuCtxCreate_v3(pctx: *mut Handle, _params: *mut c_void, _n: c_int, flags: c_uint, dev: CUdevice) {
    cuCtxCreate_v2_impl(pctx, flags, dev)
}

fn cuCtxCreate_v4(pctx: *mut Handle, _params: *mut c_void, flags: c_uint, dev: CUdevice) {
    cuCtxCreate_v2_impl(pctx, flags, dev)
}

fn cuCtxDestroy_v2(ctx: Handle) {
    let d = drv()?;
    let mut objs = lock(&d.objs);
    if objs.ctxs.get(&ctx).ok_or(INVALID_CONTEXT)?.primary { return Err(INVALID_CONTEXT); }
    d.destroy_ctx(&mut objs, ctx)
}

fn cuCtxPushCurrent_v2(ctx: Handle) {
    let d = drv()?;
    if !lock(&d.objs).ctxs.contains_key(&ctx) { return Err(INVALID_CONTEXT); }
    stack_push(ctx);
    Ok(())
}

fn cuCtxPopCurrent_v2(pctx: *mut Handle) {
    drv()?;
    let h = stack_pop();
    if h == 0 { return Err(INVALID_CONTEXT); }
    if !pctx.is_null() { out(pctx, h)?; }
    Ok(())
}

fn cuCtxSetCurrent(ctx: Handle) {
    let d = drv()?;
    if ctx != 0 && !lock(&d.objs).ctxs.contains_key(&ctx) { return Err(INVALID_CONTEXT); }
    stack_set(ctx);
    Ok(())
}

fn cuCtxGetCurrent(pctx: *mut Handle) {
    let d = drv()?;
    let top = stack_top();
    let valid = top != 0 && lock(&d.objs).ctxs.contains_key(&top);
    out(pctx, if valid { top } else { 0 })
}

fn cuCtxGetDevice(dev: *mut CUdevice) {
    let d = drv()?;
    let (_, ord, _) = current(d)?;
    out(dev, ord as CUdevice)
}

fn cuCtxGetFlags(flags: *mut c_uint) {
    let d = drv()?;
    let (h, _, _) = current(d)?;
    let f = lock(&d.objs).ctxs.get(&h).map(|c| c.flags).ok_or(INVALID_CONTEXT)?;
    out(flags, f)
}

fn cuCtxGetApiVersion(ctx: Handle, v: *mut c_uint) {
    let d = drv()?;
    let h = if ctx == 0 { current(d)?.0 } else { ctx };
    if !lock(&d.objs).ctxs.contains_key(&h) { return Err(INVALID_CONTEXT); }
    out(v, 3020)
}

fn cuCtxSynchronize() {
    let d = drv()?;
    let (_, _, phys) = current(d)?;
    crate::timeline::drain(None);
    release_pools(d, &mut lock(&d.objs), phys);
    Ok(())
}

fn cuDevicePrimaryCtxRetain(pctx: *mut Handle, dev: CUdevice) {
    let d = drv()?;
    if pctx.is_null() { return Err(INVALID_VALUE); }
    d.phys(dev)?;
    let mut objs = lock(&d.objs);
    let p = &objs.primary[dev as usize];
    let (mut h, flags, last) = (p.handle, p.flags, p.last);
    if h == 0 {
        h = d.create_ctx_as(&mut objs, dev, flags, true, d.ctx_bytes, last)?;
    }
    let p = &mut objs.primary[dev as usize];
    p.handle = h;
    p.last = h;
    p.refs += 1;
    out(pctx, h)
}

fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) {
    let d = drv()?;
    d.phys(dev)?;
    let mut objs = lock(&d.objs);
    let p = &mut objs.primary[dev as usize];
    if p.refs == 0 { return Err(INVALID_CONTEXT); }
    p.refs -= 1;
    if p.refs == 0 {
        let h = std::mem::take(&mut p.handle);
        d.destroy_ctx(&mut objs, h)?;
    }
    Ok(())
}

fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) {
    let d = drv()?;
    d.phys(dev)?;
    let mut objs = lock(&d.objs);
    let p = &mut objs.primary[dev as usize];
    let h = std::mem::take(&mut p.handle);
    p.refs = 0;
    if h != 0 { d.destroy_ctx(&mut objs, h)?; }
    Ok(())
}

fn cuDevicePrimaryCtxGetState(dev: CUdevice, flags: *mut c_uint, active: *mut c_int) {
    let d = drv()?;
    d.phys(dev)?;
    let objs = lock(&d.objs);
    let p = &objs.primary[dev as usize];
    out(flags, p.flags)?;
    out(active, (p.handle != 0) as c_int)
}

fn cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: c_uint) {
    let d = drv()?;
    d.phys(dev)?;
    lock(&d.objs).primary[dev as usize].flags = flags;
    Ok(())
}

fn cuStreamCreate(ps: *mut Handle, flags: c_uint) {
    let d = drv()?;
    if ps.is_null() { return Err(INVALID_VALUE); }
    let (ctx, _, phys) = current(d)?;
    let h = new_handle();
    if let Some(q) = crate::stream_queues::queues().as_mut() { q.created(h as u64, flags); }
    lock(&d.objs).streams.insert(h, Stream { phys, ctx });
    out(ps, h)
}

fn cuStreamCreateWithPriority(ps: *mut Handle, flags: c_uint, _prio: c_int) { cuStreamCreate_impl(ps, flags) }

fn cuStreamDestroy_v2(s: Handle) {
    let d = drv()?;
    let mut objs = lock(&d.objs);
    stream_phys(d, &objs, s)?;
    objs.streams.remove(&s).ok_or(INVALID_HANDLE)?;
    objs.dead_streams.insert(s);
    if let Some(q) = crate::stream_queues::queues().as_mut() { q.destroyed(s as u64); }
    Ok(())
}

fn cuStreamSynchronize(s: Handle) {
    let d = drv()?;
    stream_phys(d, &lock(&d.objs), s)?;
    crate::timeline::drain(Some(s as u64));
    let mut objs = lock(&d.objs);
    let phys = stream_phys(d, &objs, s)?;
    release_pools(d, &mut objs, phys);
    Ok(())
}

fn cuStreamQuery(s: Handle) {
    let d = drv()?;
    stream_phys(d, &lock(&d.objs), s)?;
    // One queue per process (unless FAKE_CUDA_STREAM_QUEUES): a stream's work is done when the process's is.
    if crate::timeline::drained(s as u64) { Ok(()) } else { Err(NOT_READY) }
}

fn cuLaunchHostFunc(s: Handle, f: Option<unsafe extern "C" fn(*mut c_void)>, data: *mut c_void) {
    let d = drv()?;
    let f = f.ok_or(INVALID_VALUE)?;
    stream_phys(d, &lock(&d.objs), s)?;
    // Host nodes of a capture are not modelled.
    if crate::api_capture::capturing(s) { return Err(NOT_SUPPORTED); }
    // Runs on the fake's callback thread once the stream's work before it is done; the stream's next
    // work waits for its round trip (FAKE_CUDA_HOSTFUNC_US).
    let at = crate::timeline::host_func(s as u64);
    host_funcs().send((at, f as usize, data as usize)).map_err(|_| UNKNOWN)
}

fn cuEventCreate(pe: *mut Handle, _flags: c_uint) {
    let d = drv()?;
    if pe.is_null() { return Err(INVALID_VALUE); }
    let (ctx, _, _) = current(d)?;
    let h = new_handle();
    let mut objs = lock(&d.objs);
    objs.events.insert(h, 0);
    objs.event_ctx.insert(h, ctx);
    out(pe, h)
}

fn cuEventDestroy_v2(e: Handle) {
    let d = drv()?;
    let mut objs = lock(&d.objs);
    dead_event(&objs, e)?;
    objs.event_ctx.remove(&e);
    objs.events.remove(&e).map(|_| ()).ok_or(INVALID_HANDLE)
}

fn cuEventRecord(e: Handle, s: Handle) {
    // FAKE_CUDA_EVENT_RECORD_US: what recording costs the calling thread (an H100's driver takes about
    // what a launch takes), so a test can see how many records a launch makes.
    crate::timeline::record_cost();
    let d = drv()?;
    let mut objs = lock(&d.objs);
    dead_event(&objs, e)?;
    stream_phys(d, &objs, s)?;
    // As the driver: the event and the stream must be of one context.
    let home = stream_ctx(&objs, s)?;
    if objs.event_ctx.get(&e).is_some_and(|&c| c != home) { return Err(INVALID_HANDLE); }
    if crate::api_capture::capturing(s) { return objs.events.contains_key(&e).then_some(()).ok_or(INVALID_HANDLE); }
    let stamp = objs.events.get_mut(&e).ok_or(INVALID_HANDLE)?;
    *stamp = crate::timeline::stamp(s as u64);
    Ok(())
}

fn cuEventSynchronize(e: Handle) {
    let d = drv()?;
    crate::api_capture::unsafe_call()?;
    dead_event(&lock(&d.objs), e)?;
    let stamp = lock(&d.objs).events.get(&e).copied().ok_or(INVALID_HANDLE)?;
    crate::timeline::wait_for(crate::timeline::resolve(stamp));
    Ok(())
}

fn cuEventQuery(e: Handle) {
    crate::timeline::read_cost();
    let d = drv()?;
    crate::api_capture::unsafe_call()?;
    dead_event(&lock(&d.objs), e)?;
    let stamp = lock(&d.objs).events.get(&e).copied().ok_or(INVALID_HANDLE)?;
    if crate::timeline::done(crate::timeline::resolve(stamp)) { Ok(()) } else { Err(NOT_READY) }
}

fn cuEventElapsedTime(ms: *mut f32, a: Handle, b: Handle) {
    crate::timeline::read_cost();
    let d = drv()?;
    let objs = lock(&d.objs);
    dead_event(&objs, a)?;
    dead_event(&objs, b)?;
    let (Some(&ta), Some(&tb)) = (objs.events.get(&a), objs.events.get(&b)) else { return Err(INVALID_HANDLE) };
    // As the driver: both must have been recorded, and be complete.
    if ta == 0 || tb == 0 { return Err(INVALID_HANDLE); }
    let (ta, tb) = (crate::timeline::resolve(ta), crate::timeline::resolve(tb));
    if !crate::timeline::done(ta) || !crate::timeline::done(tb) { return Err(NOT_READY); }
    // FAKE_CUDA_ELAPSED_SCALE: intervals read as this fraction of what the work took, as they do for a
    // tenant that makes its timed launches short and the others long (a test of what holds without them).
    let scale = std::env::var("FAKE_CUDA_ELAPSED_SCALE").ok().and_then(|v| v.parse::<f64>().ok()).unwrap_or(1.0);
    out(ms, ((tb as f64 - ta as f64) * scale) as f32 / 1e6)
}

fn cuCtxGetLimit(v: *mut usize, limit: c_int) {
    let d = drv()?;
    let (h, _, _) = current(d)?;
    // stack size, printf FIFO, malloc heap (per context), runtime sync depth, pending launches, L2 fetch,
    // persisting L2
    let own = lock(&d.objs).ctxs.get(&h).map(|c| c.limits).ok_or(INVALID_CONTEXT)?;
    out(v, match limit { 0..=2 => own[limit as usize] as usize, 3 => 2, 4 => 2048, 5 => 64, 6 => 0, _ => return Err(INVALID_VALUE) })
}

fn cuCtxSetLimit(limit: c_int, v: usize) {
    let d = drv()?;
    let (h, _, phys) = current(d)?;
    if !(0..=6).contains(&limit) { return Err(INVALID_VALUE); }
    if limit > 2 { return Ok(()); }
    // FAKE_CUDA_SET_LIMIT_DELAY_MS: a slow set (no lock of the fake held), so a test can fork meanwhile.
    if let Some(ms) = std::env::var("FAKE_CUDA_SET_LIMIT_DELAY_MS").ok().and_then(|v| v.parse().ok()) {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
    set_limit(d, &mut lock(&d.objs), h, phys, limit as usize, v as u64)
}

fn cuCtxGetStreamPriorityRange(least: *mut c_int, greatest: *mut c_int) {
    let d = drv()?;
    current(d)?;
    if !least.is_null() { out(least, 0)?; }
    if !greatest.is_null() { out(greatest, -5)?; }
    Ok(())
}

fn cuStreamGetFlags(s: Handle, flags: *mut c_uint) {
    let d = drv()?;
    stream_phys(d, &lock(&d.objs), s)?;
    out(flags, 0)
}

fn cuStreamGetDevice(s: Handle, dev: *mut CUdevice) {
    let d = drv()?;
    let phys = stream_phys(d, &lock(&d.objs), s)?;
    out(dev, d.ordinal(phys) as CUdevice)
}

fn cuStreamGetPriority(s: Handle, prio: *mut c_int) {
    let d = drv()?;
    stream_phys(d, &lock(&d.objs), s)?;
    out(prio, 0)
}

fn cuDeviceCanAccessPeer(can: *mut c_int, dev: CUdevice, peer: CUdevice) {
    let d = drv()?;
    d.phys(dev)?;
    d.phys(peer)?;
    out(can, 0)
}

fn cuStreamWaitEvent(s: Handle, e: Handle, _flags: c_uint) {
    let d = drv()?;
    let stamp = lock(&d.objs).events.get(&e).copied().ok_or(INVALID_HANDLE)?;
    if stamp != 0 { crate::timeline::wait_event(s as u64, stamp); }
    Ok(())
}
}

unsafe fn cuCtxCreate_v2_impl(pctx: *mut Handle, flags: c_uint, dev: CUdevice) -> R {
    match cuCtxCreate_v2(pctx, flags, dev) {
        SUCCESS => Ok(()),
        e => Err(e),
    }
}

unsafe fn cuStreamCreate_impl(ps: *mut Handle, flags: c_uint) -> R {
    match cuStreamCreate(ps, flags) {
        SUCCESS => Ok(()),
        e => Err(e),
    }
}

/// A NUL-terminated copy of a static string, made once per string (the C API returns pointers
/// that stay valid forever).
fn leak_cstr(s: &'static str) -> *const c_char {
    use std::collections::HashMap;
    use std::sync::Mutex;
    static CACHE: Mutex<Option<HashMap<usize, usize>>> = Mutex::new(None);
    let mut c = lock(&CACHE);
    let m = c.get_or_insert_with(HashMap::new);
    *m.entry(s.as_ptr() as usize)
        .or_insert_with(|| std::ffi::CString::new(s).unwrap_or_default().into_raw() as usize)
        as *const c_char
}

cu_alias! {
    cuCtxCreate => cuCtxCreate_v2(pctx: *mut Handle, flags: c_uint, dev: CUdevice);
    cuCtxDestroy => cuCtxDestroy_v2(ctx: Handle);
    cuCtxPushCurrent => cuCtxPushCurrent_v2(ctx: Handle);
    cuCtxPopCurrent => cuCtxPopCurrent_v2(pctx: *mut Handle);
    cuDevicePrimaryCtxRelease => cuDevicePrimaryCtxRelease_v2(dev: CUdevice);
    cuDevicePrimaryCtxReset => cuDevicePrimaryCtxReset_v2(dev: CUdevice);
    cuDevicePrimaryCtxSetFlags => cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: c_uint);
    cuStreamDestroy => cuStreamDestroy_v2(s: Handle);
    cuEventDestroy => cuEventDestroy_v2(e: Handle);
    cuStreamSynchronize_ptsz => cuStreamSynchronize(s: Handle);
    cuStreamQuery_ptsz => cuStreamQuery(s: Handle);
    cuLaunchHostFunc_ptsz => cuLaunchHostFunc(s: Handle, f: Option<unsafe extern "C" fn(*mut c_void)>, data: *mut c_void);
    cuEventRecord_ptsz => cuEventRecord(e: Handle, s: Handle);
    cuStreamWaitEvent_ptsz => cuStreamWaitEvent(s: Handle, e: Handle, flags: c_uint);
    cuStreamGetFlags_ptsz => cuStreamGetFlags(s: Handle, flags: *mut c_uint);
    cuStreamGetDevice_ptsz => cuStreamGetDevice(s: Handle, dev: *mut CUdevice);
    cuStreamGetPriority_ptsz => cuStreamGetPriority(s: Handle, prio: *mut c_int);
}

/// The callback thread (one, as the driver's): runs each host function when its stream reaches it, in
/// the order they were queued.
fn host_funcs() -> std::sync::mpsc::Sender<(u64, usize, usize)> {
    static TX: std::sync::Mutex<Option<std::sync::mpsc::Sender<(u64, usize, usize)>>> =
        std::sync::Mutex::new(None);
    let mut tx = TX.lock().unwrap_or_else(|e| e.into_inner());
    tx.get_or_insert_with(|| {
        let (tx, rx) = std::sync::mpsc::channel::<(u64, usize, usize)>();
        std::thread::spawn(move || {
            for (at, f, data) in rx {
                crate::timeline::wait_for(at);
                // SAFETY: the caller's function (a `CUhostFn`) and argument, called once as the driver does.
                let f: unsafe extern "C" fn(*mut c_void) = unsafe { std::mem::transmute(f) };
                unsafe { f(data as *mut c_void) }
            }
        });
        tx
    })
    .clone()
}
