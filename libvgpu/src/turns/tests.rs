//! The turn gate (`turns`) over a real ledger's turn area: each mode, the drain of a yield, the stale
//! heartbeat, and which devices and launches the gate leaves alone (through the fake driver seam).

use super::*;
use crate::hooks::testing::World;
use std::sync::Arc;
use vgpu_ledger::region::TurnSnapshot;

/// A pace that makes a still heartbeat stale after 100 ms.
const FAST: Pace = Pace {
    first_nap: Duration::from_micros(50),
    max_nap: Duration::from_millis(1),
    stale: Duration::from_millis(100),
};

fn world() -> World {
    World::with_memory(1 << 30, MemoryMode::Oversubscribe { reserve: 0 })
}

fn snap(w: &World) -> TurnSnapshot {
    w.q.ledger().turn().snapshot()
}

/// A thread that plays the arbiter: beats every 10 ms, and after `after` sets `mode` (same epoch).
fn arbiter(
    w: &World,
    after: Duration,
    mode: TurnMode,
    epoch: u64,
) -> (Arc<AtomicBool>, std::thread::JoinHandle<()>) {
    let q = w.q;
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let h = std::thread::spawn(move || {
        let t0 = Instant::now();
        let mut beat = 100;
        let mut switched = false;
        while !s.load(Relaxed) {
            beat += 1;
            let turn = q.ledger().turn();
            if !switched && t0.elapsed() >= after {
                turn.set(mode, epoch, beat);
                switched = true;
            } else {
                turn.heartbeat.store(beat, Relaxed);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    (stop, h)
}

fn fresh_stale() -> AtomicU64 {
    AtomicU64::new(NO_BEAT)
}

#[test]
fn unmanaged_and_free_go_at_once_and_hold_is_counted() {
    let w = world();
    let turn = w.q.ledger().turn();
    let stale = fresh_stale();
    let never = || -> bool { panic!("no drain without a yield") };
    assert_eq!(admit(turn, &stale, &FAST, || true, never), Passed::Now);
    turn.set(TurnMode::Free, 1, 5);
    assert_eq!(admit(turn, &stale, &FAST, || true, never), Passed::Now);
    assert_eq!(
        snap(&w).launches,
        0,
        "launches are counted only while holding"
    );
    turn.set(TurnMode::Hold, 2, 6);
    assert_eq!(admit(turn, &stale, &FAST, || true, never), Passed::Now);
    assert_eq!(admit(turn, &stale, &FAST, || true, never), Passed::Now);
    assert_eq!(snap(&w).launches, 2);
    assert_eq!(snap(&w).waiting, 0);
}

#[test]
fn wait_holds_the_launch_until_the_turn_comes_and_counts_the_wait() {
    let w = world();
    let turn = w.q.ledger().turn();
    turn.set(TurnMode::Wait, 7, 100);
    let (stop, h) = arbiter(&w, Duration::from_millis(150), TurnMode::Hold, 8);
    let waiting_seen = {
        let q = w.q;
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(60));
            let a = q.ledger().turn().snapshot();
            std::thread::sleep(Duration::from_millis(40));
            let b = q.ledger().turn().snapshot();
            (a.waiting, b.waited_ns > a.waited_ns && a.waited_ns > 0)
        })
    };
    let t0 = Instant::now();
    let passed = admit(turn, &fresh_stale(), &FAST, || true, || panic!("no yield"));
    let took = t0.elapsed();
    stop.store(true, Relaxed);
    h.join().unwrap();
    assert_eq!(passed, Passed::Waited);
    assert!(took >= Duration::from_millis(140), "went after {took:?}");
    assert_eq!(
        waiting_seen.join().unwrap(),
        (1, true),
        "counted as waiting while it waited, its time summed as it goes"
    );
    let s = snap(&w);
    assert_eq!(
        (s.waiting, s.launches),
        (0, 1),
        "no longer waiting; its launch counted under Hold"
    );
    assert!(s.waited_ns >= 140_000_000, "waited {} ns", s.waited_ns);
}

#[test]
fn yield_drains_records_the_epoch_then_waits() {
    let w = world();
    let turn = w.q.ledger().turn();
    turn.set(TurnMode::Yield, 41, 100);
    let (stop, h) = arbiter(&w, Duration::from_millis(100), TurnMode::Free, 41);
    let mut drains = 0;
    let passed = admit(
        turn,
        &fresh_stale(),
        &FAST,
        || true,
        || {
            drains += 1;
            true
        },
    );
    stop.store(true, Relaxed);
    h.join().unwrap();
    assert_eq!(passed, Passed::Waited);
    assert_eq!(drains, 1, "one drain per yield");
    assert_eq!(snap(&w).drained, 41);
}

#[test]
fn a_failed_drain_is_not_reported_as_drained() {
    let w = world();
    let turn = w.q.ledger().turn();
    turn.set(TurnMode::Yield, 9, 100);
    let (stop, h) = arbiter(&w, Duration::from_millis(50), TurnMode::Wait, 9);
    let (stop2, h2) = {
        let q = w.q;
        let s = Arc::new(AtomicBool::new(false));
        let s2 = s.clone();
        (
            s,
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(120));
                q.ledger().turn().set(TurnMode::Hold, 10, 1_000);
                while !s2.load(Relaxed) {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }),
        )
    };
    let passed = admit(turn, &fresh_stale(), &FAST, || true, || false);
    stop.store(true, Relaxed);
    stop2.store(true, Relaxed);
    h.join().unwrap();
    h2.join().unwrap();
    assert_eq!(passed, Passed::Waited);
    assert_eq!(
        snap(&w).drained,
        0,
        "the driver did not finish: the arbiter must not think so"
    );
}

#[test]
fn a_drain_that_outlives_its_yield_does_not_answer_the_next_turn() {
    let w = world();
    let turn = w.q.ledger().turn();
    turn.set(TurnMode::Yield, 3, 100);
    let q = w.q;
    let passed = admit(
        turn,
        &fresh_stale(),
        &FAST,
        || true,
        || {
            // While this process drained, the arbiter moved on: this process holds the turn of epoch 4.
            q.ledger().turn().set(TurnMode::Hold, 4, 200);
            true
        },
    );
    assert_eq!(passed, Passed::Waited);
    assert_eq!(snap(&w).drained, 0);
}

#[test]
fn a_still_heartbeat_lets_launches_go_and_a_moving_one_is_obeyed_again() {
    let w = world();
    let turn = w.q.ledger().turn();
    turn.set(TurnMode::Wait, 5, 777);
    let stale = fresh_stale();
    let t0 = Instant::now();
    assert_eq!(admit(turn, &stale, &FAST, || true, || true), Passed::Stale);
    assert!(t0.elapsed() >= FAST.stale, "went after {:?}", t0.elapsed());
    assert_eq!(snap(&w).waiting, 0);
    // The next launch does not wait the stale time again while the heartbeat stays where it stood.
    let t1 = Instant::now();
    assert_eq!(admit(turn, &stale, &FAST, || true, || true), Passed::Stale);
    assert!(
        t1.elapsed() < Duration::from_millis(50),
        "{:?}",
        t1.elapsed()
    );
    // The arbiter is back: it beats, and its Wait holds again until its Hold.
    turn.set(TurnMode::Wait, 6, 778);
    let (stop, h) = arbiter(&w, Duration::from_millis(150), TurnMode::Hold, 7);
    let t2 = Instant::now();
    assert_eq!(admit(turn, &stale, &FAST, || true, || true), Passed::Waited);
    assert!(t2.elapsed() >= Duration::from_millis(140));
    stop.store(true, Relaxed);
    h.join().unwrap();
}

#[test]
fn a_captured_launch_never_waits() {
    let w = world();
    let turn = w.q.ledger().turn();
    turn.set(TurnMode::Wait, 1, 100);
    let t0 = Instant::now();
    assert_eq!(
        admit(turn, &fresh_stale(), &FAST, || false, || true),
        Passed::Captured
    );
    assert!(t0.elapsed() < FAST.stale);
    assert_eq!(snap(&w).waiting, 0);
}

#[test]
fn gate_leaves_plain_and_unlimited_devices_alone() {
    // A plain quota in Wait: a tenant's own words on a GPU that is not oversubscribed never block it.
    let w = World::new(1 << 30);
    w.q.ledger().turn().set(TurnMode::Wait, 1, 1);
    let t0 = Instant::now();
    assert_eq!(
        gate(&w.fake, 0, w.fake.home, std::ptr::null_mut()),
        Passed::Now
    );
    assert!(t0.elapsed() < Duration::from_millis(50));
    // A device with no quota at all.
    assert_eq!(
        gate(&w.fake, 5, w.fake.home, std::ptr::null_mut()),
        Passed::Now
    );
}

#[test]
fn gate_drains_the_launch_context_through_the_driver_on_a_yield() {
    let w = world();
    w.q.ledger().turn().set(TurnMode::Yield, 12, 1);
    STALE_BEAT[0].store(NO_BEAT, Relaxed);
    let q = w.q;
    let h = std::thread::spawn(move || {
        // The arbiter, once the drain is recorded, hands the turn back.
        for _ in 0..2000 {
            if q.ledger().turn().snapshot().drained == 12 {
                q.ledger().turn().set(TurnMode::Hold, 13, 2);
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        false
    });
    let ctx = 0x77;
    assert_eq!(gate(&w.fake, 0, ctx, std::ptr::null_mut()), Passed::Waited);
    assert!(h.join().unwrap(), "the drain was recorded");
    assert!(w.fake.called(&format!("ctx_sync {ctx:#x}")));
    // Captured launches (the graph's launch is gated instead) and the drain's driver call: none more.
    w.q.ledger().turn().set(TurnMode::Wait, 14, 3);
    w.fake.capturing.borrow_mut().push(0);
    assert_eq!(
        gate(&w.fake, 0, ctx, std::ptr::null_mut()),
        Passed::Captured
    );
}
