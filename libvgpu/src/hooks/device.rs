//! CUDA start and the device's memory as the application sees it: `cuInit`, `cuMemGetInfo`,
//! `cuDeviceTotalMem`. The arithmetic of the view is `virt`'s; allocations live in the other families.
#![allow(clippy::missing_safety_doc)]

use std::ffi::c_uint;

use vgpu_ledger::MemoryMode;

use super::common::{hook, interposer, Interposer, Target};
use crate::driver::Driver;
use crate::error::Error;
use crate::ffi::*;
use crate::real_symbols::forward;
use crate::{devices, settings, virt};

impl<D: Driver> Interposer<'_, D> {
    /// cuMemGetInfo: the driver's (free, total) for the current device -> what the caller is told.
    pub(crate) fn mem_info_view(&self, free: u64, total: u64) -> Result<(u64, u64), Error> {
        match self.target_current().0 {
            Target::Charge(q) => {
                self.reconcile_dirty_pools();
                self.reconcile_stack();
                self.reconcile_truth();
                Ok(match q.memory {
                    MemoryMode::Oversubscribe { reserve } => {
                        virt::oversubscribed_mem_info(q.limit(), q.used(), reserve)
                    }
                    _ => virt::mem_info(q.limit(), q.used(), free, total),
                })
            }
            Target::Forward => Ok((free, total)),
            Target::Fail(e) => Err(e),
        }
    }

    /// cuDeviceTotalMem: the driver's total of `dev` -> the quota, never more than the device has.
    pub(crate) fn total_mem_view(&self, dev: CUdevice, total: u64) -> Result<u64, Error> {
        if self.drv.unlimited() {
            return Ok(total);
        }
        match self.target(Some(dev)) {
            Target::Charge(q) if q.memory.is_oversubscribe() => Ok(q.limit()),
            Target::Charge(q) => Ok(virt::total_mem(q.limit(), total)),
            Target::Forward => Ok(total),
            Target::Fail(e) => Err(e),
        }
    }
}

hook!(cuInit(flags: c_uint) {
    if settings::config().is_err() {
        return Error::Refused.cuda();
    }
    let r = forward!("cuInit", fn(c_uint), flags);
    if r != CUDA_SUCCESS || settings::unlimited() {
        return r;
    }
    // A limit that cannot be enforced (unreadable ledger, unknown UUID) fails CUDA's start here.
    match devices::resolve_all(settings::config) {
        Ok(()) => CUDA_SUCCESS,
        Err(e) => e.cuda(),
    }
});

fn mem_get_info(free: *mut u64, total: *mut u64) -> CUresult {
    if free.is_null() || total.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let (mut f, mut t) = (0usize, 0usize);
    let r = forward!(
        "cuMemGetInfo_v2",
        fn(*mut usize, *mut usize),
        &mut f,
        &mut t
    );
    if r != CUDA_SUCCESS {
        return r;
    }
    match interposer().mem_info_view(f as u64, t as u64) {
        Ok((f, t)) => {
            // SAFETY: both checked non-null above; the caller owns them.
            unsafe {
                *free = f;
                *total = t;
            }
            r
        }
        Err(e) => e.cuda(),
    }
}

hook!(cuMemGetInfo_v2(free: *mut usize, total: *mut usize) {
    mem_get_info(free.cast(), total.cast())
});

hook!(cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) {
    if free.is_null() || total.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let (mut f, mut t) = (0u64, 0u64);
    let r = mem_get_info(&mut f, &mut t);
    if r == CUDA_SUCCESS {
        // SAFETY: checked non-null; the 32-bit API saturates.
        unsafe {
            *free = f.min(u32::MAX as u64) as c_uint;
            *total = t.min(u32::MAX as u64) as c_uint;
        }
    }
    r
});

fn total_mem(bytes: *mut u64, dev: CUdevice) -> CUresult {
    if bytes.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let mut t: usize = 0;
    let r = forward!("cuDeviceTotalMem_v2", fn(*mut usize, CUdevice), &mut t, dev);
    if r != CUDA_SUCCESS {
        return r;
    }
    match interposer().total_mem_view(dev, t as u64) {
        Ok(t) => {
            // SAFETY: checked non-null.
            unsafe { *bytes = t };
            r
        }
        Err(e) => e.cuda(),
    }
}

hook!(cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) { total_mem(bytes.cast(), dev) });

hook!(cuDeviceTotalMem(bytes: *mut c_uint, dev: CUdevice) {
    if bytes.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let mut t = 0u64;
    let r = total_mem(&mut t, dev);
    // SAFETY: checked non-null.
    if r == CUDA_SUCCESS { unsafe { *bytes = t.min(u32::MAX as u64) as c_uint } }
    r
});

#[cfg(test)]
mod tests {
    use super::super::testing::World;
    use super::*;
    use crate::settings::Applies;
    use vgpu_ledger::Kind;

    #[test]
    fn the_quota_is_the_size_and_usage_comes_off_free() {
        let w = World::new(1000);
        let e = w.interposer();
        assert_eq!(e.mem_info_view(5000, 8000), Ok((1000, 1000)));
        assert!(w.q.charge(Kind::Data, 300));
        assert_eq!(e.mem_info_view(5000, 8000), Ok((700, 1000)));
        // the device's own free memory still bounds what is free
        assert_eq!(e.mem_info_view(200, 8000), Ok((200, 1000)));
        assert_eq!(e.total_mem_view(0, 8000), Ok(1000));
        assert_eq!(
            e.total_mem_view(0, 500),
            Ok(500),
            "never more than the device has"
        );
    }

    #[test]
    fn devices_without_a_quota_and_broken_ones() {
        let w = World::new(1000);
        let e = w.interposer();
        assert_eq!(e.total_mem_view(1, 8000), Ok(8000), "device 1 has no quota");
        w.fake
            .quotas
            .borrow_mut()
            .insert(1, Err(Error::Unenforceable));
        assert_eq!(e.total_mem_view(1, 8000), Err(Error::Unenforceable));
        w.fake.set_applies(Applies::Broken);
        assert_eq!(e.mem_info_view(5, 8), Err(Error::Refused));
        w.fake.set_applies(Applies::Nowhere);
        assert_eq!(e.mem_info_view(5, 8), Ok((5, 8)));
        assert_eq!(e.total_mem_view(1, 8000), Ok(8000));
    }
}
