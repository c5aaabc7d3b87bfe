//! The share wall's and the time-quanta arbiter's hand on a container: its cgroup v2 directory
//! (`cgroup_of`, written once for both) and the writes to its `cgroup.freeze` (1 freezes every process of
//! the cgroup and its descendants, 0 thaws them; the kernel's freezer, which nothing inside the container
//! can undo). The directory is the container's cgroup v2 path the hook
//! recorded at creation (`vgpu_ledger::Limits::cgroup`, the `0::` line of its init process's
//! `/proc/<pid>/cgroup`, which the hook never records as the root, its own cgroup or one above it),
//! under the host's cgroup v2 mount (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on a hybrid host). A
//! container with no recorded cgroup is never frozen (reported only). Not here: when to freeze
//! (`share_wall`), which process is whose (`vgpu_host::attribution::owner_of`).

use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use vgpu_host::usage::ContainerState;

/// Where the cgroup v2 hierarchy is mounted, from a `/proc/self/mountinfo` text (the first `cgroup2`
/// mount of the hierarchy's root).
pub fn v2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let f: Vec<&str> = left.split(' ').collect();
        let root_mount = right.split(' ').next() == Some("cgroup2") && f.get(3) == Some(&"/");
        f.get(4).filter(|_| root_mount).map(PathBuf::from)
    })
}

/// The host's cgroup v2 mount (None: no cgroup v2, nothing can be frozen).
pub fn host_v2_mount() -> Option<PathBuf> {
    v2_mount(&std::fs::read_to_string("/proc/self/mountinfo").ok()?)
}

/// A container's cgroup directory: its recorded cgroup v2 path under `mount` (None for the root or a path
/// that climbs: nothing but a container's own cgroup is ever frozen).
pub fn of_container(recorded: &str, mount: &Path) -> Option<PathBuf> {
    let rel = recorded.trim_start_matches('/');
    if rel.is_empty()
        || rel
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return None;
    }
    Some(mount.join(rel))
}

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

/// A container's cgroup directory: the cgroup v2 path recorded at its creation, under the host's mount (a
/// container without one is reported, never frozen: nothing else is known to hold only its processes).
pub fn cgroup_of(c: &ContainerState) -> Result<PathBuf, String> {
    let mount = host_v2_mount().ok_or("no cgroup v2 hierarchy is mounted")?;
    let recorded = c
        .cgroup
        .as_deref()
        .ok_or("no cgroup of its own was recorded at its creation")?;
    of_container(recorded, &mount)
        .ok_or_else(|| format!("its recorded cgroup {recorded:?} is not one to freeze"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_v2_mount_from_mountinfo_pure_or_hybrid() {
        let hybrid = "30 25 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n\
                      35 30 0:31 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw\n\
                      36 30 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        assert_eq!(v2_mount(hybrid), Some("/sys/fs/cgroup/unified".into()));
        let pure = "29 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(v2_mount(pure), Some("/sys/fs/cgroup".into()));
        // A bind of a sub-tree (a container's view) is not the hierarchy's root.
        let sub = "29 23 0:26 /kubepods/x /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(v2_mount(sub), None);
        assert_eq!(v2_mount("1 2 0:3 / /proc rw - proc proc rw\n"), None);
    }

    #[test]
    fn only_a_recorded_cgroup_below_the_root() {
        let m = Path::new("/sys/fs/cgroup");
        assert_eq!(of_container("/c1", m), Some("/sys/fs/cgroup/c1".into()));
        assert_eq!(
            of_container("/system.slice/crio-c1.scope", m),
            Some("/sys/fs/cgroup/system.slice/crio-c1.scope".into())
        );
        for no in ["/", "", "/c1/../..", "/a//b", "/./c1"] {
            assert_eq!(of_container(no, m), None, "{no}");
        }
    }

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
