//! The share wall's and the time-quanta arbiter's hand on a container: the writes to its cgroup's
//! `cgroup.freeze` (1 freezes every process of the cgroup and its descendants, 0 thaws them; the kernel's
//! freezer, which nothing inside the container can undo). The directory (`vgpu_host::cgroup::of_container`,
//! one for both walls) is the container's cgroup v2 path the hook
//! recorded at creation (`vgpu_ledger::Limits::cgroup`, the `0::` line of its init process's
//! `/proc/<pid>/cgroup`, which the hook never records as the root, its own cgroup or one above it),
//! under the host's cgroup v2 mount (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on a hybrid host). A
//! container with no recorded cgroup is never frozen (reported only). Not here: when to freeze
//! (`share_wall`), finding the directory (`vgpu_host::cgroup`), which process is whose
//! (`vgpu_host::attribution::owner_of`).

use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Opens `dir/name` for writing without following a link or creating it.
fn open_write(dir: &Path, name: &str) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(NOFOLLOW)
        .open(dir.join(name))
}

const NOFOLLOW: i32 = nix::fcntl::OFlag::O_NOFOLLOW.bits();

/// Writes `cgroup.freeze`: true freezes, false thaws.
pub fn set_frozen(dir: &Path, frozen: bool) -> std::io::Result<()> {
    open_write(dir, "cgroup.freeze")?.write_all(if frozen { b"1" } else { b"0" })
}

/// What `cgroup.freeze` says now (someone else may have frozen it: `docker pause`, `runc pause`).
/// What freezing a container's cgroup did.
#[derive(Debug, PartialEq, Eq)]
pub enum Freeze {
    /// Frozen now (by this monitor).
    Frozen,
    /// Frozen already, by someone else (`docker pause`, an operator): left alone.
    AlreadyFrozen,
    /// The cgroup is gone: the container ended between NVML's figures and the freeze.
    Gone,
}

/// Freezes the cgroup `dir` for a wall (`share_run`, `turns::run`): `Some(dir)` when this monitor
/// froze it (it then thaws it), `None` when it is gone (the container ended after NVML saw it busy), or
/// the one line that says why it was left alone (someone else froze it) or could not be frozen.
pub fn freeze_for_wall(dir: std::path::PathBuf) -> Result<Option<std::path::PathBuf>, String> {
    match freeze(&dir) {
        Ok(Freeze::Frozen) => Ok(Some(dir)),
        Ok(Freeze::Gone) => Ok(None),
        Ok(Freeze::AlreadyFrozen) => Err(format!(
            "{} is frozen already (paused by someone else): left alone",
            dir.display()
        )),
        Err(e) => Err(format!("cannot freeze {}: {e}", dir.display())),
    }
}

/// Freezes `dir` unless someone else froze it; a cgroup that is gone is no error (its container ended
/// after NVML last saw its processes busy).
pub fn freeze(dir: &Path) -> std::io::Result<Freeze> {
    let gone = |e: std::io::Error| {
        if e.kind() == std::io::ErrorKind::NotFound {
            Ok(Freeze::Gone)
        } else {
            Err(e)
        }
    };
    match is_frozen(dir) {
        Ok(true) => Ok(Freeze::AlreadyFrozen),
        Ok(false) => set_frozen(dir, true).map(|()| Freeze::Frozen).or_else(gone),
        Err(e) => gone(e),
    }
}

pub fn is_frozen(dir: &Path) -> std::io::Result<bool> {
    let mut s = String::new();
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(NOFOLLOW)
        .open(dir.join("cgroup.freeze"))?
        .take(16)
        .read_to_string(&mut s)?;
    Ok(s.trim() == "1")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression (a clean-clone CI run): a container that ended between NVML's figures and the freeze
    /// counted as a failed freeze (`vgpu_compute_share_freeze_failures_total` 1).
    #[test]
    fn a_cgroup_that_is_gone_is_no_failed_freeze() {
        let d = tempfile::tempdir().unwrap();
        let cg = d.path().join("c1");
        std::fs::create_dir(&cg).unwrap();
        std::fs::write(cg.join("cgroup.freeze"), "0\n").unwrap();
        assert_eq!(freeze(&cg).unwrap(), Freeze::Frozen);
        assert_eq!(freeze(&cg).unwrap(), Freeze::AlreadyFrozen);
        std::fs::remove_dir_all(&cg).unwrap();
        assert_eq!(freeze(&cg).unwrap(), Freeze::Gone);
    }

    #[test]
    fn freeze_and_thaw_write_cgroup_freeze_and_follow_no_link() {
        let d = tempfile::tempdir().unwrap();
        let cg = d.path().join("c1");
        std::fs::create_dir(&cg).unwrap();
        std::fs::write(cg.join("cgroup.freeze"), "0\n").unwrap();
        assert!(!is_frozen(&cg).unwrap());
        set_frozen(&cg, true).unwrap();
        assert!(is_frozen(&cg).unwrap());
        set_frozen(&cg, false).unwrap();
        assert!(!is_frozen(&cg).unwrap());
        // Not there: an error, nothing created.
        let gone = d.path().join("gone");
        std::fs::create_dir(&gone).unwrap();
        assert!(set_frozen(&gone, true).is_err());
        assert!(!gone.join("cgroup.freeze").exists());
        // A link is not followed.
        let l = d.path().join("l");
        std::fs::create_dir(&l).unwrap();
        std::fs::write(d.path().join("target"), "0").unwrap();
        std::os::unix::fs::symlink(d.path().join("target"), l.join("cgroup.freeze")).unwrap();
        assert!(set_frozen(&l, true).is_err());
        assert_eq!(
            std::fs::read_to_string(d.path().join("target")).unwrap(),
            "0"
        );
    }
}
