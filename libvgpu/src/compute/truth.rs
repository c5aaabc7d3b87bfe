//! The driver's word on how much of the GPU this process used, held against what the share charged it:
//! a floor under the charge that nothing the tenant observes can lower.
//!
//! Events time launches at once and cheaply, but what they measure is the tenant's to shape: which launch
//! is timed can be learned (the host time of the launch call, the ledger's words), and a kernel whose work
//! is fixed after its launch returns (it waits on memory the host sets) runs short when timed and long
//! when not; an end event taken into the tenant's own capture was never timed at all (a GPU probe: 94% and
//! 24% of the GPU under a 10% share). NVML's per-process SM utilisation (`nvmlDeviceGetProcessUtilization`,
//! read for `busy` anyway) is measured by the driver over all of the process's work, whatever entry
//! point queued it and whatever the library timed. So the utilisation of this process's own samples is
//! integrated over time into GPU-ns it used (`observe`), and whenever that exceeds what it was charged
//! (settled charges, the estimates of launches still in flight, and earlier corrections) by more than a
//! slack for NVML's whole-percent rounding, the difference is charged (`floor`). Over any stretch the
//! charge is then at least the driver's figure less the slack: 2 ms, 1% of what it used and 0.5% of the
//! wall time since the first reading (at most half a point of the GPU).
//!
//! A floor only: where the events charge more than NVML shows (time a tenant's synchronised batches held
//! the GPU beside busy neighbours, `Share::waited`; the stretch), that stays charged.
//!
//! Samples: one per process "that had some non-zero utilisation during the last sample period", with a
//! CPU timestamp (µs); asked for those newer than the last batch's newest. A sample counts from the later
//! of the previous batch's newest timestamp and this process's previous sample, and never for longer than
//! the driver's sample period where a batch shows it (two distinct timestamps: the least gap), so that a
//! sample after idle periods (absent from the list) is not spread over them.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// Slack for NVML's rounding: a fixed part, a part of what was used, a part of the wall time.
const SLACK_NS: u64 = 2_000_000;
const SLACK_USED_PPM: u64 = 10_000;
const SLACK_WALL_PPM: u64 = 5_000;
/// The least sample period believed (a batch's timestamps closer than this are one sampling).
const MIN_PERIOD_US: u64 = 10_000;

#[derive(Default)]
struct Book {
    /// The newest timestamp of the last batch (µs; 0: no reading yet).
    batch_newest: u64,
    /// This process's newest sample integrated (µs).
    own_newest: u64,
    /// The first reading's time (µs): the floor counts from there.
    baseline: u64,
    /// What was charged before the first reading (not compared: NVML's first sample has no start).
    booked_before: u64,
    /// The driver's sample period, where a batch showed it (µs; 0: unknown).
    period: u64,
    /// GPU-ns used, integrated from this process's samples since the baseline.
    used: u64,
    /// GPU-ns charged by the floor so far.
    floored: u64,
}

/// One device's floor in this process.
#[derive(Default)]
pub struct Truth {
    /// GPU-ns this process's share settled (every charge of the bucket it made), for the floor.
    booked: AtomicU64,
    /// A reading came since the last `floor`.
    fresh: AtomicBool,
    /// Readings of this process's figure are coming (a baseline was taken): the floor holds.
    active: AtomicBool,
    /// The last floor charged something: readings are asked for more often (`Busy`).
    suspect: AtomicBool,
    book: Mutex<Book>,
}

impl Truth {
    /// The share settled `ns` of this process's work (any charge of the bucket).
    pub fn booked(&self, ns: u64) {
        self.booked.fetch_add(ns, Ordering::Relaxed);
    }

    /// Since when NVML should be asked for samples (µs): the last batch's newest, or None before any.
    pub fn since(&self) -> Option<u64> {
        let b = self.book.lock().unwrap_or_else(|e| e.into_inner());
        (b.batch_newest != 0).then_some(b.batch_newest)
    }

    /// Whether a reading came since the last `floor` (one load: asked on every launch).
    pub fn has_news(&self) -> bool {
        self.fresh.load(Ordering::Relaxed)
    }

    /// Whether the floor holds: the driver's figure of this process is being read.
    pub fn active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    /// Whether the events fell short of the driver's figure at the last floor (`set_suspect`).
    pub fn suspect(&self) -> bool {
        self.suspect.load(Ordering::Relaxed)
    }

    /// A batch of samples (`(pid, timestamp µs, SM %)`, any order) read at `now_us`; `own`: this
    /// process's PID as NVML reports it.
    pub fn observe(&self, samples: &[(u32, u64, u32)], own: u32, now_us: u64) {
        let mut b = self.book.lock().unwrap_or_else(|e| e.into_inner());
        let newest = samples.iter().map(|s| s.1).max().unwrap_or(0);
        if b.batch_newest == 0 {
            // The first reading: the floor counts from here.
            b.batch_newest = newest.max(now_us);
            b.own_newest = b.batch_newest;
            b.baseline = b.batch_newest;
            b.booked_before = self.booked.load(Ordering::Relaxed);
            self.active.store(true, Ordering::Relaxed);
            return;
        }
        // The driver's sample period, where this batch shows two samplings.
        let mut stamps: Vec<u64> = samples
            .iter()
            .map(|s| s.1)
            .filter(|&t| t > b.batch_newest)
            .collect();
        stamps.sort_unstable();
        stamps.dedup();
        for w in stamps.windows(2) {
            let gap = w[1] - w[0];
            if gap >= MIN_PERIOD_US && (b.period == 0 || gap < b.period) {
                b.period = gap;
            }
        }
        let mut own_samples: Vec<(u64, u32)> = samples
            .iter()
            .filter(|s| s.0 == own)
            .map(|s| (s.1, s.2.min(100)))
            .collect();
        own_samples.sort_unstable();
        let mut from = b.own_newest.max(b.batch_newest);
        for (ts, sm) in own_samples {
            if ts <= from {
                continue;
            }
            let mut span = ts - from;
            if b.period != 0 {
                span = span.min(b.period);
            }
            b.used = b.used.saturating_add(u64::from(sm) * span * 10);
            from = ts;
            b.own_newest = ts;
        }
        b.batch_newest = b.batch_newest.max(newest);
        self.fresh.store(true, Ordering::Release);
    }

    /// After a reading: what to charge so that this process's charges (settled, `in_flight` estimates
    /// debited and not settled yet, and the floor's own) are no less than what it used by the driver's
    /// figure, less the slack. 0 when they are, or when there was no new reading.
    pub fn floor(&self, in_flight: u64) -> u64 {
        if !self.fresh.swap(false, Ordering::AcqRel) {
            return 0;
        }
        let mut b = self.book.lock().unwrap_or_else(|e| e.into_inner());
        let booked = self
            .booked
            .load(Ordering::Relaxed)
            .saturating_sub(b.booked_before);
        let charged = booked.saturating_add(in_flight).saturating_add(b.floored);
        let wall_ns = b.batch_newest.saturating_sub(b.baseline) * 1000;
        let slack =
            SLACK_NS + b.used / 1_000_000 * SLACK_USED_PPM + wall_ns / 1_000_000 * SLACK_WALL_PPM;
        let short = b.used.saturating_sub(charged.saturating_add(slack));
        b.floored += short;
        short
    }

    /// Whether the events fell short of the driver's figure (the last floor charged something while
    /// launches were measured): readings come more often and launches stay measured.
    pub fn set_suspect(&self, s: bool) {
        self.suspect.store(s, Ordering::Relaxed);
    }

    /// In a child after `fork`: the parent's readings and charges are not the child's.
    pub fn forget_parent(&self) {
        if let Ok(mut b) = self.book.try_lock() {
            *b = Book::default();
        }
        self.booked.store(0, Ordering::Relaxed);
        self.fresh.store(false, Ordering::Relaxed);
        self.suspect.store(false, Ordering::Relaxed);
        self.active.store(false, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests;
