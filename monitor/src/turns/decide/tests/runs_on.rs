//! Work that runs on while frozen (`busy_while_frozen`): found only in readings that begin the grace after
//! the freeze, once per freeze; a queue that drains within the grace is never found.

use super::*;
use crate::turns::decide::runs_on::runs_on_while_frozen;

/// x bypasses the library (no ledger words) and is busy by NVML; a holds the GPU first: x is frozen out of
/// turn. Returns the GPU just after the freeze.
fn x_frozen_out_of_turn() -> Gpu {
    let mut g = Gpu::new(settings());
    g.add("a", 10 * GIB);
    g.add("x", 10 * GIB);
    g.m("x").turn = None;
    g.busy = [("a".into(), true)].into();
    g.run(30, &["a"]);
    g.busy.insert("x".into(), true);
    for i in 0..200 {
        g.work("a");
        g.tick(50, i % 20 == 19);
        if g.frozen.contains(&"x".to_string()) {
            break;
        }
    }
    assert_eq!(g.b.holder(), Some("a"));
    assert_eq!(g.b.counts.out_of_turn, 1, "{:?}", g.actions);
    g
}

fn found(a: &[Action]) -> Vec<(String, bool)> {
    a.iter()
        .filter_map(|a| match a {
            Action::BusyWhileFrozen { id, begins, .. } => Some((id.clone(), *begins)),
            _ => None,
        })
        .collect()
}

#[test]
fn the_rule_counts_only_readings_that_begin_the_grace_after_the_freeze() {
    let t = Instant::now();
    let (grace, settle) = (Duration::from_secs(2), Duration::from_millis(500));
    let at = |ms: u64| Some(t + Duration::from_millis(ms));
    assert!(runs_on_while_frozen(t, true, at(2000), grace, settle));
    assert!(!runs_on_while_frozen(t, true, at(1999), grace, settle));
    assert!(!runs_on_while_frozen(t, false, at(5000), grace, settle));
    assert!(!runs_on_while_frozen(t, true, None, grace, settle));
    // A grace shorter than NVML's sample tail: the tail still keeps what ran before the freeze out.
    let short = Duration::from_millis(100);
    assert!(!runs_on_while_frozen(t, true, at(400), short, settle));
    assert!(runs_on_while_frozen(t, true, at(500), short, settle));
}

#[test]
fn a_frozen_container_still_busy_past_the_grace_is_found_once_per_freeze() {
    let mut g = x_frozen_out_of_turn();
    let froze = g.now;
    let mut first = None;
    // 5 s frozen (a holds for its quantum of 10 s): NVML shows x busy throughout.
    for i in 0..100 {
        g.work("a");
        let a = g.tick(50, i % 20 == 19);
        let f = found(&a);
        if !f.is_empty() && first.is_none() {
            first = Some(g.now.duration_since(froze));
            assert_eq!(f, [("x".to_string(), true)]);
        } else {
            assert!(f.iter().all(|(id, begins)| id == "x" && !begins), "{f:?}");
        }
    }
    let first = first.expect("found");
    // The first reading that begins 2 s (the grace) after the freeze ends a reading (1 s) later.
    assert!(
        first >= Duration::from_secs(3) && first <= Duration::from_secs(4),
        "{first:?}"
    );
    assert_eq!(g.b.counts.busy_while_frozen, 1);
    assert!(
        g.frozen.contains(&"x".to_string()),
        "reporting keeps the freeze"
    );
    assert!(found(&g.actions).len() >= 2, "each busy reading says so");
    // Its turn thaws it; frozen again out of turn later, that freeze is counted again.
    for i in 0..400 {
        g.work("a");
        g.tick(50, i % 20 == 19);
        if g.b.holder() == Some("x") {
            break;
        }
    }
    assert!(g.frozen.is_empty(), "thawed at its turn");
    for i in 0..600 {
        g.work("a");
        g.tick(50, i % 20 == 19);
        if g.b.counts.busy_while_frozen == 2 {
            break;
        }
    }
    assert_eq!(g.b.counts.busy_while_frozen, 2, "{:?}", g.b.counts);
}

#[test]
fn a_queue_that_drains_within_the_grace_is_never_found() {
    let mut g = x_frozen_out_of_turn();
    // The reading that spans the freeze still shows it busy (its queue drains); then NVML shows it idle.
    g.run(20, &["a"]);
    g.busy.insert("x".into(), false);
    g.run(100, &["a"]);
    assert!(found(&g.actions).is_empty(), "{:?}", g.actions);
    assert_eq!(g.b.counts.busy_while_frozen, 0);
}
