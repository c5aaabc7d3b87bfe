//! The launches of one device's share in flight (recorded, not yet charged), and which events time them.
//! Pure bookkeeping: the driver calls are `compute`'s.
//!
//! Each launch's elapsed time is meant to be the time its work waited in the GPU's queue, not only the
//! time its own kernels ran: on a GPU time-sliced between contexts, another context's slices fall between
//! a tenant's launches, and that time is what two busy tenants share (docs/libvgpu.md, "Sharing the GPU's
//! time"). So a launch queued while the previous launch on its stream is still in flight does not get a
//! start event of its own: it is timed from that launch's end (`Plan::chained`), which covers whatever ran
//! between the two, and costs one event record instead of two. A launch queued behind nothing starts a
//! *span*; the span's first start event is kept until the span ends, so that a blocking synchronisation
//! that finds the span's work still running can tell how long its first launch waited before the GPU
//! took it up (`Span::waited`) — the wait a tenant that synchronises after every batch meets each time.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};

use super::events::{elapsed_ns, event_create, event_record};
use crate::ffi::*;
use crate::launch_charge::Work;

/// How many of the newest launches in flight are looked through for the previous one on a stream (a
/// launch on a stream with nothing that recent in flight gets its own start event).
const CHAIN_LOOKBACK: usize = 64;

/// A launch recorded between two events, not yet charged.
pub struct InFlight {
    pub start: CUevent,
    pub end: CUevent,
    pub ctx: usize,
    pub stream: usize,
    pub estimate: u64,
    pub work: Work,
    /// When it was queued (CLOCK_MONOTONIC ns): what bounds it when it can never be measured.
    pub queued_at: u64,
    /// Its end event is the next launch's start: not reused when this launch is charged.
    pub lent_end: bool,
    /// The first launch of a span: its start event is kept in the span when it is charged.
    pub opens_span: bool,
    /// The last launch of a span (nothing of the share was in flight behind it when it was found
    /// finished): the span ends when it is charged.
    pub closes_span: bool,
    /// When a blocking synchronisation that found it running returned (its span's end), if one did.
    pub ended_at: Option<u64>,
}

// SAFETY: events are driver handles, usable from any thread.
unsafe impl Send for InFlight {}

/// How a launch about to be queued is timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// The end event of the previous launch on the same stream, still in flight: this launch's start.
    pub chained: Option<CUevent>,
    /// Nothing of this share is in flight: the launch starts a span.
    pub opens_span: bool,
}

/// The first launch of the work in flight since the share was last idle.
pub struct Span {
    pub start: CUevent,
    pub ctx: usize,
    pub queued_at: u64,
}

// SAFETY: an event is a driver handle, usable from any thread.
unsafe impl Send for Span {}

impl Span {
    /// How long the span's first launch waited before the GPU started it, when the span's last launch
    /// ended at `ended_at` (a blocking synchronisation that found it running returned then) and took
    /// `extent` ns of GPU time after the span's first start event.
    pub fn waited(&self, ended_at: u64, extent: u64) -> u64 {
        ended_at
            .saturating_sub(extent)
            .saturating_sub(self.queued_at)
    }
}

/// The launches in flight, oldest first, the finished ones a synchronisation retired (not charged yet),
/// and the open span.
#[derive(Default)]
pub struct Flights {
    pub queue: VecDeque<InFlight>,
    /// Launches a synchronisation found finished, oldest first: charged at the next synchronisation
    /// before it waits (`compute::sync::syncing`), while the GPU runs what was queued since, not while it waits
    /// for the CPU's next launch. They lend no start (`plan` looks at `queue` only) and are charged
    /// before anything in `queue`.
    pub retired: VecDeque<InFlight>,
    pub span: Option<Span>,
}

// SAFETY: see InFlight and Span.
unsafe impl Send for Flights {}

impl Flights {
    /// How the next launch on `stream` of context `ctx` is timed; a chained start is lent at once (the
    /// previous launch's end is then kept for it when that launch is charged).
    pub fn plan(&mut self, ctx: usize, stream: usize) -> Plan {
        let opens_span = self.queue.is_empty();
        let prev = self
            .queue
            .iter_mut()
            .rev()
            .take(CHAIN_LOOKBACK)
            .find(|f| f.stream == stream && f.ctx == ctx);
        let chained = match prev {
            Some(p) if !p.lent_end => {
                p.lent_end = true;
                Some(p.end)
            }
            _ => None,
        };
        Plan {
            chained,
            opens_span,
        }
    }

    /// A launch planned chained on `start` was not queued: its lender keeps its end again. False when
    /// the lender was charged meanwhile (it left the event to this launch, which must reuse it).
    pub fn unlend(&mut self, start: CUevent) -> bool {
        match self.queue.iter_mut().find(|f| f.lent_end && f.end == start) {
            Some(f) => {
                f.lent_end = false;
                true
            }
            None => false,
        }
    }

    /// The newest launch: its end event (what a synchronisation waits for last), stream and context.
    pub fn newest(&self) -> Option<(CUevent, usize, usize)> {
        self.queue.back().map(|f| (f.end, f.stream, f.ctx))
    }

    /// The oldest launch in flight is finished: it leaves the queue for `retired`, and ends its span
    /// (dated `ended_at`) when nothing is in flight behind it.
    pub fn retire(&mut self, mut f: InFlight, ended_at: Option<u64>) {
        f.closes_span = self.queue.is_empty();
        f.ended_at = ended_at.filter(|_| f.closes_span);
        self.retired.push_back(f);
    }
}

/// A launch's events between `Timer::begin` and `Timer::end`.
pub struct Begun {
    pub start: CUevent,
    pub end: CUevent,
    pub plan: Plan,
}

/// The launches of one device's share in flight and the events that time them (the driver calls).
#[derive(Default)]
pub struct Timer {
    pub flights: Mutex<Flights>,
    /// Events whose launch was charged, for reuse, by context.
    spare: Mutex<Vec<(usize, usize)>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Timer {
    /// An event of context `ctx`: a spare one, else one made with `ctx` current (events and the stream
    /// they are recorded on must be of one context, whatever context the launching thread has current).
    fn event(&self, ctx: usize) -> Option<CUevent> {
        {
            let mut spare = lock(&self.spare);
            if let Some(i) = spare.iter().position(|&(c, _)| c == ctx) {
                return Some(spare.swap_remove(i).1 as CUevent);
            }
        }
        let mut e: CUevent = std::ptr::null_mut();
        let r = crate::streams::in_context(ctx, || event_create(&mut e));
        (r == Ok(CUDA_SUCCESS)).then_some(e)
    }

    /// Gets a launch's events and records its start, unless it is timed from the end of the launch before
    /// it on its stream, still in flight (`flight`); None when events cannot be had (the launch then goes
    /// unmeasured).
    pub fn begin(&self, ctx: usize, stream: CUstream) -> Option<Begun> {
        let plan = lock(&self.flights).plan(ctx, stream as usize);
        let start = match plan.chained {
            Some(start) => Some(start),
            None => self.event(ctx),
        };
        let Some(start) = start else {
            self.unplanned(ctx, plan, None, None);
            return None;
        };
        let Some(end) = self.event(ctx) else {
            self.unplanned(ctx, plan, Some(start), None);
            return None;
        };
        if plan.chained.is_none() && event_record(start, stream) != CUDA_SUCCESS {
            self.unplanned(ctx, plan, Some(start), Some(end));
            return None;
        }
        Some(Begun { start, end, plan })
    }

    /// The events of a launch that was not queued, or whose end could not be recorded: a chained start
    /// goes back to the launch that lent it (or, charged meanwhile, to the spare ones).
    pub fn give_back(&self, ctx: usize, b: Begun) {
        self.unplanned(ctx, b.plan, Some(b.start), Some(b.end));
    }

    fn unplanned(&self, ctx: usize, plan: Plan, start: Option<CUevent>, end: Option<CUevent>) {
        let own_start = match plan.chained {
            Some(lent) => !lock(&self.flights).unlend(lent),
            None => true,
        };
        let mut spare = lock(&self.spare);
        for e in [start.filter(|_| own_start), end].into_iter().flatten() {
            spare.push((ctx, e as usize));
        }
    }

    /// Records the end event after a launch the driver took and puts the launch in flight; false (its
    /// events given back) when the end cannot be recorded.
    pub fn end(&self, ctx: usize, stream: CUstream, b: Begun, mut f: InFlight) -> bool {
        if event_record(b.end, stream) != CUDA_SUCCESS {
            self.give_back(ctx, b);
            return false;
        }
        f.start = b.start;
        f.end = b.end;
        f.opens_span = b.plan.opens_span;
        lock(&self.flights).queue.push_back(f);
        true
    }

    /// A measured launch was charged: its events go back for reuse, except an end lent to the next
    /// launch and a span's first start. When it closes its span, the span ends; returns how long the
    /// span's first launch waited before the GPU took it up, when `f.ended_at` says when it ended.
    pub fn settled(&self, f: &InFlight) -> Option<u64> {
        let mut waited = None;
        let mut reuse = Vec::with_capacity(3);
        let closed = {
            let mut q = lock(&self.flights);
            if f.opens_span {
                if let Some(old) = q.span.replace(Span {
                    start: f.start,
                    ctx: f.ctx,
                    queued_at: f.queued_at,
                }) {
                    reuse.push((old.ctx, old.start));
                }
            } else {
                reuse.push((f.ctx, f.start));
            }
            if f.closes_span {
                q.span.take()
            } else {
                None
            }
        };
        if let Some(span) = closed {
            if let (Some(t), true) = (f.ended_at, span.ctx == f.ctx) {
                if let Some(extent) = elapsed_ns(span.start, f.end) {
                    waited = Some(span.waited(t, extent));
                }
            }
            reuse.push((span.ctx, span.start));
        }
        if !f.lent_end {
            reuse.push((f.ctx, f.end));
        }
        lock(&self.spare).extend(reuse.into_iter().map(|(c, e)| (c, e as usize)));
        waited
    }

    /// Context `c` is gone: its spare events and its span's start died with it.
    pub fn forget_context(&self, c: usize) {
        lock(&self.spare).retain(|&(owner, _)| owner != c);
        let mut q = lock(&self.flights);
        if q.span.as_ref().is_some_and(|s| s.ctx == c) {
            q.span = None;
        }
    }

    /// In a child after `fork`: what is in flight and the spare events are the parent's. A lock another
    /// thread held at the fork stays held in the child: then nothing is dropped.
    pub fn forget_parent(&self) {
        if let Ok(mut q) = self.flights.try_lock() {
            q.queue.clear();
            q.retired.clear();
            q.span = None;
        }
        if let Ok(mut s) = self.spare.try_lock() {
            s.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(n: usize) -> CUevent {
        n as CUevent
    }

    fn flight(start: usize, end: usize, stream: usize, plan: Plan) -> InFlight {
        InFlight {
            start: plan.chained.unwrap_or(ev(start)),
            end: ev(end),
            ctx: 1,
            stream,
            estimate: 0,
            work: (0, [1, 1, 1]),
            queued_at: 0,
            lent_end: false,
            opens_span: plan.opens_span,
            closes_span: false,
            ended_at: None,
        }
    }

    #[test]
    fn a_launch_behind_one_in_flight_on_its_stream_is_timed_from_its_end() {
        let mut f = Flights::default();
        let p1 = f.plan(1, 10);
        assert_eq!(
            p1,
            Plan {
                chained: None,
                opens_span: true
            }
        );
        f.queue.push_back(flight(100, 101, 10, p1));
        // Another stream: its own start, no span (work is in flight).
        let p2 = f.plan(1, 20);
        assert_eq!(
            p2,
            Plan {
                chained: None,
                opens_span: false
            }
        );
        f.queue.push_back(flight(200, 201, 20, p2));
        // The same stream again: from the first launch's end, which is now lent.
        let p3 = f.plan(1, 10);
        assert_eq!(p3.chained, Some(ev(101)));
        assert!(f.queue[0].lent_end && !f.queue[1].lent_end);
        f.queue.push_back(flight(0, 301, 10, p3));
        assert_eq!(f.queue[2].start, ev(101));
        // The same stream of another context is another stream.
        assert_eq!(f.plan(2, 10).chained, None);
        assert_eq!(f.newest(), Some((ev(301), 10, 1)));
    }

    #[test]
    fn a_chained_launch_that_was_not_queued_gives_the_end_back() {
        let mut f = Flights::default();
        let p1 = f.plan(1, 10);
        f.queue.push_back(flight(100, 101, 10, p1));
        let p2 = f.plan(1, 10);
        assert!(f.unlend(p2.chained.unwrap()));
        assert!(!f.queue[0].lent_end);
        // Lent again, then the lender is charged before the launch fails: the launch owns the event.
        let p3 = f.plan(1, 10);
        f.queue.pop_front();
        assert!(!f.unlend(p3.chained.unwrap()));
    }

    // A synchronisation retires what it found finished; charging waits for the next launch. The retired
    // launches must not lend a start to it (their ends are in the past: the launch would be timed from
    // before the application queued it) and the next launch opens a span of its own, while the retired
    // span still ends (dated) at its last launch.
    #[test]
    fn retired_launches_end_their_span_and_lend_nothing() {
        let mut f = Flights::default();
        let p1 = f.plan(1, 10);
        f.queue.push_back(flight(100, 101, 10, p1));
        let p2 = f.plan(1, 10);
        f.queue.push_back(flight(0, 201, 10, p2));
        let a = f.queue.pop_front().unwrap();
        f.retire(a, Some(5_000));
        let b = f.queue.pop_front().unwrap();
        f.retire(b, Some(5_000));
        assert!(!f.retired[0].closes_span && f.retired[0].ended_at.is_none());
        assert!(f.retired[1].closes_span);
        assert_eq!(f.retired[1].ended_at, Some(5_000));
        let p3 = f.plan(1, 10);
        assert_eq!(
            p3,
            Plan {
                chained: None,
                opens_span: true
            }
        );
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
}
