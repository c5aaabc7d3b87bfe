//! `MeasureLock`: the measurement lock — processes sharing a ledger serialise what they measure (a context
//! creation) so one measurement does not count another's new context. An OFD write lock on the header's
//! bytes (`format`: no slot lock covers them) of the ledger file itself, so it needs no file of its own
//! (a container cannot create files next to its ledger, which is a bind-mounted file). Not here: how long
//! to wait for it (the caller polls `try_measure_lock`).
//!
//! Kept like a slot's lock: taken through a description of its own, pinned by a `PROT_NONE`,
//! `MADV_DONTFORK` mapping (`pin`) and its descriptor closed at once. So no descriptor number the
//! application owns carries it, a fork child never inherits it (the mapping is not copied, there is no
//! descriptor), and it goes with the holder's death, `exec`, or the value's drop.

use super::error::io_err;
use super::error::LedgerError;
use super::ledger::Ledger;
use super::lock;
use super::pin::Pin;

/// The measurement lock of one ledger, held until dropped.
pub struct MeasureLock {
    _pin: Pin,
}

impl Ledger {
    /// Takes the measurement lock if no other open file description holds it. Ok(None): held elsewhere
    /// (another process, or another thread of this one: each take is its own description).
    pub fn try_measure_lock(&self) -> Result<Option<MeasureLock>, LedgerError> {
        self.require_writable()?;
        let shared = &self.shared;
        let fd = shared.open_description()?;
        if !lock::try_lock_measure(&*fd).map_err(io_err(&shared.path))? {
            return Ok(None);
        }
        // The lock and the pin are ours only if the descriptor stayed ours throughout.
        let pin = Pin::new(&fd)
            .and_then(|pin| fd.check().map(|()| pin))
            .map_err(io_err(&shared.path))?;
        drop(fd); // the pin keeps the description and its lock
        Ok(Some(MeasureLock { _pin: pin }))
    }

    /// Whether some process holds the measurement lock (read-only: asks, never takes it).
    pub fn measure_locked(&self) -> Result<bool, LedgerError> {
        let fd = self.shared.open_description()?;
        let held = lock::measure_is_locked(&*fd).map_err(io_err(&self.shared.path))?;
        fd.check().map_err(io_err(&self.shared.path))?;
        Ok(held)
    }
}
