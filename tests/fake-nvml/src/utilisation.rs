//! The fake NVML's per-process SM utilisation: for each process whose work kept the GPU busy within the
//! last second, the share of the time since this caller's previous look at it (on its first, since the
//! process claimed its slot) that its work ran (its queue's work done, from the state file), at least 1
//! (busy is busy). Each caller (a monitor, a library asking who shares the GPU) keeps its own looks.
//! Not here: naming processes by the caller's PIDs (the crate root's `host_pids`).
//!
//! `FAKE_NVML_SAMPLE_MS` (in the caller's environment; unset or 0: every query is answered afresh):
//! the driver's samples come that often, as a real one's do. A caller's query less than that after its
//! last answered one finds no new sample (NOT_FOUND). An H200 answered the library's queries every
//! 200 ms with every other one empty: 400 here is how the library sees it there.

use std::sync::Mutex;

/// The sample period (ns; 0: none).
fn sample_ns() -> u64 {
    static NS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *NS.get_or_init(|| {
        std::env::var("FAKE_NVML_SAMPLE_MS")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map_or(0, |ms| ms * 1_000_000)
    })
}

/// Per device, when this caller's query last got a sample.
static ANSWERED: Mutex<Vec<(usize, u64)>> = Mutex::new(Vec::new());

/// Whether this caller's query of device `i` at `now` finds no sample newer than its last answer
/// (`FAKE_NVML_SAMPLE_MS`); when it finds one, `now` is its new last answer.
pub fn no_new_sample(i: usize, now: u64) -> bool {
    no_new_within(i, now, sample_ns())
}

fn no_new_within(i: usize, now: u64, period: u64) -> bool {
    if period == 0 {
        return false;
    }
    let mut a = ANSWERED.lock().unwrap_or_else(|e| e.into_inner());
    match a.iter_mut().find(|e| e.0 == i) {
        Some(e) if now.saturating_sub(e.1) < period => true,
        Some(e) => {
            e.1 = now;
            false
        }
        None => {
            a.push((i, now));
            false
        }
    }
}

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

    #[test]
    fn with_a_sample_period_a_query_before_the_next_sample_finds_none() {
        const MS: u64 = 1_000_000;
        // Device 8 (no other test uses it), samples every 400 ms, queried every 200 ms.
        assert!(
            !no_new_within(8, 1000 * MS, 400 * MS),
            "the first query is answered"
        );
        assert!(no_new_within(8, 1200 * MS, 400 * MS), "200 ms on: empty");
        assert!(
            !no_new_within(8, 1400 * MS, 400 * MS),
            "400 ms on: a new sample"
        );
        assert!(no_new_within(8, 1600 * MS, 400 * MS));
        assert!(
            !no_new_within(8, 1600 * MS, 0),
            "no period: always answered"
        );
    }
}
