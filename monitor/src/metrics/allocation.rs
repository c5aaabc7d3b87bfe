//! HAMi's scheduler series (`hami_gpu_*`, `hami_node_gpu_*`): what the node's containers commit on each
//! GPU, the figures HAMi's dashboard (`hami-vgpu-dashboard.json`) reads from HAMi's scheduler. Here they
//! come from what vgpu's admission counts (`vgpu_host::admission::committed`): every container folder of
//! the state root, its memory quota on each GPU it lists, and its compute share; so a Prometheus that
//! scrapes vgpu's monitors shows HAMi's dashboard whole, with no HAMi scheduler.
//!
//! Labels and scale are HAMi's (its `cmd/scheduler/metrics.go`, registered under `zone="vGPU"`): `node`,
//! `device_uuid`, `device_index` (NVML's), `device_type` as HAMi's device plugin writes it (NVML's name,
//! `NVIDIA-` put before it when it does not start with `NVIDIA`); cores on HAMi's 0-100 scale per GPU;
//! memory in bytes. Served for the GPUs NVML lists (without NVML a GPU's memory and index are unknown).
//! Not here: the per-container figures (`super::render_with`), the reading (`vgpu_host::usage`).

use crate::labels::{Labels, HAMI_ZONE};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicU64;
use vgpu_host::nvml::GpuReading;
use vgpu_host::usage::{ContainerState, Origin};

/// HAMi's cores of a whole GPU (its device plugin's `devcore`, 100 × a core scaling of 1).
pub const GPU_CORES: u32 = 100;

/// What the containers of the state root commit on one GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Commitment {
    /// Memory quotas, bytes (a GPU listed for its compute share alone commits none, as in admission).
    pub memory: u64,
    /// Compute shares' requests, percent of the GPU (a limit alone is its own request; past 100 no one
    /// can get its floor).
    pub cores: u32,
    /// Containers that list the GPU (HAMi's "containers sharing this GPU").
    pub containers: u64,
}

/// What every container commits, by GPU UUID: the quotas admission counts (plain, spill and oversubscribe
/// alike) and the compute shares.
pub fn commitments(cs: &[ContainerState]) -> BTreeMap<&str, Commitment> {
    let mut by_gpu: BTreeMap<&str, Commitment> = BTreeMap::new();
    // Containers of HAMi's folders are HAMi's scheduler's to count (vgpu's admission never saw them).
    for c in cs.iter().filter(|c| c.origin == Origin::StateRoot) {
        let mut seen = BTreeSet::new();
        for g in &c.gpus {
            let e = by_gpu.entry(g.uuid.as_str()).or_default();
            e.memory = e.memory.saturating_add(g.limit.unwrap_or(0));
            e.cores = e
                .cores
                .saturating_add(g.request_limit().map_or(0, |(r, _)| r));
            if seen.insert(g.uuid.as_str()) {
                e.containers += 1;
            }
        }
    }
    by_gpu
}

/// `device_type` as HAMi's device plugin registers it: NVML's name, with `NVIDIA-` before it when it does
/// not start with `NVIDIA` (its `register.go`).
pub fn device_type(name: &str) -> String {
    if name.starts_with("NVIDIA") {
        name.to_string()
    } else {
        format!("NVIDIA-{name}")
    }
}

/// The labels of a GPU on HAMi's scheduler series.
fn labels(node: &str, r: &GpuReading) -> Labels {
    vec![
        ("zone", HAMI_ZONE.into()),
        ("node", node.into()),
        ("device_uuid", r.uuid.clone().into()),
        ("device_index", r.index.to_string().into()),
        ("device_type", device_type(&r.name).into()),
    ]
}

type IntFamily = Family<Labels, Gauge>;
type RatioFamily = Family<Labels, Gauge<f64, AtomicU64>>;

fn family<F: Default + Clone + prometheus_client::registry::Metric>(
    reg: &mut Registry,
    name: &str,
    help: &str,
) -> F {
    let f = F::default();
    reg.register(name, help, f.clone());
    f
}

fn bytes(v: u64) -> i64 {
    v.min(i64::MAX as u64) as i64
}

/// Registers HAMi's scheduler series for every GPU NVML lists (`gpus`; none without NVML), on node
/// `node`, from what `containers` commit.
pub fn register(
    node: &str,
    containers: &[ContainerState],
    gpus: Option<&[GpuReading]>,
    reg: &mut Registry,
) {
    let Some(gpus) = gpus else { return };
    let limit: IntFamily = family(
        reg,
        "hami_gpu_memory_limit_bytes",
        "Device memory limit for a certain GPU: its memory (NVML), HAMi's labels",
    );
    let core_limit: RatioFamily = family(
        reg,
        "hami_gpu_core_limit_ratio",
        "Device core limit for a certain GPU: 100, HAMi's scale",
    );
    let allocated: IntFamily = family(
        reg,
        "hami_gpu_memory_allocated_bytes",
        "Device memory allocated for a certain GPU: the memory quotas committed on it (vgpu's admission)",
    );
    let shared: IntFamily = family(
        reg,
        "hami_gpu_shared_count",
        "Number of containers sharing this GPU (containers whose state lists it)",
    );
    let core_allocated: RatioFamily = family(
        reg,
        "hami_gpu_core_allocated_ratio",
        "Device core allocated for a certain GPU: the compute shares committed on it, 0-100 a GPU",
    );
    let overview: IntFamily = family(
        reg,
        "hami_node_gpu_overview",
        "GPU overview on a certain node: memory allocated, with the GPU's cores and memory (MiB) as labels",
    );
    let allocated_ratio: RatioFamily = family(
        reg,
        "hami_node_gpu_memory_allocated_ratio",
        "GPU Memory Allocated Percentage on a certain GPU, 0-1: quotas committed over its memory",
    );
    let committed = commitments(containers);
    for r in gpus {
        let c = committed.get(r.uuid.as_str()).cloned().unwrap_or_default();
        let l = labels(node, r);
        limit.get_or_create(&l).set(bytes(r.total));
        core_limit.get_or_create(&l).set(f64::from(GPU_CORES));
        let mut with_cores = l.clone();
        with_cores.insert(4, ("device_cores", GPU_CORES.to_string().into()));
        allocated.get_or_create(&with_cores).set(bytes(c.memory));
        shared.get_or_create(&l).set(bytes(c.containers));
        core_allocated.get_or_create(&l).set(f64::from(c.cores));
        let mut over = with_cores;
        over.insert(
            5,
            ("device_memory_limit", (r.total >> 20).to_string().into()),
        );
        overview.get_or_create(&over).set(bytes(c.memory));
        if r.total > 0 {
            allocated_ratio
                .get_or_create(&l)
                .set(c.memory as f64 / r.total as f64);
        }
    }
}

#[cfg(test)]
mod tests;
