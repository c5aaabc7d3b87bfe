//! The per-container state on the host: `<root>/containers/<id>/{limits.json, ledgers/, ld.so.preload}`
//! made, recorded, removed. Not here: its paths (`vgpu_ledger::layout`), its walk (`vgpu_ledger::walk`).
//!
//! The state is built in a hidden temporary folder and renamed into place, so a failure at any step leaves
//! nothing behind, and a reader never sees a half-made container folder. Every folder made here holds
//! vgpu's marker (`layout::MARKER_FILE_NAME`), written first; a folder without it is never replaced or
//! removed (the state root may name someone else's folder). Ledgers are allocated for real, so a full file
//! system fails the creation with one line instead of CUDA processes later.

use crate::plan::Plan;
use anyhow::{anyhow, bail, Context, Result};
use nix::fcntl::{renameat2, RenameFlags, AT_FDCWD};
use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use vgpu_ledger::atomic::{write_atomic, WriteOptions};
use vgpu_ledger::hostfile;
use vgpu_ledger::layout::{self, StateRoot};
use vgpu_ledger::limits::{DeviceLimit, Limits, LIMITS_VERSION};
use vgpu_ledger::walk;

/// Who owns the state: the container's init process as the host sees it. Unknown (zero) until the
/// provisioning hook runs, when the shim provisioned.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Owner {
    pub init_pid: u32,
    pub pid_ns: u64,
}

impl Owner {
    /// The owner of host pid `pid`: its PID namespace inode from /proc.
    pub fn of_pid(pid: u32) -> Result<Owner> {
        let ns = format!("/proc/{pid}/ns/pid");
        let md = fs::metadata(&ns)
            .with_context(|| format!("container init pid {pid}: cannot stat {ns}"))?;
        Ok(Owner {
            init_pid: pid,
            pid_ns: std::os::unix::fs::MetadataExt::ino(&md),
        })
    }
}

/// The preload list for the container: the interposer first (so its symbols win), then the image's own
/// entries (glibc separates them by whitespace or ':'), without duplicates.
pub fn preload_contents(image_preload: Option<&str>) -> String {
    let mut out = vec![layout::CONTAINER_LIBRARY_PATH.to_string()];
    for e in image_preload
        .unwrap_or("")
        .split(|c: char| c.is_whitespace() || c == ':')
    {
        if !e.is_empty() && !out.iter().any(|o| o == e) {
            out.push(e.to_string());
        }
    }
    out.join("\n") + "\n"
}

/// The limits file content for `plan`.
pub fn limits_for(id: &str, plan: &Plan, owner: Owner) -> Result<Limits> {
    let devices = plan
        .gpus
        .iter()
        .map(|g| {
            Ok(DeviceLimit {
                index: g.index as u32,
                uuid: g.uuid.clone(),
                memory_limit: g.memory_limit,
                ledger: layout::relative_ledger_path(&g.uuid)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let (init_pid, pid_ns) = match owner {
        Owner { init_pid: 0, .. } => (None, None),
        o => (Some(o.init_pid), Some(o.pid_ns)),
    };
    Ok(Limits {
        version: LIMITS_VERSION,
        container_id: id.to_string(),
        pid_ns,
        init_pid,
        devices,
    })
}

fn same_quota(a: &Limits, b: &Limits) -> bool {
    let key = |l: &Limits| {
        l.devices
            .iter()
            .map(|d| (d.index, d.uuid.clone(), d.memory_limit))
            .collect::<Vec<_>>()
    };
    key(a) == key(b)
}

/// Creates the container's state (idempotent: state already there with the same quota is kept as is,
/// state with another quota is replaced). Returns the container's folder. A folder of that name that vgpu
/// did not make (no marker) is refused, never replaced.
pub fn provision(
    root: &StateRoot,
    id: &str,
    plan: &Plan,
    owner: Owner,
    image_preload: Option<&str>,
) -> Result<PathBuf> {
    let dir = root.container_dir(id)?;
    let limits = limits_for(id, plan, owner)?;
    let containers = containers_dir(root).map_err(|e| no_space(e, root, id, plan))?;
    match fs::symlink_metadata(&dir) {
        Ok(_) if !walk::is_marked(&dir) => bail!(
            "{} exists and was not made by vgpu (no {} marker in it): refusing to replace it; remove it or \
             set state_root to a folder of vgpu's own",
            dir.display(),
            layout::MARKER_FILE_NAME
        ),
        Ok(_) => {
            if let Ok(existing) = hostfile::load_limits(&dir.join(layout::LIMITS_FILE_NAME)) {
                if same_quota(&existing, &limits) && dir.join(layout::PRELOAD_FILE_NAME).is_file() {
                    return Ok(dir);
                }
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("cannot look at {}", dir.display())),
    }
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".tmp-{id}-"))
        .tempdir_in(&containers)
        .with_context(|| format!("cannot create a folder in {}", containers.display()))
        .map_err(|e| no_space(e, root, id, plan))?;
    fill(tmp.path(), plan, &limits, image_preload).map_err(|e| no_space(e, root, id, plan))?;
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o711))?;
    match fs::rename(tmp.path(), &dir) {
        Ok(()) => {
            // The folder now lives at `dir`; the TempDir guard must not delete it.
            let _ = tmp.keep();
        }
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTEMPTY) | Some(libc::EEXIST)) => {
            // Replace a stale folder (ours: checked above) atomically, then remove what was there before.
            renameat2(
                AT_FDCWD,
                tmp.path(),
                AT_FDCWD,
                &dir,
                RenameFlags::RENAME_EXCHANGE,
            )
            .map_err(|e| anyhow!("cannot replace {}: {e}", dir.display()))?;
            // `tmp` now holds the old state and is removed when dropped.
        }
        Err(e) => return Err(e).with_context(|| format!("cannot create {}", dir.display())),
    }
    Ok(dir)
}

/// `<root>/containers/`, made (and marked) if missing, adopted (marked) if empty; one that holds anything
/// but no marker is someone else's folder and is refused.
fn containers_dir(root: &StateRoot) -> Result<PathBuf> {
    let containers = root.containers_dir();
    for d in [root.root(), containers.as_path()] {
        match fs::DirBuilder::new().mode(0o711).create(d) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e).with_context(|| format!("cannot create {}", d.display())),
        }
    }
    if !walk::is_marked(&containers) {
        let empty = fs::read_dir(&containers)
            .with_context(|| format!("cannot list {}", containers.display()))?
            .next()
            .is_none();
        // Asked again: another provision may have marked it and put its folder in since.
        if !empty && !walk::is_marked(&containers) {
            bail!("{}", walk::not_ours_message(&containers));
        }
        walk::mark(&containers)
            .with_context(|| format!("cannot write the marker in {}", containers.display()))?;
    }
    Ok(containers)
}

/// Bytes the state of `plan` takes on the state root's file system, ledgers allocated up front.
fn space_needed(plan: &Plan) -> u64 {
    plan.gpus.len() as u64 * vgpu_ledger::region::FILE_SIZE as u64
}

/// `e`, or one line saying the state root is full when that is why it failed (ENOSPC, EDQUOT).
fn no_space(e: anyhow::Error, root: &StateRoot, id: &str, plan: &Plan) -> anyhow::Error {
    let full = e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .and_then(|io| io.raw_os_error())
            .is_some_and(|n| n == libc::ENOSPC || n == libc::EDQUOT)
    });
    if !full {
        return e;
    }
    anyhow!(
        "no space left on the state root {} for the state of container {id} (its ledgers take {}, \
         allocated up front so that no GPU process dies of a full disk later): free space there or set \
         state_root elsewhere",
        root.root().display(),
        vgpu_ledger::format_bytes(space_needed(plan)),
    )
}

fn fill(dir: &Path, plan: &Plan, limits: &Limits, image_preload: Option<&str>) -> Result<()> {
    // First: a leftover of this folder is then known as ours to the garbage collector.
    walk::mark(dir).with_context(|| format!("cannot write the marker in {}", dir.display()))?;
    let ledgers = dir.join(layout::LEDGERS_DIR_NAME);
    fs::DirBuilder::new().mode(0o755).create(&ledgers)?;
    fs::set_permissions(&ledgers, fs::Permissions::from_mode(0o755))?;
    for g in &plan.gpus {
        let p = dir.join(layout::relative_ledger_path(&g.uuid)?);
        crate::ledgers::create(&p, &g.uuid, g.memory_limit)?;
        // Every user of the container (any uid, any user namespace) charges it.
        fs::set_permissions(&p, fs::Permissions::from_mode(0o666))?;
    }
    limits
        .write_atomic(&dir.join(layout::LIMITS_FILE_NAME))
        .map_err(|e| anyhow!("cannot write limits file in {}: {e}", dir.display()))?;
    fs::set_permissions(
        dir.join(layout::LIMITS_FILE_NAME),
        fs::Permissions::from_mode(0o644),
    )?;
    // Not synced: the folder is renamed into place as a whole, and lives on a tmpfs by default.
    let preload = preload_contents(image_preload);
    write_atomic(
        &dir.join(layout::PRELOAD_FILE_NAME),
        preload.as_bytes(),
        WriteOptions::with_mode(0o644),
    )?;
    Ok(())
}

/// Records the container's owner in its limits file once the container exists (shim path). The file is
/// already bind-mounted into the container, so it is rewritten in place (a rename would leave the mount on
/// the old file). Nothing in the container reads it before the container's process starts, after the hooks.
pub fn record_owner(root: &StateRoot, id: &str, owner: Owner) -> Result<()> {
    let dir = root.container_dir(id)?;
    if !walk::is_marked(&dir) {
        bail!(
            "{} was not made by vgpu (no {} marker in it): left alone",
            dir.display(),
            layout::MARKER_FILE_NAME
        );
    }
    let p = root.limits_path(id)?;
    let mut limits = hostfile::load_limits(&p).map_err(|e| anyhow!("container {id}: {e}"))?;
    if limits.init_pid == Some(owner.init_pid) && limits.pid_ns == Some(owner.pid_ns) {
        return Ok(());
    }
    limits.init_pid = Some(owner.init_pid);
    limits.pid_ns = Some(owner.pid_ns);
    let mut text = serde_json::to_string_pretty(&limits)?;
    text.push('\n');
    let mut f = fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&p)
        .with_context(|| format!("cannot open {}", p.display()))?;
    f.write_all(text.as_bytes())?;
    f.set_len(text.len() as u64)?;
    Ok(())
}

/// Removes the container's state; a missing folder is fine (poststop twice, or without a prestart).
pub fn remove(root: &StateRoot, id: &str) -> Result<bool> {
    let dir = root.container_dir(id)?;
    remove_dir(&dir)
}

/// Removes a state folder: renamed aside first so no reader sees it half-deleted. A folder vgpu did not
/// make (no marker) is an error and is left alone.
pub fn remove_dir(dir: &Path) -> Result<bool> {
    let parent = dir
        .parent()
        .ok_or_else(|| anyhow!("{} has no parent", dir.display()))?;
    let name = dir
        .file_name()
        .ok_or_else(|| anyhow!("{} has no name", dir.display()))?
        .to_string_lossy();
    match fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e).with_context(|| format!("cannot remove {}", dir.display())),
        Ok(_) if !walk::is_marked(dir) => bail!(
            "{} was not made by vgpu (no {} marker in it): left alone",
            dir.display(),
            layout::MARKER_FILE_NAME
        ),
        Ok(_) => {}
    }
    let aside = parent.join(format!(".rm-{name}-{}", std::process::id()));
    match fs::rename(dir, &aside) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e).with_context(|| format!("cannot remove {}", dir.display())),
    }
    remove_marked(&aside)?;
    Ok(true)
}

/// Deletes a folder vgpu made: everything in it but the marker (links unfollowed), then the marker, then the
/// folder, so that an interrupted removal leaves a folder still marked, or an empty one.
pub fn remove_marked(dir: &Path) -> Result<()> {
    let cannot = || format!("cannot remove {}", dir.display());
    for entry in fs::read_dir(dir).with_context(cannot)? {
        let entry = entry.with_context(cannot)?;
        if entry.file_name() == layout::MARKER_FILE_NAME {
            continue;
        }
        let p = entry.path();
        if entry.file_type().with_context(cannot)?.is_dir() {
            fs::remove_dir_all(&p)
        } else {
            fs::remove_file(&p)
        }
        .with_context(|| format!("cannot remove {}", p.display()))?;
    }
    match fs::remove_file(dir.join(layout::MARKER_FILE_NAME)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e).with_context(cannot),
        _ => {}
    }
    fs::remove_dir(dir).with_context(cannot)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::PlannedGpu;

    fn plan(limit: u64) -> Plan {
        Plan {
            gpus: vec![PlannedGpu {
                index: 0,
                uuid: "GPU-fa4ec0de-0000-4000-8000-000000000000".into(),
                memory_limit: limit,
            }],
        }
    }

    #[test]
    fn preload_keeps_image_entries_after_the_library() {
        assert_eq!(preload_contents(None), "/usr/local/vgpu/libvgpu.so\n");
        assert_eq!(
            preload_contents(Some(
                "/lib/a.so:/lib/b.so\n /usr/local/vgpu/libvgpu.so\t/lib/a.so\n"
            )),
            "/usr/local/vgpu/libvgpu.so\n/lib/a.so\n/lib/b.so\n"
        );
    }

    #[test]
    fn provision_is_complete_idempotent_and_removable() {
        let d = tempfile::tempdir().unwrap();
        let root = StateRoot::new(d.path().join("state"));
        let dir = provision(
            &root,
            "c1",
            &plan(1 << 30),
            Owner::default(),
            Some("/x.so\n"),
        )
        .unwrap();
        let limits = Limits::load(&dir.join("limits.json")).unwrap();
        assert_eq!(limits.devices[0].memory_limit, 1 << 30);
        assert_eq!(limits.init_pid, None);
        assert!(dir
            .join("ledgers/GPU-fa4ec0de-0000-4000-8000-000000000000.ledger")
            .is_file());
        assert_eq!(
            fs::read_to_string(dir.join("ld.so.preload")).unwrap(),
            "/usr/local/vgpu/libvgpu.so\n/x.so\n"
        );
        // Same quota again: kept (same inode), another quota: replaced.
        let ino = |p: &Path| std::os::unix::fs::MetadataExt::ino(&fs::metadata(p).unwrap());
        let before = ino(&dir.join("limits.json"));
        provision(&root, "c1", &plan(1 << 30), Owner::default(), None).unwrap();
        assert_eq!(ino(&dir.join("limits.json")), before);
        provision(&root, "c1", &plan(2 << 30), Owner::default(), None).unwrap();
        assert_eq!(
            Limits::load(&dir.join("limits.json")).unwrap().devices[0].memory_limit,
            2 << 30
        );
        // The owner is recorded in place (the file may be bind-mounted).
        let me = Owner::of_pid(std::process::id()).unwrap();
        let before = ino(&dir.join("limits.json"));
        record_owner(&root, "c1", me).unwrap();
        let l = Limits::load(&dir.join("limits.json")).unwrap();
        assert_eq!((l.init_pid, l.pid_ns), (Some(me.init_pid), Some(me.pid_ns)));
        assert_eq!(ino(&dir.join("limits.json")), before);
        assert!(remove(&root, "c1").unwrap());
        assert!(!remove(&root, "c1").unwrap());
        let left: Vec<_> = fs::read_dir(root.containers_dir())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, [layout::MARKER_FILE_NAME], "nothing but the marker left behind");
    }

    #[test]
    fn bad_ids_provision_nothing() {
        let d = tempfile::tempdir().unwrap();
        let root = StateRoot::new(d.path().join("state"));
        for id in ["../x", "a/b", ".hidden", ""] {
            assert!(provision(&root, id, &plan(1 << 30), Owner::default(), None).is_err());
        }
        assert!(
            !d.path().join("state").exists()
                || fs::read_dir(root.containers_dir()).unwrap().count() == 0
        );
    }

    #[test]
    fn folders_are_marked_and_one_vgpu_did_not_make_is_never_replaced_or_removed() {
        let d = tempfile::tempdir().unwrap();
        let root = StateRoot::new(d.path().join("state"));
        let dir = provision(&root, "c1", &plan(1 << 30), Owner::default(), None).unwrap();
        assert!(walk::is_marked(&root.containers_dir()) && walk::is_marked(&dir));
        // Someone else's folder under a container's name: refused, kept byte for byte.
        let theirs = root.container_dir("c2").unwrap();
        fs::create_dir_all(theirs.join("keep")).unwrap();
        fs::write(theirs.join("limits.json"), "theirs").unwrap();
        let e = provision(&root, "c2", &plan(1 << 30), Owner::default(), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("c2 exists and was not made by vgpu (no .vgpu-state marker"), "{e}");
        assert!(!e.contains('\n'));
        let e = remove(&root, "c2").unwrap_err().to_string();
        assert!(e.contains("was not made by vgpu"), "{e}");
        let me = Owner::of_pid(std::process::id()).unwrap();
        assert!(record_owner(&root, "c2", me).is_err());
        assert_eq!(fs::read_to_string(theirs.join("limits.json")).unwrap(), "theirs");
        assert!(theirs.join("keep").is_dir());
    }

    #[test]
    fn a_containers_folder_of_someone_else_is_refused_and_an_empty_one_adopted() {
        let d = tempfile::tempdir().unwrap();
        let root = StateRoot::new(d.path().join("varlib"));
        fs::create_dir_all(root.containers_dir().join("storage")).unwrap();
        let e = provision(&root, "c1", &plan(1 << 30), Owner::default(), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("containers is not vgpu's") && e.contains("state_root"), "{e}");
        let names: Vec<_> = fs::read_dir(root.containers_dir())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["storage"], "nothing written there");
        // An empty one (made by an operator, say) is adopted.
        fs::remove_dir(root.containers_dir().join("storage")).unwrap();
        provision(&root, "c1", &plan(1 << 30), Owner::default(), None).unwrap();
        assert!(walk::is_marked(&root.containers_dir()));
    }

    #[test]
    fn the_longest_id_provisions_and_a_longer_one_is_refused_in_one_clear_line() {
        let d = tempfile::tempdir().unwrap();
        let root = StateRoot::new(d.path().join("state"));
        let longest = "x".repeat(layout::MAX_NAME_LEN);
        provision(&root, &longest, &plan(1 << 30), Owner::default(), None).unwrap();
        assert!(remove(&root, &longest).unwrap());
        let e = provision(&root, &"x".repeat(256), &plan(1 << 30), Owner::default(), None)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("invalid container id \"xxx") && e.contains("longer than 200 bytes"), "{e}");
    }
}
