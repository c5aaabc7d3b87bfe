//! Context limits: `cuCtxSetLimit` of the three limits that are device memory the application sizes —
//! thread stack (per thread × every resident thread of the device), printf FIFO, malloc heap.
//!
//! Charged by a computed bound, not measured: the driver may allocate the heap and FIFO only at the next
//! launch, so a measurement around the call can see nothing. Growth above the current value is charged
//! before the call (refused with out-of-memory when it does not fit: the driver is not asked); a shrink
//! refunds what this library charged for that limit, never the defaults (they are part of the context's
//! measured cost). The charge belongs to the context's record and goes with the context.
//!
//! The driver also grows a context's stack on its own when a kernel needs more than it has (NCCL's kernels
//! took 720 bytes per thread more on an H200: 186 MiB). That growth is found by reading the stack size at
//! synchronisations and memory queries and charged then, after the fact (the memory is already taken).
#![allow(clippy::missing_safety_doc)]

use std::ffi::c_int;

use vgpu_ledger::Kind;

use super::common::{hook, interposer, Interposer, Target};
use crate::driver::Driver;
use crate::error::Error;
use crate::ffi::*;
use crate::real_symbols::forward;
use crate::records::Rec;

pub(crate) const CU_LIMIT_STACK_SIZE: i32 = 0;
pub(crate) const CU_LIMIT_PRINTF_FIFO_SIZE: i32 = 1;
pub(crate) const CU_LIMIT_MALLOC_HEAP_SIZE: i32 = 2;
/// The stack size of a new context (bytes per thread), as the driver sets it.
const DEFAULT_STACK: u64 = 1024;
const CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: i32 = 16;
const CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: i32 = 39;

impl<D: Driver> Interposer<'_, D> {
    /// The device memory a limit of `value` takes on `dev` (None: that limit is not device memory).
    pub(crate) fn limit_bytes(&self, dev: CUdevice, limit: i32, value: u64) -> Option<u64> {
        match limit {
            CU_LIMIT_STACK_SIZE => {
                let sms = self
                    .drv
                    .device_attribute(dev, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
                let threads = self
                    .drv
                    .device_attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)?;
                Some(value.saturating_mul((sms.max(0) * threads.max(0)) as u64))
            }
            CU_LIMIT_PRINTF_FIFO_SIZE | CU_LIMIT_MALLOC_HEAP_SIZE => Some(value),
            _ => None,
        }
    }

    /// cuCtxSetLimit: charges growth before `set`, refunds a shrink after it.
    pub(crate) fn set_limit(
        &self,
        limit: i32,
        value: u64,
        set: impl FnOnce() -> CUresult,
    ) -> CUresult {
        if self.drv.unlimited() || !(0..=2).contains(&limit) {
            return set();
        }
        if limit == CU_LIMIT_STACK_SIZE {
            // growth the driver made on its own is charged first, so this set starts from it
            self.reconcile_stack();
        }
        let (q, dev, ctx) = match self.target_current() {
            (Target::Charge(q), dev, ctx) => (q, dev, ctx),
            (Target::Forward, ..) => return set(),
            (Target::Fail(e), ..) => return e.cuda(),
        };
        // What was charged per limit is the context's record (`Records::limit_extras`); the setter lock
        // makes reading the old value, the driver's set and the charge one step.
        let _setter = self.rec.limit_setter.lock();
        let key = ctx as u64;
        let (Some(old), Some(new_bytes)) = (
            self.drv.ctx_get_limit(limit),
            self.limit_bytes(dev, limit, value),
        ) else {
            return set();
        };
        let old_bytes = self.limit_bytes(dev, limit, old).unwrap_or(0);
        let slot = limit as usize;
        let charged = self
            .rec
            .limit_extras
            .with(key, |e| e.map_or(0, |e| e[slot]));
        let (grow, shrink) = if new_bytes >= old_bytes {
            (new_bytes - old_bytes, 0)
        } else {
            (0, (old_bytes - new_bytes).min(charged))
        };
        if !self.admit(q, Kind::Context, grow) {
            return Error::OutOfMemory.cuda();
        }
        let r = set();
        if r != CUDA_SUCCESS {
            q.refund(Kind::Context, grow);
            return r;
        }
        q.refund(Kind::Context, shrink);
        self.rec
            .limit_extras
            .update(key, || [0; 3], |e| e[slot] = charged + grow - shrink);
        if limit == CU_LIMIT_STACK_SIZE {
            self.rec.stack_seen.insert(key, value);
        }
        // The context's record carries the charge, so that the context's end gives it back.
        self.rec.contexts.update(
            ctx as u64,
            || Rec::new(dev, Kind::Context, 0, ctx),
            |r| r.bytes = r.bytes + grow - shrink,
        );
        r
    }

    /// The context went away (its record, with the limits' charge, is given back by the caller).
    pub(crate) fn limits_gone(&self, ctx: usize) {
        self.rec.limit_extras.remove(ctx as u64);
        self.rec.stack_seen.remove(ctx as u64);
    }

    /// Charges what the driver grew the current context's stack by on its own since it was last seen.
    pub(crate) fn reconcile_stack(&self) {
        if self.drv.unlimited() {
            return;
        }
        let (Target::Charge(q), dev, ctx) = self.target_current() else {
            return;
        };
        let Some(now) = self.drv.ctx_get_limit(CU_LIMIT_STACK_SIZE) else {
            return;
        };
        // First sight: a launch may already have grown it; what is above the driver's default is growth
        // (the default, part of the measured context, is 1024 bytes on every GPU seen so far). The record
        // is per process (cleared in a fork child), so no PID is asked for on this path.
        let before = self.rec.stack_seen.update(
            ctx as u64,
            || now.min(DEFAULT_STACK),
            |seen| {
                let before = *seen;
                *seen = (*seen).max(now);
                before
            },
        );
        if now <= before {
            return;
        }
        let bytes = |v| self.limit_bytes(dev, CU_LIMIT_STACK_SIZE, v).unwrap_or(0);
        let grow = bytes(now).saturating_sub(bytes(before));
        if grow == 0 {
            return;
        }
        q.charge_forced(Kind::Context, grow);
        self.rec.limit_extras.update(
            ctx as u64,
            || [0; 3],
            |e| e[CU_LIMIT_STACK_SIZE as usize] += grow,
        );
        self.rec.contexts.update(
            ctx as u64,
            || Rec::new(dev, Kind::Context, 0, ctx),
            |r| r.bytes += grow,
        );
    }
}

hook!(cuCtxSetLimit(limit: c_int, value: usize) {
    interposer().set_limit(limit, value as u64, || forward!("cuCtxSetLimit", fn(c_int, usize), limit, value))
});

#[cfg(test)]
mod tests {
    use super::super::testing::World;
    use super::*;

    /// cuCtxSetLimit through the policy; the fake records the new value when the driver succeeds.
    fn set(w: &World, limit: i32, value: u64, rc: CUresult) -> CUresult {
        w.interposer().set_limit(limit, value, || {
            if rc == CUDA_SUCCESS {
                w.fake.limits.borrow_mut().insert(limit, value);
            }
            rc
        })
    }

    // Regression (item 8a): cuCtxSetLimit was not hooked; a 1 GiB malloc heap was never charged.
    #[test]
    fn heap_and_fifo_growth_is_charged_and_a_shrink_refunded() {
        let w = World::new(4 << 30);
        assert_eq!(set(&w, CU_LIMIT_MALLOC_HEAP_SIZE, 1 << 30, 0), CUDA_SUCCESS);
        assert_eq!(w.usage(Kind::Context), (1 << 30) - (8 << 20));
        assert_eq!(
            set(&w, CU_LIMIT_PRINTF_FIFO_SIZE, 65 << 20, 0),
            CUDA_SUCCESS
        );
        assert_eq!(w.used(), (1 << 30) - (8 << 20) + (64 << 20));
        assert_eq!(set(&w, CU_LIMIT_MALLOC_HEAP_SIZE, 8 << 20, 0), CUDA_SUCCESS);
        assert_eq!(w.used(), 64 << 20);
        // below the default: nothing more than what was charged comes back
        assert_eq!(set(&w, CU_LIMIT_MALLOC_HEAP_SIZE, 0, 0), CUDA_SUCCESS);
        assert_eq!(w.used(), 64 << 20);
    }

    #[test]
    fn stack_size_is_per_thread_times_every_resident_thread() {
        let w = World::new(4 << 30);
        assert_eq!(set(&w, CU_LIMIT_STACK_SIZE, 2048, 0), CUDA_SUCCESS);
        assert_eq!(w.used(), 1024 * 132 * 2048);
    }

    #[test]
    fn growth_past_the_quota_is_refused_without_asking_the_driver() {
        let w = World::new(1 << 30);
        let mut called = false;
        let r = w
            .interposer()
            .set_limit(CU_LIMIT_MALLOC_HEAP_SIZE, 2 << 30, || {
                called = true;
                CUDA_SUCCESS
            });
        assert_eq!(r, CUDA_ERROR_OUT_OF_MEMORY);
        assert!(!called);
        assert_eq!(w.used(), 0);
        assert_eq!(
            set(
                &w,
                CU_LIMIT_MALLOC_HEAP_SIZE,
                512 << 20,
                CUDA_ERROR_INVALID_VALUE
            ),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(w.used(), 0, "a failed set is refunded");
    }

    // Regression (GPU, 2 x H200): NCCL's first all-reduce made the driver grow the stack from 1024 to
    // 1744 bytes per thread on its own (186 MiB); nothing was charged.
    #[test]
    fn stack_the_driver_grows_on_its_own_is_charged_at_the_next_sync() {
        let w = World::new(4 << 30);
        w.fake
            .attributes
            .borrow_mut()
            .extend([(16, 132), (39, 2048)]);
        w.fake.limits.borrow_mut().insert(CU_LIMIT_STACK_SIZE, 1024);
        let e = w.interposer();
        e.after_sync(CUDA_SUCCESS);
        assert_eq!(
            w.used(),
            0,
            "the default stack is part of the measured context"
        );
        // (a context first seen after a launch grew it is charged from the default)
        w.fake.limits.borrow_mut().insert(CU_LIMIT_STACK_SIZE, 1744); // a launch grew it
        e.after_sync(CUDA_SUCCESS);
        assert_eq!(w.used(), 720 * 132 * 2048);
        e.after_sync(CUDA_SUCCESS);
        assert_eq!(w.used(), 720 * 132 * 2048, "counted once");
        // a later cuCtxSetLimit starts from the grown stack, and its shrink may give the growth back
        assert_eq!(set(&w, CU_LIMIT_STACK_SIZE, 1024, 0), CUDA_SUCCESS);
        assert_eq!(w.used(), 0);
        // and the context's end gives back whatever is left
        w.fake.limits.borrow_mut().insert(CU_LIMIT_STACK_SIZE, 2048);
        assert_eq!(e.mem_info_view(8 << 30, 8 << 30).map(|_| ()), Ok(()));
        assert_eq!(w.used(), 1024 * 132 * 2048);
        e.context_gone(w.fake.ctx());
        assert_eq!(w.used(), 0);
    }

    #[test]
    fn a_stack_grown_before_it_was_first_seen_is_charged_from_the_default() {
        let w = World::new(4 << 30);
        w.fake
            .attributes
            .borrow_mut()
            .extend([(16, 132), (39, 2048)]);
        w.fake.limits.borrow_mut().insert(CU_LIMIT_STACK_SIZE, 2048);
        w.interposer().after_sync(CUDA_SUCCESS);
        assert_eq!(w.used(), 1024 * 132 * 2048);
    }

    #[test]
    fn the_context_going_away_gives_the_limits_back() {
        let w = World::new(4 << 30);
        assert_eq!(set(&w, CU_LIMIT_MALLOC_HEAP_SIZE, 1 << 30, 0), CUDA_SUCCESS);
        w.interposer().context_gone(w.fake.ctx());
        assert_eq!(w.used(), 0);
        // other limits (e.g. CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH) are forwarded uncharged
        assert_eq!(set(&w, 3, 4, 0), CUDA_SUCCESS);
        assert_eq!(w.used(), 0);
    }
}
