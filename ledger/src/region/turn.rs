//! The time-quanta turn of an oversubscribed GPU (`format::TURN_AREA`): the words through which the node's
//! arbiter (`vgpuctl monitor`, `vgpu_monitor::turns`) tells a container's processes whether they may launch
//! work on this GPU now, and they tell it that they want to, that they are busy, and that they drained
//! their work when asked to yield. Not here: the arbiter's decisions (the monitor), its writes
//! (`vgpu_host::turn_write`, at [`TURN_OFFSET`] and [`TurnArea`]'s offsets), the waiting itself (the
//! library's `turns`).
//!
//! ```text
//! offset  size  written by  what
//! 0       1     arbiter     mode (`TurnMode`), one byte, so a host pwrite can never be read torn
//! 8       8     arbiter     epoch: the turn `mode` belongs to (written before the mode)
//! 16      8     library     waiting: threads blocked waiting for the turn now
//! 24      8     library     launches gated while holding the turn (monotonic; the arbiter's idle test)
//! 32      8     library     drained: the epoch of the last yield this container's work was drained for
//! 40      8     library     waited_ns: nanoseconds threads spent waiting, summed (monotonic)
//! 48      8     arbiter     heartbeat: CLOCK_MONOTONIC nanoseconds of the arbiter's last pass over this GPU
//! ```
//!
//! The heartbeat is how a waiting thread learns that the arbiter is gone (stopped, crashed, upgraded): a
//! `Wait` whose heartbeat stopped moving is not obeyed for ever (the library's bound), so a dead monitor
//! can never hang a container.
//!
//! Every word lives in a file the tenant can write, so each is a hint to the arbiter and never its wall:
//! a container that writes `Hold` into its own mode while another holds the GPU is seen using the GPU by
//! NVML and frozen (the monitor's turn wall). A fresh file is all zeros: `Unmanaged`, every launch goes.

use super::format::TURN_AREA;
use super::ledger::Ledger;
use portable_atomic::{AtomicU64, AtomicU8};
use std::mem::{offset_of, size_of};
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

/// The bytes of `TURN_AREA`, reached only as atomics through the mapping.
#[repr(C, align(64))]
pub struct TurnArea {
    pub mode: AtomicU8,
    pub _pad: [u8; 7],
    pub epoch: AtomicU64,
    pub waiting: AtomicU64,
    pub launches: AtomicU64,
    pub drained: AtomicU64,
    pub waited_ns: AtomicU64,
    pub heartbeat: AtomicU64,
    pub _reserved: [u8; 8],
}

const _: () = {
    assert!(size_of::<TurnArea>() == TURN_AREA.1);
    assert!(offset_of!(TurnArea, mode) == 0);
    assert!(offset_of!(TurnArea, epoch) == 8);
    assert!(offset_of!(TurnArea, waiting) == 16);
    assert!(offset_of!(TurnArea, launches) == 24);
    assert!(offset_of!(TurnArea, drained) == 32);
    assert!(offset_of!(TurnArea, waited_ns) == 40);
    assert!(offset_of!(TurnArea, heartbeat) == 48);
};

/// What the arbiter says to a container about one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnMode {
    /// No arbiter manages this GPU for the container (a fresh file, a plain or spill quota, no monitor):
    /// launches go.
    Unmanaged,
    /// The arbiter watches, and the GPU is not contended: launches go.
    Free,
    /// The container holds the GPU for a quantum: launches go (and are counted).
    Hold,
    /// Another container holds the GPU: launches wait until the mode changes.
    Wait,
    /// The container's quantum is over: drain the work in flight, record `drained`, then wait.
    Yield,
}

impl TurnMode {
    pub fn to_byte(self) -> u8 {
        match self {
            TurnMode::Unmanaged => 0,
            TurnMode::Free => 1,
            TurnMode::Hold => 2,
            TurnMode::Wait => 3,
            TurnMode::Yield => 4,
        }
    }

    /// A byte as a mode. An unknown byte (a newer arbiter, or the tenant's own store) is `Unmanaged`: the
    /// library never blocks on what it does not understand; the arbiter's wall does not rely on the word.
    pub fn from_byte(b: u8) -> TurnMode {
        match b {
            1 => TurnMode::Free,
            2 => TurnMode::Hold,
            3 => TurnMode::Wait,
            4 => TurnMode::Yield,
            _ => TurnMode::Unmanaged,
        }
    }

    /// Whether a launch may go now.
    pub fn launches_go(self) -> bool {
        matches!(self, TurnMode::Unmanaged | TurnMode::Free | TurnMode::Hold)
    }
}

impl Ledger {
    /// The turn area of this ledger's mapping.
    pub fn turn(&self) -> &TurnArea {
        self.shared.at(TURN_AREA.0)
    }
}

impl TurnArea {
    /// The mode now: one byte load (Acquire: the epoch stored before it is seen after it).
    #[inline]
    pub fn mode(&self) -> TurnMode {
        TurnMode::from_byte(self.mode.load(Acquire))
    }

    /// The epoch the mode belongs to (read after `mode`).
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Acquire)
    }

    /// Counts one launch made while holding the turn.
    pub fn note_launch(&self) {
        self.launches.fetch_add(1, Relaxed);
    }

    /// A thread starts (`+1`) or stops (`-1`) waiting for the turn.
    pub fn add_waiting(&self, delta: i64) {
        if delta >= 0 {
            self.waiting.fetch_add(delta as u64, Relaxed);
        } else {
            // Saturating: a tenant's store of 0 while we wait must not wrap the count.
            let _ = self.waiting.fetch_update(Relaxed, Relaxed, |w| {
                Some(w.saturating_sub(delta.unsigned_abs()))
            });
        }
    }

    /// Adds the nanoseconds a thread waited.
    pub fn add_waited(&self, ns: u64) {
        self.waited_ns.fetch_add(ns, Relaxed);
    }

    /// CLOCK_MONOTONIC nanoseconds of the arbiter's last pass (0: never).
    pub fn heartbeat(&self) -> u64 {
        self.heartbeat.load(Acquire)
    }

    /// Records that this process drained its work for the yield of `epoch`.
    pub fn set_drained(&self, epoch: u64) {
        self.drained.store(epoch, Release);
    }

    /// Every word, loaded one by one.
    pub fn snapshot(&self) -> TurnSnapshot {
        TurnSnapshot {
            mode: self.mode(),
            epoch: self.epoch(),
            waiting: self.waiting.load(Relaxed),
            launches: self.launches.load(Relaxed),
            drained: self.drained.load(Acquire),
            waited_ns: self.waited_ns.load(Relaxed),
            heartbeat: self.heartbeat(),
        }
    }

    /// Sets mode and epoch through the mapping (tests; the host writes through `vgpu_host::turn_write`).
    pub fn set(&self, mode: TurnMode, epoch: u64, heartbeat_ns: u64) {
        self.heartbeat.store(heartbeat_ns, Release);
        self.epoch.store(epoch, Release);
        self.mode.store(mode.to_byte(), Release);
    }
}

/// Byte offset of the turn area in a ledger file.
pub const TURN_OFFSET: u64 = TURN_AREA.0 as u64;

/// The turn as a host tool read it (`Snapshot::from_file`, or any `pread` of the first 384 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct TurnSnapshot {
    pub mode: TurnMode,
    pub epoch: u64,
    pub waiting: u64,
    pub launches: u64,
    pub drained: u64,
    pub waited_ns: u64,
    pub heartbeat: u64,
}

impl Default for TurnSnapshot {
    fn default() -> Self {
        TurnSnapshot::from_area_bytes(&[])
    }
}

impl TurnSnapshot {
    /// The turn from a ledger file's bytes starting at offset 0 (zeros where they are too short).
    pub fn from_file_bytes(b: &[u8]) -> TurnSnapshot {
        TurnSnapshot::from_area_bytes(b.get(TURN_AREA.0..).unwrap_or(&[]))
    }

    /// The turn from the bytes of `TURN_AREA` itself.
    pub fn from_area_bytes(b: &[u8]) -> TurnSnapshot {
        let at = |off: usize| {
            b.get(off..off + 8)
                .map_or(0, |s| u64::from_le_bytes(s.try_into().unwrap_or([0; 8])))
        };
        TurnSnapshot {
            mode: TurnMode::from_byte(b.first().copied().unwrap_or(0)),
            epoch: at(offset_of!(TurnArea, epoch)),
            waiting: at(offset_of!(TurnArea, waiting)),
            launches: at(offset_of!(TurnArea, launches)),
            drained: at(offset_of!(TurnArea, drained)),
            waited_ns: at(offset_of!(TurnArea, waited_ns)),
            heartbeat: at(offset_of!(TurnArea, heartbeat)),
        }
    }
}

#[cfg(test)]
mod tests;
