//! The context policy on the fake driver: measured creation, refusal and destruction of what does not
//! fit, the primary context's retain count, and everything of a context given back when it goes.

use super::super::testing::World;
use super::*;

/// cuCtxCreate through the policy with a driver that takes `grow` bytes and returns context `ctx`.
fn create(w: &World, ctx: usize, grow: i64) -> CUresult {
    let mut out: CUcontext = std::ptr::null_mut();
    let p: *mut CUcontext = &mut out;
    w.engine().ctx_create(p, 0, || {
        w.fake.grow(grow);
        // SAFETY: `p` points at the local `out`.
        unsafe { *p = ctx as CUcontext };
        CUDA_SUCCESS
    })
}

#[test]
fn a_context_is_charged_what_the_device_grew_by() {
    let w = World::new(1 << 30);
    assert_eq!(create(&w, 0xc1, 300 << 20), CUDA_SUCCESS);
    assert_eq!(w.usage(Kind::Context), 300 << 20);
    assert!(w.rec.contexts.with(0xc1, |r| r.is_some()));
}

#[test]
fn the_measurement_excludes_what_the_ledger_recorded_meanwhile_and_is_clamped() {
    let w = World::new(8 << 30);
    // another process of the container allocated 100 MiB during the creation
    let mut out: CUcontext = std::ptr::null_mut();
    let p: *mut CUcontext = &mut out;
    w.engine().ctx_create(p, 0, || {
        w.fake.grow(400 << 20);
        assert!(w.q.charge(Kind::Data, 100 << 20));
        // SAFETY: `p` points at the local `out`.
        unsafe { *p = 0xc2 as CUcontext };
        CUDA_SUCCESS
    });
    assert_eq!(w.usage(Kind::Context), 300 << 20);
    assert_eq!(create(&w, 0xc3, 5 << 30), CUDA_SUCCESS);
    assert_eq!(
        w.usage(Kind::Context),
        (300 << 20) + CONTEXT_CEILING,
        "clamped to the ceiling"
    );
}

#[test]
fn a_context_that_does_not_fit_is_destroyed_and_refused() {
    let w = World::new(100 << 20);
    assert_eq!(create(&w, 0xc4, 200 << 20), CUDA_ERROR_OUT_OF_MEMORY);
    assert!(w.fake.called("ctx_destroy 0xc4"));
    assert_eq!(w.used(), 0);
    assert!(w.rec.contexts.keys().is_empty());
}

#[test]
fn a_failed_creation_charges_nothing() {
    let w = World::new(1 << 30);
    let mut out: CUcontext = std::ptr::null_mut();
    let r = w
        .engine()
        .ctx_create(&mut out, 0, || CUDA_ERROR_INVALID_VALUE);
    assert_eq!(r, CUDA_ERROR_INVALID_VALUE);
    assert_eq!(w.used(), 0);
}

#[test]
fn destroying_a_context_gives_back_everything_recorded_in_it() {
    let w = World::new(1 << 30);
    create(&w, 0xc5, 10 << 20);
    let e = w.engine();
    w.rec.allocs.insert(1, Rec::new(0, Kind::Data, 5, 0xc5));
    w.rec.arrays.insert(2, Rec::new(0, Kind::Array, 7, 0xc5));
    w.rec.modules.insert(3, Rec::new(0, Kind::Module, 9, 0xc5));
    w.rec.allocs.insert(4, Rec::new(0, Kind::Data, 11, 0xc6)); // another context's
    assert!(
        w.q.charge(Kind::Data, 5 + 11) && w.q.charge(Kind::Array, 7) && w.q.charge(Kind::Module, 9)
    );
    e.context_gone(0xc5);
    assert_eq!(w.used(), 11, "only the other context's allocation stays");
    assert_eq!(w.rec.allocs.keys(), vec![4]);
}

#[test]
fn a_pool_allocation_of_a_gone_context_goes_back_to_its_pool() {
    let w = World::new(1 << 30);
    let e = w.engine();
    e.pool_created(0x50, CU_MEM_LOCATION_TYPE_DEVICE, 0);
    w.rec.pools.with(0x50, |p| p.unwrap().outstanding = 64);
    w.rec.allocs.insert(
        1,
        Rec {
            pool: 0x50,
            ..Rec::new(0, Kind::AsyncPool, 64, 0xc7)
        },
    );
    e.context_gone(0xc7);
    assert_eq!(w.rec.pools.with(0x50, |p| p.unwrap().outstanding), 0);
    assert!(w.rec.pools_dirty.load(std::sync::atomic::Ordering::Relaxed));
}

/// The primary context of device 0 is `0xd0`; retain through the policy, the driver activating it.
fn retain(w: &World, grow: i64) -> CUresult {
    let mut out: CUcontext = std::ptr::null_mut();
    let p: *mut CUcontext = &mut out;
    w.engine().primary_retain(p, 0, || {
        w.fake.grow(grow);
        w.fake.primary.borrow_mut().insert(0, (0xd0, true));
        // SAFETY: `p` points at the local `out`.
        unsafe { *p = 0xd0 as CUcontext };
        CUDA_SUCCESS
    })
}

#[test]
fn only_the_first_retain_of_the_primary_context_is_charged_and_the_last_release_refunds() {
    let w = World::new(1 << 30);
    assert_eq!(retain(&w, 500 << 20), CUDA_SUCCESS);
    assert_eq!(retain(&w, 0), CUDA_SUCCESS);
    assert_eq!(w.usage(Kind::Context), 500 << 20);
    let e = w.engine();
    assert_eq!(e.primary_release(0, || CUDA_SUCCESS, false), CUDA_SUCCESS);
    assert_eq!(w.used(), 500 << 20, "one retain is left");
    assert_eq!(e.primary_release(0, || CUDA_SUCCESS, false), CUDA_SUCCESS);
    assert_eq!(w.used(), 0);
}

#[test]
fn a_reset_ends_the_primary_context_whatever_its_count() {
    let w = World::new(1 << 30);
    retain(&w, 100 << 20);
    retain(&w, 0);
    assert_eq!(
        w.engine().primary_release(0, || CUDA_SUCCESS, true),
        CUDA_SUCCESS
    );
    assert_eq!(w.used(), 0);
}

#[test]
fn a_primary_context_that_does_not_fit_is_released_and_refused() {
    let w = World::new(100 << 20);
    assert_eq!(retain(&w, 200 << 20), CUDA_ERROR_OUT_OF_MEMORY);
    assert!(w.fake.called("primary_release 0"));
    assert_eq!(w.used(), 0);
    assert!(
        w.rec.primary.keys().is_empty(),
        "a refused retain is not counted"
    );
}
