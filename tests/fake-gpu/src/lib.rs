//! The device model shared by the fake `libcuda.so.1` and the fake `libnvidia-ml.so.1`
//! (see `tests/fake-driver.md`): which devices exist, their UUIDs, how `CUDA_VISIBLE_DEVICES`
//! maps CUDA ordinals to them, and the state file that makes device memory global to every
//! process using the fakes, whatever container or PID namespace it runs in.

pub mod config;
pub mod state;

pub use config::{Config, MAX_DEVICES};
pub use state::{Shared, Snapshot};

/// CLOCK_MONOTONIC nanoseconds: one clock for every process of the machine.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
