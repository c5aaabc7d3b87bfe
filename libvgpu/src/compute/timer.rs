//! The driver's side of the launches in flight: a launch's events, got from the spare ones or made in
//! its stream's context, recorded at its start (unless chained or grouped, `Flights::plan`; on an idle
//! stream behind a `gate`), at its end,
//! and when a group closes; given back for reuse once the launch is charged.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use super::events::{
    capturing, elapsed_ns, event_create, event_record, position_ns, stream_create, stream_idle,
};
use super::flight::{End, Flights, Grouping, InFlight, Plan, Span, GROUP_FLOORS_NS, GROUP_MAX};
use super::gate::gate;
use super::overlap::{Anchor, Overlap};
use super::quiet::quiet;
use crate::ffi::*;
use crate::launch_charge::Work;

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
    /// A group may be open: set under the queue's lock when one opens, cleared under it when
    /// `close_open` finds none; read without the lock, so that a query hook (`sync::polling`) costs one
    /// load when no group is open.
    maybe_open: AtomicBool,
    /// Where the contexts' timed intervals lie on one clock, to charge overlap once (`overlap`).
    pub overlap: Overlap,
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
    /// it on its stream, still in flight, or joins an open group there (`Flights::plan`; `floor` as
    /// there); None when events cannot be had (the launch then goes unmeasured). `teaches`: what it is
    /// charged teaches its position's average (`InFlight::drawn`) and the GPU is the tenant's alone
    /// (`Share::alone`): its own start waits behind a `gate` on an idle stream.
    pub fn begin(
        &self,
        ctx: usize,
        stream: CUstream,
        floor: Option<u64>,
        teaches: bool,
    ) -> Option<Begun> {
        let mut plan = lock(&self.flights).plan(ctx, stream as usize, floor);
        if plan.grouping == Grouping::Joins {
            let g = plan.chained.unwrap_or(std::ptr::null_mut());
            return Some(Begun {
                start: g,
                end: g,
                plan,
            });
        }
        if let (true, Some(g)) = (plan.close_first, plan.chained) {
            // The group before this launch closes: its end, recorded now, is this launch's start.
            let stale = stream_idle(stream);
            let ok = event_record(g, stream) == CUDA_SUCCESS;
            lock(&self.flights).closed(g, ok, stale);
            if !ok {
                plan = Plan::alone(plan.opens_span);
            }
        }
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
        // A start of its own on an idle stream, for a launch whose charge the untimed ones are charged:
        // the gate first, so that the GPU reaches the start when the launch was submitted (`gate`).
        if teaches && plan.chained.is_none() {
            gate(stream);
        }
        if plan.chained.is_none() && event_record(start, stream) != CUDA_SUCCESS {
            self.unplanned(ctx, plan, Some(start), Some(end));
            return None;
        }
        Some(Begun { start, end, plan })
    }

    /// The events of a launch that was not queued, or whose end could not be recorded: a chained start
    /// goes back to the launch that lent it (or, charged meanwhile, to the spare ones). A launch that
    /// was to join a group leaves it.
    pub fn give_back(&self, ctx: usize, b: Begun) {
        if b.plan.grouping == Grouping::Joins {
            self.joined(b.end, None);
            return;
        }
        self.unplanned(ctx, b.plan, Some(b.start), Some(b.end));
    }

    /// A launch planned into the group ending at `end` returned: `Some((work, floor, estimate))` when
    /// the driver took it (it becomes a member), None when not. Closes the group when it is full or
    /// was asked to close. False when the group was not found open (the launch is then not measured).
    pub fn joined(&self, end: CUevent, member: Option<(Work, u64, u64)>) -> bool {
        let (found, close) = {
            let mut q = lock(&self.flights);
            let Some(g) = q.by_end(end) else {
                return false;
            };
            if g.state != End::Open {
                return false;
            }
            g.joining = g.joining.saturating_sub(1);
            if let Some((work, floor, estimate)) = member {
                g.members += 1;
                g.floors = g.floors.saturating_add(floor);
                g.mixed |= work != g.work;
                g.estimate = g.estimate.saturating_add(estimate);
            }
            let full = g.members >= GROUP_MAX || g.floors >= GROUP_FLOORS_NS;
            let close = g.joining == 0 && (full || g.close_asked);
            let stream = g.stream;
            if close {
                g.state = End::Closing;
                q.open = q.open.saturating_sub(1);
            }
            (true, close.then_some(stream))
        };
        if let Some(stream) = close {
            // Closed by its last member, just queued: its stream is busy.
            self.record_closing(&[(end, stream)], false);
        }
        found
    }

    /// Records the ends of groups made `Closing` (of any context: no teardown meanwhile). Never into a
    /// capture (a capture beginning closes groups first, `sync::capture_beginning`, but another thread may
    /// have begun one since): an end recorded there is a node of the application's graph, never timed; the
    /// group is then charged as a launch whose end failed (`Share::lost`: the wall time since it was queued).
    /// `late`: closed by something other than its last member's launch (the harvest, a nap, a
    /// synchronisation), when its work may have ended already: its stream is asked first, and a group
    /// whose stream has nothing left to run is stale (`InFlight::stale`).
    fn record_closing(&self, groups: &[(CUevent, usize)], late: bool) {
        let _quiet = (!groups.is_empty()).then(quiet);
        for &(end, stream) in groups {
            let stream = stream as CUstream;
            let ok = !capturing(stream);
            let stale = ok && late && stream_idle(stream);
            let ok = ok && event_record(end, stream) == CUDA_SUCCESS;
            lock(&self.flights).closed(end, ok, stale);
        }
    }

    /// Closes the open groups (of context `ctx`, or all): their work is queued, and the thread is about
    /// to wait, or the application to ask what finished. Cheap when none is open.
    pub fn close_open(&self, ctx: Option<usize>) {
        if !self.maybe_open.load(Ordering::Relaxed) {
            return;
        }
        let groups = {
            let mut q = lock(&self.flights);
            if !q.any_open() {
                self.maybe_open.store(false, Ordering::Relaxed);
                return;
            }
            q.closing(ctx, false)
        };
        self.record_closing(&groups, true);
    }

    /// Closes the oldest launch in flight if it is an open group (the harvest reached it: the work before
    /// it is finished, so its members run now).
    pub fn close_front(&self) {
        let groups = lock(&self.flights).closing(None, true);
        self.record_closing(&groups, true);
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
    /// events given back) when the end cannot be recorded. `probe`: a second event is recorded right
    /// after the end (`sample::EventCost`).
    pub fn end(
        &self,
        ctx: usize,
        stream: CUstream,
        b: Begun,
        mut f: InFlight,
        probe: bool,
    ) -> bool {
        let opens = b.plan.grouping == Grouping::Opens;
        if !opens && event_record(b.end, stream) != CUDA_SUCCESS {
            self.give_back(ctx, b);
            return false;
        }
        if probe && !opens {
            if let Some(e) = self.event(ctx) {
                if event_record(e, stream) == CUDA_SUCCESS {
                    f.probe = e;
                } else {
                    lock(&self.spare).push((ctx, e as usize));
                }
            }
        }
        f.start = b.start;
        f.end = b.end;
        f.opens_span = b.plan.opens_span;
        let mut q = lock(&self.flights);
        if opens {
            f.state = End::Open;
            q.open += 1;
            self.maybe_open.store(true, Ordering::Relaxed);
        }
        f.seq = q.launches;
        q.queue.push_back(f);
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
        if !f.probe.is_null() {
            reuse.push((f.ctx, f.probe));
        }
        lock(&self.spare).extend(reuse.into_iter().map(|(c, e)| (c, e as usize)));
        waited
    }

    /// What of a measured launch's `elapsed` interval no interval of its context charged before covered
    /// (`overlap`): all of it when its context ran on one stream so far, when it cannot be placed, and
    /// for a stale group (charged by its members' floors, its interval is not what it ran).
    pub fn uncovered(&self, f: &InFlight, elapsed: u64, now: u64) -> u64 {
        if f.stale {
            return elapsed;
        }
        let (epoch, gen) = match self.overlap.anchor(f.ctx, f.stream, now) {
            Anchor::Whole => return elapsed,
            Anchor::Place(e, g) => (e, g),
            Anchor::Due(stream) => match self.rebase(f.ctx, stream, now) {
                Ok(x) => x,
                Err(stream) => {
                    self.overlap.failed(f.ctx, stream, now);
                    return elapsed;
                }
            },
        };
        let Some(end) = position_ns(epoch, f.end) else {
            return elapsed;
        };
        let start = end.saturating_sub(elapsed as i64);
        self.overlap
            .place(f.ctx, gen, start, end)
            .map_or(elapsed, |ns| ns.min(elapsed))
    }

    /// Records a new epoch for context `ctx` on its clock's stream (`stream`, made when null); the old
    /// epoch goes back to the spare events. Err with the clock's stream (null if none could be made)
    /// when nothing could be recorded.
    fn rebase(&self, ctx: usize, stream: CUstream, now: u64) -> Result<(CUevent, u64), CUstream> {
        let mut stream = stream;
        if stream.is_null() {
            let r = crate::streams::in_context(ctx, || stream_create(&mut stream));
            if r != Ok(CUDA_SUCCESS) {
                return Err(std::ptr::null_mut());
            }
        }
        let e = self.event(ctx).ok_or(stream)?;
        if event_record(e, stream) != CUDA_SUCCESS {
            lock(&self.spare).push((ctx, e as usize));
            return Err(stream);
        }
        let Some((gen, old)) = self.overlap.rebased(ctx, stream, e, now) else {
            // The context was forgotten meanwhile: its stream and events are its own.
            lock(&self.spare).push((ctx, e as usize));
            return Err(stream);
        };
        if !old.is_null() {
            lock(&self.spare).push((ctx, old as usize));
        }
        Ok((e, gen))
    }

    /// Context `c` is gone: its spare events, its span's start and its clock died with it.
    pub fn forget_context(&self, c: usize) {
        self.overlap.forget(c);
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
            q.pending = None;
            q.open = 0;
        }
        if let Ok(mut s) = self.spare.try_lock() {
            s.clear();
        }
        self.overlap.forget_parent();
    }
}
