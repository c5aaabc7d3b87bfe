//! Plain, pitch and managed device memory: `cuMemAlloc*`, `cuMemAllocPitch*`, `cuMemAllocManaged` and
//! `cuMemFree*`. Charged before the driver call; pitch is estimated then trued up. Pools live in `pools`.
#![allow(clippy::missing_safety_doc)]

use std::ffi::c_uint;

use vgpu_ledger::Kind;

use super::{engine, hook, Engine};
use crate::driver::Driver;
use crate::error::Error;
use crate::ffi::*;
use crate::real::forward;
use crate::virt;

impl<D: Driver> Engine<'_, D> {
    /// A pitch allocation of `w` x `h`: charged at an estimate, then trued up to pitch x rows.
    /// `read` returns what the driver wrote to the caller's out-parameters: (pointer, pitch).
    pub(crate) fn alloc_pitch(
        &self,
        w: u64,
        h: u64,
        call: impl FnOnce() -> CUresult,
        read: impl Fn() -> (u64, u64),
    ) -> CUresult {
        let r = self.charged_call(
            &self.rec.allocs,
            Kind::Data,
            virt::pitch_estimate(w, h),
            self.target_current(),
            call,
            || read().0,
        );
        if r != CUDA_SUCCESS {
            return r;
        }
        let (p, pitch) = read();
        if !self.true_up(&self.rec.allocs, p, pitch.saturating_mul(h.max(1))) {
            self.undo(&self.rec.allocs, p, || self.drv.mem_free(p));
            return Error::OutOfMemory.cuda();
        }
        r
    }
}

hook!(cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize) {
    let call = || forward!("cuMemAlloc_v2", fn(*mut CUdeviceptr, usize), dptr, bytes);
    if dptr.is_null() {
        return call();
    }
    let e = engine();
    // SAFETY: dptr is non-null and the driver just wrote it.
    e.charged_call(&e.rec.allocs, Kind::Data, bytes as u64, e.target_current(), call, || unsafe { *dptr })
});

hook!(cuMemAlloc(dptr: *mut CUdeviceptr_v1, bytes: c_uint) {
    let call = || forward!("cuMemAlloc", fn(*mut CUdeviceptr_v1, c_uint), dptr, bytes);
    if dptr.is_null() {
        return call();
    }
    let e = engine();
    // SAFETY: as above.
    e.charged_call(&e.rec.allocs, Kind::Data, bytes as u64, e.target_current(), call, || unsafe { *dptr } as u64)
});

hook!(cuMemAllocManaged(dptr: *mut CUdeviceptr, bytes: usize, flags: c_uint) {
    let call = || forward!("cuMemAllocManaged", fn(*mut CUdeviceptr, usize, c_uint), dptr, bytes, flags);
    if dptr.is_null() {
        return call();
    }
    let e = engine();
    // SAFETY: as above.
    e.charged_call(&e.rec.allocs, Kind::Managed, bytes as u64, e.target_current(), call, || unsafe { *dptr })
});

hook!(cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pitch: *mut usize, w: usize, h: usize, elem: c_uint) {
    let call = || forward!("cuMemAllocPitch_v2", fn(*mut CUdeviceptr, *mut usize, usize, usize, c_uint), dptr, pitch, w, h, elem);
    if dptr.is_null() || pitch.is_null() {
        return call();
    }
    // SAFETY: both non-null; read only after the driver succeeded and wrote them.
    engine().alloc_pitch(w as u64, h as u64, call, || unsafe { (*dptr, *pitch as u64) })
});

hook!(cuMemAllocPitch(dptr: *mut CUdeviceptr_v1, pitch: *mut c_uint, w: c_uint, h: c_uint, elem: c_uint) {
    let call = || forward!("cuMemAllocPitch", fn(*mut CUdeviceptr_v1, *mut c_uint, c_uint, c_uint, c_uint), dptr, pitch, w, h, elem);
    if dptr.is_null() || pitch.is_null() {
        return call();
    }
    // SAFETY: as above.
    engine().alloc_pitch(w as u64, h as u64, call, || unsafe { (*dptr as u64, *pitch as u64) })
});

hook!(cuMemFree_v2(p: CUdeviceptr) {
    let e = engine();
    e.tracked_free(&e.rec.allocs, p, || forward!("cuMemFree_v2", fn(CUdeviceptr), p))
});

hook!(cuMemFree(p: CUdeviceptr_v1) {
    let e = engine();
    e.tracked_free(&e.rec.allocs, p as u64, || forward!("cuMemFree", fn(CUdeviceptr_v1), p))
});

#[cfg(test)]
mod tests {
    use super::super::testing::World;
    use super::*;

    #[test]
    fn pitch_is_trued_up_to_what_the_driver_padded() {
        let w = World::new(1 << 20);
        let e = w.engine();
        // 100 x 10 estimated at 512 x 10; the driver padded rows to 1024
        let r = e.alloc_pitch(100, 10, || 0, || (0x40, 1024));
        assert_eq!(r, CUDA_SUCCESS);
        assert_eq!(w.used(), 10240);
        assert_eq!(w.rec.allocs.with(0x40, |r| r.map(|r| r.bytes)), Some(10240));
    }

    #[test]
    fn pitch_that_does_not_fit_once_padded_is_freed_and_refused() {
        let w = World::new(6000);
        let e = w.engine();
        // the estimate (512 x 10 = 5120) fits; the driver's pitch (1024 x 10) does not
        let r = e.alloc_pitch(100, 10, || 0, || (0x80, 1024));
        assert_eq!(r, CUDA_ERROR_OUT_OF_MEMORY);
        assert_eq!(w.used(), 0, "nothing stays charged");
        assert!(
            w.fake.called("mem_free 0x80"),
            "the driver's allocation is freed again"
        );
        assert!(w.rec.allocs.keys().is_empty());
    }

    #[test]
    fn pitch_refused_up_front_never_reaches_the_driver() {
        let w = World::new(1000);
        let e = w.engine();
        let r = e.alloc_pitch(4096, 4096, || panic!("driver called"), || (0, 0));
        assert_eq!(r, CUDA_ERROR_OUT_OF_MEMORY);
    }

    #[test]
    fn managed_and_plain_are_charged_by_kind() {
        let w = World::new(1000);
        let e = w.engine();
        e.charged_call(
            &w.rec.allocs,
            Kind::Managed,
            100,
            e.target_current(),
            || 0,
            || 1,
        );
        e.charged_call(
            &w.rec.allocs,
            Kind::Data,
            200,
            e.target_current(),
            || 0,
            || 2,
        );
        assert_eq!((w.usage(Kind::Managed), w.usage(Kind::Data)), (100, 200));
    }
}
