//! Modules: `cuModuleLoad*` and `cuModuleUnload`. A module's device memory (code, globals) is measured as
//! the device's free memory before and after loading, net of the ledger's other activity.
//! Libraries (`cuLibraryLoad*`) are not charged yet.
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_uint, c_void};

use vgpu_ledger::Kind;

use super::{engine, hook, measured, Engine, Target, MODULE_CEILING};
use crate::driver::Driver;
use crate::error::Error;
use crate::ffi::*;
use crate::real::forward;
use crate::records::Rec;

impl<D: Driver> Engine<'_, D> {
    /// Loads a module into `m` with `load` and charges what it measured; unloads it if that does not fit.
    pub(crate) fn module_load(
        &self,
        m: *mut CUmodule,
        load: impl FnOnce() -> CUresult,
    ) -> CUresult {
        if m.is_null() {
            return load();
        }
        let (tgt, dev, ctx) = self.target_current();
        let q = match tgt {
            Target::Charge(q) => q,
            Target::Forward => return load(),
            Target::Fail(e) => return e.cuda(),
        };
        let (before, lb) = (self.device_free(), q.used());
        let r = load();
        if r != CUDA_SUCCESS {
            return r;
        }
        let cost = match (before, self.device_free()) {
            (Some(b), Some(a)) => measured(
                b as i128 - a as i128,
                q.used() as i128 - lb as i128,
                MODULE_CEILING,
            ),
            _ => 0,
        };
        // SAFETY: non-null, written by the driver.
        let module = unsafe { *m } as usize;
        if !q.charge(Kind::Module, cost) {
            self.drv.module_unload(module);
            return Error::OutOfMemory.cuda();
        }
        self.rec
            .modules
            .insert(module as u64, Rec::new(dev, Kind::Module, cost, ctx));
        r
    }
}

hook!(cuModuleLoad(m: *mut CUmodule, fname: *const c_char) {
    engine().module_load(m, || forward!("cuModuleLoad", fn(*mut CUmodule, *const c_char), m, fname))
});
hook!(cuModuleLoadData(m: *mut CUmodule, image: *const c_void) {
    engine().module_load(m, || forward!("cuModuleLoadData", fn(*mut CUmodule, *const c_void), m, image))
});
hook!(cuModuleLoadDataEx(m: *mut CUmodule, image: *const c_void, n: c_uint, opts: *mut c_void, vals: *mut *mut c_void) {
    engine().module_load(m, || forward!("cuModuleLoadDataEx", fn(*mut CUmodule, *const c_void, c_uint, *mut c_void, *mut *mut c_void), m, image, n, opts, vals))
});
hook!(cuModuleLoadFatBinary(m: *mut CUmodule, fatbin: *const c_void) {
    engine().module_load(m, || forward!("cuModuleLoadFatBinary", fn(*mut CUmodule, *const c_void), m, fatbin))
});
hook!(cuModuleUnload(m: CUmodule) {
    let e = engine();
    e.tracked_free(&e.rec.modules, m as u64, || forward!("cuModuleUnload", fn(CUmodule), m))
});

#[cfg(test)]
mod tests {
    use super::super::testing::World;
    use super::*;

    fn load(w: &World, module: usize, grow: i64) -> CUresult {
        let mut out: CUmodule = std::ptr::null_mut();
        let p: *mut CUmodule = &mut out;
        w.engine().module_load(p, || {
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
        let e = w.engine();
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

    #[test]
    fn memory_freed_while_loading_is_not_a_negative_cost() {
        let w = World::new(1 << 30);
        w.fake.grow(10 << 20);
        assert_eq!(load(&w, 0xe3, -(10 << 20)), CUDA_SUCCESS);
        assert_eq!(w.used(), 0);
    }
}
