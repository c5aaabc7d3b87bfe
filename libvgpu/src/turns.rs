//! The time-quanta turn gate (issue 29): on a GPU whose quota is in oversubscribe mode, the node's arbiter
//! (`vgpuctl monitor`) tells the container through its ledger's turn area (`vgpu_ledger::region::turn`)
//! whether its work may run now, so containers whose managed memory together passes the GPU take turns
//! instead of thrashing. Every launch path (`hooks::launch`: kernels, graphs, memsets and copies) passes
//! `gate` before the driver sees the work: Unmanaged or Free goes; Hold goes and is counted; Wait waits;
//! Yield drains this process's work in the launch's context, records the drain, then waits as for Wait.
//!
//! What a wait costs nobody else: a process with no oversubscribed GPU pays one atomic load (`off`), one
//! with such a GPU one more load of the mode byte per launch while it may go. A waiting thread sleeps
//! (50 µs, doubling up to 1 ms) holding no lock, and counts itself in `waiting` and its time in
//! `waited_ns` as it goes (so `waiting` left behind by a thread killed while waiting shows as a
//! `waited_ns` that stands still), the arbiter's hints.
//!
//! A dead arbiter never hangs a container: a thread whose wait saw the arbiter's heartbeat stand still
//! for `STALE` goes ahead (one log line per process), and so do later launches while the heartbeat stays
//! that value; once it moves again the arbiter is obeyed again. The mode is the tenant's to write: the
//! gate is the cooperative half; the arbiter's wall (NVML, freezing) is the one a tenant cannot skip.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::time::{Duration, Instant};

use vgpu_ledger::region::{TurnArea, TurnMode};
use vgpu_ledger::MemoryMode;

use crate::devices::MAX_DEVICES;
use crate::driver::Driver;
use crate::ffi::{CUdevice, CUstream};
use crate::guard::exiting;
use crate::log;
use crate::settings;

/// How a waiting thread paces itself.
#[derive(Clone, Copy, Debug)]
pub struct Pace {
    /// The first sleep between looks at the mode; each next one twice as long, up to `max_nap`.
    pub first_nap: Duration,
    pub max_nap: Duration,
    /// A heartbeat that stood still this long: the arbiter is gone.
    pub stale: Duration,
}

/// The library's pace: the arbiter beats at least every 100 ms, so 3 s of a still heartbeat is no long
/// pass of a live arbiter.
pub const PACE: Pace = Pace {
    first_nap: Duration::from_micros(50),
    max_nap: Duration::from_millis(1),
    stale: Duration::from_secs(3),
};

/// How a launch got through the gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Passed {
    /// The mode let it go at once.
    Now,
    /// It waited until the mode let it go.
    Waited,
    /// The arbiter's heartbeat stood still: it went without the turn.
    Stale,
    /// Its stream is capturing a graph: nothing runs now (the graph's launch is gated).
    Captured,
}

const UNKNOWN: u8 = 0;
const OFF: u8 = 1;
const ON: u8 = 2;
static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);

/// Per CUDA ordinal: the heartbeat this process found standing still (`NO_BEAT`: none).
const NO_BEAT: u64 = u64::MAX;
static STALE_BEAT: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(NO_BEAT) }; MAX_DEVICES];

/// True when no GPU of this process is oversubscribed (or it is exiting): launches skip the gate.
#[inline]
pub fn off() -> bool {
    match STATE.load(Relaxed) {
        OFF => true,
        ON => exiting(),
        _ => init() == OFF,
    }
}

#[cold]
fn init() -> u8 {
    // A broken configuration refuses CUDA already; an unlimited one has no quota to be oversubscribed.
    let s = match settings::config() {
        Ok(c) if c.any_oversubscribed() => ON,
        _ => OFF,
    };
    STATE.store(s, Relaxed);
    s
}

/// The gate of a launch on `stream` (as `streams::named` gives it), whose work runs on device `dev` in
/// context `ctx`: returns when the launch may reach the driver. Only devices whose quota is in
/// oversubscribe mode are gated.
pub(crate) fn gate<D: Driver>(drv: &D, dev: CUdevice, ctx: usize, stream: CUstream) -> Passed {
    let Ok(Some(q)) = drv.quota(dev) else {
        return Passed::Now;
    };
    if !matches!(q.memory, MemoryMode::Oversubscribe { .. }) {
        return Passed::Now;
    }
    // Ordinals past MAX_DEVICES have no quota: `drv.quota` refused them above.
    let Some(stale) = usize::try_from(dev).ok().and_then(|i| STALE_BEAT.get(i)) else {
        return Passed::Now;
    };
    admit(
        q.ledger().turn(),
        stale,
        &PACE,
        || !drv.capturing(stream as usize, false),
        || drv.ctx_sync(ctx),
    )
}

/// The gate over one turn area. `stale`: this process's memory of a heartbeat found standing still;
/// `runs_now`: false when the launch's work does not run now (its stream captures); `drain`: waits for
/// this process's work in the launch's context, true when done.
pub fn admit(
    turn: &TurnArea,
    stale: &AtomicU64,
    pace: &Pace,
    runs_now: impl FnOnce() -> bool,
    drain: impl FnMut() -> bool,
) -> Passed {
    match turn.mode() {
        TurnMode::Hold => {
            turn.note_launch();
            return Passed::Now;
        }
        m if m.launches_go() => return Passed::Now,
        _ => {}
    }
    if stale.load(Relaxed) == turn.heartbeat() {
        return Passed::Stale;
    }
    if !runs_now() {
        return Passed::Captured;
    }
    wait(turn, stale, pace, drain)
}

/// Waits until the mode lets the launch go (draining once per yield), or the heartbeat stands still for
/// `pace.stale`.
#[cold]
fn wait(
    turn: &TurnArea,
    stale: &AtomicU64,
    pace: &Pace,
    mut drain: impl FnMut() -> bool,
) -> Passed {
    turn.add_waiting(1);
    let start = Instant::now();
    let (mut beat, mut beat_at) = (turn.heartbeat(), start);
    let mut nap = pace.first_nap;
    let mut drained_for = None;
    let mut counted = 0u64;
    let passed = loop {
        match turn.mode() {
            TurnMode::Hold => {
                turn.note_launch();
                break Passed::Waited;
            }
            m if m.launches_go() => break Passed::Waited,
            TurnMode::Yield => {
                let epoch = turn.epoch();
                if drained_for != Some(epoch) {
                    drained_for = Some(epoch);
                    // Recorded only if the yield is still the same one after the drain: a drain that
                    // began before a later turn's epoch was written must not answer that turn.
                    if drain() && turn.mode() == TurnMode::Yield && turn.epoch() == epoch {
                        turn.set_drained(epoch);
                    }
                }
            }
            _ => {}
        }
        let now = Instant::now();
        let b = turn.heartbeat();
        if b != beat {
            (beat, beat_at) = (b, now);
        } else if now.duration_since(beat_at) >= pace.stale {
            stale.store(b, Relaxed);
            tell_stale();
            break Passed::Stale;
        }
        std::thread::sleep(nap);
        nap = (nap * 2).min(pace.max_nap);
        counted = count_waited(turn, counted, start);
    };
    turn.add_waiting(-1);
    count_waited(turn, counted, start);
    passed
}

/// Adds to `waited_ns` the time waited since `counted` ns into the wait that began at `start`; returns the
/// new count. Added as the wait goes, so the arbiter sees `waited_ns` move while a thread waits, and a
/// `waiting` count left behind by a thread that was killed while waiting by a still `waited_ns`.
fn count_waited(turn: &TurnArea, counted: u64, start: Instant) -> u64 {
    let now = start.elapsed().as_nanos().min(u64::MAX as u128) as u64;
    turn.add_waited(now.saturating_sub(counted));
    now
}

#[cold]
fn tell_stale() {
    static TOLD: AtomicBool = AtomicBool::new(false);
    if !TOLD.swap(true, Relaxed) {
        log::warn(format_args!(
            "time quanta: the arbiter's heartbeat stood still for {} s; launches go without waiting for a turn until it beats again",
            PACE.stale.as_secs()
        ));
    }
}

#[cfg(test)]
mod tests;
