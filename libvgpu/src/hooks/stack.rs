//! Kernel stack growth checked before the launch (issue 23 item 3). A kernel whose local memory per
//! thread is more than its context's stack makes the driver grow the stack at the launch, for every
//! resident thread of the device (16 KiB per thread took 4,482 MiB on an H100), with no call the library
//! sees. So before a launch of such a function, the stack is grown first through `cuCtxSetLimit`'s own
//! accounting (`limits`): charged before the driver is asked, refused with `CUDA_ERROR_OUT_OF_MEMORY` —
//! what the driver itself answers when it cannot grow the stack — when the growth does not fit. The
//! launch then finds the stack big enough and grows nothing.
//!
//! The kernel launch hooks (`hooks/launch::kernel`) call [`Interposer::launch_memory`] with the launched
//! handle whenever a memory limit applies, so `cuGetProcAddress` hands them out then even without a
//! compute share (`interpose::swap_proc`). The stack grown is the launch's stream's context's (pushed
//! current for the growth when another context is current), never the current context's. A `CUkernel`
//! launched with no context current has its local size asked on its stream's device; a default stream
//! with no context current is refused with the driver's own error, as the driver refuses the launch. A
//! function the driver gives no local size for is not checked: its growth is charged after the fact.
//! Its cost on a launch that needs no growth: one atomic load, three table lookups (the function's local
//! size is asked once per function); the stream's context is asked only when the stack must grow (or a
//! `CUkernel`'s size needs its device).

use std::sync::atomic::Ordering;

use crate::driver::Driver;
use crate::ffi::*;
use crate::records::PLAIN_FUNCS;

use super::common::Interposer;
use super::limits::CU_LIMIT_STACK_SIZE;

/// The stack size of a new context (bytes per thread), as the driver sets it.
const DEFAULT_STACK: u64 = 1024;

/// Where function `func` sits in `Records::plain_funcs` (handles are pointers: their low bits are zero).
fn plain_slot(func: usize) -> usize {
    ((func >> 4) ^ (func >> 12)) % PLAIN_FUNCS
}

/// Where a launch runs: its stream's (device, context), or the driver's error for a stream without one.
pub(crate) type Home = Result<(CUdevice, usize), CUresult>;

impl<D: Driver> Interposer<'_, D> {
    /// The local memory per thread of `func`, asked once per function: of a `CUfunction`, or of a
    /// `CUkernel` on the current context's device, else on the launch's device (`home`, asked only then:
    /// with no context current the driver names no device for a `CUkernel`).
    fn local_size(
        &self,
        func: usize,
        home: &impl Fn() -> Home,
        at: &mut Option<Home>,
    ) -> Option<u64> {
        if let Some(v) = self.rec.func_local.with(func as u64, |v| v.copied()) {
            return Some(v);
        }
        let v = self.drv.func_local_size(func, None).or_else(|| {
            let dev = at.get_or_insert_with(home).as_ref().ok()?.0;
            self.drv.func_local_size(func, Some(dev))
        })?;
        self.rec.func_local.insert(func as u64, v);
        Some(v)
    }

    /// Before a launch of `func` in its stream's context (`home`, asked only when the stack may have to
    /// grow or the function's size needs the launch's device): grows that context's stack to the
    /// function's local memory per thread when that is more than the stack has, charged first. Err: what
    /// the launch returns instead (the driver is not asked to launch) — out of memory, or, for a default
    /// stream with no context current, the driver's own refusal of such a launch.
    pub(crate) fn stack_admit(&self, func: usize, home: impl Fn() -> Home) -> Result<(), CUresult> {
        if self.drv.unlimited() || func == 0 {
            return Ok(());
        }
        let slot = &self.rec.plain_funcs[plain_slot(func)];
        if slot.load(Ordering::Relaxed) == func as u64 {
            return Ok(());
        }
        let mut at = None;
        let Some(local) = self.local_size(func, &home, &mut at) else {
            return Ok(());
        };
        if local <= DEFAULT_STACK {
            slot.store(func as u64, Ordering::Relaxed);
            return Ok(());
        }
        // A stream with no context (the legacy or per-thread default stream while none is current):
        // the driver fails such a launch, and so does this, before it grows anything.
        let (_, ctx) = at.unwrap_or_else(home)?;
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
        home: impl Fn() -> Home,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        if self.drv.unlimited() {
            return call();
        }
        if let Err(e) = self.stack_admit(func, home) {
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
        let e = w.interposer();
        assert_eq!(
            e.stack_admit(0xf0, || Ok((0, e.drv.ctx_current()))),
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
        let e = w.interposer();
        assert_eq!(e.stack_admit(0xf1, || Ok((0, e.drv.ctx_current()))), Ok(()));
        let grow = ((16 << 10) - 1024) * THREADS;
        assert_eq!(w.usage(Kind::Context), grow, "charged before the launch");
        assert!(w.fake.called("ctx_set_stack 16384"));
        assert_eq!(w.fake.ctx_get_limit(CU_LIMIT_STACK_SIZE), Some(16 << 10));
        w.fake.calls.borrow_mut().clear();
        // the same function again, and a smaller one: nothing to do
        assert_eq!(e.stack_admit(0xf1, || Ok((0, e.drv.ctx_current()))), Ok(()));
        assert_eq!(e.stack_admit(0xf2, || Ok((0, e.drv.ctx_current()))), Ok(()));
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
        let e = w.interposer();
        let r = e.launch_memory(
            0xf6,
            || Ok((0, e.drv.ctx_current())),
            || panic!("launched past the quota"),
        );
        assert_eq!(r, CUDA_ERROR_OUT_OF_MEMORY);
        assert_eq!(
            e.launch_memory(0xf7, || Ok((0, e.drv.ctx_current())), || 7),
            7,
            "a launch that needs nothing runs"
        );
    }

    #[test]
    fn a_kernels_size_is_asked_on_its_streams_device_when_no_context_names_one() {
        let w = World::new(1 << 30);
        // a CUkernel: the driver gives its size only for a device named by the caller
        w.fake.kernel_locals.borrow_mut().insert(0xf8, 16 << 10);
        let e = w.interposer();
        let ctx = e.drv.ctx_current();
        assert_eq!(
            e.stack_admit(0xf8, || Ok((0, ctx))),
            Err(CUDA_ERROR_OUT_OF_MEMORY)
        );
        assert!(!w.fake.called("ctx_set_stack"));
        assert_eq!(w.used(), 0);
    }

    #[test]
    fn a_stream_without_a_context_is_refused_as_the_driver_refuses_it() {
        const INVALID_CONTEXT: CUresult = 201;
        let w = World::new(8 << 30);
        w.fake.func_locals.borrow_mut().insert(0xf9, 16 << 10);
        w.fake.func_locals.borrow_mut().insert(0xfa, 256);
        let e = w.interposer();
        assert_eq!(
            e.stack_admit(0xf9, || Err(INVALID_CONTEXT)),
            Err(INVALID_CONTEXT)
        );
        assert!(!w.fake.called("ctx_set_stack"), "nothing grown");
        assert_eq!(w.used(), 0);
        assert_eq!(
            e.stack_admit(0xfa, || panic!("asked for a launch that needs no growth")),
            Ok(()),
            "a launch that needs no growth is the driver's to answer"
        );
    }

    #[test]
    fn functions_within_the_default_stack_or_without_a_limit_cost_nothing() {
        let w = World::new(1 << 20);
        w.fake.func_locals.borrow_mut().insert(0xf3, 512);
        let e = w.interposer();
        assert_eq!(e.stack_admit(0xf3, || Ok((0, e.drv.ctx_current()))), Ok(()));
        assert_eq!(
            e.stack_admit(0xf4, || Ok((0, e.drv.ctx_current()))),
            Ok(()),
            "unknown to the driver: the launch answers"
        );
        w.fake.func_locals.borrow_mut().insert(0xf5, 64 << 10);
        w.fake.set_applies(Applies::Nowhere);
        assert_eq!(e.stack_admit(0xf5, || Ok((0, e.drv.ctx_current()))), Ok(()));
        assert!(!w.fake.called("ctx_set_stack"));
    }
}
