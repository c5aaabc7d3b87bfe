//! CUDA arrays: `cuArrayCreate*`, `cuArray3DCreate*`, `cuMipmappedArrayCreate` and their destroys.
//! Charged at an estimate, then trued up to the driver's stated or measured size. Surfaces' memory only.
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_uint, c_void};

use vgpu_ledger::Kind;

use super::common::{hook, interposer, measured, Interposer, Target, MODULE_CEILING};
use crate::driver::Driver;
use crate::error::Error;
use crate::ffi::*;
use crate::real_symbols::forward;
use crate::virt;

impl<D: Driver> Interposer<'_, D> {
    /// Creates an array charged at `estimate`, then trued up. `mipmapped` picks the driver's
    /// requirement query and destroy for an undo.
    pub(crate) fn array_create(
        &self,
        handle: *mut *mut c_void,
        estimate: u64,
        mipmapped: bool,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        if handle.is_null() {
            return call();
        }
        let tgt = self.target_current();
        let dev = tgt.1;
        // For a measurement when the driver cannot state the size (see below).
        let before = match &tgt.0 {
            Target::Charge(q) => Some((self.device_free(), q.used())),
            _ => None,
        };
        let arrays = &self.rec.arrays;
        // SAFETY: non-null, written by the driver.
        let r = self.charged_call(
            arrays,
            Kind::Array,
            estimate,
            tgt,
            call,
            || unsafe { *handle } as u64,
        );
        if r != CUDA_SUCCESS {
            return r;
        }
        // SAFETY: as above.
        let h = unsafe { *handle } as usize;
        // The real driver states an array's size only for deferred-mapping arrays; otherwise the device's
        // free memory before and after tells (net of the ledger's other activity, our estimate included),
        // and the larger of measurement and estimate stays charged.
        let actual = self.drv.array_requirements(h, dev, mipmapped).or_else(|| {
            match (before, self.quota_of(dev)) {
                (Some((Some(b), lb)), Some(q)) => {
                    let a = self.device_free()?;
                    let others = q.used() as i128 - lb as i128 - estimate as i128;
                    Some(measured(b as i128 - a as i128, others, MODULE_CEILING).max(estimate))
                }
                _ => None,
            }
        });
        if let Some(actual) = actual {
            if !self.true_up(arrays, h as u64, actual) {
                self.undo(arrays, h as u64, || self.drv.array_destroy(h, mipmapped));
                return Error::OutOfMemory.cuda();
            }
        }
        r
    }

    /// The current device's free memory, for measurements.
    pub(crate) fn device_free(&self) -> Option<u64> {
        self.drv.mem_info().map(|(f, _)| f)
    }
}

/// Layers: layered arrays keep them in depth, cubemaps have 6 faces (times layers).
fn layers_depth(depth: u64, flags: c_uint) -> u64 {
    const LAYERED: c_uint = 0x01;
    const CUBEMAP: c_uint = 0x04;
    let d = depth.max(1);
    if flags & CUBEMAP != 0 && flags & LAYERED == 0 {
        6
    } else {
        d
    }
}

/// Sparse and deferred-mapping arrays have no memory of their own until mapped (VMM charges that).
fn unbacked(flags: c_uint) -> bool {
    const SPARSE: c_uint = 0x40;
    const DEFERRED: c_uint = 0x80;
    flags & (SPARSE | DEFERRED) != 0
}

fn estimate_2d(width: u64, height: u64, format: c_uint, channels: c_uint) -> u64 {
    virt::array_estimate(width, height, 1, format, channels, 1)
}

fn estimate_3d(
    width: u64,
    height: u64,
    depth: u64,
    flags: c_uint,
    format: c_uint,
    channels: c_uint,
    levels: c_uint,
) -> u64 {
    virt::array_estimate(
        width,
        height,
        layers_depth(depth, flags),
        format,
        channels,
        levels,
    )
}

hook!(cuArrayCreate_v2(handle: *mut CUarray, d: *const CUDA_ARRAY_DESCRIPTOR) {
    let call = || forward!("cuArrayCreate_v2", fn(*mut CUarray, *const CUDA_ARRAY_DESCRIPTOR), handle, d);
    if d.is_null() { return call(); }
    // SAFETY: non-null descriptor owned by the caller.
    let d = unsafe { *d };
    interposer().array_create(handle, estimate_2d(d.width as u64, d.height as u64, d.format, d.num_channels), false, call)
});

hook!(cuArrayCreate(handle: *mut CUarray, d: *const CUDA_ARRAY_DESCRIPTOR_v1) {
    let call = || forward!("cuArrayCreate", fn(*mut CUarray, *const CUDA_ARRAY_DESCRIPTOR_v1), handle, d);
    if d.is_null() { return call(); }
    // SAFETY: as above.
    let d = unsafe { *d };
    interposer().array_create(handle, estimate_2d(d.width as u64, d.height as u64, d.format, d.num_channels), false, call)
});

hook!(cuArray3DCreate_v2(handle: *mut CUarray, d: *const CUDA_ARRAY3D_DESCRIPTOR) {
    let call = || forward!("cuArray3DCreate_v2", fn(*mut CUarray, *const CUDA_ARRAY3D_DESCRIPTOR), handle, d);
    if d.is_null() { return call(); }
    // SAFETY: as above.
    let d = unsafe { *d };
    if unbacked(d.flags) { return call(); }
    interposer().array_create(handle, estimate_3d(d.width as u64, d.height as u64, d.depth as u64, d.flags, d.format, d.num_channels, 1), false, call)
});

hook!(cuArray3DCreate(handle: *mut CUarray, d: *const CUDA_ARRAY3D_DESCRIPTOR_v1) {
    let call = || forward!("cuArray3DCreate", fn(*mut CUarray, *const CUDA_ARRAY3D_DESCRIPTOR_v1), handle, d);
    if d.is_null() { return call(); }
    // SAFETY: as above.
    let d = unsafe { *d };
    if unbacked(d.flags) { return call(); }
    interposer().array_create(handle, estimate_3d(d.width as u64, d.height as u64, d.depth as u64, d.flags, d.format, d.num_channels, 1), false, call)
});

hook!(cuMipmappedArrayCreate(handle: *mut CUmipmappedArray, d: *const CUDA_ARRAY3D_DESCRIPTOR, levels: c_uint) {
    let call = || forward!("cuMipmappedArrayCreate", fn(*mut CUmipmappedArray, *const CUDA_ARRAY3D_DESCRIPTOR, c_uint), handle, d, levels);
    if d.is_null() { return call(); }
    // SAFETY: as above.
    let d = unsafe { *d };
    if unbacked(d.flags) { return call(); }
    interposer().array_create(handle, estimate_3d(d.width as u64, d.height as u64, d.depth as u64, d.flags, d.format, d.num_channels, levels), true, call)
});

// A destroyed array's tiles mapped onto VMM memory (`hooks/vmm/holders`) give their references back.
hook!(cuArrayDestroy(a: CUarray) {
    let e = interposer();
    let r = e.tracked_free(&e.rec.arrays, a as u64, || forward!("cuArrayDestroy", fn(CUarray), a));
    if r == CUDA_SUCCESS {
        e.array_gone(a as u64);
    }
    r
});

hook!(cuMipmappedArrayDestroy(a: CUmipmappedArray) {
    let e = interposer();
    let r = e.tracked_free(&e.rec.arrays, a as u64, || forward!("cuMipmappedArrayDestroy", fn(CUmipmappedArray), a));
    if r == CUDA_SUCCESS {
        e.array_gone(a as u64);
    }
    r
});

#[cfg(test)]
mod tests {
    use super::super::testing::World;
    use super::*;

    #[test]
    fn cubemaps_have_six_faces_and_sparse_arrays_no_memory() {
        assert_eq!(layers_depth(0, 0), 1);
        assert_eq!(layers_depth(7, 0x01), 7);
        assert_eq!(layers_depth(0, 0x04), 6);
        assert!(unbacked(0x40) && unbacked(0x80) && !unbacked(0x01));
    }

    /// Runs `array_create` with a driver that writes handle `h` and, if `grow`, takes `grow` bytes.
    fn create(w: &World, h: usize, estimate: u64, grow: i64, mipmapped: bool) -> CUresult {
        let mut out: *mut c_void = std::ptr::null_mut();
        let slot: *mut *mut c_void = &mut out;
        w.interposer().array_create(slot, estimate, mipmapped, || {
            // SAFETY: `slot` points at the local `out`.
            unsafe { *slot = h as *mut c_void };
            w.fake.grow(grow);
            CUDA_SUCCESS
        })
    }

    #[test]
    fn the_size_the_driver_states_wins_over_the_estimate() {
        let w = World::new(1 << 20);
        w.fake.array_sizes.borrow_mut().insert(0xa0, 8192);
        assert_eq!(create(&w, 0xa0, 1000, 8192, false), CUDA_SUCCESS);
        assert_eq!(w.usage(Kind::Array), 8192);
    }

    #[test]
    fn without_a_stated_size_the_measured_growth_counts_but_never_below_the_estimate() {
        let w = World::new(1 << 20);
        assert_eq!(create(&w, 0xb0, 1000, 3000, false), CUDA_SUCCESS);
        assert_eq!(w.usage(Kind::Array), 3000);
        assert_eq!(create(&w, 0xb1, 1000, 10, false), CUDA_SUCCESS);
        assert_eq!(
            w.usage(Kind::Array),
            4000,
            "a measurement below the estimate keeps the estimate"
        );
    }

    #[test]
    fn an_array_larger_than_the_quota_once_measured_is_destroyed_and_refused() {
        let w = World::new(5000);
        w.fake.array_sizes.borrow_mut().insert(0xc0, 9000);
        assert_eq!(create(&w, 0xc0, 1000, 9000, true), CUDA_ERROR_OUT_OF_MEMORY);
        assert_eq!(w.used(), 0);
        assert!(w.fake.called("array_destroy 0xc0 true"));
        assert!(w.rec.arrays.keys().is_empty());
    }

    #[test]
    fn destroy_refunds_the_trued_up_size() {
        let w = World::new(1 << 20);
        w.fake.array_sizes.borrow_mut().insert(0xd0, 4096);
        create(&w, 0xd0, 100, 4096, false);
        let e = w.interposer();
        assert_eq!(
            e.tracked_free(&w.rec.arrays, 0xd0, || CUDA_SUCCESS),
            CUDA_SUCCESS
        );
        assert_eq!(w.used(), 0);
    }
}
