//! Kernel stack growth checked before the launch (issue 23 item 3). A kernel whose local memory per
//! thread is more than its context's stack makes the driver grow the stack at the launch, for every
//! resident thread of the device (16 KiB per thread took 4,482 MiB on an H100), with no call the library
//! sees. So before a launch of such a function, the stack is grown first through `cuCtxSetLimit`'s own
//! accounting (`limits`): charged before the driver is asked, refused with `CUDA_ERROR_OUT_OF_MEMORY` —
//! what the driver itself answers when it cannot grow the stack — when the growth does not fit. The
//! launch then finds the stack big enough and grows nothing.
//!
//! The kernel launch hooks (`hooks/launch::kernel`) call [`Engine::launch_memory`] with the launched
//! handle whenever a memory limit applies, so `cuGetProcAddress` hands them out then even without a
//! compute share (`interpose::swap_proc`). The stack grown is the launch's stream's context's (pushed
//! current for the growth when another context is current), never the current context's. A `CUkernel`
//! the driver gives no local size for is not checked: its growth is charged after the fact, as before.
//! Its cost on a launch that needs no growth: one atomic load, three table lookups (the function's local
//! size is asked once per function); the stream's context is asked only when the stack must grow.

use std::sync::atomic::Ordering;

use crate::driver::Driver;
use crate::ffi::*;
use crate::records::PLAIN_FUNCS;

use super::common::Engine;
use super::limits::CU_LIMIT_STACK_SIZE;

/// The stack size of a new context (bytes per thread), as the driver sets it.
const DEFAULT_STACK: u64 = 1024;

/// Where function `func` sits in `Records::plain_funcs` (handles are pointers: their low bits are zero).
fn plain_slot(func: usize) -> usize {
    ((func >> 4) ^ (func >> 12)) % PLAIN_FUNCS
}

impl<D: Driver> Engine<'_, D> {
    /// The local memory per thread of `func`, asked once per function.
    fn local_size(&self, func: usize) -> Option<u64> {
        if let Some(v) = self.rec.func_local.with(func as u64, |v| v.copied()) {
            return Some(v);
        }
        let v = self.drv.func_local_size(func)?;
        self.rec.func_local.insert(func as u64, v);
        Some(v)
    }

    /// Before a launch of `func` in context `launch_ctx()` (its stream's; asked only when the stack may
    /// have to grow): grows that context's stack to the function's local memory per thread when that is
    /// more than the stack has, charged first. Err: what the launch returns instead (the driver is not
    /// asked to launch).
    pub(crate) fn stack_admit(
        &self,
        func: usize,
        launch_ctx: impl FnOnce() -> usize,
    ) -> Result<(), CUresult> {
        if self.drv.unlimited() || func == 0 {
            return Ok(());
        }
        let slot = &self.rec.plain_funcs[plain_slot(func)];
        if slot.load(Ordering::Relaxed) == func as u64 {
            return Ok(());
        }
        let Some(local) = self.local_size(func) else {
            return Ok(());
        };
        if local <= DEFAULT_STACK {
            slot.store(func as u64, Ordering::Relaxed);
            return Ok(());
        }
        let ctx = launch_ctx();
        if ctx == 0 {
            // No context for the stream: the driver refuses the launch itself.
            return Ok(());
        }
        let seen = self.rec.stack_seen.with(ctx as u64, |s| s.copied());
        if local <= seen.unwrap_or(DEFAULT_STACK) {
            return Ok(());
        }
        let grow = || self.set_limit(CU_LIMIT_STACK_SIZE, local, || self.drv.ctx_set_stack(local));
        let r = if ctx == self.drv.ctx_current() {
            grow()
        } else {
            // cuCtxSetLimit and its accounting act on the current context: the stream's, for the call.
            crate::streams::in_context(ctx, grow).unwrap_or_else(|e| e)
        };
        match r {
            CUDA_SUCCESS => Ok(()),
            e => Err(e),
        }
    }

    /// A function handle may be reused once its module is gone: forget what was learned about it.
    pub(crate) fn forget_functions(&self) {
        self.rec.func_local.clear();
        self.rec.forget_plain_funcs();
    }

    /// What a launch of `func` needs from the memory quota before the driver runs it (`call`): the stack
    /// growth it needs charged or refused (`stack_admit`), and, for a `CUkernel`, its library's first use
    /// in this context measured (`libraries`).
    pub(crate) fn launch_memory(
        &self,
        func: usize,
        launch_ctx: impl FnOnce() -> usize,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        if self.drv.unlimited() {
            return call();
        }
        if let Err(e) = self.stack_admit(func, launch_ctx) {
            return e;
        }
        self.kernel_use(func as u64, "launch", call)
    }
}

#[cfg(test)]
mod tests {
    use vgpu_ledger::Kind;

    use super::super::testing::World;
    use super::*;
    use crate::settings::Applies;

    /// 132 multiprocessors x 2048 resident threads (the fake seam's H100).
    const THREADS: u64 = 132 * 2048;

    #[test]
    fn growth_that_does_not_fit_is_refused_before_the_launch() {
        let w = World::new(1 << 30);
        w.fake.func_locals.borrow_mut().insert(0xf0, 16 << 10);
        let e = w.engine();
        assert_eq!(
            e.stack_admit(0xf0, || e.drv.ctx_current()),
            Err(CUDA_ERROR_OUT_OF_MEMORY)
        );
        assert!(
            !w.fake.called("ctx_set_stack"),
            "the driver is not asked to grow it"
        );
        assert_eq!(w.used(), 0);
        assert_eq!(w.fake.ctx_get_limit(CU_LIMIT_STACK_SIZE), Some(1024));
    }

    #[test]
    fn growth_that_fits_is_charged_once_and_the_launch_grows_nothing() {
        let w = World::new(8 << 30);
        w.fake.func_locals.borrow_mut().insert(0xf1, 16 << 10);
        w.fake.func_locals.borrow_mut().insert(0xf2, 4 << 10);
        let e = w.engine();
        assert_eq!(e.stack_admit(0xf1, || e.drv.ctx_current()), Ok(()));
        let grow = ((16 << 10) - 1024) * THREADS;
        assert_eq!(w.usage(Kind::Context), grow, "charged before the launch");
        assert!(w.fake.called("ctx_set_stack 16384"));
        assert_eq!(w.fake.ctx_get_limit(CU_LIMIT_STACK_SIZE), Some(16 << 10));
        w.fake.calls.borrow_mut().clear();
        // the same function again, and a smaller one: nothing to do
        assert_eq!(e.stack_admit(0xf1, || e.drv.ctx_current()), Ok(()));
        assert_eq!(e.stack_admit(0xf2, || e.drv.ctx_current()), Ok(()));
        assert!(!w.fake.called("ctx_set_stack"));
        assert_eq!(w.usage(Kind::Context), grow);
        // the synchronisation's check finds no growth of its own to charge
        e.reconcile_stack();
        assert_eq!(w.usage(Kind::Context), grow);
    }

    #[test]
    fn a_launch_that_cannot_grow_the_stack_never_reaches_the_driver() {
        let w = World::new(1 << 30);
        w.fake.func_locals.borrow_mut().insert(0xf6, 16 << 10);
        w.fake.func_locals.borrow_mut().insert(0xf7, 256);
        let e = w.engine();
        let r = e.launch_memory(
            0xf6,
            || e.drv.ctx_current(),
            || panic!("launched past the quota"),
        );
        assert_eq!(r, CUDA_ERROR_OUT_OF_MEMORY);
        assert_eq!(
            e.launch_memory(0xf7, || e.drv.ctx_current(), || 7),
            7,
            "a launch that needs nothing runs"
        );
    }

    #[test]
    fn functions_within_the_default_stack_or_without_a_limit_cost_nothing() {
        let w = World::new(1 << 20);
        w.fake.func_locals.borrow_mut().insert(0xf3, 512);
        let e = w.engine();
        assert_eq!(e.stack_admit(0xf3, || e.drv.ctx_current()), Ok(()));
        assert_eq!(
            e.stack_admit(0xf4, || e.drv.ctx_current()),
            Ok(()),
            "unknown to the driver: the launch answers"
        );
        w.fake.func_locals.borrow_mut().insert(0xf5, 64 << 10);
        w.fake.set_applies(Applies::Nowhere);
        assert_eq!(e.stack_admit(0xf5, || e.drv.ctx_current()), Ok(()));
        assert!(!w.fake.called("ctx_set_stack"));
    }
}
