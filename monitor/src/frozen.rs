//! The walls' record of what they froze: each wall that freezes containers (the share wall, the
//! time-quanta arbiter) keeps the list of the cgroups it holds frozen in a host-only file of the state
//! root (`<root>/<wall>/frozen.json`, outside every container's folder), rewritten atomically at every
//! freeze and thaw and removed when nothing is frozen. A monitor that ends without thawing (SIGKILL, the
//! kernel's OOM killer, a crash) leaves the file behind; the next one thaws what it lists at its start
//! (`Record::thaw_left`), so no container stays frozen for good. Not here: when to freeze (`share_run`,
//! `turns::run`), the cgroup writes (`freezer`).

use crate::freezer;
use crate::stderr::log;
use serde::{Deserialize, Serialize};
use std::io;
use std::path::PathBuf;
use vgpu_host::atomic::{write_atomic, WriteOptions};
use vgpu_host::state_root::StateRoot;

/// Largest record read back (hundreds of containers are far smaller).
const MAX_RECORD: u64 = 1 << 20;
const OPTIONS: WriteOptions = WriteOptions::with_mode(0o644).create_parents();
const FILE: &str = "frozen.json";

/// A cgroup a wall froze.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frozen {
    pub container: String,
    pub cgroup: PathBuf,
}

/// One wall's record: `<root>/<folder>/frozen.json`.
#[derive(Debug, Clone)]
pub struct Record {
    path: PathBuf,
    /// The wall's name in the log lines ("share wall", "turns").
    wall: &'static str,
}

impl Record {
    /// The record of the wall `wall`, in `<root>/<folder>/`.
    pub fn new(root: &StateRoot, folder: &str, wall: &'static str) -> Record {
        Record {
            path: root.root().join(folder).join(FILE),
            wall,
        }
    }

    /// Records what the wall holds frozen now (none: the file removed).
    pub fn write(&self, frozen: &[Frozen]) -> io::Result<()> {
        if frozen.is_empty() {
            return match std::fs::remove_file(&self.path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            };
        }
        write_atomic(&self.path, &serde_json::to_vec_pretty(frozen)?, OPTIONS)
    }

    /// [`Record::write`], a failure logged (the freeze stands; only a crash's thaw would miss it).
    pub fn save(&self, frozen: &[Frozen]) {
        if let Err(e) = self.write(frozen) {
            log(&format!(
                "{}: cannot record the frozen cgroups in {}: {e}",
                self.wall,
                self.path.display()
            ));
        }
    }

    /// What the last run recorded as frozen (none when it stopped cleanly, or the file is unreadable).
    pub fn read(&self) -> Vec<Frozen> {
        vgpu_host::hostfile::read_regular(&self.path, MAX_RECORD)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    /// At a start: thaws every cgroup the last run recorded as frozen (it ended without thawing), one
    /// log line each, then clears the record. Only a directory below the host's cgroup v2 mount, as
    /// `vgpu_host::cgroup::below` makes them, is ever written.
    pub fn thaw_left(&self) {
        let left = self.read();
        if left.is_empty() {
            return;
        }
        let Some(mount) = vgpu_host::cgroup::host_v2_mount() else {
            return;
        };
        for f in left {
            let ok = f
                .cgroup
                .strip_prefix(&mount)
                .ok()
                .and_then(|rel| vgpu_host::cgroup::below(&rel.to_string_lossy(), &mount))
                .is_some();
            if !ok {
                continue;
            }
            match freezer::set_frozen(&f.cgroup, false) {
                Ok(()) => log(&format!(
                    "{}: thawed container {} ({}), left frozen by a previous run",
                    self.wall,
                    f.container,
                    f.cgroup.display()
                )),
                Err(e) if f.cgroup.exists() => log(&format!(
                    "{}: cannot thaw {}: {e}",
                    self.wall,
                    f.cgroup.display()
                )),
                Err(_) => {}
            }
        }
        self.save(&[]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_come_and_go_and_an_unreadable_one_is_none() {
        let d = tempfile::tempdir().unwrap();
        let root = StateRoot::new(d.path().to_path_buf());
        let r = Record::new(&root, "share-wall", "share wall");
        assert!(r.read().is_empty());
        let f = vec![Frozen {
            container: "a".into(),
            cgroup: "/sys/fs/cgroup/a".into(),
        }];
        r.write(&f).unwrap();
        assert_eq!(r.read(), f);
        assert!(d.path().join("share-wall/frozen.json").is_file());
        r.write(&[]).unwrap();
        assert!(r.read().is_empty());
        assert!(!d.path().join("share-wall/frozen.json").exists());
        r.write(&[]).unwrap();
        std::fs::write(d.path().join("share-wall/frozen.json"), "not json").unwrap();
        assert!(r.read().is_empty());
    }

    /// A record naming a path outside the cgroup mount is never written through, and is cleared.
    #[test]
    fn a_recorded_path_outside_the_cgroup_mount_is_left_alone() {
        let d = tempfile::tempdir().unwrap();
        let root = StateRoot::new(d.path().to_path_buf());
        let outside = d.path().join("cg");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("cgroup.freeze"), "1").unwrap();
        let r = Record::new(&root, "share-wall", "share wall");
        r.write(&[Frozen {
            container: "a".into(),
            cgroup: outside.clone(),
        }])
        .unwrap();
        r.thaw_left();
        assert_eq!(
            std::fs::read_to_string(outside.join("cgroup.freeze")).unwrap(),
            "1"
        );
        if vgpu_host::cgroup::host_v2_mount().is_some() {
            assert!(r.read().is_empty(), "the record is done");
        }
    }
}
