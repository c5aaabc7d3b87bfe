//! The compute share (`compute_limit` of the limits file, which inside a container is its only source, or
//! `CUDA_DEVICE_SM_LIMIT`): every launch waits while the container's bucket of GPU time is in debt, and is
//! charged afterwards the GPU time it was measured to take. The bucket is shared by the container's
//! processes in its ledger (`vgpu_ledger::region::ComputeArea`); which launches reach here is
//! `hooks::launch`'s. docs/libvgpu.md, "Compute share", has the design and its precision.
//!
//! Measuring: CUDA events recorded around each launch on its stream (a launch queued behind one still in
//! flight on its stream is timed from that one's end: `flight`); their elapsed time is read later with
//! `cuEventQuery` / `cuEventElapsedTime_v2` once the end event completed (never a blocking sync), and
//! charged by `solo` (its solo time, or its part of the GPU's time when other contexts stretch it; a
//! graph's kernels, read at instantiation by `hooks::graphs`, give its solo time): `settle`. What a
//! blocking synchronisation found finished is retired and charged at the next one, before it waits
//! (`sync`, the hooks' side of synchronisations and context teardown). Until then the launch
//! is debited from the bucket at an estimate (the moving average of measured launches), settled to the
//! measurement later, so no thread can queue unbounded work ahead of the budget and credit earned while
//! work runs is not lost to the bucket's capacity.
//!
//! Holding back: `admit` refills the bucket (lazily, by whoever launches) and sleeps while it is used up;
//! each nap is at most `MAX_NAP_NS` so finished launches are charged and the debt re-read often. The
//! bucket holds `share × (1 − share) × window`, and once it runs dry the container's gate (in the ledger)
//! stays closed until it is full again: a process that keeps the GPU busy runs `share × window` and
//! waits out the rest of each window, in bursts long enough for the GPU's clock to settle where it is
//! when the GPU is saturated (docs/libvgpu.md, "Pacing window").
//!
//! Launches of work already measured, queued with nothing in flight, behind a shallow queue or deeper where
//! no group takes them, are timed one time in eight at random and otherwise charged the average of that
//! work's timed launches in that position (`sample`): each timed launch costs one or two event records.
//!
//! Unlimited processes never get here: `off()` is one atomic load, then the launch is forwarded.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, Once};
use std::time::Duration;

pub use crate::launch_charge::Work;
use crate::launch_charge::{Composition, SoloBook};
use vgpu_ledger::region::{ComputeArea, PPM};

use crate::devices::MAX_DEVICES;
use crate::error::Error;
use crate::ffi::*;
use crate::log;
use crate::quota::DeviceQuota;
use crate::records::RECORDS;

mod busy;
pub use crate::clock::mono_ns;
mod events;
mod flight;
use flight::{Grouping, InFlight};
use sample::Position;
use timer::{Begun, Timer};
mod gate;
mod graphs;
mod lend;
mod meter;
mod overlap;
mod quiet;
mod rate;
mod sample;
mod settle;
use quiet::FORKED;
pub mod sync;
pub mod teardown;
mod timer;
mod trace;
mod truth;
mod unmeasured;
mod which;
use events::{capturing, CUDA_ERROR_NOT_READY};
pub use graphs::graph_reparametrised;
use which::resolve;
pub use which::{off, shared_uuid};

/// Longest single sleep while in debt; finished launches are charged between naps.
const MAX_NAP_NS: u64 = 2_000_000;
const MIN_NAP_NS: u64 = 20_000;
/// Launches in flight (recorded, not yet charged) per device and process, at most.
const MAX_IN_FLIGHT: usize = 4096;
/// Launches a synchronisation retired are charged by a launch (`Share::admit`) once this many of the
/// process's launches are in flight, `MAX_RETIRED` wait, or they waited `SETTLE_BY_NS`, if no
/// synchronisation came first.
const SETTLE_BEHIND: usize = 8;
const MAX_RETIRED: usize = 64;
const SETTLE_BY_NS: u64 = 1_000_000_000;
/// One launch in this many that could join a group is timed alone (`Share::groupable`).
const REFRESH_EVERY: u64 = 16;
/// The cost assumed for a launch before any was measured.
const FIRST_ESTIMATE_NS: u64 = 1_000_000;

const CUDA_ERROR_NOT_PERMITTED: CUresult = 800;

// Per CUDA ordinal: 0 unknown, 1 not throttled, 2 refused, else a leaked `Share` (never freed).
const NONE: usize = 1;
const REFUSED: usize = 2;
static SHARES: [AtomicUsize; MAX_DEVICES] = [const { AtomicUsize::new(0) }; MAX_DEVICES];

fn share_of(dev: CUdevice) -> Result<Option<&'static Share>, Error> {
    let Some(cell) = usize::try_from(dev).ok().and_then(|i| SHARES.get(i)) else {
        return Ok(None);
    };
    let v = match cell.load(Ordering::Acquire) {
        0 => {
            let v = match resolve(dev) {
                Ok(None) => NONE,
                Ok(Some((q, (request, limit), window_ms))) => {
                    Box::leak(Box::new(Share::new(q, request, limit, window_ms))) as *const Share
                        as usize
                }
                Err(_) => REFUSED,
            };
            match cell.compare_exchange(0, v, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => v,
                Err(won) => {
                    if v > REFUSED {
                        // SAFETY: the Box leaked just above, never published.
                        drop(unsafe { Box::from_raw(v as *mut Share) });
                    }
                    won
                }
            }
        }
        v => v,
    };
    match v {
        NONE => Ok(None),
        REFUSED => Err(Error::Unenforceable),
        // SAFETY: every other value is a leaked Share, never freed.
        p => Ok(Some(unsafe { &*(p as *const Share) })),
    }
}

// ---- one device's share in this process -----------------------------------------------------------------

struct Share {
    quota: DeviceQuota,
    /// The share's rate and window (`rate`: they follow the host's updates).
    rate: rate::Rate,
    /// The launches in flight, the open span and the events that time them (`flight`).
    timer: Timer,
    /// Moving average of measured launch costs (ns).
    estimate: AtomicU64,
    /// Up to when (CLOCK_MONOTONIC ns) launches that could not be measured were charged wall time.
    unmeasured_until: AtomicU64,
    /// The solo cost of each kind of work (`solo`).
    solo: Mutex<SoloBook>,
    /// How many contexts keep the GPU busy, as the driver says (`busy`).
    busy: busy::Busy,
    /// The debug trace's sums (`trace`).
    trace: trace::Trace,
    /// What timed launches of each work were charged, for the untimed ones (`sample`).
    costs: sample::Costs,
    /// What a timing event costs the GPU, which untimed launches do not (`sample::EventCost`).
    event_cost: sample::EventCost,
    /// Timed launches queued behind work, counted (one in `sample::PROBE_EVERY` is probed).
    probes: AtomicU64,
    /// The application synchronised since the last launch that opened a span: the next one is timed.
    synced: AtomicBool,
    /// Launches that could have been grouped, counted (`groupable`).
    grouped: AtomicU64,
    /// Whether launches go unmeasured for now, and what they are debited (`meter`).
    meter: meter::Meter,
    /// When a synchronisation last retired launches that are not charged yet (`Flights::retired`,
    /// CLOCK_MONOTONIC ns; 0: none wait). A hint read with one load on the launch path: set after they
    /// are queued, cleared once they are all charged.
    retired_at: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How long to sleep for a deficit of `deficit` GPU-ns at `ppm`: the wall time it takes to earn it, within
/// [MIN_NAP_NS, MAX_NAP_NS].
pub fn nap_for(deficit: u64, ppm: u64) -> u64 {
    (deficit.saturating_mul(PPM) / ppm.max(1)).clamp(MIN_NAP_NS, MAX_NAP_NS)
}

/// The grid a graph launch's `Work` has (a kernel's grid is never zero).
pub const GRAPH_GRID: [u32; 3] = [0; 3];

/// A graph exec was instantiated (or updated) under a share: what it runs, for its solo time. What was
/// learned of an earlier exec of the same handle is forgotten.
pub fn graph_composed(exec: usize, c: Composition) {
    forget_graph(exec);
    RECORDS
        .graph_work
        .insert(exec as u64, std::sync::Arc::new(c));
}

/// A graph exec was destroyed: forget its composition and its least time (the handle may come back as
/// another graph).
pub fn forget_graph(exec: usize) {
    RECORDS.graph_work.remove(exec as u64);
    for cell in &SHARES {
        let v = cell.load(Ordering::Acquire);
        if v > REFUSED {
            // SAFETY: every value above REFUSED is a leaked Share, never freed.
            let share = unsafe { &*(v as *const Share) };
            lock(&share.solo).forget((exec, GRAPH_GRID));
        }
    }
}

/// The moving average after one more measurement (weight 1/8).
pub fn averaged(prev: u64, measured: u64) -> u64 {
    prev - prev / 8 + measured / 8
}

impl Share {
    fn new(quota: DeviceQuota, request: u32, limit: u32, window_ms: u32) -> Share {
        register_exit();
        let busy = busy::Busy::new(&quota.uuid);
        Share {
            quota,
            rate: rate::Rate::new(request, limit, window_ms),
            timer: Timer::default(),
            estimate: AtomicU64::new(FIRST_ESTIMATE_NS),
            unmeasured_until: AtomicU64::new(0),
            busy,
            solo: Mutex::new(SoloBook::default()),
            trace: trace::Trace::default(),
            costs: sample::Costs::new(sample::seed()),
            event_cost: sample::EventCost::default(),
            probes: AtomicU64::new(0),
            synced: AtomicBool::new(true),
            grouped: AtomicU64::new(0),
            retired_at: AtomicU64::new(0),
            meter: meter::Meter::new(),
        }
    }

    /// The charge's stretch and the wake's (`launch_charge::SoloBook`), for the lending (`rate::lend`).
    fn stretches(&self) -> (u64, u64) {
        let book = lock(&self.solo);
        (book.stretch(), book.wake_stretch())
    }

    fn area(&self) -> &ComputeArea {
        self.quota.ledger().compute()
    }

    /// The bucket's level as the library reads it: never above its capacity, whatever the ledger holds
    /// (the ledger is the tenant's memory: a stored huge count must not buy more than a full bucket).
    fn tokens(&self) -> i64 {
        let area = self.area();
        let cap = self.rate.cap();
        let t = area.refill(mono_ns(), self.rate.ppm(), cap);
        if t > cap {
            area.clamp(cap);
            return cap;
        }
        t
    }

    /// Waits while the bucket (what is in flight debited) is used up, and then (the gate closed) until
    /// it is full again. Returns how long it held the thread.
    fn admit(&self) -> u64 {
        self.rate.follow(&self.quota);
        if self.rate.elastic() {
            // A borrower reads NVML every `LEND_REFRESH_NS`, so that a floor waking beside it has its
            // time back within one reading (`lend`).
            let now = mono_ns();
            if self.rate.borrowing() {
                self.busy.refresh_every(now, lend::LEND_REFRESH_NS);
            }
            self.rate.lend(&self.busy, || self.stretches(), now);
        }
        // After a synchronisation (launches retired, not charged yet) the GPU may be waiting for this
        // launch: what finished is charged at the next synchronisation, before it waits (`syncing`),
        // debited meanwhile at its estimate; or here once `SETTLE_BEHIND` launches are in flight (the GPU
        // has work while the library charges), `MAX_RETIRED` wait, or after `SETTLE_BY_NS`. Meanwhile
        // what finished since joins them (in order, so spans end in order): what is in flight stays
        // exact, for the next launch's timing (a launch chained on one that had already finished would
        // be charged the time the GPU waited for the host in between).
        let retired_at = self.retired_at.load(Ordering::Relaxed);
        if retired_at == 0 || FORKED.load(Ordering::Relaxed) {
            self.harvest();
        } else {
            let (in_flight, retired) = {
                let q = lock(&self.timer.flights);
                (q.queue.len(), q.retired.len())
            };
            if in_flight >= SETTLE_BEHIND
                || retired >= MAX_RETIRED
                || mono_ns().saturating_sub(retired_at) > SETTLE_BY_NS
            {
                self.harvest();
            } else if in_flight > 0 {
                self.retire(&|_| false, None);
            }
        }
        self.floor();
        let area = self.area();
        let mut held = 0u64;
        loop {
            let tokens = self.tokens();
            let busy = lock(&self.timer.flights).queue.len() >= MAX_IN_FLIGHT;
            if self.rate.free() && !busy {
                // Entitled to the whole GPU (a request alone, the GPU its alone): nothing to wait for.
                // The bucket still counts what runs, for when a neighbour wakes.
                area.open_gate_if_full(tokens, tokens);
                self.meter(tokens.max(1));
                break;
            }
            let deficit = if !area.open_gate_if_full(tokens, self.rate.cap()) {
                self.rate.cap() - tokens
            } else if tokens > 0 && !busy {
                self.meter(tokens);
                break;
            } else {
                if !busy {
                    area.close_gate();
                }
                -tokens
            };
            let nap = nap_for(deficit.max(0) as u64, self.rate.ppm());
            // The GPU runs what is queued while the thread sleeps: open groups end now, not after.
            self.timer.close_open(None);
            // The thread waits anyway: the time NVML's reading takes comes out of the nap.
            let t0 = mono_ns();
            self.busy.refresh(t0);
            self.rate.lend(&self.busy, || self.stretches(), t0);
            std::thread::sleep(Duration::from_nanos(
                nap.saturating_sub(mono_ns().saturating_sub(t0)),
            ));
            held += nap;
            if trace::on() {
                self.trace.held(nap);
                let gate = area.gate_closed();
                self.trace
                    .tick(mono_ns(), self.quota.ordinal, area.tokens(), gate);
            }
            self.harvest();
            self.floor();
        }
        if held > 0 {
            self.area().held(held);
            self.rate.held(mono_ns());
            // Naps before the meter converged are the start's (the bucket filling), not a loop at its
            // share: counted, they kept a loop well inside 99% measured for its first second (0.57
            // event calls a launch on the fake driver, against 0.03 without the rule).
            let m = &self.meter;
            if m.allowed && m.measured.load(Ordering::Relaxed) >= meter::CONVERGED {
                m.held_at.store(mono_ns(), Ordering::Relaxed);
            }
        }
        held
    }

    /// Whether NVML's last reading found the others below `lend::IDLE_BELOW` of the GPU (false before any
    /// reading). Launches are then measured more cheaply (`sample`: short work one in 32, launches onto
    /// idle streams at most ~200 a second, each behind a `gate`): nobody's time is at stake but the
    /// tenant's own, and the driver's figure floors its charge (`truth`). Beside a busy neighbour they are
    /// sampled one in eight, ungated, as before: on an H200, a 30/70 pair of launch-bound convolution
    /// loops (batch 8, eager) gave the 30 37% of the pair's work so, 43% with short work one in 32, and 47%
    /// with idle launches also rate-bound and gated. Decided from NVML (the host's driver), never from a
    /// neighbour's ledger.
    fn alone(&self) -> bool {
        let (readings, others, _) = self.busy.loads();
        readings > 0 && others < lend::IDLE_BELOW
    }

    /// Whether a launch of `work` on `stream` of context `ctx` goes untimed (`sample`: a sampling position,
    /// a kernel or copy already timed often enough, not drawn): Ok with its charge. Err with the position
    /// when it was drawn to be timed there (what it is charged teaches the average), Err(None) when it
    /// is timed whatever the draw. The first launch after a synchronisation with nothing in flight is
    /// always timed: it opens the span whose wait the next synchronisation dates (`flight::Span`), as a
    /// tenant that synchronises after every batch needs. `groupable` says whether the launch's work may be
    /// timed in a group (`groupable`); it is asked only deep in a queue, where a group may take the
    /// launch, under the queue's lock (the queue's lock is taken before the solo book's, never after).
    /// `alone`: NVML's last reading found the GPU otherwise idle (`alone`): short work is then sampled
    /// more seldom (`sample`).
    fn untimed(
        &self,
        ctx: usize,
        stream: CUstream,
        work: Work,
        alone: bool,
        groupable: impl FnOnce() -> bool,
    ) -> Result<u64, Option<Position>> {
        // Streams that overlap: every launch timed, so that overlap is charged once (`overlap`).
        if work.1 == GRAPH_GRID || self.timer.overlap.overlapped() {
            return Err(None);
        }
        let mut q = lock(&self.timer.flights);
        let Some(at) = q.position(ctx, stream as usize, groupable) else {
            return Err(None);
        };
        if q.queue.is_empty() && self.synced.swap(false, Ordering::Relaxed) {
            return Err(None);
        }
        match self.costs.untimed(work, at, alone) {
            Some(ns) => {
                q.skipped(ctx, stream as usize);
                Ok(self.event_cost.untimed_charge(ns))
            }
            None => Err(Some(at)),
        }
    }

    /// The debug trace's account of a launch taken up at `entered` (`trace::Trace::spent`).
    fn spent(&self, entered: Option<u64>, driver: u64, held: u64) {
        if entered.is_some() {
            let nvml = self.busy.spent();
            self.trace.spent(entered, driver, held, nvml);
        }
    }

    /// An untimed launch the driver took: charged at once `ns`, what its work's timed launches cost.
    fn charge_untimed(&self, ns: u64) {
        self.area().debit(ns);
        let tokens = self.area().settle(ns, ns);
        self.busy.truth.booked(ns);
        if trace::on() {
            self.trace.untimed(ns);
            let gate = self.area().gate_closed();
            self.trace.tick(mono_ns(), self.quota.ordinal, tokens, gate);
        }
    }

    /// Records the end event after a launch the driver took; the launch is now in flight. When the end
    /// cannot be recorded the launch is charged unmeasured.
    #[allow(clippy::too_many_arguments)]
    fn end(
        &self,
        ctx: usize,
        stream: CUstream,
        b: Begun,
        work: Work,
        queued_at: u64,
        floor: u64,
        drawn: Option<Position>,
    ) {
        let estimate = self.estimate.load(Ordering::Relaxed);
        let joined = match b.plan.grouping {
            Grouping::Joins => self.timer.joined(b.end, Some((work, floor, estimate))),
            grouping => {
                let mut f = InFlight::new(ctx, stream as usize, estimate, work, queued_at);
                f.floors = floor;
                f.drawn = drawn;
                let probe = !b.plan.opens_span
                    && grouping == Grouping::Alone
                    && self
                        .probes
                        .fetch_add(1, Ordering::Relaxed)
                        .is_multiple_of(sample::PROBE_EVERY);
                self.timer.end(ctx, stream, b, f, probe)
            }
        };
        if joined {
            self.area().debit(estimate);
        } else {
            self.unmeasured();
        }
    }

    /// The floor of `work` when its launch may be timed in a group (`flight`): a kernel or copy measured
    /// before, short enough; one such launch in `REFRESH_EVERY` is not grouped all the same (timed alone,
    /// or sampled deep in a queue), so that the floors of work only ever grouped with other work stay
    /// current. Deep in a queue it is asked before the sampling draw: a launch that would group is timed.
    fn groupable(&self, work: Work) -> Option<u64> {
        if work.1 == GRAPH_GRID
            || self
                .grouped
                .fetch_add(1, Ordering::Relaxed)
                .is_multiple_of(REFRESH_EVERY)
        {
            return None;
        }
        let floor = lock(&self.solo).floor(work)?;
        (floor < flight::GROUP_FLOORS_NS).then_some(floor)
    }

    /// A launch the driver took that cannot be measured (no events in its context): charged at once
    /// what measured launches cost on average, at least `FIRST_ESTIMATE_NS`, so that no launch under
    /// a share runs both undebited and unmeasured.
    fn unmeasured(&self) {
        let ns = self.estimate.load(Ordering::Relaxed).max(FIRST_ESTIMATE_NS);
        self.area().debit(ns);
        self.area().settle(ns, ns);
        self.busy.truth.booked(ns);
        static TOLD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if !TOLD.swap(true, Ordering::Relaxed) {
            log::info(format_args!(
                "compute share: a launch could not be timed (no events in its stream's context): charged {} us unmeasured",
                ns / 1000
            ));
        }
    }
}

/// Runs `launch` (a kernel or graph launch on `stream` in context `ctx` of device `dev`) under the
/// device's share: held back while the bucket is in debt, measured, charged later.
pub fn throttled(
    dev: CUdevice,
    ctx: usize,
    stream: CUstream,
    work: Work,
    launch: impl FnOnce() -> CUresult,
) -> CUresult {
    let share = match share_of(dev) {
        Ok(Some(s)) => s,
        Ok(None) => return launch(),
        Err(_) => return CUDA_ERROR_NOT_PERMITTED,
    };
    // A launch into a stream being captured only adds a node to a graph: it runs (and is charged) when
    // the graph is launched. An event recorded there would join the graph, and querying it is an error.
    if capturing(stream) {
        return launch();
    }
    let entered = trace::on().then(mono_ns);
    let held = share.admit();
    if share.meter.unmeasured() {
        return share.launch_unmeasured(entered, held, launch);
    }
    // The floor is asked once: for the draw deep in a queue, or for the timing (it counts the refresh).
    let floor = std::cell::OnceCell::new();
    let floor_of = || *floor.get_or_init(|| share.groupable(work));
    // Sampled seldom and gated only while the GPU is this tenant's alone by NVML's last reading (`alone`).
    let alone = share.alone();
    let drawn = match share.untimed(ctx, stream, work, alone, || floor_of().is_some()) {
        Ok(ns) => {
            let (r, driver) = trace::timed(entered, launch);
            if r == CUDA_SUCCESS {
                share.charge_untimed(ns);
            }
            share.spent(entered, driver, held);
            return r;
        }
        Err(drawn) => drawn,
    };
    let floor = floor_of();
    let begun = share
        .timer
        .begin(ctx, stream, floor, drawn.is_some() && alone);
    let queued_at = mono_ns();
    let (r, driver) = trace::timed(entered, launch);
    if r == CUDA_SUCCESS {
        match begun {
            Some(b) => share.end(ctx, stream, b, work, queued_at, floor.unwrap_or(0), drawn),
            None => share.unmeasured(),
        }
    } else if let Some(b) = begun {
        share.timer.give_back(ctx, b);
    }
    share.spent(entered, driver, held);
    r
}

/// Whether launches on device `dev` are under a share (or refused: a share that cannot be enforced).
pub fn governed(dev: CUdevice) -> bool {
    !matches!(share_of(dev), Ok(None))
}

/// Every share of this process made so far.
fn shares() -> impl Iterator<Item = &'static Share> {
    SHARES.iter().filter_map(|cell| {
        let v = cell.load(Ordering::Acquire);
        // SAFETY: every value above REFUSED is a leaked Share, never freed.
        (v > REFUSED).then(|| unsafe { &*(v as *const Share) })
    })
}

/// At exit: every launch in flight is waited for and charged (a short-lived process is otherwise
/// never charged what it queued last). Registered with the first share, never at load time; atexit
/// handlers run last-registered first, so this runs before the CUDA runtime's own teardown.
extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(|| {
        for s in shares() {
            s.drain(None);
            // What ran since the last reading (unmeasured launches above all) is charged from the
            // driver's figure, as far as its samples have come.
            if s.busy.truth.active() {
                s.busy.refresh_every(mono_ns(), 0);
                s.floor();
            }
        }
    });
}

static AT_EXIT: Once = Once::new();

/// Registered with the first share: the exit handler here (after the CUDA runtime registered its own,
/// so that it runs first), the fork handlers with the library's (`lifecycle`: its child handler tells
/// the share it forked, `lifecycle::FORKED`).
fn register_exit() {
    crate::lifecycle::register();
    AT_EXIT.call_once(|| {
        // SAFETY: a plain extern "C" function that lives as long as the process (never unloaded).
        unsafe {
            libc::atexit(at_exit);
        }
    });
}

#[cfg(test)]
mod tests;
