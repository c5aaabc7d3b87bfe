//! One share's rate and pacing window in this process, as the bucket reads them: set from the limits
//! file when the share is made, and changed when the host's `vgpuctl update` rewrites the file
//! (`vgpu_ledger::live`), checked with one load at each launch (`follow`). With a request below the
//! limit, the rate is the entitlement the lending arrives at from NVML's readings (`lend`).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicI64, AtomicU64};
use std::sync::{Mutex, MutexGuard};

use vgpu_ledger::envcompute::DEFAULT_WINDOW_MS;
use vgpu_ledger::region::{window_capacity, PPM};

use super::busy::Busy;
use super::lend::{self, Lending};
use crate::log;
use crate::quota::DeviceQuota;

pub struct Rate {
    /// What the bucket refills at now, parts per million of the GPU's time: the limit, or with a
    /// request below it the entitlement `lend` arrives at.
    ppm: AtomicU64,
    /// The bucket's capacity at `ppm`: `share × (1 − share) × window` (`window_capacity`).
    cap: AtomicI64,
    /// The request (floor) and limit (cap), ppm, and the window, ns, as the host last set them.
    request: AtomicU64,
    limit: AtomicU64,
    window_ns: AtomicU64,
    /// The lending state (`lend`), stepped once per NVML reading, and the reading it last took.
    lending: Mutex<Lending>,
    reading: AtomicU64,
    /// When the bucket last held a launch back (CLOCK_MONOTONIC ns; 0: never): the share wants more.
    held_at: AtomicU64,
}

impl Rate {
    /// A share of `request` and `limit` percent (a request at its limit or above: a hard cap) paced in
    /// windows of `window_ms`.
    pub fn new(request: u32, limit: u32, window_ms: u32) -> Rate {
        let r = Rate {
            ppm: AtomicU64::new(0),
            cap: AtomicI64::new(0),
            request: AtomicU64::new(0),
            limit: AtomicU64::new(0),
            window_ns: AtomicU64::new(0),
            lending: Mutex::new(Lending::START),
            reading: AtomicU64::new(0),
            held_at: AtomicU64::new(0),
        };
        r.set(request, limit, window_ms);
        r
    }

    #[inline]
    pub fn ppm(&self) -> u64 {
        self.ppm.load(Relaxed)
    }

    #[inline]
    pub fn cap(&self) -> i64 {
        self.cap.load(Relaxed)
    }

    /// The share runs free now: entitled to the whole GPU (a request alone, the GPU its alone).
    #[inline]
    pub fn free(&self) -> bool {
        self.ppm() >= PPM
    }

    /// Whether this share lends (a request below its limit).
    #[inline]
    pub fn elastic(&self) -> bool {
        self.request.load(Relaxed) < self.limit.load(Relaxed)
    }

    /// Whether it runs above its request now: it then reads NVML every `lend::LEND_REFRESH_NS`.
    #[inline]
    pub fn borrowing(&self) -> bool {
        self.ppm() > self.request.load(Relaxed)
    }

    fn set(&self, request: u32, limit: u32, window_ms: u32) {
        let limit = u64::from(limit.clamp(1, 100)) * PPM / 100;
        let request = (u64::from(request) * PPM / 100).min(limit);
        self.request.store(request, Relaxed);
        self.limit.store(limit, Relaxed);
        self.window_ns
            .store(u64::from(window_ms) * 1_000_000, Relaxed);
        let entitled = lock(&self.lending).entitled(request, limit);
        self.entitle(entitled);
    }

    fn entitle(&self, ppm: u64) {
        let window = self.window_ns.load(Relaxed);
        self.cap.store(window_capacity(window, ppm), Relaxed);
        self.ppm.store(ppm, Relaxed);
    }

    /// The bucket held a launch back at `now`.
    #[inline]
    pub fn held(&self, now: u64) {
        if self.elastic() {
            self.held_at.store(now, Relaxed);
        }
    }

    /// Steps the lending on NVML's reading (`busy::Busy::loads`) when there is a new one, and while it
    /// borrows on its own work's stretch, read when needed: `stretch` gives the charge's (64 ms, the
    /// baseline when NVML finds it alone, `lend::Lending::seen_alone`) and the wake's (its last few ms,
    /// `lend::Lending::stretched`), thousandths of a context. One load when there is nothing new and it
    /// borrows nothing, or when the share lends nothing.
    #[inline]
    pub fn lend(&self, busy: &Busy, stretch: impl FnOnce() -> (u64, u64), now: u64) {
        if !self.elastic() {
            return;
        }
        let (n, others, own) = busy.loads();
        let fresh = n != 0 && self.reading.swap(n, Relaxed) != n;
        if !fresh && !self.borrowing() {
            return;
        }
        // Read only here: an elastic share at its floor with no new reading takes no lock a launch.
        let (stretch, wake) = stretch();
        let (request, limit) = (self.request.load(Relaxed), self.limit.load(Relaxed));
        let mut l = lock(&self.lending);
        let before = l.entitled(request, limit);
        let held_at = self.held_at.load(Relaxed);
        let wants = held_at != 0 && now.saturating_sub(held_at) < lend::STEP_NS;
        // The stretch first: a reading that does not show the neighbour yet must not make its stretch
        // the baseline.
        let woke = l.stretched(wake, now);
        let why = match woke.alone != l.alone {
            true => "its own work's stretch",
            false => "NVML",
        };
        *l = match fresh {
            true => woke
                .step(request, limit, (others, own), wants, now)
                .seen_alone(stretch),
            false => woke,
        };
        let after = l.entitled(request, limit);
        drop(l);
        if after != before {
            self.entitle(after);
            // CLOCK_MONOTONIC ms: the elastic suite dates the reclaim by it.
            log::debug(format_args!(
                "compute share: entitled {}% (was {}%) at {} ms: others {others}%, own {own}%, own \
                 work stretched {}.{:03} contexts, its last ms {}.{:03} (by {why})",
                after / (PPM / 100),
                before / (PPM / 100),
                now / 1_000_000,
                stretch / 1000,
                stretch % 1000,
                wake / 1000,
                wake % 1000
            ));
        }
    }

    /// Takes the rate and window the host set in the limits file, when it updated it since `bucket` (the
    /// share's ledger) last looked: one load when it did not. A share is never removed live (`vgpuctl
    /// update` refuses it), so an entry without one changes nothing.
    #[inline]
    pub fn follow(&self, bucket: &DeviceQuota) {
        let Some(d) = bucket.updated_entry() else {
            return;
        };
        let Some((request, limit)) = d.settings.request_limit() else {
            return;
        };
        let window_ms = d.settings.compute_window_ms.unwrap_or(DEFAULT_WINDOW_MS);
        let was = (
            self.request.load(Relaxed),
            self.limit.load(Relaxed),
            self.window_ns.load(Relaxed),
        );
        self.set(request, limit, window_ms);
        let now = (
            self.request.load(Relaxed),
            self.limit.load(Relaxed),
            self.window_ns.load(Relaxed),
        );
        if was == now {
            return; // the file was read again unchanged (`live::FileWatch`)
        }
        log::info(format_args!(
            "device {} ({}): compute share updated by the host to request {request}%, limit {limit}%, window {window_ms} ms",
            bucket.ordinal, bucket.uuid
        ));
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Issue 48 item 1: the share is read like the quota, so a tenant writing back the generation word
    // its processes applied hid a cut of the share as it hid a shrink; the read-only file itself is
    // looked at within a second whatever the word says.
    #[test]
    fn a_share_cut_behind_a_word_written_back_applies_within_a_second() {
        let dir = tempfile::tempdir().unwrap();
        let (mut limits, _file, q) = crate::quota::tests::followed_quota(dir.path());
        let r = Rate::new(50, 50, 1000);
        limits.updates += 1;
        limits.devices[0].settings.compute_limit = Some(10);
        vgpu_host::live::publish(dir.path(), &limits).unwrap();
        q.ledger().set_limits_generation(0);
        r.follow(&q);
        assert_eq!(r.ppm(), 500_000, "not looked at yet");
        std::thread::sleep(std::time::Duration::from_millis(
            crate::live::FILE_CHECK_MS + 50,
        ));
        r.follow(&q);
        assert_eq!(r.ppm(), 100_000, "the file itself, within a second");
    }

    #[test]
    fn rate_and_capacity_are_the_shares() {
        let r = Rate::new(30, 30, 1000);
        assert_eq!(r.ppm(), 300_000);
        assert_eq!(r.cap(), 210_000_000, "0.3 x 0.7 x 1 s");
    }
}
