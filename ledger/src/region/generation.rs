//! The header's limits generation (`format::GENERATION_AREA`): how the library learns that the host's
//! `vgpuctl update` rewrote the container's mounted limits file (the protocol is `crate::live`'s). Here
//! only the load the library does on its allocation path and the word's place; the host's write of the
//! value is `vgpu_host::live::write_generation`.
//!
//! The word lives in a file the tenant can write, so it is only ever a hint to look again: the limits
//! themselves are read from the read-only mounted limits file, never from the ledger.

use super::format::GENERATION_AREA;
use super::ledger::Ledger;
use portable_atomic::AtomicU64;
use std::sync::atomic::Ordering::{Acquire, Release};

/// Byte offset of the generation word in a ledger file (the host writes it there with `pwrite`).
pub const GENERATION_OFFSET: u64 = GENERATION_AREA.0 as u64;

impl Ledger {
    fn generation_word(&self) -> &AtomicU64 {
        self.shared.at(GENERATION_AREA.0)
    }

    /// The limits generation as stored: one load (Acquire: the mounted file's bytes written before it are
    /// seen by a read after it).
    #[inline]
    pub fn limits_generation(&self) -> u64 {
        self.generation_word().load(Acquire)
    }

    /// Stores a generation through the mapping (tests; the host writes through
    /// `vgpu_host::live::write_generation`).
    pub fn set_limits_generation(&self, generation: u64) {
        if self.shared.writable {
            self.generation_word().store(generation, Release);
        }
    }
}
