//! Pools held to the right device and never refused while their freed memory would fit: a pool's
//! allocations are charged to the pool's location (a device's default or current pool, with no context
//! current or another device's current), and before any refusal the process's pools are reconciled and
//! trimmed of memory freed in them.

use std::cell::Cell;

use super::super::testing::World;
use super::*;
use crate::driver::Place;

const MIB: u64 = 1 << 20;
const CHUNK: u64 = 32 * MIB;
const STREAM: usize = 0x77;

/// A pool as the driver keeps it (live bytes, a reservation grown in chunks), found by its handle.
struct Pool<'a> {
    w: &'a World,
    handle: u64,
    live: Cell<u64>,
    next: Cell<u64>,
}

impl<'a> Pool<'a> {
    fn new(w: &'a World, handle: u64) -> Self {
        w.fake.pool_reserved.borrow_mut().insert(handle, 0);
        Pool {
            w,
            handle,
            live: Cell::new(0),
            next: Cell::new(0x9000_0000 + handle * 0x1_0000_0000),
        }
    }

    fn reserved(&self) -> u64 {
        self.w.fake.pool_reserved.borrow()[&self.handle]
    }

    /// The driver's side of an allocation of `bytes` (writes `out`).
    fn driver_alloc(&self, out: *mut CUdeviceptr, bytes: u64) -> CUresult {
        let live = self.live.get() + bytes;
        self.live.set(live);
        let mut res = self.w.fake.pool_reserved.borrow_mut();
        let r = res.get_mut(&self.handle).unwrap();
        *r = (*r).max(live.div_ceil(CHUNK) * CHUNK);
        let p = self.next.get();
        self.next.set(p + bytes.max(1));
        // SAFETY: `out` points at the caller's local.
        unsafe { *out = p };
        CUDA_SUCCESS
    }

    /// cuMemAllocFromPoolAsync through the policy.
    fn alloc(&self, bytes: u64) -> Result<u64, CUresult> {
        let mut ptr: CUdeviceptr = 0;
        let out: *mut CUdeviceptr = &mut ptr;
        let r = self
            .w
            .interposer()
            .alloc_from_pool(out, bytes, self.handle, STREAM, false, || {
                self.driver_alloc(out, bytes)
            });
        (r == CUDA_SUCCESS).then_some(ptr).ok_or(r)
    }

    /// cuMemAllocAsync through the policy (this pool being the stream's device's current one).
    fn alloc_async(&self, bytes: u64) -> Result<u64, CUresult> {
        let mut ptr: CUdeviceptr = 0;
        let out: *mut CUdeviceptr = &mut ptr;
        let r = self
            .w
            .interposer()
            .alloc_async(out, bytes, STREAM, false, || self.driver_alloc(out, bytes));
        (r == CUDA_SUCCESS).then_some(ptr).ok_or(r)
    }

    /// cuMemFreeAsync through the policy: the memory stays reserved.
    fn free(&self, ptr: u64, bytes: u64) {
        let e = self.w.interposer();
        assert_eq!(
            e.tracked_free(&self.w.rec.allocs, ptr, || CUDA_SUCCESS),
            CUDA_SUCCESS
        );
        self.live.set(self.live.get() - bytes);
    }

    /// A synchronisation no hook saw (CUDA 13's cudaDeviceSynchronize before it was hooked): the driver
    /// releases what is not in use.
    fn unseen_sync(&self) {
        let keep = self.live.get().div_ceil(CHUNK) * CHUNK;
        let mut res = self.w.fake.pool_reserved.borrow_mut();
        let r = res.get_mut(&self.handle).unwrap();
        *r = (*r).min(keep);
    }
}

/// A plain allocation of `bytes` in the current context through the policy.
fn plain(w: &World, bytes: u64) -> CUresult {
    let e = w.interposer();
    e.charged_call(
        &w.rec.allocs,
        Kind::Data,
        bytes,
        e.target_current(),
        || CUDA_SUCCESS,
        || 0xd000_0000 + bytes,
    )
}

// Regression (issue 23 item 7, H100 with CUDA 13): cudaDeviceSynchronize resolved to the unhooked
// cuCtxSynchronize_v2, so freed stream-ordered memory was never reconciled and the next cudaMalloc was
// refused while the device held 527 MiB.
#[test]
fn a_refusal_first_reconciles_pools_a_sync_no_hook_saw_released() {
    let w = World::new(1024 * MIB);
    let d = Pool::new(&w, 0x5100);
    w.fake.device_pools.borrow_mut().insert(0, d.handle);
    let p = d.alloc_async(800 * MIB).unwrap();
    d.free(p, 800 * MIB);
    d.unseen_sync();
    assert_eq!(d.reserved(), 0);
    assert_eq!(plain(&w, 900 * MIB), CUDA_SUCCESS);
    assert_eq!(
        w.used(),
        900 * MIB,
        "the pool's released memory was given back"
    );
}

#[test]
fn a_refusal_first_trims_memory_freed_in_the_processs_pools() {
    let w = World::new(1024 * MIB);
    let d = Pool::new(&w, 0x5200);
    w.fake.device_pools.borrow_mut().insert(0, d.handle);
    let keep = d.alloc_async(64 * MIB).unwrap();
    let p = d.alloc_async(700 * MIB).unwrap();
    d.free(p, 700 * MIB);
    // no synchronisation at all: the driver still holds the freed memory in the pool
    assert_eq!(d.reserved(), 768 * MIB);
    assert_eq!(plain(&w, 900 * MIB), CUDA_SUCCESS);
    assert!(w.fake.called("pool_trim"), "the pool was trimmed first");
    assert_eq!(d.reserved(), 64 * MIB, "down to its live allocation");
    assert_eq!(w.used(), 900 * MIB + 64 * MIB);
    // what does not fit even then is still refused, and the live allocation stays charged
    assert_eq!(plain(&w, 200 * MIB), CUDA_ERROR_OUT_OF_MEMORY);
    d.free(keep, 64 * MIB);
}

// GPU (H100, issue 23 item 7): memory freed on a stream that has not reached the free yet stays the
// driver's until a synchronisation: a trim alone released nothing and 1,200 MiB under 2 GiB was refused.
#[test]
fn frees_still_pending_on_their_streams_are_waited_for_before_a_refusal() {
    let w = World::new(1024 * MIB);
    let d = Pool::new(&w, 0x5250);
    w.fake.device_pools.borrow_mut().insert(0, d.handle);
    let p = d.alloc_async(800 * MIB).unwrap();
    d.free(p, 800 * MIB);
    w.fake.frees_pending.set(true);
    assert_eq!(plain(&w, 900 * MIB), CUDA_SUCCESS);
    assert!(w.fake.called("ctx_synchronize"));
    assert_eq!(w.used(), 900 * MIB);
}

#[test]
fn a_pool_allocation_is_not_refused_while_another_pools_freed_memory_would_fit() {
    let w = World::new(1024 * MIB);
    let a = Pool::new(&w, 0x5300);
    let b = Pool::new(&w, 0x5400);
    let e = w.interposer();
    e.pool_created(a.handle, CU_MEM_LOCATION_TYPE_DEVICE, 0);
    e.pool_created(b.handle, CU_MEM_LOCATION_TYPE_DEVICE, 0);
    let p = a.alloc(900 * MIB).unwrap();
    a.free(p, 900 * MIB);
    assert_eq!(b.alloc(900 * MIB).map(|_| ()), Ok(()));
    assert_eq!(a.reserved(), 0);
    assert_eq!(w.used(), 928 * MIB, "b's chunked reservation only");
}

// Regression (issue 23 item 1): cuMemAllocFromPoolAsync on a device's default pool with no context
// current was not charged at all (2,100 MiB granted under 1 GiB).
#[test]
fn a_default_pool_with_no_context_current_is_charged_to_its_device() {
    let w = World::new(1024 * MIB);
    let d = Pool::new(&w, 0x5500);
    w.fake
        .pool_places
        .borrow_mut()
        .insert(d.handle, Place::Device(0));
    w.fake.set_current(0);
    assert_eq!(d.alloc(700 * MIB).map(|_| ()), Ok(()));
    assert_eq!(w.usage(Kind::AsyncPool), 704 * MIB);
    assert_eq!(d.alloc(700 * MIB), Err(CUDA_ERROR_OUT_OF_MEMORY));
}

// Regression (issue 23 item 1): device 1's pool used while device 0's context is current was charged
// to device 0 (device 1 held 1,660 MiB under its 1 GiB quota).
#[test]
fn another_devices_pool_is_charged_to_that_device_and_reconciled_there() {
    let w = World::new(4096 * MIB);
    let (q1, _) = w.add_device(1, 1024 * MIB);
    let d = Pool::new(&w, 0x5600);
    w.fake
        .pool_places
        .borrow_mut()
        .insert(d.handle, Place::Device(1));
    let p = d.alloc(700 * MIB).unwrap();
    assert_eq!((w.used(), q1.used()), (0, 704 * MIB));
    assert_eq!(d.alloc(700 * MIB), Err(CUDA_ERROR_OUT_OF_MEMORY));
    // the trim's reconciliation gives back to device 1
    d.free(p, 700 * MIB);
    w.fake.pool_reserved.borrow_mut().insert(d.handle, 0);
    w.interposer().reconcile_pool(d.handle);
    assert_eq!((w.used(), q1.used()), (0, 0));
}

// Issue 23 item 11: an allocation whose device cannot be resolved is refused under a limit.
#[test]
fn a_pool_whose_place_is_unknown_is_refused_and_a_host_pool_is_not_charged() {
    let w = World::new(1024 * MIB);
    let d = Pool::new(&w, 0x5700);
    let mut called = false;
    let mut ptr: CUdeviceptr = 0;
    let r = w
        .interposer()
        .alloc_from_pool(&mut ptr, MIB, d.handle, STREAM, false, || {
            called = true;
            CUDA_SUCCESS
        });
    assert_eq!((r, called), (CUDA_ERROR_OUT_OF_MEMORY, false));
    let h = Pool::new(&w, 0x5800);
    w.fake
        .pool_places
        .borrow_mut()
        .insert(h.handle, Place::Host);
    assert_eq!(h.alloc(2048 * MIB).map(|_| ()), Ok(()));
    assert_eq!(w.used(), 0);
}
