//! The compute share wall at work in the monitor: at each collection it measures every container GPU with
//! a share (NVML's per-process SM utilisation of the processes the watchdog attributed to it, summed),
//! hands the figures to the wall (`share_wall`), logs a finding once when it begins, and under the
//! `freeze` mode freezes the container's cgroup for the time the wall says (`freezer`), thawing it when
//! that time is up (the collector's sleep wakes for it: `sleep`). It owns what the scrape shows of the
//! wall (`ShareView`, registered by `metrics`). Not here: the decisions (`share_wall`), the cgroup files
//! (`freezer`), attribution (`watchdog`).

use super::freezer;
use super::share_wall::{Over, Settings, Use, Wall};
use super::state::ContainerState;
use super::watchdog::Truth;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use vgpu_host::config::ShareWall;
use vgpu_host::nvml::GpuReading;
use vgpu_ledger::envcompute::DEFAULT_WINDOW_MS;

/// Label pairs of one series (their values escaped when encoded).
pub use crate::labels::Labels;

/// The wall in the monitor.
pub struct ShareRun {
    mode: ShareWall,
    inner: Mutex<Inner>,
}

struct Inner {
    wall: Wall,
    /// Containers this monitor froze: id → (cgroup directory, thaw at).
    frozen: BTreeMap<String, (PathBuf, Instant)>,
    /// Findings that began.
    events: u64,
    freezes: u64,
    failures: u64,
}

/// What the scrape shows of the wall.
#[derive(Debug, Clone, Default)]
pub struct ShareView {
    /// Per container GPU with a share: labels, use over the window (None: not measured yet), GPU-seconds
    /// past the allowance, frozen by the wall.
    pub gpus: Vec<(Labels, Option<f64>, f64, bool)>,
    pub freezes: u64,
    pub failures: u64,
    /// Findings that began, and the labels of those open.
    pub events: u64,
    pub open: Vec<Labels>,
    /// The wall runs (not `off`).
    pub on: bool,
}

fn log(msg: &str) {
    eprintln!("vgpuctl monitor: {msg}");
}

impl ShareRun {
    pub fn new(mode: ShareWall, settings: Settings) -> ShareRun {
        ShareRun {
            mode,
            inner: Mutex::new(Inner {
                wall: Wall::new(settings),
                frozen: BTreeMap::new(),
                events: 0,
                freezes: 0,
                failures: 0,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One pass over a collection: measure, decide, act. Nothing while off or without NVML.
    pub fn pass(&self, cs: &[ContainerState], truth: &Truth, gpus: Option<&[GpuReading]>) {
        let Some(gpus) = gpus.filter(|_| self.mode != ShareWall::Off) else {
            return;
        };
        let now = Instant::now();
        let uses = measure(cs, truth, gpus);
        let mut w = self.lock();
        let overs = w.wall.pass(now, &uses);
        for o in overs {
            let Some(c) = cs.iter().position(|c| c.id == o.container) else {
                continue;
            };
            let dir = (self.mode == ShareWall::Freeze).then(|| cgroup_of(cs, c));
            if o.begins {
                w.events += 1;
                log(&describe(&cs[c], &o, &dir, w.wall.settings().tolerance));
            }
            let Some(dir) = dir else { continue };
            let until = now + o.freeze_for;
            if let Some(f) = w.frozen.get_mut(&o.container) {
                // Frozen already for another of its GPUs: held the longer of the two.
                f.1 = f.1.max(until);
                continue;
            }
            let r = dir.and_then(freezer::freeze_for_wall);
            match r {
                Ok(None) => {}
                Ok(Some(d)) => {
                    w.frozen.insert(o.container.clone(), (d, until));
                    w.freezes += 1;
                }
                Err(e) => {
                    w.failures += 1;
                    log(&format!("share wall: container {}: {e}", o.container));
                }
            }
        }
        // A frozen container that is gone is forgotten (its cgroup went with it).
        w.frozen.retain(|id, _| cs.iter().any(|c| &c.id == id));
        drop(w);
        self.thaw_due(now);
    }

    /// Thaws the containers whose time is up.
    pub fn thaw_due(&self, now: Instant) {
        let mut w = self.lock();
        let due: Vec<String> = w
            .frozen
            .iter()
            .filter(|(_, f)| f.1 <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in due {
            if let Some((dir, _)) = w.frozen.remove(&id) {
                // A cgroup that is gone has nothing left to thaw.
                if let Err(e) = freezer::set_frozen(&dir, false) {
                    if dir.exists() {
                        w.failures += 1;
                        log(&format!("share wall: cannot thaw {}: {e}", dir.display()));
                    }
                }
            }
        }
    }

    /// Thaws every container this monitor froze (the monitor stops).
    pub fn thaw_all(&self) {
        let far = Instant::now() + Duration::from_secs(1 << 30);
        self.thaw_due(far);
    }

    /// Sleeps `interval`, waking to thaw containers when their time is up.
    pub fn sleep(&self, interval: Duration) {
        let end = Instant::now() + interval;
        loop {
            let now = Instant::now();
            if now >= end {
                return;
            }
            let next = self.lock().frozen.values().map(|f| f.1).min();
            let wake = next.map_or(end, |t| t.min(end));
            std::thread::sleep(wake.saturating_duration_since(now));
            self.thaw_due(Instant::now());
        }
    }

    /// The scrape's view; `labels` gives a container GPU's labels.
    pub fn view(
        &self,
        cs: &[ContainerState],
        labels: impl Fn(usize, usize) -> Labels,
    ) -> ShareView {
        let w = self.lock();
        let now = Instant::now();
        let mut v = ShareView {
            freezes: w.freezes,
            failures: w.failures,
            events: w.events,
            on: self.mode != ShareWall::Off,
            ..Default::default()
        };
        if !v.on {
            return v;
        }
        for (c, cs) in cs.iter().enumerate() {
            for (g, gs) in cs.gpus.iter().enumerate() {
                if gs.compute_limit.is_none() {
                    continue;
                }
                let l = labels(c, g);
                if w.wall.open(&cs.id, &gs.uuid, now) {
                    v.open.push(l.clone());
                }
                v.gpus.push((
                    l,
                    w.wall.used_ratio(&cs.id, &gs.uuid),
                    w.wall.excess_total(&cs.id, &gs.uuid),
                    w.frozen.contains_key(&cs.id),
                ));
            }
        }
        v
    }
}

impl ShareView {
    /// Registers the wall's series.
    pub fn register(&self, reg: &mut Registry) {
        if !self.on {
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
        let frozen = Family::<Labels, Gauge>::default();
        reg.register(
            "vgpu_container_frozen",
            "1 while the share wall holds the container's cgroup frozen",
            frozen.clone(),
        );
        for (l, u, e, f) in &self.gpus {
            if let Some(u) = u {
                used.get_or_create(l).set(*u);
            }
            excess.get_or_create(l).inc_by(*e);
            frozen.get_or_create(l).set(i64::from(*f));
        }
        let freezes = Counter::<u64>::default();
        reg.register(
            "vgpu_compute_share_freezes",
            "cgroup freezes by the share wall",
            freezes.clone(),
        );
        freezes.inc_by(self.freezes);
        let failures = Counter::<u64>::default();
        reg.register(
            "vgpu_compute_share_freeze_failures",
            "freezes and thaws the share wall could not do",
            failures.clone(),
        );
        failures.inc_by(self.failures);
    }
}

/// Each container GPU with a share whose process list NVML gave: the processes' utilisation summed.
/// NVML without samples for the GPU counts as idle (no evidence of use, no action).
fn measure(cs: &[ContainerState], truth: &Truth, gpus: &[GpuReading]) -> Vec<Use> {
    let mut out = Vec::new();
    for (c, cstate) in cs.iter().enumerate() {
        for (g, gs) in cstate.gpus.iter().enumerate() {
            let Some(pct) = gs.compute_limit else {
                continue;
            };
            if !truth.knows(&gs.uuid) {
                continue;
            }
            let samples = gpus
                .iter()
                .find(|r| r.uuid == gs.uuid)
                .and_then(|r| r.process_utilization.as_deref())
                .unwrap_or_default();
            let busy: f64 = truth.by_gpu.get(&(c, g)).map_or(0.0, |ps| {
                ps.iter()
                    .filter_map(|p| samples.iter().find(|s| s.0 == p.pid))
                    .map(|s| s.1)
                    .sum()
            });
            let share = f64::from(pct.min(100)) / 100.0;
            let window = f64::from(gs.compute_window_ms.unwrap_or(DEFAULT_WINDOW_MS)) / 1000.0;
            out.push(Use {
                container: cstate.id.clone(),
                gpu: gs.uuid.clone(),
                share,
                busy: busy.min(1.0),
                burst: share * (1.0 - share) * window,
            });
        }
    }
    out
}

/// Container `c`'s cgroup directory: the cgroup v2 path recorded at its creation (a container without
/// one is reported, never frozen: nothing else is known to hold only its processes).
fn cgroup_of(cs: &[ContainerState], c: usize) -> Result<PathBuf, String> {
    let mount = freezer::host_v2_mount().ok_or("no cgroup v2 hierarchy is mounted")?;
    let recorded = cs[c]
        .cgroup
        .as_deref()
        .ok_or("no cgroup of its own was recorded at its creation")?;
    freezer::of_container(recorded, &mount)
        .ok_or_else(|| format!("its recorded cgroup {recorded:?} is not one to freeze"))
}

/// The finding's log line.
fn describe(
    c: &ContainerState,
    o: &Over,
    dir: &Option<Result<PathBuf, String>>,
    tol: f64,
) -> String {
    let gpu = c
        .gpus
        .iter()
        .find(|g| g.uuid == o.gpu)
        .map_or(0, |g| g.index);
    let who = match &c.names {
        Some(n) => format!(
            "container {} (pod {}/{}, container {})",
            c.id, n.namespace, n.pod, n.container
        ),
        None => format!("container {}", c.id),
    };
    let action = match dir {
        None => "reporting only".to_string(),
        Some(Ok(d)) => format!(
            "freezing {} for {:.1} s",
            d.display(),
            o.freeze_for.as_secs_f64()
        ),
        Some(Err(e)) => format!("cannot freeze it: {e}"),
    };
    format!(
        "over its compute share: {who} GPU {gpu} ({}): its processes used {:.2} s of GPU time in the last {:.1} s (NVML), share {}% + {} points: {action}",
        o.gpu,
        o.used,
        o.span,
        (o.share * 100.0).round(),
        tol * 100.0
    )
}
