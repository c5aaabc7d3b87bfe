//! The process that provisions a container's state, told apart from a later process with its PID: its PID
//! and start time (field 22 of `/proc/<pid>/stat`), recorded in `limits.json` (`creator`). Not here: what
//! is done with state whose creator is gone (`abandoned`, `gc`).
//!
//! Its `/proc/<pid>/stat` line is read by `procs` (the one reader of `/proc`).

use crate::procs;
use vgpu_ledger::{Creator, Limits};

/// The calling process as a creator; `None` when /proc cannot tell (the state is then collected after
/// the grace, as before).
pub fn current() -> Option<Creator> {
    of_pid(std::process::id())
}

/// Host PID `pid` as a creator, while it runs; `None` when it is gone or a zombie (a killed shim its
/// parent has not reaped yet).
pub fn of_pid(pid: u32) -> Option<Creator> {
    let (state, start_time) = procs::stat(pid)?;
    if matches!(state, 'Z' | 'X' | 'x') {
        return None;
    }
    Some(Creator { pid, start_time })
}

/// True when the recorded creator no longer runs (its PID gone, a zombie, or another process's).
pub fn creator_gone(c: &Creator) -> bool {
    of_pid(c.pid) != Some(*c)
}

/// State that no owner was ever recorded in and whose creator is gone: the create was killed.
pub fn is_abandoned(l: &Limits) -> bool {
    l.init_pid.is_none() && l.creator.as_ref().is_some_and(creator_gone)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_creator_is_alive_and_a_reaped_or_reused_one_gone() {
        let me = current().unwrap();
        assert_eq!(me.pid, std::process::id());
        assert!(!creator_gone(&me));
        // the same PID with another start time is another process
        assert!(creator_gone(&Creator {
            start_time: me.start_time + 1,
            ..me
        }));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let c = of_pid(child.id());
        child.wait().unwrap();
        if let Some(c) = c {
            assert!(creator_gone(&c));
        }
    }

    #[test]
    fn a_zombie_is_gone() {
        let child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        // not reaped: a zombie once it has exited
        let mut zombie = false;
        for _ in 0..200 {
            if procs::stat(pid).is_some_and(|(s, _)| s == 'Z') {
                zombie = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(zombie);
        assert_eq!(of_pid(pid), None);
        let mut child = child;
        child.wait().unwrap();
    }
}
