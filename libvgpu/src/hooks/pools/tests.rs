//! The pool policy driven through its edge cases on the fake driver: chunked reservation growth, growth
//! that does not fit, trims, failures after the charge, host pools and captured streams.

use std::cell::Cell;

use super::super::testing::World;
use super::*;

const MIB: u64 = 1 << 20;
const CHUNK: u64 = 32 * MIB;
const POOL: u64 = 0x5000;
const STREAM: usize = 0x77;

/// A pool as the driver keeps it: live bytes, and a reservation grown in chunks.
struct DriverPool<'a> {
    w: &'a World,
    live: Cell<u64>,
    next: Cell<u64>,
}

impl<'a> DriverPool<'a> {
    fn new(w: &'a World) -> Self {
        w.fake.pool_reserved.borrow_mut().insert(POOL, 0);
        w.fake.device_pools.borrow_mut().insert(0, POOL);
        DriverPool {
            w,
            live: Cell::new(0),
            next: Cell::new(0x9000_0000),
        }
    }

    fn reserved(&self) -> u64 {
        self.w.fake.pool_reserved.borrow()[&POOL]
    }

    /// cuMemAllocAsync through the policy; the pointer it got, or the error.
    fn alloc(&self, bytes: u64) -> Result<u64, CUresult> {
        let mut ptr: CUdeviceptr = 0;
        let out: *mut CUdeviceptr = &mut ptr;
        let r = self
            .w
            .interposer()
            .alloc_async(out, bytes, STREAM, false, || {
                let live = self.live.get() + bytes;
                self.live.set(live);
                let mut res = self.w.fake.pool_reserved.borrow_mut();
                let r = res.get_mut(&POOL).unwrap();
                *r = (*r).max(live.div_ceil(CHUNK) * CHUNK);
                let p = self.next.get();
                self.next.set(p + bytes.max(1));
                // SAFETY: `out` points at the local `ptr`.
                unsafe { *out = p };
                CUDA_SUCCESS
            });
        if r == CUDA_SUCCESS {
            Ok(ptr)
        } else {
            Err(r)
        }
    }

    /// cuMemFreeAsync through the policy (the reservation stays until a trim).
    fn free(&self, ptr: u64, bytes: u64) {
        let e = self.w.interposer();
        assert_eq!(
            e.tracked_free(&self.w.rec.allocs, ptr, || CUDA_SUCCESS),
            CUDA_SUCCESS
        );
        self.live.set(self.live.get() - bytes);
    }
}

#[test]
fn the_reservation_grows_by_a_chunk_and_is_charged_whole() {
    let w = World::new(100 * MIB);
    let d = DriverPool::new(&w);
    let p = d.alloc(MIB).unwrap();
    assert_eq!(d.reserved(), CHUNK);
    assert_eq!(
        w.usage(Kind::AsyncPool),
        CHUNK,
        "the driver's chunk is what is held"
    );
    // a second allocation inside the chunk costs nothing more
    d.alloc(MIB).unwrap();
    assert_eq!(w.used(), CHUNK);
    let rec = w.rec.allocs.with(p, |r| r.copied()).unwrap();
    assert_eq!(
        (rec.pool, rec.bytes, rec.kind),
        (POOL, MIB, Kind::AsyncPool)
    );
}

#[test]
fn growth_that_does_not_fit_is_undone_trimmed_and_refused() {
    let w = World::new(20 * MIB);
    let d = DriverPool::new(&w);
    assert_eq!(d.alloc(MIB), Err(CUDA_ERROR_OUT_OF_MEMORY));
    assert!(w.fake.called("free_async_and_sync 0x90000000 0x77 false"));
    assert!(
        w.fake.called("pool_trim 0x5000 0"),
        "trimmed back to what stays live"
    );
    assert_eq!(
        w.used(),
        0,
        "the quota is never exceeded, nothing stays charged"
    );
    assert!(w.rec.allocs.keys().is_empty());
}

#[test]
fn a_free_refunds_at_the_next_reconciliation_after_the_trim() {
    let w = World::new(100 * MIB);
    let d = DriverPool::new(&w);
    let p = d.alloc(4 * MIB).unwrap();
    d.free(p, 4 * MIB);
    let e = w.interposer();
    e.after_sync(CUDA_SUCCESS);
    assert_eq!(
        w.used(),
        CHUNK,
        "still reserved by the driver: still charged"
    );
    w.fake.pool_reserved.borrow_mut().insert(POOL, 0); // the driver trimmed
    e.reconcile_pool(POOL);
    assert_eq!(w.used(), 0);
}

#[test]
fn a_trim_never_refunds_below_live_allocations() {
    let w = World::new(100 * MIB);
    let d = DriverPool::new(&w);
    d.alloc(4 * MIB).unwrap();
    w.fake.pool_reserved.borrow_mut().insert(POOL, 0); // a (wrong) reading of zero
    w.interposer().reconcile_pool(POOL);
    assert_eq!(w.used(), 4 * MIB);
}

#[test]
fn a_driver_failure_after_the_charge_gives_it_back() {
    let w = World::new(100 * MIB);
    DriverPool::new(&w);
    let mut ptr: CUdeviceptr = 0;
    let r = w
        .interposer()
        .alloc_async(&mut ptr, MIB, STREAM, false, || CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(r, CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(w.used(), 0);
    assert_eq!(
        w.rec
            .pools
            .with(POOL, |p| p.map(|p| (p.charged, p.outstanding))),
        Some((0, 0))
    );
}

#[test]
fn refused_before_the_driver_when_the_size_alone_does_not_fit() {
    let w = World::new(10 * MIB);
    DriverPool::new(&w);
    let mut ptr: CUdeviceptr = 0;
    let r = w
        .interposer()
        .alloc_async(&mut ptr, 11 * MIB, STREAM, false, || {
            panic!("driver called")
        });
    assert_eq!(r, CUDA_ERROR_OUT_OF_MEMORY);
}

#[test]
fn host_pools_and_captured_streams_are_not_charged() {
    let w = World::new(10 * MIB);
    let e = w.interposer();
    e.pool_created(0x6000, 2 /* host */, 0);
    let mut ptr: CUdeviceptr = 0;
    assert_eq!(
        e.alloc_from_pool(&mut ptr, 64 * MIB, 0x6000, STREAM, false, || CUDA_SUCCESS),
        CUDA_SUCCESS
    );
    assert_eq!(w.used(), 0);
    DriverPool::new(&w);
    w.fake.capturing.borrow_mut().push(STREAM);
    assert_eq!(
        e.alloc_async(&mut ptr, 64 * MIB, STREAM, false, || CUDA_SUCCESS),
        CUDA_SUCCESS
    );
    assert_eq!(
        w.used(),
        0,
        "captured allocations become graph memory, charged at launch"
    );
}

#[test]
fn an_explicit_pool_charges_the_device_it_was_created_on() {
    let w = World::new(100 * MIB);
    let e = w.interposer();
    e.pool_created(0x7000, CU_MEM_LOCATION_TYPE_DEVICE, 0);
    w.fake.set_current(0); // no current context: the pool's own device still counts
    let mut ptr: CUdeviceptr = 0;
    let out: *mut CUdeviceptr = &mut ptr;
    let r = e.alloc_from_pool(out, 2 * MIB, 0x7000, STREAM, true, || {
        // SAFETY: `out` points at the local `ptr`.
        unsafe { *out = 0xabc0 };
        CUDA_SUCCESS
    });
    assert_eq!(r, CUDA_SUCCESS);
    assert_eq!(w.used(), 2 * MIB);
}

#[test]
fn destroying_a_pool_without_live_allocations_refunds_its_charge() {
    let w = World::new(100 * MIB);
    let d = DriverPool::new(&w);
    let p = d.alloc(MIB).unwrap();
    d.free(p, MIB);
    w.interposer().pool_destroyed(POOL);
    assert_eq!(w.used(), 0);
}

#[test]
fn a_destroyed_pool_stays_charged_while_its_allocations_live() {
    let w = World::new(100 * MIB);
    let d = DriverPool::new(&w);
    let (a, b) = (d.alloc(MIB).unwrap(), d.alloc(MIB).unwrap());
    let e = w.interposer();
    e.pool_destroyed(POOL);
    e.after_sync(CUDA_SUCCESS);
    assert_eq!(
        w.used(),
        CHUNK,
        "the driver keeps the pool's memory for the live allocations"
    );
    // a new pool may get the same handle: it starts from nothing and never mixes with the old one
    e.pool_created(POOL, CU_MEM_LOCATION_TYPE_DEVICE, 0);
    w.fake.pool_reserved.borrow_mut().insert(POOL, 0);
    d.free(a, MIB);
    e.after_sync(CUDA_SUCCESS);
    assert_eq!(w.used(), CHUNK, "one allocation still lives");
    d.free(b, MIB);
    assert_eq!(
        w.used(),
        CHUNK,
        "given back at the next reconciliation, not before"
    );
    e.after_sync(CUDA_SUCCESS);
    assert_eq!(w.used(), 0);
    assert_eq!(w.rec.pools.keys(), vec![POOL], "only the new pool is left");
}

#[test]
fn broken_configuration_refuses_and_no_limit_forwards() {
    let w = World::new(MIB);
    let e = w.interposer();
    let mut ptr: CUdeviceptr = 0;
    w.fake.set_applies(Applies::Broken);
    assert_eq!(
        e.alloc_async(&mut ptr, 1, STREAM, false, || CUDA_SUCCESS),
        CUDA_ERROR_NOT_INITIALIZED
    );
    w.fake.set_applies(Applies::Nowhere);
    assert_eq!(
        e.alloc_async(&mut ptr, 64 * MIB, STREAM, false, || CUDA_SUCCESS),
        CUDA_SUCCESS
    );
    assert_eq!(w.used(), 0);
}

#[test]
fn charged_to_the_streams_device_not_the_current_contexts() {
    let w = World::new(100 * MIB);
    DriverPool::new(&w);
    // device 1 has no quota; a stream of device 1 used while device 0's context is current
    w.fake.stream_devices.borrow_mut().insert(0x88, 1);
    w.fake.device_pools.borrow_mut().insert(1, 0x5100);
    let mut ptr: CUdeviceptr = 0;
    let e = w.interposer();
    assert_eq!(
        e.alloc_async(&mut ptr, 64 * MIB, 0x88, false, || CUDA_SUCCESS),
        CUDA_SUCCESS
    );
    assert_eq!(w.used(), 0, "device 1's memory is not device 0's quota");
    // and the other way round: device 0's stream while device 1 is current
    w.fake.ctx_devices.borrow_mut().insert(w.fake.home, 1);
    crate::records::context_gone();
    w.fake.stream_devices.borrow_mut().insert(0x89, 0);
    let out: *mut CUdeviceptr = &mut ptr;
    let r = e.alloc_async(out, MIB, 0x89, false, || {
        // SAFETY: `out` points at the local `ptr`.
        unsafe { *out = 0x4400 };
        w.fake.pool_reserved.borrow_mut().insert(POOL, CHUNK);
        CUDA_SUCCESS
    });
    assert_eq!(r, CUDA_SUCCESS);
    assert_eq!(w.used(), CHUNK);
}
