//! The fake NVML's per-process SM utilisation: for each process whose work kept the GPU busy within the
//! last second, the share of the time since this caller's previous look at it (on its first, since the
//! process claimed its slot) that its work ran (its queue's work done, from the state file), at least 1
//! (busy is busy). Each caller (a monitor, a library asking who shares the GPU) keeps its own looks.
//! Not here: naming processes by the caller's PIDs (the crate root's `host_pids`).

use std::sync::Mutex;

/// Per device and process slot: (device, slot, its PID, namespace, when this caller last looked, its
/// work done then).
type Seen = (usize, usize, u32, u64, u64, u64);
static SEEN: Mutex<Vec<Seen>> = Mutex::new(Vec::new());

/// Device `i`'s busy processes at `now` from `work` (`Shared::work_done`): (PID as the process sees it,
/// its PID namespace, percent).
pub fn percents(
    i: usize,
    now: u64,
    work: &[(usize, u32, u64, u64, u64, u64)],
) -> Vec<(u32, u64, u64)> {
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    let mut procs = Vec::new();
    for &(slot, pid, ns, done, until, claimed) in work {
        let (t, d) = seen
            .iter()
            .find(|s| (s.0, s.1, s.2, s.3) == (i, slot, pid, ns))
            .map_or((claimed, 0), |s| (s.4, s.5));
        if until > now.saturating_sub(1_000_000_000) {
            let pct = match now.checked_sub(t).filter(|&dt| dt > 0) {
                Some(dt) => (done.saturating_sub(d) as f64 * 100.0 / dt as f64).round() as u64,
                None => 100,
            };
            procs.push((pid, ns, pct.clamp(1, 100)));
        }
    }
    seen.retain(|s| s.0 != i);
    seen.extend(
        work.iter()
            .map(|&(slot, pid, ns, done, _, _)| (i, slot, pid, ns, now, done)),
    );
    procs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_share_of_the_time_since_the_last_look_at_least_one_while_busy() {
        const S: u64 = 1_000_000_000;
        // Device 7 (no other test uses it). Slot 0 claimed at 10 s; at 12 s it did 0.5 s of work.
        let w = |done, until| vec![(0, 42, 1, done, until, 10 * S)];
        assert_eq!(percents(7, 12 * S, &w(S / 2, 12 * S)), vec![(42, 1, 25)]);
        // A second later, 0.9 s more: 90%.
        assert_eq!(
            percents(7, 13 * S, &w(14 * S / 10, 13 * S)),
            vec![(42, 1, 90)]
        );
        // Nothing more but its queue drained within the last second: busy, at least 1.
        assert_eq!(
            percents(7, 13 * S + S / 2, &w(14 * S / 10, 13 * S)),
            vec![(42, 1, 1)]
        );
        // Idle for over a second: no sample.
        assert_eq!(percents(7, 20 * S, &w(14 * S / 10, 13 * S)), vec![]);
    }
}
