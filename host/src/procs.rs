//! A host process as the monitor and `vgpuctl status` need it: its PID namespace inode, its PID inside that namespace (the last
//! `NSpid` entry) and its cgroup, from `/proc/<pid>`. Not here: deciding which container it is
//! (`watchdog::owner_of`), killing it (`watchdog::kill`).
//!
//! Hand-written rather than through the `procfs` crate: each PID costs one `stat` of `/proc/<pid>/ns/pid`
//! (the inode is the namespace's identity) and one line of `/proc/<pid>/status` (`NSpid`), read for every
//! PID of the host on each `vgpuctl status` and for every GPU process on each watchdog pass; `procfs`
//! parses the whole status file into some fifty fields per process (and reads every namespace link for
//! the inode), for the one field used. The cgroup text is matched as written, not parsed into hierarchies.

/// What `/proc` says about a host PID.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostProc {
    pub pid: u32,
    /// Inode of its PID namespace.
    pub ns: u64,
    /// Its PID inside that namespace (what the ledger's slot records).
    pub inner_pid: u32,
    /// The text of `/proc/<pid>/cgroup`; `None`: not read yet (only needed when the PID namespace does not
    /// tell the container, see `cgroup`).
    pub cgroup: Option<String>,
}

impl HostProc {
    /// The text of `/proc/<pid>/cgroup` (read now unless given).
    pub fn cgroup(&self) -> String {
        match &self.cgroup {
            Some(c) => c.clone(),
            None => {
                std::fs::read_to_string(format!("/proc/{}/cgroup", self.pid)).unwrap_or_default()
            }
        }
    }
}

/// Inode of the monitor's own PID namespace (0 when /proc cannot tell).
pub fn own_ns() -> u64 {
    std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| std::os::unix::fs::MetadataExt::ino(&m))
}

/// Reads `/proc/<pid>`; `None` when the process is gone (or `/proc` is not the host's).
pub fn inspect(pid: u32) -> Option<HostProc> {
    let ns = std::fs::metadata(format!("/proc/{pid}/ns/pid")).ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    Some(HostProc {
        pid,
        ns: std::os::unix::fs::MetadataExt::ino(&ns),
        inner_pid: inner_pid(&status).unwrap_or(pid),
        cgroup: None,
    })
}

/// The last PID of the `NSpid:` line (the innermost namespace's).
pub fn inner_pid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

/// True when one of the cgroup paths names container `id`: a path component that is the id (cgroupfs:
/// `/docker/<id>`, `/kubepods/.../<id>`, runc's default `/<id>`) or a systemd scope ending in `-<id>.scope`
/// (`docker-<id>.scope`, `cri-containerd-<id>.scope`, `crio-<id>.scope`).
pub fn cgroup_names(cgroup: &str, id: &str) -> bool {
    cgroup.lines().any(|line| {
        let path = line.splitn(3, ':').nth(2).unwrap_or("");
        path.split('/').any(|c| {
            c == id
                || c.strip_suffix(".scope")
                    .and_then(|s| s.strip_suffix(id))
                    .is_some_and(|s| s.ends_with('-'))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nspid_and_cgroup_matching() {
        assert_eq!(inner_pid("Name:\tx\nNSpid:\t4242\t7\n"), Some(7));
        assert_eq!(inner_pid("NSpid:\t99\n"), Some(99));
        assert_eq!(inner_pid("Name:\tx\n"), None);
        let me = inspect(std::process::id()).unwrap();
        assert_eq!(me.inner_pid, std::process::id());
        assert!(me.ns > 0);
        let id = "3f2a9c";
        for yes in [
            "0::/system.slice/docker-3f2a9c.scope\n",
            "0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-3f2a9c.scope\n",
            "12:memory:/docker/3f2a9c\n",
            "0::/3f2a9c\n",
        ] {
            assert!(cgroup_names(yes, id), "{yes}");
        }
        for no in [
            "0::/system.slice/docker-13f2a9c.scope\n",
            "0::/3f2a9c0\n",
            "0::/user.slice\n",
            "",
        ] {
            assert!(!cgroup_names(no, id), "{no}");
        }
    }
}
