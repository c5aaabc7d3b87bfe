//! The per-container state on the host: `<root>/containers/<id>/{limits.json, ledgers/, ld.so.preload}`
//! made and recorded. Not here: removing it (`vgpu_host::removal`), its paths (`vgpu_ledger::layout`), its walk (`vgpu_host::walk`).
//!
//! The state is built in a hidden temporary folder and renamed into place, so a failure at any step leaves
//! nothing behind, and a reader never sees a half-made container folder. The rename never replaces a
//! folder that is there (another container with this id, or a create of it in progress), and the folder
//! carries a random token of the invocation that made it: cleaning up after a failed create removes only
//! a folder that still holds that token, never another's state. Every folder made here holds vgpu's
//! marker (`state_root::MARKER_FILE_NAME`), written first; a folder without it is never replaced or removed
//! (the state root may name someone else's folder). Ledgers are allocated for real, so a full file system
//! fails the creation with one line instead of CUDA processes later.

use crate::plan::Plan;
use nix::errno::Errno;
use nix::fcntl::{renameat2, RenameFlags, AT_FDCWD};
use std::fs;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use vgpu_host::atomic::{write_atomic, WriteOptions};
use vgpu_host::hostfile;
use vgpu_host::limits_file::WriteLimits;
use vgpu_host::procs;
use vgpu_host::removal;
use vgpu_host::state_root::{self, StateRoot};
use vgpu_host::walk;
use vgpu_ledger::layout;
use vgpu_ledger::limits::{DeviceLimit, Limits, LIMITS_VERSION};

mod error;
pub use error::{AlreadyExists, ProvisionError};

type Result<T, E = ProvisionError> = std::result::Result<T, E>;

/// Who owns the state: the container's init process as the host sees it, and the container's cgroup.
/// Unknown (zero) until the provisioning hook runs, when the shim provisioned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Owner {
    pub init_pid: u32,
    pub pid_ns: u64,
    /// When the init process started (`vgpu_host::procs::start_time`): with the PID, its identity.
    pub start_time: u64,
    /// The container's cgroup v2 path (see [`Owner::of_pid`]); None: none of its own.
    pub cgroup: Option<String>,
}

impl Owner {
    /// The owner of host pid `pid`: its PID namespace inode and start time from /proc, and its cgroup v2
    /// path when that is the container's own: not the root, and neither the hook's own cgroup nor one
    /// above it (a runtime that manages no cgroup, as crun with `--cgroup-manager=disabled`, leaves the
    /// container in its caller's cgroup, shared with host processes the monitor must never take for the
    /// container's).
    pub fn of_pid(pid: u32) -> Result<Owner> {
        let ns = format!("/proc/{pid}/ns/pid");
        let md = fs::metadata(&ns).map_err(|e| {
            ProvisionError::io(format!("container init pid {pid}: cannot stat {ns}"), e)
        })?;
        let start_time = procs::start_time(pid).ok_or(ProvisionError::NoStartTime { pid })?;
        let cg = fs::read_to_string(format!("/proc/{pid}/cgroup")).map_err(|e| {
            ProvisionError::io(
                format!("container init pid {pid}: cannot read /proc/{pid}/cgroup"),
                e,
            )
        })?;
        let own = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let cgroup = procs::unified_path(&cg)
            .filter(|c| {
                *c != "/" && !procs::unified_path(&own).is_some_and(|o| procs::cgroup_within(o, c))
            })
            .map(str::to_string);
        Ok(Owner {
            init_pid: pid,
            pid_ns: std::os::unix::fs::MetadataExt::ino(&md),
            start_time,
            cgroup,
        })
    }

    /// Whether `limits` records this owner.
    fn recorded_in(&self, limits: &Limits) -> bool {
        self.init_pid != 0
            && limits.init_pid == Some(self.init_pid)
            && limits.pid_ns == Some(self.pid_ns)
            && limits.init_start_time.unwrap_or(self.start_time) == self.start_time
    }

    /// Writes this owner into `limits` (nothing when unknown).
    fn record_in(&self, limits: &mut Limits) {
        if self.init_pid == 0 {
            return;
        }
        limits.init_pid = Some(self.init_pid);
        limits.pid_ns = Some(self.pid_ns);
        limits.init_start_time = Some(self.start_time);
        limits.cgroup = self.cgroup.clone();
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
pub fn limits_for(id: &str, plan: &Plan, owner: &Owner) -> Result<Limits> {
    let devices = plan
        .gpus
        .iter()
        .map(|g| {
            Ok(DeviceLimit {
                index: g.index as u32,
                uuid: g.uuid.clone(),
                settings: g.settings,
                ledger: layout::relative_ledger_path(&g.uuid)?,
                shrunk_from: None,
                held_at_shrink: None,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let mut limits = Limits {
        version: LIMITS_VERSION,
        container_id: id.to_string(),
        pid_ns: None,
        init_pid: None,
        init_start_time: None,
        cgroup: None,
        creator: None,
        devices,
        kubernetes: plan.kubernetes.clone(),
        updates: 0,
        updated_at: None,
    };
    owner.record_in(&mut limits);
    Ok(limits)
}

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
        let aside = removal::aside_path(&self.dir)?;
        match fs::rename(&self.dir, &aside) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => {
                return Err(ProvisionError::io(
                    format!("cannot remove {}", self.dir.display()),
                    e,
                ))
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
            .map_err(|err| ProvisionError::Rename {
                what: format!("cannot put {} back", self.dir.display()),
                err,
            })?;
            return Ok(false);
        }
        removal::remove_marked(&aside)?;
        Ok(true)
    }

    #[cfg(test)]
    fn token(&self) -> &str {
        &self.token
    }
}

fn holds_token(dir: &Path, token: &str) -> bool {
    fs::read_to_string(dir.join(state_root::CREATE_TOKEN_FILE_NAME)).is_ok_and(|t| t == token)
}

/// 128 random bits, hex.
fn new_token() -> Result<String> {
    use std::io::Read;
    let mut b = [0u8; 16];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| ProvisionError::io("cannot read /dev/urandom", e))?;
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
    let mut limits = limits_for(id, plan, &owner)?;
    // Who provisions: state without an owner whose creator is gone is collected (`vgpu_host::abandoned`, `vgpu_host::creator`).
    limits.creator = vgpu_host::creator::current();
    let containers = root
        .prepare_containers()
        .map_err(|e| no_space(e.into(), root, id, plan))?;
    match fs::symlink_metadata(&dir) {
        Ok(_) if !walk::is_marked(&dir) => return Err(ProvisionError::NotOurs { dir }),
        Ok(_) => {
            return Err(AlreadyExists {
                id: id.to_string(),
                dir,
            }
            .into())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(ProvisionError::io(
                format!("cannot look at {}", dir.display()),
                e,
            ))
        }
    }
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".tmp-{id}-"))
        .tempdir_in(&containers)
        .map_err(|e| {
            ProvisionError::io(
                format!("cannot create a folder in {}", containers.display()),
                e,
            )
        })
        .map_err(|e| no_space(e, root, id, plan))?;
    let token = new_token()?;
    fill(tmp.path(), plan, &limits, image_preload).map_err(|e| no_space(e, root, id, plan))?;
    write_atomic(
        &tmp.path().join(state_root::CREATE_TOKEN_FILE_NAME),
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
        Err(Errno::EEXIST) | Err(Errno::ENOTEMPTY) => {
            return Err(AlreadyExists {
                id: id.to_string(),
                dir,
            }
            .into())
        }
        Err(err) => {
            return Err(ProvisionError::Rename {
                what: format!("cannot create {}", dir.display()),
                err,
            })
        }
    }
    Ok(Provisioned { dir, token })
}

/// Bytes the state of `plan` takes on the state root's file system, ledgers allocated up front.
fn space_needed(plan: &Plan) -> u64 {
    plan.gpus.len() as u64 * vgpu_ledger::region::FILE_SIZE as u64
}

/// `e`, or one line saying the state root is full when that is why it failed (ENOSPC, EDQUOT).
fn no_space(e: ProvisionError, root: &StateRoot, id: &str, plan: &Plan) -> ProvisionError {
    let full = e
        .io_error()
        .and_then(|io| io.raw_os_error())
        .is_some_and(|n| {
            n == nix::errno::Errno::ENOSPC as i32 || n == nix::errno::Errno::EDQUOT as i32
        });
    if !full {
        return e;
    }
    ProvisionError::NoSpace {
        root: root.root().to_path_buf(),
        id: id.to_string(),
        needed: space_needed(plan),
    }
}

fn fill(dir: &Path, plan: &Plan, limits: &Limits, image_preload: Option<&str>) -> Result<()> {
    // First: a leftover of this folder is then known as ours to the garbage collector.
    walk::mark(dir).map_err(|e| {
        ProvisionError::io(format!("cannot write the marker in {}", dir.display()), e)
    })?;
    let ledgers = dir.join(layout::LEDGERS_DIR_NAME);
    fs::DirBuilder::new().mode(0o755).create(&ledgers)?;
    fs::set_permissions(&ledgers, fs::Permissions::from_mode(0o755))?;
    for g in &plan.gpus {
        let p = dir.join(layout::relative_ledger_path(&g.uuid)?);
        // A GPU with a compute share alone still needs its ledger (the share's bucket lives there); its
        // informational limit is "unlimited".
        vgpu_ledger::Ledger::open_or_create(
            &p,
            &g.uuid,
            g.settings.memory_limit.unwrap_or(u64::MAX),
        )
        .map_err(|err| ProvisionError::Ledger {
            path: p.clone(),
            err,
        })?;
        // Every user of the container (any uid, any user namespace) charges it.
        fs::set_permissions(&p, fs::Permissions::from_mode(0o666))?;
    }
    limits
        .write_atomic(&dir.join(layout::LIMITS_FILE_NAME))
        .map_err(|e| {
            ProvisionError::io(format!("cannot write limits file in {}", dir.display()), e)
        })?;
    fs::set_permissions(
        dir.join(layout::LIMITS_FILE_NAME),
        fs::Permissions::from_mode(0o644),
    )?;
    // The inode the container's mount will hold, under a second name: `vgpuctl update` rewrites it in
    // place once limits.json has been replaced by rename (`vgpu_host::live`).
    fs::hard_link(
        dir.join(layout::LIMITS_FILE_NAME),
        dir.join(layout::MOUNTED_LIMITS_FILE_NAME),
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

/// Records the container's owner in its limits file once the container exists (shim path), as a whole new
/// file renamed over the old one (`Limits::write_atomic`): admission, gc and the monitor read the file
/// while this runs, and each of them reads the old file or the new one, never half of each. The file is
/// bind-mounted into the container already, so the container keeps the old inode: the limits file as
/// provisioned, without the owner. Nothing in the container needs the owner (the library reads `devices`
/// alone, `vgpu_ledger::Limits`' readers inside never look at `init_pid`, `pid_ns`, `init_start_time` or
/// `cgroup`), and host facts (host PIDs, cgroup paths) are better kept out of the tenant's sight, so the
/// owner lives in the host's copy alone: one file for every host reader, written whole.
pub fn record_owner(root: &StateRoot, id: &str, owner: Owner) -> Result<()> {
    let dir = root.container_dir(id)?;
    if !walk::is_marked(&dir) {
        return Err(ProvisionError::Unmarked { dir });
    }
    let p = root.limits_path(id)?;
    let mut limits = hostfile::load_limits(&p).map_err(|err| ProvisionError::Limits {
        id: id.to_string(),
        err,
    })?;
    if owner.recorded_in(&limits) && limits.cgroup == owner.cgroup {
        return Ok(());
    }
    owner.record_in(&mut limits);
    limits
        .write_atomic(&p)
        .map_err(|e| ProvisionError::io(format!("container {id}: cannot record its owner"), e))
}

/// Whether container `id`'s state records `owner` as its init process (the hooks.d path provisions with
/// the owner known, so a stage run twice recognises its own state).
pub fn owned_by(root: &StateRoot, id: &str, owner: &Owner) -> bool {
    let Ok(p) = root.limits_path(id) else {
        return false;
    };
    hostfile::load_limits(&p).is_ok_and(|l| owner.recorded_in(&l))
}

#[cfg(test)]
mod tests;
