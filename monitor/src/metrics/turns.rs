//! The time-quanta arbiter's series (`vgpu_turn_*`), from what it shows at a scrape (`turns::view`). Not
//! here: the arbiter (`turns`).

use crate::labels::Labels;
use crate::turns::view::TurnsView;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// Registers the series; `gpu` gives a GPU's labels, `member` a container GPU's.
pub fn register(
    view: &TurnsView,
    reg: &mut Registry,
    gpu: impl Fn(&str) -> Labels,
    member: impl Fn(usize, usize) -> Labels,
) {
    if !view.on {
        return;
    }
    let int = |reg: &mut Registry, name: &str, help: &str| {
        let f = Family::<Labels, Gauge>::default();
        reg.register(name, help, f.clone());
        f
    };
    let count = |reg: &mut Registry, name: &str, help: &str| {
        let f = Family::<Labels, Counter>::default();
        reg.register(name, help, f.clone());
        f
    };
    let contended = int(
        reg,
        "vgpu_turn_contended",
        "1 while the GPU's oversubscribed containers take turns (two or more want it and memory is short)",
    );
    let queue = int(
        reg,
        "vgpu_turn_queue_length",
        "oversubscribed containers waiting for their turn on the GPU",
    );
    let grants = count(reg, "vgpu_turn_grants", "turns granted on the GPU");
    let revocations = count(
        reg,
        "vgpu_turn_revocations",
        "holders frozen for not giving the GPU back within the grace after their quantum",
    );
    let out_of_turn = count(
        reg,
        "vgpu_turn_out_of_turn",
        "containers frozen for using the GPU while told to wait (NVML)",
    );
    let ran_on = count(
        reg,
        "vgpu_turn_busy_while_frozen",
        "freezes of the arbiter whose container's work ran on while frozen (NVML busy past the grace)",
    );
    for (uuid, c, q, g, r, o, f) in &view.gpus {
        let l = gpu(uuid);
        contended.get_or_create(&l).set(i64::from(*c));
        queue.get_or_create(&l).set(*q as i64);
        grants.get_or_create(&l).inc_by(*g);
        revocations.get_or_create(&l).inc_by(*r);
        out_of_turn.get_or_create(&l).inc_by(*o);
        ran_on.get_or_create(&l).inc_by(*f);
    }
    let holder = int(
        reg,
        "vgpu_turn_holder",
        "1 while the container holds the oversubscribed GPU's turn",
    );
    let frozen = int(
        reg,
        "vgpu_turn_frozen",
        "1 while the time-quanta arbiter holds the container's cgroup frozen",
    );
    let waited = Family::<Labels, Counter<f64, AtomicU64>>::default();
    reg.register(
        "vgpu_turn_wait_seconds",
        "time the container wanted the GPU and waited for its turn, as the arbiter measured it",
        waited.clone(),
    );
    for (c, g, h, w, f) in &view.members {
        let l = member(*c, *g);
        holder.get_or_create(&l).set(i64::from(*h));
        frozen.get_or_create(&l).set(i64::from(*f));
        waited.get_or_create(&l).inc_by(*w);
    }
    let failures = Counter::<u64>::default();
    reg.register(
        "vgpu_turn_failures",
        "turn writes, freezes and thaws the arbiter could not make",
        failures.clone(),
    );
    failures.inc_by(view.failures);
}
