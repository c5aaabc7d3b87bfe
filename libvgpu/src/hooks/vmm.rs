//! Virtual memory management: physical allocations made with `cuMemCreate`, charged to the device named
//! in their properties (not to a context) until the driver really frees them: when the handle, every
//! retained reference and every mapping are gone. Address reservations cost no device memory.
#![allow(clippy::missing_safety_doc)]

use std::ffi::c_void;

use vgpu_ledger::Kind;

use super::common::{hook, interposer, Interposer};
use crate::driver::Driver;
use crate::error::Error;
use crate::ffi::*;
use crate::real_symbols::forward;
use crate::records::VmmRec;
use crate::settings::Applies;

mod shared;
pub use shared::*;

impl<D: Driver> Interposer<'_, D> {
    /// cuMemCreate of `bytes` at a location of type `location_type` (`dev` for device memory).
    pub(crate) fn vmm_create(
        &self,
        bytes: u64,
        location_type: i32,
        dev: CUdevice,
        call: impl FnOnce() -> CUresult,
        key: impl FnOnce() -> u64,
    ) -> CUresult {
        if location_type != CU_MEM_LOCATION_TYPE_DEVICE {
            return call(); // host / NUMA memory: not a device quota
        }
        match self.drv.applies() {
            Applies::Nowhere => return call(),
            Applies::Broken => return Error::Refused.cuda(),
            Applies::Somewhere => {}
        }
        // VMM memory belongs to the device, not to a context: it outlives a context's destruction.
        let tgt = (self.target(Some(dev)), dev, 0);
        self.charged(&self.rec.vmm, Kind::Vmm, bytes, tgt, call, key, VmmRec::new)
    }

    /// One more driver reference to `handle` (a mapping or a retain), if it is ours.
    pub(crate) fn vmm_ref(&self, handle: u64) {
        self.rec.vmm.with(handle, |v| {
            if let Some(v) = v {
                v.refs = v.refs.saturating_add(1);
            }
        });
    }

    /// One driver reference to `handle` fewer; the last one gives the charge back (an import of this
    /// process's own export gives back its reference on the exported handle's record instead).
    pub(crate) fn vmm_unref(&self, handle: u64) {
        let gone = self.rec.vmm.with(handle, |v| match v {
            Some(v) => {
                v.refs = v.refs.saturating_sub(1);
                v.refs == 0
            }
            None => false,
        });
        if !gone {
            return;
        }
        let Some(v) = self.rec.vmm.remove(handle) else {
            return;
        };
        self.release(&v.rec);
        if v.of != 0 {
            self.vmm_unref(v.of);
        } else {
            self.rec.vmm_exports.drain_where(|&(_, h)| h == handle);
        }
    }

    /// cuMemRelease: drops the handle's own reference (mappings may keep the memory alive).
    pub(crate) fn vmm_release(&self, handle: u64, call: impl FnOnce() -> CUresult) -> CUresult {
        let r = call();
        if r == CUDA_SUCCESS && !self.drv.unlimited() {
            self.vmm_unref(handle);
        }
        r
    }

    /// cuMemRetainAllocationHandle: `read` gives the handle the driver wrote.
    pub(crate) fn vmm_retain(
        &self,
        call: impl FnOnce() -> CUresult,
        read: impl FnOnce() -> u64,
    ) -> CUresult {
        let r = call();
        if r == CUDA_SUCCESS && !self.drv.unlimited() {
            self.vmm_ref(read());
        }
        r
    }

    /// cuMemMap of `size` bytes of `handle` at `ptr`: the mapping holds a reference. A handle imported
    /// from another process is charged what is mapped of it, before the driver maps it.
    pub(crate) fn vmm_map(
        &self,
        ptr: u64,
        size: u64,
        handle: u64,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        if self.drv.unlimited() {
            return call();
        }
        let charged = match self.vmm_map_import(handle, size) {
            Ok(c) => c,
            Err(r) => return r,
        };
        let r = call();
        if r != CUDA_SUCCESS {
            self.vmm_map_failed(handle, charged);
        } else if self.rec.vmm.with(handle, |v| v.is_some()) {
            self.vmm_ref(handle);
            self.rec.vmm_maps.insert(ptr, (ptr, handle));
        }
        r
    }

    /// cuMemUnmap of `[ptr, ptr + size)`: every mapping starting there drops its reference.
    pub(crate) fn vmm_unmap(
        &self,
        ptr: u64,
        size: u64,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let r = call();
        if r == CUDA_SUCCESS && !self.drv.unlimited() {
            let end = ptr.saturating_add(size);
            for (_, (_, handle)) in self.rec.vmm_maps.drain_where(|&(p, _)| p >= ptr && p < end) {
                self.vmm_unref(handle);
            }
        }
        r
    }
}

hook!(cuMemCreate(handle: *mut CUmemGenericAllocationHandle, bytes: usize, prop: *const CUmemAllocationPropHead, flags: u64) {
    let call = || forward!("cuMemCreate", fn(*mut CUmemGenericAllocationHandle, usize, *const CUmemAllocationPropHead, u64), handle, bytes, prop, flags);
    let e = interposer();
    if handle.is_null() || prop.is_null() || e.drv.unlimited() {
        return call();
    }
    // SAFETY: non-null, owned by the caller; only the location is read.
    let (lt, dev) = unsafe { ((*prop).location_type, (*prop).location_id) };
    // SAFETY: non-null, written by the driver.
    e.vmm_create(bytes as u64, lt, dev, call, || unsafe { *handle })
});

hook!(cuMemRelease(handle: CUmemGenericAllocationHandle) {
    interposer().vmm_release(handle, || forward!("cuMemRelease", fn(CUmemGenericAllocationHandle), handle))
});

hook!(cuMemRetainAllocationHandle(handle: *mut CUmemGenericAllocationHandle, addr: *mut c_void) {
    let call = || forward!("cuMemRetainAllocationHandle", fn(*mut CUmemGenericAllocationHandle, *mut c_void), handle, addr);
    if handle.is_null() {
        return call();
    }
    // SAFETY: non-null, written by the driver when it succeeded (read only then).
    interposer().vmm_retain(call, || unsafe { *handle })
});

hook!(cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: u64) {
    interposer().vmm_map(ptr, size as u64, handle, || forward!("cuMemMap", fn(CUdeviceptr, usize, usize, CUmemGenericAllocationHandle, u64), ptr, size, offset, handle, flags))
});

hook!(cuMemUnmap(ptr: CUdeviceptr, size: usize) {
    interposer().vmm_unmap(ptr, size as u64, || forward!("cuMemUnmap", fn(CUdeviceptr, usize), ptr, size))
});

#[cfg(test)]
mod tests {
    use super::super::testing::World;
    use super::*;

    const H: u64 = 0x11;

    fn create(w: &World, bytes: u64, handle: u64) -> CUresult {
        w.interposer().vmm_create(
            bytes,
            CU_MEM_LOCATION_TYPE_DEVICE,
            0,
            || CUDA_SUCCESS,
            || handle,
        )
    }

    #[test]
    fn device_memory_is_charged_to_its_device_without_a_context() {
        let w = World::new(1000);
        w.fake.set_current(0);
        assert_eq!(create(&w, 600, H), CUDA_SUCCESS);
        assert_eq!(w.usage(Kind::Vmm), 600);
        assert_eq!(w.rec.vmm.with(H, |r| r.map(|r| r.rec.ctx)), Some(0));
        assert_eq!(create(&w, 600, H + 1), CUDA_ERROR_OUT_OF_MEMORY);
        assert_eq!(w.interposer().vmm_release(H, || CUDA_SUCCESS), CUDA_SUCCESS);
        assert_eq!(w.used(), 0);
    }

    #[test]
    fn host_memory_is_nobodys_quota() {
        let w = World::new(1000);
        let e = w.interposer();
        assert_eq!(e.vmm_create(1 << 30, 2, 0, || 0, || 0x13), CUDA_SUCCESS);
        assert_eq!(w.used(), 0);
        assert!(w.rec.vmm.keys().is_empty());
    }

    #[test]
    fn released_while_mapped_stays_charged_until_unmapped() {
        let w = World::new(1000);
        let e = w.interposer();
        create(&w, 600, H);
        e.vmm_map(0x7000_0000, 600, H, || CUDA_SUCCESS);
        e.vmm_release(H, || CUDA_SUCCESS);
        assert_eq!(w.used(), 600, "the mapping keeps the memory");
        e.vmm_unmap(0x7000_0000, 600, || CUDA_SUCCESS);
        assert_eq!(w.used(), 0);
    }

    #[test]
    fn a_retained_reference_released_again_changes_nothing() {
        let w = World::new(1000);
        let e = w.interposer();
        create(&w, 600, H);
        e.vmm_map(0x7000_0000, 600, H, || CUDA_SUCCESS);
        e.vmm_retain(|| CUDA_SUCCESS, || H);
        e.vmm_release(H, || CUDA_SUCCESS);
        assert_eq!(w.used(), 600);
        // the original handle and the mapping still count
        e.vmm_release(H, || CUDA_SUCCESS);
        assert_eq!(w.used(), 600);
        e.vmm_unmap(0x7000_0000, 600, || CUDA_SUCCESS);
        assert_eq!(w.used(), 0);
    }

    #[test]
    fn one_unmap_over_several_mappings_drops_each_and_failures_change_nothing() {
        let w = World::new(1000);
        let e = w.interposer();
        create(&w, 200, H);
        create(&w, 300, H + 1);
        e.vmm_map(0x1000, 600, H, || CUDA_SUCCESS);
        e.vmm_map(0x2000, 600, H + 1, || CUDA_SUCCESS);
        e.vmm_release(H, || CUDA_SUCCESS);
        e.vmm_release(H + 1, || CUDA_SUCCESS);
        assert_eq!(
            e.vmm_unmap(0x1000, 0x2000, || CUDA_ERROR_INVALID_VALUE),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(w.used(), 500);
        e.vmm_unmap(0x1000, 0x2000, || CUDA_SUCCESS);
        assert_eq!(w.used(), 0);
        assert!(w.rec.vmm.keys().is_empty() && w.rec.vmm_maps.keys().is_empty());
    }

    #[test]
    fn handles_that_are_not_ours_are_left_alone() {
        let w = World::new(1000);
        let e = w.interposer();
        // an imported (IPC) handle mapped here is another process's memory
        e.vmm_map(0x3000, 600, 0x99, || CUDA_SUCCESS);
        e.vmm_unmap(0x3000, 0x100, || CUDA_SUCCESS);
        e.vmm_release(0x99, || CUDA_SUCCESS);
        assert_eq!(w.used(), 0);
        assert!(w.rec.vmm_maps.keys().is_empty());
    }
}
