//! Virtual memory management: physical allocations made with `cuMemCreate`, given back by `cuMemRelease`.
//! Charged to the device named in the allocation's properties, not to a context. Mapping is not charged.
#![allow(clippy::missing_safety_doc)]

use vgpu_ledger::Kind;

use super::{engine, hook, Engine};
use crate::driver::Driver;
use crate::error::Error;
use crate::ffi::*;
use crate::real::forward;
use crate::settings::Applies;

impl<D: Driver> Engine<'_, D> {
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
        self.charged_call(&self.rec.vmm, Kind::Vmm, bytes, tgt, call, key)
    }
}

hook!(cuMemCreate(handle: *mut CUmemGenericAllocationHandle, bytes: usize, prop: *const CUmemAllocationPropHead, flags: u64) {
    let call = || forward!("cuMemCreate", fn(*mut CUmemGenericAllocationHandle, usize, *const CUmemAllocationPropHead, u64), handle, bytes, prop, flags);
    let e = engine();
    if handle.is_null() || prop.is_null() || e.drv.unlimited() {
        return call();
    }
    // SAFETY: non-null, owned by the caller; only the location is read.
    let (lt, dev) = unsafe { ((*prop).location_type, (*prop).location_id) };
    // SAFETY: non-null, written by the driver.
    e.vmm_create(bytes as u64, lt, dev, call, || unsafe { *handle })
});

hook!(cuMemRelease(handle: CUmemGenericAllocationHandle) {
    let e = engine();
    e.tracked_free(&e.rec.vmm, handle, || forward!("cuMemRelease", fn(CUmemGenericAllocationHandle), handle))
});

#[cfg(test)]
mod tests {
    use super::super::testing::World;
    use super::*;

    #[test]
    fn device_memory_is_charged_to_its_device_without_a_context() {
        let w = World::new(1000);
        w.fake.set_current(0);
        let e = w.engine();
        assert_eq!(
            e.vmm_create(600, CU_MEM_LOCATION_TYPE_DEVICE, 0, || 0, || 0x11),
            CUDA_SUCCESS
        );
        assert_eq!(w.usage(Kind::Vmm), 600);
        assert_eq!(w.rec.vmm.with(0x11, |r| r.map(|r| r.ctx)), Some(0));
        assert_eq!(
            e.vmm_create(600, CU_MEM_LOCATION_TYPE_DEVICE, 0, || 0, || 0x12),
            CUDA_ERROR_OUT_OF_MEMORY
        );
        assert_eq!(e.tracked_free(&w.rec.vmm, 0x11, || 0), CUDA_SUCCESS);
        assert_eq!(w.used(), 0);
    }

    #[test]
    fn host_memory_is_nobodys_quota() {
        let w = World::new(1000);
        let e = w.engine();
        assert_eq!(e.vmm_create(1 << 30, 2, 0, || 0, || 0x13), CUDA_SUCCESS);
        assert_eq!(w.used(), 0);
        assert!(w.rec.vmm.keys().is_empty());
    }
}
