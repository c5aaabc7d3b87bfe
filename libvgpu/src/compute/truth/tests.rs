//! The floor against the driver's figure: samples of both kinds, the slack, what was charged before.

use super::*;

const ME: u32 = 42;
const S: u64 = 1_000_000; // a second in µs
const MS: u64 = 1_000_000; // a millisecond in ns

// The fake's NVML (and the driver's "since the last query"): one sample per process per reading, its SM
// the share of the time since the caller's previous reading.
#[test]
fn a_process_charged_less_than_the_driver_saw_is_charged_the_rest() {
    let t = Truth::default();
    t.observe(&[(ME, 10 * S, 0)], ME, 10 * S);
    assert_eq!(t.floor(0), 0, "the first reading only sets the baseline");
    // A second at 40%: 400 ms used; the events charged 100 ms of it.
    t.booked(100 * MS);
    t.observe(&[(ME, 11 * S, 40), (7, 11 * S, 50)], ME, 11 * S);
    let short = t.floor(0);
    // Slack: 2 ms + 1% of 400 ms + 0.5% of a second = 11 ms.
    assert_eq!(short, 400 * MS - 100 * MS - 11 * MS);
    assert_eq!(t.floor(0), 0, "nothing new read: nothing charged");
    // Another second, honestly charged: nothing more.
    t.booked(300 * MS);
    t.observe(&[(ME, 12 * S, 30)], ME, 12 * S);
    assert_eq!(t.floor(0), 0);
}

#[test]
fn charges_in_flight_and_the_slack_count_for_the_process() {
    let t = Truth::default();
    t.observe(&[], ME, 10 * S);
    t.booked(150 * MS);
    t.observe(&[(ME, 11 * S, 20)], ME, 11 * S);
    // 200 ms used, 150 settled and 45 in flight: within the slack (2 + 2 + 5 ms).
    assert_eq!(t.floor(45 * MS), 0);
}

#[test]
fn what_was_charged_before_the_first_reading_is_not_set_against_later_use() {
    let t = Truth::default();
    t.booked(5_000 * MS);
    t.observe(&[(ME, 10 * S, 90)], ME, 10 * S);
    t.observe(&[(ME, 11 * S, 90)], ME, 11 * S);
    assert!(t.floor(0) > 800 * MS);
}

// The driver's own buffer: samples every sample period, only for processes busy in it. A sample after
// idle periods covers its period, not the time since the process's previous sample.
#[test]
fn per_period_samples_count_for_their_period_only() {
    let t = Truth::default();
    t.observe(&[(ME, 10 * S, 50)], ME, 10 * S);
    // Periods of 200 ms: busy 50% in the first, absent (idle) in three, busy 100% in the last.
    let p = 200_000;
    t.observe(
        &[
            (ME, 10 * S + p, 50),
            (7, 10 * S + 2 * p, 10),
            (ME, 10 * S + 5 * p, 100),
        ],
        ME,
        10 * S + 5 * p,
    );
    // Used: 100 ms + 200 ms (not 100% of the 800 ms since its previous sample).
    let slack = SLACK_NS + 3 * MS + 5 * MS; // 1% of 300 ms, 0.5% of a second
    assert_eq!(t.floor(0), 300 * MS - slack);
}

#[test]
fn samples_already_seen_are_not_counted_again() {
    let t = Truth::default();
    t.observe(&[(ME, 10 * S, 0)], ME, 10 * S);
    t.observe(&[(ME, 11 * S, 50)], ME, 11 * S);
    let first = t.floor(0);
    // The driver answers with the same sample again (nothing newer): nothing more used.
    t.observe(&[(ME, 11 * S, 50)], ME, 11 * S + 100_000);
    assert_eq!(t.floor(first), 0);
}

#[test]
fn a_fork_child_starts_afresh() {
    let t = Truth::default();
    t.observe(&[(ME, 10 * S, 0)], ME, 10 * S);
    t.booked(7 * MS);
    t.forget_parent();
    assert_eq!(t.since(), None);
    t.observe(&[(ME, 20 * S, 90)], ME, 20 * S);
    assert_eq!(t.floor(0), 0, "a new baseline");
}
