//! The compute share's host wall: its decisions. The library's token bucket lives in the container's
//! ledger, which the tenant can write, and governs only processes that load the library; this wall
//! measures each container's GPU time outside the tenant (NVML's per-process utilisation of the
//! container's processes, summed per GPU) and keeps a bucket of its own per container GPU: it earns
//! `share + tolerance` of each second, holds at most the library's own burst (`share × (1 − share) ×` its
//! pacing window) plus `tolerance × window`, and is debited the GPU time measured. A container whose bucket
//! runs into debt ran past its share plus the tolerance: it is to be frozen for as long as the bucket
//! takes to earn the debt back (at most one window at a time; a debt is remembered up to one window's
//! earning), and the finding begins (logged once) unless one is open (it closes after a window in
//! credit). A freeze stops the container's CPU threads, not GPU work already queued: a container GPU
//! whose processes used more GPU time over the window than its thawed time plus its allowance could
//! explain, while frozen for half the window or more, runs work on while frozen (`Runaway`, the finding
//! `busy_while_frozen`; `runs_on_while_frozen` is the rule).
//!
//! **Floors** (issue 42): a share is a request (its floor) and a limit (its cap; the bucket above). On a
//! GPU where some container has a request of its own, each pass divides the GPU among its containers
//! with a share by `vgpu_host::division` (the library's rules, in one place), busy-ness from NVML
//! (processes seen using the GPU in the pass; a container the wall held frozen counts as busy): each gets
//! its entitlement. A second bucket per container GPU earns `entitlement + tolerance` and is debited the
//! GPU time measured; while no floor was starved for a window (or the starved container went idle) its
//! debt is forgiven (borrowing idle time is the point). A floor is starved when the GPU was saturated (every process's use, NVML: at least
//! `1 − tolerance`) and a busy container, not frozen, used less than its floor (its request, or its
//! entitlement when the requests add up past 100) less the tolerance. Then, for a window, a container
//! in debt on that bucket, a borrower past its entitlement, is frozen as for its limit (the finding
//! `over_entitlement`): the borrowers are held to their entitlements plus the tolerance, and the floor
//! gets its time back less the tolerance.
//! NVML cannot tell a light tenant from a starved one: on a saturated GPU, a busy tenant below its floor
//! is taken as starved. On a GPU of limits alone (today's hard caps, never promised anything) the floor
//! bucket does nothing. Pure: time is passed in, nothing is read or written here. Not here: measuring
//! and acting (`share_run`), the cgroup writes (`freezer`).

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};
use vgpu_host::division::{self, Tenant};

/// The wall's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// The window: how far ahead of its share a container may run (with the tolerance), and how far back
    /// the reported use looks.
    pub window: Duration,
    /// Tolerance, as a ratio of the GPU's time (5 points: 0.05).
    pub tolerance: f64,
}

/// One container GPU as measured at a pass.
#[derive(Debug, Clone, PartialEq)]
pub struct Use {
    pub container: String,
    pub gpu: String,
    /// The share's limit (its cap), 0–1 (1: a request alone).
    pub share: f64,
    /// The share's request (its floor), 0–1: a limit alone is its own request.
    pub request: f64,
    /// The request is the container's own (not a limit alone's): the GPU's floors are promised.
    pub requested: bool,
    /// The GPU's time the container's processes used since the last pass, 0–1 (NVML).
    pub busy: f64,
    /// The GPU's time every process on the GPU used since the last pass, 0–1 (NVML: the device's
    /// utilisation, or its processes' summed, whichever is more).
    pub gpu_busy: f64,
    /// GPU-seconds the library itself lets a container run ahead of its share (its bucket's capacity).
    pub burst: f64,
    /// Seconds since the last pass that its cgroup was held frozen by the wall (0 when never frozen, as
    /// while reporting only).
    pub frozen: f64,
}

/// Why a container GPU is frozen.
#[derive(Debug, Clone, PartialEq)]
pub enum Why {
    /// It ran past its limit plus the tolerance.
    Limit,
    /// It ran past its entitlement plus the tolerance while a busy container's floor on the GPU was
    /// starved (`over_entitlement`).
    Floor {
        /// Its entitlement at this pass, 0–1 (`vgpu_host::division`).
        entitled: f64,
        /// The starved container.
        starved: Starved,
    },
}

/// A busy container of a saturated GPU that used less than its floor less the tolerance.
#[derive(Debug, Clone, PartialEq)]
pub struct Starved {
    pub container: String,
    /// What it used of the GPU since the last pass, 0–1.
    pub got: f64,
    /// Its floor, 0–1: its request, or its entitlement when that is less.
    pub floor: f64,
}

/// A container GPU in debt at this pass (and not already frozen for it).
#[derive(Debug, Clone, PartialEq)]
pub struct Over {
    pub container: String,
    pub gpu: String,
    /// Its limit, 0–1.
    pub share: f64,
    /// Its request, 0–1.
    pub request: f64,
    /// Past its limit, or past its entitlement while a floor was starved.
    pub why: Why,
    /// GPU-seconds its processes used over the last `span` seconds (at most about a window).
    pub used: f64,
    pub span: f64,
    /// GPU-seconds past what the bucket allowed.
    pub debt: f64,
    /// How long to freeze it: the debt earned back at `share + tolerance` (for a floor, its entitlement
    /// + tolerance), at most a window.
    pub freeze_for: Duration,
    /// A finding begins (none was open).
    pub begins: bool,
}

/// A container GPU whose work ran on while it was frozen, found at this pass.
#[derive(Debug, Clone, PartialEq)]
pub struct Runaway {
    pub container: String,
    pub gpu: String,
    pub share: f64,
    /// GPU-seconds its processes used over the last `span` seconds, of which it was frozen `frozen`.
    pub used: f64,
    pub span: f64,
    pub frozen: f64,
    /// A finding begins (none was open).
    pub begins: bool,
}

/// The rule of `busy_while_frozen`: over the last `span` seconds (about a window), frozen `frozen` of
/// them, the processes used `used` GPU-seconds. Thawed, they can have used at most `span − frozen`; the
/// work they queued before a freeze may run on into it, up to what the wall allows (`rate × window`,
/// `rate` = share + tolerance). More than both, while frozen half the window or more: the work runs on
/// whatever the freezes do (a long kernel, a deep queue). The half keeps a short or first freeze, whose
/// queue drains as it begins, from counting.
pub fn runs_on_while_frozen(used: f64, span: f64, frozen: f64, rate: f64, window: f64) -> bool {
    frozen >= window / 2.0 && used >= (span - frozen) + rate * window
}

/// What the wall holds of one container GPU.
#[derive(Debug, Clone)]
struct Track {
    /// GPU-seconds of credit (negative: debt).
    level: f64,
    /// Each pass over the last window: when, seconds measured, GPU-seconds used, seconds frozen.
    recent: VecDeque<Sample>,
    /// Frozen (or, reporting only, counted as frozen) until then: no new decision before.
    paid_until: Option<Instant>,
    /// The last pass it was in debt (the finding stays open a window after).
    last_debt: Option<Instant>,
    /// GPU-seconds used past the allowance, in all.
    excess_total: f64,
    /// The last pass its work ran on while frozen (that finding stays open a window after).
    last_runaway: Option<Instant>,
    /// GPU-seconds used past its thawed time (at least what ran while it was frozen), in all.
    frozen_busy_total: f64,
    /// GPU-seconds of credit on the floor bucket, which earns its entitlement + tolerance (negative:
    /// debt, kept only while a floor on the GPU is starved).
    floor_level: f64,
    /// The last pass it was in debt on the floor bucket while a floor was starved.
    last_floor_debt: Option<Instant>,
    /// GPU-seconds used past its request (borrowed), in all.
    borrowed_total: f64,
}

/// One pass of a container GPU, as the window keeps it.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Instant,
    secs: f64,
    used: f64,
    frozen: f64,
}

/// The wall's state between passes.
#[derive(Debug, Clone)]
pub struct Wall {
    settings: Settings,
    last: Option<Instant>,
    tracks: BTreeMap<(String, String), Track>,
    /// What the last pass found running on while frozen.
    runaways: Vec<Runaway>,
    /// Per GPU, the last pass a floor was starved there and the container most short of it (kept a
    /// window: the borrowers' floor buckets stay in force that long).
    starved: BTreeMap<String, (Instant, Starved)>,
}

impl Wall {
    pub fn new(settings: Settings) -> Wall {
        Wall {
            settings,
            last: None,
            tracks: BTreeMap::new(),
            runaways: Vec::new(),
            starved: BTreeMap::new(),
        }
    }

    pub fn settings(&self) -> Settings {
        self.settings
    }

    /// One pass at `now` with this pass's measurements: what is in debt (what runs on while frozen:
    /// `runaways`). The first pass only starts the clock (a utilisation is a rate over the time since the
    /// last pass). Container GPUs not measured are forgotten.
    pub fn pass(&mut self, now: Instant, uses: &[Use]) -> Vec<Over> {
        let window = self.settings.window.as_secs_f64();
        let tol = self.settings.tolerance;
        self.runaways.clear();
        let dt = match self.last.replace(now) {
            None => return vec![],
            Some(t) => now.saturating_duration_since(t).as_secs_f64().min(window),
        };
        let (entitled, starved) = divide(uses, tol);
        for (gpu, s) in starved {
            self.starved.insert(gpu.to_string(), (now, s));
        }
        // A floor stays starved a window, while its container is still busy (one gone idle wants
        // nothing back).
        self.starved.retain(|gpu, (at, s)| {
            now.saturating_duration_since(*at).as_secs_f64() <= window
                && uses.iter().any(|u| {
                    &u.gpu == gpu && u.container == s.container && (u.busy > 0.0 || u.frozen > 0.0)
                })
        });
        let mut out = Vec::new();
        let mut kept = BTreeMap::new();
        for (u, &e) in uses.iter().zip(&entitled) {
            let key = (u.container.clone(), u.gpu.clone());
            let rate = (u.share + tol).min(1.0);
            let cap = u.burst + tol * window;
            // The floor bucket: the entitlement's rate, and the burst the library allows at it.
            let floor_rate = (e + tol).min(1.0);
            let floor_cap = e * (1.0 - e) * window + tol * window;
            let Some(mut t) = self.tracks.remove(&key) else {
                // First seen: its rate was measured over less than this pass (since its process
                // began, or over the samples NVML has of it), so it starts its clock, full, unbilled.
                kept.insert(
                    key,
                    Track {
                        level: cap,
                        recent: VecDeque::new(),
                        paid_until: None,
                        last_debt: None,
                        excess_total: 0.0,
                        last_runaway: None,
                        frozen_busy_total: 0.0,
                        floor_level: floor_cap,
                        last_floor_debt: None,
                        borrowed_total: 0.0,
                    },
                );
                continue;
            };
            let gpu = u.busy.clamp(0.0, 1.0) * dt;
            let avail = t.level + rate * dt;
            t.excess_total += (gpu - avail.max(0.0)).max(0.0);
            t.level = (avail - gpu).clamp(-rate * window, cap);
            t.borrowed_total += (gpu - u.request * dt).max(0.0);
            // Only a starved floor (within the last window) makes a debt of borrowing; a borrower of
            // idle time owes nothing. Kept a window, the bucket holds the borrower to its entitlement on
            // average, not only at the passes that found the floor short.
            let starving = self
                .starved
                .get(&u.gpu)
                .map(|(_, s)| s)
                .filter(|s| s.container != u.container);
            t.floor_level =
                (t.floor_level + floor_rate * dt - gpu).clamp(-floor_rate * window, floor_cap);
            if starving.is_none() {
                t.floor_level = t.floor_level.max(0.0);
            }
            // Used past its thawed time: at least that much ran while it was frozen.
            let held = u.frozen.clamp(0.0, dt);
            t.frozen_busy_total += (gpu - (dt - held)).max(0.0);
            t.recent.push_back(Sample {
                at: now,
                secs: dt,
                used: gpu,
                frozen: held,
            });
            while t
                .recent
                .front()
                .is_some_and(|r| now.saturating_duration_since(r.at).as_secs_f64() >= window)
            {
                t.recent.pop_front();
            }
            let (used, span) = (t.used(), t.span());
            let frozen_for: f64 = t.recent.iter().map(|r| r.frozen).sum();
            if runs_on_while_frozen(used, span, frozen_for, rate, window) {
                self.runaways.push(Runaway {
                    container: u.container.clone(),
                    gpu: u.gpu.clone(),
                    share: u.share,
                    used,
                    span,
                    frozen: frozen_for,
                    begins: t
                        .last_runaway
                        .is_none_or(|d| now.saturating_duration_since(d).as_secs_f64() > window),
                });
                t.last_runaway = Some(now);
            }
            let frozen = t.paid_until.is_some_and(|p| p > now);
            let begun = |last: Option<Instant>| {
                last.is_none_or(|d| now.saturating_duration_since(d).as_secs_f64() > window)
            };
            let over = |why, debt: f64, rate: f64, begins| Over {
                container: u.container.clone(),
                gpu: u.gpu.clone(),
                share: u.share,
                request: u.request,
                why,
                used,
                span,
                debt,
                freeze_for: Duration::from_secs_f64((debt / rate).min(window)),
                begins,
            };
            if t.level < 0.0 && !frozen {
                let o = over(Why::Limit, -t.level, rate, begun(t.last_debt));
                t.paid_until = Some(now + o.freeze_for);
                t.last_debt = Some(now);
                out.push(o);
            } else {
                if t.level < 0.0 {
                    t.last_debt = Some(now);
                }
                if let Some(s) = starving.filter(|_| t.floor_level < 0.0) {
                    if !frozen {
                        let why = Why::Floor {
                            entitled: e,
                            starved: s.clone(),
                        };
                        let o = over(why, -t.floor_level, floor_rate, begun(t.last_floor_debt));
                        t.paid_until = Some(now + o.freeze_for);
                        out.push(o);
                    }
                    t.last_floor_debt = Some(now);
                }
            }
            kept.insert(key, t);
        }
        // Not measured this pass (NVML had no figures, or the container is gone): kept a window, so a
        // missed reading neither forgives a debt nor restarts the counters.
        for (key, t) in std::mem::take(&mut self.tracks) {
            if t.recent
                .back()
                .is_some_and(|r| now.saturating_duration_since(r.at).as_secs_f64() < window)
            {
                kept.insert(key, t);
            }
        }
        self.tracks = kept;
        out
    }

    /// The share of the GPU a container GPU used over the last window (None: not measured yet).
    pub fn used_ratio(&self, container: &str, gpu: &str) -> Option<f64> {
        let t = self.track(container, gpu)?;
        let span = t.span();
        (span > 0.0).then(|| t.used() / span)
    }

    /// What the wall holds of a container GPU.
    fn track(&self, container: &str, gpu: &str) -> Option<&Track> {
        self.tracks.get(&(container.to_string(), gpu.to_string()))
    }

    /// The container GPUs the last pass found running work on while frozen.
    pub fn runaways(&self) -> &[Runaway] {
        &self.runaways
    }

    /// GPU-seconds a container GPU used past its thawed time (at least what ran while frozen), in all.
    pub fn frozen_busy_total(&self, container: &str, gpu: &str) -> f64 {
        self.track(container, gpu)
            .map_or(0.0, |t| t.frozen_busy_total)
    }

    /// Whether a `busy_while_frozen` finding is open for a container GPU at `now`: its work ran on while
    /// frozen within the last window.
    pub fn runaway_open(&self, container: &str, gpu: &str, now: Instant) -> bool {
        self.track(container, gpu)
            .and_then(|t| t.last_runaway)
            .is_some_and(|d| now.saturating_duration_since(d) <= self.settings.window)
    }

    /// GPU-seconds a container GPU used past its allowance, in all.
    pub fn excess_total(&self, container: &str, gpu: &str) -> f64 {
        self.track(container, gpu).map_or(0.0, |t| t.excess_total)
    }

    /// GPU-seconds a container GPU used past its request (borrowed), in all.
    pub fn borrowed_total(&self, container: &str, gpu: &str) -> f64 {
        self.track(container, gpu).map_or(0.0, |t| t.borrowed_total)
    }

    /// Whether an `over_entitlement` finding is open for a container GPU at `now`: it borrowed past its
    /// entitlement while a floor was starved within the last window.
    pub fn floor_open(&self, container: &str, gpu: &str, now: Instant) -> bool {
        self.track(container, gpu)
            .and_then(|t| t.last_floor_debt)
            .is_some_and(|d| now.saturating_duration_since(d) <= self.settings.window)
    }

    /// Whether a finding is open for a container GPU at `now`: in debt within the last window.
    pub fn open(&self, container: &str, gpu: &str, now: Instant) -> bool {
        self.track(container, gpu)
            .and_then(|t| t.last_debt)
            .is_some_and(|d| now.saturating_duration_since(d) <= self.settings.window)
    }
}

/// A share as the division takes it: a whole percent.
fn percent(ratio: f64) -> u32 {
    (ratio.clamp(0.0, 1.0) * 100.0).round() as u32
}

/// Each use's entitlement at this pass, 0–1, and per GPU where a floor is starved the container most
/// short of its floor. Only on a GPU where a container has a request of its own: elsewhere (limits
/// alone) the entitlement is the limit and nothing is starved. Busy-ness is NVML's (a container held
/// frozen by the wall counts as busy: it would be, and its entitlement is what it pays its freeze back
/// at).
fn divide(uses: &[Use], tol: f64) -> (Vec<f64>, BTreeMap<&str, Starved>) {
    let mut entitled: Vec<f64> = uses.iter().map(|u| u.share).collect();
    let mut starved = BTreeMap::new();
    let mut gpus: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, u) in uses.iter().enumerate() {
        gpus.entry(u.gpu.as_str()).or_default().push(i);
    }
    for (gpu, members) in gpus {
        if !members.iter().any(|&i| uses[i].requested) {
            continue;
        }
        let busy = |u: &Use| u.busy > 0.0 || u.frozen > 0.0;
        let tenants: Vec<Tenant> = members
            .iter()
            .map(|&i| Tenant {
                request: percent(uses[i].request),
                limit: percent(uses[i].share),
                busy: busy(&uses[i]),
            })
            .collect();
        let shares = division::divide(&tenants);
        for (&i, e) in members.iter().zip(shares) {
            entitled[i] = e / 100.0;
        }
        let saturated = members
            .iter()
            .map(|&i| uses[i].gpu_busy)
            .fold(0.0, f64::max)
            >= 1.0 - tol;
        if !saturated {
            continue;
        }
        let short = members
            .iter()
            .map(|&i| (&uses[i], uses[i].request.min(entitled[i])))
            .filter(|(u, _)| busy(u) && u.frozen <= 0.0)
            .filter(|(u, floor)| u.busy.clamp(0.0, 1.0) < floor - tol)
            .max_by(|a, b| (a.1 - a.0.busy).total_cmp(&(b.1 - b.0.busy)));
        if let Some((u, floor)) = short {
            starved.insert(
                gpu,
                Starved {
                    container: u.container.clone(),
                    got: u.busy.clamp(0.0, 1.0),
                    floor,
                },
            );
        }
    }
    (entitled, starved)
}

impl Track {
    /// GPU-seconds used over the window.
    fn used(&self) -> f64 {
        self.recent.iter().map(|r| r.used).sum()
    }

    /// Seconds the window's passes measured.
    fn span(&self) -> f64 {
        self.recent.iter().map(|r| r.secs).sum()
    }
}

#[cfg(test)]
mod tests;
