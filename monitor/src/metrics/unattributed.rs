//! The series of memory no process's figure shows (`crate::unattributed`): per host GPU its remainder, the
//! per-process figures it is measured against and the driver's reserve, with HAMi's host labels as the
//! other host GPU series; per container GPU the part it likely holds. Not here: the figures themselves.

use super::{container_labels, host_labels, IntFamily};
use crate::unattributed::Remainder;
use prometheus_client::registry::Registry;
use vgpu_host::nvml::GpuReading;
use vgpu_host::usage::ContainerState;

/// Registers the series of `rs` (one per GPU whose processes NVML listed, each with a figure).
pub fn register(
    node: &str,
    gpus: &[GpuReading],
    containers: &[ContainerState],
    rs: &[Remainder],
    reg: &mut Registry,
) {
    let int = |reg: &mut Registry, name: &str, help: &str| {
        let f = IntFamily::default();
        reg.register(name, help, f.clone());
        f
    };
    let unattributed = int(
        reg,
        "vgpu_host_gpu_memory_unattributed_bytes",
        "GPU memory in use that no process's NVML figure shows: used - driver reserve - every listed process's figure (exported handles kept after their release, managed memory, the driver's references)",
    );
    let processes = int(
        reg,
        "vgpu_host_gpu_memory_processes_bytes",
        "GPU memory NVML's per-process figures add up to, every process listed (containers' and the host's)",
    );
    let reserved = int(
        reg,
        "vgpu_host_gpu_memory_reserved_bytes",
        "GPU memory the driver and firmware reserve, part of hami_host_gpu_memory_used_bytes (NVML's memory info v2; absent where NVML cannot tell)",
    );
    let likely = int(
        reg,
        "vgpu_container_gpu_memory_unattributed_likely_bytes",
        "the part of its GPU's unattributed memory the container likely holds: its ledger's charge past its processes' NVML figures, at most the remainder (a hint from a file the tenant writes; only while the remainder is past the threshold)",
    );
    for r in rs {
        let Some(reading) = gpus.iter().find(|g| g.uuid == r.uuid) else {
            continue;
        };
        let l = host_labels(node, reading);
        super::set(&unattributed, &l, r.unattributed);
        super::set(&processes, &l, r.processes);
        if reading.reserved.is_some() {
            super::set(&reserved, &l, r.reserved);
        }
        for h in &r.holders {
            let Some(c) = containers.get(h.c) else {
                continue;
            };
            super::set(&likely, &container_labels(c, h.g), h.likely);
        }
    }
}
