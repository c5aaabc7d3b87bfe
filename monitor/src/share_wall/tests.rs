//! The share wall's decisions under a fake clock: a bypassing process held near its share plus the
//! tolerance, an honest one never, a finding once per episode, time and debt bounded; floors (issue 42):
//! a borrower held to its entitlement while a busy floor is starved on a saturated GPU, never otherwise.

use super::*;

const S: Duration = Duration::from_secs(1);

fn settings() -> Settings {
    Settings {
        window: Duration::from_secs(10),
        tolerance: 0.05,
    }
}

fn use_(busy: f64, share: f64) -> Use {
    Use {
        container: "c".into(),
        gpu: "GPU-0".into(),
        share,
        request: share,
        requested: false,
        busy,
        gpu_busy: busy,
        burst: share * (1.0 - share),
        frozen: 0.0,
    }
}

/// A wall that has seen container `c` once at `t0` (its first measurement, which only starts its clock).
fn started(w: &mut Wall, t0: Instant, share: f64) {
    w.pass(t0 - S, &[]);
    w.pass(t0, &[use_(0.0, share)]);
}

/// A process that keeps the GPU busy whenever it is not frozen, under the wall's freezes, for `secs`
/// passes of `step`: the share of the GPU it got, and the decisions.
fn bypasser(share: f64, secs: u32, step: Duration) -> (f64, Vec<Over>) {
    let mut w = Wall::new(settings());
    let t0 = Instant::now();
    let mut frozen_until = t0;
    let mut last = t0;
    let (mut used, mut all) = (0.0, vec![]);
    started(&mut w, t0, share);
    for i in 1..=secs {
        let now = t0 + step * i;
        // It ran from max(last, frozen_until) to now.
        let ran = now
            .saturating_duration_since(last.max(frozen_until))
            .as_secs_f64();
        let busy = ran / step.as_secs_f64();
        used += ran;
        for o in w.pass(now, &[use_(busy, share)]) {
            frozen_until = now + o.freeze_for;
            all.push(o);
        }
        last = now;
    }
    (used / (step * secs).as_secs_f64(), all)
}

#[test]
fn a_bypassing_process_is_held_to_its_share_plus_the_tolerance() {
    let (got, overs) = bypasser(0.10, 300, S);
    assert!((0.13..=0.17).contains(&got), "10% + 5 points, got {got}");
    assert!(overs.len() > 10, "duty cycling: {}", overs.len());
    assert!(overs
        .iter()
        .all(|o| o.freeze_for <= Duration::from_secs(10)));
    // The first decision: one second at 100% past a full bucket of 0.09 + 0.5 s and the second's 0.15:
    // 0.26 s of debt, frozen while 15% of each second earns it back.
    let first = &overs[0];
    assert!((first.debt - 0.26).abs() < 1e-6, "{first:?}");
    assert!((first.freeze_for.as_secs_f64() - 0.26 / 0.15).abs() < 1e-3);
    assert_eq!((first.used, first.span), (1.0, 1.0));
    // Passes every 250 ms hold it the same.
    let (got, _) = bypasser(0.30, 800, S / 4);
    assert!((0.33..=0.37).contains(&got), "30% + 5 points, got {got}");
}

#[test]
fn the_finding_begins_once_per_episode() {
    let (_, overs) = bypasser(0.10, 120, S);
    assert_eq!(overs.iter().filter(|o| o.begins).count(), 1, "{overs:?}");
    // In credit for more than a window, then over again: a new finding.
    let mut w = Wall::new(settings());
    let t0 = Instant::now();
    started(&mut w, t0, 0.1);
    assert!(w.pass(t0 + S, &[use_(1.0, 0.1)])[0].begins);
    assert!(w.open("c", "GPU-0", t0 + S));
    for i in 2..30 {
        assert_eq!(w.pass(t0 + S * i, &[use_(0.0, 0.1)]), vec![]);
    }
    assert!(!w.open("c", "GPU-0", t0 + S * 29));
    assert!(w.pass(t0 + S * 30, &[use_(1.0, 0.1)])[0].begins);
}

#[test]
fn an_honest_container_is_never_held() {
    // The library's pacing: bursts of its bucket, then waits, averaging its share (here a 1 s window
    // at 30%: 0.3 s busy of each second, seen by passes every 0.5 s as 60% then 0%).
    for (share, pattern) in [(0.3, vec![0.6, 0.0]), (0.3, vec![0.34]), (0.1, vec![0.14])] {
        let mut w = Wall::new(settings());
        let t0 = Instant::now();
        started(&mut w, t0, share);
        for i in 1..2000u32 {
            let busy = pattern[i as usize % pattern.len()];
            let o = w.pass(t0 + S / 2 * i, &[use_(busy, share)]);
            assert_eq!(o, vec![], "share {share}, {pattern:?}, pass {i}");
        }
        assert_eq!(w.excess_total("c", "GPU-0"), 0.0);
    }
}

#[test]
fn past_the_tolerance_it_is_held_and_its_excess_counted() {
    // 10 points past a 30% share: over within a few windows.
    let mut w = Wall::new(settings());
    let t0 = Instant::now();
    started(&mut w, t0, 0.3);
    let first = (1..100u32)
        .find(|&i| !w.pass(t0 + S * i, &[use_(0.4, 0.3)]).is_empty())
        .unwrap();
    // Its bucket (0.21 + 0.5 s) drains at 5 points a second: 15 s.
    assert!((14..=16).contains(&first), "{first}");
    assert!(w.excess_total("c", "GPU-0") > 0.0);
    assert!((w.used_ratio("c", "GPU-0").unwrap() - 0.4).abs() < 1e-9);
}

#[test]
fn time_and_debt_are_bounded() {
    let mut w = Wall::new(settings());
    let t0 = Instant::now();
    // The first pass only starts the clock, and so does a container's first measurement.
    assert_eq!(w.pass(t0, &[use_(1.0, 0.1)]), vec![]);
    assert_eq!(w.used_ratio("c", "GPU-0"), None);
    assert_eq!(w.pass(t0 + S, &[use_(1.0, 0.1)]), vec![]);
    // A stall of an hour counts as one window at most; reporting only (never frozen), the debt stays
    // within one window's earning and a freeze within one window.
    let o = w.pass(t0 + Duration::from_secs(3600), &[use_(1.0, 0.1)]);
    assert_eq!(o[0].span, 10.0);
    let mut t = t0 + Duration::from_secs(3600);
    for _ in 0..100 {
        t += S * 20;
        for o in w.pass(t, &[use_(1.0, 0.1)]) {
            assert!(o.debt <= 0.15 * 10.0 + 1e-9, "{o:?}");
            assert!(o.freeze_for <= Duration::from_secs(10));
        }
    }
    // Not measured for a window: forgotten (a fresh bucket after).
    let later = t + Duration::from_secs(11);
    w.pass(later, &[]);
    assert_eq!(w.used_ratio("c", "GPU-0"), None);
    assert_eq!(w.excess_total("c", "GPU-0"), 0.0);
}

/// Regression (make test on the merged tree): a container that starts between two passes is first seen
/// with a rate NVML measured over less than the pass (the fake over the time since its process began,
/// NVML over the samples it has): taken as the rate over the whole pass, an honest container at 30%
/// whose start-up ran at 84% was frozen. Its first measurement starts its clock and debits nothing.
#[test]
fn a_containers_first_measurement_only_starts_its_clock() {
    // A 5 s window, as tests/e2e/monitor-share.test.sh: a full bucket of 0.21 + 0.25 s and the second's
    // 0.35 do not cover a second at 100%.
    let mut w = Wall::new(Settings {
        window: Duration::from_secs(5),
        tolerance: 0.05,
    });
    let t0 = Instant::now();
    w.pass(t0, &[]);
    assert!(
        w.pass(t0 + S, &[use_(1.0, 0.30)]).is_empty(),
        "first seen: no debit"
    );
    // From then on it is measured: at its share it never goes into debt, past it it does.
    for i in 2..30 {
        assert!(
            w.pass(t0 + S * i, &[use_(0.30, 0.30)]).is_empty(),
            "at its share, pass {i}"
        );
    }
    let mut overs = 0;
    for i in 30..40 {
        overs += w.pass(t0 + S * i, &[use_(1.0, 0.30)]).len();
    }
    assert!(overs > 0, "a bypass after its start is caught");
}

/// A bypassing process under the wall's freezes, as the monitor measures it, for `secs` passes a second
/// apart: busy whenever thawed, when it also fills its queue to `queue` seconds of work, which runs on into
/// a freeze until drained (infinite: one kernel longer than the run). The wall is told how long each pass
/// it was frozen. Returns the wall and, per pass, what it found running on while frozen.
fn queued(share: f64, secs: u32, queue: f64) -> (Wall, Vec<(u32, Runaway)>) {
    let mut w = Wall::new(settings());
    let t0 = Instant::now();
    started(&mut w, t0, share);
    // Frozen until (seconds after t0; a freeze begins at a pass), and the work left in its queue.
    let (mut until, mut left): (f64, f64) = (0.0, queue);
    let mut found = vec![];
    for i in 1..=secs {
        let (a, b) = (f64::from(i - 1), f64::from(i));
        // Frozen from the pass's start (or not at all), thawed after.
        let frozen = (until.min(b) - a).max(0.0);
        let drained = left.min(frozen);
        left -= drained;
        if frozen < 1.0 {
            left = queue;
        }
        let mut u = use_((b - a - frozen) + drained, share);
        u.frozen = frozen;
        for o in w.pass(t0 + S * i, &[u]) {
            until = b + o.freeze_for.as_secs_f64();
        }
        found.extend(w.runaways().iter().map(|r| (i, r.clone())));
    }
    (w, found)
}

#[test]
fn the_rule_of_work_running_on_while_frozen() {
    // A 10 s window, 10% + 5 points: 1.5 s of allowance.
    let r = |used, frozen| runs_on_while_frozen(used, 10.0, frozen, 0.15, 10.0);
    // Busy throughout while frozen 9 s of 10: 10 >= 1 + 1.5.
    assert!(r(10.0, 9.0));
    // Busy thawed (1 s) and its queue 1.4 s into the freeze: within its allowance.
    assert!(!r(2.4, 9.0));
    assert!(r(2.5, 9.0));
    // Frozen less than half the window: a freeze that just began, whatever its use.
    assert!(!r(10.0, 4.9));
    // Never frozen (reporting only, or an honest container): never.
    assert!(!r(10.0, 0.0));
}

#[test]
fn a_kernel_that_runs_through_the_freezes_is_found_once_and_counted() {
    let (w, found) = queued(0.10, 60, f64::INFINITY);
    // The first freeze comes at the second pass (a full bucket of 0.09 + 0.5 s does not cover a second
    // at 100%); frozen half a window (5 s) later at the latest, it is found, and at every pass after.
    let first = found.first().expect("found").0;
    assert!(first <= 2 + 5 + 1, "found at pass {first}");
    assert!(found.iter().all(|(i, _)| *i >= first));
    assert_eq!(found.len() as u32, 60 - first + 1, "every pass after");
    // The finding begins once for the run.
    assert_eq!(found.iter().filter(|(_, r)| r.begins).count(), 1);
    let r = &found[0].1;
    assert!(r.used >= (r.span - r.frozen) + 1.5, "{r:?}");
    assert!(w.runaway_open("c", "GPU-0", Instant::now() + S * 60));
    // Nearly all of the run was frozen and busy: well over 40 GPU-seconds ran while frozen.
    assert!(w.frozen_busy_total("c", "GPU-0") > 40.0);
    assert!((w.used_ratio("c", "GPU-0").unwrap() - 1.0).abs() < 1e-9);
}

#[test]
fn an_honest_queue_that_drains_into_a_freeze_is_not_found() {
    // No queue (the bypasser above), a short one (0.2 s) and one of 0.4 s: what runs on into the freezes
    // of a window stays within its 1.5 s allowance (the first freezes are short: up to three begin in a
    // window, 1.2 s in all). Never found.
    for queue in [0.0, 0.2, 0.4] {
        let (w, found) = queued(0.10, 120, queue);
        assert_eq!(found, vec![], "queue {queue}");
        assert!(!w.runaway_open("c", "GPU-0", Instant::now() + S * 120));
        // What ran while frozen is counted all the same (at most its queue per freeze).
        assert!(w.frozen_busy_total("c", "GPU-0") <= queue * 120.0 + 1e-9);
    }
    // A deeper queue, 0.6 s into each of three freezes: past the allowance, found.
    assert!(!queued(0.10, 120, 0.6).1.is_empty());
    // Reporting only, the wall freezes nothing: a container busy throughout is never found.
    let mut w = Wall::new(settings());
    let t0 = Instant::now();
    started(&mut w, t0, 0.1);
    for i in 1..60 {
        w.pass(t0 + S * i, &[use_(1.0, 0.1)]);
        assert!(w.runaways().is_empty());
    }
}

/// Container `name` with request `request` and limit `limit` (its own request: `requested`).
fn tenant(name: &str, request: f64, limit: f64) -> Use {
    Use {
        container: name.into(),
        request,
        requested: true,
        burst: limit * (1.0 - limit),
        ..use_(0.0, limit)
    }
}

/// Two bypassing containers (no library) that want the whole GPU whenever they are not frozen, on a GPU
/// that slices its time between the busy ones equally (as a real GPU's time slicing, and the fake's
/// `FAKE_CUDA_TIMESLICE_US`), under the wall's freezes, for `secs` passes a second apart; `b` wants the
/// GPU after pass `b_from` up to pass `b_until` (idle before and after). Returns each one's share of the
/// GPU from `b_from` on, and the decisions with the pass each came at.
fn pair(a: Use, b: Use, secs: u32, b_from: u32, b_until: u32) -> (f64, f64, Vec<(u32, Over)>) {
    let mut w = Wall::new(settings());
    let t0 = Instant::now();
    w.pass(t0 - S, &[]);
    w.pass(t0, &[a.clone(), b.clone()]);
    let mut until: BTreeMap<String, f64> = BTreeMap::new();
    let (mut got_a, mut got_b, mut all) = (0.0, 0.0, vec![]);
    for i in 1..=secs {
        let (from, to) = (f64::from(i - 1), f64::from(i));
        let frozen = |c: &str| (until.get(c).copied().unwrap_or(0.0).min(to) - from).max(0.0);
        let (fa, fb) = (frozen(&a.container), frozen(&b.container));
        let b_wants = i > b_from && i <= b_until;
        // Sliced: while both run, each gets half; alone, all of it.
        let both = if b_wants {
            (1.0 - fa.max(fb)).max(0.0)
        } else {
            0.0
        };
        let ua = both / 2.0 + (1.0 - fa - both).max(0.0);
        let ub = if b_wants {
            both / 2.0 + (1.0 - fb - both).max(0.0)
        } else {
            0.0
        };
        let mut ua_ = Use {
            busy: ua,
            frozen: fa,
            gpu_busy: ua + ub,
            ..a.clone()
        };
        let mut ub_ = Use {
            busy: ub,
            frozen: fb,
            gpu_busy: ua + ub,
            ..b.clone()
        };
        ua_.gpu_busy = ua_.gpu_busy.min(1.0);
        ub_.gpu_busy = ub_.gpu_busy.min(1.0);
        if i > b_from {
            got_a += ua;
            got_b += ub;
        }
        for o in w.pass(t0 + S * i, &[ua_, ub_]) {
            until.insert(o.container.clone(), to + o.freeze_for.as_secs_f64());
            all.push((i, o));
        }
    }
    let n = f64::from(secs - b_from);
    (got_a / n, got_b / n, all)
}

#[test]
fn a_borrower_is_held_to_its_entitlement_while_a_busy_floor_is_starved() {
    // Requests 30 and 70, limits 100: sliced equally, each would get 50; the wall holds the borrower
    // near its 30% (+ the tolerance) and the floor of 70 gets its time back (less the tolerance).
    let (a, b, overs) = pair(tenant("a", 0.3, 1.0), tenant("b", 0.7, 1.0), 300, 0, 300);
    assert!((0.30..=0.37).contains(&a), "a got {a}");
    assert!(b >= 0.63, "b got {b}");
    assert!(overs.iter().all(|(_, o)| o.container == "a"), "{overs:?}");
    let o = &overs[0].1;
    match &o.why {
        Why::Floor { entitled, starved } => {
            assert!((entitled - 0.3).abs() < 1e-9, "{o:?}");
            assert_eq!(starved.container, "b");
            assert!(
                (starved.floor - 0.7).abs() < 1e-9 && starved.got < 0.65,
                "{starved:?}"
            );
        }
        w => panic!("{w:?}"),
    }
    assert!((o.request, o.share) == (0.3, 1.0), "{o:?}");
    // One finding for the run.
    assert_eq!(overs.iter().filter(|(_, o)| o.begins).count(), 1);
    // A trio: 20/30/50, the 50 starved by two borrowers.
    let mut w = Wall::new(settings());
    let t0 = Instant::now();
    let trio = [
        tenant("a", 0.2, 1.0),
        tenant("b", 0.3, 1.0),
        tenant("c", 0.5, 1.0),
    ];
    w.pass(t0 - S, &[]);
    w.pass(t0, &trio);
    let sliced: Vec<Use> = trio
        .iter()
        .map(|u| Use {
            busy: 1.0 / 3.0,
            gpu_busy: 1.0,
            ..u.clone()
        })
        .collect();
    // Each gets a third: a is past its 20% + 5 points, b within its 30% + 5, c's 50 is starved.
    let overs = (1..30)
        .map(|i| w.pass(t0 + S * i, &sliced))
        .find(|o| !o.is_empty())
        .expect("a borrower frozen");
    let frozen: Vec<&str> = overs.iter().map(|o| o.container.as_str()).collect();
    assert_eq!(
        frozen,
        vec!["a"],
        "the one past its entitlement + tolerance: {overs:?}"
    );
}

#[test]
fn an_idle_floor_is_lent_and_taken_back_when_it_is_busy_again() {
    // b is idle for 60 passes: a runs at the whole GPU, never held (its limit is 100).
    let (_, _, overs) = pair(tenant("a", 0.3, 1.0), tenant("b", 0.7, 1.0), 60, 60, 60);
    assert_eq!(overs, vec![], "nothing frozen while b is idle");
    let (_, _, overs) = pair(tenant("a", 0.3, 1.0), tenant("b", 0.7, 1.0), 120, 60, 120);
    // b busy from pass 61: a is frozen within a few passes (its bucket's credit first).
    let first = overs.first().expect("a frozen").0;
    assert!((61..=64).contains(&first), "frozen at pass {first}");
    assert!(overs.iter().all(|(i, o)| *i >= 61 && o.container == "a"));
    // b busy from pass 31 to 60, idle after: a is held while b is busy, and free again as soon as b is
    // idle (its debt forgiven, whatever it was).
    let (_, _, overs) = pair(tenant("a", 0.3, 1.0), tenant("b", 0.7, 1.0), 120, 30, 60);
    assert!(!overs.is_empty());
    let last = overs.last().unwrap().0;
    assert!(last <= 61, "a frozen at pass {last}, b idle from 61");
}

#[test]
fn nothing_is_starved_on_a_gpu_with_idle_time_or_below_its_floor_by_its_own_choice() {
    let mut w = Wall::new(settings());
    let t0 = Instant::now();
    let (a, b) = (tenant("a", 0.3, 1.0), tenant("b", 0.7, 1.0));
    w.pass(t0 - S, &[]);
    w.pass(t0, &[a.clone(), b.clone()]);
    for i in 1..100 {
        // b light (10%) and a at 80%: the GPU had 10% idle, which b could have had.
        let uses = [
            Use {
                busy: 0.8,
                gpu_busy: 0.9,
                ..a.clone()
            },
            Use {
                busy: 0.1,
                gpu_busy: 0.9,
                ..b.clone()
            },
        ];
        assert_eq!(w.pass(t0 + S * i, &uses), vec![], "pass {i}");
    }
    // The borrowed time is counted all the same: a used 50 points past its request for 99 s.
    assert!((w.borrowed_total("a", "GPU-0") - 0.5 * 99.0).abs() < 1e-6);
    assert_eq!(w.borrowed_total("b", "GPU-0"), 0.0);
    assert!(!w.floor_open("a", "GPU-0", t0 + S * 99));
}

#[test]
fn limits_alone_keep_todays_wall() {
    // Caps of 60 and 60 (no container asked for a request): sliced 60/40 on a saturated GPU, nothing
    // is promised to the one below 50, and the one at its cap is within it.
    let mut w = Wall::new(settings());
    let t0 = Instant::now();
    let cap = |name: &str| Use {
        container: name.into(),
        ..use_(0.0, 0.6)
    };
    w.pass(t0 - S, &[]);
    w.pass(t0, &[cap("a"), cap("b")]);
    for i in 1..100 {
        let uses = [
            Use {
                busy: 0.6,
                gpu_busy: 1.0,
                ..cap("a")
            },
            Use {
                busy: 0.4,
                gpu_busy: 1.0,
                ..cap("b")
            },
        ];
        assert_eq!(w.pass(t0 + S * i, &uses), vec![], "pass {i}");
    }
    // Beside a container with a request, a cap is its own floor: within admission (60 + 30), a cap at
    // its limit is never frozen by the floors either.
    let mut w = Wall::new(settings());
    w.pass(t0 - S, &[]);
    w.pass(t0, &[cap("a"), tenant("b", 0.3, 1.0)]);
    for i in 1..100 {
        let uses = [
            Use {
                busy: 0.6,
                gpu_busy: 1.0,
                ..cap("a")
            },
            Use {
                busy: 0.4,
                gpu_busy: 1.0,
                ..tenant("b", 0.3, 1.0)
            },
        ];
        assert_eq!(w.pass(t0 + S * i, &uses), vec![], "pass {i}");
    }
}

#[test]
fn the_division_is_per_gpu() {
    let on = |gpu: &str, u: Use| Use {
        gpu: gpu.into(),
        ..u
    };
    let uses = [
        on(
            "GPU-0",
            Use {
                busy: 0.5,
                gpu_busy: 1.0,
                ..tenant("a", 0.3, 1.0)
            },
        ),
        on(
            "GPU-0",
            Use {
                busy: 0.5,
                gpu_busy: 1.0,
                ..tenant("b", 0.7, 1.0)
            },
        ),
        on(
            "GPU-1",
            Use {
                busy: 1.0,
                gpu_busy: 1.0,
                ..tenant("a", 0.3, 1.0)
            },
        ),
    ];
    let (e, starved) = divide(&uses, 0.05);
    assert!(
        (e[0] - 0.3).abs() < 1e-9 && (e[1] - 0.7).abs() < 1e-9,
        "{e:?}"
    );
    // Alone on GPU 1: its limit.
    assert!((e[2] - 1.0).abs() < 1e-9, "{e:?}");
    assert_eq!(
        starved.get("GPU-0").map(|s| s.container.as_str()),
        Some("b")
    );
    assert!(!starved.contains_key("GPU-1"));
}
