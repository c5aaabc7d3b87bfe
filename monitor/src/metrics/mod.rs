//! One scrape's text: the HAMi-compatible series (`hami_*`, so existing dashboards work) and ours
//! (`vgpu_*`), encoded with `prometheus-client` in the OpenMetrics text format. Built at each scrape from
//! the collector's last reading of the state root and NVML; the watchdog's counters and open findings come
//! from its passes. Every family is registered in this room: the compute share wall's in `share`, the
//! time-quanta arbiter's in `turns`, memory no process's figure shows in `unattributed`. Not here: reading anything (`vgpu_host::usage`, `nvml`), deciding
//! (`watchdog`), HTTP (`http`).

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::time::Duration;
use vgpu_host::attribution::Truth;
use vgpu_host::nvml::GpuReading;
use vgpu_host::usage::ContainerState;
use vgpu_ledger::Kind;

pub use crate::labels::{Labels, Value, HAMI_ZONE};

pub mod allocation;
pub mod share;
pub mod turns;
pub mod unattributed;

type IntFamily = Family<Labels, Gauge>;
type RatioFamily = Family<Labels, Gauge<f64, AtomicU64>>;
type SecondsFamily = Family<Labels, Counter<f64, AtomicU64>>;

/// What the watchdog loop has counted and still sees, for the scrape.
#[derive(Debug, Clone, Default)]
pub struct WatchdogView {
    /// Findings that began (an episode counts once), by kind.
    pub events: Vec<(&'static str, u64)>,
    pub kills: u64,
    pub kill_failures: u64,
    /// Open findings: (container id, GPU uuid, container GPU index, kind), with the container's labels.
    pub open: Vec<(Labels, &'static str)>,
    pub passes: u64,
}

/// What vgpuctl was built from, for `vgpu_build_info`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuildInfo {
    pub version: &'static str,
    /// The git commit (12 hex digits), or "unknown" outside a checkout.
    pub commit: &'static str,
}

impl Default for BuildInfo {
    fn default() -> Self {
        BuildInfo {
            version: env!("CARGO_PKG_VERSION"),
            commit: "unknown",
        }
    }
}

/// Everything one scrape shows.
pub struct Scrape<'a> {
    pub build: BuildInfo,
    /// The node's name, HAMi's `node` label (`[monitor] node`, default the host name).
    pub node: &'a str,
    pub containers: &'a [ContainerState],
    /// `None`: NVML is not loaded or could not be read.
    pub gpus: Option<&'a [GpuReading]>,
    pub truth: &'a Truth,
    pub watchdog: &'a WatchdogView,
    /// The compute share wall's figures.
    pub share: &'a super::share_run::ShareView,
    pub state_error: Option<&'a str>,
    /// The reading's age and cost (`None`: read for this scrape).
    pub collection: Option<Collection>,
}

/// How old the reading a scrape shows is, and what reading it cost.
#[derive(Debug, Clone, Copy)]
pub struct Collection {
    pub age: Duration,
    pub took: Duration,
}

/// The labels of a container's GPU: HAMi's (`namespace`, `pod`, `container`, `vdevice_index`,
/// `device_uuid`) and the container id. Outside Kubernetes, `container` is Docker's name for it, else the
/// container id.
pub fn container_labels(c: &ContainerState, g: usize) -> Labels {
    let names = c.names.clone().unwrap_or_default();
    let gpu = &c.gpus[g];
    let container = match (names.container.is_empty(), &c.docker_name) {
        (false, _) => names.container,
        (true, Some(d)) => d.clone(),
        (true, None) => c.id.clone(),
    };
    vec![
        ("namespace", names.namespace.into()),
        ("pod", names.pod.into()),
        ("container", container.into()),
        ("container_id", c.id.clone().into()),
        ("vdevice_index", gpu.index.to_string().into()),
        ("device_uuid", gpu.uuid.clone().into()),
    ]
}

/// The labels of a container's GPU on a `hami_*` series: exactly HAMi's vGPU monitor's (`zone`,
/// `namespace`, `pod`, `container`, `vdevice_index`, `device_uuid`), no container id.
pub fn hami_container_labels(c: &ContainerState, g: usize) -> Labels {
    let mut l = container_labels(c, g);
    l.retain(|(k, _)| *k != "container_id");
    l.insert(0, ("zone", HAMI_ZONE.into()));
    l
}

/// The labels of a host GPU: HAMi's (`zone`, `node`, `device_index`, `device_uuid`, `device_type` as
/// HAMi writes it: `NVIDIA-` and NVML's name).
pub fn host_labels(node: &str, r: &GpuReading) -> Labels {
    vec![
        ("zone", HAMI_ZONE.into()),
        ("node", node.into()),
        ("device_index", r.index.to_string().into()),
        ("device_uuid", r.uuid.clone().into()),
        ("device_type", format!("NVIDIA-{}", r.name).into()),
    ]
}

/// Which container GPU each `hami_*` container series shows. HAMi's labels carry no container id, so two
/// containers of one pod and name (an exited container the engine keeps beside its restart) would be one
/// series: the one with live ledger slots wins, then the larger charge. Our own `vgpu_*` series, keyed by
/// `container_id`, show every one.
fn hami_winners(cs: &[ContainerState]) -> std::collections::BTreeSet<(usize, usize)> {
    /// (has live slots, total) and (container, GPU) of the best so far.
    type Best = ((bool, u64), (usize, usize));
    let mut best: std::collections::BTreeMap<Labels, Best> = Default::default();
    for (ci, c) in cs.iter().enumerate() {
        for (gi, g) in c.gpus.iter().enumerate() {
            let rank = (!g.owners.is_empty(), g.total);
            let e = best
                .entry(hami_container_labels(c, gi))
                .or_insert((rank, (ci, gi)));
            if rank > e.0 {
                *e = (rank, (ci, gi));
            }
        }
    }
    best.into_values().map(|(_, at)| at).collect()
}

fn with(mut l: Labels, k: &'static str, v: impl Into<Value>) -> Labels {
    l.push((k, v.into()));
    l
}

fn int(reg: &mut Registry, name: &str, help: &str) -> IntFamily {
    let f = IntFamily::default();
    reg.register(name, help, f.clone());
    f
}

fn ratio(reg: &mut Registry, name: &str, help: &str) -> RatioFamily {
    let f = RatioFamily::default();
    reg.register(name, help, f.clone());
    f
}

fn plain(reg: &mut Registry, name: &str, help: &str) -> Gauge {
    let g = Gauge::default();
    reg.register(name, help, g.clone());
    g
}

fn set(f: &IntFamily, l: &Labels, v: u64) {
    f.get_or_create(l).set(v.min(i64::MAX as u64) as i64);
}

/// `vgpu_hami_skipped_files`: files of HAMi's per-container folders the last collection skipped (served
/// while a folder of HAMi's is read).
pub fn hami_skipped(reg: &mut Registry, n: usize) {
    plain(
        reg,
        "vgpu_hami_skipped_files",
        "files of HAMi's per-container folders skipped: not a ledger of its name's GPU (a link, a FIFO, a file of the wrong size or header), or past the entries looked at",
    )
    .set(n as i64);
}

/// The scrape's text (OpenMetrics, ending in `# EOF`).
pub fn render(s: &Scrape) -> String {
    render_with(s, |_| {})
}

/// The scrape's text with the series `more` registers (a part of the monitor that shows its own, as the
/// time-quanta arbiter's `turns::view`).
pub fn render_with(s: &Scrape, more: impl FnOnce(&mut Registry)) -> String {
    let mut reg = Registry::default();
    let used = int(
        &mut reg,
        "hami_vgpu_memory_used_bytes",
        "GPU memory charged to the container's quota (its ledger's total), HAMi's labels",
    );
    let limit = int(
        &mut reg,
        "hami_vgpu_memory_limit_bytes",
        "the container's GPU memory quota, HAMi's labels",
    );
    let own_used = int(
        &mut reg,
        "vgpu_memory_used_bytes",
        "GPU memory charged to the container's quota (its ledger's total)",
    );
    let own_limit = int(
        &mut reg,
        "vgpu_memory_limit_bytes",
        "the container's GPU memory quota",
    );
    let host_used = int(
        &mut reg,
        "hami_host_gpu_memory_used_bytes",
        "GPU memory in use on the host GPU (NVML)",
    );
    let host_total = int(
        &mut reg,
        "vgpu_host_gpu_memory_total_bytes",
        "GPU memory of the host GPU (NVML)",
    );
    let host_util = ratio(
        &mut reg,
        "hami_host_gpu_utilization_ratio",
        "host GPU busy percentage, 0-100 as HAMi's (NVML)",
    );
    let ctr_util = ratio(
        &mut reg,
        "hami_container_device_utilization_ratio",
        "SM utilisation of the container's processes on the GPU, 0-100 as HAMi's (NVML per-process samples)",
    );
    let own_util = ratio(
        &mut reg,
        "vgpu_container_sm_utilization_ratio",
        "SM utilisation of the container's processes on the GPU, 0-1 (NVML per-process samples)",
    );
    let by_kind = int(
        &mut reg,
        "vgpu_memory_used_by_kind_bytes",
        "GPU memory charged to the container's quota, by kind",
    );
    let spilled = int(
        &mut reg,
        "vgpu_memory_spilled_bytes",
        "memory spilled past the quota into the container's host budget (spill mode)",
    );
    let slots = int(
        &mut reg,
        "vgpu_ledger_slots_bytes",
        "sum of the ledger's per-process counters (equals the total unless tampered with)",
    );
    let live = int(
        &mut reg,
        "vgpu_ledger_processes",
        "processes holding a slot of the container's ledger",
    );
    let truth = int(
        &mut reg,
        "vgpu_container_gpu_memory_nvml_bytes",
        "GPU memory the container's processes truly hold (NVML, host PIDs)",
    );
    let untracked = int(
        &mut reg,
        "vgpu_container_gpu_memory_untracked_bytes",
        "GPU memory held by container processes without a ledger slot (bypassing the library)",
    );
    let compute_limit = ratio(
        &mut reg,
        "vgpu_compute_limit_ratio",
        "the container's compute limit (its cap) of the GPU's time, 0-1 (limits.json; 1 for a request alone; only GPUs with a share)",
    );
    let compute_request = ratio(
        &mut reg,
        "vgpu_compute_request_ratio",
        "the container's compute request (its floor) of the GPU's time, 0-1 (limits.json; a limit alone is its own request; only GPUs with a share)",
    );
    let compute_charged = SecondsFamily::default();
    reg.register(
        "vgpu_compute_charged_seconds",
        "GPU time charged to the container's compute bucket (its launches' measured time)",
        compute_charged.clone(),
    );
    let compute_held = SecondsFamily::default();
    reg.register(
        "vgpu_compute_held_seconds",
        "time the container's launching threads were held back by its compute share, summed over threads",
        compute_held.clone(),
    );
    let compute_launches = Family::<Labels, Counter>::default();
    reg.register(
        "vgpu_compute_launches",
        "kernel and graph launches measured and charged to the container's compute bucket",
        compute_launches.clone(),
    );
    let refusals = Family::<Labels, Counter>::default();
    reg.register(
        "vgpu_memory_refusals",
        "allocations the container's quota refused (counted by its library in the ledger it can write)",
        refusals.clone(),
    );
    let updates = Family::<Labels, Counter>::default();
    reg.register(
        "vgpu_container_updates",
        "live updates of the container's quota or share (vgpuctl update)",
        updates.clone(),
    );
    let updated_at = int(
        &mut reg,
        "vgpu_container_last_update_timestamp_seconds",
        "when vgpuctl update last changed the container's quota or share, Unix seconds (only updated containers)",
    );
    let pending_shrink = int(
        &mut reg,
        "vgpu_memory_pending_shrink_bytes",
        "bytes the container's ledger holds past a quota vgpuctl update lowered below its use (refused until freed; only such GPUs)",
    );
    let errors = plain(
        &mut reg,
        "vgpu_state_errors",
        "containers or ledgers of the state root that could not be read",
    );
    let nvml_up = plain(
        &mut reg,
        "vgpu_nvml_up",
        "1 when NVML was read for the reading this scrape shows",
    );
    let unattributed = plain(
        &mut reg,
        "vgpu_nvml_unattributed_processes",
        "GPU processes of no container with a quota",
    );
    let open = int(
        &mut reg,
        "vgpu_watchdog_findings",
        "open watchdog findings (1 per container GPU and finding)",
    );
    let events = Family::<Labels, Counter>::default();
    reg.register(
        "vgpu_watchdog_events",
        "watchdog findings that began, by finding",
        events.clone(),
    );
    let kills = Counter::<u64>::default();
    reg.register(
        "vgpu_watchdog_kills",
        "processes killed under the kill policy (the memory watchdog's, the share wall's and the time-quanta arbiter's)",
        kills.clone(),
    );
    let kill_failures = Counter::<u64>::default();
    reg.register(
        "vgpu_watchdog_kill_failures",
        "kills the watchdog attempted that failed",
        kill_failures.clone(),
    );
    let passes = Counter::<u64>::default();
    reg.register(
        "vgpu_watchdog_passes",
        "watchdog passes run",
        passes.clone(),
    );

    let build = IntFamily::default();
    reg.register(
        "vgpu_build_info",
        "the vgpu version and git commit serving these metrics (always 1)",
        build.clone(),
    );
    set(
        &build,
        &vec![
            ("version", s.build.version.into()),
            ("commit", s.build.commit.into()),
        ],
        1,
    );
    let winners = hami_winners(s.containers);
    let mut n_errors = u64::from(s.state_error.is_some());
    for (ci, c) in s.containers.iter().enumerate() {
        n_errors += u64::from(c.error.is_some());
        for (gi, g) in c.gpus.iter().enumerate() {
            n_errors += u64::from(g.error.is_some());
            let l = container_labels(c, gi);
            let hami = winners
                .contains(&(ci, gi))
                .then(|| hami_container_labels(c, gi));
            set(&own_used, &l, g.total);
            if let Some(h) = &hami {
                set(&used, h, g.total);
            }
            if let Some(b) = g.limit {
                set(&own_limit, &l, b);
                if let Some(h) = &hami {
                    set(&limit, h, b);
                }
            }
            if let Some((request, limit)) = g.request_limit() {
                compute_limit
                    .get_or_create(&l)
                    .set(f64::from(limit) / 100.0);
                compute_request
                    .get_or_create(&l)
                    .set(f64::from(request) / 100.0);
                compute_charged
                    .get_or_create(&l)
                    .inc_by(g.compute.charged_ns as f64 / 1e9);
                compute_held
                    .get_or_create(&l)
                    .inc_by(g.compute.held_ns as f64 / 1e9);
                compute_launches
                    .get_or_create(&l)
                    .inc_by(g.compute.launches);
            }
            set(&slots, &l, g.slots_sum);
            set(&spilled, &l, g.spilled);
            set(&live, &l, g.owners.len() as u64);
            refusals.get_or_create(&l).inc_by(g.refusals);
            updates.get_or_create(&l).inc_by(c.updates);
            if let Some(t) = c.updated_at {
                set(&updated_at, &l, t);
            }
            if let (Some(b), Some(_)) = (g.limit, g.shrunk_from) {
                if g.total > b {
                    set(&pending_shrink, &l, g.total - b);
                }
            }
            // Kinds at zero are left out (most containers use two or three of the eight).
            for k in Kind::ALL.into_iter().filter(|k| g.by_kind[k.index()] > 0) {
                set(
                    &by_kind,
                    &with(l.clone(), "kind", k.name()),
                    g.by_kind[k.index()],
                );
            }
            if s.truth.knows(&g.uuid) {
                let procs = s.truth.by_gpu.get(&(ci, gi));
                let sum = |tracked: Option<bool>| -> u64 {
                    procs.map_or(0, |ps| {
                        ps.iter()
                            .filter(|p| tracked.is_none() || tracked == Some(p.tracked))
                            .map(|p| p.used)
                            .sum()
                    })
                };
                set(&truth, &l, sum(None));
                set(&untracked, &l, sum(Some(false)));
                let samples = s
                    .gpus
                    .unwrap_or_default()
                    .iter()
                    .find(|r| r.uuid == g.uuid)
                    .and_then(|r| r.process_utilization.as_ref());
                if let Some(samples) = samples {
                    let u: f64 = procs.map_or(0.0, |ps| {
                        ps.iter()
                            .filter_map(|p| samples.iter().find(|s| s.0 == p.pid))
                            .map(|s| s.1)
                            .sum()
                    });
                    own_util.get_or_create(&l).set(u.min(1.0));
                    if let Some(h) = &hami {
                        ctr_util.get_or_create(h).set(u.min(1.0) * 100.0);
                    }
                }
            }
        }
    }
    for r in s.gpus.unwrap_or_default() {
        let l = host_labels(s.node, r);
        set(&host_used, &l, r.used);
        set(&host_total, &l, r.total);
        if let Some(u) = r.utilization {
            host_util.get_or_create(&l).set(u * 100.0);
        }
    }
    errors.set(n_errors as i64);
    nvml_up.set(i64::from(s.gpus.is_some()));
    unattributed.set(s.truth.unattributed as i64);
    for (l, kind) in &s.watchdog.open {
        set(&open, &with(l.clone(), "finding", *kind), 1);
    }
    for (kind, n) in &s.watchdog.events {
        events
            .get_or_create(&vec![("finding", Value::from(*kind))])
            .inc_by(*n);
    }
    if let Some(c) = s.collection {
        let age = Gauge::<f64, AtomicU64>::default();
        reg.register(
            "vgpu_monitor_reading_age_seconds",
            "age of the reading this scrape shows (the collector reads once per interval)",
            age.clone(),
        );
        age.set(c.age.as_secs_f64());
        let took = Gauge::<f64, AtomicU64>::default();
        reg.register(
            "vgpu_monitor_collection_seconds",
            "time the collector took to read the state root and NVML and attribute the processes",
            took.clone(),
        );
        took.set(c.took.as_secs_f64());
    }
    allocation::register(s.node, s.containers, s.gpus, &mut reg);
    share::register(s.share, &mut reg);
    more(&mut reg);
    kills.inc_by(s.watchdog.kills);
    kill_failures.inc_by(s.watchdog.kill_failures);
    passes.inc_by(s.watchdog.passes);
    let mut out = String::with_capacity(64 * 1024);
    // Writing to a String cannot fail.
    let _ = encode(&mut out, &reg);
    out
}

#[cfg(test)]
mod tests;
