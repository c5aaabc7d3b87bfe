//! The device's time: with `FAKE_CUDA_KERNEL_US` set, every kernel takes that long, one after another
//! (one queue per process, as if every stream fed one engine). Launches return at once and only move the
//! queue's end; events are stamped with the end of the queue when recorded, complete when the clock
//! passes that stamp, and their elapsed time is the difference; synchronising sleeps until the queue is
//! drained. Unset (the default), kernels take no time and events complete at once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Nanoseconds since the first use; 0 is "never".
fn now() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64 + 1
}

/// A kernel's duration (FAKE_CUDA_KERNEL_US, microseconds; 0 when unset or malformed).
pub fn kernel_ns() -> u64 {
    static NS: OnceLock<u64> = OnceLock::new();
    *NS.get_or_init(|| {
        std::env::var("FAKE_CUDA_KERNEL_US")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map_or(0, |us| us * 1000)
    })
}

/// When the queue is drained (fake nanoseconds).
static BUSY_UNTIL: AtomicU64 = AtomicU64::new(0);

/// Queues `kernels` kernels; returns when they will be done.
pub fn run(kernels: u64) -> u64 {
    let cost = kernels * kernel_ns();
    let mut cur = BUSY_UNTIL.load(Ordering::SeqCst);
    loop {
        let end = cur.max(now()) + cost;
        match BUSY_UNTIL.compare_exchange(cur, end, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => return end,
            Err(seen) => cur = seen,
        }
    }
}

/// The stamp an event recorded now gets: when the work queued before it is done.
pub fn stamp() -> u64 {
    BUSY_UNTIL.load(Ordering::SeqCst).max(now())
}

pub fn done(stamp: u64) -> bool {
    now() >= stamp
}

pub fn wait_for(stamp: u64) {
    let n = now();
    if stamp > n {
        std::thread::sleep(Duration::from_nanos(stamp - n));
    }
}

/// Sleeps until everything queued is done.
pub fn drain() {
    wait_for(BUSY_UNTIL.load(Ordering::SeqCst));
}
