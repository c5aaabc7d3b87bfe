//! The exit flag and the panic guard every exported function runs under. A leaf: it imports nothing of
//! the crate, so every module may use it without an import circle. Logging and policies live elsewhere.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once the process is exiting: from then on calls are forwarded without accounting.
static EXITING: AtomicBool = AtomicBool::new(false);

pub fn exiting() -> bool {
    EXITING.load(Ordering::Relaxed)
}

/// The process is exiting (atexit handler): no hooked call reaches a quota any more.
pub fn set_exiting() {
    EXITING.store(true, Ordering::Relaxed);
}

/// Runs `f`; a panic is reported on stderr in one line and turned into `on_panic`, never unwound into C.
pub fn guard<R>(on_panic: R, f: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => {
            report_panic();
            on_panic
        }
    }
}

/// One line in the format of the crate's log, written with a single write(2) and no allocation.
fn report_panic() {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let mut line = [0u8; 96];
    let mut n = 0;
    let mut put = |b: &[u8]| {
        for &c in b {
            if n < line.len() {
                line[n] = c;
                n += 1;
            }
        }
    };
    put(b"[vgpu ERROR pid ");
    let digits = pid.unsigned_abs().to_string();
    put(digits.as_bytes());
    put(b"] internal error in the interposer; the call fails\n");
    // SAFETY: writes `n` initialised bytes of a local buffer to fd 2; a failed write is ignored.
    unsafe {
        libc::write(2, line.as_ptr().cast(), n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_the_error_value() {
        assert_eq!(guard(7, || 3), 3);
        assert_eq!(guard(7, || -> i32 { panic!("boom") }), 7);
    }
}
