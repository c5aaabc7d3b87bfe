//! What an operation on the ledger is: the book it moves (`Book`) and the operation itself (`Op`). Their own
//! module because the mapping (`shared`), slots (`slot`), views (`view`) and the protocol (`commit`) all
//! name them, while only `commit` runs them.

/// Which set of counters an operation moves. Both books run the same protocol with their own commit word
/// and their own pair per slot, so each is exact on its own: `Device` (the quota: the commit word after the
/// header, one pair per kind) and `Spill` (device allocations served as host-preferred managed memory past
/// the quota, against the container's spill budget: the word in the header's `SPILL_AREA`, one pair per
/// slot in its `spill` bytes, kind 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Book {
    Device,
    Spill,
}

/// A charge admitted only within `limit`, or a refund.
pub(super) enum Op {
    Charge { bytes: u64, limit: u64 },
    Refund { bytes: u64 },
}
