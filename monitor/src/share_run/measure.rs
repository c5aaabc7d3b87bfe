//! What the share wall measures of each container GPU with a share, from NVML's per-process samples of the
//! processes the watchdog attributed to it (`measure`), with the GPU's own busy time, and which of its
//! processes NVML shows busy (`busy_procs`, the kill policy's victims). Only a share the host recorded
//! counts (a state root's limits file, a HAMi container's bundle spec). Not here: what the wall decides of
//! the figures (`crate::share_wall`).

use crate::share_wall::Use;
use std::collections::BTreeMap;
use vgpu_host::attribution::{TrueProc, Truth};
use vgpu_host::nvml::GpuReading;
use vgpu_host::usage::ContainerState;
use vgpu_ledger::envcompute::DEFAULT_WINDOW_MS;

/// NVML's utilisation samples of GPU `uuid` (none: NVML had none).
fn samples_of<'a>(gpus: &'a [GpuReading], uuid: &str) -> &'a [(u32, f64)] {
    gpus.iter()
        .find(|r| r.uuid == uuid)
        .and_then(|r| r.process_utilization.as_deref())
        .unwrap_or_default()
}

/// Container `c`'s processes on its GPU `g` (`uuid`) that NVML's samples show busy.
pub(super) fn busy_procs(
    truth: &Truth,
    gpus: &[GpuReading],
    c: usize,
    g: usize,
    uuid: &str,
) -> Vec<TrueProc> {
    let samples = samples_of(gpus, uuid);
    truth.by_gpu.get(&(c, g)).map_or(vec![], |ps| {
        ps.iter()
            .filter(|p| samples.iter().any(|s| s.0 == p.pid && s.1 > 0.0))
            .copied()
            .collect()
    })
}

/// How busy GPU `uuid` was, 0–1, every process on it: NVML's device utilisation or its processes'
/// samples summed, whichever is more (either may be missing; none: idle, no evidence).
fn gpu_busy(gpus: &[GpuReading], uuid: &str) -> f64 {
    let device = gpus
        .iter()
        .find(|r| r.uuid == uuid)
        .and_then(|r| r.utilization)
        .unwrap_or(0.0);
    let procs: f64 = samples_of(gpus, uuid).iter().map(|s| s.1).sum();
    device.max(procs).clamp(0.0, 1.0)
}

/// Each container GPU with a share whose process list NVML gave: the processes' utilisation summed, and
/// how long the container was frozen since the last pass (`frozen`, by container id).
/// NVML without samples for the GPU counts as idle (no evidence of use, no action).
pub(super) fn measure(
    cs: &[ContainerState],
    truth: &Truth,
    gpus: &[GpuReading],
    frozen: &BTreeMap<String, f64>,
) -> Vec<Use> {
    let mut out = Vec::new();
    // Only a share the host recorded (a state root's limits file, a HAMi container's bundle spec).
    for (c, cstate) in cs.iter().enumerate().filter(|(_, c)| c.enforced()) {
        for (g, gs) in cstate.gpus.iter().enumerate() {
            let Some((request, limit)) = gs.request_limit() else {
                continue;
            };
            if !truth.knows(&gs.uuid) {
                continue;
            }
            let samples = samples_of(gpus, &gs.uuid);
            let busy: f64 = truth.by_gpu.get(&(c, g)).map_or(0.0, |ps| {
                ps.iter()
                    .filter_map(|p| samples.iter().find(|s| s.0 == p.pid))
                    .map(|s| s.1)
                    .sum()
            });
            let share = f64::from(limit.min(100)) / 100.0;
            let window = f64::from(gs.compute_window_ms.unwrap_or(DEFAULT_WINDOW_MS)) / 1000.0;
            out.push(Use {
                container: cstate.id.clone(),
                gpu: gs.uuid.clone(),
                share,
                request: f64::from(request.min(limit)) / 100.0,
                requested: gs.compute_request.is_some(),
                busy: busy.min(1.0),
                gpu_busy: gpu_busy(gpus, &gs.uuid),
                burst: share * (1.0 - share) * window,
                frozen: frozen.get(&cstate.id).copied().unwrap_or(0.0),
            });
        }
    }
    out
}
