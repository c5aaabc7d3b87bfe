//! One share's rate and pacing window in this process, as the bucket reads them: set from the limits
//! file when the share is made, and changed when the host's `vgpuctl update` rewrites the file
//! (`vgpu_ledger::live`), checked with one load at each launch (`follow`).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicI64, AtomicU64};

use vgpu_ledger::envcompute::DEFAULT_WINDOW_MS;
use vgpu_ledger::region::{window_capacity, PPM};

use crate::log;
use crate::quota::DeviceQuota;

pub struct Rate {
    /// The share in parts per million of the GPU's time.
    ppm: AtomicU64,
    /// The bucket's capacity: `share × (1 − share) × window` (`window_capacity`).
    cap: AtomicI64,
}

impl Rate {
    pub fn new(pct: u32, window_ms: u32) -> Rate {
        let (ppm, cap) = figures(pct, window_ms);
        Rate {
            ppm: AtomicU64::new(ppm),
            cap: AtomicI64::new(cap),
        }
    }

    #[inline]
    pub fn ppm(&self) -> u64 {
        self.ppm.load(Relaxed)
    }

    #[inline]
    pub fn cap(&self) -> i64 {
        self.cap.load(Relaxed)
    }

    /// Takes the rate and window the host set in the limits file, when it updated it since `bucket` (the
    /// share's ledger) last looked: one load when it did not. A share is never removed live (`vgpuctl
    /// update` refuses it), so an entry without one changes nothing.
    #[inline]
    pub fn follow(&self, bucket: &DeviceQuota) {
        let Some(d) = bucket.updated_entry() else {
            return;
        };
        let Some(pct) = d.settings.compute_share() else {
            return;
        };
        let window_ms = d.settings.compute_window_ms.unwrap_or(DEFAULT_WINDOW_MS);
        let (ppm, cap) = figures(pct, window_ms);
        let old = self.ppm.swap(ppm, Relaxed);
        if self.cap.swap(cap, Relaxed) == cap && old == ppm {
            return; // the file was read again unchanged (`live::FileWatch`)
        }
        log::info(format_args!(
            "device {} ({}): compute share updated by the host to {pct}%, window {window_ms} ms",
            bucket.ordinal, bucket.uuid
        ));
    }
}

fn figures(pct: u32, window_ms: u32) -> (u64, i64) {
    let ppm = pct as u64 * PPM / 100;
    (ppm, window_capacity(window_ms as u64 * 1_000_000, ppm))
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
        let r = Rate::new(50, 1000);
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
        let r = Rate::new(30, 1000);
        assert_eq!(r.ppm(), 300_000);
        assert_eq!(r.cap(), 210_000_000, "0.3 x 0.7 x 1 s");
    }
}
