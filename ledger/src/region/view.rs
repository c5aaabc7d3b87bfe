//! Read-only queries: `used()` and the monitor's `Snapshot` of usage per slot and kind with each slot's
//! liveness, read from the mapping or (`Source`) from bytes a host tool read (`host`). Reads only (no write,
//! no lock taken); whatever charges, refunds or reclaims lives elsewhere.

use super::book::Book;
use super::compute::ComputeSnapshot;
use super::format::{total_of_low_half, Commit, KINDS, SEQ_MASK, SLOT_COUNT};
use super::ledger::Ledger;
use super::lock;
use super::shared::Shared;
use super::turn::TurnSnapshot;
use serde::Serialize;
use std::sync::atomic::Ordering::SeqCst;

/// A point-in-time view for the monitor. Exact when nobody is charging; under load each number is a value
/// it really had, taken a few instructions apart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Snapshot {
    pub uuid: String,
    /// The limit recorded at provisioning (informational).
    pub limit: u64,
    pub used: u64,
    /// Allocations the quota refused, as the container's library counted them (`stats`).
    pub refusals: u64,
    /// Device allocations served as host-preferred managed memory past the quota (spill mode), charged to
    /// the spill budget, not to `used`.
    #[serde(default)]
    pub spilled: u64,
    /// The compute share's bucket (`COMPUTE_AREA`): all zeros where no share ever ran.
    pub compute: ComputeSnapshot,
    /// The time-quanta turn (`TURN_AREA`): `Unmanaged` and zeros where no arbiter ever wrote.
    pub turn: TurnSnapshot,
    /// Slots with a live owner or leftover usage, by index.
    pub slots: Vec<SlotSnapshot>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SlotSnapshot {
    pub index: u16,
    /// PID in the owner's own PID namespace (0: none recorded).
    pub pid: u32,
    /// Inode of the owner's PID namespace.
    pub pid_ns: u64,
    /// Someone holds the slot's lock (its owner lives).
    pub alive: bool,
    /// Bytes per kind, indexed by `Kind::index()`.
    pub usage: [u64; KINDS],
    /// Spilled bytes (not part of `usage`).
    #[serde(default)]
    pub spilled: u64,
}

impl SlotSnapshot {
    pub fn total(&self) -> u64 {
        self.usage.iter().fold(0u64, |a, &b| a.saturating_add(b))
    }
}

/// Where a snapshot reads its numbers: the library's mapping (atomic loads, `Shared`) or the bytes a host
/// tool read with `pread` (`host`). The reading is the same for both.
pub(super) trait Source {
    /// The commit word's low and high halves.
    fn word_low(&self) -> u64;
    fn word_high(&self) -> u64;
    fn pid(&self, slot: usize) -> u32;
    fn pid_ns(&self, slot: usize) -> u64;
    fn usage(&self, slot: usize) -> [u64; KINDS];
    fn applied(&self, slot: usize, kind: usize) -> u64;
    /// Slots to look at: 0..this.
    fn slot_count(&self) -> usize;
    /// The spill book: its commit word's halves and each slot's pair.
    fn spill_word_low(&self) -> u64;
    fn spill_word_high(&self) -> u64;
    fn spill_usage(&self, slot: usize) -> u64;
    fn spill_applied(&self, slot: usize) -> u64;
}

impl Source for Shared {
    fn word_low(&self) -> u64 {
        Shared::word_low(self).load(SeqCst)
    }
    fn word_high(&self) -> u64 {
        Shared::word_high(self).load(SeqCst)
    }
    fn pid(&self, slot: usize) -> u32 {
        self.slot(slot).pid.load(SeqCst)
    }
    fn pid_ns(&self, slot: usize) -> u64 {
        self.slot(slot).pid_ns.load(SeqCst)
    }
    fn usage(&self, slot: usize) -> [u64; KINDS] {
        self.slot_usage(slot)
    }
    fn applied(&self, slot: usize, kind: usize) -> u64 {
        self.pair(slot, kind).applied.load(SeqCst)
    }
    fn slot_count(&self) -> usize {
        // The library's own view looks at every slot (it trusts no mark).
        SLOT_COUNT
    }
    fn spill_word_low(&self) -> u64 {
        Shared::spill_word_low(self).load(SeqCst)
    }
    fn spill_word_high(&self) -> u64 {
        Shared::spill_word_high(self).load(SeqCst)
    }
    fn spill_usage(&self, slot: usize) -> u64 {
        self.slot_spilled(slot)
    }
    fn spill_applied(&self, slot: usize) -> u64 {
        self.book_pair(Book::Spill, slot, 0).applied.load(SeqCst)
    }
}

/// A commit word read through two 64-bit loads (a 128-bit load could write), retried until consistent:
/// the decoded word, or only its total when it kept moving.
fn read_word(lo: impl Fn() -> u64, hi: impl Fn() -> u64) -> (u64, Option<Commit>) {
    let mut total = 0;
    for _ in 0..64 {
        let l = lo();
        let h = hi();
        if lo() == l {
            let c = Commit::decode(l as u128 | (h as u128) << 64);
            return (c.total, Some(c));
        }
        total = total_of_low_half(l);
    }
    (total, None)
}

/// `usage` with the word's operation added when it is on `slot` and not applied yet (`applied`: the
/// pair's applied_seq), so that the counters sum to the word's total.
fn with_pending(
    usage: u64,
    pending: Option<Commit>,
    slot: usize,
    applied: impl Fn(u8) -> u64,
) -> u64 {
    match pending.filter(|c| c.slot as usize == slot) {
        Some(c) if applied(c.kind) & SEQ_MASK != c.seq as u64 => {
            usage.saturating_add_signed(c.delta())
        }
        _ => usage,
    }
}

/// The device total, the spilled total and the slots in use (liveness left `false`), read from `src`.
pub(super) fn read_slots(src: &impl Source) -> (u64, u64, Vec<SlotSnapshot>) {
    let (used, pending) = read_word(|| src.word_low(), || src.word_high());
    let (spilled, spill_pending) = read_word(|| src.spill_word_low(), || src.spill_word_high());
    let spill_pending = spill_pending.filter(|c| c.kind == 0);
    let mut slots = Vec::new();
    for index in 0..src.slot_count() {
        let pid = src.pid(index);
        let mut usage = src.usage(index);
        // Count the operation in the word if it is not applied yet, so that Σ usage == used.
        if let Some(c) = pending.filter(|c| c.slot as usize == index) {
            let k = c.kind as usize;
            usage[k] = with_pending(usage[k], pending, index, |_| src.applied(index, k));
        }
        let spill = with_pending(src.spill_usage(index), spill_pending, index, |_| {
            src.spill_applied(index)
        });
        if pid == 0 && usage.iter().all(|&u| u == 0) && spill == 0 {
            continue;
        }
        slots.push(SlotSnapshot {
            index: index as u16,
            pid,
            pid_ns: src.pid_ns(index),
            alive: false,
            usage,
            spilled: spill,
        });
    }
    (used, spilled, slots)
}

impl Ledger {
    /// Bytes charged in the whole ledger now (one atomic load).
    pub fn used(&self) -> u64 {
        self.shared.used()
    }

    /// Usage per slot and kind, the total and the liveness of each slot in use. Reads only.
    pub fn snapshot(&self) -> Snapshot {
        let shared = &*self.shared;
        let (used, spilled, mut slots) = read_slots(shared);
        // Liveness through a description of our own, trusted only if it stayed ours for the whole pass
        // (else asked again); a ledger whose path cannot be opened any more shows no slot alive.
        for _ in 0..if slots.is_empty() { 0 } else { 3 } {
            let Ok(fd) = shared.open_description() else {
                break;
            };
            for s in &mut slots {
                s.alive = lock::slot_is_locked(&*fd, s.index as usize).unwrap_or(false);
            }
            if fd.is_ours() {
                break;
            }
            slots.iter_mut().for_each(|s| s.alive = false);
        }
        Snapshot {
            uuid: shared.uuid.clone(),
            limit: shared.provisioned_limit,
            used,
            refusals: self.refusals(),
            spilled,
            compute: self.compute().snapshot(),
            turn: self.turn().snapshot(),
            slots,
        }
    }
}
