//! Process slots: claiming one (`attach`), detaching (`Drop`), liveness through the slot's OFD lock, and
//! reclaiming what dead owners left. The commit protocol itself is in `commit`, the lock calls in `lock`.
//!
//! A slot's lock is taken through a description of its own, which is then pinned by a mapping (`pin`) and
//! its descriptor closed: liveness never rides on a descriptor number the application owns. Every lock
//! taken through a short-lived descriptor is trusted only once the descriptor is proven still ours (`fd`).

use super::book::{Book, Op};
use super::error::{io_err, LedgerError};
use super::format::{KINDS, SLOT_COUNT};
use super::ledger::Ledger;
use super::lock;
use super::pin::Pin;
use super::shared::Shared;
use std::fmt;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;

/// A process slot claimed by `Ledger::attach`. Dropping it detaches: everything still charged to it is
/// refunded, then the lock is released.
pub struct Slot {
    pub(super) index: u16,
    /// Keeps the slot's own open file description, and with it the slot's OFD lock, alive. None once
    /// detached/forgotten.
    pin: Option<Pin>,
    pub(super) shared: Arc<Shared>,
}

impl fmt::Debug for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slot")
            .field("index", &self.index)
            .field("ledger", &self.shared.path)
            .finish()
    }
}

impl Shared {
    /// Give back everything a slot holds (its owner is gone or detaching) and clear its owner fields.
    /// The caller holds the slot's lock. Returns whether there was anything to reclaim.
    fn empty_slot(&self, index: usize) -> bool {
        let rec = self.slot(index);
        let mut had = rec.pid.load(SeqCst) != 0;
        self.help_pending(Book::Device);
        self.help_pending(Book::Spill);
        for kind in 0..KINDS {
            let refund = Op::Refund { bytes: u64::MAX };
            if let Ok(n) = self.commit(Book::Device, index, kind, &refund, true) {
                had |= n > 0;
            }
        }
        if let Ok(n) = self.commit(Book::Spill, index, 0, &Op::Refund { bytes: u64::MAX }, true) {
            had |= n > 0;
        }
        rec.pid.store(0, SeqCst);
        rec.pid_ns.store(0, SeqCst);
        had
    }
}

/// Inode of this process's PID namespace (what `ls -l /proc/self/ns/pid` shows in brackets); 0 if unknown.
pub(super) fn own_pid_namespace() -> u64 {
    std::fs::metadata("/proc/self/ns/pid")
        .map(|m| m.ino())
        .unwrap_or(0)
}

impl Ledger {
    /// Claim a free slot for this process: an OFD write lock on the slot's byte range through a new open
    /// file description of its own, pinned by a mapping (its descriptor is closed before this returns). A
    /// slot whose lock can be taken has no live owner; whatever a dead owner left in it is refunded before it
    /// is handed out. A process killed while claiming just drops the lock.
    pub fn attach(&self) -> Result<Slot, LedgerError> {
        self.require_writable()?;
        let shared = &self.shared;
        let path = &shared.path;
        let fd = shared.open_description()?;
        let pid = std::process::id();
        let pid_ns = own_pid_namespace();
        // First pass: slots that look free (no recorded owner); second: every slot, dead owners included.
        for pass in 0..2 {
            for index in 0..SLOT_COUNT {
                let rec = shared.slot(index);
                if pass == 0 && rec.pid.load(SeqCst) != 0 {
                    continue;
                }
                if !lock::try_lock_slot(&*fd, index).map_err(io_err(path))? {
                    continue;
                }
                // The lock and the pin are ours only if the descriptor stayed ours throughout.
                let pin = Pin::new(&fd)
                    .and_then(|pin| fd.check().map(|()| pin))
                    .map_err(io_err(path))?;
                shared.empty_slot(index);
                rec.pid_ns.store(pid_ns, SeqCst);
                rec.pid.store(pid, SeqCst);
                rec.claims.fetch_add(1, SeqCst);
                shared.raise_high_water(index);
                drop(fd); // the pin keeps the description and its lock
                return Ok(Slot {
                    index: index as u16,
                    pin: Some(pin),
                    shared: Arc::clone(shared),
                });
            }
        }
        Err(LedgerError::NoFreeSlot { path: path.clone() })
    }

    /// Refund the usage of every slot whose owner is dead and clear it. Returns how many slots had anything
    /// to reclaim. Safe to run at any time, by any number of processes at once.
    pub fn reclaim_dead(&self) -> Result<usize, LedgerError> {
        self.require_writable()?;
        let shared = &self.shared;
        // Locks through a description of its own, opened for this reclaim alone.
        let fd = shared.open_description()?;
        shared.help_pending(Book::Device);
        shared.help_pending(Book::Spill);
        let mut reclaimed = 0;
        for index in 0..SLOT_COUNT {
            let rec = shared.slot(index);
            if rec.pid.load(SeqCst) == 0
                && shared.slot_usage(index).iter().all(|&u| u == 0)
                && shared.slot_spilled(index) == 0
            {
                continue;
            }
            if !lock::try_lock_slot(&*fd, index).map_err(io_err(&shared.path))? {
                continue; // alive, or being claimed or reclaimed right now
            }
            // A lock "taken" through a number the application closed and reused proves nothing.
            fd.check().map_err(io_err(&shared.path))?;
            if shared.empty_slot(index) {
                reclaimed += 1;
            }
            lock::unlock_slot(&*fd, index).map_err(io_err(&shared.path))?;
        }
        Ok(reclaimed)
    }
}

impl Slot {
    pub fn index(&self) -> u16 {
        self.index
    }

    /// In a forked child: give up the parent's slot without refunding anything (the parent still owns the
    /// slot and its usage) and without touching any descriptor or mapping (the child inherited none of the
    /// slot's: its pin is not copied into children). The child attaches a slot of its own.
    pub fn forget_after_fork(mut self) {
        if let Some(pin) = self.pin.take() {
            pin.forget();
        }
    }

    /// Test hook: let the slot go without refunding, as its owner's death would (the lock is released).
    #[cfg(test)]
    pub(super) fn die(mut self) {
        drop(self.pin.take());
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(pin) = self.pin.take() {
            self.shared.empty_slot(self.index as usize);
            drop(pin); // releases the lock
        }
    }
}
