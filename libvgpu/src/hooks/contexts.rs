//! Contexts: `cuCtxCreate*`, `cuCtxDestroy*`, the primary context's retain/release/reset, and green
//! contexts (`cuGreenCtxCreate`/`cuGreenCtxDestroy`: contexts of their own, recorded under the `CUcontext`
//! `cuCtxFromGreenCtx` names). A context's own memory is measured (not asked for by size); destroying it
//! gives back everything recorded in it.
//!
//! Measurement (`measure`): this process's own usage in NVML before and after creation, else the device's
//! used memory (NVML, or without NVML the driver's free memory through a context of the device before and
//! the new one after) bounded by the context size this process learned first. Context creations of the
//! processes sharing a quota are serialised by the ledger's measurement lock (a byte range of the ledger).
//! If the measured memory does not fit, the context is destroyed again and the call fails with
//! out-of-memory.
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_uint, c_void};

use vgpu_ledger::Kind;

use super::common::{hook, interposer, Interposer, Target};
use super::measure::{estimate, Probe, Reading};
use crate::compute::teardown;
use crate::driver::Driver;
use crate::error::Error;
use crate::ffi::*;
use crate::guard::exiting;
use crate::log;
use crate::quota::DeviceQuota;
use crate::real_symbols::forward;
use crate::records::{self, Rec};

/// What a context is charged when nothing can measure it (no NVML, no earlier context of the device):
/// about an H100/H200 context with driver 580 (an H200 context measured 524 MiB).
pub(crate) const DEFAULT_CONTEXT_BYTES: u64 = 512 << 20;

/// The same for a green context, which takes far less than an ordinary one (an H100 green context of all
/// its SMs took 6 MiB with driver 580, where a context takes ~500): its measurement neither uses nor
/// teaches the device's known context size.
pub(crate) const DEFAULT_GREEN_CONTEXT_BYTES: u64 = 64 << 20;

/// An ordinary context (`cuCtxCreate*`, the primary one) or a green one (`cuGreenCtxCreate`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum CtxKind {
    Ordinary,
    Green,
}

impl<D: Driver> Interposer<'_, D> {
    /// Runs `create` and measures what the new context (`new_ctx()`, read after success) took on the
    /// device (0 without a quota to measure for). See `measure` for the estimator.
    fn measure_ctx(
        &self,
        dev: CUdevice,
        q: Option<&DeviceQuota>,
        kind: CtxKind,
        create: impl FnOnce() -> CUresult,
        new_ctx: impl FnOnce() -> usize,
    ) -> (CUresult, u64) {
        let Some(q) = q else { return (create(), 0) };
        let _measuring = q.measure_lock();
        let nvml = self.drv.device_used(&q.uuid).is_some();
        let probe = if nvml {
            Probe::Nvml
        } else {
            self.ctx_probe(dev)
        };
        let pid = self.nvml_pid();
        let (mut before, procs_b) = self.read(q, probe, pid);
        let r = create();
        if r != CUDA_SUCCESS {
            return (r, 0);
        }
        let probe = if nvml {
            Probe::Nvml
        } else {
            Probe::Ctx(new_ctx())
        };
        let (mut after, procs_a) = self.read(q, probe, pid);
        if pid.is_none() {
            self.discover((&mut before, &procs_b), (&mut after, &procs_a));
        } else if after.process == Some(0) {
            // A process holding a context is in NVML's list: this PID is not ours (any more).
            self.forget_nvml_pid();
            (before.process, after.process) = (None, None);
        }
        let measured_before = before.process.is_some() || before.device.is_some();
        let (known, fallback) = match kind {
            CtxKind::Ordinary => (self.known_context(dev), DEFAULT_CONTEXT_BYTES),
            CtxKind::Green => (None, DEFAULT_GREEN_CONTEXT_BYTES),
        };
        let (cost, source) = estimate(measured_before.then_some(&before), &after, known, fallback);
        if kind == CtxKind::Ordinary {
            self.learn_context(dev, cost, source);
        }
        log::debug(format_args!(
            "context on device {dev}: {cost} bytes ({source:?})"
        ));
        (r, cost)
    }

    /// A context on a GPU that no memory quota measures: where a compute share applies and this
    /// process's PID in NVML's lists is not known yet, it is learned around the creation (`discover`),
    /// for the share's floor (`compute::truth`, which reads NVML's figure of this PID).
    fn learn_pid_around(
        &self,
        out: *mut c_void,
        dev: CUdevice,
        create: impl FnOnce() -> CUresult,
    ) -> CUresult {
        if out.is_null() {
            return create();
        }
        let Some(uuid) = self.pid_to_learn(dev) else {
            return create();
        };
        let before = self.drv.device_processes(&uuid);
        let r = create();
        if r == CUDA_SUCCESS && before.is_some() {
            let after = self.drv.device_processes(&uuid);
            let (mut b, mut a) = (Reading::default(), Reading::default());
            self.discover((&mut b, &before), (&mut a, &after));
        }
        r
    }

    /// The UUID of `dev` when this process's NVML PID is still to be learned for a compute share there
    /// (a limit applies, the PID is unknown, the device is under a share); None otherwise, after at most
    /// loads and the configuration's lookup, no driver call unless a share applies.
    fn pid_to_learn(&self, dev: CUdevice) -> Option<String> {
        if self.drv.unlimited() || exiting() || self.nvml_pid().is_some() || crate::compute::off() {
            return None;
        }
        crate::compute::shared_uuid(dev)
    }

    /// Where to read the device's free memory before a context is created without NVML: a context of
    /// `dev` that exists now (the current one, or the active primary context).
    fn ctx_probe(&self, dev: CUdevice) -> Probe {
        match self.current() {
            Some((d, ctx)) if d == dev => return Probe::Ctx(ctx),
            _ => {}
        }
        match self.drv.primary_active(dev) {
            true => self.drv.primary_handle(dev).map_or(Probe::None, Probe::Ctx),
            false => Probe::None,
        }
    }

    /// The quota a context made on `dev` into `pctx` is charged to: Err(None) to leave the call untouched
    /// (no out-pointer, no limit, exiting, no quota on the device), Err(Some) to refuse it.
    fn ctx_quota(
        &self,
        pctx: *mut c_void,
        dev: CUdevice,
    ) -> Result<&'static DeviceQuota, Option<Error>> {
        if pctx.is_null() || self.drv.unlimited() || exiting() {
            return Err(None);
        }
        match self.target(Some(dev)) {
            Target::Charge(q) => Ok(q),
            Target::Forward => Err(None),
            Target::Fail(e) => Err(Some(e)),
        }
    }

    /// cuCtxCreate*: the new context written to `pctx` by `create` is charged what it measured.
    pub(crate) fn ctx_create(
        &self,
        pctx: *mut CUcontext,
        dev: CUdevice,
        create: impl FnOnce() -> CUresult,
    ) -> CUresult {
        // SAFETY: read only after `create` succeeded: `pctx` is non-null (ctx_quota) and written by the
        // driver.
        let new_ctx = || unsafe { *pctx } as usize;
        self.create_measured(
            pctx.cast(),
            dev,
            CtxKind::Ordinary,
            create,
            new_ctx,
            |ctx| self.drv.ctx_destroy(ctx),
        )
    }

    /// A context made by `create` into the out-pointer `out` (a `CUcontext`, or a green context whose
    /// `CUcontext` `new_ctx` asks for), measured and charged to `dev`; `undo` destroys it again (given the
    /// context) when its memory does not fit.
    pub(crate) fn create_measured(
        &self,
        out: *mut c_void,
        dev: CUdevice,
        kind: CtxKind,
        create: impl FnOnce() -> CUresult,
        new_ctx: impl Fn() -> usize,
        undo: impl FnOnce(usize),
    ) -> CUresult {
        let q = match self.ctx_quota(out, dev) {
            Ok(q) => q,
            Err(None) => return self.learn_pid_around(out, dev, create),
            Err(Some(e)) => return e.cuda(),
        };
        let (r, cost) = self.measure_ctx(dev, Some(q), kind, create, &new_ctx);
        if r != CUDA_SUCCESS {
            return r;
        }
        let ctx = new_ctx();
        if !self.admit(q, Kind::Context, cost) {
            undo(ctx);
            return Error::OutOfMemory.cuda();
        }
        self.rec
            .contexts
            .insert(ctx as u64, Rec::new(dev, Kind::Context, cost, ctx));
        // Recorded first: a managed allocation made meanwhile sees this context (`hooks/managed`).
        if !self.managed_onto_context(dev, q) {
            self.rec.contexts.remove(ctx as u64);
            q.refund(Kind::Context, cost);
            undo(ctx);
            return Error::OutOfMemory.cuda();
        }
        r
    }

    /// The driver freed everything of context `ctx`: give back its records.
    pub(crate) fn context_gone(&self, ctx: usize) {
        records::context_gone();
        self.limits_gone(ctx);
        let dev = self.rec.contexts.remove(ctx as u64).map(|rec| {
            self.release(&rec);
            rec.dev
        });
        for t in [&self.rec.allocs, &self.rec.arrays, &self.rec.modules] {
            for (key, rec) in t.drain_where(|r| r.ctx == ctx) {
                self.release_unless_exported(key, &rec);
            }
        }
        self.ipc_context_gone(ctx);
        self.managed_context_gone(ctx);
        if let Some(dev) = dev.filter(|&d| !self.rec.contexts.any(|r| r.dev == d)) {
            self.last_context_gone(dev);
        }
    }

    /// The process's last context of `dev` went, and with it what the driver held for the process there
    /// that no hook saw: the truth-up's charge (`truth`) goes back, and the graph reservation is read
    /// again. Nothing else would look before the next synchronisation with a context current, and a
    /// process that had released its contexts kept up to a context's worth charged until it exited (the
    /// soak on an H200: 545 MiB of module memory and 32 MiB of graph memory with the driver holding
    /// nothing). A truth-up that still finds memory in NVML's figure charges it again.
    fn last_context_gone(&self, dev: CUdevice) {
        let Some(q) = self.quota_of(dev) else { return };
        let was = self
            .rec
            .truth_charged
            .update(dev as u64, || 0, std::mem::take);
        if was > 0 {
            q.refund(Kind::Module, was);
        }
        self.reconcile_graph(dev, q);
    }

    /// cuDevicePrimaryCtxRetain: the first retain of an inactive primary context creates it (measured).
    pub(crate) fn primary_retain(
        &self,
        pctx: *mut CUcontext,
        dev: CUdevice,
        retain: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let q = match self.ctx_quota(pctx.cast(), dev) {
            Ok(q) => q,
            // Only a share's process whose NVML PID is unknown asks whether the retain creates the context.
            Err(None) if self.pid_to_learn(dev).is_some() && !self.drv.primary_active(dev) => {
                return self.learn_pid_around(pctx.cast(), dev, retain)
            }
            Err(None) => return retain(),
            Err(Some(e)) => return e.cuda(),
        };
        let fresh = !self.drv.primary_active(dev);
        // SAFETY: the closure runs only after `retain` succeeded: `pctx` is non-null and written by the driver.
        let (r, cost) = self.measure_ctx(
            dev,
            fresh.then_some(q),
            CtxKind::Ordinary,
            retain,
            || unsafe { *pctx } as usize,
        );
        if r != CUDA_SUCCESS {
            return r;
        }
        // SAFETY: non-null, written by the driver.
        let ctx = unsafe { *pctx } as usize;
        if fresh && cost > 0 {
            if !self.admit(q, Kind::Context, cost) {
                self.drv.primary_release(dev);
                return Error::OutOfMemory.cuda();
            }
            self.rec
                .contexts
                .insert(ctx as u64, Rec::new(dev, Kind::Context, cost, ctx));
        }
        if fresh && !self.managed_onto_context(dev, q) {
            if let Some(rec) = self.rec.contexts.remove(ctx as u64) {
                self.release(&rec);
            }
            self.drv.primary_release(dev);
            return Error::OutOfMemory.cuda();
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
    interposer().ctx_create(pctx, dev, || forward!("cuCtxCreate_v2", fn(*mut CUcontext, c_uint, CUdevice), pctx, flags, dev))
});
hook!(cuCtxCreate(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) {
    interposer().ctx_create(pctx, dev, || forward!("cuCtxCreate", fn(*mut CUcontext, c_uint, CUdevice), pctx, flags, dev))
});
hook!(cuCtxCreate_v3(pctx: *mut CUcontext, params: *mut c_void, n: i32, flags: c_uint, dev: CUdevice) {
    interposer().ctx_create(pctx, dev, || forward!("cuCtxCreate_v3", fn(*mut CUcontext, *mut c_void, i32, c_uint, CUdevice), pctx, params, n, flags, dev))
});
hook!(cuCtxCreate_v4(pctx: *mut CUcontext, params: *mut c_void, flags: c_uint, dev: CUdevice) {
    interposer().ctx_create(pctx, dev, || forward!("cuCtxCreate_v4", fn(*mut CUcontext, *mut c_void, c_uint, CUdevice), pctx, params, flags, dev))
});

/// Destroys context `ctx` by `destroy`: the compute share's launches in it charged first and its
/// events forgotten with it (`compute::teardown`), then what was recorded in it given back.
fn ctx_destroy(ctx: CUcontext, destroy: impl FnOnce() -> CUresult) -> CUresult {
    let t = teardown::begin(ctx as usize);
    let r = destroy();
    t.end(r == CUDA_SUCCESS);
    if r == CUDA_SUCCESS {
        interposer().context_gone(ctx as usize);
    }
    r
}

/// A primary context's release or reset by `call`: when it destroys the context (a reset of an active
/// one, the last release), the compute share's launches in it are charged first and its events
/// forgotten with it; the handle comes back for the next primary context of the device, so nothing
/// of the old one may be taken for the new one's (`compute::teardown`).
fn primary_teardown(dev: CUdevice, call: impl FnOnce() -> CUresult, reset: bool) -> CUresult {
    let i = interposer();
    let ctx = if crate::compute::off() || !i.drv.primary_active(dev) {
        0
    } else {
        i.drv.primary_handle(dev).unwrap_or(0)
    };
    let t = teardown::begin(ctx);
    let r = i.primary_release(dev, call, reset);
    t.end(r == CUDA_SUCCESS && ctx != 0 && (reset || !i.drv.primary_active(dev)));
    r
}

hook!(cuCtxDestroy_v2(ctx: CUcontext) {
    ctx_destroy(ctx, || forward!("cuCtxDestroy_v2", fn(CUcontext), ctx))
});
hook!(cuCtxDestroy(ctx: CUcontext) {
    ctx_destroy(ctx, || forward!("cuCtxDestroy", fn(CUcontext), ctx))
});

hook!(cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) {
    interposer().primary_retain(pctx, dev, || forward!("cuDevicePrimaryCtxRetain", fn(*mut CUcontext, CUdevice), pctx, dev))
});
hook!(cuDevicePrimaryCtxRelease_v2(dev: CUdevice) {
    primary_teardown(dev, || forward!("cuDevicePrimaryCtxRelease_v2", fn(CUdevice), dev), false)
});
hook!(cuDevicePrimaryCtxRelease(dev: CUdevice) {
    primary_teardown(dev, || forward!("cuDevicePrimaryCtxRelease", fn(CUdevice), dev), false)
});
hook!(cuDevicePrimaryCtxReset_v2(dev: CUdevice) {
    primary_teardown(dev, || forward!("cuDevicePrimaryCtxReset_v2", fn(CUdevice), dev), true)
});
hook!(cuDevicePrimaryCtxReset(dev: CUdevice) {
    primary_teardown(dev, || forward!("cuDevicePrimaryCtxReset", fn(CUdevice), dev), true)
});

/// The `CUcontext` of green context `green` (`cuCtxFromGreenCtx`; 0 when the driver gives none): what
/// the green context's allocations and launches name as their context.
fn green_ctx(green: *mut c_void) -> usize {
    let mut c: CUcontext = std::ptr::null_mut();
    match forward!(
        "cuCtxFromGreenCtx",
        fn(*mut CUcontext, *mut c_void),
        &mut c,
        green
    ) {
        CUDA_SUCCESS => c as usize,
        _ => 0,
    }
}

// A green context (CUDA 12.4+) is a context of its own, with its own memory on the device: measured and
// charged as cuCtxCreate's (but never bounded by, nor teaching, the size of an ordinary context: an H100
// green context took 6 MiB), recorded under its CUcontext, and everything made in it given back with it.
hook!(cuGreenCtxCreate(pg: *mut *mut c_void, desc: *mut c_void, dev: CUdevice, flags: c_uint) {
    // SAFETY: read only after the driver wrote it (create_measured checks `pg` is non-null).
    let green = || unsafe { *pg };
    interposer().create_measured(
        pg.cast(),
        dev,
        CtxKind::Green,
        || forward!("cuGreenCtxCreate", fn(*mut *mut c_void, *mut c_void, CUdevice, c_uint), pg, desc, dev, flags),
        || green_ctx(green()),
        |_| {
            forward!("cuGreenCtxDestroy", fn(*mut c_void), green());
        },
    )
});
hook!(cuGreenCtxDestroy(g: *mut c_void) {
    let ctx = if g.is_null() { 0 } else { green_ctx(g) };
    let t = teardown::begin(ctx);
    let r = forward!("cuGreenCtxDestroy", fn(*mut c_void), g);
    t.end(r == CUDA_SUCCESS);
    if r == CUDA_SUCCESS && ctx != 0 {
        interposer().context_gone(ctx);
    }
    r
});

#[cfg(test)]
mod tests;
