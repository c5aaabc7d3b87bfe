//! The compute share's clock: CLOCK_MONOTONIC, which every process of the machine reads alike (the
//! bucket's refill times are compared across a container's processes).

/// CLOCK_MONOTONIC in nanoseconds: the same clock in every process of the machine.
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
