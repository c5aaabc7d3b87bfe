//! Contexts: `cuCtxCreate*`, `cuCtxDestroy*` and the primary context's retain/release/reset. A context's
//! own memory is measured (not asked for by size); destroying it gives back everything recorded in it.
//!
//! Measurement: the device's used memory as NVML reports it, before and after creation (a context is not
//! current yet, so cuMemGetInfo cannot be asked). Another process allocating at the same instant can skew
//! it: context creations of the processes sharing a quota are serialised by a record lock on a file next
//! to the ledger, what the ledger recorded meanwhile is subtracted, and the result is clamped to
//! [0, ceiling]. If the measured memory does not fit, the context is destroyed again and the call fails
//! with out-of-memory.
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_uint, c_void};

use vgpu_ledger::Kind;

use super::{engine, hook, measured, Engine, Target};
use crate::driver::Driver;
use crate::error::Error;
use crate::ffi::*;
use crate::guard::exiting;
use crate::log;
use crate::quota::DeviceQuota;
use crate::real::forward;
use crate::records::{self, Rec};

const CONTEXT_CEILING: u64 = 2 << 30;

impl<D: Driver> Engine<'_, D> {
    /// Runs `create` and measures what it took on the device (0 without a quota to measure for).
    fn measure_ctx(
        &self,
        dev: CUdevice,
        q: Option<&DeviceQuota>,
        create: impl FnOnce() -> CUresult,
    ) -> (CUresult, u64) {
        let Some(q) = q else { return (create(), 0) };
        let _measuring = q.measure_lock();
        let (before, lb) = (self.drv.device_used(&q.uuid), q.used());
        let r = create();
        let (after, la) = (self.drv.device_used(&q.uuid), q.used());
        let cost = match (before, after) {
            (Some(b), Some(a)) => measured(
                a as i128 - b as i128,
                la as i128 - lb as i128,
                CONTEXT_CEILING,
            ),
            _ => 0,
        };
        log::debug(format_args!("context on device {dev}: {cost} bytes"));
        (r, cost)
    }

    /// cuCtxCreate*: the new context written to `pctx` by `create` is charged what it measured.
    pub(crate) fn ctx_create(
        &self,
        pctx: *mut CUcontext,
        dev: CUdevice,
        create: impl FnOnce() -> CUresult,
    ) -> CUresult {
        if pctx.is_null() || self.drv.unlimited() || exiting() {
            return create();
        }
        let q = match self.target(Some(dev)) {
            Target::Charge(q) => q,
            Target::Forward => return create(),
            Target::Fail(e) => return e.cuda(),
        };
        let (r, cost) = self.measure_ctx(dev, Some(q), create);
        if r != CUDA_SUCCESS {
            return r;
        }
        // SAFETY: non-null, written by the driver.
        let ctx = unsafe { *pctx } as usize;
        if !q.charge(Kind::Context, cost) {
            self.drv.ctx_destroy(ctx);
            return Error::OutOfMemory.cuda();
        }
        self.rec
            .contexts
            .insert(ctx as u64, Rec::new(dev, Kind::Context, cost, ctx));
        r
    }

    /// The driver freed everything of context `ctx`: give back its records.
    pub(crate) fn context_gone(&self, ctx: usize) {
        records::context_gone();
        if let Some(rec) = self.rec.contexts.remove(ctx as u64) {
            self.release(&rec);
        }
        for t in [&self.rec.allocs, &self.rec.arrays, &self.rec.modules] {
            for (_, rec) in t.drain_where(|r| r.ctx == ctx) {
                self.release(&rec);
            }
        }
    }

    /// cuDevicePrimaryCtxRetain: the first retain of an inactive primary context creates it (measured).
    pub(crate) fn primary_retain(
        &self,
        pctx: *mut CUcontext,
        dev: CUdevice,
        retain: impl FnOnce() -> CUresult,
    ) -> CUresult {
        if pctx.is_null() || self.drv.unlimited() || exiting() {
            return retain();
        }
        let q = match self.target(Some(dev)) {
            Target::Charge(q) => q,
            Target::Forward => return retain(),
            Target::Fail(e) => return e.cuda(),
        };
        let fresh = !self.drv.primary_active(dev);
        let (r, cost) = self.measure_ctx(dev, fresh.then_some(q), retain);
        if r != CUDA_SUCCESS {
            return r;
        }
        // SAFETY: non-null, written by the driver.
        let ctx = unsafe { *pctx } as usize;
        if fresh && cost > 0 {
            if !q.charge(Kind::Context, cost) {
                self.drv.primary_release(dev);
                return Error::OutOfMemory.cuda();
            }
            self.rec
                .contexts
                .insert(ctx as u64, Rec::new(dev, Kind::Context, cost, ctx));
        }
        self.rec.primary.update(dev as u64, || 0, |n| *n += 1);
        r
    }

    /// cuDevicePrimaryCtxRelease / Reset: when the last retain goes (or on reset) the context is gone.
    pub(crate) fn primary_release(
        &self,
        dev: CUdevice,
        call: impl FnOnce() -> CUresult,
        reset: bool,
    ) -> CUresult {
        if self.drv.unlimited() {
            return call();
        }
        // Which context is the primary one: ask the driver before it may go away.
        let ctx = if self.drv.primary_active(dev) {
            self.drv.primary_handle(dev)
        } else {
            None
        };
        let r = call();
        if r != CUDA_SUCCESS {
            return r;
        }
        let last = self.rec.primary.update(
            dev as u64,
            || 0,
            |n| {
                *n = if reset { 0 } else { n.saturating_sub(1) };
                *n == 0
            },
        );
        if let (true, Some(ctx)) = (last, ctx) {
            self.context_gone(ctx);
        }
        r
    }
}

hook!(cuCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) {
    engine().ctx_create(pctx, dev, || forward!("cuCtxCreate_v2", fn(*mut CUcontext, c_uint, CUdevice), pctx, flags, dev))
});
hook!(cuCtxCreate(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) {
    engine().ctx_create(pctx, dev, || forward!("cuCtxCreate", fn(*mut CUcontext, c_uint, CUdevice), pctx, flags, dev))
});
hook!(cuCtxCreate_v3(pctx: *mut CUcontext, params: *mut c_void, n: i32, flags: c_uint, dev: CUdevice) {
    engine().ctx_create(pctx, dev, || forward!("cuCtxCreate_v3", fn(*mut CUcontext, *mut c_void, i32, c_uint, CUdevice), pctx, params, n, flags, dev))
});
hook!(cuCtxCreate_v4(pctx: *mut CUcontext, params: *mut c_void, flags: c_uint, dev: CUdevice) {
    engine().ctx_create(pctx, dev, || forward!("cuCtxCreate_v4", fn(*mut CUcontext, *mut c_void, c_uint, CUdevice), pctx, params, flags, dev))
});

hook!(cuCtxDestroy_v2(ctx: CUcontext) {
    let r = forward!("cuCtxDestroy_v2", fn(CUcontext), ctx);
    if r == CUDA_SUCCESS { engine().context_gone(ctx as usize); }
    r
});
hook!(cuCtxDestroy(ctx: CUcontext) {
    let r = forward!("cuCtxDestroy", fn(CUcontext), ctx);
    if r == CUDA_SUCCESS { engine().context_gone(ctx as usize); }
    r
});

hook!(cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) {
    engine().primary_retain(pctx, dev, || forward!("cuDevicePrimaryCtxRetain", fn(*mut CUcontext, CUdevice), pctx, dev))
});
hook!(cuDevicePrimaryCtxRelease_v2(dev: CUdevice) {
    engine().primary_release(dev, || forward!("cuDevicePrimaryCtxRelease_v2", fn(CUdevice), dev), false)
});
hook!(cuDevicePrimaryCtxRelease(dev: CUdevice) {
    engine().primary_release(dev, || forward!("cuDevicePrimaryCtxRelease", fn(CUdevice), dev), false)
});
hook!(cuDevicePrimaryCtxReset_v2(dev: CUdevice) {
    engine().primary_release(dev, || forward!("cuDevicePrimaryCtxReset_v2", fn(CUdevice), dev), true)
});
hook!(cuDevicePrimaryCtxReset(dev: CUdevice) {
    engine().primary_release(dev, || forward!("cuDevicePrimaryCtxReset", fn(CUdevice), dev), true)
});

#[cfg(test)]
mod tests;
