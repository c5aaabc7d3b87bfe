//! The other ways to launch a kernel (`cuLaunchKernelEx`, cooperative launches, and
//! `cuLaunchCooperativeKernelMultiDevice`, one kernel per entry), each run as `cuLaunchKernel` runs it,
//! and what a launch's stream says about where it runs: `cuStreamGetCtx` and `cuCtxGetDevice_v2`.

use crate::api_module::launch;
use crate::driver::*;
use crate::types::*;
use std::ffi::{c_uint, c_void};

/// `CUlaunchConfig` as cuda.h lays it out.
#[repr(C)]
pub struct LaunchConfig {
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared_mem: c_uint,
    stream: Handle,
    attrs: *mut c_void,
    num_attrs: c_uint,
}

/// `CUDA_LAUNCH_PARAMS` (one device's entry of a multi-device launch).
#[repr(C)]
pub struct LaunchParams {
    function: Handle,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared_mem: c_uint,
    stream: Handle,
    params: *mut *mut c_void,
}

cu_fn! {
fn cuStreamGetCtx(s: Handle, pctx: *mut Handle) {
    let d = drv()?;
    let ctx = stream_ctx(&lock(&d.objs), s)?;
    out(pctx, ctx)
}

fn cuCtxGetDevice_v2(dev: *mut CUdevice, ctx: Handle) {
    let d = drv()?;
    let ord = match ctx {
        0 => current(d)?.1,
        c => lock(&d.objs).ctxs.get(&c).map(|c| c.ordinal).ok_or(INVALID_CONTEXT)?,
    };
    out(dev, ord as CUdevice)
}

fn cuLaunchKernelEx(config: *const LaunchConfig, f: Handle, _params: *mut *mut c_void, _extra: *mut *mut c_void) {
    if config.is_null() { return Err(INVALID_VALUE); }
    let c = &*config;
    launch(f, c.grid, c.block, c.stream)
}

fn cuLaunchCooperativeKernel(f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
                             _shmem: c_uint, stream: Handle, _params: *mut *mut c_void) {
    launch(f, [gx, gy, gz], [bx, by, bz], stream)
}

fn cuLaunchCooperativeKernelMultiDevice(list: *mut LaunchParams, n: c_uint, _flags: c_uint) {
    if list.is_null() || n == 0 { return Err(INVALID_VALUE); }
    for i in 0..n as usize {
        let p = &*list.add(i);
        launch(p.function, p.grid, p.block, p.stream)?;
    }
    Ok(())
}
}

cu_alias! {
    cuStreamGetCtx_ptsz => cuStreamGetCtx(s: Handle, pctx: *mut Handle);
    cuLaunchKernelEx_ptsz => cuLaunchKernelEx(config: *const LaunchConfig, f: Handle, params: *mut *mut c_void, extra: *mut *mut c_void);
    cuLaunchCooperativeKernel_ptsz => cuLaunchCooperativeKernel(f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
                                                                shmem: c_uint, stream: Handle, params: *mut *mut c_void);
}
