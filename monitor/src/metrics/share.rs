//! The compute share wall's series (`vgpu_compute_share_*`, `vgpu_container_frozen`), from what the wall
//! shows at a scrape (`share_run::ShareView`). Not here: the wall's decisions and passes (`share_wall`,
//! `share_run`).

use crate::labels::Labels;
use crate::share_run::ShareView;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// Registers the wall's series (none while the wall is off).
pub fn register(view: &ShareView, reg: &mut Registry) {
    if !view.on {
        return;
    }
    let used = Family::<Labels, Gauge<f64, AtomicU64>>::default();
    reg.register(
        "vgpu_compute_share_used_ratio",
        "share of the GPU's time the container's processes used over the share wall's window (NVML)",
        used.clone(),
    );
    let excess = Family::<Labels, Counter<f64, AtomicU64>>::default();
    reg.register(
        "vgpu_compute_share_excess_seconds",
        "GPU-seconds the container used past its share + tolerance (NVML, the share wall)",
        excess.clone(),
    );
    let frozen_busy = Family::<Labels, Counter<f64, AtomicU64>>::default();
    reg.register(
        "vgpu_compute_share_frozen_busy_seconds",
        "GPU-seconds the container used past its thawed time: work that ran on while the share wall held it frozen (NVML)",
        frozen_busy.clone(),
    );
    let borrowed = Family::<Labels, Gauge<f64, AtomicU64>>::default();
    reg.register(
        "vgpu_compute_share_borrowed_ratio",
        "share of the GPU's time the container's processes used past its compute request over the share wall's window (NVML; 0 within its request)",
        borrowed.clone(),
    );
    let borrowed_total = Family::<Labels, Counter<f64, AtomicU64>>::default();
    reg.register(
        "vgpu_compute_share_borrowed_seconds",
        "GPU-seconds the container used past its compute request: idle time lent by others (NVML, the share wall)",
        borrowed_total.clone(),
    );
    let frozen = Family::<Labels, Gauge>::default();
    reg.register(
        "vgpu_container_frozen",
        "1 while the share wall holds the container's cgroup frozen",
        frozen.clone(),
    );
    for g in &view.gpus {
        if let Some(u) = g.used {
            used.get_or_create(&g.labels).set(u);
            borrowed
                .get_or_create(&g.labels)
                .set((u - g.request).max(0.0));
        }
        borrowed_total.get_or_create(&g.labels).inc_by(g.borrowed);
        excess.get_or_create(&g.labels).inc_by(g.excess);
        frozen_busy.get_or_create(&g.labels).inc_by(g.frozen_busy);
        frozen.get_or_create(&g.labels).set(i64::from(g.frozen));
    }
    let freezes = Counter::<u64>::default();
    reg.register(
        "vgpu_compute_share_freezes",
        "cgroup freezes by the share wall",
        freezes.clone(),
    );
    freezes.inc_by(view.freezes);
    let failures = Counter::<u64>::default();
    reg.register(
        "vgpu_compute_share_freeze_failures",
        "freezes and thaws the share wall could not do",
        failures.clone(),
    );
    failures.inc_by(view.failures);
}
