//! Whose word counts (issue 44): a container's ledger words may cost that container alone. The forger
//! of waiting words, the one that holds next to nothing with tiny kernels, and the one whose `launches`
//! move while NVML sees it idle never make an honest neighbour wait longer than its own work does.

use super::*;

/// A holder that NVML sees busy with 12 GiB of a 16 GiB GPU, and a member `x` that holds `x_gib` GiB by
/// NVML and is busy (tiny kernels).
fn beside(x_gib: u64) -> Gpu {
    let mut g = Gpu::new(settings());
    g.add("honest", 12 * GIB);
    g.add("x", x_gib * GIB / 4);
    g.used = 12 * GIB + x_gib * GIB / 4;
    g.busy = [("honest".into(), true), ("x".into(), true)].into();
    g
}

#[test]
fn tiny_kernels_beside_a_full_device_take_no_turns_when_they_hold_next_to_nothing() {
    // x holds 256 MiB (the unforged attack: managed memory never touched is not on the device, NVML
    // lists only its context), its kernels keep NVML's reading busy; the device is at 95% by the honest
    // one's own working set. Taking turns would free nothing: no turns.
    let mut g = beside(1);
    g.used = 15 * GIB + 300 * (1 << 20);
    g.run(200, &["honest", "x"]);
    assert!(!g.b.contended(), "{:?}", g.b.why);
    assert_eq!(g.grants(), 0);
    assert_eq!(g.mode("honest"), TurnMode::Free);
}

#[test]
fn forged_waiting_words_buy_one_idle_turn_then_are_not_heard() {
    // Two real working sets that do not fit: they take turns. Then b's processes stop using the GPU
    // (NVML idle) but its ledger keeps saying a thread waits, its time moving.
    let mut g = Gpu::new(settings());
    g.add("a", 10 * GIB);
    g.add("b", 10 * GIB);
    g.busy = [("a".into(), true)].into();
    g.run(20, &["a"]);
    g.busy.insert("b".into(), true);
    g.run(40, &["a", "b"]);
    assert!(g.b.contended());
    let mut b_held = Duration::ZERO;
    let mut holds = 0;
    let mut was = g.b.holder().map(str::to_string);
    // a works throughout; b, when told to wait, forges a waiting thread and never launches
    for i in 0..1200 {
        g.busy
            .insert("b".into(), g.b.holder() == Some("b") && i < 40);
        g.work("a");
        let t = g.turn("b");
        if t.mode == TurnMode::Wait {
            t.waiting = 1;
            t.waited_ns += 50_000_000;
        }
        g.tick(50, i % 20 == 19);
        let now = g.b.holder().map(str::to_string);
        if now.as_deref() == Some("b") {
            b_held += Duration::from_millis(50);
            if was.as_deref() != Some("b") {
                holds += 1;
            }
        }
        was = now;
    }
    // 60 s: b's forged words bought it at most one idle turn (idle 1 s after a reading, then the grace)
    // after its owed one; a kept the GPU for the rest.
    assert!(holds <= 2, "{holds} turns");
    assert!(b_held <= Duration::from_secs(16), "{b_held:?}");
    assert!(g.frozen.is_empty(), "{:?}", g.actions);
}

#[test]
fn a_holders_own_launches_do_not_keep_an_idle_turn() {
    // The holder's processes go idle by NVML while its words say it launches: the other runs within
    // seconds (handed the turn, or the turns end as one alone wants the GPU), not at the quantum's end.
    let mut g = Gpu::new(settings());
    g.add("a", 10 * GIB);
    g.add("b", 10 * GIB);
    g.busy = [("a".into(), true), ("b".into(), true)].into();
    g.run(40, &["a", "b"]);
    let first = g.b.holder().unwrap().to_string();
    let other = if first == "a" { "b" } else { "a" };
    g.busy.insert(first.clone(), false);
    let t0 = g.now;
    for i in 0..200 {
        g.turn(&first).launches += 5;
        g.work(other);
        g.tick(50, i % 20 == 19);
        if matches!(g.mode(other), TurnMode::Hold | TurnMode::Free) {
            break;
        }
    }
    assert!(
        matches!(g.mode(other), TurnMode::Hold | TurnMode::Free),
        "{:?}",
        g.actions
    );
    assert!(
        g.now.duration_since(t0) < Duration::from_secs(5),
        "idle by NVML: {:?}",
        g.now.duration_since(t0)
    );
}
