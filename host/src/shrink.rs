//! A pending shrink's figures: what a container may still hold on a GPU after `vgpuctl update` lowered its
//! memory quota below what it held (limits.json's `shrunk_from` and `held_at_shrink`). `vgpuctl update`
//! bounds a new shrink's record by it; the monitor's watchdog tolerates a pending shrink up to it. Not here:
//! measuring what a container holds (`crate::held`), the file's format (`vgpu_ledger::limits`).

use vgpu_ledger::DeviceLimit;

/// The figure a pending shrink from the quota `shrunk_from` recorded: what the container held then
/// (`held_at_shrink`), never above the quota it came from; a shrink recorded before that figure existed
/// starts from the quota it came from.
pub fn recorded(shrunk_from: u64, held_at_shrink: Option<u64>) -> u64 {
    held_at_shrink.unwrap_or(shrunk_from).min(shrunk_from)
}

/// The most the container may hold on this GPU by its limits file: its quota, or while a shrink is
/// pending (`shrunk_from`) what it held at the shrink when that is more ([`recorded`]). None: no memory
/// quota.
pub fn allowed_memory(d: &DeviceLimit) -> Option<u64> {
    let limit = d.settings.memory_limit?;
    Some(match d.shrunk_from {
        Some(from) => limit.max(recorded(from, d.held_at_shrink)),
        None => limit,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_ledger::{GpuSettings, Limits};

    fn device(limit: u64, shrunk_from: Option<u64>, held_at_shrink: Option<u64>) -> DeviceLimit {
        DeviceLimit {
            index: 0,
            uuid: "GPU-0".into(),
            settings: GpuSettings {
                memory_limit: Some(limit),
                ..Default::default()
            },
            ledger: "ledgers/GPU-0.ledger".into(),
            shrunk_from,
            held_at_shrink,
        }
    }

    // What the container held at the shrink bounds what is allowed, between the new quota and the one it
    // came from.
    #[test]
    fn the_held_figure_bounds_what_is_allowed() {
        assert_eq!(
            allowed_memory(&device(1 << 30, Some(4 << 30), Some(3 << 30))),
            Some(3 << 30)
        );
        // held less than the new quota: the quota
        assert_eq!(
            allowed_memory(&device(1 << 30, Some(4 << 30), Some(512 << 20))),
            Some(1 << 30)
        );
        // never more than the quota it came from
        assert_eq!(
            allowed_memory(&device(1 << 30, Some(4 << 30), Some(8 << 30))),
            Some(4 << 30)
        );
        // no pending shrink: the quota, whatever else is there
        assert_eq!(
            allowed_memory(&device(2 << 30, None, Some(8 << 30))),
            Some(2 << 30)
        );
        let mut none = device(1 << 30, Some(4 << 30), None);
        none.settings.memory_limit = None;
        assert_eq!(allowed_memory(&none), None);
    }

    // A file from before `held_at_shrink` existed reads it absent and allows up to `shrunk_from`.
    #[test]
    fn a_shrink_recorded_before_the_held_figure_allows_the_quota_it_came_from() {
        let older = r#"{"version":1,"container_id":"c0","devices":[{"index":0,"uuid":"GPU-0",
            "memory_limit":1073741824,"shrunk_from":4294967296,"ledger":"ledgers/GPU-0.ledger"}]}"#;
        let d = &Limits::from_slice(older.as_bytes()).unwrap().devices[0];
        assert_eq!((d.held_at_shrink, allowed_memory(d)), (None, Some(4 << 30)));
        assert_eq!(recorded(4 << 30, None), 4 << 30);
    }
}
