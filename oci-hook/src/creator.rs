//! The process that provisions a container's state, told apart from a later process with its PID: its PID
//! and start time (field 22 of `/proc/<pid>/stat`), recorded in `limits.json` (`creator`). Not here: what
//! is done with state whose creator is gone (`crate::abandoned`, `crate::gc`).
//!
//! Read by hand, as `vgpu_host::procs` reads the rest of /proc: two fields of one line.

use vgpu_ledger::{Creator, Limits};

/// The calling process as a creator; `None` when /proc cannot tell (the state is then collected after
/// the grace, as before).
pub fn current() -> Option<Creator> {
    of_pid(std::process::id())
}

/// Host PID `pid` as a creator, while it runs; `None` when it is gone or a zombie (a killed shim its
/// parent has not reaped yet).
pub fn of_pid(pid: u32) -> Option<Creator> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (state, start_time) = parse_stat(&stat)?;
    if matches!(state, 'Z' | 'X' | 'x') {
        return None;
    }
    Some(Creator { pid, start_time })
}

/// The state letter (field 3) and the start time (field 22) of a `/proc/<pid>/stat` line. The command
/// name (field 2) is in parentheses and may hold spaces and parentheses itself: fields are counted from
/// the last `)`.
fn parse_stat(stat: &str) -> Option<(char, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    // Fields 4..=21 come between the state and the start time.
    let start_time = fields.nth(18)?.parse().ok()?;
    Some((state, start_time))
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
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        let line =
            "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_stat(line), Some(('S', 987654)));
        assert_eq!(parse_stat("4242 (x) Z 1"), None);
        assert_eq!(parse_stat("garbage"), None);
    }

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
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
            if parse_stat(&stat).is_some_and(|(s, _)| s == 'Z') {
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
