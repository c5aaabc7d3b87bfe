//! What a container's processes truly hold on each of its GPUs now, by NVML, attributed exactly as the
//! monitor's watchdog attributes them (`attribution::attribute` over every container of the state root, the live ones
//! naming processes): `vgpuctl update` records it when it lowers a quota below that (limits.json's
//! `held_at_shrink`), the figure the watchdog then tolerates a pending shrink up to. Never from the
//! ledger, which the tenant can write. Not here: the decision (the monitor's `watchdog`), NVML itself
//! (`nvml`).

use crate::nvml::{GpuReading, Nvml, NvmlError};
use crate::procs::{self, HostProc};
use crate::state_root::StateRoot;
use crate::{attribution, usage};
use std::collections::BTreeMap;

/// Why what a container holds could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum HeldError {
    #[error(transparent)]
    Nvml(#[from] NvmlError),
    #[error("cannot read the state root: {0}")]
    State(#[from] std::io::Error),
}

/// Bytes container `id`'s processes hold now, by GPU UUID, over the GPUs of its limits whose processes
/// NVML listed (a GPU it could not list is absent: nothing is known there). A container whose recorded
/// init is gone names no process: 0 on each listed GPU.
pub fn held_by(
    root: &StateRoot,
    id: &str,
    nvml: &dyn Nvml,
) -> Result<BTreeMap<String, u64>, HeldError> {
    let readings = nvml.readings()?;
    held_with(
        root,
        id,
        &readings,
        procs::init_alive,
        procs::inspect,
        procs::own_ns(),
    )
}

/// `held_by` with the readings taken and `/proc` behind seams: `alive` is `procs::init_alive`, `inspect`
/// `procs::inspect`, `host_ns` the host's own PID namespace.
fn held_with(
    root: &StateRoot,
    id: &str,
    readings: &[GpuReading],
    alive: impl Fn(u32, u64, Option<u64>) -> bool,
    inspect: impl Fn(u32) -> Option<HostProc>,
    host_ns: u64,
) -> Result<BTreeMap<String, u64>, HeldError> {
    let mut containers = usage::read(root)?;
    usage::mark_live(&mut containers, alive);
    let truth = attribution::attribute(&containers, readings, inspect, host_ns);
    let Some(c) = containers.iter().position(|cs| cs.id == id) else {
        return Ok(BTreeMap::new());
    };
    Ok(containers[c]
        .gpus
        .iter()
        .enumerate()
        .filter(|(_, gs)| truth.knows(&gs.uuid))
        .map(|(g, gs)| (gs.uuid.clone(), truth.used(c, g)))
        .collect())
}

#[cfg(test)]
mod tests;
