//! Charge and refund: committing an operation to the commit word and applying it to its counter (the "help"
//! protocol), lock-free. Not here: slot ownership and reclaim (`slot`), read-only views (`view`).
//!
//! How it stays exact (docs/architecture.md, "The ledger", has the short version):
//!
//! * The *commit word* holds the ledger's total plus the last committed operation `(slot, kind, seq,
//!   amount, refund, gen)`. Committing an operation is one 128-bit CAS of that word; a charge's CAS is only
//!   attempted when `total + amount <= limit`, so the total can never pass the limit, whatever the timing.
//! * Each slot has one `(usage, applied_seq)` pair per kind. After the commit the operation is *applied* to
//!   its pair with a 128-bit CAS that adds the amount and increments `applied_seq`.
//! * Before committing, everybody *helps*: if the operation in the word is not applied yet (its `seq` differs
//!   from `applied_seq mod 8` of its pair), apply it. So at any instant at most one committed operation is
//!   unapplied — the one in the word — and `total == Σ usage + (that one, if unapplied)`. A process killed
//!   between commit and apply leaves nothing ambiguous: the next operation or the reclaimer finishes it.
//!   A new operation on `(slot, kind)` takes `seq = applied_seq + 1 (mod 8)`, read after helping.
//!
//! Why a helper never applies an operation twice or applies a stale one: it loads the pair `p`, checks the
//! word still holds `c`, and only then decides. The pair's `applied_seq` is a full 64-bit counter that grows
//! with every application, so a pair CAS from `p` succeeds only if the pair did not change since it was
//! loaded — i.e. it still is the state it had while the word held `c`, where `applied_seq` is either
//! `seq − 1` (unapplied: apply it) or `seq` (applied). The "applied" verdict is confirmed the same way (the
//! pair is loaded again and must be unchanged). The remaining window, a commit CAS succeeding on a word that
//! went away and came back bit-identical, is closed by the 17-bit `gen` counter in the word: it needs an
//! exact multiple of 2^17 commits, returning to the same total, slot, kind, seq and amount, while one thread
//! sits between two adjacent instructions.

use super::book::{Book, Op};
use super::error::Refused;
use super::format::{pack_pair, unpack_pair, Commit, MAX_TOTAL, SEQ_MASK};
use super::kind::Kind;
use super::ledger::Ledger;
use super::shared::Shared;
use super::slot::Slot;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;

impl Shared {
    /// Apply the operation of commit word `c` to its counter unless it already is. Returns false when the
    /// word no longer holds `c` (the caller reloads it and tries again).
    fn help(&self, book: Book, c: u128) -> bool {
        let op = Commit::decode(c);
        if book == Book::Spill && op.kind != 0 {
            return true; // never written by us: the spill book only has kind 0 (a scribbled word)
        }
        let pair = self
            .book_pair(book, op.slot as usize, op.kind as usize)
            .as_u128();
        loop {
            let p = pair.load(SeqCst);
            if self.book_word(book).load(SeqCst) != c {
                return false;
            }
            let (usage, applied) = unpack_pair(p);
            if applied & SEQ_MASK == op.seq as u64 {
                // Applied, provided `p` is still the pair's state, i.e. its state while the word held `c`.
                if pair.load(SeqCst) == p {
                    return true;
                }
                continue;
            }
            let next = pack_pair(
                usage.saturating_add_signed(op.delta()),
                applied.wrapping_add(1),
            );
            if pair.compare_exchange(p, next, SeqCst, SeqCst).is_ok() {
                return true;
            }
        }
    }

    /// Apply whatever operation the commit word holds.
    pub(super) fn help_pending(&self, book: Book) {
        let word = self.book_word(book);
        let mut c = word.load(SeqCst);
        while !self.help(book, c) {
            c = word.load(SeqCst);
        }
    }

    /// Commit one operation on (slot, kind) and apply it. Returns the bytes actually moved: a refund is
    /// clamped to the counter's usage, so no counter and no total ever goes below zero.
    pub(super) fn commit(
        &self,
        book: Book,
        slot: usize,
        kind: usize,
        op: &Op,
        apply: bool,
    ) -> Result<u64, Refused> {
        let word = self.book_word(book);
        let pair = self.book_pair(book, slot, kind).as_u128();
        let mut c = word.load(SeqCst);
        loop {
            if !self.help(book, c) {
                c = word.load(SeqCst);
                continue;
            }
            let cur = Commit::decode(c);
            let (usage, applied) = unpack_pair(pair.load(SeqCst));
            let (amount, refund, total) = match *op {
                Op::Charge { bytes, limit } => {
                    let cap = limit.min(MAX_TOTAL);
                    if bytes > cap || cur.total > cap - bytes {
                        return Err(Refused {
                            requested: bytes,
                            used: cur.total,
                            limit,
                        });
                    }
                    (bytes, false, cur.total + bytes)
                }
                Op::Refund { bytes } => {
                    let amount = bytes.min(usage);
                    (amount, true, cur.total.saturating_sub(amount))
                }
            };
            if amount == 0 {
                return Ok(0);
            }
            let next = Commit {
                total,
                slot: slot as u16,
                kind: kind as u8,
                seq: (applied.wrapping_add(1) & SEQ_MASK) as u8,
                amount,
                refund,
                gen: cur.next_gen(),
            }
            .encode();
            match word.compare_exchange(c, next, SeqCst, SeqCst) {
                Ok(_) => {
                    if apply {
                        self.help(book, next);
                    }
                    return Ok(amount);
                }
                Err(actual) => c = actual,
            }
        }
    }
}

impl Ledger {
    /// Charge `bytes` of `kind` to `slot` unless the ledger's total would pass `limit`. Lock-free.
    pub fn charge(&self, slot: &Slot, kind: Kind, bytes: u64, limit: u64) -> Result<(), Refused> {
        debug_assert!(
            Arc::ptr_eq(&self.shared, &slot.shared) || self.shared.path == slot.shared.path
        );
        if bytes == 0 {
            return Ok(());
        }
        slot.shared
            .commit(
                Book::Device,
                slot.index as usize,
                kind.index(),
                &Op::Charge { bytes, limit },
                true,
            )
            .map(|_| ())
    }

    /// Give back `bytes` of `kind` charged to `slot`; never more than the slot holds of that kind.
    pub fn refund(&self, slot: &Slot, kind: Kind, bytes: u64) {
        debug_assert!(
            Arc::ptr_eq(&self.shared, &slot.shared) || self.shared.path == slot.shared.path
        );
        let _ = slot.shared.commit(
            Book::Device,
            slot.index as usize,
            kind.index(),
            &Op::Refund { bytes },
            true,
        );
    }

    /// Charge `bytes` of spilled memory (device allocations served as host-preferred managed memory) to
    /// `slot` unless the container's spilled total would pass `budget`. Lock-free, exact across process
    /// death as the device counters are (a dead slot's spill is refunded by the reclaim).
    pub fn charge_spill(&self, slot: &Slot, bytes: u64, budget: u64) -> Result<(), Refused> {
        if bytes == 0 {
            return Ok(());
        }
        slot.shared
            .commit(
                Book::Spill,
                slot.index as usize,
                0,
                &Op::Charge {
                    bytes,
                    limit: budget,
                },
                true,
            )
            .map(|_| ())
    }

    /// Give back `bytes` of spilled memory charged to `slot`; never more than the slot holds.
    pub fn refund_spill(&self, slot: &Slot, bytes: u64) {
        let _ = slot.shared.commit(
            Book::Spill,
            slot.index as usize,
            0,
            &Op::Refund { bytes },
            true,
        );
    }

    /// Bytes spilled in the whole ledger now (one atomic load).
    pub fn spilled(&self) -> u64 {
        self.shared.spilled()
    }
}

impl Slot {
    /// Test hook: commit an operation but do not apply it, as a process killed between the two steps would.
    #[cfg(test)]
    pub(super) fn commit_unapplied(&self, kind: Kind, bytes: u64, refund: bool) {
        let op = if refund {
            Op::Refund { bytes }
        } else {
            Op::Charge {
                bytes,
                limit: MAX_TOTAL,
            }
        };
        self.shared
            .commit(Book::Device, self.index as usize, kind.index(), &op, false)
            .unwrap();
    }

    /// Test hook: as `commit_unapplied`, on the spill book.
    #[cfg(test)]
    pub(super) fn commit_spill_unapplied(&self, bytes: u64) {
        let op = Op::Charge {
            bytes,
            limit: MAX_TOTAL,
        };
        self.shared
            .commit(Book::Spill, self.index as usize, 0, &op, false)
            .unwrap();
    }
}
