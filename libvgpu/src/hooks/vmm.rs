//! Virtual memory management: physical allocations made with `cuMemCreate`, charged to the device named
//! in their properties (not to a context) until the driver really frees them: when the handle, every
//! retained reference, every mapping, every sparse-array tile and multicast binding (`holders`) are gone —
//! and never while it may be kept by an export (`shared`): a release that cannot be proven to free memory
//! does not refund it. Address reservations cost no device memory.
#![allow(clippy::missing_safety_doc)]

use std::ffi::c_void;

use vgpu_ledger::Kind;

use super::common::{hook, interposer, Interposer};
use crate::driver::Driver;
use crate::error::Error;
use crate::ffi::*;
use crate::real_symbols::forward;
use crate::records::{VmmMap, VmmRec};
use crate::settings::Applies;

mod holders;
mod shared;
pub use holders::*;
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

    /// One more driver reference to `handle` (a mapping, a retain, a tile or a binding), if it is ours:
    /// whether it is. Taken before the driver call that makes the reference, so that a release racing it
    /// can never see the last reference go while the driver is taking a new one.
    pub(crate) fn vmm_ref(&self, handle: u64) -> bool {
        self.rec.vmm.with(handle, |v| match v {
            Some(v) => {
                v.refs = v.refs.saturating_add(1);
                true
            }
            None => false,
        })
    }

    /// One driver reference to `handle` fewer. The last one gives the charge back, unless the handle was
    /// exported (`VmmRec::kept`: a descriptor or an import elsewhere may keep the memory, so it stays
    /// charged until the process ends); a multicast object's last one drops what was bound to it; an
    /// import of this process's own export gives back its reference on the exported handle's record.
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
        self.rec.vmm_spans.remove(handle);
        if v.multicast {
            let binds = self.rec.mc_binds.remove(handle).unwrap_or_default();
            // A multicast object that was exported may live on in another process, and its bindings
            // with it: their references are never given back here.
            if !v.kept() {
                for b in binds {
                    self.vmm_unref(b.handle);
                }
            }
        }
        if !v.kept() {
            if v.rec.bytes > 0 {
                self.release(&v.rec);
            }
        } else if v.rec.bytes > 0 {
            crate::log::info(format_args!(
                "quota: VMM handle {handle:#x} ({} bytes on device {}) released, but it was exported: a \
                 descriptor or an import in another process may keep its memory, so it stays charged \
                 until this process ends",
                v.rec.bytes, v.rec.dev
            ));
        }
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

    /// The mapping of ours that holds address `addr`, if any.
    pub(crate) fn vmm_mapping_at(&self, addr: u64) -> Option<VmmMap> {
        self.rec
            .vmm_maps
            .find(|m| addr >= m.ptr && addr - m.ptr < m.size)
    }

    /// cuMemRetainAllocationHandle of the memory mapped at `addr`: `read` gives the handle the driver
    /// wrote. The reference is taken before the call, on the handle mapped there.
    pub(crate) fn vmm_retain(
        &self,
        addr: u64,
        call: impl FnOnce() -> CUresult,
        read: impl FnOnce() -> u64,
    ) -> CUresult {
        if self.drv.unlimited() {
            return call();
        }
        let before = self
            .vmm_mapping_at(addr)
            .map(|m| m.handle)
            .filter(|&h| self.vmm_ref(h));
        let r = call();
        let got = (r == CUDA_SUCCESS).then(read);
        if got != before {
            if let Some(h) = before {
                self.vmm_unref(h);
            }
            if let Some(h) = got {
                self.vmm_ref(h);
            }
        }
        r
    }

    /// cuMemMap of `size` bytes of `handle` from its `offset`, at `ptr`: the mapping holds a reference. A
    /// handle imported from another process is charged what this adds to the union of what is mapped of
    /// it, before the driver maps it.
    pub(crate) fn vmm_map(
        &self,
        ptr: u64,
        size: u64,
        offset: u64,
        handle: u64,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        if self.drv.unlimited() {
            return call();
        }
        let (r, held) = self.held_by(handle, offset, size, call);
        if held {
            let m = VmmMap {
                ptr,
                handle,
                size,
                offset,
            };
            self.rec.vmm_maps.insert(ptr, m);
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
            for (_, m) in self
                .rec
                .vmm_maps
                .drain_where(|m| m.ptr >= ptr && m.ptr < end)
            {
                self.vmm_unref(m.handle);
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
    interposer().vmm_retain(addr as u64, call, || unsafe { *handle })
});

hook!(cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: u64) {
    interposer().vmm_map(ptr, size as u64, offset as u64, handle, || forward!("cuMemMap", fn(CUdeviceptr, usize, usize, CUmemGenericAllocationHandle, u64), ptr, size, offset, handle, flags))
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
        e.vmm_map(0x7000_0000, 600, 0, H, || CUDA_SUCCESS);
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
        e.vmm_map(0x7000_0000, 600, 0, H, || CUDA_SUCCESS);
        e.vmm_retain(0x7000_0000, || CUDA_SUCCESS, || H);
        e.vmm_release(H, || CUDA_SUCCESS);
        assert_eq!(w.used(), 600);
        // the original handle and the mapping still count
        e.vmm_release(H, || CUDA_SUCCESS);
        assert_eq!(w.used(), 600);
        e.vmm_unmap(0x7000_0000, 600, || CUDA_SUCCESS);
        assert_eq!(w.used(), 0);
    }

    // A release racing a mapping or a retain of the same handle (another thread's, between the driver's
    // answer and the library's record of it) saw the last reference go and refunded mapped memory: the
    // reference is now counted before the driver call.
    #[test]
    fn a_release_racing_a_map_or_a_retain_never_refunds_mapped_memory() {
        let w = World::new(1000);
        let e = w.interposer();
        create(&w, 600, H);
        let r = e.vmm_map(0x7000_0000, 600, 0, H, || e.vmm_release(H, || CUDA_SUCCESS));
        assert_eq!((r, w.used()), (CUDA_SUCCESS, 600), "mapped: kept");
        let r = e.vmm_retain(
            0x7000_0000,
            || e.vmm_unmap(0x7000_0000, 600, || CUDA_SUCCESS),
            || H,
        );
        assert_eq!((r, w.used()), (CUDA_SUCCESS, 600), "retained: kept");
        e.vmm_release(H, || CUDA_SUCCESS);
        assert_eq!(w.used(), 0);
        // a failed map or retain gives its reference back
        create(&w, 600, H);
        e.vmm_map(0x7000_0000, 600, 0, H, || CUDA_SUCCESS);
        e.vmm_retain(0x7000_0000, || 1, || H);
        e.vmm_map(0x8000_0000, 600, 0, H, || 1);
        e.vmm_release(H, || CUDA_SUCCESS);
        e.vmm_unmap(0x7000_0000, 600, || CUDA_SUCCESS);
        assert_eq!(w.used(), 0);
    }

    #[test]
    fn one_unmap_over_several_mappings_drops_each_and_failures_change_nothing() {
        let w = World::new(1000);
        let e = w.interposer();
        create(&w, 200, H);
        create(&w, 300, H + 1);
        e.vmm_map(0x1000, 600, 0, H, || CUDA_SUCCESS);
        e.vmm_map(0x2000, 600, 0, H + 1, || CUDA_SUCCESS);
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
        e.vmm_map(0x3000, 600, 0, 0x99, || CUDA_SUCCESS);
        e.vmm_unmap(0x3000, 0x100, || CUDA_SUCCESS);
        e.vmm_release(0x99, || CUDA_SUCCESS);
        assert_eq!(w.used(), 0);
        assert!(w.rec.vmm_maps.keys().is_empty());
    }
}
