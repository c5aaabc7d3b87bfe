//! Older state (issue 44): a container whose state was written before the hook recorded its cgroup (an
//! older release) has none, so the share wall and the time-quanta arbiter could never freeze it (0 of 100
//! samples frozen where the current format gave 76). At each collection the monitor finds the cgroup of
//! each live such container from its recorded init process, and records it in the container's limits
//! file, so every later reading (and every host tool) has it:
//!
//! * only with the init's start time recorded: the process at the recorded PID must have that start time
//!   both before and after its `/proc/<pid>/cgroup` is read (`alive`), so a reused PID is never taken;
//!   state without a start time is left as it is (nothing tells its init from another process);
//! * under the rules the hook records by: a cgroup v2 path (the `0::` line), never the root, never the
//!   monitor's own cgroup or one above it;
//! * the file edited as JSON, every key it holds kept (a newer release's too), `cgroup` added only where
//!   absent, checked to be a limits file still, written whole and renamed over the old one
//!   (`vgpu_host::atomic`), under the container's folder lock as `vgpuctl update` takes it (busy: the
//!   next collection tries again).
//!
//! Not here: when the cgroup is frozen (`share_wall`, `turns`), its directory (`vgpu_host::cgroup::of_container`).

use std::path::Path;
use vgpu_host::atomic;
use vgpu_host::hostfile;
use vgpu_host::procs;
use vgpu_host::state_root::StateRoot;
use vgpu_host::usage::{ContainerState, Origin};

/// What `record_missing` needs of the host: whether a recorded init lives (`procs::init_alive`), a
/// process's `/proc/<pid>/cgroup` text, and the monitor's own cgroup v2 path.
pub struct Host<'a> {
    pub alive: &'a dyn Fn(u32, u64, Option<u64>) -> bool,
    pub cgroup_text: &'a dyn Fn(u32) -> Option<String>,
    pub own: Option<String>,
}

impl Host<'_> {
    /// The host as it is.
    pub fn real() -> Host<'static> {
        Host {
            alive: &procs::init_alive,
            cgroup_text: &|pid| std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok(),
            own: std::fs::read_to_string("/proc/self/cgroup")
                .ok()
                .and_then(|t| procs::unified_path(&t).map(str::to_string)),
        }
    }
}

/// Finds and records the cgroup of every live container in `containers` whose state lacks one (see the
/// module's header), setting it in `containers` too. Returns one log line per container recorded or
/// whose record failed.
pub fn record_missing(
    root: &StateRoot,
    containers: &mut [ContainerState],
    host: &Host,
) -> Vec<String> {
    let mut lines = Vec::new();
    for c in containers
        .iter_mut()
        .filter(|c| c.live && c.cgroup.is_none() && c.origin == Origin::StateRoot)
    {
        let (Some(pid), Some(ns), Some(start)) = (c.init_pid, c.pid_ns, c.init_start_time) else {
            continue;
        };
        let Some(text) = (host.cgroup_text)(pid) else {
            continue;
        };
        let Some(cg) = procs::unified_path(&text).map(str::to_string) else {
            continue;
        };
        let ours = host
            .own
            .as_deref()
            .is_some_and(|o| procs::cgroup_within(o, &cg));
        if cg == "/" || ours || !(host.alive)(pid, ns, Some(start)) {
            continue;
        }
        match record(root, &c.id, &cg) {
            Ok(true) => {
                lines.push(format!(
                    "container {}: its state had no cgroup (an older release wrote it): recorded {cg}, its init's (pid {pid})",
                    c.id
                ));
                c.cgroup = Some(cg);
            }
            Ok(false) => {}
            Err(e) => lines.push(format!(
                "container {}: cannot record its cgroup {cg}: {e}",
                c.id
            )),
        }
    }
    lines
}

/// Adds `cgroup` to container `id`'s limits file under its folder lock; false when the lock is held (the
/// next collection tries again) or the file has a cgroup already.
fn record(root: &StateRoot, id: &str, cgroup: &str) -> Result<bool, String> {
    let dir = root.container_dir(id).map_err(|e| e.to_string())?;
    let path = root.limits_path(id).map_err(|e| e.to_string())?;
    let d = std::fs::File::open(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let _lock = match nix::fcntl::Flock::lock(d, nix::fcntl::FlockArg::LockExclusiveNonblock) {
        Ok(l) => l,
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => return Ok(false),
        Err((_, e)) => return Err(format!("cannot lock {}: {e}", dir.display())),
    };
    add_cgroup(&path, cgroup)
}

/// The limits file at `path` with `cgroup` added, every other key kept; false when it has one already.
fn add_cgroup(path: &Path, cgroup: &str) -> Result<bool, String> {
    let bytes = hostfile::read_regular(path, hostfile::MAX_LIMITS_FILE)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut doc: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    let Some(obj) = doc.as_object_mut() else {
        return Err(format!("{}: not a JSON object", path.display()));
    };
    if obj.get("cgroup").is_some_and(|v| !v.is_null()) {
        return Ok(false);
    }
    obj.insert("cgroup".into(), cgroup.into());
    let mut text = serde_json::to_vec_pretty(&doc).map_err(|e| e.to_string())?;
    text.push(b'\n');
    let limits: vgpu_ledger::Limits = serde_json::from_slice(&text)
        .map_err(|e| format!("{}: not a limits file: {e}", path.display()))?;
    limits
        .validate()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    atomic::write_atomic(path, &text, atomic::WriteOptions::with_mode(0o644))
        .map_err(|e| e.to_string())?;
    Ok(true)
}

#[cfg(test)]
mod tests;
