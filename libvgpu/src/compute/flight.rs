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
//!
//! Deep queues are timed in groups. A timing event between two kernels costs the GPU itself time (an
//! H100 kept 87% of a 2048² matmul loop's rate with one after every matmul, 99% with one after every
//! fourth: `tests/gpu/event_cost.py`). So a launch queued behind unfinished work of its stream, whose work
//! was measured before and is short (`GROUP_FLOORS_NS`), opens a *group* instead of recording its end:
//! the next such launches join it with no event at all, and one end event after the group's last member
//! closes it. The group's interval is charged as a whole (`launch_charge::SoloBook::charge_group`).
//! A group is joined only while the launch before it on its stream is known unfinished (the harvest
//! found it so just before): then none of its members has started, the GPU cannot idle between them,
//! and the interval is all their work. A group is closed (its end recorded) once it has `GROUP_MAX`
//! members or its floors reach `GROUP_FLOORS_NS`, by the next launch on its stream that does not join,
//! when the harvest reaches it, before the thread naps, and before any synchronisation or query of a
//! stream or event, so that its end is recorded while its work still runs.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use super::events::{elapsed_ns, event_create, event_record};
use super::sample::Position;
use crate::ffi::*;
use crate::launch_charge::Work;

/// How many of the newest launches in flight are looked through for the previous one on a stream (a
/// launch on a stream with nothing that recent in flight gets its own start event).
const CHAIN_LOOKBACK: usize = 64;

/// Members of a group at most.
pub const GROUP_MAX: u32 = 8;
/// A group's members' floors sum to less than this. Longer work is timed launch by launch: an event costs
/// it little (a few microseconds of GPU time against a millisecond), and it is measured sooner.
pub const GROUP_FLOORS_NS: u64 = 1_000_000;

/// A group opens only behind this many unfinished launches of its stream besides the one before it. In a
/// queue the GPU keeps up with (a loop bound by its launch rate), a group would soon reach the front, its
/// end would be recorded there all the same, and the launches after it would find the queue never empty
/// and lose the cheap untimed path (`sample`): on an H100 a 2048² `torch.compile` loop kept 70% of its
/// rate under 99% with groups from the first unfinished launch, 82% without groups.
const OPEN_DEPTH: usize = 2;

/// A launch queued behind this many launches of the share (timed or not) since the oldest in flight is
/// in a deep queue: it is timed (chained, then in groups), not sampled (`sample`). Entries of the queue
/// alone cannot tell: after untimed launches the queue holds few entries however deep it is.
const SAMPLE_DEPTH: u64 = 3;

/// Whether a launch's (or group's) end event is recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Recorded after the launch: it can be queried.
    Recorded,
    /// A group still taking members: nothing recorded yet (a query would say complete).
    Open,
    /// A thread is recording it.
    Closing,
    /// Recording it failed: the group is never measured (charged as lost).
    Failed,
}

/// How a launch is timed with respect to groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grouping {
    /// Its own end event, recorded after it.
    Alone,
    /// It opens a group: its end event is recorded when the group closes.
    Opens,
    /// It joins the open group whose end event `Plan::chained` names: no event of its own.
    Joins,
}

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
    /// How many launches it stands for (a group's members; 1 for a launch timed alone).
    pub members: u32,
    /// The members' floors, summed as they joined (a group of different work is charged by them).
    pub floors: u64,
    /// The members ran different work (`work` is the first member's).
    pub mixed: bool,
    /// Whether its end is recorded (`End`).
    pub state: End,
    /// Launches planned into the group whose launch has not returned yet.
    pub joining: u32,
    /// Something asked to close the group while launches were joining: the last of them closes it.
    pub close_asked: bool,
    /// An untimed launch of its stream came after it (`sample`): its end is no later launch's start.
    pub skipped: bool,
    /// An event recorded right after its end (`sample::EventCost`), or null.
    pub probe: CUevent,
    /// The share's launch count when it was queued (`Flights::launches`).
    pub seq: u64,
    /// It was in a sampling position and drawn to be timed (or its work was not known enough yet): what
    /// it is charged teaches that position's average (`sample::Costs`).
    pub drawn: Option<Position>,
}

impl InFlight {
    /// A launch (or a group's first member) of `work`, its events filled in by `Timer::end`.
    pub fn new(ctx: usize, stream: usize, estimate: u64, work: Work, queued_at: u64) -> InFlight {
        InFlight {
            start: std::ptr::null_mut(),
            end: std::ptr::null_mut(),
            ctx,
            stream,
            estimate,
            work,
            queued_at,
            lent_end: false,
            opens_span: false,
            closes_span: false,
            ended_at: None,
            members: 1,
            floors: 0,
            mixed: false,
            state: End::Recorded,
            joining: 0,
            close_asked: false,
            skipped: false,
            probe: std::ptr::null_mut(),
            seq: 0,
            drawn: None,
        }
    }
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
    pub grouping: Grouping,
    /// `chained` is an open group's end, which this launch records before it is queued (the group
    /// closes, `Closing` until then).
    pub close_first: bool,
}

impl Plan {
    fn alone(opens_span: bool) -> Plan {
        Plan {
            chained: None,
            opens_span,
            grouping: Grouping::Alone,
            close_first: false,
        }
    }
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
    /// The end event of the queue's oldest launch when the harvest last found it still running: what
    /// proves a queue deep (`plan`). Cleared whenever the oldest leaves the queue.
    pending: Option<usize>,
    /// Groups open (their end not recorded).
    open: usize,
    /// Launches planned so far, timed or not: how deep the queue is behind its oldest launch.
    pub launches: u64,
}

// SAFETY: see InFlight and Span.
unsafe impl Send for Flights {}

impl Flights {
    /// How the next launch on `stream` of context `ctx` is timed; a chained start is lent at once (the
    /// previous launch's end is then kept for it when that launch is charged). `floor`: the least time
    /// its work took, when it may be timed in a group (`Share::groupable`).
    pub fn plan(&mut self, ctx: usize, stream: usize, floor: Option<u64>) -> Plan {
        self.launches += 1;
        let mut plan = Plan::alone(self.queue.is_empty());
        // The queue's oldest launch, found running just now, is of this stream: every later launch of
        // the stream is unfinished too (a stream runs in order).
        let deep_from = match (self.pending, self.queue.front()) {
            (Some(e), Some(f)) => f.end as usize == e && f.stream == stream && f.ctx == ctx,
            _ => false,
        };
        let Some(i) = self.newest_of(ctx, stream) else {
            return plan;
        };
        let p = &mut self.queue[i];
        match p.state {
            End::Recorded if !p.lent_end && !p.skipped => {
                p.lent_end = true;
                plan.chained = Some(p.end);
                if floor.is_some() && deep_from && i >= OPEN_DEPTH {
                    plan.grouping = Grouping::Opens;
                }
            }
            End::Open => {
                // None of the group's members has started: a launch of the stream before it is unfinished.
                let waiting = deep_from && i > 0;
                if let Some(fl) = floor {
                    if waiting
                        && !p.close_asked
                        && p.members + p.joining < GROUP_MAX
                        && p.floors.saturating_add(fl) < GROUP_FLOORS_NS
                    {
                        p.joining += 1;
                        plan.chained = Some(p.end);
                        plan.grouping = Grouping::Joins;
                        return plan;
                    }
                }
                if p.joining > 0 {
                    // Another thread's launch is joining: it closes the group; this one starts anew.
                    p.close_asked = true;
                    return plan;
                }
                p.state = End::Closing;
                p.lent_end = true;
                plan.chained = Some(p.end);
                plan.close_first = true;
                if floor.is_some() && waiting && i >= OPEN_DEPTH {
                    plan.grouping = Grouping::Opens;
                }
                self.open = self.open.saturating_sub(1);
            }
            _ => {}
        }
        plan
    }

    /// Whether a launch on `stream` of context `ctx` is in a sampling position (`sample::Position`), and
    /// which: nothing of its stream in flight, or a shallow queue: fewer than `SAMPLE_DEPTH` launches
    /// queued since the oldest in flight, and its stream's newest launch in flight among the first
    /// `OPEN_DEPTH`, its end recorded and not lent (a group forming, or a launch being chained on it, is
    /// timed on). Deeper queues are timed.
    pub fn position(&self, ctx: usize, stream: usize) -> Option<Position> {
        match self.newest_of(ctx, stream) {
            None => Some(Position::Idle),
            Some(i) if i < OPEN_DEPTH => {
                let p = &self.queue[i];
                let depth = self.launches.saturating_sub(self.queue[0].seq);
                (depth < SAMPLE_DEPTH && p.state == End::Recorded && !p.lent_end)
                    .then_some(Position::Behind)
            }
            Some(_) => None,
        }
    }

    /// An untimed launch on `stream` of context `ctx` is about to be queued: its stream's newest launch
    /// in flight lends no start from now on.
    pub fn skipped(&mut self, ctx: usize, stream: usize) {
        self.launches += 1;
        if let Some(i) = self.newest_of(ctx, stream) {
            self.queue[i].skipped = true;
        }
    }

    /// The index of the newest launch in flight on `stream` of context `ctx` (within `CHAIN_LOOKBACK`).
    fn newest_of(&self, ctx: usize, stream: usize) -> Option<usize> {
        (0..self.queue.len())
            .rev()
            .take(CHAIN_LOOKBACK)
            .find(|&i| self.queue[i].stream == stream && self.queue[i].ctx == ctx)
    }

    /// The oldest launch in flight leaves the queue (to be charged or retired).
    pub fn pop_front(&mut self) -> Option<InFlight> {
        self.pending = None;
        self.queue.pop_front()
    }

    /// The oldest launch goes back to the front of the queue: still running (`running`: a query said so,
    /// which proves the queue deep behind it) or its end not recorded yet.
    pub fn push_front(&mut self, f: InFlight, running: bool) {
        self.pending = running.then_some(f.end as usize);
        self.queue.push_front(f);
    }

    /// The launch in flight whose end event is `end`.
    fn by_end(&mut self, end: CUevent) -> Option<&mut InFlight> {
        self.queue.iter_mut().rev().find(|f| f.end == end)
    }

    /// Open groups (of context `ctx`, or all) to close: each is `Closing` on return, for the caller to
    /// record its end; one that launches are joining is left to the last of them (`close_asked`).
    fn closing(&mut self, ctx: Option<usize>, front_only: bool) -> Vec<(CUevent, usize)> {
        let mut out = Vec::new();
        let n = if front_only { 1 } else { self.queue.len() };
        for f in self.queue.iter_mut().take(n) {
            if f.state != End::Open || ctx.is_some_and(|c| c != f.ctx) {
                continue;
            }
            if f.joining > 0 {
                f.close_asked = true;
            } else {
                f.state = End::Closing;
                out.push((f.end, f.stream));
            }
        }
        self.open = self.open.saturating_sub(out.len());
        out
    }

    /// A group's end was recorded (`ok`) or could not be.
    fn closed(&mut self, end: CUevent, ok: bool) {
        if let Some(f) = self.by_end(end) {
            f.state = if ok { End::Recorded } else { End::Failed };
            if !ok {
                f.lent_end = false;
            }
        }
    }

    /// Whether a group is open.
    pub fn any_open(&self) -> bool {
        self.open > 0
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

    /// The oldest launch in flight is finished (it left the queue by `pop_front`): it goes to `retired`,
    /// and ends its span (dated `ended_at`) when nothing is in flight behind it.
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
    /// A group may be open: set under the queue's lock when one opens, cleared under it when
    /// `close_open` finds none; read without the lock, so that a query hook (`sync::polling`) costs one
    /// load when no group is open.
    maybe_open: AtomicBool,
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
    /// there); None when events cannot be had (the launch then goes unmeasured).
    pub fn begin(&self, ctx: usize, stream: CUstream, floor: Option<u64>) -> Option<Begun> {
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
            let ok = event_record(g, stream) == CUDA_SUCCESS;
            lock(&self.flights).closed(g, ok);
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
            self.record_closing(&[(end, stream)]);
        }
        found
    }

    /// Records the ends of groups made `Closing`.
    fn record_closing(&self, groups: &[(CUevent, usize)]) {
        for &(end, stream) in groups {
            let ok = event_record(end, stream as CUstream) == CUDA_SUCCESS;
            lock(&self.flights).closed(end, ok);
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
        self.record_closing(&groups);
    }

    /// Closes the oldest launch in flight if it is an open group (the harvest reached it: the work before
    /// it is finished, so its members run now).
    pub fn close_front(&self) {
        let groups = lock(&self.flights).closing(None, true);
        self.record_closing(&groups);
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
            q.pending = None;
            q.open = 0;
        }
        if let Ok(mut s) = self.spare.try_lock() {
            s.clear();
        }
    }
}

#[cfg(test)]
mod tests;
