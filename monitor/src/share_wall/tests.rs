//! The share wall's decisions under a fake clock: a bypassing process held near its share plus the
//! tolerance, an honest one never, a finding once per episode, time and debt bounded.

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
        busy,
        burst: share * (1.0 - share),
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
