//! Kernel launches: every way work reaches the GPU through the driver API (`cuLaunchKernel`,
//! `cuLaunchKernelEx`, cooperative launches, each also `_ptsz`; graph launches are in `graphs`) goes
//! through `launch`, which forwards at once unless a compute share applies (`compute`).
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_uint, c_void};

use super::{engine, hook};
use crate::compute;
use crate::ffi::*;
use crate::real::forward;

/// The stream a launch runs on as `cuEventRecord` names it: a `_ptsz` entry point's stream 0 is the
/// calling thread's default stream.
pub(crate) fn stream_of(s: CUstream, ptsz: bool) -> CUstream {
    if ptsz && s.is_null() {
        compute::STREAM_PER_THREAD as CUstream
    } else {
        s
    }
}

/// Runs `call` (a launch of `work` on `stream`) under the compute share of the current device, if any.
#[inline]
pub(crate) fn launch(
    stream: CUstream,
    ptsz: bool,
    work: compute::Work,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    if compute::off() {
        return call();
    }
    let Some((dev, ctx)) = engine().current() else {
        return call();
    };
    compute::throttled(dev, ctx, stream_of(stream, ptsz), work, call)
}

/// The stream and grid of a `cuLaunchKernelEx` configuration (null: the driver refuses the call itself).
fn config_of(config: *const CUlaunchConfig) -> (CUstream, [c_uint; 3]) {
    if config.is_null() {
        return (std::ptr::null_mut(), [0; 3]);
    }
    // SAFETY: the caller's launch configuration, read before the driver reads it.
    unsafe { ((*config).h_stream, (*config).grid) }
}

hook!(cuLaunchKernel(f: *mut c_void, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
                     shmem: c_uint, s: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) {
    launch(s, false, (f as usize, [gx, gy, gz]), || forward!("cuLaunchKernel",
        fn(*mut c_void, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void, *mut *mut c_void),
        f, gx, gy, gz, bx, by, bz, shmem, s, params, extra))
});
hook!(cuLaunchKernel_ptsz(f: *mut c_void, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
                          shmem: c_uint, s: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) {
    launch(s, true, (f as usize, [gx, gy, gz]), || forward!("cuLaunchKernel_ptsz",
        fn(*mut c_void, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void, *mut *mut c_void),
        f, gx, gy, gz, bx, by, bz, shmem, s, params, extra))
});
hook!(cuLaunchKernelEx(config: *const CUlaunchConfig, f: *mut c_void, params: *mut *mut c_void, extra: *mut *mut c_void) {
    let (s, grid) = config_of(config);
    launch(s, false, (f as usize, grid), || forward!("cuLaunchKernelEx",
        fn(*const CUlaunchConfig, *mut c_void, *mut *mut c_void, *mut *mut c_void), config, f, params, extra))
});
hook!(cuLaunchKernelEx_ptsz(config: *const CUlaunchConfig, f: *mut c_void, params: *mut *mut c_void, extra: *mut *mut c_void) {
    let (s, grid) = config_of(config);
    launch(s, true, (f as usize, grid), || forward!("cuLaunchKernelEx_ptsz",
        fn(*const CUlaunchConfig, *mut c_void, *mut *mut c_void, *mut *mut c_void), config, f, params, extra))
});
hook!(cuLaunchCooperativeKernel(f: *mut c_void, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
                                shmem: c_uint, s: CUstream, params: *mut *mut c_void) {
    launch(s, false, (f as usize, [gx, gy, gz]), || forward!("cuLaunchCooperativeKernel",
        fn(*mut c_void, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void),
        f, gx, gy, gz, bx, by, bz, shmem, s, params))
});
hook!(cuLaunchCooperativeKernel_ptsz(f: *mut c_void, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
                                     shmem: c_uint, s: CUstream, params: *mut *mut c_void) {
    launch(s, true, (f as usize, [gx, gy, gz]), || forward!("cuLaunchCooperativeKernel_ptsz",
        fn(*mut c_void, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void),
        f, gx, gy, gz, bx, by, bz, shmem, s, params))
});
