//! Work that overlaps on several streams of a context, charged once: the GPU time the context's timed
//! intervals cover together (their union), not their sum. Pure bookkeeping; the driver calls (the epoch
//! event, its stream, the positions read against it) are `compute::timer`'s.
//!
//! A timed interval is placed on one clock by reading its end event against the context's *epoch*, an
//! event recorded on a stream of the library's own (idle, so the epoch completes at once). Each interval
//! is charged only its part not covered by the intervals charged before it (`Covered`): charged in any
//! order, the intervals together are charged their union, never less than the longest. Only a context
//! whose timed launches came on more than one stream places its intervals (one read more a launch); a
//! context on one stream is charged as before. Once intervals were found overlapping, the share's
//! launches are all timed (none sampled: an untimed launch is charged what timed ones cost, which no
//! interval places); streams that never overlap keep the sampling. `cuEventElapsedTime` answers f32
//! milliseconds, so the epoch is recorded anew every `REBASE_NS` (the covered intervals, on the old
//! epoch's clock, are then forgotten: the intervals charged next may be charged in full, never less),
//! and a position farther than `FAR_NS` from the epoch is not placed. Every covered interval is kept `SLACK_NS` shorter at each end
//! than read, more than a position's rounding: two intervals of one stream, one after the other, never
//! read as overlapping, and nothing is subtracted that the reading's error could have made up.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::ffi::*;

/// How long an epoch is used before a new one is recorded (f32 ms keep ~0.1 µs at 1 s).
pub const REBASE_NS: u64 = 1_000_000_000;
/// A position farther from the epoch than this is not placed (f32 ms keep ~0.5 µs at 4 s: farther, the
/// rounding nears `SLACK_NS`).
pub const FAR_NS: i64 = 4_000_000_000;
/// What a covered interval is shortened by at each end.
pub const SLACK_NS: i64 = 1_000;
/// Covered intervals kept per context (the latest on the clock; an interval that overlaps one forgotten
/// is charged more, never less).
const KEEP: usize = 32;

/// The covered intervals of one clock: disjoint, sorted, each already `SLACK_NS` shorter at both ends.
#[derive(Default, Debug)]
pub struct Covered {
    spans: Vec<(i64, i64)>,
}

impl Covered {
    /// Adds the interval `[start, end]` (ns on the epoch's clock): returns what of it no covered interval
    /// covered (what it is charged), and keeps it covered.
    pub fn add(&mut self, start: i64, end: i64) -> u64 {
        let len = end.saturating_sub(start).max(0);
        let overlap: i64 = self
            .spans
            .iter()
            .map(|&(s, e)| (e.min(end) - s.max(start)).max(0))
            .sum();
        let (s, e) = (start + SLACK_NS, end - SLACK_NS);
        if e > s {
            self.insert(s, e);
        }
        (len - overlap.min(len)) as u64
    }

    fn insert(&mut self, mut s: i64, mut e: i64) {
        let mut kept = Vec::with_capacity(self.spans.len() + 1);
        for &(a, b) in &self.spans {
            if b < s || a > e {
                kept.push((a, b));
            } else {
                s = s.min(a);
                e = e.max(b);
            }
        }
        let at = kept.partition_point(|&(a, _)| a < s);
        kept.insert(at, (s, e));
        if kept.len() > KEEP {
            kept.remove(0);
        }
        self.spans = kept;
    }
}

/// One context's clock: its epoch (null until one is recorded), the stream it is recorded on, and the
/// intervals charged on it.
struct Clock {
    ctx: usize,
    stream: CUstream,
    epoch: CUevent,
    /// Which epoch: bumped at each new one, so that a position read against an older one is dropped.
    gen: u64,
    since: u64,
    last_stream: usize,
    multi: bool,
    covered: Covered,
}

/// What `Overlap::anchor` says of a measured interval.
#[derive(Debug, PartialEq, Eq)]
pub enum Anchor {
    /// Charged as measured (its context ran on one stream so far).
    Whole,
    /// Placed against this epoch (of this generation).
    Place(CUevent, u64),
    /// An epoch is due: record one (on the clock's stream, made if null) and call `rebased`.
    Due(CUstream),
}

/// The clocks of the contexts of one device's share.
#[derive(Default)]
pub struct Overlap {
    clocks: Mutex<Vec<Clock>>,
    /// Intervals of a context of the share were found overlapping (by an eighth of one at least): its
    /// launches are all timed from then on (`Share::untimed`), since an untimed launch's charge, learned
    /// from timed ones, is no interval to place. One load on the launch path.
    overlapped: AtomicBool,
}

// SAFETY: events and streams are driver handles, usable from any thread.
unsafe impl Send for Overlap {}
// SAFETY: as above; the handles are only read under the lock.
unsafe impl Sync for Overlap {}

impl Overlap {
    fn clocks(&self) -> std::sync::MutexGuard<'_, Vec<Clock>> {
        self.clocks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How an interval measured on `stream` of context `ctx` at `now` (CLOCK_MONOTONIC ns) is charged.
    pub fn anchor(&self, ctx: usize, stream: usize, now: u64) -> Anchor {
        let mut clocks = self.clocks();
        let i = match clocks.iter().position(|c| c.ctx == ctx) {
            Some(i) => i,
            None => {
                clocks.push(Clock {
                    ctx,
                    stream: std::ptr::null_mut(),
                    epoch: std::ptr::null_mut(),
                    gen: 0,
                    since: 0,
                    last_stream: stream,
                    multi: false,
                    covered: Covered::default(),
                });
                clocks.len() - 1
            }
        };
        let c = &mut clocks[i];
        c.multi |= c.last_stream != stream;
        c.last_stream = stream;
        if !c.multi {
            Anchor::Whole
        } else if c.since == 0 || now.saturating_sub(c.since) >= REBASE_NS {
            Anchor::Due(c.stream)
        } else if c.epoch.is_null() {
            // No epoch could be recorded (`failed`): charged whole until the next try.
            Anchor::Whole
        } else {
            Anchor::Place(c.epoch, c.gen)
        }
    }

    /// A new epoch `epoch` was recorded at `now` on `stream` for context `ctx`: the intervals covered on
    /// the old one are forgotten. Returns the new generation and the old epoch (for reuse), or None when
    /// the context is gone meanwhile (the caller then keeps its event).
    pub fn rebased(
        &self,
        ctx: usize,
        stream: CUstream,
        epoch: CUevent,
        now: u64,
    ) -> Option<(u64, CUevent)> {
        let mut clocks = self.clocks();
        let c = clocks.iter_mut().find(|c| c.ctx == ctx)?;
        let old = std::mem::replace(&mut c.epoch, epoch);
        c.stream = stream;
        c.gen += 1;
        c.since = now.max(1);
        c.covered = Covered::default();
        Some((c.gen, old))
    }

    /// No epoch could be recorded for context `ctx` at `now` (its stream not made, the record refused):
    /// the next try is `REBASE_NS` later, so that a failing driver call is not made at every launch;
    /// `stream`, when not null, is the clock's stream made meanwhile (kept for the next try).
    pub fn failed(&self, ctx: usize, stream: CUstream, now: u64) {
        if let Some(c) = self.clocks().iter_mut().find(|c| c.ctx == ctx) {
            c.since = now.max(1);
            if !stream.is_null() {
                c.stream = stream;
            }
        }
    }

    /// The interval `[start, end]` on the clock of `ctx`'s epoch of generation `gen`: what of it is
    /// charged (not covered before), or None when the epoch changed since it was read.
    pub fn place(&self, ctx: usize, gen: u64, start: i64, end: i64) -> Option<u64> {
        if start.abs() > FAR_NS || end.abs() > FAR_NS {
            return None;
        }
        let mut clocks = self.clocks();
        let c = clocks.iter_mut().find(|c| c.ctx == ctx && c.gen == gen)?;
        let ns = c.covered.add(start, end);
        let len = end.saturating_sub(start).max(0) as u64;
        if len.saturating_sub(ns) >= len / 8 && len > ns {
            self.overlapped.store(true, Ordering::Relaxed);
        }
        Some(ns)
    }

    /// Whether intervals of a context of the share were found overlapping.
    pub fn overlapped(&self) -> bool {
        self.overlapped.load(Ordering::Relaxed)
    }

    /// Context `ctx` is gone: its epoch and stream died with it.
    pub fn forget(&self, ctx: usize) {
        self.clocks().retain(|c| c.ctx != ctx);
    }

    /// In a child after `fork`: the clocks are the parent's. A lock held at the fork: nothing is dropped.
    pub fn forget_parent(&self) {
        if let Ok(mut c) = self.clocks.try_lock() {
            c.clear();
            self.overlapped.store(false, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests;
