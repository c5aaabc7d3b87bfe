//! Process life: fork and exit handlers, registered when a limit is first found (never at load time).
//! The fork child drops the parent's records and slots and tells the compute share it forked; exit gives
//! this process's slots back. (The compute share registers its own exit handler, later: `compute`.)

use std::panic::catch_unwind;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;

use crate::{devices, guard, records};

static REGISTER: Once = Once::new();

/// Set in the child of a fork: the compute share's launches in flight and spare events are the parent's
/// (`compute`, which reads it lazily).
pub static FORKED: AtomicBool = AtomicBool::new(false);

extern "C" {
    fn pthread_atfork(
        prepare: Option<unsafe extern "C" fn()>,
        parent: Option<unsafe extern "C" fn()>,
        child: Option<unsafe extern "C" fn()>,
    ) -> libc::c_int;
}

pub fn register() {
    REGISTER.call_once(|| {
        // SAFETY: registering plain extern "C" functions that live as long as the process (we are never
        // unloaded: the library is preloaded).
        unsafe {
            pthread_atfork(Some(prepare), Some(parent), Some(child));
            libc::atexit(at_exit);
        }
    });
}

unsafe extern "C" fn prepare() {
    // Tables first, then the resolution lock: a thread may wait for resolution while holding a table
    // shard, never the other way round, so this order cannot deadlock.
    let _ = catch_unwind(|| {
        records::RECORDS.lock_all();
        devices::lock_all();
    });
}

unsafe extern "C" fn parent() {
    let _ = catch_unwind(|| {
        records::RECORDS.unlock_all();
        devices::unlock_all();
    });
}

unsafe extern "C" fn child() {
    let _ = catch_unwind(|| {
        records::RECORDS.unlock_all();
        records::RECORDS.clear_after_fork();
        devices::child_after_fork();
        FORKED.store(true, Ordering::Relaxed);
    });
}

extern "C" fn at_exit() {
    let _ = catch_unwind(|| {
        guard::set_exiting();
        devices::release_all();
    });
}
