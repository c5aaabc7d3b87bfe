//! A container's cgroup directory on the host, every way vgpu finds one: from the path the hook recorded
//! (`Limits::cgroup`, the `0::` line of its init process's `/proc/<pid>/cgroup`) under the host's cgroup v2
//! mount ([`of_container`]: the monitor's share wall and time-quanta arbiter freeze it), and from a live
//! process at creation ([`of_pid`]: the driver's per-cgroup memory limit, `crate::driverlimit`). Not here:
//! what is done with the folder (freezing: the monitor's `freezer`; the NVML call: `driverlimit`), which
//! process is whose (`crate::attribution`).
//!
//! `/proc/<pid>/cgroup` is read by hand (three colon-separated fields a line), not through `procfs`: one
//! small file, read once per container, where the crate would bring its parser for all of `/proc`.

use crate::usage::ContainerState;
use std::path::{Path, PathBuf};

/// Why a process's cgroup folder could not be found. `Display` is one line.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cannot read the cgroup of pid {pid}: {err}")]
    ReadCgroup { pid: u32, err: std::io::Error },
    #[error("pid {pid}: no cgroup v2 or memory cgroup in /proc/{pid}/cgroup, below its hierarchy's root and mounted on this host")]
    NoCgroup { pid: u32 },
}

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

/// Where the cgroup v1 memory controller's hierarchy is mounted, from a `/proc/self/mountinfo` text.
pub fn v1_memory_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let f: Vec<&str> = left.split(' ').collect();
        let mut r = right.split(' ');
        let memory = r.next() == Some("cgroup") && r.nth(1)?.split(',').any(|o| o == "memory");
        f.get(4)
            .filter(|_| memory && f.get(3) == Some(&"/"))
            .map(PathBuf::from)
    })
}

/// The host's cgroup v2 mount (None: no cgroup v2, nothing can be frozen).
pub fn host_v2_mount() -> Option<PathBuf> {
    v2_mount(&std::fs::read_to_string("/proc/self/mountinfo").ok()?)
}

/// A container's cgroup directory: its recorded cgroup v2 path under `mount` (None for the root or a path
/// that climbs: nothing but a container's own cgroup is ever frozen).
pub fn below(recorded: &str, mount: &Path) -> Option<PathBuf> {
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

/// A container's cgroup directory: the cgroup v2 path recorded at its creation, under the host's mount (a
/// container without one is reported, never frozen: nothing else is known to hold only its processes).
pub fn of_container(c: &ContainerState) -> Result<PathBuf, String> {
    let mount = host_v2_mount().ok_or("no cgroup v2 hierarchy is mounted")?;
    let recorded = c
        .cgroup
        .as_deref()
        .ok_or("no cgroup of its own was recorded at its creation")?;
    below(recorded, &mount)
        .ok_or_else(|| format!("its recorded cgroup {recorded:?} is not one to freeze"))
}

/// The sysfs path of the cgroup of host process `pid`: the unified hierarchy's (cgroup v2) under its mount,
/// else the memory controller's (v1) under its mount; never a hierarchy's root (the whole host).
pub fn of_pid(pid: u32) -> Result<PathBuf, CgroupError> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .map_err(|err| CgroupError::ReadCgroup { pid, err })?;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    parse(
        &text,
        v2_mount(&mountinfo).as_deref(),
        v1_memory_mount(&mountinfo).as_deref(),
    )
    .ok_or(CgroupError::NoCgroup { pid })
}

/// The sysfs path of a `/proc/<pid>/cgroup` text: its unified hierarchy's line under `v2` (the v2 mount),
/// else its memory controller's under `v1_memory`. A line naming the root (`/`) is passed over: on a
/// hybrid host every process sits in the unused unified hierarchy's root, and a limit there would be the
/// whole host's.
fn parse(text: &str, v2: Option<&Path>, v1_memory: Option<&Path>) -> Option<PathBuf> {
    let line = |want: &dyn Fn(&str, &str) -> bool| {
        text.lines().find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (id, ctrl, path) = (f.next()?, f.next()?, f.next()?);
            want(id, ctrl).then(|| path.to_string())
        })
    };
    let unified = line(&|id, ctrl| id == "0" && ctrl.is_empty());
    if let (Some(p), Some(m)) = (unified, v2) {
        if let Some(dir) = below(&p, m) {
            return Some(dir);
        }
    }
    let p = line(&|_, ctrl| ctrl.split(',').any(|c| c == "memory"))?;
    below(&p, v1_memory?)
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
        assert_eq!(below("/c1", m), Some("/sys/fs/cgroup/c1".into()));
        assert_eq!(
            below("/system.slice/crio-c1.scope", m),
            Some("/sys/fs/cgroup/system.slice/crio-c1.scope".into())
        );
        for no in ["/", "", "/c1/../..", "/a//b", "/./c1"] {
            assert_eq!(below(no, m), None, "{no}");
        }
    }

    #[test]
    fn the_cgroup_path_of_v2_and_of_v1s_memory_controller() {
        let (v2, v1) = (
            Path::new("/sys/fs/cgroup"),
            Path::new("/sys/fs/cgroup/memory"),
        );
        assert_eq!(
            parse("0::/system.slice/docker-3f2a.scope\n", Some(v2), None),
            Some(PathBuf::from(
                "/sys/fs/cgroup/system.slice/docker-3f2a.scope"
            ))
        );
        // A hybrid host: the unified hierarchy mounted elsewhere, and unused (every process at its root):
        // the memory controller's folder, never the root's (a limit there was the whole host's).
        let unified = Path::new("/sys/fs/cgroup/unified");
        assert_eq!(
            parse(
                "12:cpu,cpuacct:/x\n7:memory:/kubepods/pod1/c2\n0::/\n",
                Some(unified),
                Some(v1)
            ),
            Some(PathBuf::from("/sys/fs/cgroup/memory/kubepods/pod1/c2"))
        );
        assert_eq!(
            parse("7:memory:/c2\n0::/kubepods/c2\n", Some(unified), Some(v1)),
            Some(PathBuf::from("/sys/fs/cgroup/unified/kubepods/c2")),
            "a used unified hierarchy, under its own mount"
        );
        assert_eq!(
            parse(
                "12:cpu,cpuacct:/x\n7:memory:/kubepods/pod1/c2\n",
                None,
                Some(v1)
            ),
            Some(PathBuf::from("/sys/fs/cgroup/memory/kubepods/pod1/c2"))
        );
        assert_eq!(parse("12:cpu:/x\n", Some(v2), Some(v1)), None);
        assert_eq!(
            parse("0::/\n", Some(v2), Some(v1)),
            None,
            "the root: refused"
        );
        assert_eq!(parse("7:memory:/\n0::/\n", Some(v2), Some(v1)), None);
        assert_eq!(parse("0::/c1/../..\n", Some(v2), None), None);
    }

    #[test]
    fn the_v1_memory_mount_from_mountinfo() {
        let hybrid = "30 25 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n\
                      35 30 0:31 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw\n\
                      36 30 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        assert_eq!(
            v1_memory_mount(hybrid),
            Some("/sys/fs/cgroup/memory".into())
        );
        let pure = "29 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(v1_memory_mount(pure), None);
    }
}
