//! Green contexts (CUDA 12.4+): `cuDeviceGetDevResource` (the device's SMs), `cuDevResourceGenerateDesc`,
//! `cuGreenCtxCreate` — a context of its own on the device, not made current, taking
//! `FAKE_CUDA_GREEN_CONTEXT_BYTES` (default 6 MiB: an H100 green context of all its SMs took 6 MiB with
//! driver 580, where an ordinary context takes ~500) — `cuCtxFromGreenCtx` (its
//! `CUcontext`, a handle other than the green one, usable as any context) and `cuGreenCtxDestroy`, which
//! frees everything made in it. SM partitions are not modelled: a description is a handle.

use crate::driver::*;
use crate::types::*;
use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::Mutex;

/// Green context -> its context.
static GREEN: Mutex<Option<HashMap<Handle, Handle>>> = Mutex::new(None);
/// Resource descriptions made (`cuDevResourceGenerateDesc`).
static DESCS: Mutex<Vec<Handle>> = Mutex::new(Vec::new());

/// `CU_DEV_RESOURCE_TYPE_SM`.
const RESOURCE_SM: c_int = 1;
/// `CU_GREEN_CTX_DEFAULT_STREAM`: the one flag the driver requires.
const DEFAULT_STREAM: c_uint = 1;

fn green<T>(f: impl FnOnce(&mut HashMap<Handle, Handle>) -> T) -> T {
    f(lock(&GREEN).get_or_insert_with(HashMap::new))
}

cu_fn! {
fn cuDeviceGetDevResource(dev: CUdevice, res: *mut c_int, kind: c_int) {
    let d = drv()?;
    d.phys(dev)?;
    if kind != RESOURCE_SM { return Err(INVALID_VALUE); }
    // The resource's type; the rest of the caller's CUdevResource is the driver's own.
    out(res, RESOURCE_SM)
}

fn cuDevResourceGenerateDesc(desc: *mut Handle, res: *mut c_void, n: c_uint) {
    drv()?;
    if res.is_null() || n == 0 { return Err(INVALID_VALUE); }
    let h = new_handle();
    lock(&DESCS).push(h);
    out(desc, h)
}

fn cuGreenCtxCreate(pg: *mut Handle, desc: Handle, dev: CUdevice, flags: c_uint) {
    let d = drv()?;
    if pg.is_null() || !lock(&DESCS).contains(&desc) || flags != DEFAULT_STREAM { return Err(INVALID_VALUE); }
    let bytes = fake_gpu::config::env_size("FAKE_CUDA_GREEN_CONTEXT_BYTES", 6 << 20);
    let ctx = d.create_ctx_of(&mut lock(&d.objs), dev, 0, false, bytes)?;
    let g = new_handle();
    green(|m| m.insert(g, ctx));
    out(pg, g)
}

fn cuCtxFromGreenCtx(pctx: *mut Handle, g: Handle) {
    drv()?;
    out(pctx, green(|m| m.get(&g).copied()).ok_or(INVALID_HANDLE)?)
}

fn cuGreenCtxDestroy(g: Handle) {
    let d = drv()?;
    let ctx = green(|m| m.remove(&g)).ok_or(INVALID_HANDLE)?;
    d.destroy_ctx(&mut lock(&d.objs), ctx)
}
}
