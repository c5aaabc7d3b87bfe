//! The paging cost of oversubscribed managed memory (`FAKE_CUDA_PAGING_FACTOR`): a process's kernels,
//! memsets and copies on a device take that many times longer while the managed memory of the processes
//! active there (work queued or finished within `FAKE_CUDA_PAGING_WINDOW_MS`) together passes the
//! device's size, as a real GPU thrashes when the working sets it pages between do not fit. A process
//! holding no managed memory on the device does not fault and runs at its own speed. With
//! `FAKE_CUDA_PAGING_MIGRATE_US`, a process that comes back to the device after another one whose managed
//! memory and its own together pass the device used it first pays that long once (its pages move back in:
//! the cost of a hand-off between turns). Also here: keeping
//! each process's managed bytes (total and resident) in its slot of the state file, where the other
//! processes and the fake NVML read them. Not here: the queue the cost is paid on (`timeline`).

use fake_gpu::Shared;
use std::sync::OnceLock;

/// How many times longer paging work takes (`FAKE_CUDA_PAGING_FACTOR`; unset, 0 or 1: no paging cost).
pub fn factor() -> u64 {
    static F: OnceLock<u64> = OnceLock::new();
    *F.get_or_init(|| {
        std::env::var("FAKE_CUDA_PAGING_FACTOR")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(1)
            .max(1)
    })
}

fn window_ns() -> u64 {
    static W: OnceLock<u64> = OnceLock::new();
    *W.get_or_init(fake_gpu::config::paging_window_ns)
}

/// The one-off cost of moving a process's managed pages back in after another process evicted them
/// (`FAKE_CUDA_PAGING_MIGRATE_US`, nanoseconds; 0 when unset).
fn migrate_ns() -> u64 {
    static NS: OnceLock<u64> = OnceLock::new();
    *NS.get_or_init(|| {
        std::env::var("FAKE_CUDA_PAGING_MIGRATE_US")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
            .saturating_mul(1000)
    })
}

/// What `cost` nanoseconds of this process's work on physical device `phys`, queued at `now`, take:
/// `factor` times as long while it pages, plus the migration when it comes back after another process.
pub fn cost(shared: &Shared, phys: usize, cost: u64, now: u64) -> u64 {
    if cost == 0 {
        return 0;
    }
    let since = now.saturating_sub(window_ns());
    let f = factor();
    let paged = if f > 1 && shared.paging(phys, since) {
        cost.saturating_mul(f)
    } else {
        cost
    };
    let m = migrate_ns();
    if m > 0 && shared.migrates(phys, since) {
        return paged.saturating_add(m);
    }
    paged
}

/// A managed allocation of `size` bytes on `phys`, `resident` of them charged to the device, was made
/// (or, `made` false, freed).
pub fn note(shared: &Shared, phys: usize, size: u64, resident: u64, made: bool) {
    let sign = if made { 1 } else { -1 };
    shared.add_managed(phys, sign * size as i64, sign * resident as i64);
}

/// `bytes` of a managed allocation on `phys` moved onto the device (`to_device`) or off it.
pub fn migrated(shared: &Shared, phys: usize, bytes: u64, to_device: bool) {
    let delta = if to_device {
        bytes as i64
    } else {
        -(bytes as i64)
    };
    shared.add_managed(phys, 0, delta);
}
