//! Where managed memory may go: `cuMemAdvise[_v2]`, `cuMemPrefetchAsync[_v2][_ptsz]`,
//! `cuMemPrefetchBatchAsync[_ptsz]` and `cuMemDiscardAndPrefetchBatchAsync[_ptsz]`. Each can put managed
//! memory onto a device with no allocation call, so under a limit a device location is admitted only for
//! memory that device's quota already holds:
//! * memory the library spilled (charged to the spill budget) is moved into the target device's quota
//!   first — refused with out-of-memory when it does not fit;
//! * the application's own managed memory (charged to its device at `cuMemAllocManaged`) may go to that
//!   device only (another device with a quota: `CUDA_ERROR_INVALID_DEVICE`);
//! * memory the library never charged (pageable memory on a node with HMM or ATS, a module's managed
//!   variables) is refused a device with a quota (`CUDA_ERROR_INVALID_VALUE`), with one log line.
//!
//! Advice that lets a device fault spilled pages in (read-mostly copies, unsetting the host preference)
//! counts as a device location for the allocation's device. Host locations and access advice pass.
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_int, c_uint};

use vgpu_ledger::Kind;

use super::common::{hook, interposer, Interposer, Target};
use crate::driver::Driver;
use crate::ffi::*;
use crate::log;
use crate::real_symbols::forward;
use crate::records::Rec;

/// `CUmemLocation`, passed by value by the location-based entry points.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemLocation {
    pub kind: c_int,
    pub id: c_int,
}

pub const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
const CU_MEM_ADVISE_SET_READ_MOSTLY: c_int = 1;
const CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION: c_int = 4;

/// Where a request would put memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Place {
    Device(CUdevice),
    /// The host, a NUMA node, or nothing valid (the driver answers).
    Elsewhere,
}

impl Place {
    /// A device ordinal of the legacy entry points (`CU_DEVICE_CPU` = -1: the host).
    pub(crate) fn ordinal(dev: CUdevice) -> Place {
        if dev >= 0 {
            Place::Device(dev)
        } else {
            Place::Elsewhere
        }
    }

    pub(crate) fn location(loc: CUmemLocation) -> Place {
        if loc.kind == CU_MEM_LOCATION_TYPE_DEVICE {
            Place::ordinal(loc.id)
        } else {
            Place::Elsewhere
        }
    }
}

impl<D: Driver> Interposer<'_, D> {
    /// The recorded plain or managed allocation holding `p`, by its base: `p` itself first (prefetches
    /// and advice name whole allocations), else every record is looked at.
    fn holding(&self, p: u64) -> Option<(u64, Rec)> {
        if let Some(r) = self.rec.allocs.with(p, |r| r.copied()) {
            return Some((p, r));
        }
        self.rec.allocs.keys().into_iter().find_map(|base| {
            let r = self.rec.allocs.with(base, |r| r.copied())?;
            (base <= p && p - base < r.bytes.max(1)).then_some((base, r))
        })
    }

    /// Whether the memory at `p` may be placed at `place` (`what`: the entry point, for the log line).
    /// Spilled memory is moved into the target device's quota first. Err: what the call returns instead.
    pub(crate) fn admit_placement(&self, p: u64, place: Place, what: &str) -> Result<(), CUresult> {
        let Place::Device(dev) = place else {
            return Ok(());
        };
        if self.drv.unlimited() {
            return Ok(());
        }
        let q = match self.target(Some(dev)) {
            Target::Forward => return Ok(()),
            Target::Fail(e) => return Err(e.cuda()),
            Target::Charge(q) => q,
        };
        let Some((base, r)) = self.holding(p) else {
            log::warn(format_args!(
                "{what}: 0x{p:x} is no memory this library charged (pageable memory under HMM/ATS, a \
                 module's managed variable); device {dev} has a quota: CUDA_ERROR_INVALID_VALUE"
            ));
            return Err(CUDA_ERROR_INVALID_VALUE);
        };
        if r.spilled {
            // Charged to the spill budget: into the device's quota first, or not at all.
            if !q.charge(Kind::Data, r.bytes) {
                log::warn(format_args!(
                    "{what}: 0x{base:x} ({} bytes) was spilled past the quota and does not fit device \
                     {dev}'s quota: CUDA_ERROR_OUT_OF_MEMORY",
                    r.bytes
                ));
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
            let moved = self.rec.allocs.with(base, |cur| match cur {
                Some(cur) if cur.spilled => {
                    cur.spilled = false;
                    cur.dev = dev;
                    cur.kind = Kind::Data;
                    true
                }
                _ => false,
            });
            if moved {
                if let Some(sq) = self.quota_of(r.dev) {
                    sq.refund_spill(r.bytes);
                }
                log::info(format_args!(
                    "{what}: spilled 0x{base:x} ({} bytes) moved into device {dev}'s quota",
                    r.bytes
                ));
            } else {
                q.refund(Kind::Data, r.bytes); // freed or moved meanwhile by another thread
            }
            return Ok(());
        }
        let managed = r.pool == 0 && (r.served_managed || r.kind == Kind::Managed);
        if managed && r.dev != dev {
            log::warn(format_args!(
                "{what}: managed 0x{base:x} is charged to device {}, not to device {dev} (which has a \
                 quota): CUDA_ERROR_INVALID_DEVICE",
                r.dev
            ));
            return Err(CUDA_ERROR_INVALID_DEVICE);
        }
        Ok(())
    }

    /// `cuMemAdvise`: the preferred location is a placement; read-mostly copies and dropping the host
    /// preference let the allocation's device fault spilled pages in, so for spilled memory they count
    /// as its device.
    pub(crate) fn admit_advice(
        &self,
        p: u64,
        advice: c_int,
        place: Place,
        what: &str,
    ) -> Result<(), CUresult> {
        match advice {
            CU_MEM_ADVISE_SET_PREFERRED_LOCATION => self.admit_placement(p, place, what),
            CU_MEM_ADVISE_SET_READ_MOSTLY | CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION
                if !self.drv.unlimited() =>
            {
                match self.holding(p) {
                    Some((_, r)) if r.spilled => {
                        self.admit_placement(p, Place::Device(r.dev), what)
                    }
                    _ => Ok(()),
                }
            }
            _ => Ok(()),
        }
    }

    /// A batch of prefetches: operation `i` goes to `locs[j]` for the last `j` whose `first[j] <= i`.
    /// Every device placement is admitted before the driver is asked.
    pub(crate) fn admit_batch(
        &self,
        ptrs: &[u64],
        locs: &[CUmemLocation],
        first: &[usize],
        what: &str,
    ) -> Result<(), CUresult> {
        for (i, &p) in ptrs.iter().enumerate() {
            let j = first.iter().rposition(|&f| f <= i);
            if let Some(loc) = j.and_then(|j| locs.get(j)) {
                self.admit_placement(p, Place::location(*loc), what)?;
            }
        }
        Ok(())
    }
}

/// Runs `call` if `check` admits it.
fn admitted(check: Result<(), CUresult>, call: impl FnOnce() -> CUresult) -> CUresult {
    match check {
        Ok(()) => call(),
        Err(e) => e,
    }
}

hook!(cuMemAdvise(p: CUdeviceptr, count: usize, advice: c_int, dev: CUdevice) {
    let call = || forward!("cuMemAdvise", fn(CUdeviceptr, usize, c_int, CUdevice), p, count, advice, dev);
    admitted(interposer().admit_advice(p, advice, Place::ordinal(dev), "cuMemAdvise"), call)
});

hook!(cuMemAdvise_v2(p: CUdeviceptr, count: usize, advice: c_int, loc: CUmemLocation) {
    let call = || forward!("cuMemAdvise_v2", fn(CUdeviceptr, usize, c_int, CUmemLocation), p, count, advice, loc);
    admitted(interposer().admit_advice(p, advice, Place::location(loc), "cuMemAdvise_v2"), call)
});

hook!(cuMemPrefetchAsync(p: CUdeviceptr, count: usize, dev: CUdevice, s: CUstream) {
    let call = || forward!("cuMemPrefetchAsync", fn(CUdeviceptr, usize, CUdevice, CUstream), p, count, dev, s);
    admitted(interposer().admit_placement(p, Place::ordinal(dev), "cuMemPrefetchAsync"), call)
});

hook!(cuMemPrefetchAsync_ptsz(p: CUdeviceptr, count: usize, dev: CUdevice, s: CUstream) {
    let call = || forward!("cuMemPrefetchAsync_ptsz", fn(CUdeviceptr, usize, CUdevice, CUstream), p, count, dev, s);
    admitted(interposer().admit_placement(p, Place::ordinal(dev), "cuMemPrefetchAsync_ptsz"), call)
});

hook!(cuMemPrefetchAsync_v2(p: CUdeviceptr, count: usize, loc: CUmemLocation, flags: c_uint, s: CUstream) {
    let call = || forward!("cuMemPrefetchAsync_v2", fn(CUdeviceptr, usize, CUmemLocation, c_uint, CUstream), p, count, loc, flags, s);
    admitted(interposer().admit_placement(p, Place::location(loc), "cuMemPrefetchAsync_v2"), call)
});

hook!(cuMemPrefetchAsync_v2_ptsz(p: CUdeviceptr, count: usize, loc: CUmemLocation, flags: c_uint, s: CUstream) {
    let call = || forward!("cuMemPrefetchAsync_v2_ptsz", fn(CUdeviceptr, usize, CUmemLocation, c_uint, CUstream), p, count, loc, flags, s);
    admitted(interposer().admit_placement(p, Place::location(loc), "cuMemPrefetchAsync_v2_ptsz"), call)
});

/// The batch entry points' arrays, read as slices (empty where a pointer is null).
unsafe fn batch<'a>(
    ptrs: *const CUdeviceptr,
    count: usize,
    locs: *const CUmemLocation,
    first: *const usize,
    nlocs: usize,
) -> (&'a [u64], &'a [CUmemLocation], &'a [usize]) {
    fn slice<'a, T>(p: *const T, n: usize) -> &'a [T] {
        if p.is_null() || n == 0 {
            &[]
        } else {
            // SAFETY: the caller passes `n` elements at `p` (the driver's contract for these arguments).
            unsafe { std::slice::from_raw_parts(p, n) }
        }
    }
    (slice(ptrs, count), slice(locs, nlocs), slice(first, nlocs))
}

/// Declares a batch prefetch hook (`cuMemPrefetchBatchAsync`, `cuMemDiscardAndPrefetchBatchAsync`, and
/// their `_ptsz`): every operation's location admitted, then the driver's own call.
macro_rules! batch_hook {
    ($name:ident, $sym:literal) => {
        hook!($name(ptrs: *mut CUdeviceptr, sizes: *mut usize, count: usize, locs: *mut CUmemLocation,
                    first: *mut usize, nlocs: usize, flags: u64, s: CUstream) {
            let call = || forward!(
                $sym,
                fn(*mut CUdeviceptr, *mut usize, usize, *mut CUmemLocation, *mut usize, usize, u64, CUstream),
                ptrs, sizes, count, locs, first, nlocs, flags, s
            );
            let e = interposer();
            if e.drv.unlimited() {
                return call();
            }
            // SAFETY: the arrays as the caller passed them to the driver, `count` and `nlocs` long.
            let (p, l, f) = unsafe { batch(ptrs, count, locs, first, nlocs) };
            admitted(e.admit_batch(p, l, f, $sym), call)
        });
    };
}

batch_hook!(cuMemPrefetchBatchAsync, "cuMemPrefetchBatchAsync");
batch_hook!(cuMemPrefetchBatchAsync_ptsz, "cuMemPrefetchBatchAsync_ptsz");
batch_hook!(
    cuMemDiscardAndPrefetchBatchAsync,
    "cuMemDiscardAndPrefetchBatchAsync"
);
batch_hook!(
    cuMemDiscardAndPrefetchBatchAsync_ptsz,
    "cuMemDiscardAndPrefetchBatchAsync_ptsz"
);

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use vgpu_ledger::MemoryMode;

    use super::super::testing::World;
    use super::*;
    use crate::quota::DeviceQuota;
    use crate::settings::Applies;

    const HOST: CUmemLocation = CUmemLocation { kind: 2, id: 0 };
    const DEV0: CUmemLocation = CUmemLocation { kind: 1, id: 0 };
    const DEV1: CUmemLocation = CUmemLocation { kind: 1, id: 1 };

    fn spill_world(limit: u64, budget: u64) -> World {
        World::with_memory(
            limit,
            MemoryMode::Spill {
                spill_limit: budget,
            },
        )
    }

    /// A spilled allocation of `bytes` (the quota is already full of `full` bytes of device memory).
    fn spilled(w: &World, full: u64, bytes: u64) -> u64 {
        let e = w.interposer();
        if full > 0 {
            assert_eq!(
                e.alloc_plain(full, || 0, || 0x10, |_| panic!()),
                CUDA_SUCCESS
            );
        }
        let out = Cell::new(0);
        assert_eq!(
            e.alloc_plain(bytes, || panic!(), || 0, |p| out.set(p)),
            CUDA_SUCCESS
        );
        assert!(w.rec.allocs.with(out.get(), |r| r.unwrap().spilled));
        out.get()
    }

    #[test]
    fn spilled_memory_prefetched_to_the_device_is_refused_while_the_quota_is_full() {
        let w = spill_world(1000, 4000);
        let p = spilled(&w, 900, 700);
        let e = w.interposer();
        let before = (w.used(), w.q.spilled());
        for place in [Place::Device(0), Place::location(DEV0), Place::ordinal(0)] {
            assert_eq!(
                e.admit_placement(p + 10, place, "t"),
                Err(CUDA_ERROR_OUT_OF_MEMORY)
            );
        }
        // the advice that would let the device fault it in is refused the same way
        for advice in [
            CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
            CU_MEM_ADVISE_SET_READ_MOSTLY,
        ] {
            assert_eq!(
                e.admit_advice(p, advice, Place::Device(0), "t"),
                Err(CUDA_ERROR_OUT_OF_MEMORY)
            );
        }
        assert_eq!(
            e.admit_advice(
                p,
                CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION,
                Place::Elsewhere,
                "t"
            ),
            Err(CUDA_ERROR_OUT_OF_MEMORY)
        );
        assert_eq!((w.used(), w.q.spilled()), before, "nothing moved");
        // the host, and access advice, pass
        assert_eq!(e.admit_placement(p, Place::location(HOST), "t"), Ok(()));
        assert_eq!(
            e.admit_placement(p, Place::ordinal(CU_DEVICE_CPU), "t"),
            Ok(())
        );
        assert_eq!(
            e.admit_advice(p, CU_MEM_ADVISE_SET_ACCESSED_BY, Place::Device(0), "t"),
            Ok(())
        );
        assert_eq!((w.used(), w.q.spilled()), before);
    }

    #[test]
    fn spilled_memory_moves_into_the_quota_when_it_fits_and_is_refunded_from_there() {
        let w = spill_world(1000, 4000);
        let p = spilled(&w, 900, 700);
        let e = w.interposer();
        assert_eq!(e.tracked_free(&w.rec.allocs, 0x10, || 0), CUDA_SUCCESS);
        assert_eq!((w.used(), w.q.spilled()), (0, 700));
        assert_eq!(e.admit_placement(p, Place::location(DEV0), "t"), Ok(()));
        assert_eq!(
            (w.used(), w.q.spilled()),
            (700, 0),
            "charged to the quota, not the budget"
        );
        let r = w.rec.allocs.with(p, |r| r.copied()).unwrap();
        assert!(!r.spilled && r.served_managed, "IPC of it stays refused");
        // once in the quota it may go to its device again, for free
        assert_eq!(e.admit_placement(p, Place::Device(0), "t"), Ok(()));
        assert_eq!(w.used(), 700);
        assert_eq!(e.tracked_free(&w.rec.allocs, p, || 0), CUDA_SUCCESS);
        assert_eq!((w.used(), w.q.spilled()), (0, 0));
    }

    #[test]
    fn managed_memory_may_go_only_to_the_device_whose_quota_holds_it() {
        let w = World::new(1000);
        let e = w.interposer();
        e.charged_call(
            &w.rec.allocs,
            Kind::Managed,
            400,
            e.target_current(),
            || 0,
            || 0x100,
        );
        assert_eq!(e.admit_placement(0x100, Place::Device(0), "t"), Ok(()));
        assert_eq!(
            e.admit_placement(0x100 + 399, Place::location(DEV0), "t"),
            Ok(())
        );
        // device 1 without a quota: not ours to refuse
        assert_eq!(e.admit_placement(0x100, Place::location(DEV1), "t"), Ok(()));
        // device 1 with a quota: refused
        let dir = tempfile::tempdir().unwrap();
        let q1 = DeviceQuota::open(1, "GPU-1", 1000, &dir.path().join("gpu1")).unwrap();
        w.fake
            .quotas
            .borrow_mut()
            .insert(1, Ok(Box::leak(Box::new(q1))));
        assert_eq!(
            e.admit_placement(0x100, Place::location(DEV1), "t"),
            Err(CUDA_ERROR_INVALID_DEVICE)
        );
        assert_eq!(w.used(), 400, "nothing charged or refunded");
        // plain device memory: the driver answers (it refuses prefetches of it itself)
        e.charged_call(
            &w.rec.allocs,
            Kind::Data,
            100,
            e.target_current(),
            || 0,
            || 0x900,
        );
        assert_eq!(e.admit_placement(0x900, Place::Device(1), "t"), Ok(()));
    }

    #[test]
    fn memory_the_library_never_charged_gets_no_device_under_a_limit() {
        let w = World::new(1000);
        let e = w.interposer();
        assert_eq!(
            e.admit_placement(0x5000, Place::Device(0), "t"),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        assert_eq!(e.admit_placement(0x5000, Place::Elsewhere, "t"), Ok(()));
        assert_eq!(
            e.admit_advice(0x5000, CU_MEM_ADVISE_SET_READ_MOSTLY, Place::Elsewhere, "t"),
            Ok(())
        );
        w.fake.set_applies(Applies::Nowhere);
        assert_eq!(e.admit_placement(0x5000, Place::Device(0), "t"), Ok(()));
    }

    #[test]
    fn a_batch_is_refused_whole_when_one_operation_would_pass_the_quota() {
        let w = spill_world(1000, 4000);
        let p = spilled(&w, 900, 700);
        let e = w.interposer();
        e.charged_call(
            &w.rec.allocs,
            Kind::Managed,
            50,
            e.target_current(),
            || 0,
            || 0x100,
        );
        // op 0 to the host, ops 1.. to device 0: op 1 (managed, ours) passes, op 2 (spilled) does not
        let r = e.admit_batch(&[p, 0x100, p], &[HOST, DEV0], &[0, 1], "t");
        assert_eq!(r, Err(CUDA_ERROR_OUT_OF_MEMORY));
        assert_eq!(
            e.admit_batch(&[p, 0x100], &[HOST, DEV0], &[0, 1], "t"),
            Ok(())
        );
        assert_eq!(
            e.admit_batch(&[p], &[], &[], "t"),
            Ok(()),
            "no location: the driver answers"
        );
    }
}
