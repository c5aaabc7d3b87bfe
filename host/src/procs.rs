//! A host process as the monitor, `vgpuctl status` and the garbage collector need it: its PID namespace
//! inode, its PID inside that namespace (the last `NSpid` entry), its start time and its cgroup, from
//! `/proc/<pid>`; whether a container's recorded init process still lives ([`init_alive`]); and killing a
//! process only if it is still the one that was looked at ([`kill_checked`], through a pidfd). Not here:
//! deciding which container a process is (`attribution::owner_of`).
//!
//! A PID alone names no process for long: PIDs are reused, and so are namespace inodes once their
//! namespace is gone. A process is the pair (PID, start time): the start time (clock ticks after boot,
//! field 22 of `/proc/<pid>/stat`) of whatever holds the PID later differs. So a recorded init process
//! counts only while its PID runs in the recorded namespace with the recorded start time, and a kill opens
//! a pidfd first (it holds that very process, whatever the PID names later), reads `/proc/<pid>` again,
//! and signals through the pidfd only when the start time and the caller's check still agree.
//!
//! Hand-written rather than through the `procfs` crate: each PID costs one `stat` of `/proc/<pid>/ns/pid`
//! (the inode is the namespace's identity), one line of `/proc/<pid>/status` (`NSpid`) and the short
//! `/proc/<pid>/stat`, read for every PID of the host on each `vgpuctl status` and for every GPU process on
//! each watchdog pass; `procfs` parses the whole status file into some fifty fields per process, for the
//! one field used. Measured (2026-11-29, this repository's 2-core build machine, every PID of the host 20
//! times, three rounds): the status and stat reads here 8.8–9.1 µs a PID, `procfs` 0.17's
//! `Process::status` and `Process::stat` 21.5–22.2 µs. Of `/proc/<pid>/cgroup` only the unified (cgroup v2)
//! line is used, the `0::` one, as the kernel writes it.

use nix::libc;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// What `/proc` says about a host PID.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostProc {
    pub pid: u32,
    /// Inode of its PID namespace.
    pub ns: u64,
    /// Its PID inside that namespace (what the ledger's slot records).
    pub inner_pid: u32,
    /// When it started (clock ticks after boot): with `pid`, its identity.
    pub start_time: u64,
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

    /// Its cgroup v2 path (see [`unified_path`]).
    pub fn unified_cgroup(&self) -> Option<String> {
        unified_path(&self.cgroup()).map(str::to_string)
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
        start_time: start_time(pid)?,
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

/// When host PID `pid` started (clock ticks after boot); `None` when it is gone.
pub fn start_time(pid: u32) -> Option<u64> {
    stat(pid).map(|(_, start)| start)
}

/// Host PID `pid`'s state letter and start time (`/proc/<pid>/stat`, see [`parse_stat`]); `None` when
/// it is gone.
pub fn stat(pid: u32) -> Option<(char, u64)> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Clock ticks a second, the unit of a start time (`sysconf(_SC_CLK_TCK)`; 100 where it cannot tell).
pub fn ticks_per_second() -> u64 {
    // SAFETY: sysconf reads a setting of the system; nothing is passed by pointer.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(hz).ok().filter(|&h| h > 0).unwrap_or(100)
}

/// The state letter (field 3) and the start time (field 22) of a `/proc/<pid>/stat` line. The command
/// name (field 2) is in parentheses and may hold spaces and parentheses itself: fields are counted after
/// its last `)`.
pub fn parse_stat(stat: &str) -> Option<(char, u64)> {
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    // Fields 4..=21 come between the state and the start time.
    let start_time = fields.nth(18)?.parse().ok()?;
    Some((state, start_time))
}

/// The cgroup v2 path of a `/proc/<pid>/cgroup` text: the path of its `0::` line (the unified hierarchy,
/// the only one on a cgroup v2 host and beside the v1 ones on a hybrid host). `None` when there is none.
pub fn unified_path(cgroup: &str) -> Option<&str> {
    cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .filter(|p| p.starts_with('/'))
}

/// True when cgroup path `path` is `base` or a cgroup below it (`/a/b` is below `/a`, `/ab` is not). The
/// root `/` contains every cgroup; a container is never recorded there (see the recording's rules).
pub fn cgroup_within(path: &str, base: &str) -> bool {
    let base = base.trim_end_matches('/');
    path == base
        || path
            .strip_prefix(base)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// True when a container's recorded init process still lives: host PID `pid` runs in PID namespace `ns`
/// and, when recorded (`start`; state written before it was recorded has none), started at that time. A
/// namespace whose recorded init is gone names nothing: the kernel reuses its inode for a new namespace.
/// An init that exited and was not reaped yet (a zombie: its namespace and start time still read as
/// before) has exited: `vgpuctl update` once updated such a container.
pub fn init_alive(pid: u32, ns: u64, start: Option<u64>) -> bool {
    let Ok(m) = std::fs::metadata(format!("/proc/{pid}/ns/pid")) else {
        return false;
    };
    if std::os::unix::fs::MetadataExt::ino(&m) != ns {
        return false;
    }
    match stat(pid) {
        Some((state, started)) => !matches!(state, 'Z' | 'X') && start.is_none_or(|s| s == started),
        None => false,
    }
}

/// Why [`kill_checked`] sent no signal. `Display` is one line.
#[derive(Debug, thiserror::Error)]
pub enum KillError {
    /// The process is gone (or `/proc` cannot show it).
    #[error("the process is gone")]
    Gone,
    /// Another process holds the PID now (another start time).
    #[error("the PID is another process's now (started at tick {now}, not {was})")]
    Reused { was: u64, now: u64 },
    /// The caller's check refused the process as it is now.
    #[error("the process no longer passes the check ({0})")]
    Refused(&'static str),
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        source: std::io::Error,
    },
}

/// SIGKILLs the process `seen` describes, only if it is still that process and `still` accepts it as
/// `/proc` shows it now (its namespace and cgroup, read again): a pidfd is opened on the PID first, then
/// `/proc/<pid>` is read; a process whose start time matches is the one the pidfd holds, and the signal is
/// sent through the pidfd, so a PID reused at any moment (before the open, between the check and the
/// signal) is never signalled.
pub fn kill_checked(
    seen: &HostProc,
    still: impl FnOnce(&HostProc) -> Result<(), &'static str>,
) -> Result<(), KillError> {
    let pid = i32::try_from(seen.pid)
        .ok()
        .filter(|&p| p > 0)
        .ok_or(KillError::Gone)?;
    let gone = |e: &std::io::Error| e.raw_os_error() == Some(libc::ESRCH);
    let fd = match pidfd_open(pid) {
        Ok(fd) => fd,
        Err(e) if gone(&e) => return Err(KillError::Gone),
        Err(source) => {
            return Err(KillError::Io {
                what: "pidfd_open",
                source,
            })
        }
    };
    let now = inspect(seen.pid).ok_or(KillError::Gone)?;
    if now.start_time != seen.start_time {
        return Err(KillError::Reused {
            was: seen.start_time,
            now: now.start_time,
        });
    }
    still(&now).map_err(KillError::Refused)?;
    match pidfd_kill(&fd) {
        Ok(()) => Ok(()),
        Err(e) if gone(&e) => Err(KillError::Gone),
        Err(source) => Err(KillError::Io {
            what: "pidfd_send_signal",
            source,
        }),
    }
}

// The two pidfd calls go through libc's `syscall`: nix has no wrapper for them, and glibc's own come only
// with 2.36, above the binaries' floor of 2.28.
/// `pidfd_open(2)` (Linux 5.3): a descriptor that holds the process `pid` names now, whatever it names later.
fn pidfd_open(pid: libc::pid_t) -> std::io::Result<OwnedFd> {
    // SAFETY: the call takes a PID and flags and borrows nothing; it returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor the kernel has just made for this call, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `pidfd_send_signal(2)` of SIGKILL (Linux 5.1) to the process `fd` holds.
fn pidfd_kill(fd: &OwnedFd) -> std::io::Result<()> {
    // SAFETY: an open pidfd, a signal number, no siginfo (null: as kill(2) sends it) and no flags.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_ticks_are_the_systems() {
        let getconf = std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .unwrap();
        let want: u64 = String::from_utf8_lossy(&getconf.stdout)
            .trim()
            .parse()
            .unwrap();
        assert_eq!(ticks_per_second(), want);
    }

    #[test]
    fn nspid_start_time_and_cgroup_paths() {
        assert_eq!(inner_pid("Name:\tx\nNSpid:\t4242\t7\n"), Some(7));
        assert_eq!(inner_pid("NSpid:\t99\n"), Some(99));
        assert_eq!(inner_pid("Name:\tx\n"), None);
        let me = inspect(std::process::id()).unwrap();
        assert_eq!(me.inner_pid, std::process::id());
        assert!(me.ns > 0 && me.start_time > 0);
        // A command name with spaces and parentheses does not shift the fields.
        let stat = "42 (a) b (c) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 777 1000 10";
        assert_eq!(parse_stat(stat), Some(('S', 777)));
        assert_eq!(parse_stat("42 (x) S 1"), None);
        assert_eq!(parse_stat("garbage"), None);
        let hybrid = "4:memory:/process_api/x\n1:cpu:/c\n0::/kubepods/pod1/crio-3f2a\n";
        assert_eq!(unified_path(hybrid), Some("/kubepods/pod1/crio-3f2a"));
        assert_eq!(unified_path("4:memory:/c\n"), None);
        assert!(cgroup_within("/pod/crio-3f2a", "/pod/crio-3f2a"));
        assert!(cgroup_within("/pod/crio-3f2a/inner", "/pod/crio-3f2a"));
        assert!(!cgroup_within("/pod/crio-3f2a0", "/pod/crio-3f2a"));
        assert!(!cgroup_within("/pod", "/pod/crio-3f2a"));
    }

    #[test]
    fn an_init_counts_only_in_its_namespace_with_its_start_time() {
        let me = inspect(std::process::id()).unwrap();
        assert!(init_alive(me.pid, me.ns, Some(me.start_time)));
        assert!(
            init_alive(me.pid, me.ns, None),
            "state recorded before start times"
        );
        assert!(!init_alive(me.pid, me.ns + 1, Some(me.start_time)));
        assert!(
            !init_alive(me.pid, me.ns, Some(me.start_time + 1)),
            "PID reused"
        );
    }

    #[test]
    fn a_kill_hits_only_the_process_that_was_looked_at() {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let seen = inspect(child.id()).unwrap();
        // The PID held by another process than the one seen (another start time): no signal.
        let other = HostProc {
            start_time: seen.start_time + 1,
            ..seen.clone()
        };
        assert!(matches!(
            kill_checked(&other, |_| Ok(())),
            Err(KillError::Reused { .. })
        ));
        // The caller's check, on the process as it is now, refuses it: no signal.
        assert!(matches!(
            kill_checked(&seen, |_| Err("moved")),
            Err(KillError::Refused("moved"))
        ));
        assert_eq!(child.try_wait().unwrap(), None, "still running");
        kill_checked(&seen, |now| {
            assert_eq!(now.ns, seen.ns);
            Ok(())
        })
        .unwrap();
        let status = child.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9)
        );
        // Gone (reaped): nothing to signal (or, should the PID be taken already, another process's).
        assert!(matches!(
            kill_checked(&seen, |_| Ok(())),
            Err(KillError::Gone | KillError::Reused { .. })
        ));
    }

    #[test]
    fn an_init_that_exited_unreaped_is_not_alive() {
        use std::os::unix::fs::MetadataExt;
        let ns = std::fs::metadata("/proc/self/ns/pid").unwrap().ino();
        let child = std::process::Command::new("sleep")
            .arg("0.2")
            .spawn()
            .unwrap();
        let pid = child.id();
        let start = start_time(pid);
        assert!(init_alive(pid, ns, start), "running");
        // Exited, not reaped: a zombie keeps its namespace and start time.
        for _ in 0..100 {
            if stat(pid).is_some_and(|(s, _)| s == 'Z') {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(stat(pid).map(|(s, _)| s), Some('Z'));
        assert!(!init_alive(pid, ns, start), "a zombie has exited");
        let mut child = child;
        child.wait().unwrap();
    }
}
