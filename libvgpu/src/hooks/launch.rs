//! Kernel launches: every way work reaches the GPU through the driver API (`cuLaunchKernel`,
//! `cuLaunchKernelEx`, cooperative launches, each also `_ptsz`; graph launches are in `graphs`, memsets and
//! copies in `transfers`) goes through `launch`, which forwards at once unless a compute share applies
//! (`compute`). The launch's device and context are its stream's (`streams`), never the current
//! context's: a `CUkernel` or another context's function runs in its stream's context whatever is current.
//! `cuLaunchCooperativeKernelMultiDevice` (one launch per device, deprecated since CUDA 11.3) is refused
//! when any of its devices is under a share, and waits for the turn of each of its devices (`turns`).
//! On an oversubscribed GPU every one of these paths first passes the turn gate (`turns::gate`).
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_uint, c_void};
use std::sync::atomic::{AtomicBool, Ordering};

use super::common::hook;
use crate::compute;
use crate::driver::{Driver, RealDriver};
use crate::ffi::*;
use crate::log;
use crate::real_symbols::forward;
use crate::streams;
use crate::turns;

const CUDA_ERROR_NOT_PERMITTED: CUresult = 800;

/// Runs `call` (a launch of `work` on `stream`) once the stream's device's turn lets it (`turns`, on an
/// oversubscribed GPU), under the compute share of that device, if any. Under a share a launch whose
/// stream's device cannot be resolved is refused: its work could run on any device, unthrottled. Under
/// the turn gate alone it goes to the driver, which refuses a stream with no context (the arbiter's wall
/// does not rely on the gate).
#[inline]
pub(crate) fn launch(
    stream: CUstream,
    ptsz: bool,
    work: compute::Work,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let (shared, turns) = (!compute::off(), !turns::off());
    if !shared && !turns {
        return call();
    }
    let s = streams::named(stream, ptsz);
    match streams::home(s) {
        Ok((dev, ctx)) => {
            if turns {
                turns::gate(&RealDriver, dev, ctx, s);
            }
            if shared {
                compute::throttled(dev, ctx, s, work, call)
            } else {
                call()
            }
        }
        Err(e) if shared => unresolved(e),
        Err(_) => call(),
    }
}

/// A kernel launch of `work.0` on `stream`: under a memory limit, the stack growth it needs is charged or
/// refused in its stream's context (`hooks/stack`) and a `CUkernel`'s library measured at its first use
/// there, before `launch` (the compute share, if any) lets it reach the driver. Without a memory limit
/// this is `launch` after one atomic load.
#[inline]
pub(crate) fn kernel(
    stream: CUstream,
    ptsz: bool,
    work: compute::Work,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let e = super::common::interposer();
    if e.drv.unlimited() {
        return launch(stream, ptsz, work, call);
    }
    let s = streams::named(stream, ptsz);
    e.launch_memory(
        work.0,
        || streams::home(s),
        || launch(stream, ptsz, work, call),
    )
}

/// A launch under a share whose stream's context or device the driver would not give: refused with the
/// driver's reason (a default stream with no context current, a stream that is gone), or
/// CUDA_ERROR_NOT_PERMITTED when the driver cannot say at all.
#[cold]
fn unresolved(e: CUresult) -> CUresult {
    static TOLD: AtomicBool = AtomicBool::new(false);
    if !TOLD.swap(true, Ordering::Relaxed) {
        log::warn(format_args!(
            "compute share: a launch whose stream's device cannot be resolved (error {e}) is refused"
        ));
    }
    if e == CUDA_ERROR_NOT_FOUND || e == CUDA_SUCCESS {
        CUDA_ERROR_NOT_PERMITTED
    } else {
        e
    }
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
    kernel(s, false, (f as usize, [gx, gy, gz]), || forward!("cuLaunchKernel",
        fn(*mut c_void, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void, *mut *mut c_void),
        f, gx, gy, gz, bx, by, bz, shmem, s, params, extra))
});
hook!(cuLaunchKernel_ptsz(f: *mut c_void, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
                          shmem: c_uint, s: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) {
    kernel(s, true, (f as usize, [gx, gy, gz]), || forward!("cuLaunchKernel_ptsz",
        fn(*mut c_void, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void, *mut *mut c_void),
        f, gx, gy, gz, bx, by, bz, shmem, s, params, extra))
});
hook!(cuLaunchKernelEx(config: *const CUlaunchConfig, f: *mut c_void, params: *mut *mut c_void, extra: *mut *mut c_void) {
    let (s, grid) = config_of(config);
    kernel(s, false, (f as usize, grid), || forward!("cuLaunchKernelEx",
        fn(*const CUlaunchConfig, *mut c_void, *mut *mut c_void, *mut *mut c_void), config, f, params, extra))
});
hook!(cuLaunchKernelEx_ptsz(config: *const CUlaunchConfig, f: *mut c_void, params: *mut *mut c_void, extra: *mut *mut c_void) {
    let (s, grid) = config_of(config);
    kernel(s, true, (f as usize, grid), || forward!("cuLaunchKernelEx_ptsz",
        fn(*const CUlaunchConfig, *mut c_void, *mut *mut c_void, *mut *mut c_void), config, f, params, extra))
});
hook!(cuLaunchCooperativeKernel(f: *mut c_void, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
                                shmem: c_uint, s: CUstream, params: *mut *mut c_void) {
    kernel(s, false, (f as usize, [gx, gy, gz]), || forward!("cuLaunchCooperativeKernel",
        fn(*mut c_void, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void),
        f, gx, gy, gz, bx, by, bz, shmem, s, params))
});
hook!(cuLaunchCooperativeKernel_ptsz(f: *mut c_void, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
                                     shmem: c_uint, s: CUstream, params: *mut *mut c_void) {
    kernel(s, true, (f as usize, [gx, gy, gz]), || forward!("cuLaunchCooperativeKernel_ptsz",
        fn(*mut c_void, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void),
        f, gx, gy, gz, bx, by, bz, shmem, s, params))
});

/// `CUDA_LAUNCH_PARAMS`: one device's entry of a multi-device cooperative launch.
#[repr(C)]
pub struct LaunchParams {
    pub function: *mut c_void,
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared_mem_bytes: c_uint,
    pub h_stream: CUstream,
    pub kernel_params: *mut *mut c_void,
}

/// Whether a multi-device launch of `n` entries at `list` may go: no entry's device is under a share
/// (an entry whose device cannot be resolved counts as under one).
fn multi_device_allowed(list: *const LaunchParams, n: c_uint) -> bool {
    if compute::off() || list.is_null() {
        return true;
    }
    (0..n as usize).all(|i| {
        // SAFETY: the caller's array of `n` entries, read before the driver reads it.
        let s = unsafe { (*list.add(i)).h_stream };
        streams::home(s).is_ok_and(|(dev, _)| !compute::governed(dev))
    })
}

/// The turn gate of each entry of a multi-device launch, in order (an entry whose stream cannot be
/// resolved goes to the driver, which refuses it).
fn gate_each(list: *const LaunchParams, n: c_uint) {
    if turns::off() || list.is_null() {
        return;
    }
    for i in 0..n as usize {
        // SAFETY: the caller's array of `n` entries, read before the driver reads it.
        let s = unsafe { (*list.add(i)).h_stream };
        if let Ok((dev, ctx)) = streams::home(s) {
            turns::gate(&RealDriver, dev, ctx, s);
        }
    }
}

hook!(cuLaunchCooperativeKernelMultiDevice(list: *mut LaunchParams, n: c_uint, flags: c_uint) {
    gate_each(list, n);
    if !multi_device_allowed(list, n) {
        static TOLD: AtomicBool = AtomicBool::new(false);
        if !TOLD.swap(true, Ordering::Relaxed) {
            log::warn(format_args!(
                "compute share: cuLaunchCooperativeKernelMultiDevice is refused on a device under a compute share"
            ));
        }
        return CUDA_ERROR_NOT_PERMITTED;
    }
    forward!("cuLaunchCooperativeKernelMultiDevice", fn(*mut LaunchParams, c_uint, c_uint), list, n, flags)
});
