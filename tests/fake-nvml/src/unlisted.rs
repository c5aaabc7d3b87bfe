//! Device memory no process's figure shows, as a real GPU has it: the physical memory an exported handle
//! keeps after its process released the handle (the descriptor holds it, in that process or one it was
//! passed to), and managed memory resident on the GPU, which the driver counts in the device's used memory
//! and not in the process's figure. What `vgpuctl monitor` reports as unattributed memory
//! (`tests/e2e/monitor.test.sh`).
//!
//! - `<FAKE_CUDA_STATE_DIR>/unlisted-<device>`: a byte count (or a size, `512Mi`) the device uses that no
//!   process lists, read at every memory-info call; a test writes it (a descriptor kept) and removes it
//!   (closed). No file: none.
//! - `FAKE_NVML_PROCESS_OMITS_MANAGED=1` in the caller's environment: a process's figure leaves out its
//!   managed memory resident on the device (still in the device's used memory).

use fake_gpu::{Config, Shared};

/// Device `i`'s memory in use: the bytes charged to it and the managed pages active processes pulled in
/// (`Shared::resident_used` since `since`), plus those no process lists, at most the device.
pub fn device_used(s: &Shared, i: usize, since: u64) -> u64 {
    s.resident_used(i, since)
        .saturating_add(bytes(i))
        .min(s.total(i))
}

/// The bytes device `i` uses that no process lists (its `unlisted-<i>` file; 0 without one or when it does
/// not parse).
pub fn bytes(i: usize) -> u64 {
    let Ok(cfg) = Config::from_env() else {
        return 0;
    };
    let path = std::path::Path::new(&cfg.state_dir).join(format!("unlisted-{i}"));
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| fake_gpu::config::parse_size(t.trim()).ok())
        .unwrap_or(0)
}

/// The live processes on device `i` (`Shared::processes_on`: PID, PID namespace, bytes), each less its
/// resident managed bytes when the caller's environment has `FAKE_NVML_PROCESS_OMITS_MANAGED=1`.
pub fn processes_on(s: &Shared, i: usize, pages_since: Option<u64>) -> Vec<(u32, u64, u64)> {
    let mut procs = s.processes_on(i, pages_since);
    if !std::env::var("FAKE_NVML_PROCESS_OMITS_MANAGED").is_ok_and(|v| v.trim() == "1") {
        return procs;
    }
    let managed = s.resident_managed(i);
    for p in &mut procs {
        let m: u64 = managed
            .iter()
            .filter(|q| (q.0, q.1) == (p.0, p.1))
            .map(|q| q.2)
            .sum();
        p.2 = p.2.saturating_sub(m);
    }
    procs
}
