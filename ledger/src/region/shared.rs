//! `Shared`: the mapping and the file behind it, shared by a `Ledger` and its `Slot`s, and typed access to
//! the mapped bytes. No protocol here: committing lives in `commit`, claiming and emptying slots in `slot`.

use super::book::Book;
use super::error::{io_err, LedgerError};
use super::fd::{Identity, LedgerFd};
use super::format::{
    total_of_low_half, CommitArea, Pair, SlotRecord, COMMIT_OFFSET, KINDS, SLOTS_OFFSET,
    SLOT_COUNT, SLOT_SIZE, SPILL_PAIR_OFFSET, SPILL_WORD_OFFSET,
};
use memmap2::MmapRaw;
use portable_atomic::{AtomicU128, AtomicU64};
use std::path::PathBuf;
use std::sync::atomic::Ordering::SeqCst;

/// The mapping and the file behind it, shared by a `Ledger` and the `Slot`s it handed out. No descriptor is
/// kept (the mapping keeps the file): each operation that needs one opens its own (`open_description`).
pub(super) struct Shared {
    pub(super) map: MmapRaw,
    /// The file that was mapped; a descriptor is trusted only while it refers to this file.
    pub(super) identity: Identity,
    /// The path as given (messages) and made absolute when the ledger was opened (reopening).
    pub(super) path: PathBuf,
    pub(super) reopen: PathBuf,
    pub(super) writable: bool,
    pub(super) uuid: String,
    pub(super) provisioned_limit: u64,
}

impl Shared {
    pub(super) fn at<T>(&self, offset: usize) -> &T {
        debug_assert!(offset + std::mem::size_of::<T>() <= self.map.len());
        // SAFETY: the mapping is FILE_SIZE bytes (checked before mapping) and lives as long as `self`; every
        // offset used is inside it and aligned for T (compile-time checks in format.rs; mmap is page
        // aligned). T is only ever a struct of atomics, which other processes may change at any time.
        unsafe { &*(self.map.as_ptr().add(offset) as *const T) }
    }

    fn commit_area(&self) -> &CommitArea {
        self.at(COMMIT_OFFSET)
    }

    /// The commit word as one 128-bit atomic: read-write mappings only (a 128-bit load may be a CAS).
    pub(super) fn word(&self) -> &AtomicU128 {
        debug_assert!(self.writable);
        &self.commit_area().word
    }

    /// The low 64 bits of the commit word (total, slot, kind, seq), loadable from a read-only mapping.
    pub(super) fn word_low(&self) -> &AtomicU64 {
        self.at(COMMIT_OFFSET)
    }

    pub(super) fn word_high(&self) -> &AtomicU64 {
        self.at(COMMIT_OFFSET + 8)
    }

    /// The commit word of `book` (read-write mappings only, as `word`).
    pub(super) fn book_word(&self, book: Book) -> &AtomicU128 {
        match book {
            Book::Device => self.word(),
            Book::Spill => {
                debug_assert!(self.writable);
                self.at(SPILL_WORD_OFFSET)
            }
        }
    }

    /// The counter pair of (slot, kind) in `book`; the spill book has one pair per slot (`kind` 0).
    pub(super) fn book_pair(&self, book: Book, slot: usize, kind: usize) -> &Pair {
        match book {
            Book::Device => self.pair(slot, kind),
            Book::Spill => {
                assert!(slot < SLOT_COUNT && kind == 0);
                self.at(SLOTS_OFFSET + slot * SLOT_SIZE + SPILL_PAIR_OFFSET)
            }
        }
    }

    /// The spill book's commit word halves, loadable from a read-only mapping.
    pub(super) fn spill_word_low(&self) -> &AtomicU64 {
        self.at(SPILL_WORD_OFFSET)
    }

    pub(super) fn spill_word_high(&self) -> &AtomicU64 {
        self.at(SPILL_WORD_OFFSET + 8)
    }

    /// Bytes spilled in the whole ledger now (one atomic load).
    pub(super) fn spilled(&self) -> u64 {
        total_of_low_half(self.spill_word_low().load(SeqCst))
    }

    pub(super) fn slot(&self, index: usize) -> &SlotRecord {
        assert!(index < SLOT_COUNT);
        self.at(SLOTS_OFFSET + index * SLOT_SIZE)
    }

    pub(super) fn pair(&self, slot: usize, kind: usize) -> &Pair {
        &self.slot(slot).counters[kind]
    }

    pub(super) fn used(&self) -> u64 {
        total_of_low_half(self.word_low().load(SeqCst))
    }

    /// A new open file description of the mapped file, opened by path (never through `/proc/self/fd`: the
    /// application may own that number by now) and refused if the path names another file now. Locks
    /// taken through it belong to it alone. Read-only for a read-only ledger.
    pub(super) fn open_description(&self) -> Result<LedgerFd, LedgerError> {
        LedgerFd::open(&self.reopen, self.writable, Some(self.identity)).map_err(io_err(&self.path))
    }

    pub(super) fn slot_spilled(&self, index: usize) -> u64 {
        self.book_pair(Book::Spill, index, 0).usage.load(SeqCst)
    }

    pub(super) fn slot_usage(&self, index: usize) -> [u64; KINDS] {
        let rec = self.slot(index);
        std::array::from_fn(|k| rec.counters[k].usage.load(SeqCst))
    }
}
