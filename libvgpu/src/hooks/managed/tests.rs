//! Managed memory charged on every device of the process's contexts, on the fake driver: device 0
//! current (its quota `w.q`), device 1 added with a quota of its own.

use super::super::testing::World;
use super::*;
use crate::records::Rec;

const MIB: u64 = 1 << 20;

/// cuMemAllocManaged of `bytes` in the current context; the driver answers `p`.
fn managed(w: &World, p: u64, bytes: u64) -> CUresult {
    w.interposer().alloc_managed(bytes, || CUDA_SUCCESS, || p)
}

/// cuCtxCreate on `dev` through the policy, the driver taking `grow` bytes for context `ctx`.
fn create(w: &World, dev: CUdevice, ctx: usize, grow: i64) -> CUresult {
    let mut out: CUcontext = std::ptr::null_mut();
    let p: *mut CUcontext = &mut out;
    w.interposer().ctx_create(p, dev, || {
        w.fake.grow(grow);
        // SAFETY: `p` points at the local `out`.
        unsafe { *p = ctx as CUcontext };
        CUDA_SUCCESS
    })
}

/// A context of this process on device 1, recorded as the context hooks record one (charged nothing).
fn context_on_1(w: &World, ctx: usize) {
    w.rec
        .contexts
        .insert(ctx as u64, Rec::new(1, Kind::Context, 0, ctx));
}

#[test]
fn a_process_on_one_device_is_charged_once() {
    let w = World::new(1 << 30);
    let (q1, _) = w.add_device(1, 1 << 30);
    assert_eq!(managed(&w, 0x10, 800 * MIB), CUDA_SUCCESS);
    assert_eq!(w.usage(Kind::Managed), 800 * MIB);
    assert_eq!(
        q1.used(),
        0,
        "no context on device 1: nothing charged there"
    );
    assert_eq!(
        w.interposer()
            .tracked_free(&w.rec.allocs, 0x10, || CUDA_SUCCESS),
        CUDA_SUCCESS
    );
    assert_eq!(w.used(), 0);
    assert!(w.rec.managed.keys().is_empty());
}

#[test]
fn managed_memory_is_charged_on_every_device_with_a_context_and_the_free_refunds_all() {
    let w = World::new(1 << 30);
    let (q1, c1) = w.add_device(1, 1 << 30);
    context_on_1(&w, c1);
    assert_eq!(managed(&w, 0x10, 300 * MIB), CUDA_SUCCESS);
    assert_eq!(
        (w.usage(Kind::Managed), q1.usage_of(Kind::Managed)),
        (300 * MIB, 300 * MIB)
    );
    let e = w.interposer();
    assert_eq!(
        e.tracked_free(&w.rec.allocs, 0x10, || CUDA_SUCCESS),
        CUDA_SUCCESS
    );
    assert_eq!((w.used(), q1.used()), (0, 0));
}

#[test]
fn managed_memory_that_does_not_fit_another_devices_quota_is_freed_and_refused() {
    let w = World::new(1 << 30);
    let (q1, c1) = w.add_device(1, 512 * MIB);
    context_on_1(&w, c1);
    assert_eq!(managed(&w, 0x10, 800 * MIB), CUDA_ERROR_OUT_OF_MEMORY);
    assert!(w.fake.called("mem_free 0x10"));
    assert_eq!((w.used(), q1.used()), (0, 0));
    assert!(w.rec.allocs.keys().is_empty() && w.rec.managed.keys().is_empty());
}

#[test]
fn a_device_without_a_quota_is_not_charged() {
    let w = World::new(1 << 30);
    context_on_1(&w, 0xc1); // device 1 has no quota
    assert_eq!(managed(&w, 0x10, 800 * MIB), CUDA_SUCCESS);
    assert_eq!(w.used(), 800 * MIB);
    assert_eq!(w.rec.managed.with(0x10, |m| m.unwrap().devs.len()), 0);
}

#[test]
fn a_new_context_on_another_device_is_charged_the_live_managed_memory_once() {
    let w = World::new(1 << 30);
    let (q1, _) = w.add_device(1, 1 << 30);
    assert_eq!(managed(&w, 0x10, 300 * MIB), CUDA_SUCCESS);
    assert_eq!(create(&w, 1, 0xc1, (10 * MIB) as i64), CUDA_SUCCESS);
    assert_eq!(q1.usage_of(Kind::Managed), 300 * MIB);
    assert_eq!(create(&w, 1, 0xc2, (10 * MIB) as i64), CUDA_SUCCESS);
    assert_eq!(
        q1.usage_of(Kind::Managed),
        300 * MIB,
        "charged once per device"
    );
    // Destroying device 1's contexts keeps the charge (the pages may stay there); the free refunds it.
    let e = w.interposer();
    e.context_gone(0xc1);
    e.context_gone(0xc2);
    assert_eq!(q1.usage_of(Kind::Managed), 300 * MIB);
    assert_eq!(
        e.tracked_free(&w.rec.allocs, 0x10, || CUDA_SUCCESS),
        CUDA_SUCCESS
    );
    assert_eq!((w.used(), q1.used()), (0, 0));
}

#[test]
fn a_context_where_the_managed_memory_does_not_fit_is_destroyed_and_refused() {
    let w = World::new(1 << 30);
    let (q1, _) = w.add_device(1, 512 * MIB);
    assert_eq!(managed(&w, 0x10, 100 * MIB), CUDA_SUCCESS);
    assert_eq!(managed(&w, 0x20, 500 * MIB), CUDA_SUCCESS);
    assert_eq!(
        create(&w, 1, 0xc1, (10 * MIB) as i64),
        CUDA_ERROR_OUT_OF_MEMORY
    );
    assert!(w.fake.called("ctx_destroy 0xc1"));
    assert_eq!(
        q1.used(),
        0,
        "neither the context nor either allocation stays charged"
    );
    assert!(w.rec.contexts.keys().is_empty());
    assert!(w.rec.managed.values().iter().all(|m| m.devs.is_empty()));
    assert_eq!(w.usage(Kind::Managed), 600 * MIB);
}

#[test]
fn a_fresh_primary_context_is_charged_the_managed_memory_or_released() {
    let w = World::new(1 << 30);
    let (q1, _) = w.add_device(1, 512 * MIB);
    assert_eq!(managed(&w, 0x10, 400 * MIB), CUDA_SUCCESS);
    let retain = |grow: u64| {
        let mut out: CUcontext = std::ptr::null_mut();
        let p: *mut CUcontext = &mut out;
        w.interposer().primary_retain(p, 1, || {
            w.fake.grow(grow as i64);
            w.fake.primary.borrow_mut().insert(1, (0xd1, true));
            // SAFETY: `p` points at the local `out`.
            unsafe { *p = 0xd1 as CUcontext };
            CUDA_SUCCESS
        })
    };
    // 400 MiB of managed memory and a 200 MiB context pass 512 MiB: released and refused.
    assert_eq!(retain(200 * MIB), CUDA_ERROR_OUT_OF_MEMORY);
    assert!(w.fake.called("primary_release 1"));
    assert_eq!(q1.used(), 0);
    assert!(w.rec.primary.keys().is_empty());
    w.fake.primary.borrow_mut().clear();
    assert_eq!(retain(50 * MIB), CUDA_SUCCESS);
    assert_eq!(q1.usage_of(Kind::Managed), 400 * MIB);
    // A reset of device 1's primary context keeps the charge; the free gives it back.
    let e = w.interposer();
    assert_eq!(e.primary_release(1, || CUDA_SUCCESS, true), CUDA_SUCCESS);
    assert_eq!(q1.usage_of(Kind::Managed), 400 * MIB);
    assert_eq!(
        e.tracked_free(&w.rec.allocs, 0x10, || CUDA_SUCCESS),
        CUDA_SUCCESS
    );
    assert_eq!(q1.used(), 0);
}

#[test]
fn the_end_of_the_allocations_context_refunds_every_device() {
    let w = World::new(1 << 30);
    let (q1, c1) = w.add_device(1, 1 << 30);
    context_on_1(&w, c1);
    assert_eq!(managed(&w, 0x10, 300 * MIB), CUDA_SUCCESS);
    w.interposer().context_gone(w.fake.ctx());
    assert_eq!((w.used(), q1.used()), (0, 0));
    assert!(w.rec.managed.keys().is_empty());
}

#[test]
fn a_shared_managed_allocation_stays_charged_everywhere_after_its_free() {
    let w = World::new(1 << 30);
    let (q1, c1) = w.add_device(1, 1 << 30);
    context_on_1(&w, c1);
    assert_eq!(managed(&w, 0x10, 300 * MIB), CUDA_SUCCESS);
    w.rec.allocs.with(0x10, |r| r.unwrap().exported = true);
    let e = w.interposer();
    assert_eq!(
        e.tracked_free(&w.rec.allocs, 0x10, || CUDA_SUCCESS),
        CUDA_SUCCESS
    );
    assert_eq!((w.used(), q1.used()), (300 * MIB, 300 * MIB));
    assert!(
        w.rec.managed.keys().is_empty(),
        "a new context is not charged for freed memory"
    );
}

/// Makes a context of device 2, which has no quota, current; device 0's context recorded as the context
/// hooks record one.
fn current_on_unlimited_device(w: &World) -> usize {
    let c2 = crate::driver::fake::handle();
    w.fake.ctx_devices.borrow_mut().insert(c2, 2);
    w.rec.contexts.insert(
        w.fake.ctx() as u64,
        Rec::new(0, Kind::Context, 0, w.fake.ctx()),
    );
    w.fake.set_current(c2);
    c2
}

#[test]
fn managed_memory_of_a_device_without_a_quota_is_charged_where_the_process_has_a_context() {
    let w = World::new(1 << 30);
    current_on_unlimited_device(&w);
    assert_eq!(managed(&w, 0x10, 300 * MIB), CUDA_SUCCESS);
    assert_eq!(
        w.usage(Kind::Managed),
        300 * MIB,
        "device 0 holds a context"
    );
    assert!(
        w.rec.allocs.keys().is_empty(),
        "its own device charges nothing"
    );
    let e = w.interposer();
    assert_eq!(
        e.tracked_free(&w.rec.allocs, 0x10, || CUDA_SUCCESS),
        CUDA_SUCCESS
    );
    assert_eq!(w.used(), 0);
    // Past device 0's quota: freed and refused.
    assert_eq!(managed(&w, 0x20, 2 << 30), CUDA_ERROR_OUT_OF_MEMORY);
    assert!(w.fake.called("mem_free 0x20"));
    assert_eq!(w.used(), 0);
    assert!(w.rec.managed.keys().is_empty());
}

#[test]
fn a_new_context_is_charged_managed_memory_of_a_device_without_a_quota_until_its_context_goes() {
    let w = World::new(1 << 30);
    let (q1, _) = w.add_device(1, 1 << 30);
    let c2 = current_on_unlimited_device(&w);
    assert_eq!(managed(&w, 0x10, 300 * MIB), CUDA_SUCCESS);
    assert_eq!(create(&w, 1, 0xc1, 0), CUDA_SUCCESS);
    assert_eq!(q1.usage_of(Kind::Managed), 300 * MIB);
    w.interposer().context_gone(c2);
    assert_eq!((w.used(), q1.used()), (0, 0), "its context took it with it");
    assert!(w.rec.managed.keys().is_empty());
}
