//! The launches of one device's share in flight (recorded, not yet charged), and which events time them.
//! Pure bookkeeping: the driver calls (events made, recorded, given back) are `compute::timer`'s.
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
//! Deep queues are timed in groups where groups form (elsewhere in a deep queue a launch is sampled,
//! `sample`). A timing event between two kernels costs the GPU itself time (an
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
/// in a deep queue: it is timed in a group where it would join or open one, else sampled in its own
/// position (`sample::Position::Deep`, not `Behind`, whose launches the GPU reaches at once). Entries of
/// the queue alone cannot tell: after untimed launches the queue holds few entries however deep it is.
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
    /// A group whose end was recorded on a stream with nothing left to run: its work ended some time
    /// before, and the interval takes in the GPU's idle time after it (a paced loop that queued a burst and
    /// slept). Charged by its members' floors (`compute::settle`).
    pub stale: bool,
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
            stale: false,
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
    pub(super) fn alone(opens_span: bool) -> Plan {
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
    pub(super) pending: Option<usize>,
    /// Groups open (their end not recorded).
    pub(super) open: usize,
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
        let deep_from = self.deep_from(ctx, stream);
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
    /// which: nothing of its stream in flight; a shallow queue (fewer than `SAMPLE_DEPTH` launches
    /// queued since the oldest in flight, and its stream's newest launch in flight among the first
    /// `OPEN_DEPTH`, its end recorded and not lent); or a deeper queue where the launch would be timed on
    /// its own. None where it is timed in a group: it would join its stream's open group or open one
    /// (`plan`'s conditions, `groupable` the last of them: its floor is known and short, asked only
    /// there), and where a launch being chained on its stream's newest (its end lent) or a group closing
    /// there is timed on.
    pub fn position(
        &self,
        ctx: usize,
        stream: usize,
        groupable: impl FnOnce() -> bool,
    ) -> Option<Position> {
        let Some(i) = self.newest_of(ctx, stream) else {
            return Some(Position::Idle);
        };
        let p = &self.queue[i];
        let depth = self.launches.saturating_sub(self.queue[0].seq);
        if i < OPEN_DEPTH && depth < SAMPLE_DEPTH {
            return (p.state == End::Recorded && !p.lent_end).then_some(Position::Behind);
        }
        match p.state {
            End::Open | End::Closing => None,
            End::Recorded if p.lent_end => None,
            End::Recorded
                if !p.skipped && i >= OPEN_DEPTH && self.deep_from(ctx, stream) && groupable() =>
            {
                None
            }
            _ => Some(Position::Deep),
        }
    }

    /// Whether the queue's oldest launch, found running just now, is of this stream: then every later
    /// launch of the stream is unfinished too (a stream runs in order).
    fn deep_from(&self, ctx: usize, stream: usize) -> bool {
        match (self.pending, self.queue.front()) {
            (Some(e), Some(f)) => f.end as usize == e && f.stream == stream && f.ctx == ctx,
            _ => false,
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
    pub(super) fn by_end(&mut self, end: CUevent) -> Option<&mut InFlight> {
        self.queue.iter_mut().rev().find(|f| f.end == end)
    }

    /// Open groups (of context `ctx`, or all) to close: each is `Closing` on return, for the caller to
    /// record its end; one that launches are joining is left to the last of them (`close_asked`).
    pub(super) fn closing(
        &mut self,
        ctx: Option<usize>,
        front_only: bool,
    ) -> Vec<(CUevent, usize)> {
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

    /// A group's end was recorded (`ok`) or could not be; `stale`: on a stream with nothing left to run.
    pub(super) fn closed(&mut self, end: CUevent, ok: bool, stale: bool) {
        if let Some(f) = self.by_end(end) {
            f.state = if ok { End::Recorded } else { End::Failed };
            f.stale = ok && stale;
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

#[cfg(test)]
mod tests;
