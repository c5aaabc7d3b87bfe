//! Which launches are timed when the GPU keeps up with the CPU. Timing a launch costs event records (on an
//! H100 a record costs about a third of a launch, and a timing event between two kernels costs the GPU
//! ~3.5 µs too), and a loop bound by its launch rate (`torch.compile`'s, two launches per matmul) lost
//! 15–30% of its throughput to them. So a launch in a *sampling position* of work already timed
//! `MIN_MEASURED` times after its first is timed one time in `TIMED_ONE_IN`, at random; the others are
//! charged at once what that work's timed launches in the same position were charged on average
//! (`Costs`), and cost no event. The positions (`Position`):
//! - `Idle`: nothing of the launch's stream in flight. Timed, it needs a start event of its own, held
//!   back on an idle stream until the launch is submitted (`gate`); without the gate the GPU reached it
//!   before the launch, and its time included the host's time to submit it.
//! - `Behind`: its stream's one launch in flight is the oldest of the share's (the queue is shallow: the
//!   GPU keeps up). Timed, it is timed from that launch's end, or from a start of its own when an untimed
//!   launch came between (`flight::Flights::skipped`).
//! - `Deep`: deeper in a queue, where it would be timed on its own (chained, one record). Sampled, a
//!   loop whose queue hovers a few launches deep (a 2048² `torch.compile` loop on an H200) went from
//!   ~0.45 event records a launch to ~0.3, and alone under 99% from 92.6–100.1% of its bare rate to
//!   93.5–100.9% (same calls, pinned).
//!
//! A launch that would join its stream's open group or open one (`flight`: one event for up to eight
//! launches, exactly) is timed there, and so is the first launch after a synchronisation (it opens the
//! span whose wait the next one dates) and every graph.
//!
//! Which launch is timed is drawn at random so that a program cannot make its timed launches cheap and
//! the others dear: the average is of a random sample of its launches of the same work (function and grid)
//! in the same position, whatever their arguments make them cost. Only launches that went through the
//! draw are learned from (`InFlight::drawn`): a launch always timed (the first after a synchronisation, one
//! in a deeper queue) is one the program can tell apart.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::launch_charge::{Work, WorkMap};

/// One launch in this many (of work already known, in a sampling position) is timed. A timed launch
/// costs one or two event records; one in four left a launch-bound loop ~0.5 records a launch.
pub const TIMED_ONE_IN: u64 = 8;
/// One launch in this many is timed when its work's average in that position is under `SHORT_NS`. An
/// event record costs the host ~1.3 µs on an H200 (a launch ~3.9), so timing one in eight short launches
/// (a batch-1 decode step's ~1–3 µs kernels, each launched onto an idle GPU: two records each) cost such a
/// loop ~0.35 µs a launch, a few percent of its rate; one in 32 costs it a quarter of that. Longer work
/// keeps one in eight: its events are cheap beside it, and its average follows its changes sooner.
pub const TIMED_ONE_IN_SHORT: u64 = 32;
/// Work shorter than this on average in a position is sampled one in `TIMED_ONE_IN_SHORT`.
pub const SHORT_NS: u64 = 20_000;
/// Launches onto an idle stream timed at most about this often a second, whatever the rates above say.
/// Such a launch, when it teaches its position's average, waits behind a host function (`gate`), whose
/// round trip through the driver's thread cost ~25 µs of the process's CPU on an H200 when the process
/// was pinned to one CPU (a convolution loop's library time went from 2.8 to 5.3 µs a launch at one in
/// eight): 200 a second is at most ~0.5% of a CPU. Still a random draw, launch by launch: the rate only
/// sets the odds.
pub const IDLE_TIMED_PER_S: u64 = 200;
/// The idle launches' rate is read every this many of them (one clock read), over at least
/// `IDLE_RATE_NS`.
const IDLE_RATE_EVERY: u64 = 64;
const IDLE_RATE_NS: u64 = 100_000_000;
/// Launches of a work timed before any of it goes untimed.
pub const MIN_MEASURED: u32 = 8;

/// Where a launch that may go untimed stands (the module's doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Position {
    /// Nothing of its stream in flight.
    Idle,
    /// Behind its stream's one launch in flight, the oldest of the share's.
    Behind,
    /// Deeper in a queue, where it would be timed on its own (not in a group).
    Deep,
}

/// How many positions there are (each work keeps an average for each).
const POSITIONS: usize = 3;

impl Position {
    fn index(self) -> usize {
        match self {
            Position::Idle => 0,
            Position::Behind => 1,
            Position::Deep => 2,
        }
    }
}

/// What timed launches of each work were charged on average in each position, and the draw of which
/// launch is timed.
pub struct Costs {
    by_work: Mutex<WorkMap<[(u64, u32); POSITIONS]>>,
    rng: AtomicU64,
    idle: IdleRate,
}

/// How fast launches come onto idle streams, and so how seldom one is timed (`IDLE_TIMED_PER_S`).
#[derive(Default)]
struct IdleRate {
    /// Idle launches since `since`.
    count: AtomicU64,
    /// When the count started (CLOCK_MONOTONIC ns; 0: not yet).
    since: AtomicU64,
    /// One in how many is timed at least, from the last rate read (0: no limit yet).
    one_in: AtomicU64,
}

impl IdleRate {
    /// One more idle launch, `now` read only every `IDLE_RATE_EVERY`: one in how many is timed at least.
    fn launched(&self, now: impl FnOnce() -> u64) -> u64 {
        let n = self.count.fetch_add(1, Ordering::Relaxed) + 1;
        if n.is_multiple_of(IDLE_RATE_EVERY) {
            let now = now();
            let since = self.since.load(Ordering::Relaxed);
            if since == 0 {
                self.since.store(now, Ordering::Relaxed);
                self.count.store(0, Ordering::Relaxed);
            } else if now.saturating_sub(since) >= IDLE_RATE_NS {
                let per_s = n.saturating_mul(1_000_000_000) / now.saturating_sub(since);
                self.one_in
                    .store(per_s / IDLE_TIMED_PER_S, Ordering::Relaxed);
                self.since.store(now, Ordering::Relaxed);
                self.count.store(0, Ordering::Relaxed);
            }
        }
        self.one_in.load(Ordering::Relaxed)
    }
}

impl Costs {
    pub fn new(seed: u64) -> Costs {
        Costs {
            by_work: Mutex::new(WorkMap::default()),
            rng: AtomicU64::new(seed | 1),
            idle: IdleRate::default(),
        }
    }

    /// A timed launch of `work` drawn in position `at` was charged `ns`. The first one of a work is not learned: it carries the
    /// work's first use (a module's load, a copy's first touch of its buffers; on the fake driver a first
    /// 4 MiB copy took 24 ms, the next ones 2.1). Then the plain mean of the first `MIN_MEASURED`, then a
    /// moving average over about the last 8.
    pub fn learned(&self, work: Work, at: Position, ns: u64) {
        let mut m = self.by_work.lock().unwrap_or_else(|e| e.into_inner());
        let e = &mut m.entry(work).or_insert([(0, 0); POSITIONS])[at.index()];
        e.1 = e.1.saturating_add(1);
        let n = e.1 as u64 - 1;
        if n == 0 {
            return;
        }
        let weight = n.min(MIN_MEASURED as u64);
        e.0 = (e.0 as i128 + (ns as i128 - e.0 as i128) / weight as i128) as u64;
    }

    /// Whether a launch of `work` in position `at` goes untimed, and then its charge. `alone`: the GPU is
    /// the tenant's alone (`Share::alone`): short work one in `TIMED_ONE_IN_SHORT`, idle launches at most
    /// about `IDLE_TIMED_PER_S` a second; else one in `TIMED_ONE_IN`.
    pub fn untimed(&self, work: Work, at: Position, alone: bool) -> Option<u64> {
        self.untimed_at(work, at, alone, crate::clock::mono_ns)
    }

    /// `untimed`, the clock given (read once every `IDLE_RATE_EVERY` idle launches).
    fn untimed_at(
        &self,
        work: Work,
        at: Position,
        alone: bool,
        now: impl FnOnce() -> u64,
    ) -> Option<u64> {
        let least = match (at, alone) {
            (Position::Idle, true) => self.idle.launched(now),
            _ => 0,
        };
        let avg = {
            let m = self.by_work.lock().unwrap_or_else(|e| e.into_inner());
            m.get(&work)
                .map(|by_position| by_position[at.index()])
                .filter(|(_, n)| *n > MIN_MEASURED)
                .map(|(ns, _)| ns)?
        };
        let one_in = match alone && avg < SHORT_NS {
            true => TIMED_ONE_IN_SHORT,
            false => TIMED_ONE_IN,
        };
        (!self.draw().is_multiple_of(one_in.max(least))).then_some(avg)
    }

    /// The next draw (xorshift64*).
    fn draw(&self) -> u64 {
        let mut x = self.rng.load(Ordering::Relaxed);
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.store(x, Ordering::Relaxed);
        x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32
    }
}

/// Probes of the event cost kept (the estimate is their least).
const PROBES: usize = 8;
/// Probes needed before the estimate is used.
const PROBES_FIRST: usize = 4;
/// The most an untimed launch's charge is lowered by for the event it did not cost, and at most a
/// quarter of the charge: a probe a neighbour's time slice fell into reads long, and the least of the
/// recent ones still could.
pub const EVENT_COST_MAX_NS: u64 = 20_000;
/// One timed launch in this many (of those queued behind work) is followed by a probe.
pub const PROBE_EVERY: u64 = 16;

/// What a timing event costs the GPU. A timed launch's interval holds one event's cost (the end event
/// drains the GPU before it writes its time; an H100 ran a loop of 2048² matmuls 13% slower with one
/// after each), which an untimed launch does not cost. So one timed launch in `PROBE_EVERY` queued
/// behind work is followed by a second event at once (`flight::InFlight::probe`): the time between the
/// two is one event's cost, nothing of any kernel. The estimate is the least of the last `PROBES`, and
/// an untimed launch is charged its position's average less that (`untimed_charge`). The probes are the
/// library's own events: a program can lengthen one only with another context's work falling between
/// them, which the least of eight and the bounds leave little of.
#[derive(Default)]
pub struct EventCost {
    recent: Mutex<([u64; PROBES], usize)>,
    estimate: AtomicU64,
}

impl EventCost {
    /// A probe read `ns` between the end event and the probe.
    pub fn observed(&self, ns: u64) {
        let mut r = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        let (ring, n) = &mut *r;
        ring[*n % PROBES] = ns;
        *n += 1;
        if *n >= PROBES_FIRST {
            let least = ring[..(*n).min(PROBES)].iter().copied().min().unwrap_or(0);
            self.estimate.store(least, Ordering::Relaxed);
        }
    }

    /// The charge of an untimed launch whose position's timed launches were charged `avg` on average.
    pub fn untimed_charge(&self, avg: u64) -> u64 {
        let e = self
            .estimate
            .load(Ordering::Relaxed)
            .min(EVENT_COST_MAX_NS)
            .min(avg / 4);
        avg - e
    }
}

/// A seed no program chooses: the time when the share was made and this process's id.
pub fn seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t ^ ((std::process::id() as u64) << 32)
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Work = (0x100, [1, 1, 1]);
    const I: Position = Position::Idle;

    #[test]
    fn unknown_work_is_always_timed_and_known_work_one_time_in_timed_one_in() {
        let c = Costs::new(12345);
        assert!(
            (0..100).all(|_| c.untimed(W, I, true).is_none()),
            "never timed yet"
        );
        for _ in 0..MIN_MEASURED {
            c.learned(W, I, 1000);
        }
        assert!(
            (0..100).all(|_| c.untimed(W, I, true).is_none()),
            "timed too few times"
        );
        c.learned(W, I, 1000);
        let untimed = (0..10_000)
            .filter(|_| c.untimed(W, I, true).is_some())
            .count();
        let expected = 10_000 - 10_000 / TIMED_ONE_IN_SHORT as usize;
        assert!(
            (expected - 500..expected + 500).contains(&untimed),
            "{untimed}"
        );
        assert_eq!(
            c.untimed(W, I, true).or_else(|| c.untimed(W, I, true)),
            Some(1000)
        );
    }

    // Short work (a decode step's kernels) is timed one time in 32 while the GPU is the tenant's alone,
    // longer work, or any beside a busy neighbour, one in eight.
    #[test]
    fn short_work_is_timed_more_seldom_than_long_work() {
        let c = Costs::new(4242);
        let long = (0x300, [8, 1, 1]);
        // Behind a launch in flight: idle launches are limited by their rate too (below).
        let at = Position::Behind;
        for _ in 0..=MIN_MEASURED {
            c.learned(W, at, SHORT_NS - 1);
            c.learned(long, at, SHORT_NS);
        }
        let untimed = |w| {
            (0..20_000)
                .filter(|_| c.untimed(w, at, true).is_some())
                .count()
        };
        let (short, long) = (untimed(W), untimed(long));
        let expect = |one_in: u64| 20_000 - 20_000 / one_in as usize;
        assert!(short.abs_diff(expect(TIMED_ONE_IN_SHORT)) < 300, "{short}");
        assert!(long.abs_diff(expect(TIMED_ONE_IN)) < 400, "{long}");
        // Beside a busy neighbour every work is timed one in eight.
        let sharing = (0..20_000)
            .filter(|_| c.untimed(W, at, false).is_some())
            .count();
        assert!(sharing.abs_diff(expect(TIMED_ONE_IN)) < 400, "{sharing}");
    }

    // Launches onto idle streams faster than IDLE_TIMED_PER_S a second are timed about that often, at
    // random; slower ones at the work's own odds; other positions are not limited.
    #[test]
    fn idle_launches_are_timed_at_most_about_idle_timed_per_s() {
        let c = Costs::new(777);
        for _ in 0..=MIN_MEASURED {
            c.learned(W, I, 1000);
            c.learned(W, Position::Behind, 1000);
        }
        // 100,000 idle launches a second (10 us apart) for 2 s.
        let mut t = 1_000_000_000u64;
        let mut timed = 0;
        for _ in 0..200_000 {
            t += 10_000;
            timed += c.untimed_at(W, I, true, || t).is_none() as u32;
        }
        // The first 100 ms at the work's odds (1 in 32: ~312), then ~200 a second.
        assert!((500..1000).contains(&timed), "{timed}");
        let behind = (0..32_000)
            .filter(|_| c.untimed(W, Position::Behind, true).is_none())
            .count();
        assert!((700..1300).contains(&behind), "{behind}");
        // Slower again (1,000 a second): the work's own odds.
        let mut timed = 0;
        for _ in 0..5_000 {
            t += 1_000_000;
            timed += c.untimed_at(W, I, true, || t).is_none() as u32;
        }
        assert!((100..400).contains(&timed), "{timed}");
    }

    // Regression (fake driver, eager 4 MiB copies at 10%: 5–9% where the library before sampling gave
    // 9.5%): the first timed copy took 24 ms (its buffers' first use), the next ones 2.1 ms, and an
    // average seeded with the first charged the untimed copies ~10.9 ms each.
    #[test]
    fn the_first_use_of_a_work_does_not_make_its_untimed_launches_dear() {
        let c = Costs::new(99);
        c.learned(W, I, 24_000_000);
        for _ in 0..MIN_MEASURED {
            c.learned(W, I, 2_100_000);
        }
        let ns = (0..100).find_map(|_| c.untimed(W, I, true)).unwrap();
        assert_eq!(ns, 2_100_000);
    }

    // A launch with nothing of its stream in flight is timed from a start event the GPU may reach before
    // the launch (the host's own time to queue it then counts); one behind its stream's launch in flight
    // is timed from when the GPU ends that one. Each position has its own average.
    #[test]
    fn each_position_has_its_own_average() {
        let c = Costs::new(5);
        for _ in 0..=MIN_MEASURED {
            c.learned(W, Position::Idle, 3000);
            c.learned(W, Position::Behind, 1000);
        }
        let idle = (0..100)
            .find_map(|_| c.untimed(W, Position::Idle, true))
            .unwrap();
        let behind = (0..100)
            .find_map(|_| c.untimed(W, Position::Behind, true))
            .unwrap();
        assert_eq!((idle, behind), (3000, 1000));
        assert!((0..100).all(|_| c
            .untimed((0x200, [1, 1, 1]), Position::Behind, true)
            .is_none()));
    }

    // Regression (fake driver, 40 us kernels each ~70 us apart, 15 us a timing event, at 90%): untimed
    // launches were charged what the timed ones cost, their event included, 95 us a launch where the GPU
    // spent ~87: the share held the loop back below its 90%.
    #[test]
    fn an_untimed_launch_is_charged_less_the_event_it_did_not_cost() {
        let e = EventCost::default();
        e.observed(15_000);
        assert_eq!(e.untimed_charge(95_000), 95_000, "one probe is not enough");
        for ns in [16_000, 15_500, 15_200] {
            e.observed(ns);
        }
        assert_eq!(e.untimed_charge(95_000), 80_000);
        // A probe a neighbour's slice fell into does not raise the estimate; the least of the last eight
        // is kept, so an old low reading ages out.
        e.observed(3_000_000);
        assert_eq!(e.untimed_charge(95_000), 80_000);
        // Bounded: at most a quarter of the charge, at most EVENT_COST_MAX_NS.
        assert_eq!(e.untimed_charge(40_000), 30_000);
        for _ in 0..PROBES {
            e.observed(1_000_000);
        }
        assert_eq!(e.untimed_charge(1_000_000), 1_000_000 - EVENT_COST_MAX_NS);
    }

    // A program whose launches of one work alternate cheap and dear (its arguments decide) is charged the
    // average of both, whichever ones were timed.
    #[test]
    fn untimed_launches_are_charged_what_a_random_sample_of_timed_ones_cost() {
        let c = Costs::new(777);
        let mut charged = 0u64;
        let mut truth = 0u64;
        for i in 0..100_000u64 {
            let cost = if i % 2 == 0 { 100 } else { 10_000 };
            truth += cost;
            match c.untimed(W, I, true) {
                Some(ns) => charged += ns,
                None => {
                    c.learned(W, I, cost);
                    charged += cost;
                }
            }
        }
        let ratio = charged as f64 / truth as f64;
        assert!((0.9..1.1).contains(&ratio), "{ratio}");
    }
}
