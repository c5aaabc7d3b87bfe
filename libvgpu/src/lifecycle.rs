//! Process life: no constructor; fork and exit handlers registered on the first CUDA call that finds a
//! limit; every exported function runs under `guard`, so a panic becomes an error code, never an unwind
//! into C.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;

use crate::{hooks, log, quota};

static REGISTER: Once = Once::new();
/// Set once the process is exiting: from then on calls are forwarded without accounting.
static EXITING: AtomicBool = AtomicBool::new(false);

pub fn exiting() -> bool {
    EXITING.load(Ordering::Relaxed)
}

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
        hooks::lock_tables();
        quota::lock_all();
    });
}

unsafe extern "C" fn parent() {
    let _ = catch_unwind(|| {
        hooks::unlock_tables();
        quota::unlock_all();
    });
}

unsafe extern "C" fn child() {
    let _ = catch_unwind(|| {
        hooks::unlock_tables();
        hooks::clear_tables();
        quota::child_after_fork();
    });
}

extern "C" fn at_exit() {
    let _ = catch_unwind(|| {
        EXITING.store(true, Ordering::Relaxed);
        quota::release_all();
    });
}

/// Runs `f`; a panic is logged and turned into `on_panic`.
pub fn guard<R>(on_panic: R, f: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => {
            log::error(format_args!(
                "internal error in the interposer; the call fails"
            ));
            on_panic
        }
    }
}
