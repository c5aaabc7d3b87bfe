//! The one reader of the state root: every entry of `<root>/containers/` sorted (`vgpu_ledger::walk`),
//! each container's limits file (quotas, Kubernetes names, owner) and, on demand, its ledgers. Used by
//! `vgpuctl status`, the monitor, admission and the garbage collector, so that they all see one state
//! root the same way. Not here: what they make of it (tables, metrics, refusals, removals), writing it
//! (`vgpu_oci::provision`).
//!
//! Everything is read as a tenant may have left it (`crate::hostfile`): the limits file and the
//! ledgers are opened without following a link, never blocking on a FIFO, only if regular and of bounded
//! size, and read with `pread` into memory (`hostfile::read_ledger`: never mapped, so a tenant truncating a ledger
//! cannot kill the reader; liveness asked with `F_OFD_GETLK`, no lock taken). Nothing is written.
//!
//! A ledger that is not there ([`LedgerRead::Missing`]) is not an error: no process of the container has
//! used CUDA on that GPU yet (an older hook made none at provisioning), so its usage is none and its quota
//! still counts. It is told by the open itself failing with "not found", never by a look before the
//! read, so a ledger removed between the two is not reported as unreadable. Anything else that is not a
//! ledger (a FIFO, a link, a foreign file) is [`LedgerRead::Unreadable`], with why.

use crate::hostfile;
use crate::state_root::StateRoot;
use crate::walk::{ContainerDir, OtherEntry, StateEntry};
use std::io;
use std::path::Path;
use vgpu_ledger::layout::LEDGER_EXTENSION;
use vgpu_ledger::{DeviceLimit, LedgerError, Limits, LimitsError, Snapshot};

/// One entry of `<root>/containers/`.
#[derive(Debug)]
pub enum Entry {
    /// A container's state folder (vgpu's marker in it, its name a container id); boxed, the largest
    /// variant by far.
    Container(Box<Container>),
    /// A provision (`.tmp-*`) or removal (`.rm-*`) in progress, or interrupted.
    Leftover(OtherEntry),
    /// Not vgpu's: readers report it and never touch it; `why` in a few words.
    Foreign { entry: OtherEntry, why: String },
}

/// A container's state: its folder and its limits file, read.
#[derive(Debug)]
pub struct Container {
    pub dir: ContainerDir,
    /// The limits file, or why it cannot be used (the container's quota is then unknown).
    pub limits: Result<Limits, LimitsError>,
}

/// One GPU's ledger as read now.
#[derive(Debug, Clone)]
pub enum LedgerRead {
    /// There is none (see the module's header): no usage yet.
    Missing,
    Read(Snapshot),
    /// Why it could not be read (one line naming the file).
    Unreadable(String),
}

/// Every entry of the state root, sorted by name, each container's limits file read. A missing state
/// root has none; a `<root>/containers/` that is not vgpu's is an error (nothing in it is read).
pub fn read(root: &StateRoot) -> io::Result<Vec<Entry>> {
    Ok(root
        .entries()?
        .into_iter()
        .map(|e| match e {
            StateEntry::Container(dir) => Entry::Container(Box::new(Container {
                limits: hostfile::load_limits(&dir.limits_path),
                dir,
            })),
            StateEntry::Leftover(o) => Entry::Leftover(o),
            StateEntry::Foreign { entry, why } => Entry::Foreign { entry, why },
        })
        .collect())
}

/// The containers alone (leftovers and entries not vgpu's left out).
pub fn containers(root: &StateRoot) -> io::Result<Vec<Container>> {
    Ok(read(root)?
        .into_iter()
        .filter_map(|e| match e {
            Entry::Container(c) => Some(*c),
            _ => None,
        })
        .collect())
}

/// The ledger at `path`, read (see the module's header for a missing one).
pub fn read_ledger(path: &Path) -> LedgerRead {
    match hostfile::read_ledger(path) {
        Ok(s) => LedgerRead::Read(s),
        Err(LedgerError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
            LedgerRead::Missing
        }
        Err(e) => LedgerRead::Unreadable(e.to_string()),
    }
}

impl Container {
    pub fn id(&self) -> &str {
        &self.dir.id
    }

    /// Each GPU of the limits file with its ledger read now, in the file's order; none when the limits
    /// file cannot be used.
    pub fn ledgers(&self) -> Vec<(&DeviceLimit, LedgerRead)> {
        let Ok(limits) = &self.limits else {
            return vec![];
        };
        limits
            .devices
            .iter()
            .map(|d| {
                (
                    d,
                    read_ledger(&limits.ledger_path(&self.dir.limits_path, d)),
                )
            })
            .collect()
    }

    /// True when a process holds a slot of any ledger in the container's ledger folder, listed in the
    /// limits file or not (read-only OFD-lock test). A ledger that cannot be read has no live users to
    /// protect.
    pub fn any_slot_alive(&self) -> io::Result<bool> {
        let ledgers = &self.dir.ledgers_dir;
        let entries = match std::fs::read_dir(ledgers) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("cannot list {}: {e}", ledgers.display()),
                ))
            }
        };
        for e in entries {
            let p = e?.path();
            if p.extension().and_then(|x| x.to_str()) != Some(LEDGER_EXTENSION) {
                continue;
            }
            if let LedgerRead::Read(s) = read_ledger(&p) {
                if s.slots.iter().any(|s| s.alive) {
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits_file::WriteLimits;
    use vgpu_ledger::{Kind, Ledger};

    const UUID: &str = "GPU-fa4ec0de-0000-4000-8000-000000000000";

    /// A container folder as the hook makes it, its limits file naming one GPU; no ledger yet.
    fn provision(root: &StateRoot, id: &str) -> std::path::PathBuf {
        std::fs::create_dir_all(root.ledgers_dir(id).unwrap()).unwrap();
        crate::walk::mark(&root.containers_dir()).unwrap();
        crate::walk::mark(&root.container_dir(id).unwrap()).unwrap();
        let mut limits = vgpu_ledger::fixtures::one_gpu(id, UUID, 1 << 30);
        (limits.pid_ns, limits.init_pid) = (Some(42), Some(1));
        limits.write_atomic(&root.limits_path(id).unwrap()).unwrap();
        root.ledger_path(id, UUID).unwrap()
    }

    fn fifo(p: &Path) {
        nix::unistd::mkfifo(p, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
    }

    #[test]
    fn a_missing_ledger_is_no_usage_and_anything_else_not_a_ledger_is_unreadable() {
        let d = tempfile::tempdir().unwrap();
        let root = StateRoot::new(d.path().to_path_buf());
        let path = provision(&root, "c1");
        let c = containers(&root).unwrap();
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].limits.as_ref().unwrap().pid_ns, Some(42));
        let l = c[0].ledgers();
        assert!(matches!(l[..], [(_, LedgerRead::Missing)]), "{l:?}");
        assert!(!c[0].any_slot_alive().unwrap());

        let ledger = Ledger::open_or_create(&path, UUID, 1 << 30).unwrap();
        let slot = ledger.attach().unwrap();
        ledger.charge(&slot, Kind::Data, 1 << 20, 1 << 30).unwrap();
        let c = containers(&root).unwrap();
        match &c[0].ledgers()[0].1 {
            LedgerRead::Read(s) => assert_eq!(s.used, 1 << 20),
            other => panic!("{other:?}"),
        }
        assert!(c[0].any_slot_alive().unwrap());
        drop(slot);

        // A FIFO where the ledger was: refused at once, never waited on.
        std::fs::remove_file(&path).unwrap();
        fifo(&path);
        match &containers(&root).unwrap()[0].ledgers()[0].1 {
            LedgerRead::Unreadable(e) => assert!(e.contains("not a regular file"), "{e}"),
            other => panic!("{other:?}"),
        }
        // A dangling link is a link, not a missing ledger.
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink("/nonexistent", &path).unwrap();
        assert!(matches!(
            containers(&root).unwrap()[0].ledgers()[0].1,
            LedgerRead::Unreadable(_)
        ));
    }

    #[test]
    fn every_entry_is_sorted_and_an_unusable_limits_file_is_kept_with_why() {
        let d = tempfile::tempdir().unwrap();
        let root = StateRoot::new(d.path().to_path_buf());
        assert!(read(&root).unwrap().is_empty(), "no state root: nothing");
        provision(&root, "b");
        provision(&root, "a");
        std::fs::remove_file(root.limits_path("b").unwrap()).unwrap();
        fifo(&root.limits_path("b").unwrap());
        std::fs::create_dir_all(root.containers_dir().join(".tmp-x")).unwrap();
        std::fs::write(root.containers_dir().join("stray"), "x").unwrap();
        let e = read(&root).unwrap();
        let kinds: Vec<&str> = e
            .iter()
            .map(|e| match e {
                Entry::Container(c) if c.limits.is_ok() => "ok",
                Entry::Container(_) => "unreadable",
                Entry::Leftover(_) => "leftover",
                Entry::Foreign { .. } => "foreign",
            })
            .collect();
        assert_eq!(kinds, ["leftover", "ok", "unreadable", "foreign"]);
        let Entry::Container(b) = &e[2] else { panic!() };
        assert_eq!(b.id(), "b");
        assert!(b.ledgers().is_empty());
        assert!(b
            .limits
            .as_ref()
            .unwrap_err()
            .to_string()
            .contains("not a regular file"));
    }
}
