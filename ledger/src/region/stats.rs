//! The header's monitor area (`format::MONITOR_AREA`): two figures the library keeps for the host's
//! monitor, written with plain atomics and never used to decide anything.
//!
//! ```text
//! offset  size  what
//! 152     4     slot high-water mark: 1 + the highest slot index ever claimed (0: not kept, read every slot)
//! 156     4     zero
//! 160     8     refusals: allocations the quota refused, counted by the library
//! ```
//!
//! Both live in a file the tenant can write, so both are what the tenant lets us see: the monitor exports
//! the refusals as the container's own account, and reads only the slots below the high-water mark. A tenant
//! that lowers the mark hides only its own slots' detail — the total in the commit word still counts them,
//! and the monitor's watchdog reports a ledger whose total and slots disagree.

use super::format::{MONITOR_AREA, SLOT_COUNT};
use super::ledger::Ledger;
use super::shared::Shared;
use portable_atomic::{AtomicU32, AtomicU64};
use std::sync::atomic::Ordering::{Relaxed, SeqCst};

pub(super) const HIGH_WATER_OFFSET: usize = MONITOR_AREA.0;
pub(super) const REFUSALS_OFFSET: usize = MONITOR_AREA.0 + 8;
const _: () = assert!(REFUSALS_OFFSET + 8 <= MONITOR_AREA.0 + MONITOR_AREA.1);

impl Shared {
    fn high_water(&self) -> &AtomicU32 {
        self.at(HIGH_WATER_OFFSET)
    }

    fn refusals(&self) -> &AtomicU64 {
        self.at(REFUSALS_OFFSET)
    }

    /// Records that slot `index` is (or was) in use: the mark only grows.
    pub(super) fn raise_high_water(&self, index: usize) {
        self.high_water().fetch_max(index as u32 + 1, SeqCst);
    }
}

/// How many slots a reader must look at, from the mark as stored: every slot when it is 0 (a ledger of a
/// library that did not keep it) or out of range.
pub(super) fn slots_to_read(mark: u32) -> usize {
    match mark as usize {
        0 => SLOT_COUNT,
        n => n.min(SLOT_COUNT),
    }
}

impl Ledger {
    /// Counts one refused allocation (for the monitor; a read-only ledger counts nothing).
    pub fn count_refusal(&self) {
        if self.shared.writable {
            self.shared.refusals().fetch_add(1, Relaxed);
        }
    }

    /// Refusals counted so far.
    pub fn refusals(&self) -> u64 {
        self.shared.refusals().load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zero_or_wild_mark_means_every_slot() {
        assert_eq!(slots_to_read(0), SLOT_COUNT);
        assert_eq!(slots_to_read(3), 3);
        assert_eq!(slots_to_read(u32::MAX), SLOT_COUNT);
    }
}
