//! The context policy on the fake driver: measured creation, refusal and destruction of what does not
//! fit, the primary context's retain count, and everything of a context given back when it goes.

use super::super::testing::World;
use super::*;
use crate::hooks::measure::PROCESS_SLACK;

/// cuCtxCreate through the policy with a driver that takes `grow` bytes and returns context `ctx`.
fn create(w: &World, ctx: usize, grow: i64) -> CUresult {
    let mut out: CUcontext = std::ptr::null_mut();
    let p: *mut CUcontext = &mut out;
    w.interposer().ctx_create(p, 0, || {
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
fn the_measurement_excludes_what_the_ledger_recorded_meanwhile() {
    let w = World::new(8 << 30);
    // another process of the container allocated 100 MiB during the creation
    let mut out: CUcontext = std::ptr::null_mut();
    let p: *mut CUcontext = &mut out;
    w.interposer().ctx_create(p, 0, || {
        w.fake.grow(400 << 20);
        assert!(w.q.charge(Kind::Data, 100 << 20));
        // SAFETY: `p` points at the local `out`.
        unsafe { *p = 0xc2 as CUcontext };
        CUDA_SUCCESS
    });
    assert_eq!(w.usage(Kind::Context), 300 << 20);
}

// Regression (item 8c): a context measured above the old 2 GiB ceiling was charged 2 GiB.
#[test]
fn a_context_larger_than_the_old_ceiling_is_charged_in_full() {
    let w = World::new(8 << 30);
    assert_eq!(create(&w, 0xc3, 5 << 30), CUDA_SUCCESS);
    assert_eq!(w.usage(Kind::Context), 5 << 30);
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
        .interposer()
        .ctx_create(&mut out, 0, || CUDA_ERROR_INVALID_VALUE);
    assert_eq!(r, CUDA_ERROR_INVALID_VALUE);
    assert_eq!(w.used(), 0);
}

#[test]
fn destroying_a_context_gives_back_everything_recorded_in_it() {
    let w = World::new(1 << 30);
    create(&w, 0xc5, 10 << 20);
    let e = w.interposer();
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
    let e = w.interposer();
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
    w.interposer().primary_retain(p, 0, || {
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
    let e = w.interposer();
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
        w.interposer().primary_release(0, || CUDA_SUCCESS, true),
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

/// cuCtxCreate through the policy; during the creation another tenant (NVML PID `pid`) changes its
/// device memory by `noise`. The new context is registered with the fake (so it can be asked).
fn create_noisy(w: &World, ctx: usize, grow: i64, pid: u32, noise: i64) -> CUresult {
    let mut out: CUcontext = std::ptr::null_mut();
    let p: *mut CUcontext = &mut out;
    w.interposer().ctx_create(p, 0, || {
        w.fake.neighbour(pid, noise / 2);
        w.fake.grow(grow);
        w.fake.ctx_devices.borrow_mut().insert(ctx, 0);
        w.fake.neighbour(pid, noise - noise / 2);
        // SAFETY: `p` points at the local `out`.
        unsafe { *p = ctx as CUcontext };
        CUDA_SUCCESS
    })
}

// Regression (item 9): another tenant's allocation inside the window was charged to the context.
#[test]
fn a_neighbour_allocating_during_creation_is_not_charged() {
    let w = World::new(8 << 30);
    assert_eq!(create_noisy(&w, 0xca, 300 << 20, 77, 3 << 30), CUDA_SUCCESS);
    // at most the slack the device-wide reading may add above the process's own figure
    let c = w.usage(Kind::Context);
    assert!(
        (300 << 20..=(300 << 20) + PROCESS_SLACK).contains(&c),
        "{c}"
    );
}

// Regression (item 9): another tenant's free inside the window made the context cost nothing.
#[test]
fn a_neighbour_freeing_during_creation_does_not_hide_the_cost() {
    let w = World::new(8 << 30);
    w.fake.neighbour(77, 2 << 30);
    assert_eq!(
        create_noisy(&w, 0xcb, 300 << 20, 77, -(2 << 30)),
        CUDA_SUCCESS
    );
    assert_eq!(w.usage(Kind::Context), 300 << 20);
}

// Item 9: in a PID namespace NVML's PIDs are the host's; the process finds its own as the one PID that
// appears with its first context, then measures through it.
#[test]
fn in_a_pid_namespace_the_process_is_found_in_nvml_by_its_first_context() {
    let w = World::new(8 << 30);
    w.fake.same_pid_ns.set(false);
    w.fake.nvml_pid.set(900_001);
    w.fake.neighbour(78, 1 << 30);
    assert_eq!(create_noisy(&w, 0xcc, 300 << 20, 78, 1 << 30), CUDA_SUCCESS);
    let c = w.usage(Kind::Context);
    assert!(
        (300 << 20..=(300 << 20) + PROCESS_SLACK).contains(&c),
        "{c}"
    );
    // a second context while a new process of another tenant appears: exact up to the slack
    assert_eq!(create_noisy(&w, 0xcd, 300 << 20, 79, 2 << 30), CUDA_SUCCESS);
    let c = w.usage(Kind::Context);
    assert!(
        (600 << 20..=(600 << 20) + 2 * PROCESS_SLACK).contains(&c),
        "{c}"
    );
}

// Item 9: without per-process usage, a device-wide measurement far from the context size this process
// learned first is other tenants' noise: the known size is charged.
#[test]
fn without_per_process_usage_a_noisy_measurement_is_bounded_by_the_known_context_size() {
    let w = World::new(8 << 30);
    w.fake.per_process.set(false);
    assert_eq!(create_noisy(&w, 0xce, 300 << 20, 80, 0), CUDA_SUCCESS);
    assert_eq!(create_noisy(&w, 0xcf, 300 << 20, 80, 3 << 30), CUDA_SUCCESS);
    assert_eq!(
        create_noisy(&w, 0xd1, 300 << 20, 80, -(3 << 30)),
        CUDA_SUCCESS
    );
    assert_eq!(w.usage(Kind::Context), 900 << 20);
}

// Regression (item 8d): without NVML every context was charged 0. The driver measures it: the free
// memory through a context of the device before, through the new context after.
#[test]
fn without_nvml_a_context_is_measured_with_the_driver() {
    let w = World::new(8 << 30);
    w.fake.nvml.set(false);
    assert_eq!(create_noisy(&w, 0xd2, 300 << 20, 81, 0), CUDA_SUCCESS);
    assert_eq!(w.usage(Kind::Context), 300 << 20);
    assert!(w.fake.called(&format!("ctx_mem_info {:#x}", w.fake.ctx())));
    assert!(w.fake.called("ctx_mem_info 0xd2"));
}

// Item 8d: without NVML and without any context of the device before, the first context is charged what
// the device holds after its creation beyond the container's ledger, at most DEFAULT_CONTEXT_BYTES.
#[test]
fn without_nvml_or_a_prior_context_the_first_context_is_bounded() {
    let w = World::new(8 << 30);
    w.fake.nvml.set(false);
    w.fake.set_current(0);
    assert_eq!(create_noisy(&w, 0xd3, 300 << 20, 82, 0), CUDA_SUCCESS);
    assert_eq!(w.usage(Kind::Context), 300 << 20);
    // another tenant holds 4 GiB: the bound is the default context size, then the learned one
    let w = World::new(8 << 30);
    w.fake.nvml.set(false);
    w.fake.set_current(0);
    w.fake.neighbour(83, 4 << 30);
    assert_eq!(create_noisy(&w, 0xd4, 300 << 20, 83, 0), CUDA_SUCCESS);
    assert_eq!(w.usage(Kind::Context), DEFAULT_CONTEXT_BYTES);
}

/// cuGreenCtxCreate through the policy with a driver that takes `grow` bytes; green context `green`
/// whose CUcontext is `ctx` (registered with the fake).
fn create_green(w: &World, green: usize, ctx: usize, grow: i64) -> CUresult {
    let mut out: *mut c_void = std::ptr::null_mut();
    let p: *mut *mut c_void = &mut out;
    w.interposer().create_measured(
        p.cast(),
        0,
        CtxKind::Green,
        || {
            w.fake.grow(grow);
            w.fake.ctx_devices.borrow_mut().insert(ctx, 0);
            // SAFETY: `p` points at the local `out`.
            unsafe { *p = green as *mut c_void };
            CUDA_SUCCESS
        },
        // SAFETY: `p` points at the local `out`, written above.
        || {
            assert_eq!(unsafe { *p } as usize, green);
            ctx
        },
        |c| w.fake.ctx_destroy(c),
    )
}

// A green context took 6 MiB on an H100 where an ordinary one took ~500: without per-process usage its
// device-wide measurement is neither replaced by the ordinary context size learned before nor taught as
// the device's context size.
#[test]
fn a_green_context_is_charged_what_it_took_not_an_ordinary_contexts_size() {
    let w = World::new(8 << 30);
    w.fake.per_process.set(false);
    assert_eq!(create_green(&w, 0xe1, 0xe2, 6 << 20), CUDA_SUCCESS);
    assert!(
        w.rec.contexts.with(0xe2, |r| r.is_some()),
        "recorded under its CUcontext"
    );
    assert_eq!(create_noisy(&w, 0xe3, 500 << 20, 83, 0), CUDA_SUCCESS);
    assert_eq!(
        w.usage(Kind::Context),
        (6 + 500) << 20,
        "the green size is not the known one"
    );
    assert_eq!(create_green(&w, 0xe4, 0xe5, 6 << 20), CUDA_SUCCESS);
    assert_eq!(
        w.usage(Kind::Context),
        (6 + 500 + 6) << 20,
        "nor is the known one the green's"
    );
}

#[test]
fn a_green_context_that_does_not_fit_is_destroyed_and_refused() {
    let w = World::new(100 << 20);
    assert_eq!(
        create_green(&w, 0xe5, 0xe6, 200 << 20),
        CUDA_ERROR_OUT_OF_MEMORY
    );
    assert!(w.fake.called("ctx_destroy 0xe6"));
    assert_eq!(w.used(), 0);
}

// Regression (issue 47's soak on an H200): the truth-up's charge of memory no hook saw stayed after the
// process's last context went (545 MiB with the driver holding nothing), until the process exited.
#[test]
fn the_last_context_of_a_device_takes_the_truth_ups_charge_with_it() {
    let w = World::new(8 << 30);
    w.fake.nvml.set(true);
    w.fake.per_process.set(true);
    w.fake.same_pid_ns.set(true);
    assert_eq!(create(&w, 0xd1, 300 << 20), CUDA_SUCCESS);
    assert_eq!(create(&w, 0xd2, 300 << 20), CUDA_SUCCESS);
    // NVML shows 200 MiB more than the slot holds (code loaded lazily): charged as module memory.
    w.fake.own_used.set((600 + 200) << 20);
    w.interposer().truth_up();
    assert_eq!(w.usage(Kind::Module), 200 << 20);
    w.interposer().context_gone(0xd1);
    assert_eq!(
        w.usage(Kind::Module),
        200 << 20,
        "another context of the device lives: kept"
    );
    w.interposer().context_gone(0xd2);
    assert_eq!(w.usage(Kind::Module), 0, "the last one went: given back");
    assert_eq!(w.used(), 0);
}
