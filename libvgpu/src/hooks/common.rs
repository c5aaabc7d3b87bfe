//! The machinery every hook family shares: the `hook!` macro, the `Interposer` (driver seam + record tables),
//! which quota a call is charged to (`Target`), and the charge / refund / true-up helpers. Every family's
//! own policy lives in its module, never here; the families take these from here (`super::common`), never
//! from `hooks` itself, so `hooks/mod.rs` stays a list of modules and re-exports.

use vgpu_ledger::Kind;

use crate::driver::{Driver, RealDriver};
use crate::error::Error;
use crate::ffi::*;
use crate::guard::exiting;
use crate::quota::DeviceQuota;
use crate::records::{self, Rec, Records, Table, RECORDS};
use crate::settings::Applies;

/// Exports a driver API hook under `$name`, run under `guard` (a panic returns CUDA_ERROR_UNKNOWN).
macro_rules! hook {
    ($name:ident($($a:ident: $t:ty),*) $body:block) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> CUresult {
            $crate::guard::guard(CUDA_ERROR_UNKNOWN, || $body)
        }
    };
}
pub(crate) use hook;

/// The policies' world: the driver behind the seam and the process's record tables.
pub(crate) struct Interposer<'a, D: Driver> {
    pub(crate) drv: &'a D,
    pub(crate) rec: &'a Records,
}

/// The interposer: the real driver and the process's records.
#[inline]
pub(crate) fn interposer() -> Interposer<'static, RealDriver> {
    Interposer {
        drv: &RealDriver,
        rec: &RECORDS,
    }
}

/// The quota to charge for a device, or how the call must end without one.
pub(crate) enum Target {
    Charge(&'static DeviceQuota),
    Forward,
    Fail(Error),
}

impl<D: Driver> Interposer<'_, D> {
    pub(crate) fn target(&self, dev: Option<CUdevice>) -> Target {
        if exiting() {
            return Target::Forward;
        }
        let Some(dev) = dev else {
            return Target::Forward;
        };
        match self.drv.quota(dev) {
            Ok(Some(q)) => Target::Charge(q),
            Ok(None) => Target::Forward,
            Err(e) => Target::Fail(e),
        }
    }

    /// The quota of `dev` if one applies and can be used (refunds and reconciliations).
    pub(crate) fn quota_of(&self, dev: CUdevice) -> Option<&'static DeviceQuota> {
        match self.target(Some(dev)) {
            Target::Charge(q) => Some(q),
            _ => None,
        }
    }

    /// The current context and its device (the device remembered per thread and context).
    pub(crate) fn current(&self) -> Option<(CUdevice, usize)> {
        let ctx = self.drv.ctx_current();
        if ctx == 0 {
            return None;
        }
        if let Some(d) = records::cached_device(ctx) {
            return Some((d, ctx));
        }
        let generation = records::generation();
        let d = self.drv.ctx_device()?;
        records::remember_device(ctx, d, generation);
        Some((d, ctx))
    }

    pub(crate) fn current_device(&self) -> Option<CUdevice> {
        self.current().map(|(d, _)| d)
    }

    /// Target for the device of the current context (allocations in it): (target, device, context).
    pub(crate) fn target_current(&self) -> (Target, CUdevice, usize) {
        match self.drv.applies() {
            Applies::Broken => return (Target::Fail(Error::Refused), 0, 0),
            Applies::Nowhere => return (Target::Forward, 0, 0),
            Applies::Somewhere => {}
        }
        match self.current() {
            Some((dev, ctx)) => (self.target(Some(dev)), dev, ctx),
            None => (Target::Forward, 0, 0),
        }
    }

    /// Charges `bytes` of `kind` to `q`. Before refusing, the process's pools give back what they hold
    /// freed (`reclaim_pools`) and the charge is tried once more: a refusal never happens while freed
    /// stream-ordered memory of this process would make the request fit.
    pub(crate) fn admit(&self, q: &DeviceQuota, kind: Kind, bytes: u64) -> bool {
        self.settle_ipc_opens();
        if q.try_charge(kind, bytes) == Some(true) {
            return true;
        }
        self.reclaim_pools(q, 0);
        q.charge(kind, bytes)
    }

    /// Under a limit, an allocation whose device cannot be told is refused, with one log line: a charge
    /// never falls back to whatever context is current (`docs/libvgpu.md`, the attribution rule).
    pub(crate) fn unresolved(&self, what: &str, handle: u64) -> CUresult {
        crate::log::warn(format_args!(
            "quota: refused an allocation from {what} ({handle:#x}): the driver does not say which device it is on"
        ));
        Error::OutOfMemory.cuda()
    }

    /// Gives back what a record charged (a pool allocation goes back to its pool, not to the ledger).
    pub(crate) fn release(&self, rec: &Rec) {
        if rec.pool != 0 {
            self.rec.pool_released(rec.pool, rec.bytes);
        } else if rec.spilled {
            if let Some(q) = self.quota_of(rec.dev) {
                q.refund_spill(rec.bytes);
            }
        } else if let Some(q) = self.quota_of(rec.dev) {
            q.refund(rec.kind, rec.bytes);
        }
    }

    /// The common shape of an allocation: charge `bytes`, call the driver, refund if it fails, record
    /// `key()` in `table`.
    pub(crate) fn charged_call(
        &self,
        table: &Table<Rec>,
        kind: Kind,
        bytes: u64,
        tgt: (Target, CUdevice, usize),
        call: impl FnOnce() -> CUresult,
        key: impl FnOnce() -> u64,
    ) -> CUresult {
        self.charged(table, kind, bytes, tgt, call, key, |r| r)
    }

    /// `charged_call` for any record type: `wrap` makes the record kept for `key()`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn charged<T>(
        &self,
        table: &Table<T>,
        kind: Kind,
        bytes: u64,
        tgt: (Target, CUdevice, usize),
        call: impl FnOnce() -> CUresult,
        key: impl FnOnce() -> u64,
        wrap: impl FnOnce(Rec) -> T,
    ) -> CUresult {
        let (q, dev, ctx) = match tgt {
            (Target::Forward, ..) => return call(),
            (Target::Fail(e), ..) => return e.cuda(),
            (Target::Charge(q), dev, ctx) => (q, dev, ctx),
        };
        if !self.admit(q, kind, bytes) {
            return Error::OutOfMemory.cuda();
        }
        let r = call();
        if r != CUDA_SUCCESS {
            q.refund(kind, bytes);
            return r;
        }
        table.insert(key(), wrap(Rec::new(dev, kind, bytes, ctx)));
        r
    }

    /// Frees `key` with `call`; gives back what was recorded for it. Untracked keys pass straight through.
    pub(crate) fn tracked_free(
        &self,
        table: &Table<Rec>,
        key: u64,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        if self.drv.unlimited() {
            return call(); // nothing is ever recorded without a limit
        }
        let Some(rec) = table.remove(key) else {
            let r = self.import_freed(key, call);
            if r == CUDA_SUCCESS {
                self.managed_freed(key); // managed memory of a device without a quota
            }
            return r;
        };
        let r = call();
        if r != CUDA_SUCCESS {
            table.insert(key, rec);
            return r;
        }
        self.release_unless_exported(key, &rec);
        r
    }

    /// Gives back what `rec` (at `key`) charged, unless it was shared (legacy IPC, dma-buf: `Rec::exported`; an
    /// allocation of an exported pool: `PoolState::exported`):
    /// that stays charged until the process ends (its slot in the ledger is reclaimed then).
    pub(crate) fn release_unless_exported(&self, key: u64, rec: &Rec) {
        let refund = !rec.exported && !self.pool_exported(rec.pool);
        self.managed_gone(key, rec, refund);
        if refund {
            self.release(rec);
            return;
        }
        // Said as a warning the first time (why the quota ran short), then at info level.
        static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        let line = format_args!(
            "quota: 0x{key:x} ({} bytes on device {}) freed, but it was shared (CUDA IPC, a dma-buf \
             descriptor or an exported pool): another process may keep its memory, so it stays charged until \
             this process ends",
            rec.bytes, rec.dev
        );
        if SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
            crate::log::info(line);
        } else {
            crate::log::warn(line);
        }
    }

    /// Corrects a charge made from an estimate to the size the driver reports. Returns false when the
    /// larger true size does not fit: the caller then frees the object and reports out of memory.
    pub(crate) fn true_up(&self, table: &Table<Rec>, key: u64, actual: u64) -> bool {
        let Some(rec) = table.with(key, |r| r.copied()) else {
            return true;
        };
        let Some(q) = self.quota_of(rec.dev) else {
            return true;
        };
        if actual > rec.bytes {
            if !self.admit(q, rec.kind, actual - rec.bytes) {
                return false;
            }
        } else {
            q.refund(rec.kind, rec.bytes - actual);
        }
        table.with(key, |r| {
            if let Some(r) = r {
                r.bytes = actual
            }
        });
        true
    }

    /// Undoes a recorded object whose true size did not fit: removes its record, destroys it with
    /// `destroy` and gives its charge back.
    pub(crate) fn undo(&self, table: &Table<Rec>, key: u64, destroy: impl FnOnce()) {
        if let Some(rec) = table.remove(key) {
            destroy();
            self.release(&rec);
        }
    }
}

/// The most a measured module or array may be charged (a wild measurement must not eat the quota).
pub(crate) const MODULE_CEILING: u64 = 4 << 30;

/// A measured cost: the device's growth minus what the ledger recorded meanwhile (allocations of this
/// container's other processes and threads during the measurement), within [0, ceiling].
pub(crate) fn measured(device_delta: i128, ledger_delta: i128, ceiling: u64) -> u64 {
    (device_delta - ledger_delta).clamp(0, ceiling as i128) as u64
}

#[cfg(test)]
mod tests {
    use super::super::testing::World;
    use super::*;

    #[test]
    fn measurements_net_of_ledger_activity_and_clamped() {
        assert_eq!(measured(600, 100, 1000), 500);
        assert_eq!(measured(100, 300, 1000), 0);
        assert_eq!(measured(-50, 0, 1000), 0);
        assert_eq!(measured(5000, 0, 1000), 1000);
    }

    #[test]
    fn charged_call_refunds_when_the_driver_fails_after_the_charge() {
        let w = World::new(1000);
        let e = w.interposer();
        let r = e.charged_call(
            &w.rec.allocs,
            Kind::Data,
            400,
            e.target_current(),
            || 2,
            || 1,
        );
        assert_eq!(r, 2);
        assert_eq!(w.used(), 0);
        assert!(w.rec.allocs.keys().is_empty());
    }

    #[test]
    fn charged_call_refuses_past_the_quota_without_calling_the_driver() {
        let w = World::new(1000);
        let e = w.interposer();
        let mut called = false;
        let r = e.charged_call(
            &w.rec.allocs,
            Kind::Data,
            1001,
            e.target_current(),
            || {
                called = true;
                0
            },
            || 1,
        );
        assert_eq!(r, CUDA_ERROR_OUT_OF_MEMORY);
        assert!(!called);
        assert_eq!(w.used(), 0);
    }

    #[test]
    fn charged_call_records_and_tracked_free_refunds() {
        let w = World::new(1000);
        let e = w.interposer();
        assert_eq!(
            e.charged_call(
                &w.rec.allocs,
                Kind::Data,
                300,
                e.target_current(),
                || 0,
                || 0x10
            ),
            0
        );
        assert_eq!(w.used(), 300);
        let rec = w.rec.allocs.with(0x10, |r| r.copied()).unwrap();
        assert_eq!((rec.dev, rec.ctx, rec.bytes), (0, w.fake.ctx(), 300));
        // a failing free keeps the record and the charge
        assert_eq!(e.tracked_free(&w.rec.allocs, 0x10, || 1), 1);
        assert_eq!(w.used(), 300);
        assert_eq!(e.tracked_free(&w.rec.allocs, 0x10, || 0), 0);
        assert_eq!(w.used(), 0);
        // untracked keys pass through
        assert_eq!(e.tracked_free(&w.rec.allocs, 0x99, || 0), 0);
    }

    #[test]
    fn without_a_current_context_or_limit_calls_are_forwarded() {
        let w = World::new(1000);
        w.fake.set_current(0);
        let e = w.interposer();
        assert!(matches!(e.target_current().0, Target::Forward));
        w.fake.set_current(w.fake.ctx());
        w.fake.set_applies(Applies::Nowhere);
        assert!(matches!(e.target_current().0, Target::Forward));
        w.fake.set_applies(Applies::Broken);
        assert!(matches!(e.target_current().0, Target::Fail(Error::Refused)));
    }

    #[test]
    fn true_up_charges_growth_refunds_shrink_and_refuses_what_does_not_fit() {
        let w = World::new(1000);
        let e = w.interposer();
        e.charged_call(
            &w.rec.arrays,
            Kind::Array,
            100,
            e.target_current(),
            || 0,
            || 7,
        );
        assert!(e.true_up(&w.rec.arrays, 7, 250));
        assert_eq!(w.used(), 250);
        assert!(e.true_up(&w.rec.arrays, 7, 50));
        assert_eq!(w.used(), 50);
        assert!(!e.true_up(&w.rec.arrays, 7, 2000));
        assert_eq!(
            w.used(),
            50,
            "a refused true-up leaves the charge as it was"
        );
        assert!(
            e.true_up(&w.rec.arrays, 8, 5000),
            "unknown keys are not ours"
        );
    }
}
