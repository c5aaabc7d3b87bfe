//! Modules: `cuModuleLoad*`, `cuModuleUnload`, and the measured load shared with libraries (whose hooks
//! live in `libraries`). Their device memory (code, globals) is measured around the load (`measure`).
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_uint, c_void};

use vgpu_ledger::Kind;

use super::common::{hook, interposer, Interposer, Target};
use super::measure::{estimate, Probe};
use crate::driver::Driver;
use crate::error::Error;
use crate::ffi::*;
use crate::real_symbols::forward;
use crate::records::Rec;

impl<D: Driver> Interposer<'_, D> {
    /// Loads a module into `m` with `load` and charges what it measured; unloads it if that does not fit.
    pub(crate) fn module_load(
        &self,
        m: *mut CUmodule,
        load: impl FnOnce() -> CUresult,
    ) -> CUresult {
        self.load_measured(m.cast(), load, |h| self.drv.module_unload(h))
    }

    /// cuLibraryLoad*: a library loaded while a context is current is measured like a module in that
    /// context; without a current context nothing is loaded on a device yet: its first use in each
    /// context is measured there (`libraries`).
    pub(crate) fn library_load(
        &self,
        lib: *mut *mut c_void,
        load: impl FnOnce() -> CUresult,
    ) -> CUresult {
        self.load_measured(lib, load, |h| self.drv.library_unload(h))
    }

    /// Runs `load` (which writes a handle to `out`) and charges what the device grew by in this process
    /// (`measure`); with `unload` undoes it when that does not fit.
    fn load_measured(
        &self,
        out: *mut *mut c_void,
        load: impl FnOnce() -> CUresult,
        unload: impl FnOnce(usize),
    ) -> CUresult {
        if out.is_null() {
            return load();
        }
        let (tgt, dev, ctx) = self.target_current();
        let q = match tgt {
            Target::Charge(q) => q,
            Target::Forward => return load(),
            Target::Fail(e) => return e.cuda(),
        };
        let pid = self.nvml_pid();
        let (before, _) = self.read(q, Probe::Current, pid);
        let r = load();
        if r != CUDA_SUCCESS {
            return r;
        }
        let (after, _) = self.read(q, Probe::Current, pid);
        let (cost, _) = estimate(Some(&before), &after, None, 0);
        // SAFETY: non-null, written by the driver.
        let handle = unsafe { *out } as usize;
        if !self.admit(q, Kind::Module, cost) {
            unload(handle);
            return Error::OutOfMemory.cuda();
        }
        self.rec
            .modules
            .insert(handle as u64, Rec::new(dev, Kind::Module, cost, ctx));
        r
    }
}

hook!(cuModuleLoad(m: *mut CUmodule, fname: *const c_char) {
    interposer().module_load(m, || forward!("cuModuleLoad", fn(*mut CUmodule, *const c_char), m, fname))
});
hook!(cuModuleLoadData(m: *mut CUmodule, image: *const c_void) {
    interposer().module_load(m, || forward!("cuModuleLoadData", fn(*mut CUmodule, *const c_void), m, image))
});
hook!(cuModuleLoadDataEx(m: *mut CUmodule, image: *const c_void, n: c_uint, opts: *mut c_void, vals: *mut *mut c_void) {
    interposer().module_load(m, || forward!("cuModuleLoadDataEx", fn(*mut CUmodule, *const c_void, c_uint, *mut c_void, *mut *mut c_void), m, image, n, opts, vals))
});
hook!(cuModuleLoadFatBinary(m: *mut CUmodule, fatbin: *const c_void) {
    interposer().module_load(m, || forward!("cuModuleLoadFatBinary", fn(*mut CUmodule, *const c_void), m, fatbin))
});
hook!(cuModuleUnload(m: CUmodule) {
    let e = interposer();
    let r = e.tracked_free(&e.rec.modules, m as u64, || forward!("cuModuleUnload", fn(CUmodule), m));
    if r == CUDA_SUCCESS && !e.drv.unlimited() {
        e.forget_functions(); // its function handles may come back as another module's
    }
    r
});

#[cfg(test)]
mod tests {
    use super::super::testing::World;
    use super::*;

    fn load(w: &World, module: usize, grow: i64) -> CUresult {
        let mut out: CUmodule = std::ptr::null_mut();
        let p: *mut CUmodule = &mut out;
        w.interposer().module_load(p, || {
            w.fake.grow(grow);
            // SAFETY: `p` points at the local `out`.
            unsafe { *p = module as CUmodule };
            CUDA_SUCCESS
        })
    }

    #[test]
    fn a_module_is_charged_its_measured_size_in_the_current_context() {
        let w = World::new(1 << 30);
        assert_eq!(load(&w, 0xe1, 2 << 20), CUDA_SUCCESS);
        assert_eq!(w.usage(Kind::Module), 2 << 20);
        let rec = w.rec.modules.with(0xe1, |r| r.copied()).unwrap();
        assert_eq!(rec.ctx, w.fake.ctx());
        let e = w.interposer();
        assert_eq!(
            e.tracked_free(&w.rec.modules, 0xe1, || CUDA_SUCCESS),
            CUDA_SUCCESS
        );
        assert_eq!(w.used(), 0);
    }

    #[test]
    fn a_module_that_does_not_fit_is_unloaded_and_refused() {
        let w = World::new(1 << 20);
        assert_eq!(load(&w, 0xe2, 2 << 20), CUDA_ERROR_OUT_OF_MEMORY);
        assert!(w.fake.called("module_unload 0xe2"));
        assert_eq!(w.used(), 0);
    }

    // Regression (item 8c): a module measured above the old 4 GiB ceiling was charged 4 GiB.
    #[test]
    fn a_module_larger_than_the_old_ceiling_is_charged_in_full() {
        let w = World::new(8 << 30);
        assert_eq!(load(&w, 0xe4, 5 << 30), CUDA_SUCCESS);
        assert_eq!(w.usage(Kind::Module), 5 << 30);
    }

    // Regression (item 9): another tenant allocating while a module loads was charged to the module.
    #[test]
    fn a_neighbour_allocating_while_a_module_loads_is_not_charged() {
        let w = World::new(8 << 30);
        let mut out: CUmodule = std::ptr::null_mut();
        let p: *mut CUmodule = &mut out;
        let r = w.interposer().module_load(p, || {
            w.fake.grow(2 << 20);
            w.fake.neighbour(90, 1 << 30);
            // SAFETY: `p` points at the local `out`.
            unsafe { *p = 0xe5 as CUmodule };
            CUDA_SUCCESS
        });
        assert_eq!(r, CUDA_SUCCESS);
        // at most the slack the device-wide reading may add above the process's own figure
        let m = w.usage(Kind::Module);
        assert!(
            (2 << 20..=(2 << 20) + super::super::measure::PROCESS_SLACK).contains(&m),
            "{m}"
        );
    }

    // Item 8b: cuLibraryLoad* was not charged at all.
    #[test]
    fn a_library_is_measured_like_a_module_and_unloaded_when_it_does_not_fit() {
        let w = World::new(64 << 20);
        let lib = |h: usize, grow: i64| {
            let mut out: *mut c_void = std::ptr::null_mut();
            let p: *mut *mut c_void = &mut out;
            w.interposer().library_load(p, || {
                w.fake.grow(grow);
                // SAFETY: `p` points at the local `out`.
                unsafe { *p = h as *mut c_void };
                CUDA_SUCCESS
            })
        };
        assert_eq!(lib(0xf1, 3 << 20), CUDA_SUCCESS);
        assert_eq!(w.usage(Kind::Module), 3 << 20);
        assert_eq!(lib(0xf2, 100 << 20), CUDA_ERROR_OUT_OF_MEMORY);
        assert!(w.fake.called("library_unload 0xf2"));
        assert_eq!(w.used(), 3 << 20);
    }

    #[test]
    fn memory_freed_while_loading_is_not_a_negative_cost() {
        let w = World::new(1 << 30);
        w.fake.grow(10 << 20);
        assert_eq!(load(&w, 0xe3, -(10 << 20)), CUDA_SUCCESS);
        assert_eq!(w.used(), 0);
    }
}
