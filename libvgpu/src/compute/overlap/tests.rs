//! Unit tests of overlapping intervals charged once (`compute::overlap`).
use super::*;

const MS: i64 = 1_000_000;

#[test]
fn four_streams_running_together_are_charged_the_time_they_cover_once() {
    let mut c = Covered::default();
    // four 2 ms intervals at once, harvested one after another
    let charged: u64 = (0..4).map(|_| c.add(10 * MS, 12 * MS)).sum();
    // the first its 2 ms; the others only the slack at each end of the first
    assert_eq!(charged, 2 * MS as u64 + 3 * 2 * SLACK_NS as u64);
}

#[test]
fn intervals_that_do_not_overlap_are_charged_the_sum() {
    let mut c = Covered::default();
    // one stream's launches one after another (each starts at the end before it), then another stream's
    let charged: u64 = (0..8)
        .map(|i| c.add(i * 2 * MS, (i + 1) * 2 * MS))
        .sum::<u64>()
        + (8..12)
            .map(|i| c.add(i * 2 * MS, (i + 1) * 2 * MS))
            .sum::<u64>();
    assert_eq!(charged, 24 * MS as u64);
}

#[test]
fn the_charge_is_never_less_than_the_union_whatever_the_order() {
    // a long interval harvested after short ones it covers, and a partial overlap
    let mut c = Covered::default();
    let a = c.add(5 * MS, 6 * MS);
    let b = c.add(7 * MS, 8 * MS);
    let long = c.add(0, 10 * MS);
    let part = c.add(9 * MS, 14 * MS);
    assert_eq!(a + b, 2 * MS as u64);
    // the long one: its 10 ms less what the two short ones covered (less the slack)
    assert_eq!(long, 8 * MS as u64 + 4 * SLACK_NS as u64);
    assert_eq!(part, 4 * MS as u64 + SLACK_NS as u64);
    // together: at least the union (14 ms), never less than the longest interval
    assert!(a + b + long + part >= 14 * MS as u64);
}

#[test]
fn an_interval_that_overlaps_a_forgotten_one_is_charged_more_never_less() {
    let mut c = Covered::default();
    for i in 0..(KEEP as i64 + 4) {
        c.add(i * 10 * MS, i * 10 * MS + MS);
    }
    // the oldest were forgotten: an interval over the first is charged whole
    assert_eq!(c.add(0, MS), MS as u64);
    assert!(c.spans.len() <= KEEP);
}

#[test]
fn a_context_on_one_stream_is_charged_whole_and_one_on_two_is_placed() {
    let o = Overlap::default();
    assert_eq!(o.anchor(1, 10, 0), Anchor::Whole);
    assert_eq!(o.anchor(1, 10, 5), Anchor::Whole);
    // another stream: an epoch is due (no stream of its own yet)
    assert_eq!(o.anchor(1, 11, 6), Anchor::Due(std::ptr::null_mut()));
    let (s, e) = (77usize as CUstream, 88usize as CUevent);
    let (gen, old) = o.rebased(1, s, e, 6).unwrap();
    assert!(old.is_null());
    assert_eq!(o.anchor(1, 10, 7), Anchor::Place(e, gen));
    assert_eq!(o.place(1, gen, 0, 2 * MS), Some(2 * MS as u64));
    // the next interval of the stream, after it: no overlap, the launches may still be sampled
    assert_eq!(o.place(1, gen, 2 * MS, 4 * MS), Some(2 * MS as u64));
    assert!(!o.overlapped());
    // another stream's over both: overlap found, every launch timed from now on
    assert_eq!(o.place(1, gen, MS, 3 * MS), Some(2 * SLACK_NS as u64));
    assert!(o.overlapped());
    // an epoch older than REBASE_NS is due again, on the same stream; positions read against the old
    // one are dropped, and the covered intervals forgotten
    assert_eq!(o.anchor(1, 10, 6 + REBASE_NS), Anchor::Due(s));
    let (gen2, old) = o.rebased(1, s, 99usize as CUevent, 6 + REBASE_NS).unwrap();
    assert_eq!(old, e);
    assert_eq!(o.place(1, gen, 0, 2 * MS), None);
    assert_eq!(o.place(1, gen2, 0, 2 * MS), Some(2 * MS as u64));
    // far from the epoch: not placed
    assert_eq!(o.place(1, gen2, FAR_NS + 1, FAR_NS + 2), None);
    // a context whose epoch could not be recorded is charged whole until the next try
    assert_eq!(o.anchor(3, 10, 7), Anchor::Whole);
    assert_eq!(o.anchor(3, 11, 8), Anchor::Due(std::ptr::null_mut()));
    o.failed(3, 55usize as CUstream, 8);
    assert_eq!(o.anchor(3, 10, 9), Anchor::Whole);
    // tried again later, on the stream made before
    assert_eq!(
        o.anchor(3, 10, 8 + REBASE_NS),
        Anchor::Due(55usize as CUstream)
    );
    // another context has its own clock; a gone context is forgotten
    assert_eq!(o.anchor(2, 10, 7), Anchor::Whole);
    o.forget(1);
    assert_eq!(o.place(1, gen2, 0, MS), None);
}
