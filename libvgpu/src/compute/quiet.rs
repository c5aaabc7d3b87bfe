//! What keeps the share's events safe from the driver freeing them under a thread that uses them: a
//! context teardown (`teardown`) excludes every `Quiet` section, in which a thread takes launches out
//! of the queue and hands their events to the driver; and in a child after `fork`, what is in flight is
//! the parent's (`FORKED`).

use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Set in the child of a fork (`lifecycle`'s handler): what is in flight and the spare events are the parent's.
pub(super) use crate::lifecycle::FORKED;

/// Held (read) while a thread hands events of the share to the driver, held (write) across a teardown.
static EVENTS: RwLock<()> = RwLock::new(());

thread_local! {
    /// How many `Quiet` sections this thread is in: only the outermost takes the lock (a read lock
    /// taken again while a teardown waits for it would never be granted).
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// A section of a thread that touches the share's events of any context (the harvest, a
/// synchronisation's queries, closing groups, draining): no context is torn down meanwhile.
pub(super) struct Quiet(Option<RwLockReadGuard<'static, ()>>);

/// Enters a `Quiet` section. In a child after `fork` no lock is taken (a thread of the parent may have
/// held it at the fork; the child's driver state is not usable anyway, and the share forgets it).
pub(super) fn quiet() -> Quiet {
    let depth = DEPTH.with(|d| {
        let n = d.get();
        d.set(n + 1);
        n
    });
    if depth > 0 || FORKED.load(Ordering::Relaxed) {
        return Quiet(None);
    }
    Quiet(Some(EVENTS.read().unwrap_or_else(|e| e.into_inner())))
}

impl Drop for Quiet {
    fn drop(&mut self) {
        drop(self.0.take());
        DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
    }
}

/// Excludes every `Quiet` section until dropped (a teardown). None within a Quiet section of this
/// thread (never by construction) or in a forked child, where the lock might never be granted.
pub(super) fn exclusive() -> Option<RwLockWriteGuard<'static, ()>> {
    let nested = DEPTH.with(|d| d.get()) > 0;
    (!nested && !FORKED.load(Ordering::Relaxed))
        .then(|| EVENTS.write().unwrap_or_else(|e| e.into_inner()))
}
