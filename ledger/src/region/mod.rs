//! The ledger ("shared region"): one memory-mapped file per GPU and container, charged and refunded by every
//! process of the container without any lock on the charge/refund path. Only the map and re-exports here.
//!
//! A *commit word* holds the ledger's total and the last committed operation; each slot keeps one
//! `(usage, applied_seq)` counter pair per kind. A charge is admitted by one 128-bit CAS of the word, then
//! applied to its pair; everybody first finishes ("helps") an operation left unapplied, so the total is
//! exact at every instant and a process killed mid-operation leaves nothing ambiguous. `commit` has the
//! full argument. Liveness is an OFD lock per slot (see `lock`), never a PID.
//!
//! | module   | what lives there                                                               |
//! |----------|--------------------------------------------------------------------------------|
//! | `format` | the bytes of the file: header, commit word and slot layout, encodings          |
//! | `kind`   | `Kind`, what an amount of memory is for                                        |
//! | `error`  | `Refused`, `LedgerError`                                                       |
//! | `shared` | `Shared`: the mapping and file behind a `Ledger` and its `Slot`s, typed access |
//! | `ledger` | `Ledger`: create, open, validate the header; path, uuid, provisioned limit     |
//! | `book`   | `Book` (the quota's counters or the spill budget's) and `Op` (charge, refund)  |
//! | `commit` | charge and refund: the commit word and the "help" protocol                     |
//! | `compute`| the compute share's token bucket of GPU time (header `COMPUTE_AREA`)           |
//! | `slot`   | `Slot`: attach, detach, reclaim of dead owners                                 |
//! | `lock`   | the OFD lock calls behind slot liveness and the measurement lock               |
//! | `measure`| `MeasureLock`: serialises measurements, a lock on the header's bytes            |
//! | `pin`    | `Pin`: the mapping that keeps a lock alive without a descriptor                 |
//! | `fd`     | our short-lived descriptors: by path, high numbers, closed only when ours      |
//! | `stats`  | the monitor's figures: slot high-water mark, refusals counted                  |
//! | `generation` | the limits generation `vgpuctl update` bumps (`crate::live`)               |
//! | `turn`   | the time-quanta turn of an oversubscribed GPU (`TURN_AREA`), arbiter ↔ library |
//! | `view`   | `used()` and `Snapshot`, read-only                                             |
//! | `file`   | `Snapshot::from_file`: the view read with `pread` from the file, never mapped    |

mod book;
mod commit;
mod compute;
mod error;
mod fd;
mod file;
mod format;
mod generation;
mod kind;
mod ledger;
mod lock;
mod measure;
mod pin;
mod shared;
mod slot;
mod stats;
mod turn;
mod view;

pub use compute::{refilled, window_capacity, ComputeArea, ComputeSnapshot, PPM};
pub use error::{LedgerError, Refused};
pub use format::{
    FILE_SIZE, FORMAT_VERSION, IPC_MARK_OFFSET, IPC_MARK_SPAN, KINDS, MAX_TOTAL, MEASURE_LOCK_LEN,
    MEASURE_LOCK_OFFSET, SLOT_COUNT,
};
pub use generation::GENERATION_OFFSET;
pub use kind::Kind;
pub use ledger::Ledger;
pub use measure::MeasureLock;
pub use slot::Slot;
pub use turn::{TurnArea, TurnMode, TurnSnapshot, TURN_OFFSET};
pub use view::{SlotSnapshot, Snapshot};

// The library shares one Ledger and its Slot between all threads of a process.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Ledger>();
    send_sync::<Slot>();
    send_sync::<MeasureLock>();
};

#[cfg(test)]
mod tests;
