//! Deprecated entry points whose memory or work the library does not follow, refused while any limit
//! applies (`CUDA_ERROR_NOT_SUPPORTED`, one log line each call); without a limit they are the driver's own.
//! * `cuLaunch`, `cuLaunchGrid`, `cuLaunchGridAsync` (deprecated since CUDA 3.2): launches the compute
//!   share and the stack check do not meter; `cuLaunchKernel` does the same work and is metered.
//!   (`cuLaunchCooperativeKernelMultiDevice` is `hooks/launch`'s: refused on a device under a share.)
//! * `cuGLCtxCreate[_v2]`, `cuVDPAUCtxCreate[_v2]` (deprecated interop contexts) and `cuCtxDetach`
//!   (since 4.0; the last detach destroys the context): contexts made or ended past the measured
//!   `cuCtxCreate` / `cuCtxDestroy`.
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_int, c_uint, c_void};

use super::common::{hook, interposer, Interposer};
use crate::driver::Driver;
use crate::ffi::*;
use crate::log;
use crate::real_symbols::forward;

impl<D: Driver> Interposer<'_, D> {
    /// `call` without a limit; under one, `what` is refused with CUDA_ERROR_NOT_SUPPORTED (`instead`:
    /// what to use, for the log line).
    pub(crate) fn refused_under_limit(
        &self,
        what: &str,
        instead: &str,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        if self.drv.unlimited() {
            return call();
        }
        log::warn(format_args!(
            "{what}: deprecated, and not metered under a limit (use {instead}): CUDA_ERROR_NOT_SUPPORTED"
        ));
        CUDA_ERROR_NOT_SUPPORTED
    }
}

hook!(cuLaunch(f: *mut c_void) {
    interposer().refused_under_limit("cuLaunch", "cuLaunchKernel", || forward!("cuLaunch", fn(*mut c_void), f))
});
hook!(cuLaunchGrid(f: *mut c_void, w: c_int, h: c_int) {
    interposer().refused_under_limit("cuLaunchGrid", "cuLaunchKernel", || forward!("cuLaunchGrid", fn(*mut c_void, c_int, c_int), f, w, h))
});
hook!(cuLaunchGridAsync(f: *mut c_void, w: c_int, h: c_int, s: CUstream) {
    interposer().refused_under_limit("cuLaunchGridAsync", "cuLaunchKernel", || forward!("cuLaunchGridAsync", fn(*mut c_void, c_int, c_int, CUstream), f, w, h, s))
});
hook!(cuGLCtxCreate(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) {
    interposer().refused_under_limit("cuGLCtxCreate", "cuCtxCreate", || forward!("cuGLCtxCreate", fn(*mut CUcontext, c_uint, CUdevice), pctx, flags, dev))
});
hook!(cuGLCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) {
    interposer().refused_under_limit("cuGLCtxCreate_v2", "cuCtxCreate", || forward!("cuGLCtxCreate_v2", fn(*mut CUcontext, c_uint, CUdevice), pctx, flags, dev))
});
hook!(cuVDPAUCtxCreate(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice, vdp: c_uint, getproc: *mut c_void) {
    interposer().refused_under_limit("cuVDPAUCtxCreate", "cuCtxCreate", || forward!("cuVDPAUCtxCreate", fn(*mut CUcontext, c_uint, CUdevice, c_uint, *mut c_void), pctx, flags, dev, vdp, getproc))
});
hook!(cuVDPAUCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice, vdp: c_uint, getproc: *mut c_void) {
    interposer().refused_under_limit("cuVDPAUCtxCreate_v2", "cuCtxCreate", || forward!("cuVDPAUCtxCreate_v2", fn(*mut CUcontext, c_uint, CUdevice, c_uint, *mut c_void), pctx, flags, dev, vdp, getproc))
});
hook!(cuCtxDetach(ctx: CUcontext) {
    interposer().refused_under_limit("cuCtxDetach", "cuCtxDestroy", || forward!("cuCtxDetach", fn(CUcontext), ctx))
});

#[cfg(test)]
mod tests {
    use super::super::testing::World;
    use super::*;
    use crate::settings::Applies;

    #[test]
    fn refused_under_a_limit_and_the_drivers_own_without() {
        let w = World::new(1 << 30);
        let e = w.interposer();
        let r = e.refused_under_limit("t", "u", || panic!("reached the driver under a limit"));
        assert_eq!(r, CUDA_ERROR_NOT_SUPPORTED);
        w.fake.set_applies(Applies::Nowhere);
        assert_eq!(e.refused_under_limit("t", "u", || 7), 7);
    }
}
