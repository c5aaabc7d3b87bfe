//! HAMi's per-container folders, read as a host tool must read a tenant's files: containers started under
//! HAMi's device plugin with vgpu's library (docs/engines/hami.md) have no state under vgpu's state root;
//! HAMi gives each one a host folder `<hook path>/vgpu/containers/<pod UID>_<container>` (mounted read-write
//! at `/usr/local/vgpu` inside, mode 0777), where the library makes its ledgers
//! `<CUDA_DEVICE_MEMORY_SHARED_CACHE's file name>.<GPU uuid>`. [`scan`] lists those folders and reads their
//! ledgers for the monitor and `vgpuctl status` (`usage::hami::from_hami` makes them containers). Not here: what
//! is made of them (metrics, findings), which processes are theirs (`attribution`), the quota the host
//! keeps for them (`bundle`).
//!
//! The containers folder and its entries are HAMi's (its device plugin makes them, as root); everything
//! inside a container's folder is the tenant's. So inside it: at most [`MAX_ENTRIES`] entries are looked
//! at; only names of the ledger's pattern (not a dot-name, `<prefix>.GPU-…` or `<prefix>.MIG-…`) are
//! opened, and only as every host read of a tenant's file is (`hostfile::open_regular`: no link followed,
//! never blocking, only a regular file of at most a ledger's size), then read with `pread`, never mapped.
//! A file of that pattern that is not a ledger of its name's GPU is [`Skipped`] with one line saying why,
//! and the folder's other ledgers are still read. Nothing is written, no lock taken.
//!
//! The quota a folder's ledger shows is the one its library wrote into the ledger's header at creation
//! (from the process's `CUDA_DEVICE_MEMORY_LIMIT_<i>`), in a file the tenant can write: readers may report
//! it, never enforce by it. The host's own record of the quota is the container's OCI spec in its
//! containerd bundle ([`bundle`]), where one is found.

pub mod bundle;

use crate::hostfile;
use crate::printable::printable;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use vgpu_ledger::layout::check_gpu_uuid;
use vgpu_ledger::region::FILE_SIZE;
use vgpu_ledger::{LedgerError, Snapshot};

/// Where HAMi's device plugin makes the per-container folders with its chart's default hook path
/// (`global.gpuHookPath`, `/usr/local`).
pub const DEFAULT_CONTAINERS_DIR: &str = "/usr/local/vgpu/containers";

/// The most entries of one container's folder looked at (the tenant makes them).
pub const MAX_ENTRIES: usize = 256;

/// One container's folder with its ledgers.
#[derive(Debug, Clone)]
pub struct Folder {
    /// `<pod UID>_<container>`, the folder's name.
    pub name: String,
    pub pod_uid: String,
    pub container: String,
    pub dir: PathBuf,
    /// One ledger per GPU, sorted by GPU uuid.
    pub ledgers: Vec<Ledger>,
}

/// One ledger of a container's folder, read.
#[derive(Debug, Clone)]
pub struct Ledger {
    /// The GPU's uuid, as the name and the header both say.
    pub uuid: String,
    pub path: PathBuf,
    pub snapshot: Snapshot,
}

/// Something of the containers folder that was not used, and why: one line naming it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub path: PathBuf,
    /// One line naming the file or folder.
    pub why: String,
}

/// Every container folder with at least one ledger, sorted by name, and what was skipped.
#[derive(Debug, Clone, Default)]
pub struct Scan {
    pub folders: Vec<Folder>,
    pub skipped: Vec<Skipped>,
}

/// Reads HAMi's containers folder `dir` (see the module's header). `dir` itself must be a folder, not a
/// link to one; a missing one is an error of kind `NotFound` (the caller decides whether that matters).
pub fn scan(dir: &Path) -> io::Result<Scan> {
    let meta = fs::symlink_metadata(dir)?;
    if !meta.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a folder (a link is not followed)", dir.display()),
        ));
    }
    let mut out = Scan::default();
    let mut names: Vec<(String, PathBuf)> = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let skip = |why: &str| Skipped {
            // Debug form: a file name the tenant chose, control characters escaped.
            why: format!("HAMi container folder {:?}: {why}", path),
            path: path.clone(),
        };
        // Not following links: a link to a folder is not a container's folder.
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            out.skipped.push(skip("not a folder"));
            continue;
        }
        match entry.file_name().to_str() {
            Some(n) if split_name(n).is_some() => names.push((n.to_string(), path)),
            _ => out
                .skipped
                .push(skip("not named <pod UID>_<container> as HAMi names them")),
        }
    }
    names.sort();
    for (name, path) in names {
        let (pod_uid, container) = split_name(&name).expect("checked above");
        let folder = Folder {
            pod_uid: pod_uid.to_string(),
            container: container.to_string(),
            ledgers: ledgers(&path, &mut out.skipped),
            dir: path,
            name,
        };
        if !folder.ledgers.is_empty() {
            out.folders.push(folder);
        }
    }
    Ok(out)
}

/// `<pod UID>_<container>`: a pod UID (a UUID, or a static pod's hash: hex digits and dashes, 1 to 64)
/// and a container name (a DNS-1123 label, as Kubernetes requires), split at the first `_` (neither has
/// one).
pub fn split_name(name: &str) -> Option<(&str, &str)> {
    let (uid, ctr) = name.split_once('_')?;
    let uid_ok = (1..=64).contains(&uid.len())
        && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
        && uid.bytes().any(|b| b.is_ascii_hexdigit());
    let ctr_ok = (1..=63).contains(&ctr.len())
        && ctr
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !ctr.starts_with('-')
        && !ctr.ends_with('-');
    (uid_ok && ctr_ok).then_some((uid, ctr))
}

/// The GPU uuid a ledger's file name ends with (`<prefix>.GPU-…` or `<prefix>.MIG-…`), or None: not a
/// ledger's name (a dot-name is the library's ledger being made, never one to read).
pub fn ledger_uuid(name: &str) -> Option<&str> {
    if name.starts_with('.') {
        return None;
    }
    let at = [".GPU-", ".MIG-"]
        .iter()
        .filter_map(|p| name.find(p))
        .min()?;
    let uuid = &name[at + 1..];
    (at > 0 && uuid.len() > 4 && check_gpu_uuid(uuid).is_ok()).then_some(uuid)
}

/// The ledgers of one container's folder (see the module's header), one per GPU: where a tenant left two
/// for one GPU, the one with live slots, else the larger charge, is read; the other is skipped.
fn ledgers(dir: &Path, skipped: &mut Vec<Skipped>) -> Vec<Ledger> {
    let list = match fs::read_dir(dir) {
        Ok(l) => l,
        Err(e) => {
            skipped.push(Skipped {
                why: format!("HAMi container folder {}: cannot list: {e}", dir.display()),
                path: dir.to_path_buf(),
            });
            return vec![];
        }
    };
    let mut found: Vec<Ledger> = Vec::new();
    for (n, entry) in list.enumerate() {
        if n == MAX_ENTRIES {
            skipped.push(Skipped {
                why: format!(
                    "HAMi container folder {}: holds more than {MAX_ENTRIES} entries; the rest are not looked at",
                    dir.display()
                ),
                path: dir.to_path_buf(),
            });
            break;
        }
        let Ok(entry) = entry else { break };
        let name = entry.file_name();
        let Some(uuid) = name.to_str().and_then(ledger_uuid) else {
            continue;
        };
        let path = entry.path();
        match read(&path, uuid) {
            Ok(snapshot) => found.push(Ledger {
                uuid: uuid.to_string(),
                path,
                snapshot,
            }),
            // Gone between the listing and the open: nothing to say.
            Err(LedgerError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {}
            Err(e) => skipped.push(Skipped {
                why: skip_line(&path, &e),
                path,
            }),
        }
    }
    let rank = |l: &Ledger| (l.snapshot.slots.iter().any(|s| s.alive), l.snapshot.used);
    found.sort_by(|a, b| {
        a.uuid
            .cmp(&b.uuid)
            .then_with(|| rank(b).cmp(&rank(a)))
            .then_with(|| a.path.cmp(&b.path))
    });
    let mut out: Vec<Ledger> = Vec::new();
    for l in found {
        match out.last() {
            Some(kept) if kept.uuid == l.uuid => skipped.push(Skipped {
                why: format!(
                    // Debug form: the names are the tenant's (control characters escaped).
                    "vgpu ledger {:?}: another ledger of GPU {:?} in the folder ({:?}) is the one read",
                    l.path,
                    l.uuid,
                    kept.path
                ),
                path: l.path,
            }),
            _ => out.push(l),
        }
    }
    out
}

/// The line saying why the ledger at `path` was skipped: the ledger error's, with the path in Debug form
/// (the name is the tenant's) and anything else it quotes with control characters escaped.
fn skip_line(path: &Path, e: &LedgerError) -> String {
    let line = e.to_string();
    match line.strip_prefix(&format!("vgpu ledger {}: ", path.display())) {
        Some(rest) => format!("vgpu ledger {path:?}: {}", printable(rest)),
        None => printable(&line).into_owned(),
    }
}

/// The ledger at `path`, opened as a tenant's file (`hostfile::open_regular`: at most a ledger's size) and
/// read with `pread`; its header must name the GPU its file name does.
fn read(path: &Path, uuid: &str) -> Result<Snapshot, LedgerError> {
    let file =
        hostfile::open_regular(path, FILE_SIZE as u64).map_err(|source| LedgerError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    let snap = Snapshot::from_file(path, file.file())?;
    if snap.uuid != uuid {
        return Err(LedgerError::UuidMismatch {
            path: path.to_path_buf(),
            found: snap.uuid,
            expected: uuid.to_string(),
        });
    }
    Ok(snap)
}

/// The pod UID a kubelet's cgroup path names, if it names one: `…/pod<uid>/…` (the cgroupfs driver) or
/// `…/kubepods-<qos>-pod<uid with _ for ->.slice/…` (the systemd driver). The host's record of which pod
/// a process runs in: the process cannot leave its cgroup, and its tenant cannot name it.
pub fn kubelet_pod_uid(cgroup: &str) -> Option<String> {
    cgroup.split('/').find_map(|part| {
        let uid = match part.strip_suffix(".slice") {
            Some(slice) => slice.rsplit_once("-pod")?.1.replace('_', "-"),
            None => part.strip_prefix("pod")?.to_string(),
        };
        let ok = uid.len() >= 32 && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
        ok.then_some(uid)
    })
}

#[cfg(test)]
mod tests;
