//! Kernel launches: `launch` (validates the arguments, grows the stream's context's stack as the driver
//! does, runs the kernel's time on the fake timeline) and every entry point that reaches it
//! (`cuLaunchKernel`, `cuLaunchKernelEx`, cooperative launches, and `cuLaunchCooperativeKernelMultiDevice`,
//! one kernel per entry),
//! and what a launch's stream says about where it runs: `cuStreamGetCtx` and `cuCtxGetDevice_v2`.

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

pub fn launch(f: Handle, grid: [c_uint; 3], block: [c_uint; 3], stream: Handle) -> R {
    let d = drv()?;
    let f = crate::api_library::launchable(f, stream)?; // a library's kernel: its function in the stream's context
    let mut objs = lock(&d.objs);
    if !objs.functions.contains_key(&f) {
        return Err(INVALID_HANDLE);
    }
    let phys = stream_phys(d, &objs, stream)?;
    let threads = block.iter().map(|&b| b as u64).product::<u64>();
    if grid.contains(&0) || block.contains(&0) || threads > 1024 || block[2] > 64 {
        return Err(INVALID_VALUE);
    }
    // A kernel needing more stack than the context has: the driver grows the context's stack size for
    // every resident thread, on its own (FAKE_CUDA_KERNEL_STACK): the stack of the stream's context.
    let top = stream_ctx(&objs, stream).unwrap_or_else(|_| stack_top());
    if let Some(stack) = objs.ctxs.get(&top).map(|c| c.limits[0]) {
        if d.kernel_stack > stack {
            crate::api_ctx::set_limit(d, &mut objs, top, phys, 0, d.kernel_stack)?;
        }
    }
    drop(objs);
    if crate::api_capture::captured(stream, f, grid, block) {
        return Ok(());
    }
    if d.managed_faults {
        crate::api_managed::fault_in(d, phys);
    }
    // FAKE_CUDA_LAUNCH_HOST_US: the host's time to submit the launch; its kernel is queued at the end.
    crate::timeline::launch_cost();
    // A block `y` threads high is `y` kernels' work (a launch's arguments decide how long it runs).
    crate::timeline::run(&d.shared, phys, stream as u64, block[1].max(1) as u64);
    Ok(())
}

cu_fn! {
fn cuLaunchKernel(f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
                  _shmem: c_uint, stream: Handle, _params: *mut *mut c_void, _extra: *mut *mut c_void) {
    launch(f, [gx, gy, gz], [bx, by, bz], stream)
}

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
    cuLaunchKernel_ptsz => cuLaunchKernel(f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
                                          shmem: c_uint, stream: Handle, params: *mut *mut c_void, extra: *mut *mut c_void);
    cuStreamGetCtx_ptsz => cuStreamGetCtx(s: Handle, pctx: *mut Handle);
    cuLaunchKernelEx_ptsz => cuLaunchKernelEx(config: *const LaunchConfig, f: Handle, params: *mut *mut c_void, extra: *mut *mut c_void);
    cuLaunchCooperativeKernel_ptsz => cuLaunchCooperativeKernel(f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
                                                                shmem: c_uint, stream: Handle, params: *mut *mut c_void);
}
