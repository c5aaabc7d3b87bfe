//! The compute share's shared state: a token bucket of GPU-nanoseconds in the header's `COMPUTE_AREA`,
//! shared by every process of the container and changed lock-free (atomic add, CAS), like the memory
//! counters. Not here: measuring launches or holding a thread back (the library's `compute` module).
//!
//! The bucket holds `tokens` GPU-nanoseconds (negative = debt). It is refilled lazily by whoever launches:
//! the caller that moves `refilled_at` forward by a CAS adds `share × elapsed wall time`, capped at the
//! bucket's capacity, so concurrent refills never add the same interval twice. A launch is debited an
//! estimate when queued (`debit`) and settled to the GPU time it was measured to take (`settle`); a
//! thread waits while the bucket is used up, and once it ran dry (the gate closed) until it is full again.
//! A fresh file is all zeros: no credit, last refill "at boot", the gate open, so the first refill fills
//! at most to the capacity.

use portable_atomic::{AtomicI64, AtomicU64};
use std::mem::{offset_of, size_of};
use std::sync::atomic::Ordering::SeqCst;

use super::format::COMPUTE_AREA;
use super::ledger::Ledger;

/// The bytes of `COMPUTE_AREA`, reached only as atomics through the mapping.
#[repr(C, align(64))]
pub struct ComputeArea {
    /// GPU-nanoseconds the container may still use; negative while in debt.
    pub tokens: AtomicI64,
    /// CLOCK_MONOTONIC nanoseconds up to which the bucket was refilled.
    pub refilled_at: AtomicU64,
    /// GPU-nanoseconds charged since the ledger was made (monotonic; what monitors read).
    pub charged_ns: AtomicU64,
    /// Nanoseconds launching threads were held back, summed over threads (monotonic).
    pub held_ns: AtomicU64,
    /// Launches measured and charged (monotonic).
    pub launches: AtomicU64,
    /// The pacing gate: 0 open (launches go while the bucket holds credit), 1 closed (the bucket ran dry:
    /// launches wait until it is full again). A fresh file's zero is open.
    pub gate: AtomicU64,
    pub _reserved: [u8; 16],
}

const _: () = {
    assert!(size_of::<ComputeArea>() == COMPUTE_AREA.1);
    assert!(offset_of!(ComputeArea, tokens) == 0);
    assert!(offset_of!(ComputeArea, refilled_at) == 8);
    assert!(offset_of!(ComputeArea, charged_ns) == 16);
    assert!(offset_of!(ComputeArea, held_ns) == 24);
    assert!(offset_of!(ComputeArea, launches) == 32);
    assert!(offset_of!(ComputeArea, gate) == 40);
};

/// A share in parts per million of the GPU's time (1_000_000 = all of it).
pub const PPM: u64 = 1_000_000;

/// GPU-nanoseconds earned over `dt_ns` of wall time at `share_ppm`.
pub fn earned(dt_ns: u64, share_ppm: u64) -> i64 {
    ((dt_ns as u128 * share_ppm.min(PPM) as u128) / PPM as u128).min(i64::MAX as u128) as i64
}

/// The bucket's capacity for a pacing window of `window_ns` at `share_ppm`: `share × (1 − share) × window`.
/// A process that keeps the GPU busy then cycles once per window: from full, it runs while the bucket
/// drains at `1 − share` (GPU time `share × window`), and waits while it refills at `share` (the rest).
/// At least 1 ns, so a share near 100% still has a gate to close.
pub fn window_capacity(window_ns: u64, share_ppm: u64) -> i64 {
    let p = share_ppm.min(PPM) as u128;
    ((window_ns as u128 * p * (PPM as u128 - p)) / (PPM as u128 * PPM as u128))
        .clamp(1, i64::MAX as u128) as i64
}

/// The bucket after adding `add` to `tokens`, capped at `cap`. A level above the cap is read as the cap:
/// the ledger is memory the container's processes can write, and a stored huge count must buy no more
/// than a full bucket.
pub fn refilled(tokens: i64, add: i64, cap: i64) -> i64 {
    tokens.min(cap).saturating_add(add.max(0)).min(cap)
}

/// What the bucket holds right now, read without changing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct ComputeSnapshot {
    pub tokens: i64,
    pub refilled_at: u64,
    pub charged_ns: u64,
    pub held_ns: u64,
    pub launches: u64,
}

impl ComputeSnapshot {
    /// The bucket from the little-endian bytes of `COMPUTE_AREA` (a host tool's `pread` of the header).
    pub fn from_bytes(b: &[u8]) -> ComputeSnapshot {
        let at = |off: usize| {
            b.get(off..off + 8)
                .map_or(0, |s| u64::from_le_bytes(s.try_into().unwrap()))
        };
        ComputeSnapshot {
            tokens: at(offset_of!(ComputeArea, tokens)) as i64,
            refilled_at: at(offset_of!(ComputeArea, refilled_at)),
            charged_ns: at(offset_of!(ComputeArea, charged_ns)),
            held_ns: at(offset_of!(ComputeArea, held_ns)),
            launches: at(offset_of!(ComputeArea, launches)),
        }
    }
}

impl ComputeArea {
    /// Refills for the wall time since the last refill (`now_ns`, CLOCK_MONOTONIC). Only the caller whose
    /// CAS moves `refilled_at` adds that interval; the others see it done. Returns the tokens after.
    pub fn refill(&self, now_ns: u64, share_ppm: u64, cap: i64) -> i64 {
        let last = self.refilled_at.load(SeqCst);
        if now_ns > last
            && self
                .refilled_at
                .compare_exchange(last, now_ns, SeqCst, SeqCst)
                .is_ok()
        {
            let add = earned(now_ns - last, share_ppm);
            let mut cur = self.tokens.load(SeqCst);
            loop {
                let new = refilled(cur, add, cap);
                match self.tokens.compare_exchange_weak(cur, new, SeqCst, SeqCst) {
                    Ok(_) => return new,
                    Err(seen) => cur = seen,
                }
            }
        }
        self.tokens.load(SeqCst)
    }

    /// Lowers a level above `cap` to `cap` (what the library reads of a bucket someone wrote past its
    /// capacity); a level at or below it is left alone.
    pub fn clamp(&self, cap: i64) {
        let _ = self
            .tokens
            .fetch_update(SeqCst, SeqCst, |t| (t > cap).then_some(cap));
    }

    /// Takes a launch's estimated cost out of the bucket when it is queued, so that work in flight
    /// counts against the bucket (for every process of the container) and the credit earned while it
    /// runs is not lost to the capacity.
    pub fn debit(&self, estimate_ns: u64) {
        let ns = estimate_ns.min(i64::MAX as u64) as i64;
        self.tokens.fetch_sub(ns, SeqCst);
    }

    /// Charges what a launch took, `debit`ed `estimate_ns` when queued: the bucket gets the difference.
    /// Returns the tokens after.
    pub fn settle(&self, gpu_ns: u64, estimate_ns: u64) -> i64 {
        self.settle_launches(gpu_ns, estimate_ns, 1)
    }

    /// `settle` for `launches` launches timed together (debited `estimate_ns` in all).
    pub fn settle_launches(&self, gpu_ns: u64, estimate_ns: u64, launches: u64) -> i64 {
        let ns = (gpu_ns.min(i64::MAX as u64) as i64) - (estimate_ns.min(i64::MAX as u64) as i64);
        self.charged_ns.fetch_add(gpu_ns, SeqCst);
        self.launches.fetch_add(launches, SeqCst);
        self.tokens.fetch_sub(ns, SeqCst).saturating_sub(ns)
    }

    /// Charges GPU time that is no launch of its own (the library's: time a tenant's queued work waited
    /// beside busy neighbours): out of the bucket and into `charged_ns`, the launch count untouched.
    pub fn charge(&self, gpu_ns: u64) {
        let ns = gpu_ns.min(i64::MAX as u64);
        self.charged_ns.fetch_add(ns, SeqCst);
        self.tokens.fetch_sub(ns as i64, SeqCst);
    }

    /// Whether the pacing gate is closed: launches wait for a full bucket.
    pub fn gate_closed(&self) -> bool {
        self.gate.load(SeqCst) != 0
    }

    /// Closes the gate (the bucket ran dry).
    pub fn close_gate(&self) {
        if !self.gate_closed() {
            self.gate.store(1, SeqCst);
        }
    }

    /// Opens the gate once the bucket holds `cap` (it is full); returns whether it is open. Every
    /// process of the container sees the same gate, so they pause and resume together.
    pub fn open_gate_if_full(&self, tokens: i64, cap: i64) -> bool {
        if !self.gate_closed() {
            return true;
        }
        if tokens >= cap {
            self.gate.store(0, SeqCst);
            return true;
        }
        false
    }

    /// Records time a thread was held back.
    pub fn held(&self, ns: u64) {
        self.held_ns.fetch_add(ns, SeqCst);
    }

    pub fn tokens(&self) -> i64 {
        self.tokens.load(SeqCst)
    }

    pub fn snapshot(&self) -> ComputeSnapshot {
        ComputeSnapshot {
            tokens: self.tokens.load(SeqCst),
            refilled_at: self.refilled_at.load(SeqCst),
            charged_ns: self.charged_ns.load(SeqCst),
            held_ns: self.held_ns.load(SeqCst),
            launches: self.launches.load(SeqCst),
        }
    }
}

impl Ledger {
    /// The container's compute bucket in this ledger (plain 64-bit atomics: loads work on a read-only
    /// mapping; only a writable one may refill or charge).
    pub fn compute(&self) -> &ComputeArea {
        self.shared.at(COMPUTE_AREA.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn zeroed() -> ComputeArea {
        // SAFETY: ComputeArea is integers and atomics only; all zeros is a valid (fresh file's) value.
        unsafe { std::mem::zeroed() }
    }

    #[test]
    fn earned_is_share_of_wall_time() {
        assert_eq!(earned(1_000_000, 300_000), 300_000);
        assert_eq!(earned(1_000_000, PPM), 1_000_000);
        assert_eq!(
            earned(1_000_000, 2 * PPM),
            1_000_000,
            "a share is at most all"
        );
        assert_eq!(earned(u64::MAX, PPM), i64::MAX);
    }

    #[test]
    fn a_window_cycles_share_on_and_the_rest_off() {
        // 30% over 1 s: a bucket of 210 ms drains in 300 ms of GPU time and refills in 700 ms.
        assert_eq!(window_capacity(1_000_000_000, 300_000), 210_000_000);
        assert_eq!(window_capacity(1_000_000_000, 500_000), 250_000_000);
        assert_eq!(window_capacity(1_000_000_000, PPM), 1);
        assert_eq!(window_capacity(0, 300_000), 1);
        assert_eq!(window_capacity(u64::MAX, 500_000), (u64::MAX / 4) as i64);
    }

    #[test]
    fn a_debited_estimate_is_settled_to_what_was_measured() {
        let area = zeroed();
        area.debit(1000);
        assert_eq!(area.tokens(), -1000);
        assert_eq!(area.settle(1500, 1000), -1500);
        area.debit(1000);
        assert_eq!(area.settle(400, 1000), -1900);
        let s = area.snapshot();
        assert_eq!((s.charged_ns, s.launches), (1900, 2));
    }

    #[test]
    fn time_charged_outside_a_launch_counts_as_charged_but_not_as_a_launch() {
        let area = zeroed();
        area.charge(700);
        let s = area.snapshot();
        assert_eq!((s.tokens, s.charged_ns, s.launches), (-700, 700, 0));
    }

    #[test]
    fn the_gate_opens_only_on_a_full_bucket() {
        let area = zeroed();
        assert!(!area.gate_closed(), "a fresh file's gate is open");
        area.close_gate();
        assert!(!area.open_gate_if_full(99, 100));
        assert!(area.gate_closed());
        assert!(area.open_gate_if_full(100, 100));
        assert!(!area.gate_closed());
    }

    #[test]
    fn refill_caps() {
        assert_eq!(refilled(-500, 200, 1000), -300);
        assert_eq!(refilled(900, 200, 1000), 1000);
        assert_eq!(refilled(i64::MIN, i64::MAX, 10), -1);
    }

    // Regression (issue 24, item 3): one store of a huge count into the ledger (the tenant's own memory)
    // turned a 10% share into 99%: a level above the cap was kept by every refill.
    #[test]
    fn a_stored_huge_count_is_read_as_a_full_bucket() {
        assert_eq!(refilled(i64::MAX / 2, 200, 1000), 1000);
        let area = zeroed();
        area.tokens.store(i64::MAX / 2, SeqCst);
        area.refilled_at.store(1, SeqCst);
        assert_eq!(area.refill(2, PPM, 1000), 1000);
        area.tokens.store(i64::MAX / 2, SeqCst);
        area.clamp(1000);
        assert_eq!(area.tokens(), 1000);
        area.tokens.store(-5, SeqCst);
        area.clamp(1000);
        assert_eq!(area.tokens(), -5, "a level within the cap is left alone");
    }

    proptest! {
        /// However the wall time is cut into refills, the bucket earns the same (below the cap).
        #[test]
        fn refills_add_each_interval_once(cuts in proptest::collection::vec(1u64..10_000_000, 1..40),
                                          share in 1u64..=PPM) {
            let area = zeroed();
            area.refilled_at.store(1, SeqCst);
            let mut now = 1;
            let mut expect: i64 = 0;
            for c in cuts {
                now += c;
                expect += earned(c, share);
                area.refill(now, share, i64::MAX);
                // a second refill at the same instant adds nothing
                area.refill(now, share, i64::MAX);
            }
            prop_assert_eq!(area.tokens(), expect);
        }

        #[test]
        fn charges_subtract_exactly(charges in proptest::collection::vec(0u64..1_000_000_000, 0..50)) {
            let area = zeroed();
            for &c in &charges { area.settle(c, 0); }
            let sum: u64 = charges.iter().sum();
            prop_assert_eq!(area.tokens(), -(sum as i64));
            prop_assert_eq!(area.snapshot().charged_ns, sum);
            prop_assert_eq!(area.snapshot().launches, charges.len() as u64);
        }
    }
}
