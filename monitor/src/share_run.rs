//! The compute share wall at work in the monitor: at each collection it measures every container GPU with
//! a share (NVML's per-process SM utilisation of the processes the watchdog attributed to it, summed),
//! hands the figures to the wall (`share_wall`), logs a finding once when it begins, and under the
//! `freeze` mode freezes the container's cgroup for the time the wall says (`freezer`), thawing it when
//! that time is up (the collector's sleep wakes for it: `sleep`). It tells the wall how long each
//! container was frozen, since a freeze cannot stop GPU work already queued: a container GPU whose work
//! runs on while frozen is logged once (`busy_while_frozen`), and under the kill policy the processes
//! NVML shows busy there while it is frozen are named for the monitor to kill (`Victim`: the watchdog's
//! pidfd-checked kill). It owns what the scrape shows of the wall (`ShareView`, registered by `metrics::share`).
//! Each container GPU's share is its request and limit (a limit alone is its own request); the GPU's
//! own busy time (NVML's device utilisation, or its processes' summed) tells the wall whether the GPU was
//! saturated, so that a floor is starved only when the GPU had no idle time to give (`share_wall`,
//! "Floors"). Not here: the figures measured (`measure`), the log lines (`lines`), the decisions
//! (`share_wall`), the cgroup files (`freezer`), attribution (`watchdog`), the kill itself
//! (`Monitor::kill`).

mod lines;
mod measure;

use crate::freezer;
use crate::frozen::{Frozen, Record};
// The monitor's one log: control characters escaped (a pod name cannot forge a line).
use crate::share_wall::{Settings, Wall, Why};
use crate::stderr::log;
use lines::{describe, describe_runaway};
use measure::{busy_procs, measure};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use vgpu_host::attribution::{TrueProc, Truth};
use vgpu_host::config::ShareWall;
use vgpu_host::nvml::GpuReading;
use vgpu_host::usage::ContainerState;

/// Label pairs of one series (their values escaped when encoded).
pub use crate::labels::Labels;

/// The wall in the monitor.
pub struct ShareRun {
    mode: ShareWall,
    /// The monitor's kill policy: kill what runs on while frozen.
    kill: bool,
    /// Where what it holds frozen is recorded (`<root>/share-wall/frozen.json`), so that a monitor killed
    /// outright has it thawed by the next one (none: not recorded, the unit tests' walls).
    record: Option<Record>,
    inner: Mutex<Inner>,
}

struct Inner {
    wall: Wall,
    /// Containers this monitor froze, by id.
    frozen: BTreeMap<String, Held>,
    /// Seconds each container was frozen since the last pass, not yet handed to the wall.
    frozen_secs: BTreeMap<String, f64>,
    /// Findings that began: `over_share`, `busy_while_frozen`, `over_entitlement`.
    events: u64,
    runaway_events: u64,
    floor_events: u64,
    freezes: u64,
    failures: u64,
}

/// A container this monitor holds frozen.
struct Held {
    /// Its cgroup directory.
    dir: PathBuf,
    /// When to thaw it.
    until: Instant,
    /// Its frozen time is counted up to then (`Inner::take_frozen_secs`).
    counted: Instant,
}

/// A process to kill under the kill policy: NVML shows it busy on GPU `g` of container `c` (indices into
/// the collection's containers) while the container is frozen and its work runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Victim {
    pub c: usize,
    pub g: usize,
    pub proc_: TrueProc,
}

/// What the scrape shows of the wall.
#[derive(Debug, Clone, Default)]
pub struct ShareView {
    pub gpus: Vec<GpuView>,
    pub freezes: u64,
    pub failures: u64,
    /// Findings that began, and the labels of those open: `over_share`, `busy_while_frozen`.
    pub events: u64,
    pub open: Vec<Labels>,
    pub runaway_events: u64,
    pub runaway_open: Vec<Labels>,
    /// `over_entitlement`: borrowed past its entitlement while a floor was starved.
    pub floor_events: u64,
    pub floor_open: Vec<Labels>,
    /// The wall runs (not `off`).
    pub on: bool,
}

/// One container GPU with a share, as the scrape shows it.
#[derive(Debug, Clone)]
pub struct GpuView {
    pub labels: Labels,
    /// Use over the window (None: not measured yet).
    pub used: Option<f64>,
    /// The share's request and limit, 0–1.
    pub request: f64,
    pub limit: f64,
    /// GPU-seconds used past the request (borrowed), in all.
    pub borrowed: f64,
    /// GPU-seconds past the allowance, in all.
    pub excess: f64,
    /// GPU-seconds used past its thawed time (at least what ran while it was frozen), in all.
    pub frozen_busy: f64,
    /// Frozen by the wall now.
    pub frozen: bool,
}

impl ShareRun {
    /// The wall in `mode`; `kill`: the monitor's kill policy.
    pub fn new(mode: ShareWall, settings: Settings, kill: bool) -> ShareRun {
        ShareRun {
            mode,
            kill,
            record: None,
            inner: Mutex::new(Inner {
                wall: Wall::new(settings),
                frozen: BTreeMap::new(),
                frozen_secs: BTreeMap::new(),
                events: 0,
                runaway_events: 0,
                floor_events: 0,
                freezes: 0,
                failures: 0,
            }),
        }
    }

    /// This wall recording what it holds frozen in `<root>/share-wall/frozen.json`.
    pub fn with_record(mut self, root: &vgpu_host::state_root::StateRoot) -> ShareRun {
        self.record = Some(Record::new(root, "share-wall", "share wall"));
        self
    }

    /// At the start: thaws what the last run recorded as frozen by its share wall (it was killed
    /// outright: SIGKILL, the OOM killer), whatever this run's mode.
    pub fn thaw_left_frozen(&self) {
        if let Some(r) = &self.record {
            r.thaw_left();
        }
    }

    /// Records what the wall holds frozen now (every freeze and thaw; nothing when not recording).
    fn save(&self, w: &Inner) {
        if let Some(r) = &self.record {
            let list: Vec<Frozen> = w
                .frozen
                .iter()
                .map(|(id, f)| Frozen {
                    container: id.clone(),
                    cgroup: f.dir.clone(),
                })
                .collect();
            r.save(&list);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One pass over a collection: measure, decide, act. Nothing while off or without NVML. Returns,
    /// under the kill policy, the processes to kill (their work runs on while their container is frozen).
    pub fn pass(
        &self,
        cs: &[ContainerState],
        truth: &Truth,
        gpus: Option<&[GpuReading]>,
    ) -> Vec<Victim> {
        let Some(gpus) = gpus.filter(|_| self.mode != ShareWall::Off) else {
            return vec![];
        };
        let now = Instant::now();
        let mut w = self.lock();
        let frozen = w.take_frozen_secs(now);
        let uses = measure(cs, truth, gpus, &frozen);
        let overs = w.wall.pass(now, &uses);
        for o in overs {
            let Some(c) = cs.iter().position(|c| c.id == o.container) else {
                continue;
            };
            let dir =
                (self.mode == ShareWall::Freeze).then(|| vgpu_host::cgroup::of_container(&cs[c]));
            if o.begins {
                match o.why {
                    Why::Limit => w.events += 1,
                    Why::Floor { .. } => w.floor_events += 1,
                }
                log(&describe(&cs[c], &o, &dir, w.wall.settings().tolerance));
            }
            let Some(dir) = dir else { continue };
            let until = now + o.freeze_for;
            if let Some(f) = w.frozen.get_mut(&o.container) {
                // Frozen already for another of its GPUs: held the longer of the two.
                f.until = f.until.max(until);
                continue;
            }
            let r = dir.and_then(freezer::freeze_for_wall);
            match r {
                Ok(None) => {}
                Ok(Some(d)) => {
                    let held = Held {
                        dir: d,
                        until,
                        counted: now,
                    };
                    w.frozen.insert(o.container.clone(), held);
                    w.freezes += 1;
                    // Recorded before anything else can happen to the monitor.
                    self.save(&w);
                }
                Err(e) => {
                    w.failures += 1;
                    log(&format!("share wall: container {}: {e}", o.container));
                }
            }
        }
        let victims = self.runaways(&mut w, cs, truth, gpus);
        // A frozen container that is gone is forgotten (its cgroup went with it).
        let before = w.frozen.len();
        w.frozen.retain(|id, _| cs.iter().any(|c| &c.id == id));
        if w.frozen.len() != before {
            self.save(&w);
        }
        drop(w);
        self.thaw_due(now);
        victims
    }

    /// What this pass found running on while frozen: each finding logged when it begins; under the kill
    /// policy, the processes NVML shows busy there while the container is frozen by this monitor now.
    fn runaways(
        &self,
        w: &mut Inner,
        cs: &[ContainerState],
        truth: &Truth,
        gpus: &[GpuReading],
    ) -> Vec<Victim> {
        let mut victims = Vec::new();
        for r in w.wall.runaways().to_vec() {
            let Some(c) = cs.iter().position(|c| c.id == r.container) else {
                continue;
            };
            let Some(g) = cs[c].gpus.iter().position(|g| g.uuid == r.gpu) else {
                continue;
            };
            // Only while frozen: a thawed container's busy processes may be doing their share's work.
            let kill = self.kill && w.frozen.contains_key(&r.container);
            if r.begins {
                w.runaway_events += 1;
                log(&describe_runaway(
                    &cs[c],
                    &r,
                    kill,
                    w.wall.settings().tolerance,
                ));
            }
            if kill {
                let busy = busy_procs(truth, gpus, c, g, &r.gpu);
                victims.extend(busy.into_iter().map(|p| Victim { c, g, proc_: p }));
            }
        }
        victims
    }

    /// Thaws the containers whose time is up.
    pub fn thaw_due(&self, now: Instant) {
        let mut w = self.lock();
        let due: Vec<String> = w
            .frozen
            .iter()
            .filter(|(_, f)| f.until <= now)
            .map(|(id, _)| id.clone())
            .collect();
        let any = !due.is_empty();
        for id in due {
            if let Some(Held { dir, counted, .. }) = w.frozen.remove(&id) {
                let held = Instant::now().saturating_duration_since(counted);
                *w.frozen_secs.entry(id).or_default() += held.as_secs_f64();
                // A cgroup that is gone has nothing left to thaw.
                if let Err(e) = freezer::set_frozen(&dir, false) {
                    if dir.exists() {
                        w.failures += 1;
                        log(&format!("share wall: cannot thaw {}: {e}", dir.display()));
                    }
                }
            }
        }
        if any {
            self.save(&w);
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
            let next = self.lock().frozen.values().map(|f| f.until).min();
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
            runaway_events: w.runaway_events,
            floor_events: w.floor_events,
            on: self.mode != ShareWall::Off,
            ..Default::default()
        };
        if !v.on {
            return v;
        }
        for (c, cs) in cs.iter().enumerate().filter(|(_, c)| c.enforced()) {
            for (g, gs) in cs.gpus.iter().enumerate() {
                let Some((request, limit)) = gs.request_limit() else {
                    continue;
                };
                let l = labels(c, g);
                if w.wall.floor_open(&cs.id, &gs.uuid, now) {
                    v.floor_open.push(l.clone());
                }
                if w.wall.open(&cs.id, &gs.uuid, now) {
                    v.open.push(l.clone());
                }
                if w.wall.runaway_open(&cs.id, &gs.uuid, now) {
                    v.runaway_open.push(l.clone());
                }
                v.gpus.push(GpuView {
                    labels: l,
                    used: w.wall.used_ratio(&cs.id, &gs.uuid),
                    request: f64::from(request) / 100.0,
                    limit: f64::from(limit) / 100.0,
                    borrowed: w.wall.borrowed_total(&cs.id, &gs.uuid),
                    excess: w.wall.excess_total(&cs.id, &gs.uuid),
                    frozen_busy: w.wall.frozen_busy_total(&cs.id, &gs.uuid),
                    frozen: w.frozen.contains_key(&cs.id),
                });
            }
        }
        v
    }
}

impl Inner {
    /// The seconds each container was frozen since the last pass, up to `now` (the count starts again).
    fn take_frozen_secs(&mut self, now: Instant) -> BTreeMap<String, f64> {
        let mut secs = std::mem::take(&mut self.frozen_secs);
        for (id, f) in self.frozen.iter_mut() {
            let held = now.saturating_duration_since(f.counted);
            *secs.entry(id.clone()).or_default() += held.as_secs_f64();
            f.counted = now;
        }
        secs
    }
}

#[cfg(test)]
mod tests;
