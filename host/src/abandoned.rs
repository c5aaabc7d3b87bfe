//! State left by a create that never finished: the shim provisions a container's state before the lower
//! runtime runs, and the owner (the container's init) is recorded only when the container exists. A shim
//! killed in between (SIGKILL mid-create, then `delete -f` as an engine does) left state that admission
//! counted for `gc_pending_grace_seconds`. The state records its creator (PID and start time, so a reused
//! PID is told apart) at provisioning; state with no owner whose creator is gone is abandoned, and admission,
//! the garbage collector and a passed-through `delete` of its id remove it. Not here: provisioning
//! (`vgpu_oci::provision`), the collector's other rules (`gc`), telling the creator gone (`creator`),
//! removing a folder (`removal`).
//!
//! The creator of the shim path is the shim, which stays the lower runtime's parent until the create is
//! over: while it lives the create may still finish. On the hooks.d path the owner is known at
//! provisioning, so the creator never decides anything there.

use crate::creator::is_abandoned;
use crate::hostfile;
use crate::inventory::Container;
use crate::removal::{self, RemoveError};
use crate::state_root::StateRoot;

/// [`is_abandoned`](crate::creator::is_abandoned), for a container as the state root's reader gives it, and no process holds a slot of
/// its ledgers (none can, without an owner; checked all the same, as the collector does).
pub fn container_abandoned(c: &Container) -> bool {
    c.limits.as_ref().is_ok_and(is_abandoned) && c.any_slot_alive().is_ok_and(|alive| !alive)
}

/// Removes every abandoned container's state under `root` (admission, under its lock: such state must not
/// hold room); returns the ids removed. Errors are logged, never fatal.
pub fn collect(root: &StateRoot) -> Vec<String> {
    let Ok(containers) = crate::inventory::containers(root) else {
        return vec![];
    };
    let mut removed = Vec::new();
    for c in containers.iter().filter(|c| container_abandoned(c)) {
        match removal::remove_dir(&c.dir.dir) {
            Ok(true) => removed.push(c.dir.id.clone()),
            Ok(false) => {}
            Err(e) => tracing::warn!("state left by a killed create: {e}"),
        }
    }
    removed
}

/// `delete` of `id` passed through to the lower runtime: an engine gives up on a container whose create
/// never finished. Its state without an owner goes; state with an owner is the container's poststop's.
/// Ok(true) when removed.
pub fn remove_ownerless(root: &StateRoot, id: &str) -> Result<bool, RemoveError> {
    let dir = root.container_dir(id)?;
    if !dir.is_dir() {
        return Ok(false);
    }
    match hostfile::load_limits(&root.limits_path(id)?) {
        Ok(l) if l.init_pid.is_none() => removal::remove_dir(&dir),
        _ => Ok(false),
    }
}
