//! The library's clock: CLOCK_MONOTONIC, read once per call through one
//! `clock_gettime` (the quota's backoffs), and its coarse variant (a few ns to read; ticks of a few ms are
//! enough for the limits file's watch of once a second). A leaf; the compute share reads it too (its
//! bucket's refill times are compared across a container's processes: the same clock in every one).

/// CLOCK_MONOTONIC in nanoseconds: the same clock in every process of the machine.
pub fn mono_ns() -> u64 {
    read(libc::CLOCK_MONOTONIC)
}

/// CLOCK_MONOTONIC_COARSE in milliseconds.
pub fn coarse_ms() -> u64 {
    read(libc::CLOCK_MONOTONIC_COARSE) / 1_000_000
}

fn read(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; CLOCK_MONOTONIC always exists on Linux, CLOCK_MONOTONIC_COARSE since
    // 2.6.32.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
