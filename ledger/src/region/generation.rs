//! The header's limits generation (`format::GENERATION_AREA`): how the library learns that the host's
//! `vgpuctl update` rewrote the container's mounted limits file (the protocol is `crate::live`'s). Here
//! only the load the library does on its allocation path and the host's write of the value.
//!
//! The word lives in a file the tenant can write, so it is only ever a hint to look again: the limits
//! themselves are read from the read-only mounted limits file, never from the ledger.

use super::format::GENERATION_AREA;
use super::ledger::Ledger;
use portable_atomic::AtomicU64;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering::{Acquire, Release};

/// Byte offset of the generation word in a ledger file (the host writes it with `pwrite`).
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

    /// Stores a generation through the mapping (tests; the host writes through `write_generation`).
    pub fn set_limits_generation(&self, generation: u64) {
        if self.shared.writable {
            self.generation_word().store(generation, Release);
        }
    }
}

/// Writes `generation` into the ledger open as `file` (the host's side: host tools never map a ledger).
/// One 8-byte `pwrite` at an 8-aligned offset; a reader that catches it half written sees a value that is
/// neither the old nor the new one, which makes it look again, never apply a file it has not read whole.
pub fn write_generation(file: &File, generation: u64) -> io::Result<()> {
    file.write_all_at(&generation.to_le_bytes(), GENERATION_OFFSET)
}

/// Reads the generation from a ledger's bytes (a host tool's `pread` of the header), 0 when too short.
pub fn generation_from_header(bytes: &[u8]) -> u64 {
    bytes
        .get(GENERATION_AREA.0..GENERATION_AREA.0 + 8)
        .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
}
