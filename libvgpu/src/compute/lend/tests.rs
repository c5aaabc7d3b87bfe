//! Unit tests of `lend`: the entitlement alone, beside a waking neighbour, grown and halved with the GPU's
//! idle share, smoothed over a paced neighbour's bursts; and simulations of tenants sharing a GPU.
use super::*;

const MS: u64 = 1_000_000;
const P: u64 = 10_000; // ppm per percent

#[test]
fn alone_the_limit_and_a_neighbour_waking_gives_the_floor_back_at_once() {
    let l = Lending::START;
    assert_eq!(l.entitled(30 * P, 100 * P), 100 * P, "before any reading");
    let l = l.step(30 * P, 80 * P, (2, 60), true, 100 * MS);
    assert_eq!(l.entitled(30 * P, 80 * P), 80 * P, "others at 2%: alone");
    let l = l.step(30 * P, 80 * P, (40, 60), true, 150 * MS);
    assert_eq!(
        l.entitled(30 * P, 80 * P),
        30 * P,
        "a neighbour woke: the floor, at once"
    );
    // The neighbour pauses (its own bucket's pacing): alone only once it stays quiet a second.
    let q = l.step(30 * P, 80 * P, (1, 90), true, 160 * MS);
    assert_eq!(q.entitled(30 * P, 80 * P), 30 * P, "one quiet reading");
    let q = q.step(30 * P, 80 * P, (2, 90), true, 160 * MS + ALONE_AFTER_NS - 1);
    assert_eq!(
        q.entitled(30 * P, 80 * P),
        30 * P,
        "quiet just under a second"
    );
    let r = q.step(30 * P, 80 * P, (30, 30), true, 160 * MS + ALONE_AFTER_NS);
    assert_eq!(r.quiet_since, 0, "busy again: the quiet starts over");
    let q = q.step(30 * P, 80 * P, (0, 90), true, 160 * MS + ALONE_AFTER_NS);
    assert_eq!(q.entitled(30 * P, 80 * P), 80 * P, "quiet a second: alone");
}

/// Sharing the GPU with the smoothed figures `others` and `own` already at `(others, own)`, lent `lent`.
fn sharing(others: u32, own: u32, lent: u64) -> Lending {
    Lending {
        alone: false,
        lent,
        others: f64::from(others),
        own: f64::from(own),
        read_at: 1,
        ..Lending::START
    }
}

#[test]
fn lent_grows_with_the_request_while_the_gpu_idles_and_halves_when_it_is_saturated() {
    let busy = sharing(30, 20, 0);
    let l = busy.step(20 * P, 100 * P, (30, 20), true, STEP_NS - 1);
    assert_eq!(l.lent, 0, "not before a step's time");
    let l = busy.step(20 * P, 100 * P, (30, 20), true, STEP_NS);
    assert_eq!(
        l.lent,
        9 * P,
        "request 20 x the 45 points idle past the margin"
    );
    let l = l.step(20 * P, 100 * P, (30, 20), false, 2 * STEP_NS);
    assert_eq!(l.lent, 9 * P, "not held back: lent no more");
    let l = sharing(70, 25, 10 * P).step(20 * P, 100 * P, (70, 25), true, STEP_NS);
    assert_eq!(l.lent, 10 * P, "5% idle: the margin, held");
    let l = sharing(70, 27, 10 * P).step(20 * P, 100 * P, (70, 27), true, STEP_NS);
    assert_eq!(
        l.lent,
        5 * P,
        "3% idle: halved, even served all it is entitled to"
    );
    let l = sharing(30, 20, 0).step(20 * P, 100 * P, (60, 30), true, STEP_NS);
    assert_eq!(
        l.lent, P,
        "the mean says 50 idle, the reading 10: grown by the lesser"
    );
    let l = sharing(10, 45, 28 * P).step(20 * P, 50 * P, (10, 45), true, STEP_NS);
    assert_eq!(l.entitled(20 * P, 50 * P), 50 * P, "never above the limit");
    assert_eq!(l.lent, 30 * P);
}

#[test]
fn a_paced_neighbours_bursts_are_smoothed() {
    // Readings every 100 ms of a neighbour that runs one in three (its bucket's pacing): 90, 0, 0, ...
    let mut l = sharing(30, 20, 0);
    let mut now = 0;
    for k in 0..30 {
        now += 100 * MS;
        let others = if k % 3 == 0 { 90 } else { 6 };
        l = l.step(20 * P, 100 * P, (others, 20), false, now);
    }
    assert!((25.0..=45.0).contains(&l.others), "{}", l.others);
    assert!(!l.alone);
}

/// A GPU that time-slices busy contexts: each gets an equal part of the time, at most what its share
/// lets it run (its entitlement) or wants (its demand), what one leaves going to the others.
fn sliced(caps: &[u64]) -> Vec<u64> {
    let mut got = vec![0u64; caps.len()];
    let mut left = 100 * P;
    let mut open: Vec<usize> = (0..caps.len()).filter(|&i| caps[i] > 0).collect();
    while !open.is_empty() && left > 0 {
        let each = left / open.len() as u64;
        let mut next = Vec::new();
        for &i in &open {
            let take = (caps[i] - got[i]).min(each);
            got[i] += take;
            left -= take;
            if got[i] < caps[i] {
                next.push(i);
            }
        }
        if next.len() == open.len() && each == 0 {
            break;
        }
        open = next;
    }
    got
}

/// Tenants `(request, limit, demand)` in percent, every one stepping on a reading each 100 ms of what
/// the GPU gave each over the last 100 ms, for `secs`; the mean use of each over the last half, percent.
fn run(tenants: &[(u64, u64, u64)], secs: u64) -> Vec<f64> {
    let mut ls = vec![Lending::START; tenants.len()];
    let mut sums = vec![0u64; tenants.len()];
    let ticks = secs * 10;
    let mut used = vec![0u64; tenants.len()];
    for t in 0..ticks {
        let now = t * 100 * MS;
        let caps: Vec<u64> = tenants
            .iter()
            .zip(&ls)
            .map(|(&(r, l, d), s)| s.entitled(r * P, l * P).min(d * P))
            .collect();
        used = sliced(&caps);
        let total: u64 = used.iter().sum();
        for (i, &(r, l, d)) in tenants.iter().enumerate() {
            if d == 0 {
                continue;
            }
            let own = (used[i] / P) as u32;
            let others = ((total - used[i]) / P) as u32;
            let wants = d * P > ls[i].entitled(r * P, l * P);
            ls[i] = ls[i].step(r * P, l * P, (others, own), wants, now);
        }
        if t >= ticks / 2 {
            for (s, u) in sums.iter_mut().zip(&used) {
                *s += u;
            }
        }
    }
    let _ = used;
    sums.iter()
        .map(|&s| s as f64 / P as f64 / (ticks - ticks / 2) as f64)
        .collect()
}

#[test]
fn a_floor_alone_runs_at_its_limit() {
    let u = run(&[(30, 100, 100)], 10);
    assert!(u[0] >= 99.0, "{u:?}");
    let u = run(&[(30, 100, 100), (70, 100, 0)], 10);
    assert!(u[0] >= 99.0, "the other idle: {u:?}");
}

#[test]
fn floors_that_fill_the_gpu_get_exactly_their_floors() {
    let u = run(&[(30, 100, 100), (70, 100, 100)], 20);
    assert!(
        (u[0] - 30.0).abs() <= 3.0 && (u[1] - 70.0).abs() <= 3.0,
        "{u:?}"
    );
    let u = run(&[(20, 100, 100), (30, 100, 100), (50, 100, 100)], 20);
    for (got, want) in u.iter().zip([20.0, 30.0, 50.0]) {
        assert!((got - want).abs() <= 3.0, "{u:?}");
    }
}

#[test]
fn what_floors_leave_is_shared_in_proportion_to_the_requests() {
    // 20 and 40: the 40 left idle goes 1:2, to 33 and 67.
    let u = run(&[(20, 100, 100), (40, 100, 100)], 30);
    let sum = u[0] + u[1];
    assert!(sum >= 85.0, "the GPU is kept busy: {u:?}");
    assert!(u[0] >= 20.0 && u[1] >= 40.0, "the floors hold: {u:?}");
    let ratio = u[1] / u[0];
    assert!((1.5..=2.6).contains(&ratio), "about 1:2: {u:?}");
    // Equal requests: equal parts.
    let u = run(&[(20, 100, 100), (20, 100, 100)], 30);
    assert!((u[0] - u[1]).abs() <= 5.0 && u[0] + u[1] >= 85.0, "{u:?}");
    // A limit caps what is lent.
    let u = run(&[(20, 30, 100), (20, 100, 100)], 30);
    assert!(u[0] <= 30.5 && u[1] >= 60.0, "{u:?}");
}

#[test]
fn a_floor_waking_beside_a_borrower_has_it_back_within_one_reading() {
    let (r, l) = (30 * P, 100 * P);
    // The borrower alone: its limit.
    let b = Lending::START.step(r, l, (0, 100), true, 0);
    assert_eq!(b.entitled(r, l), 100 * P);
    // The 70% floor wakes; time-sliced, it got half the GPU in the borrower's next reading.
    let b = b.step(r, l, (50, 50), true, 100 * MS);
    assert_eq!(b.entitled(r, l), 30 * P);
    // And a waking floor starts at its own floor, not lent anything, beside the busy borrower.
    let f = Lending::START.step(70 * P, l, (100, 0), true, 100 * MS);
    assert_eq!(f.entitled(70 * P, l), 70 * P);
}

// Issue 42's reclaim on an H200: NVML's samples of a waking neighbour came 435 ms late at the median. The
// borrower's own work, stretched by the neighbour's slices, gives the floor back first.
#[test]
fn its_own_work_stretched_past_its_alone_baseline_gives_the_floor_back_before_nvml() {
    let l = Lending::START
        .step(30 * P, 100 * P, (0, 90), true, 100 * MS)
        .seen_alone(CONTEXT);
    assert_eq!(l.entitled(30 * P, 100 * P), 100 * P, "alone: the limit");
    let same = l.stretched(CONTEXT + WAKE_STRETCH - 1, 110 * MS);
    assert_eq!(same, l, "stretched less than WAKE_STRETCH: nothing changes");
    let woke = l.stretched(2 * CONTEXT, 120 * MS);
    assert_eq!(
        woke.entitled(30 * P, 100 * P),
        30 * P,
        "a second context's slices: the floor at once"
    );
    assert_eq!((woke.lent, woke.stepped_at), (0, 120 * MS));
    // NVML then decides: it never shows the neighbour, and a second of quiet gives the GPU back.
    let q = woke.step(30 * P, 100 * P, (1, 90), true, 200 * MS);
    assert_eq!(q.entitled(30 * P, 100 * P), 30 * P, "one quiet reading");
    let q = q.step(30 * P, 100 * P, (1, 90), true, 200 * MS + ALONE_AFTER_NS);
    assert_eq!(
        q.entitled(30 * P, 100 * P),
        100 * P,
        "quiet a second: alone"
    );
}

#[test]
fn the_baseline_is_its_own_stretch_alone_so_streams_that_stretch_each_other_keep_borrowing() {
    // Alone, its own streams read as 1.8 contexts: that is its baseline, not a neighbour.
    let l = Lending::START
        .step(30 * P, 100 * P, (0, 95), true, 100 * MS)
        .seen_alone(1800);
    assert!(l.stretched(1800 + WAKE_STRETCH - 1, 110 * MS).alone);
    assert!(!l.stretched(1800 + WAKE_STRETCH, 110 * MS).alone);
    // Only a reading that finds it alone moves the baseline; a stretch never wakes one already sharing.
    let shared = sharing(40, 30, 10 * P);
    assert_eq!(shared.seen_alone(2500).alone_stretch, CONTEXT);
    assert_eq!(shared.stretched(5000, 110 * MS), shared);
}

// A false wake (the stretch woke it, NVML never showed a neighbour) costs the tenant its own borrowing
// until NVML's quiet second gives the GPU back: its entitlement goes to its request, never below, and
// nobody else's changes. The same stretch does not wake it again: a wake then needs `WAKE_STRETCH` more
// than the false one, so one process wakes falsely at most three times in a row (a minute: below).
#[test]
fn a_false_wake_costs_only_its_own_borrowing_for_a_second_and_raises_the_bar() {
    let (r, lim) = (30 * P, 100 * P);
    let l = Lending::START
        .step(r, lim, (0, 90), true, 100 * MS)
        .seen_alone(CONTEXT);
    let woke = l.stretched(1400, 110 * MS);
    assert_eq!(woke.entitled(r, lim), r, "down to its request, not below");
    assert_eq!(woke.woke_by, 1400);
    // NVML shows nobody for a second: alone again, and the false wake remembered.
    let q = woke.step(r, lim, (0, 90), true, 200 * MS);
    let back = q.step(r, lim, (0, 90), true, 200 * MS + ALONE_AFTER_NS);
    assert_eq!(
        back.entitled(r, lim),
        lim,
        "the GPU back after NVML's quiet second"
    );
    assert_eq!((back.woke_by, back.false_wake), (0, 1400));
    let back = back.seen_alone(CONTEXT);
    assert!(
        back.stretched(1400, 1300 * MS).alone,
        "the same stretch: no wake"
    );
    assert!(back.stretched(1400 + WAKE_STRETCH - 1, 1300 * MS).alone);
    assert!(
        !back.stretched(1400 + WAKE_STRETCH, 1300 * MS).alone,
        "a larger one still wakes it"
    );
    // Falsely woken each time at the least stretch that wakes it: the wake's stretch reads two contexts
    // at most (`launch_charge::SoloBook::wake_stretch`), so after three nothing wakes it but NVML.
    let (mut s, mut wakes, mut t) = (Lending::START.seen_alone(CONTEXT), 0, 1300 * MS);
    for stretch in (CONTEXT..=2 * CONTEXT).step_by(10) {
        let w = s.stretched(stretch, t);
        if w.alone {
            continue;
        }
        s = w.step(r, lim, (0, 90), true, t + MS).step(
            r,
            lim,
            (0, 90),
            true,
            t + MS + ALONE_AFTER_NS,
        );
        assert!(s.alone);
        wakes += 1;
        t += 2 * ALONE_AFTER_NS;
    }
    assert_eq!(wakes, 3, "false wakes at 1.3, 1.6 and 1.9 contexts");
    // A wake NVML confirms is no false one.
    let w = back.stretched(2500, 1400 * MS);
    let c = w.step(r, lim, (40, 60), true, 1500 * MS);
    assert_eq!(
        (c.woke_by, c.false_wake),
        (0, 1400),
        "confirmed: the bar stays"
    );
}

// The bar a false wake raised is kept a minute, then forgotten: a long-lived process that woke falsely
// three times (its own work's stretch) wakes by its stretch again later (before: never, for its life).
#[test]
fn a_raised_bar_is_forgotten_a_minute_after_the_last_false_wake() {
    let (r, lim) = (30 * P, 100 * P);
    let l = Lending::START
        .step(r, lim, (0, 90), true, 100 * MS)
        .seen_alone(CONTEXT);
    let woke = l.stretched(1400, 110 * MS);
    let q = woke.step(r, lim, (0, 90), true, 200 * MS);
    let back = q.step(r, lim, (0, 90), true, 200 * MS + ALONE_AFTER_NS);
    assert_eq!(back.false_wake, 1400);
    let t = back.false_wake_at;
    assert_eq!(t, 200 * MS + ALONE_AFTER_NS);
    let kept = back.step(r, lim, (0, 90), true, t + FALSE_WAKE_KEPT_NS - 1);
    assert_eq!(kept.false_wake, 1400, "kept for a minute");
    assert!(kept.stretched(1400, t + FALSE_WAKE_KEPT_NS - 1).alone);
    let forgot = kept.step(r, lim, (0, 90), true, t + FALSE_WAKE_KEPT_NS);
    assert_eq!(forgot.false_wake, 0, "then forgotten");
    assert!(
        !forgot.stretched(1400, t + FALSE_WAKE_KEPT_NS).alone,
        "the same stretch wakes it again"
    );
}
