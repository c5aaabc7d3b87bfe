//! Levelled logging to stderr only (never stdout: the library lives inside other people's programs).
//! What is worth a line is decided by the callers; the panic guard writes its own line (`guard`).
//!
//! `LIBCUDA_LOG_LEVEL`: 0 errors, 1 (default) + warnings and quota refusals, 2 info, 3 debug, 4 trace.

use std::fmt::{Arguments, Write};
use std::sync::atomic::{AtomicU8, Ordering};

const UNSET: u8 = u8::MAX;
static LEVEL: AtomicU8 = AtomicU8::new(UNSET);

pub const ERROR: u8 = 0;
pub const WARN: u8 = 1;
pub const INFO: u8 = 2;
pub const DEBUG: u8 = 3;
pub const TRACE: u8 = 4;

/// Parses a `LIBCUDA_LOG_LEVEL` value.
pub fn parse_level(v: &str) -> Option<u8> {
    match v.trim().parse::<u8>() {
        Ok(l) if l <= TRACE => Some(l),
        _ => None,
    }
}

pub fn level() -> u8 {
    let l = LEVEL.load(Ordering::Relaxed);
    if l != UNSET {
        return l;
    }
    let (l, bad) = match std::env::var("LIBCUDA_LOG_LEVEL") {
        Ok(v) => match parse_level(&v) {
            Some(l) => (l, None),
            None => (WARN, Some(v)),
        },
        Err(_) => (WARN, None),
    };
    LEVEL.store(l, Ordering::Relaxed);
    if let Some(v) = bad {
        log(
            WARN,
            format_args!("LIBCUDA_LOG_LEVEL={v:?} is not 0..4; using 1"),
        );
    }
    l
}

pub fn enabled(l: u8) -> bool {
    l <= level()
}

/// One line to fd 2 in a single write(2), so lines from threads and processes do not interleave.
pub fn log(l: u8, args: Arguments) {
    if !enabled(l) {
        return;
    }
    let tag = ["ERROR", "WARN", "INFO", "DEBUG", "TRACE"][l as usize];
    let mut s = String::with_capacity(128);
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let _ = write!(s, "[vgpu {tag} pid {pid}] ");
    let _ = s.write_fmt(args);
    s.push('\n');
    // SAFETY: writing an owned buffer to fd 2; a short or failed write is ignored (logging is best effort).
    unsafe {
        libc::write(2, s.as_ptr().cast(), s.len());
    }
}

pub fn error(args: Arguments) {
    log(ERROR, args)
}
pub fn warn(args: Arguments) {
    log(WARN, args)
}
pub fn info(args: Arguments) {
    log(INFO, args)
}
pub fn debug(args: Arguments) {
    log(DEBUG, args)
}
