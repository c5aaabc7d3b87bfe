//! Libraries (context-independent loading): `cuLibraryLoadData`, `cuLibraryLoadFromFile`,
//! `cuLibraryUnload`, and the calls that load a library into a context at its first use there:
//! `cuLibraryGetModule`, `cuKernelGetFunction`, `cuLibraryGetGlobal`, `cuLibraryGetManaged`,
//! `cuLibraryGetUnifiedFunction` (`cuLibraryGetKernel` loads nothing: its kernels are remembered, and a
//! kernel's first use loads its library). A library loaded while a context is current is measured there
//! at the load (`modules`); its first use in any other context (or, loaded with none current, in every
//! context) is measured around that call and charged as module memory of that context, once per context.
//! A first use that does not fit cannot be undone in that context alone (the driver has no per-context
//! unload): the library is unloaded everywhere and the call fails with out-of-memory. A library whose
//! size is known from another context is refused before the driver is asked.
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_uint, c_void};
use std::sync::atomic::Ordering;

use vgpu_ledger::Kind;

use super::common::{hook, interposer, Interposer, Target};
use super::measure::{estimate, Probe};
use crate::driver::Driver;
use crate::error::Error;
use crate::ffi::*;
use crate::log;
use crate::real_symbols::forward;
use crate::records::Rec;

/// The key in `modules` of `lib`'s copy in `ctx` (the top bit: never a user-space handle).
fn use_key(lib: u64, ctx: usize) -> u64 {
    (lib.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ ctx as u64) | 1 << 63
}

impl<D: Driver> Interposer<'_, D> {
    /// Whether `lib` is charged in `ctx`: loaded there, or used there before.
    fn library_charged_in(&self, lib: u64, ctx: usize) -> bool {
        self.rec
            .modules
            .with(lib, |r| r.is_some_and(|r| r.ctx == ctx))
            || self.rec.modules.with(use_key(lib, ctx), |r| r.is_some())
    }

    /// What `lib` was measured at in some context (its load, or an earlier first use).
    fn library_size(&self, lib: u64) -> Option<u64> {
        let at_load = self.rec.modules.with(lib, |r| r.map(|r| r.bytes));
        at_load.or_else(|| {
            let keys = self.rec.library_uses.with(lib, |k| k.cloned())?;
            keys.iter()
                .find_map(|k| self.rec.modules.with(*k, |r| r.map(|r| r.bytes)))
        })
    }

    /// A call that loads `lib` into the current context if it is not there yet: measured and charged on
    /// the first use in each context, passed straight through after.
    pub(crate) fn library_use(
        &self,
        lib: u64,
        what: &str,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        if lib == 0 || self.drv.unlimited() {
            return call();
        }
        let (tgt, dev, ctx) = self.target_current();
        let q = match tgt {
            Target::Charge(q) => q,
            Target::Forward => return call(),
            Target::Fail(e) => return e.cuda(),
        };
        if self.library_charged_in(lib, ctx) {
            return call();
        }
        if let Some(known) = self.library_size(lib) {
            if !q.charge(Kind::Module, known) {
                log::warn(format_args!(
                    "{what}: library 0x{lib:x} ({known} bytes in another context) does not fit device \
                     {dev}'s quota: CUDA_ERROR_OUT_OF_MEMORY"
                ));
                return Error::OutOfMemory.cuda();
            }
            q.refund(Kind::Module, known); // measured below
        }
        let pid = self.nvml_pid();
        let (before, _) = self.read(q, Probe::Current, pid);
        let r = call();
        if r != CUDA_SUCCESS {
            return r;
        }
        let (after, _) = self.read(q, Probe::Current, pid);
        let (cost, _) = estimate(Some(&before), &after, None, 0);
        if !q.charge(Kind::Module, cost) {
            // The driver cannot unload it from one context: the library goes, everywhere.
            self.drv.library_unload(lib as usize);
            self.forget_library(lib);
            log::warn(format_args!(
                "{what}: library 0x{lib:x} took {cost} bytes loading into this context, past device {dev}'s \
                 quota: unloaded (its handle is no longer valid); CUDA_ERROR_OUT_OF_MEMORY"
            ));
            return Error::OutOfMemory.cuda();
        }
        let key = use_key(lib, ctx);
        self.rec
            .modules
            .insert(key, Rec::new(dev, Kind::Module, cost, ctx));
        self.rec.library_uses.update(lib, Vec::new, |v| v.push(key));
        r
    }

    /// Gives back what `lib`'s load and its first uses in other contexts charged, and forgets its kernels.
    fn forget_library(&self, lib: u64) {
        if let Some(rec) = self.rec.modules.remove(lib) {
            self.release(&rec);
        }
        for key in self.rec.library_uses.remove(lib).unwrap_or_default() {
            if let Some(rec) = self.rec.modules.remove(key) {
                self.release(&rec); // absent: its context went first, with it
            }
        }
        self.rec.kernels.drain_where(|l| *l == lib);
        self.forget_functions();
    }

    /// `library_use` for a kernel handle from `cuLibraryGetKernel` (anything else passes through). The
    /// launch hooks call it for a launch of a `CUkernel`, which loads the kernel's library likewise.
    pub(crate) fn kernel_use(
        &self,
        kernel: u64,
        what: &str,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        if !self.rec.kernels_seen.load(Ordering::Relaxed) {
            return call();
        }
        match self.rec.kernels.with(kernel, |l| l.copied()) {
            Some(lib) => self.library_use(lib, what, call),
            None => call(),
        }
    }

    /// `cuLibraryGetKernel`: the kernel is remembered with its library (it loads nothing itself).
    pub(crate) fn library_kernel(
        &self,
        out: *mut *mut c_void,
        lib: u64,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let r = call();
        if r == CUDA_SUCCESS && !out.is_null() && !self.drv.unlimited() {
            // SAFETY: non-null, written by the driver.
            let k = unsafe { *out } as u64;
            self.rec.kernels.insert(k, lib);
            self.rec.kernels_seen.store(true, Ordering::Relaxed);
        }
        r
    }

    /// `cuLibraryUnload`: gives back what the load and every first use charged.
    pub(crate) fn library_unload(&self, lib: u64, call: impl FnOnce() -> CUresult) -> CUresult {
        let r = call();
        if r == CUDA_SUCCESS && !self.drv.unlimited() {
            self.forget_library(lib);
        }
        r
    }
}

type Opts = *mut c_void;
hook!(cuLibraryLoadData(lib: *mut *mut c_void, code: *const c_void, jo: Opts, jv: *mut *mut c_void, nj: c_uint, lo: Opts, lv: *mut *mut c_void, nl: c_uint) {
    interposer().library_load(lib, || forward!("cuLibraryLoadData", fn(*mut *mut c_void, *const c_void, Opts, *mut *mut c_void, c_uint, Opts, *mut *mut c_void, c_uint), lib, code, jo, jv, nj, lo, lv, nl))
});
hook!(cuLibraryLoadFromFile(lib: *mut *mut c_void, fname: *const c_char, jo: Opts, jv: *mut *mut c_void, nj: c_uint, lo: Opts, lv: *mut *mut c_void, nl: c_uint) {
    interposer().library_load(lib, || forward!("cuLibraryLoadFromFile", fn(*mut *mut c_void, *const c_char, Opts, *mut *mut c_void, c_uint, Opts, *mut *mut c_void, c_uint), lib, fname, jo, jv, nj, lo, lv, nl))
});
hook!(cuLibraryUnload(lib: *mut c_void) {
    interposer().library_unload(lib as u64, || forward!("cuLibraryUnload", fn(*mut c_void), lib))
});
hook!(cuLibraryGetModule(m: *mut CUmodule, lib: *mut c_void) {
    interposer().library_use(lib as u64, "cuLibraryGetModule", || forward!("cuLibraryGetModule", fn(*mut CUmodule, *mut c_void), m, lib))
});
hook!(cuLibraryGetKernel(k: *mut *mut c_void, lib: *mut c_void, name: *const c_char) {
    interposer().library_kernel(k, lib as u64, || forward!("cuLibraryGetKernel", fn(*mut *mut c_void, *mut c_void, *const c_char), k, lib, name))
});
hook!(cuKernelGetFunction(f: *mut *mut c_void, k: *mut c_void) {
    interposer().kernel_use(k as u64, "cuKernelGetFunction", || forward!("cuKernelGetFunction", fn(*mut *mut c_void, *mut c_void), f, k))
});
hook!(cuLibraryGetGlobal(p: *mut CUdeviceptr, bytes: *mut usize, lib: *mut c_void, name: *const c_char) {
    interposer().library_use(lib as u64, "cuLibraryGetGlobal", || forward!("cuLibraryGetGlobal", fn(*mut CUdeviceptr, *mut usize, *mut c_void, *const c_char), p, bytes, lib, name))
});
hook!(cuLibraryGetManaged(p: *mut CUdeviceptr, bytes: *mut usize, lib: *mut c_void, name: *const c_char) {
    interposer().library_use(lib as u64, "cuLibraryGetManaged", || forward!("cuLibraryGetManaged", fn(*mut CUdeviceptr, *mut usize, *mut c_void, *const c_char), p, bytes, lib, name))
});
hook!(cuLibraryGetUnifiedFunction(f: *mut *mut c_void, lib: *mut c_void, name: *const c_char) {
    interposer().library_use(lib as u64, "cuLibraryGetUnifiedFunction", || forward!("cuLibraryGetUnifiedFunction", fn(*mut *mut c_void, *mut c_void, *const c_char), f, lib, name))
});

#[cfg(test)]
mod tests {
    use super::super::testing::World;
    use super::*;
    use crate::driver::fake::handle;

    /// A library loaded with no context current (nothing measured, nothing charged).
    fn loaded_without_context(w: &World, lib: usize) {
        let home = w.fake.ctx();
        w.fake.set_current(0);
        let mut out: *mut c_void = std::ptr::null_mut();
        let p: *mut *mut c_void = &mut out;
        let r = w.interposer().library_load(p, || {
            // SAFETY: `p` points at the local `out`.
            unsafe { *p = lib as *mut c_void };
            CUDA_SUCCESS
        });
        assert_eq!(r, CUDA_SUCCESS);
        assert_eq!(w.used(), 0, "nothing is on a device yet");
        w.fake.set_current(home);
    }

    /// A second context on device 0, made current.
    fn other_context(w: &World) -> usize {
        let c = handle();
        w.fake.ctx_devices.borrow_mut().insert(c, 0);
        w.fake.set_current(c);
        c
    }

    #[test]
    fn a_library_loaded_without_a_context_is_charged_at_its_first_use_in_each_context() {
        let w = World::new(1 << 30);
        loaded_without_context(&w, 0xa1);
        let e = w.interposer();
        let use_it = |grow: i64| {
            e.library_use(0xa1, "t", || {
                w.fake.grow(grow);
                CUDA_SUCCESS
            })
        };
        assert_eq!(use_it(300 << 20), CUDA_SUCCESS);
        assert_eq!(w.usage(Kind::Module), 300 << 20, "charged at the first use");
        assert_eq!(use_it(0), CUDA_SUCCESS);
        assert_eq!(w.usage(Kind::Module), 300 << 20, "once per context");
        other_context(&w);
        assert_eq!(use_it(300 << 20), CUDA_SUCCESS);
        assert_eq!(
            w.usage(Kind::Module),
            600 << 20,
            "and again in another context"
        );
        assert_eq!(e.library_unload(0xa1, || CUDA_SUCCESS), CUDA_SUCCESS);
        assert_eq!(w.used(), 0, "the unload gives every copy back");
    }

    #[test]
    fn a_first_use_past_the_quota_is_charged_and_refused() {
        let w = World::new(1 << 30);
        loaded_without_context(&w, 0xa2);
        let e = w.interposer();
        let r = e.library_use(0xa2, "t", || {
            w.fake.grow(2 << 30);
            CUDA_SUCCESS
        });
        assert_eq!(r, CUDA_ERROR_OUT_OF_MEMORY);
        assert!(
            w.fake.called("library_unload 0xa2"),
            "unloaded: the device gets it back"
        );
        assert_eq!(w.used(), 0);
    }

    #[test]
    fn a_size_known_from_another_context_is_refused_before_the_driver_is_asked() {
        let w = World::new(1 << 30);
        loaded_without_context(&w, 0xa5);
        let e = w.interposer();
        let r = e.library_use(0xa5, "t", || {
            w.fake.grow(600 << 20);
            CUDA_SUCCESS
        });
        assert_eq!(r, CUDA_SUCCESS);
        other_context(&w);
        let r = e.library_use(0xa5, "t", || panic!("loaded past the quota"));
        assert_eq!(r, CUDA_ERROR_OUT_OF_MEMORY);
        assert_eq!(
            w.usage(Kind::Module),
            600 << 20,
            "the first context keeps its copy"
        );
        assert!(!w.fake.called("library_unload"));
    }

    #[test]
    fn a_library_loaded_in_a_context_is_not_measured_again_there() {
        let w = World::new(1 << 30);
        let e = w.interposer();
        let mut out: *mut c_void = std::ptr::null_mut();
        let p: *mut *mut c_void = &mut out;
        let r = e.library_load(p, || {
            w.fake.grow(5 << 20);
            // SAFETY: `p` points at the local `out`.
            unsafe { *p = 0xa3 as *mut c_void };
            CUDA_SUCCESS
        });
        assert_eq!(r, CUDA_SUCCESS);
        assert_eq!(e.library_use(0xa3, "t", || CUDA_SUCCESS), CUDA_SUCCESS);
        assert_eq!(w.usage(Kind::Module), 5 << 20);
        // in another context it is a first use
        other_context(&w);
        let r = e.library_use(0xa3, "t", || {
            w.fake.grow(5 << 20);
            CUDA_SUCCESS
        });
        assert_eq!((r, w.usage(Kind::Module)), (CUDA_SUCCESS, 10 << 20));
    }

    #[test]
    fn a_kernel_of_the_library_loads_it_at_its_first_use() {
        let w = World::new(1 << 30);
        loaded_without_context(&w, 0xa4);
        let e = w.interposer();
        let mut k: *mut c_void = std::ptr::null_mut();
        let kp: *mut *mut c_void = &mut k;
        let r = e.library_kernel(kp, 0xa4, || {
            // SAFETY: `kp` points at the local `k`.
            unsafe { *kp = 0xb4 as *mut c_void };
            CUDA_SUCCESS
        });
        assert_eq!(
            (r, w.used()),
            (CUDA_SUCCESS, 0),
            "getting the kernel loads nothing"
        );
        let r = e.kernel_use(0xb4, "t", || {
            w.fake.grow(7 << 20);
            CUDA_SUCCESS
        });
        assert_eq!((r, w.usage(Kind::Module)), (CUDA_SUCCESS, 7 << 20));
        // an unknown handle (a CUfunction) passes through
        assert_eq!(e.kernel_use(0xc4, "t", || 5), 5);
        assert_eq!(e.library_unload(0xa4, || CUDA_SUCCESS), CUDA_SUCCESS);
        assert_eq!(w.used(), 0);
        assert!(w.rec.kernels.keys().is_empty());
    }
}
