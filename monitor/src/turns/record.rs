//! The arbiter's host-only files, under `<state root>/turns/` (never in a container's folder, which the
//! tenant sees): per GPU its status (`gpu-<uuid>.json`: holder, queue, epoch, counters, each member's
//! mode, freeze and wait), rewritten atomically when it changes and read by `vgpuctl status`; and the
//! cgroups this arbiter froze (`frozen.json`, `frozen::Record`), so a monitor that starts after a crash
//! thaws what the last one left frozen. Not here: the decisions (`decide`), when the files are written (`run`).

use crate::frozen::Record;
use serde::{Deserialize, Serialize};
use std::io;
use std::path::{Path, PathBuf};
use vgpu_host::atomic::{write_atomic, WriteOptions};
use vgpu_host::state_root::StateRoot;
use vgpu_ledger::region::TurnMode;

/// Largest record read back (a status file of hundreds of containers is far smaller).
pub const MAX_RECORD: u64 = 1 << 20;

const OPTIONS: WriteOptions = WriteOptions::with_mode(0o644).create_parents();

/// `<root>/turns`
pub fn dir(root: &StateRoot) -> PathBuf {
    root.root().join("turns")
}

/// One GPU's turns as the arbiter last decided them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct GpuTurns {
    pub uuid: String,
    /// Memory is short and two or more want the GPU: they take turns.
    pub contended: bool,
    /// The container holding the GPU, and since when (Unix ms).
    pub holder: Option<String>,
    pub held_since_unix_ms: Option<u64>,
    /// Those waiting, next first.
    pub queue: Vec<String>,
    pub epoch: u64,
    pub grants: u64,
    /// Holders frozen for not giving the GPU back.
    pub revocations: u64,
    /// Containers frozen for using the GPU out of turn.
    pub out_of_turn: u64,
    /// Freezes whose container's work ran on while frozen (`busy_while_frozen`). Absent in a file an
    /// older monitor wrote.
    #[serde(default)]
    pub busy_while_frozen: u64,
    pub members: Vec<MemberTurn>,
}

/// One oversubscribe container of the GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemberTurn {
    pub id: String,
    /// What it was told: unmanaged, free, hold, wait or yield.
    pub mode: String,
    /// Frozen by the arbiter, and why (revoked, out_of_turn).
    pub frozen: Option<String>,
    /// Whole seconds it waited for its turn while wanting it.
    pub waited_seconds: u64,
}

/// A mode's word in the file (the ledger's `TurnMode`, snake case).
pub fn mode_name(m: TurnMode) -> &'static str {
    match m {
        TurnMode::Unmanaged => "unmanaged",
        TurnMode::Free => "free",
        TurnMode::Hold => "hold",
        TurnMode::Wait => "wait",
        TurnMode::Yield => "yield",
    }
}

fn gpu_file(root: &StateRoot, uuid: &str) -> Option<PathBuf> {
    vgpu_ledger::layout::check_gpu_uuid(uuid).ok()?;
    Some(dir(root).join(format!("gpu-{uuid}.json")))
}

/// Writes one GPU's status.
pub fn write_gpu(root: &StateRoot, g: &GpuTurns) -> io::Result<()> {
    let Some(p) = gpu_file(root, &g.uuid) else {
        return Ok(());
    };
    write_atomic(&p, &serde_json::to_vec_pretty(g)?, OPTIONS)
}

/// Removes one GPU's status (no oversubscribe container on it any more, or the arbiter stops).
pub fn remove_gpu(root: &StateRoot, uuid: &str) {
    if let Some(p) = gpu_file(root, uuid) {
        let _ = std::fs::remove_file(p);
    }
}

/// Every GPU's status the arbiter left, by UUID order; none when it never ran or is stopped. A file that
/// cannot be read is skipped.
pub fn read_gpus(root: &StateRoot) -> Vec<GpuTurns> {
    let Ok(entries) = std::fs::read_dir(dir(root)) else {
        return vec![];
    };
    let mut out: Vec<GpuTurns> = entries
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.strip_prefix("gpu-")?.strip_suffix(".json")?;
            read(&dir(root).join(name))
        })
        .collect();
    out.sort_by(|a, b| a.uuid.cmp(&b.uuid));
    out
}

fn read<T: for<'de> Deserialize<'de>>(p: &Path) -> Option<T> {
    let bytes = vgpu_host::hostfile::read_regular(p, MAX_RECORD).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// The record of the cgroups this arbiter froze: `<root>/turns/frozen.json` (`frozen::Record`).
pub fn frozen_record(root: &StateRoot) -> Record {
    Record::new(root, "turns", "turns")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_files_round_trip_and_frozen_records_come_and_go() {
        let d = tempfile::tempdir().unwrap();
        let root = StateRoot::new(d.path().to_path_buf());
        assert!(read_gpus(&root).is_empty());
        let g = GpuTurns {
            uuid: "GPU-1".into(),
            contended: true,
            holder: Some("a".into()),
            queue: vec!["b".into()],
            grants: 3,
            busy_while_frozen: 1,
            members: vec![MemberTurn {
                id: "b".into(),
                mode: mode_name(TurnMode::Wait).into(),
                frozen: Some("revoked".into()),
                waited_seconds: 4,
            }],
            ..Default::default()
        };
        write_gpu(&root, &g).unwrap();
        write_gpu(
            &root,
            &GpuTurns {
                uuid: "GPU-0".into(),
                ..Default::default()
            },
        )
        .unwrap();
        // Not a UUID: never a path.
        write_gpu(
            &root,
            &GpuTurns {
                uuid: "../x".into(),
                ..Default::default()
            },
        )
        .unwrap();
        let all = read_gpus(&root);
        assert_eq!(all.len(), 2);
        assert_eq!(all[1], g);
        remove_gpu(&root, "GPU-0");
        assert_eq!(read_gpus(&root).len(), 1);
        // A file an older monitor wrote (no busy_while_frozen) still reads, the count 0.
        let old = r#"{"uuid":"GPU-2","contended":false,"holder":null,"held_since_unix_ms":null,"queue":[],"epoch":0,"grants":1,"revocations":0,"out_of_turn":0,"members":[]}"#;
        std::fs::write(gpu_file(&root, "GPU-2").unwrap(), old).unwrap();
        let two = read_gpus(&root)
            .into_iter()
            .find(|g| g.uuid == "GPU-2")
            .unwrap();
        assert_eq!((two.grants, two.busy_while_frozen), (1, 0));
        remove_gpu(&root, "GPU-2");

        let r = frozen_record(&root);
        let f = vec![crate::frozen::Frozen {
            container: "a".into(),
            cgroup: "/sys/fs/cgroup/a".into(),
        }];
        r.write(&f).unwrap();
        assert_eq!(r.read(), f);
        assert!(d.path().join("turns/frozen.json").is_file());
        assert!(read_gpus(&root).iter().all(|g| g.uuid.starts_with("GPU")));
        r.write(&[]).unwrap();
        assert!(r.read().is_empty());
    }
}
