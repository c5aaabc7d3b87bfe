//! The per-container state on the host: `<root>/containers/<id>/{limits.json, ledgers/, ld.so.preload}`
//! made, recorded, removed. Not here: its paths (`vgpu_ledger::layout`), its walk (`vgpu_ledger::walk`).
//!
//! The state is built in a hidden temporary folder and renamed into place, so a failure at any step leaves
//! nothing behind, and a reader never sees a half-made container folder. The rename never replaces a
//! folder that is there (another container with this id, or a create of it in progress), and the folder
//! carries a random token of the invocation that made it: cleaning up after a failed create removes only
//! a folder that still holds that token, never another's state.

use crate::plan::Plan;
use anyhow::{anyhow, Context, Result};
use nix::fcntl::{renameat2, RenameFlags, AT_FDCWD};
use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use vgpu_ledger::atomic::{write_atomic, WriteOptions};
use vgpu_ledger::layout::{self, StateRoot};
use vgpu_ledger::limits::{DeviceLimit, Limits, LIMITS_VERSION};

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
        kubernetes: plan.kubernetes.clone(),
    })
}

/// The state of container `id` is there already: it belongs to a live container with this id, or to a
/// create of it in progress. Nothing was changed.
#[derive(Debug)]
pub struct AlreadyExists {
    pub id: String,
    pub dir: PathBuf,
}

impl std::fmt::Display for AlreadyExists {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "container {}: its state {} already exists (a container with this id is running or being \
             created; state left by a crash is collected after gc_pending_grace_seconds)",
            self.id,
            self.dir.display()
        )
    }
}

impl std::error::Error for AlreadyExists {}

/// A container's state folder made by this invocation, and the token that proves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provisioned {
    pub dir: PathBuf,
    token: String,
}

impl Provisioned {
    /// Removes the folder if it is still the one this invocation made (its token); another's state (a
    /// container that got the id since) is left alone. Ok(true) when removed.
    pub fn remove(&self) -> Result<bool> {
        if !holds_token(&self.dir, &self.token) {
            return Ok(false);
        }
        let aside = aside_path(&self.dir)?;
        match fs::rename(&self.dir, &aside) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => {
                return Err(e).with_context(|| format!("cannot remove {}", self.dir.display()))
            }
        }
        // Replaced between the check and the rename: put the other's folder back.
        if !holds_token(&aside, &self.token) {
            renameat2(
                AT_FDCWD,
                &aside,
                AT_FDCWD,
                &self.dir,
                RenameFlags::RENAME_NOREPLACE,
            )
            .map_err(|e| anyhow!("cannot put {} back: {e}", self.dir.display()))?;
            return Ok(false);
        }
        fs::remove_dir_all(&aside).with_context(|| format!("cannot remove {}", aside.display()))?;
        Ok(true)
    }

    #[cfg(test)]
    fn token(&self) -> &str {
        &self.token
    }
}

fn holds_token(dir: &Path, token: &str) -> bool {
    fs::read_to_string(dir.join(layout::CREATE_TOKEN_FILE_NAME)).is_ok_and(|t| t == token)
}

/// 128 random bits, hex.
fn new_token() -> Result<String> {
    use std::io::Read;
    let mut b = [0u8; 16];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .context("cannot read /dev/urandom")?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Creates the container's state. Refuses (with [`AlreadyExists`]) when the container's folder is there
/// already: it is another container's, or another create's in progress, and is left untouched.
pub fn provision(
    root: &StateRoot,
    id: &str,
    plan: &Plan,
    owner: Owner,
    image_preload: Option<&str>,
) -> Result<Provisioned> {
    let dir = root.container_dir(id)?;
    let limits = limits_for(id, plan, owner)?;
    if fs::symlink_metadata(&dir).is_ok() {
        return Err(AlreadyExists {
            id: id.to_string(),
            dir,
        }
        .into());
    }
    let containers = root.containers_dir();
    for d in [root.root(), containers.as_path()] {
        match fs::DirBuilder::new().mode(0o711).create(d) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e).with_context(|| format!("cannot create {}", d.display())),
        }
    }
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".tmp-{id}-"))
        .tempdir_in(&containers)
        .with_context(|| format!("cannot create a folder in {}", containers.display()))?;
    let token = new_token()?;
    fill(tmp.path(), plan, &limits, image_preload)?;
    write_atomic(
        &tmp.path().join(layout::CREATE_TOKEN_FILE_NAME),
        token.as_bytes(),
        WriteOptions::with_mode(0o600),
    )?;
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o711))?;
    // Never over a folder that appeared meanwhile (two creates of one id at once: the loser fails here,
    // before it runs anything, and removes only its own temporary folder).
    match renameat2(
        AT_FDCWD,
        tmp.path(),
        AT_FDCWD,
        &dir,
        RenameFlags::RENAME_NOREPLACE,
    ) {
        Ok(()) => {
            // The folder now lives at `dir`; the TempDir guard must not delete it.
            let _ = tmp.keep();
        }
        Err(nix::errno::Errno::EEXIST) | Err(nix::errno::Errno::ENOTEMPTY) => {
            return Err(AlreadyExists {
                id: id.to_string(),
                dir,
            }
            .into())
        }
        Err(e) => return Err(anyhow!("cannot create {}: {e}", dir.display())),
    }
    Ok(Provisioned { dir, token })
}

fn fill(dir: &Path, plan: &Plan, limits: &Limits, image_preload: Option<&str>) -> Result<()> {
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
    let p = root.limits_path(id)?;
    let mut limits = Limits::load(&p).map_err(|e| anyhow!("container {id}: {e}"))?;
    if limits.init_pid == Some(owner.init_pid) && limits.pid_ns == Some(owner.pid_ns) {
        return Ok(());
    }
    limits.init_pid = Some(owner.init_pid);
    limits.pid_ns = Some(owner.pid_ns);
    let mut text = serde_json::to_string_pretty(&limits)?;
    text.push('\n');
    let mut f = fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .with_context(|| format!("cannot open {}", p.display()))?;
    f.write_all(text.as_bytes())?;
    f.set_len(text.len() as u64)?;
    Ok(())
}

/// Whether container `id`'s state records `owner` as its init process (the hooks.d path provisions with
/// the owner known, so a stage run twice recognises its own state).
pub fn owned_by(root: &StateRoot, id: &str, owner: Owner) -> bool {
    let Ok(p) = root.limits_path(id) else {
        return false;
    };
    Limits::load(&p).is_ok_and(|l| {
        owner.init_pid != 0 && l.init_pid == Some(owner.init_pid) && l.pid_ns == Some(owner.pid_ns)
    })
}

/// Removes the container's state; a missing folder is fine (poststop twice, or without a prestart).
pub fn remove(root: &StateRoot, id: &str) -> Result<bool> {
    let dir = root.container_dir(id)?;
    remove_dir(&dir)
}

/// Where a folder is renamed to before it is deleted: `.rm-<name>-<pid>` beside it.
fn aside_path(dir: &Path) -> Result<PathBuf> {
    let parent = dir
        .parent()
        .ok_or_else(|| anyhow!("{} has no parent", dir.display()))?;
    let name = dir
        .file_name()
        .ok_or_else(|| anyhow!("{} has no name", dir.display()))?
        .to_string_lossy();
    Ok(parent.join(format!(".rm-{name}-{}", std::process::id())))
}

/// Removes a state folder: renamed aside first so no reader sees it half-deleted.
pub fn remove_dir(dir: &Path) -> Result<bool> {
    let aside = aside_path(dir)?;
    match fs::rename(dir, &aside) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e).with_context(|| format!("cannot remove {}", dir.display())),
    }
    fs::remove_dir_all(&aside).with_context(|| format!("cannot remove {}", aside.display()))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::PlannedGpu;

    fn plan(limit: u64) -> Plan {
        Plan {
            kubernetes: None,
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
        .unwrap()
        .dir;
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
        let ino = |p: &Path| std::os::unix::fs::MetadataExt::ino(&fs::metadata(p).unwrap());
        // The owner is recorded in place (the file may be bind-mounted).
        let me = Owner::of_pid(std::process::id()).unwrap();
        let before = ino(&dir.join("limits.json"));
        record_owner(&root, "c1", me).unwrap();
        let l = Limits::load(&dir.join("limits.json")).unwrap();
        assert_eq!((l.init_pid, l.pid_ns), (Some(me.init_pid), Some(me.pid_ns)));
        assert_eq!(ino(&dir.join("limits.json")), before);
        assert!(remove(&root, "c1").unwrap());
        assert!(!remove(&root, "c1").unwrap());
        assert_eq!(
            fs::read_dir(root.containers_dir()).unwrap().count(),
            0,
            "nothing left behind"
        );
    }

    #[test]
    fn a_second_create_of_one_id_changes_nothing_and_cleans_up_only_its_own() {
        let d = tempfile::tempdir().unwrap();
        let root = StateRoot::new(d.path().join("state"));
        let first = provision(&root, "c1", &plan(1 << 30), Owner::default(), None).unwrap();
        let limits = fs::read(first.dir.join("limits.json")).unwrap();
        // Same id again (the container lives, or its create is in progress), with the same or another quota.
        for limit in [1 << 30, 2 << 30] {
            let e = provision(&root, "c1", &plan(limit), Owner::default(), None).unwrap_err();
            assert!(e.downcast_ref::<AlreadyExists>().is_some(), "{e:#}");
            assert!(format!("{e:#}").contains("already exists"), "{e:#}");
            assert_eq!(fs::read(first.dir.join("limits.json")).unwrap(), limits);
        }
        assert_eq!(
            fs::read_dir(root.containers_dir()).unwrap().count(),
            1,
            "the losers left no temporary folder"
        );
        // The first container went (poststop) and another took the id: the first create's clean-up
        // must not remove the newcomer's state.
        assert!(remove(&root, "c1").unwrap());
        let second = provision(&root, "c1", &plan(2 << 30), Owner::default(), None).unwrap();
        assert_ne!(first.token(), second.token());
        assert!(!first.remove().unwrap());
        assert!(second.dir.join("limits.json").is_file());
        assert!(second.remove().unwrap());
        assert!(!second.dir.exists());
        assert_eq!(fs::read_dir(root.containers_dir()).unwrap().count(), 0);
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
}
