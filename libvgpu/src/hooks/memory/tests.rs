//! Unit tests of `hooks/memory`: plain, pitch and managed memory charged and freed on the fake driver.

use super::super::testing::World;
use super::*;

#[test]
fn pitch_is_trued_up_to_what_the_driver_padded() {
    let w = World::new(1 << 20);
    let e = w.interposer();
    // 100 x 10 estimated at 512 x 10; the driver padded rows to 1024
    let r = e.alloc_pitch(100, 10, || 0, || (0x40, 1024), |_, _| panic!());
    assert_eq!(r, CUDA_SUCCESS);
    assert_eq!(w.used(), 10240);
    assert_eq!(w.rec.allocs.with(0x40, |r| r.map(|r| r.bytes)), Some(10240));
}

#[test]
fn pitch_that_does_not_fit_once_padded_is_freed_and_refused() {
    let w = World::new(6000);
    let e = w.interposer();
    // the estimate (512 x 10 = 5120) fits; the driver's pitch (1024 x 10) does not
    let r = e.alloc_pitch(100, 10, || 0, || (0x80, 1024), |_, _| panic!());
    assert_eq!(r, CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(w.used(), 0, "nothing stays charged");
    assert!(
        w.fake.called("mem_free 0x80"),
        "the driver's allocation is freed again"
    );
    assert!(w.rec.allocs.keys().is_empty());
}

#[test]
fn pitch_refused_up_front_never_reaches_the_driver() {
    let w = World::new(1000);
    let e = w.interposer();
    let r = e.alloc_pitch(
        4096,
        4096,
        || panic!("driver called"),
        || (0, 0),
        |_, _| panic!(),
    );
    assert_eq!(r, CUDA_ERROR_OUT_OF_MEMORY);
}

#[test]
fn managed_and_plain_are_charged_by_kind() {
    let w = World::new(1000);
    let e = w.interposer();
    e.charged_call(
        &w.rec.allocs,
        Kind::Managed,
        100,
        e.target_current(),
        || 0,
        || 1,
    );
    e.charged_call(
        &w.rec.allocs,
        Kind::Data,
        200,
        e.target_current(),
        || 0,
        || 2,
    );
    assert_eq!((w.usage(Kind::Managed), w.usage(Kind::Data)), (100, 200));
}

fn spill_world(limit: u64, budget: u64) -> World {
    World::with_memory(
        limit,
        MemoryMode::Spill {
            spill_limit: budget,
        },
    )
}

#[test]
fn spill_serves_past_the_quota_from_the_budget_and_refunds_exactly() {
    let w = spill_world(1000, 3000);
    let e = w.interposer();
    let out = Cell::new(0);
    // within the quota: the driver's own allocation, as in plain mode
    let r = e.alloc_plain(600, || 0, || 0x10, |_| panic!("not managed"));
    assert_eq!((r, w.used(), w.q.spilled()), (CUDA_SUCCESS, 600, 0));
    // past the quota: managed memory preferring the host, charged to the spill budget only
    let r = e.alloc_plain(
        900,
        || panic!("driver asked past the quota"),
        || 0,
        |p| out.set(p),
    );
    assert_eq!((r, w.used(), w.q.spilled()), (CUDA_SUCCESS, 600, 900));
    assert!(w.fake.called("alloc_managed 900 dev 0 host"));
    let spilled = out.get();
    assert!(w.rec.allocs.with(spilled, |r| r.unwrap().spilled));
    // the device refusing (other tenants) spills too, with its charge given back
    let r = e.alloc_plain(300, || CUDA_ERROR_OUT_OF_MEMORY, || 0, |p| out.set(p));
    assert_eq!((r, w.used(), w.q.spilled()), (CUDA_SUCCESS, 600, 1200));
    // past the budget: the ordinary out-of-memory, nothing charged
    let r = e.alloc_plain(
        2000,
        || panic!(),
        || 0,
        |_| panic!("served past the budget"),
    );
    assert_eq!(
        (r, w.used(), w.q.spilled()),
        (CUDA_ERROR_OUT_OF_MEMORY, 600, 1200)
    );
    // frees refund the book each was charged to
    assert_eq!(e.tracked_free(&w.rec.allocs, spilled, || 0), CUDA_SUCCESS);
    assert_eq!((w.used(), w.q.spilled()), (600, 300));
    assert_eq!(e.tracked_free(&w.rec.allocs, 0x10, || 0), CUDA_SUCCESS);
    assert_eq!((w.used(), w.q.spilled()), (0, 300));
    assert_eq!(e.tracked_free(&w.rec.allocs, out.get(), || 0), CUDA_SUCCESS);
    assert_eq!((w.used(), w.q.spilled()), (0, 0));
}

#[test]
fn spill_keeps_room_in_the_quota_for_lazily_loaded_code() {
    let w = spill_world(1600, 1 << 20);
    let e = w.interposer();
    let out = Cell::new(0);
    assert_eq!(code_room(1600), 100);
    assert_eq!(code_room(64 << 30), 256 << 20, "at most 256 MiB");
    // 1550 would leave 50 of the 100: spilled, the device part left alone
    let r = e.alloc_plain(
        1550,
        || panic!("device memory into the code's room"),
        || 0,
        |p| out.set(p),
    );
    assert_eq!((r, w.used(), w.q.spilled()), (CUDA_SUCCESS, 0, 1550));
    // 1500 leaves the room: device memory
    assert_eq!(
        e.alloc_plain(1500, || 0, || 0x10, |_| panic!()),
        CUDA_SUCCESS
    );
    assert_eq!(w.used(), 1500);
    // what the truth-up charged for this process's code comes out of the room
    w.rec.truth_charged.update(0, || 0, |c| *c = 60);
    assert_eq!(e.alloc_plain(50, || 0, || 0x20, |_| panic!()), CUDA_SUCCESS);
    assert_eq!(w.used(), 1550);
    // pitch too: 512 x 16 fits the quota of 8192 but not its room of 512; 512 x 15 does
    let w = spill_world(8192, 1 << 20);
    let e = w.interposer();
    let r = e.alloc_pitch(
        100,
        16,
        || panic!("device pitch into the code's room"),
        || (0, 0),
        |_, _| (),
    );
    assert_eq!((r, w.used(), w.q.spilled()), (CUDA_SUCCESS, 0, 8192));
    let r = e.alloc_pitch(100, 15, || 0, || (0x40, 512), |_, _| panic!());
    assert_eq!((r, w.used()), (CUDA_SUCCESS, 7680));
}

#[test]
fn ipc_of_memory_served_managed_is_refused_and_device_memory_passes() {
    let w = spill_world(1000, 3000);
    let e = w.interposer();
    let out = Cell::new(0);
    assert_eq!(
        e.alloc_plain(600, || 0, || 0x10, |_| panic!()),
        CUDA_SUCCESS
    );
    assert_eq!(
        e.alloc_plain(900, || panic!(), || 0, |p| out.set(p)),
        CUDA_SUCCESS
    );
    let mut asked = 0;
    assert_eq!(
        e.ipc_handle(
            0x10,
            || {
                asked += 1;
                CUDA_SUCCESS
            },
            || [0; 64]
        ),
        CUDA_SUCCESS
    );
    assert_eq!(
        e.ipc_handle(
            out.get(),
            || {
                asked += 1;
                CUDA_SUCCESS
            },
            || [0; 64]
        ),
        CUDA_ERROR_NOT_SUPPORTED
    );
    // unknown pointers (the application's own managed memory, another library's) go to the driver
    assert_eq!(
        e.ipc_handle(
            0x99,
            || {
                asked += 1;
                1
            },
            || [0; 64]
        ),
        1
    );
    assert_eq!(asked, 2);
    let o = World::with_memory(1000, MemoryMode::Oversubscribe { reserve: 0 });
    let e = o.interposer();
    assert_eq!(
        e.alloc_plain(100, || panic!(), || 0, |p| out.set(p)),
        CUDA_SUCCESS
    );
    assert_eq!(
        e.ipc_handle(out.get(), || CUDA_SUCCESS, || [0; 64]),
        CUDA_ERROR_NOT_SUPPORTED
    );
}

#[test]
fn a_spill_the_driver_refuses_gives_the_budget_back() {
    let w = spill_world(100, 1000);
    w.fake.managed_error.set(CUDA_ERROR_INVALID_VALUE);
    let r = w
        .interposer()
        .alloc_plain(500, || panic!(), || 0, |_| panic!());
    assert_eq!(
        (r, w.used(), w.q.spilled()),
        (CUDA_ERROR_INVALID_VALUE, 0, 0)
    );
    assert!(w.rec.allocs.keys().is_empty());
}

#[test]
fn spilled_pitch_memory_gets_padded_rows() {
    let w = spill_world(1000, 1 << 20);
    let got = Cell::new((0, 0));
    let r = w.interposer().alloc_pitch(
        100,
        10,
        || panic!(),
        || (0, 0),
        |p, pitch| got.set((p, pitch)),
    );
    assert_eq!(r, CUDA_SUCCESS);
    assert_eq!(got.get().1, 512);
    assert_eq!((w.used(), w.q.spilled()), (0, 5120));
}

#[test]
fn oversubscribe_serves_everything_managed_against_the_quota() {
    let w = World::with_memory(1000, MemoryMode::Oversubscribe { reserve: 100 });
    let e = w.interposer();
    let out = Cell::new(0);
    let r = e.alloc_plain(
        600,
        || panic!("device memory in oversubscribe mode"),
        || 0,
        |p| out.set(p),
    );
    assert_eq!((r, w.used()), (CUDA_SUCCESS, 600));
    assert!(w.fake.called("alloc_managed 600 dev 0 any"));
    // the quota still caps the total
    let r = e.alloc_plain(600, || panic!(), || 0, |_| panic!());
    assert_eq!(r, CUDA_ERROR_OUT_OF_MEMORY);
    // cuMemGetInfo: the quota as the size (past the device's), free less the reserve
    assert_eq!(e.mem_info_view(10, 20), Ok((300, 1000)));
    assert_eq!(e.tracked_free(&w.rec.allocs, out.get(), || 0), CUDA_SUCCESS);
    assert_eq!(w.used(), 0);
    let r = e.alloc_pitch(
        100,
        1,
        || panic!(),
        || (0, 0),
        |_, pitch| assert_eq!(pitch, 512),
    );
    assert_eq!((r, w.used()), (CUDA_SUCCESS, 512));
}
