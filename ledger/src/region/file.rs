//! A ledger read from its file rather than its mapping: `Snapshot::from_file`, the view the host tools
//! take (`vgpuctl status`, the garbage collector, the monitor) once `vgpu_host::hostfile::read_ledger` has
//! opened the file as untrusted. Not here: the library's view through its mapping (`view`), opening a
//! tenant's file safely (`vgpu_host::hostfile`).
//!
//! Its bytes are read with `pread` into memory — nothing is mapped, so a tenant truncating the file while we
//! read gives a short read and an error, never a SIGBUS — and each slot's liveness asked with `F_OFD_GETLK`
//! through that same read-only descriptor (no lock is ever taken). Only the slots below the header's
//! high-water mark are read (`stats`): a node's ledgers use a few of their 1024 slots. The snapshot is the
//! bytes of one read: exact when nobody charges, each number a value it had under load (as the mapped
//! view).

use super::compute::ComputeSnapshot;
use super::error::{io_err, LedgerError};
use super::format::{
    SlotRecord, COMMIT_OFFSET, COMPUTE_AREA, FILE_SIZE, KINDS, SLOTS_OFFSET, SLOT_SIZE,
    SPILL_PAIR_OFFSET, SPILL_WORD_OFFSET,
};
use super::ledger::check_header;
use super::lock;
use super::stats::{slots_to_read, HIGH_WATER_OFFSET, REFUSALS_OFFSET};
use super::turn::TurnSnapshot;
use super::view::{read_slots, Snapshot, Source};
use std::fs::File;
use std::io;
use std::mem::offset_of;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// A ledger's bytes as read: the header, the commit area and the first slots.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u64_at(&self, off: usize) -> u64 {
        u64::from_le_bytes(self.0[off..off + 8].try_into().unwrap())
    }
    fn slot_at(&self, slot: usize, field: usize) -> usize {
        SLOTS_OFFSET + slot * SLOT_SIZE + field
    }
}

impl Source for Bytes<'_> {
    fn word_low(&self) -> u64 {
        self.u64_at(COMMIT_OFFSET)
    }
    fn word_high(&self) -> u64 {
        self.u64_at(COMMIT_OFFSET + 8)
    }
    fn pid(&self, slot: usize) -> u32 {
        let off = self.slot_at(slot, offset_of!(SlotRecord, pid));
        u32::from_le_bytes(self.0[off..off + 4].try_into().unwrap())
    }
    fn pid_ns(&self, slot: usize) -> u64 {
        self.u64_at(self.slot_at(slot, offset_of!(SlotRecord, pid_ns)))
    }
    fn usage(&self, slot: usize) -> [u64; KINDS] {
        // A pair is (usage, applied), 16 bytes.
        let base = self.slot_at(slot, offset_of!(SlotRecord, counters));
        std::array::from_fn(|k| self.u64_at(base + 16 * k))
    }
    fn applied(&self, slot: usize, kind: usize) -> u64 {
        self.u64_at(self.slot_at(slot, offset_of!(SlotRecord, counters)) + 16 * kind + 8)
    }
    fn slot_count(&self) -> usize {
        (self.0.len() - SLOTS_OFFSET) / SLOT_SIZE
    }
    fn spill_word_low(&self) -> u64 {
        self.u64_at(SPILL_WORD_OFFSET)
    }
    fn spill_word_high(&self) -> u64 {
        self.u64_at(SPILL_WORD_OFFSET + 8)
    }
    fn spill_usage(&self, slot: usize) -> u64 {
        self.u64_at(self.slot_at(slot, SPILL_PAIR_OFFSET))
    }
    fn spill_applied(&self, slot: usize) -> u64 {
        self.u64_at(self.slot_at(slot, SPILL_PAIR_OFFSET) + 8)
    }
}

impl Snapshot {
    /// Reads the ledger open as `file` (`path` names it in errors; the caller opened it, on the host as
    /// untrusted: `vgpu_host::hostfile::read_ledger`): maps nothing, writes nothing, takes no lock. A file
    /// of the wrong size or header is an error naming the file; no error shows the file's bytes.
    pub fn from_file(path: &Path, file: &File) -> Result<Snapshot, LedgerError> {
        // Any size opens (the header check names a wrong one). The header first, for the high-water mark;
        // then, in one read, the header again, the commit word and the slots below the mark.
        let size = file.metadata().map_err(io_err(path))?.len();
        let head = read_prefix(file, SLOTS_OFFSET).map_err(io_err(path))?;
        check_header(path, size, &head)?;
        let mark = u32::from_le_bytes(
            head[HIGH_WATER_OFFSET..HIGH_WATER_OFFSET + 4]
                .try_into()
                .unwrap(),
        );
        let want = SLOTS_OFFSET + slots_to_read(mark) * SLOT_SIZE;
        let bytes = read_prefix(file, want).map_err(io_err(path))?;
        if bytes.len() < want {
            // Shrunk since fstat: the check names it as a file of the wrong size.
            check_header(path, bytes.len() as u64, &bytes)?;
        }
        let (uuid, limit) = check_header(path, FILE_SIZE as u64, &bytes)?;
        let b = Bytes(&bytes);
        let refusals = b.u64_at(REFUSALS_OFFSET);
        let (used, spilled, mut slots) = read_slots(&b);
        for s in &mut slots {
            s.alive = lock::slot_is_locked(file, s.index as usize).unwrap_or(false);
        }
        Ok(Snapshot {
            uuid,
            limit,
            used,
            refusals,
            spilled,
            compute: ComputeSnapshot::from_bytes(
                &bytes[COMPUTE_AREA.0..COMPUTE_AREA.0 + COMPUTE_AREA.1],
            ),
            turn: TurnSnapshot::from_file_bytes(&bytes),
            slots,
        })
    }
}

/// The file's first `n` bytes (fewer if it is shorter), read with `pread`.
fn read_prefix(file: &File, n: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; n];
    let mut have = 0;
    while have < n {
        match file.read_at(&mut buf[have..], have as u64) {
            Ok(0) => break,
            Ok(k) => have += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(have);
    Ok(buf)
}
