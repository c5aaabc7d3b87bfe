//! Unit tests of the launches in flight, their chaining and their groups (`compute::flight`).
use super::*;

fn ev(n: usize) -> CUevent {
    n as CUevent
}

fn flight(start: usize, end: usize, stream: usize, plan: Plan) -> InFlight {
    let mut f = InFlight::new(1, stream, 0, (0, [1, 1, 1]), 0);
    f.seq = 0;
    f.start = plan.chained.unwrap_or(ev(start));
    f.end = ev(end);
    f.opens_span = plan.opens_span;
    f
}

/// One launch in flight on stream 10 of context 1 (start 100, end 101), planned as a first launch is.
fn one_in_flight() -> Flights {
    let mut f = Flights::default();
    let p = f.plan(1, 10, None);
    f.queue.push_back(flight(100, 101, 10, p));
    f
}

#[test]
fn a_launch_behind_one_in_flight_on_its_stream_is_timed_from_its_end() {
    let mut f = Flights::default();
    let p1 = f.plan(1, 10, None);
    assert_eq!(p1, Plan::alone(true));
    f.queue.push_back(flight(100, 101, 10, p1));
    // Another stream: its own start, no span (work is in flight).
    let p2 = f.plan(1, 20, None);
    assert_eq!(p2, Plan::alone(false));
    f.queue.push_back(flight(200, 201, 20, p2));
    // The same stream again: from the first launch's end, which is now lent.
    let p3 = f.plan(1, 10, None);
    assert_eq!(p3.chained, Some(ev(101)));
    assert!(f.queue[0].lent_end && !f.queue[1].lent_end);
    f.queue.push_back(flight(0, 301, 10, p3));
    assert_eq!(f.queue[2].start, ev(101));
    // The same stream of another context is another stream.
    assert_eq!(f.plan(2, 10, None).chained, None);
    assert_eq!(f.newest(), Some((ev(301), 10, 1)));
}

#[test]
fn a_chained_launch_that_was_not_queued_gives_the_end_back() {
    let mut f = one_in_flight();
    let p2 = f.plan(1, 10, None);
    assert!(f.unlend(p2.chained.unwrap()));
    assert!(!f.queue[0].lent_end);
    // Lent again, then the lender is charged before the launch fails: the launch owns the event.
    let p3 = f.plan(1, 10, None);
    f.queue.pop_front();
    assert!(!f.unlend(p3.chained.unwrap()));
}

// A synchronisation retires what it found finished; charging waits for the next launch. The retired
// launches must not lend a start to it (their ends are in the past: the launch would be timed from
// before the application queued it) and the next launch opens a span of its own, while the retired
// span still ends (dated) at its last launch.
#[test]
fn retired_launches_end_their_span_and_lend_nothing() {
    let mut f = one_in_flight();
    let p2 = f.plan(1, 10, None);
    f.queue.push_back(flight(0, 201, 10, p2));
    let a = f.queue.pop_front().unwrap();
    f.retire(a, Some(5_000));
    let b = f.queue.pop_front().unwrap();
    f.retire(b, Some(5_000));
    assert!(!f.retired[0].closes_span && f.retired[0].ended_at.is_none());
    assert!(f.retired[1].closes_span);
    assert_eq!(f.retired[1].ended_at, Some(5_000));
    let p3 = f.plan(1, 10, None);
    assert_eq!(p3, Plan::alone(true));
    assert_eq!(f.newest(), None, "nothing in flight");
}

#[test]
fn a_span_s_first_launch_waited_what_its_work_did_not_fill() {
    let s = Span {
        start: ev(1),
        ctx: 1,
        queued_at: 1_000,
    };
    // Queued at 1,000; the work's 600 ns ended at 2,000: it waited 400 ns first.
    assert_eq!(s.waited(2_000, 600), 400);
    assert_eq!(s.waited(1_500, 600), 0);
}

/// Pushes a launch planned by `p` as `Timer::end` would (a group's opener stays open).
fn push(f: &mut Flights, end: usize, p: Plan, floor: u64) {
    push_on(f, 10, end, p, floor)
}

fn push_on(f: &mut Flights, stream: usize, end: usize, p: Plan, floor: u64) {
    let mut l = flight(end + 1000, end, stream, p);
    l.floors = floor;
    if p.grouping == Grouping::Opens {
        l.state = End::Open;
        f.open += 1;
    }
    f.queue.push_back(l);
}

// A deep queue (the oldest launch found running, of the same stream): short work measured before
// opens a group, and the next launches join it without events until it is full.
#[test]
fn launches_behind_unfinished_work_of_their_stream_are_timed_in_groups() {
    let mut f = Flights::default();
    let p = f.plan(1, 10, Some(100));
    assert_eq!(
        p.grouping,
        Grouping::Alone,
        "nothing in flight: timed alone"
    );
    push(&mut f, 1, p, 100);
    // Not known running yet: chained, alone.
    let p = f.plan(1, 10, Some(100));
    assert_eq!((p.chained, p.grouping), (Some(ev(1)), Grouping::Alone));
    push(&mut f, 2, p, 100);
    // The harvest found the oldest running: with one more unfinished launch behind it, the next
    // launch opens a group.
    let oldest = f.pop_front().unwrap();
    f.push_front(oldest, true);
    let p = f.plan(1, 10, Some(100));
    assert_eq!(
        (p.chained, p.grouping),
        (Some(ev(2)), Grouping::Alone),
        "too shallow yet"
    );
    push(&mut f, 30, p, 100);
    let p = f.plan(1, 10, Some(100));
    assert_eq!((p.chained, p.grouping), (Some(ev(30)), Grouping::Opens));
    push(&mut f, 3, p, 100);
    assert!(f.any_open());
    // Seven more join it (eight members at most), with no event of their own.
    for _ in 0..GROUP_MAX - 1 {
        let p = f.plan(1, 10, Some(100));
        assert_eq!((p.chained, p.grouping), (Some(ev(3)), Grouping::Joins));
        let g = f.by_end(ev(3)).unwrap();
        g.joining -= 1;
        g.members += 1;
    }
    // Full: the next launch closes it (records its end first) and starts from that end.
    let p = f.plan(1, 10, Some(100));
    assert_eq!(p.grouping, Grouping::Opens);
    assert!(p.close_first && p.chained == Some(ev(3)));
    assert_eq!(f.by_end(ev(3)).unwrap().state, End::Closing);
    assert!(!f.any_open());
    f.closed(ev(3), true, false);
    assert_eq!(f.by_end(ev(3)).unwrap().state, End::Recorded);
    assert!(!f.by_end(ev(3)).unwrap().stale);
}

// A group closed on a stream with nothing left to run is stale (charged by its members' least times);
// one whose end could not be recorded is failed, never stale (charged as lost).
#[test]
fn a_group_closed_on_an_idle_stream_is_stale() {
    let mut f = deep();
    let p = f.plan(1, 10, Some(100));
    assert_eq!(p.grouping, Grouping::Opens);
    push(&mut f, 3, p, 100);
    let closing = f.closing(None, false);
    assert_eq!(closing.len(), 1);
    f.closed(ev(3), true, true);
    let g = f.by_end(ev(3)).unwrap();
    assert_eq!((g.state, g.stale), (End::Recorded, true));
    g.state = End::Closing;
    f.closed(ev(3), false, true);
    let g = f.by_end(ev(3)).unwrap();
    assert_eq!((g.state, g.stale), (End::Failed, false));
}

// Work not measured before, long work, another stream's unfinished launch in front, or a group that
// reached the front (its members may run already): no group forms or grows.
#[test]
fn no_group_where_its_interval_could_hold_idle_time_or_unknown_work() {
    let mut f = deep();
    assert_eq!(
        f.plan(1, 10, None).grouping,
        Grouping::Alone,
        "unmeasured work"
    );
    let mut g = Flights::default();
    let p = g.plan(1, 20, None);
    push_on(&mut g, 20, 1, p, 0);
    let oldest = g.pop_front().unwrap();
    g.push_front(oldest, true);
    for e in [2, 3] {
        let p = g.plan(1, 10, Some(100));
        assert_eq!(
            p.grouping,
            Grouping::Alone,
            "the oldest running is another stream's"
        );
        push(&mut g, e, p, 100);
    }
    // A group of floors that reach GROUP_FLOORS_NS takes no more.
    let mut h = deep();
    let p = h.plan(1, 10, Some(GROUP_FLOORS_NS - 1));
    assert_eq!(p.grouping, Grouping::Opens);
    push(&mut h, 3, p, GROUP_FLOORS_NS - 1);
    let p = h.plan(1, 10, Some(1));
    assert_eq!(
        p.grouping,
        Grouping::Opens,
        "closed, and the next group opened"
    );
    assert!(p.close_first);
    // A group at the front: what ran before it finished, so no launch joins it.
    let mut k = deep();
    let p = k.plan(1, 10, Some(100));
    push(&mut k, 3, p, 100);
    k.pop_front();
    k.pop_front();
    k.pop_front();
    let g = k.pop_front().unwrap();
    k.push_front(g, false);
    let p = k.plan(1, 10, Some(100));
    assert!(p.close_first && p.grouping == Grouping::Alone);
}

/// Three launches of stream 10 in flight (ends 1, 2, 20), the oldest found running: the next launch
/// of short, measured work opens a group.
fn deep() -> Flights {
    let mut f = Flights::default();
    let p = f.plan(1, 10, Some(100));
    push(&mut f, 1, p, 100);
    let oldest = f.pop_front().unwrap();
    f.push_front(oldest, true);
    for e in [2, 20] {
        let p = f.plan(1, 10, Some(100));
        assert_eq!(p.grouping, Grouping::Alone, "too shallow yet");
        push(&mut f, e, p, 100);
    }
    f
}

// A launch joining while another thread wants the group closed: the joiner closes it once its
// launch is queued; the other starts from an event of its own.
#[test]
fn a_group_being_joined_is_closed_by_its_last_joiner() {
    let mut f = deep();
    let p = f.plan(1, 10, Some(100));
    assert_eq!(p.grouping, Grouping::Opens);
    push(&mut f, 3, p, 100);
    assert_eq!(f.plan(1, 10, Some(100)).grouping, Grouping::Joins);
    assert!(f.closing(None, false).is_empty(), "a joiner is in flight");
    assert!(f.by_end(ev(3)).unwrap().close_asked);
    let p = f.plan(1, 10, Some(100));
    assert_eq!((p.chained, p.grouping), (None, Grouping::Alone));
    assert_eq!(f.by_end(ev(3)).unwrap().state, End::Open);
}

// In a queue the GPU keeps up with (a loop bound by its launch rate), a launch finds at most its stream's
// one launch in flight, at the front: it may go untimed (`sample`), as a launch with nothing in flight
// may. After an untimed launch the one in flight lends no start: a launch timed from its end would be
// timed over the untimed one's work too (charged twice).
#[test]
fn a_launch_behind_its_stream_s_front_launch_may_go_untimed_and_then_nothing_chains_over_it() {
    let mut f = Flights::default();
    // Whether the work may group is asked only deep in a queue (it takes the solo book's lock).
    let unasked = || -> bool { panic!("asked whether the work groups") };
    assert_eq!(f.position(1, 10, unasked), Some(Position::Idle));
    let p1 = f.plan(1, 10, None);
    f.queue.push_back(flight(100, 101, 10, p1));
    assert_eq!(f.position(1, 10, unasked), Some(Position::Behind));
    // A stream with nothing of its own in flight.
    assert_eq!(f.position(1, 20, || false), Some(Position::Idle));
    assert_eq!(f.position(2, 10, || false), Some(Position::Idle));
    f.skipped(1, 10);
    let p2 = f.plan(1, 10, None);
    assert_eq!(
        p2,
        Plan::alone(false),
        "its own start: not chained over the untimed launch"
    );
    assert!(!f.queue[0].lent_end);
    f.queue.push_back(flight(200, 201, 10, p2));
    // Two of the stream in flight: a deeper queue, where the launch would be timed on its own, samples
    // too (`Position::Deep`); a launch drawn to be timed there is chained.
    assert_eq!(f.position(1, 10, || false), Some(Position::Deep));
    let p3 = f.plan(1, 10, None);
    assert_eq!(p3.chained, Some(ev(201)));
}

// A launch planned chained on the front (its end lent, the launch not queued yet), or a group forming at
// the front, is no place to sample: the next launch is timed.
#[test]
fn a_front_lent_or_open_is_no_sampling_position() {
    let mut f = one_in_flight();
    let _lent = f.plan(1, 10, None);
    assert_eq!(f.position(1, 10, || false), None);
    let mut g = Flights::default();
    let p = g.plan(1, 10, None);
    g.queue.push_back(flight(100, 101, 10, p));
    g.queue[0].state = End::Open;
    assert_eq!(g.position(1, 10, || false), None);
}

// A deep queue holds few entries once launches go untimed: its depth is counted in launches. Behind
// SAMPLE_DEPTH launches since the oldest in flight a launch is no longer `Behind` (whose average is of
// launches the GPU reaches at once) but `Deep`: its own average.
#[test]
fn a_queue_deep_in_launches_is_the_deep_position_however_few_its_entries() {
    let mut f = Flights::default();
    let p1 = f.plan(1, 10, None);
    let mut a = flight(100, 101, 10, p1);
    a.seq = f.launches;
    f.queue.push_back(a);
    for _ in 0..SAMPLE_DEPTH {
        assert_eq!(f.position(1, 10, || false), Some(Position::Behind));
        f.skipped(1, 10);
    }
    assert_eq!(
        f.position(1, 10, || false),
        Some(Position::Deep),
        "{SAMPLE_DEPTH} launches behind the oldest"
    );
    assert_eq!(
        f.position(1, 20, || false),
        Some(Position::Idle),
        "another stream, nothing of its own"
    );
}

// Where a launch of short, measured work would join its stream's open group or open one (`plan`), it is
// timed there: a group costs one event for up to eight launches. Anywhere else in a deep queue it may
// go untimed (an H200 ran a 2048² torch.compile loop at 90% of its bare rate under 99% with every such
// launch timed on its own, one event record each).
#[test]
fn a_launch_that_would_group_is_no_sampling_position_and_one_that_would_not_is() {
    let mut f = deep();
    assert_eq!(f.position(1, 10, || true), None, "it would open a group");
    assert_eq!(
        f.position(1, 10, || false),
        Some(Position::Deep),
        "work that does not group"
    );
    let p = f.plan(1, 10, Some(100));
    assert_eq!(p.grouping, Grouping::Opens);
    push(&mut f, 3, p, 100);
    assert_eq!(f.position(1, 10, || true), None, "it would join the group");
    assert_eq!(f.position(1, 10, || false), None, "it closes the group");
    // Once an untimed launch came after the newest, nothing chains on it: no group opens there.
    let mut g = deep();
    g.skipped(1, 10);
    assert_eq!(
        g.position(1, 10, || panic!("no group can open: not asked")),
        Some(Position::Deep)
    );
    assert_eq!(g.position(1, 10, || true), Some(Position::Deep));
}
