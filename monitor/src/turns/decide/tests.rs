//! Tests of the arbiter's decisions: a GPU of 16 GiB whose members play the library (or forge, or bypass it).

use super::*;
use vgpu_ledger::region::TurnSnapshot;

mod runs_on;
mod truth;

const GIB: u64 = 1 << 30;

fn settings() -> Settings {
    Settings {
        quantum: Duration::from_secs(10),
        idle: Duration::from_secs(1),
        grace: Duration::from_secs(2),
        linger: Duration::from_secs(3),
        settle: Duration::from_millis(500),
        force: false,
    }
}

/// A GPU of 16 GiB with its members, each playing the library (or not): the turn words the arbiter
/// wrote are what the next tick reads, unless the member forges them.
struct Gpu {
    b: Board,
    now: Instant,
    ns: u64,
    members: Vec<Seen>,
    /// NVML: the last reading's time, whether a new one comes with the next tick, the device's used
    /// memory, and each member's busy flag in it.
    nvml_at: Option<Instant>,
    used: u64,
    busy: BTreeMap<String, bool>,
    /// What NVML lists each member's processes holding.
    mem: BTreeMap<String, u64>,
    frozen: Vec<String>,
    actions: Vec<Action>,
}

impl Gpu {
    fn new(s: Settings) -> Gpu {
        Gpu {
            b: Board::new(s),
            now: Instant::now(),
            ns: 5_000_000_000,
            members: vec![],
            nvml_at: None,
            used: 0,
            busy: BTreeMap::new(),
            mem: BTreeMap::new(),
            frozen: vec![],
            actions: vec![],
        }
    }

    /// A member whose processes hold `held` bytes by NVML.
    fn add(&mut self, id: &str, held: u64) {
        self.members.push(Seen {
            id: id.into(),
            turn: Some(TurnSnapshot::default()),
            held: None,
            busy: None,
        });
        self.mem.insert(id.into(), held);
    }

    fn m(&mut self, id: &str) -> &mut Seen {
        self.members.iter_mut().find(|s| s.id == id).unwrap()
    }

    fn turn(&mut self, id: &str) -> &mut TurnSnapshot {
        self.m(id).turn.as_mut().unwrap()
    }

    fn mode(&self, id: &str) -> TurnMode {
        self.members
            .iter()
            .find(|s| s.id == id)
            .unwrap()
            .turn
            .unwrap()
            .mode
    }

    /// Advances `ms` and ticks; `nvml`: a new collection comes with this tick.
    fn tick(&mut self, ms: u64, nvml: bool) -> Vec<Action> {
        self.now += Duration::from_millis(ms);
        self.ns += ms * 1_000_000;
        let n = nvml.then(|| {
            let since = self.nvml_at.replace(self.now);
            GpuNvml {
                at: self.now,
                since,
                total: 16 * GIB,
                used: self.used,
                others: 0,
            }
        });
        for s in &mut self.members {
            s.busy = n.map(|_| self.busy.get(&s.id).copied().unwrap_or(false));
            s.held = n.map(|_| self.mem.get(&s.id).copied().unwrap_or(0));
        }
        let a = self.b.tick(&Tick {
            now: self.now,
            now_ns: self.ns,
            members: &self.members,
            nvml: n,
        });
        for act in &a {
            match act {
                Action::Write { id, mode, epoch } => {
                    if let Some(t) = self.m(id).turn.as_mut() {
                        (t.mode, t.epoch) = (*mode, *epoch);
                    }
                }
                Action::Freeze { id, .. } => self.frozen.push(id.clone()),
                Action::Thaw { id } => self.frozen.retain(|f| f != id),
                Action::BusyWhileFrozen { .. } => {}
            }
        }
        self.actions.extend(a.iter().cloned());
        a
    }

    /// The library of a cooperating member at work: launches while it may (counted while holding),
    /// drains at once when told to yield, a thread waits otherwise.
    fn work(&mut self, id: &str) {
        let t = self.turn(id);
        match t.mode {
            TurnMode::Hold => {
                t.launches += 1;
                t.waiting = 0;
            }
            TurnMode::Yield => {
                t.drained = t.epoch;
                t.waiting = 1;
                t.waited_ns += 50_000_000;
            }
            TurnMode::Wait => {
                t.waiting = 1;
                t.waited_ns += 50_000_000;
            }
            _ => t.waiting = 0,
        }
    }

    /// Ticks `n` times 50 ms with `ids` at work, NVML every 20th tick (1 s).
    fn run(&mut self, n: usize, ids: &[&str]) {
        for i in 0..n {
            for id in ids {
                self.work(id);
            }
            self.tick(50, i % 20 == 19);
        }
    }

    fn grants(&self) -> u64 {
        self.b.counts.grants
    }
}

#[test]
fn two_that_fit_run_together_free_and_never_take_turns() {
    let mut g = Gpu::new(settings());
    g.add("a", 6 * GIB);
    g.add("b", 6 * GIB);
    g.used = 12 * GIB;
    g.busy = [("a".into(), true), ("b".into(), true)].into();
    g.run(200, &[]);
    assert!(!g.b.contended());
    assert_eq!((g.mode("a"), g.mode("b")), (TurnMode::Free, TurnMode::Free));
    assert_eq!(g.grants(), 0);
    assert!(
        !g.actions.iter().any(|a| matches!(
            a,
            Action::Write {
                mode: TurnMode::Yield | TurnMode::Wait | TurnMode::Hold,
                ..
            } | Action::Freeze { .. }
        )),
        "{:?}",
        g.actions
    );
}

#[test]
fn one_alone_is_free_however_large() {
    let mut g = Gpu::new(settings());
    g.add("a", 30 * GIB);
    g.add("b", 10 * GIB);
    g.used = 16 * GIB;
    g.busy = [("a".into(), true)].into();
    g.run(100, &[]);
    assert!(!g.b.contended());
    assert_eq!(g.mode("a"), TurnMode::Free);
}

#[test]
fn two_that_do_not_fit_take_turns_in_arrival_order_each_for_a_quantum() {
    let mut g = Gpu::new(settings());
    g.add("b", 10 * GIB);
    g.add("a", 10 * GIB);
    // "a" begins wanting the GPU first (NVML), "b" a second later: a comes first though b sorts first.
    g.busy = [("a".into(), true)].into();
    g.run(20, &[]);
    g.busy.insert("b".into(), true);
    g.run(20, &[]);
    assert!(g.b.contended(), "20 GiB charged on a 16 GiB GPU");
    assert_eq!(g.b.holder(), Some("a"));
    assert_eq!(g.mode("a"), TurnMode::Hold);
    assert_eq!(
        g.mode("b"),
        TurnMode::Yield,
        "b was running: it drains first"
    );
    let e0 = g.b.epoch();
    assert!(
        e0 >= g.ns - 2_000_000_000,
        "epochs start from the clock: {e0}"
    );
    g.run(2, &["a", "b"]);
    assert_eq!(g.mode("b"), TurnMode::Wait, "drained: waits");
    assert_eq!(g.b.queue().collect::<Vec<_>>(), ["b"]);
    // a works its quantum (10 s); b waits.
    let held = g.b.held_since().unwrap();
    let mut handed = None;
    for i in 0..260 {
        g.work("a");
        g.work("b");
        g.tick(50, i % 20 == 19);
        if g.b.holder() == Some("b") {
            handed = Some(g.now.duration_since(held));
            break;
        }
    }
    let handed = handed.expect("b got the GPU");
    assert!(
        handed >= Duration::from_secs(10) && handed < Duration::from_millis(10_300),
        "a held it a quantum, then drained at once: {handed:?}"
    );
    assert_eq!((g.mode("a"), g.mode("b")), (TurnMode::Wait, TurnMode::Hold));
    assert_eq!(
        g.b.queue().collect::<Vec<_>>(),
        ["a"],
        "a still wants it: back of the queue"
    );
    assert!(g.b.epoch() > e0);
    assert_eq!(g.grants(), 2);
    assert!(g.frozen.is_empty() && g.b.counts.revocations == 0);
    let waited = g.b.members().find(|m| m.0 == "b").unwrap().3;
    assert!(waited >= Duration::from_secs(9), "{waited:?}");
}

#[test]
fn an_idle_holder_hands_on_early() {
    // Its signs of wanting the GPU last 5 s: it is idle for a spell, not gone.
    let mut g = Gpu::new(Settings {
        linger: Duration::from_secs(5),
        ..settings()
    });
    g.add("a", 10 * GIB);
    g.add("b", 10 * GIB);
    g.busy = [("a".into(), true), ("b".into(), true)].into();
    g.run(40, &["a", "b"]);
    let first = g.b.holder().unwrap().to_string();
    let other = if first == "a" { "b" } else { "a" };
    // The holder stops launching: after `idle` (1 s) it is told to yield; it launches nothing, so it
    // never drains, and NVML shows it idle: handed on without a freeze.
    g.busy.insert(first.clone(), false);
    let t0 = g.now;
    for i in 0..120 {
        g.work(other);
        g.tick(50, i % 20 == 19);
        if g.b.holder() == Some(other) {
            break;
        }
    }
    assert_eq!(g.b.holder(), Some(other));
    assert!(
        g.now.duration_since(t0) <= Duration::from_millis(3100),
        "idle 1 s, then NVML shows it idle or the grace (2 s) ends: {:?}",
        g.now.duration_since(t0)
    );
    assert!(g.frozen.is_empty(), "idle is no revocation");
    assert_eq!(g.b.counts.revocations, 0);
}

#[test]
fn memory_pressure_by_nvml_alone_with_a_margin_that_does_not_flap() {
    let mut g = Gpu::new(settings());
    g.add("a", 4 * GIB);
    g.add("b", 4 * GIB);
    g.busy = [("a".into(), true), ("b".into(), true)].into();
    g.used = 15 * GIB + 900 * (1 << 20); // within 5% of 16 GiB
    g.run(40, &["a", "b"]);
    assert!(
        g.b.contended(),
        "the device is full: truth no tenant forges"
    );
    // Between one and two margins: still contended.
    g.used = 15 * GIB;
    g.run(40, &["a", "b"]);
    assert!(g.b.contended());
    // Taking turns, only the holder's pages press: 12 GiB on the device and the other's 4 GiB charged
    // would not fit together, so they go on taking turns.
    g.used = 12 * GIB;
    g.run(40, &["a", "b"]);
    assert!(
        g.b.contended(),
        "the pressure hidden by the turns still counts"
    );
    g.used = 8 * GIB;
    g.run(40, &["a", "b"]);
    assert!(
        g.b.contended(),
        "8 + 4 GiB fit, but not yet for a whole turn"
    );
    g.run(220, &["a", "b"]);
    assert!(
        !g.b.contended(),
        "8 + 4 GiB fit for a whole turn (quantum + grace)"
    );
    assert_eq!((g.mode("a"), g.mode("b")), (TurnMode::Free, TurnMode::Free));
}

#[test]
fn forced_turns_whatever_the_memory_but_only_when_two_want() {
    let mut g = Gpu::new(Settings {
        force: true,
        ..settings()
    });
    g.add("a", GIB);
    g.add("b", GIB);
    g.busy = [("a".into(), true)].into();
    g.run(40, &["a"]);
    assert!(!g.b.contended(), "one alone");
    g.busy.insert("b".into(), true);
    g.run(40, &["a", "b"]);
    assert!(g.b.contended());
}

#[test]
fn a_holder_that_never_drains_is_handed_past_after_the_grace_and_frozen_then_thawed_at_its_turn() {
    let mut g = Gpu::new(settings());
    g.add("a", 10 * GIB);
    g.add("b", 10 * GIB);
    g.busy = [("a".into(), true)].into();
    g.run(10, &[]);
    g.busy.insert("b".into(), true);
    g.run(30, &["b"]);
    assert_eq!(g.b.holder(), Some("a"));
    // a bypasses the library: its words never move, NVML shows it busy throughout.
    let held = g.b.held_since().unwrap();
    let mut handed = None;
    let mut frozen = None;
    for i in 0..400 {
        g.work("b");
        g.tick(50, i % 20 == 19);
        if handed.is_none() && g.b.holder() == Some("b") {
            handed = Some(g.now.duration_since(held));
        }
        if frozen.is_none() && g.frozen.contains(&"a".to_string()) {
            frozen = Some(g.now.duration_since(held));
            break;
        }
    }
    let (handed, frozen) = (handed.unwrap(), frozen.unwrap());
    // quantum 10 s (the bypassing holder is idle by its words: no launch counted, so it is told to
    // yield after `idle` already) + grace 2 s.
    assert!(
        handed <= Duration::from_secs(12) + Duration::from_millis(100),
        "{handed:?}"
    );
    assert!(
        frozen <= handed + Duration::from_secs(3),
        "{frozen:?} {handed:?}"
    );
    assert_eq!(g.b.counts.revocations, 1);
    assert!(g.actions.contains(&Action::Freeze {
        id: "a".into(),
        why: Why::Revoked
    }));
    assert_eq!(g.b.frozen().collect::<Vec<_>>(), ["a"]);
    assert_eq!(g.b.queue().collect::<Vec<_>>(), ["a"], "owed its turn");
    // b's quantum ends: a is thawed and holds the GPU.
    for i in 0..300 {
        g.work("b");
        g.tick(50, i % 20 == 19);
        if g.b.holder() == Some("a") {
            break;
        }
    }
    assert_eq!(g.b.holder(), Some("a"));
    assert!(g.frozen.is_empty());
    assert!(g.actions.contains(&Action::Thaw { id: "a".into() }));
}

#[test]
fn a_forged_hold_while_another_holds_is_rewritten_and_frozen_out_of_turn() {
    let mut g = Gpu::new(settings());
    g.add("a", 10 * GIB);
    g.add("b", 10 * GIB);
    g.busy = [("a".into(), true)].into();
    g.run(10, &["a"]);
    g.busy.insert("b".into(), true);
    g.run(40, &["a", "b"]);
    assert_eq!((g.b.holder(), g.mode("b")), (Some("a"), TurnMode::Wait));
    // b writes Hold into its own words and launches (NVML busy).
    g.turn("b").mode = TurnMode::Hold;
    let a = g.tick(50, false);
    assert!(
        a.iter()
            .any(|a| matches!(a, Action::Write { id, mode: TurnMode::Wait, .. } if id == "b")),
        "the forged word is told again: {a:?}"
    );
    for i in 0..60 {
        g.turn("b").mode = TurnMode::Hold;
        g.work("a");
        g.tick(50, i % 20 == 19);
    }
    assert!(g.frozen.contains(&"b".to_string()));
    assert_eq!(g.b.counts.out_of_turn, 1);
    assert_eq!(g.b.counts.revocations, 0);
    assert_eq!(g.b.holder(), Some("a"), "the holder keeps the GPU");
}

#[test]
fn a_container_without_the_library_is_seen_by_nvml_alone_and_caught() {
    let mut g = Gpu::new(settings());
    g.add("a", 10 * GIB);
    g.add("x", 10 * GIB);
    g.m("x").turn = None; // no ledger words at all: the preload is gone
    g.busy = [("a".into(), true)].into();
    g.run(30, &["a"]);
    g.busy.insert("x".into(), true);
    g.run(200, &["a"]);
    assert!(g.b.contended(), "x wants the GPU by NVML alone");
    // Whoever held first, x was caught busy while told to stop, or holds now.
    let x_frozen = g.frozen.contains(&"x".to_string());
    assert!(x_frozen || g.b.holder() == Some("x"), "{:?}", g.actions);
    assert!(g.b.counts.out_of_turn + g.b.counts.revocations >= 1);
}

#[test]
fn contention_ends_everyone_free_and_thawed_and_a_gone_member_is_thawed_and_forgotten() {
    let mut g = Gpu::new(settings());
    g.add("a", 10 * GIB);
    g.add("b", 10 * GIB);
    g.add("c", 10 * GIB);
    g.busy = [("a".into(), true)].into();
    g.run(10, &["a"]);
    g.busy.insert("b".into(), true);
    g.busy.insert("c".into(), true);
    g.run(80, &["a"]);
    assert_eq!(g.b.holder(), Some("a"));
    assert!(g.frozen.contains(&"b".into()) && g.frozen.contains(&"c".into()));
    // c ends: thawed (its cgroup may be gone: harmless) and forgotten.
    g.members.retain(|s| s.id != "c");
    g.busy.remove("c");
    let a = g.tick(50, false);
    assert!(a.contains(&Action::Thaw { id: "c".into() }));
    assert!(!g.b.members().any(|m| m.0 == "c"));
    // b stops wanting (nothing more from it): it is still owed its turn, gets it after a's quantum, is
    // idle by NVML and handed back; then one wants: not contended, all free and thawed.
    g.busy.insert("b".into(), false);
    g.b.not_frozen("b");
    g.frozen.retain(|f| f != "b");
    g.run(400, &["a"]);
    assert!(!g.b.contended());
    assert_eq!((g.mode("a"), g.mode("b")), (TurnMode::Free, TurnMode::Free));
    assert!(g.frozen.is_empty());
}

#[test]
fn the_holder_gone_hands_on_at_once() {
    let mut g = Gpu::new(settings());
    g.add("a", 10 * GIB);
    g.add("b", 10 * GIB);
    g.add("c", 10 * GIB);
    g.busy = [("a".into(), true), ("b".into(), true), ("c".into(), true)].into();
    g.run(40, &["a", "b", "c"]);
    let h = g.b.holder().unwrap().to_string();
    g.members.retain(|s| s.id != h);
    g.tick(50, false);
    let next = g.b.holder().unwrap();
    assert_ne!(next, h);
    assert_eq!(g.mode(next), TurnMode::Hold);
}

#[test]
fn without_nvml_no_pressure_is_known_and_nothing_is_frozen() {
    let mut g = Gpu::new(settings());
    g.add("a", 10 * GIB);
    g.add("b", 10 * GIB);
    for _ in 0..100 {
        g.work("a");
        g.work("b");
        g.tick(50, false);
    }
    assert!(!g.b.contended());
    assert!(g.frozen.is_empty());
}

/// A thread killed while it waited leaves `waiting` at 1 for good; its `waited_ns` stands still, so it is
/// no sign of wanting the GPU: the contention ends with the other's.
#[test]
fn a_waiting_count_whose_time_stands_still_is_no_sign() {
    let mut g = Gpu::new(settings());
    g.add("a", 10 * GIB);
    g.add("b", 10 * GIB);
    g.busy = [("a".into(), true), ("b".into(), true)].into();
    g.run(40, &["a", "b"]);
    assert!(g.b.contended());
    let waiter = g.b.queue().next().unwrap().to_string();
    // The waiter's process dies inside the wait: its count stays, its time does not move, NVML sees
    // nothing of it any more.
    g.busy.insert(waiter.clone(), false);
    g.turn(&waiter).waiting = 1;
    let holder = g.b.holder().unwrap().to_string();
    // It is owed its turn (it wanted the GPU when told to wait): it gets it after the holder's quantum,
    // is idle by NVML, is handed back without a place in the queue, and the turns end.
    g.run(400, &[holder.as_str()]);
    assert!(!g.b.contended(), "{:?}", g.b.members().collect::<Vec<_>>());
    assert!(g.frozen.is_empty());
}

/// A holder whose last pass was still running when its quantum ended (a long kernel: the library drains
/// only at its next launch) drained within the grace; NVML's first reading after the drain still averages
/// the pass it ran before. That work was its own turn's, not out of turn: it must not be frozen.
#[test]
fn work_in_flight_at_a_yield_then_drained_is_not_out_of_turn() {
    let mut g = Gpu::new(settings());
    g.add("a", 10 * GIB);
    g.add("b", 10 * GIB);
    g.busy = [("a".into(), true)].into();
    g.run(10, &["a"]);
    // b, a cooperating library, is busy by NVML exactly while it may run
    let b_runs = |g: &Gpu| matches!(g.mode("b"), TurnMode::Free | TurnMode::Hold);
    g.busy.insert("b".into(), true);
    for i in 0..40 {
        g.work("a");
        g.work("b");
        g.tick(50, i % 20 == 19);
        let r = b_runs(&g);
        g.busy.insert("b".into(), r);
    }
    assert_eq!((g.b.holder(), g.mode("b")), (Some("a"), TurnMode::Wait));
    let (mut yielded, mut drained, mut quiet) = (None, None, false);
    for i in 0..400 {
        let nvml = i % 20 == 19;
        if yielded.is_none() && g.mode("a") == TurnMode::Yield {
            yielded = Some(i);
        }
        match (yielded, drained) {
            (None, _) => g.work("a"),
            // its pass runs on for 1.5 s after the yield (within the 2 s grace), then it drains
            (Some(y), None) if i >= y + 30 => {
                g.work("a");
                drained = Some(i);
            }
            (Some(_), None) => {}
            (Some(_), Some(_)) => g.work("a"),
        }
        g.work("b");
        g.tick(50, nvml);
        let r = b_runs(&g);
        g.busy.insert("b".into(), r);
        if nvml && drained.is_some() && !quiet {
            // the first reading after the drain covered the pass; from now on NVML sees it idle
            quiet = true;
            g.busy.insert("a".into(), false);
        }
        if drained.is_some_and(|d| i > d + 80) {
            break;
        }
    }
    assert!(drained.is_some(), "a was told to yield and drained");
    assert!(!g.frozen.contains(&"a".to_string()), "{:?}", g.actions);
    assert_eq!((g.b.counts.out_of_turn, g.b.counts.revocations), (0, 0));
    assert_eq!(g.b.holder(), Some("b"));
}
