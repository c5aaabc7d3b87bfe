//! Garbage collection of state whose poststop never came; run by every hook and by `vgpuctl gc`. Not here:
//! reading the state root (`inventory`, the host tools' one reader), removing a folder
//! (`removal`).
//!
//! Its poststop may never come after an engine crash, CRI-O removing late, or a lower runtime that failed
//! after the shim provisioned.
//! A container folder is garbage when its container is gone — its init process is dead, or that pid now
//! belongs to another PID namespace or to a process started at another time (`procs::init_alive`)
//! — and no process still holds a slot of any of its ledgers (the OFD-lock test is read-only and needs no
//! PIDs). A folder whose limits file cannot be read (too large, not a regular file, not JSON) is kept and
//! reported: whose it is cannot be told, and its container may be running. State provisioned by the shim
//! whose hook never recorded an owner is garbage once it is older than `gc_pending_grace_seconds`, or at
//! once when the process that provisioned it is gone (`abandoned`).
//! Only folders holding vgpu's marker (`crate::state_root::MARKER_FILE_NAME`) are ever removed; anything else under the
//! state root is reported and left alone, and a `containers/` folder without the marker is not walked at all.
//! A ledger folder is its tenant's: ledgers are read without following links or waiting on FIFOs.

use crate::inventory::{self, Container, Entry};
use crate::procs;
use crate::removal::{self, RemoveError};
use crate::state_root::StateRoot;
use nix::errno::Errno;
use std::fs;
use std::io;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

/// Default grace for state without an owner (see the config key `gc_pending_grace_seconds`).
pub const DEFAULT_PENDING_GRACE: Duration = Duration::from_secs(300);

/// What one collection did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct GcReport {
    /// Container ids whose state was removed.
    pub removed: Vec<String>,
    /// Container ids whose state was kept (container alive, or a process still holds a slot).
    pub kept: Vec<String>,
    /// One line per folder that could not be examined or removed.
    pub errors: Vec<String>,
}

/// Why one folder was neither removed nor kept: the line of [`GcReport::errors`].
#[derive(Debug, thiserror::Error)]
pub enum GcError {
    /// A leftover folder without vgpu's marker that holds something.
    #[error("{}: holds no vgpu marker ({}) and is not empty: not made by vgpu; left alone", path.display(), crate::state_root::MARKER_FILE_NAME)]
    NotOurs { path: PathBuf },
    #[error("{}: {err}", path.display())]
    Io { path: PathBuf, err: io::Error },
    /// The limits file cannot be used (its reader's line).
    #[error("{err}; kept: its container may still be running (remove the folder once it is gone)")]
    Unreadable { err: String },
    /// Whether a process holds a slot of its ledgers cannot be told.
    #[error(transparent)]
    Slots(io::Error),
    #[error(transparent)]
    Remove(#[from] RemoveError),
}

/// Collects with the default grace for owner-less state.
pub fn collect(root: &StateRoot) -> io::Result<GcReport> {
    collect_with(root, DEFAULT_PENDING_GRACE)
}

/// Collects garbage under `root`; `pending_grace` is how old owner-less state must be to be garbage. Entries
/// of the state root that are not a container's state (no vgpu marker, not a folder, ...) are reported in
/// `errors` and left alone; a `<root>/containers/` that is not vgpu's is an error, and nothing in it is
/// touched. Ledgers are read as untrusted files (`vgpu_ledger::hostfile`): a tenant's FIFO or link in its
/// ledger folder is never opened as a file, so it can neither block nor trick the collector.
pub fn collect_with(root: &StateRoot, pending_grace: Duration) -> io::Result<GcReport> {
    let mut report = GcReport::default();
    let now = SystemTime::now();
    let age = |m: Option<SystemTime>| {
        m.and_then(|m| now.duration_since(m).ok())
            .unwrap_or_default()
    };
    for entry in inventory::read(root)? {
        match entry {
            // Leftovers of an interrupted provision (.tmp-*) or removal (.rm-*): ours when marked; one cut
            // short before its marker was written is empty, and removing an empty folder loses nothing.
            Entry::Leftover(o) if age(o.modified) > pending_grace => {
                let removed = if o.marked {
                    removal::remove_marked(&o.path).map_err(GcError::from)
                } else {
                    fs::remove_dir(&o.path).map_err(|err| {
                        match err.raw_os_error().map(Errno::from_raw) {
                            Some(Errno::ENOTEMPTY) | Some(Errno::EEXIST) => GcError::NotOurs {
                                path: o.path.clone(),
                            },
                            _ => GcError::Io {
                                path: o.path.clone(),
                                err,
                            },
                        }
                    })
                };
                match removed {
                    Ok(()) => report.removed.push(o.name),
                    Err(e) => report.errors.push(e.to_string()),
                }
            }
            Entry::Leftover(_) => {}
            Entry::Foreign { entry, why } => report.errors.push(format!(
                "{}: not a container's state ({why}); left alone",
                entry.path.display()
            )),
            Entry::Container(c) => match is_garbage(&c, age(c.dir.modified), pending_grace) {
                Ok(true) => match removal::remove_dir(&c.dir.dir) {
                    Ok(_) => report.removed.push(c.dir.id),
                    Err(e) => report.errors.push(e.to_string()),
                },
                Ok(false) => report.kept.push(c.dir.id),
                Err(e) => report.errors.push(format!("{}: {e}", c.dir.dir.display())),
            },
        }
    }
    Ok(report)
}

fn is_garbage(c: &Container, age: Duration, pending_grace: Duration) -> Result<bool, GcError> {
    let limits = match &c.limits {
        Ok(l) => l,
        // Whose it is cannot be told, and its container may be running (its quota still held against
        // the GPU): never removed for that.
        Err(e) => return Err(GcError::Unreadable { err: e.to_string() }),
    };
    let container_gone = match (limits.init_pid, limits.pid_ns) {
        (Some(pid), Some(ns)) => !procs::init_alive(pid, ns, limits.init_start_time),
        // No owner, and the create that made it was killed (`abandoned`).
        _ if crate::creator::is_abandoned(limits) => true,
        // No owner yet: only old ones are garbage.
        _ => age > pending_grace,
    };
    Ok(container_gone && !c.any_slot_alive().map_err(GcError::Slots)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits_file::WriteLimits;
    use std::os::unix::fs::FileTypeExt;
    use std::path::Path;
    use vgpu_ledger::{Ledger, Limits};

    /// The owner provisioning records: the container's init process as the host sees it.
    #[derive(Debug, Clone, Copy, Default)]
    struct Owner {
        init_pid: u32,
        pid_ns: u64,
        start_time: u64,
    }

    impl Owner {
        fn of_pid(pid: u32) -> Option<Owner> {
            let p = procs::inspect(pid)?;
            Some(Owner {
                init_pid: pid,
                pid_ns: p.ns,
                start_time: p.start_time,
            })
        }
    }

    /// A container's state as provisioning leaves it (`vgpu_oci::provision`): marked folders, a 1 GiB quota
    /// on GPU-1 with its ledger, this process as its creator and the owner when it is known.
    fn provision(root: &StateRoot, id: &str, owner: Owner) {
        fs::create_dir_all(root.ledgers_dir(id).unwrap()).unwrap();
        crate::walk::mark(&root.containers_dir()).unwrap();
        crate::walk::mark(&root.container_dir(id).unwrap()).unwrap();
        let ledger = root.ledger_path(id, "GPU-1").unwrap();
        Ledger::open_or_create(&ledger, "GPU-1", 1 << 30).unwrap();
        let limits = Limits {
            creator: crate::creator::current(),
            ..vgpu_ledger::fixtures::one_gpu(id, "GPU-1", 1 << 30)
        };
        limits.write_atomic(&root.limits_path(id).unwrap()).unwrap();
        record_owner(root, id, owner);
    }

    /// Records `owner` in container `id`'s limits (nothing when unknown), as the hook does.
    fn record_owner(root: &StateRoot, id: &str, owner: Owner) {
        if owner.init_pid == 0 {
            return;
        }
        let path = root.limits_path(id).unwrap();
        let mut limits = crate::hostfile::load_limits(&path).unwrap();
        limits.init_pid = Some(owner.init_pid);
        limits.pid_ns = Some(owner.pid_ns);
        limits.init_start_time = Some(owner.start_time);
        limits.write_atomic(&path).unwrap();
    }

    #[test]
    fn collects_dead_and_stale_keeps_live_and_fresh() {
        let d = tempfile::tempdir().unwrap();
        let root = StateRoot::new(d.path().to_path_buf());
        // Alive: owned by this test process.
        provision(&root, "alive", Owner::of_pid(std::process::id()).unwrap());
        // Dead: a child that has exited and been reaped.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let owner = Owner::of_pid(pid).unwrap_or(Owner {
            init_pid: pid,
            pid_ns: 1,
            ..Default::default()
        });
        child.wait().unwrap();
        provision(&root, "dead", Owner::default());
        record_owner(&root, "dead", owner);
        // Reused pid: this process, but recorded with another namespace inode.
        provision(
            &root,
            "reused",
            Owner {
                init_pid: std::process::id(),
                pid_ns: 1,
                ..Default::default()
            },
        );
        // Pending (the shim provisioned, no hook yet): kept while fresh.
        provision(&root, "pending", Owner::default());
        let r = collect_with(&root, Duration::from_secs(60)).unwrap();
        let mut removed = r.removed.clone();
        removed.sort();
        assert_eq!(removed, vec!["dead", "reused"]);
        let mut kept = r.kept.clone();
        kept.sort();
        assert_eq!(kept, vec!["alive", "pending"]);
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        // With no grace the pending one goes too; the live one never.
        let r = collect_with(&root, Duration::ZERO).unwrap();
        assert_eq!(r.removed, vec!["pending"]);
        assert!(root.container_dir("alive").unwrap().is_dir());
        // A missing root is not an error.
        assert_eq!(
            collect(&StateRoot::new(d.path().join("none"))).unwrap(),
            GcReport::default()
        );
    }

    // Issue 25: a limits file made too large to read (1.5 MiB of pod names) had its state deleted as
    // owner-less once past the grace, while its container ran: its quota was released from admission.
    #[test]
    fn state_whose_limits_file_cannot_be_read_is_kept_and_reported() {
        let d = tempfile::tempdir().unwrap();
        let root = StateRoot::new(d.path().to_path_buf());
        for id in ["big", "fifo", "garbled"] {
            provision(&root, id, Owner::default());
        }
        let path = |id| root.limits_path(id).unwrap();
        let big = crate::hostfile::MAX_LIMITS_FILE as usize + 1;
        fs::write(path("big"), vec![b' '; big]).unwrap();
        fs::remove_file(path("fifo")).unwrap();
        nix::unistd::mkfifo(
            &path("fifo"),
            nix::sys::stat::Mode::from_bits_truncate(0o644),
        )
        .unwrap();
        fs::write(path("garbled"), "{").unwrap();
        let r = collect_with(&root, Duration::ZERO).unwrap();
        assert!(r.removed.is_empty(), "{r:?}");
        assert_eq!(r.errors.len(), 3, "{r:?}");
        for e in &r.errors {
            assert!(
                e.contains("kept: its container may still be running"),
                "{e}"
            );
            assert!(!e.contains('\n'), "one line: {e}");
        }
        for id in ["big", "fifo", "garbled"] {
            assert!(root.container_dir(id).unwrap().is_dir(), "{id}");
        }
    }

    // Issue 26 item 7 (version skew): after a downgrade, state a newer vgpu wrote (a limits.json version
    // this build does not read) is kept and reported like any unreadable state, never taken for garbage:
    // its container may run; its poststop removes it by id.
    #[test]
    fn state_of_a_newer_format_version_is_kept_and_reported() {
        let d = tempfile::tempdir().unwrap();
        let root = StateRoot::new(d.path().to_path_buf());
        provision(&root, "newer", Owner::default());
        let path = root.limits_path("newer").unwrap();
        let text = fs::read_to_string(&path).unwrap();
        assert!(text.contains("\"version\": 1"), "{text}");
        fs::write(&path, text.replace("\"version\": 1", "\"version\": 2")).unwrap();
        let r = collect_with(&root, Duration::ZERO).unwrap();
        assert!(r.removed.is_empty(), "{r:?}");
        assert_eq!(r.errors.len(), 1, "{r:?}");
        assert!(r.errors[0].contains("format version 2"), "{r:?}");
        assert!(root.container_dir("newer").unwrap().is_dir());
        assert!(removal::remove(&root, "newer").unwrap());
        assert!(!root.container_dir("newer").unwrap().exists());
    }

    // The recorded init's PID alive in its namespace, but another process (another start time): gone.
    #[test]
    fn an_init_pid_held_by_another_process_is_gone() {
        let d = tempfile::tempdir().unwrap();
        let root = StateRoot::new(d.path().to_path_buf());
        let me = Owner::of_pid(std::process::id()).unwrap();
        let other = Owner {
            start_time: me.start_time + 1,
            ..me
        };
        provision(&root, "mine", me);
        provision(&root, "restarted", other);
        let r = collect_with(&root, Duration::from_secs(60)).unwrap();
        assert_eq!(
            (r.removed, r.kept),
            (vec!["restarted".to_string()], vec!["mine".to_string()])
        );
    }

    #[test]
    fn entries_not_ours_are_reported_and_left_alone() {
        let d = tempfile::tempdir().unwrap();
        let root = StateRoot::new(d.path().to_path_buf());
        fs::create_dir_all(root.containers_dir()).unwrap();
        crate::walk::mark(&root.containers_dir()).unwrap();
        let stray = root.containers_dir().join("stray-file");
        fs::write(&stray, "x").unwrap();
        let r = collect_with(&root, Duration::ZERO).unwrap();
        assert!(r.removed.is_empty() && r.kept.is_empty(), "{r:?}");
        assert_eq!(r.errors.len(), 1);
        assert!(
            r.errors[0].contains("stray-file") && r.errors[0].contains("not a folder"),
            "{:?}",
            r.errors
        );
        assert!(stray.is_file());
    }

    #[test]
    fn a_state_root_or_folder_vgpu_did_not_make_is_never_touched() {
        let d = tempfile::tempdir().unwrap();
        // The state root is someone else's folder (/var/lib, with Podman's containers/storage).
        let root = StateRoot::new(d.path().join("varlib"));
        let storage = root.containers_dir().join("storage");
        fs::create_dir_all(storage.join("overlay")).unwrap();
        fs::create_dir_all(root.containers_dir().join(".hidden")).unwrap();
        let e = collect_with(&root, Duration::ZERO).unwrap_err().to_string();
        assert!(e.contains("is not vgpu's"), "{e}");
        assert!(storage.join("overlay").is_dir() && root.containers_dir().join(".hidden").is_dir());

        // vgpu's own state root, holding folders vgpu did not make.
        let root = StateRoot::new(d.path().join("state"));
        provision(&root, "ours", Owner::default());
        let c = root.containers_dir();
        for name in ["c1/keep", ".tmp-x-1/keep", ".tmp-y-2"] {
            fs::create_dir_all(c.join(name)).unwrap();
        }
        let r = collect_with(&root, Duration::ZERO).unwrap();
        // ours (owner never recorded, no grace) goes; an empty leftover cut short before its marker too.
        let mut removed = r.removed.clone();
        removed.sort();
        assert_eq!(removed, vec![".tmp-y-2", "ours"]);
        assert_eq!(r.errors.len(), 2, "{:?}", r.errors);
        assert!(r
            .errors
            .iter()
            .any(|e| e.contains("c1: not a container's state (holds no vgpu marker")));
        assert!(r
            .errors
            .iter()
            .any(|e| e.contains(".tmp-x-1: holds no vgpu marker")));
        assert!(c.join("c1/keep").is_dir() && c.join(".tmp-x-1/keep").is_dir());
    }

    #[test]
    fn a_gone_tenants_fifos_and_links_neither_block_nor_trick_the_collector() {
        let d = tempfile::tempdir().unwrap();
        let root = StateRoot::new(d.path().join("state"));
        provision(&root, "gone", Owner::default());
        let ledgers = root.ledgers_dir("gone").unwrap();
        let ledger = root.ledger_path("gone", "GPU-1").unwrap();
        let fifo = |p: &Path| {
            nix::unistd::mkfifo(p, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap()
        };
        // What the tenant left: its ledger a FIFO, and links to a host FIFO and a host file.
        fs::remove_file(&ledger).unwrap();
        fifo(&ledger);
        let host_fifo = d.path().join("host-fifo");
        fifo(&host_fifo);
        let secret = d.path().join("secret");
        fs::write(&secret, "TOPSECRET").unwrap();
        std::os::unix::fs::symlink(&host_fifo, ledgers.join("follow.ledger")).unwrap();
        std::os::unix::fs::symlink(&secret, ledgers.join("leak.ledger")).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let r = root.clone();
        std::thread::spawn(move || tx.send(collect_with(&r, Duration::ZERO).unwrap()));
        let report = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the collector blocked");
        assert_eq!(report.removed, vec!["gone"], "{report:?}");
        assert!(report.errors.is_empty(), "{report:?}");
        // Links were removed, never followed.
        assert_eq!(fs::read_to_string(&secret).unwrap(), "TOPSECRET");
        assert!(fs::symlink_metadata(&host_fifo)
            .unwrap()
            .file_type()
            .is_fifo());
    }
}
