//! What one tick of the arbiter sees and answers, for one GPU: its settings, NVML's figures and each
//! oversubscribe container's turn words and NVML's figures of its processes (`Seen`), what to do
//! (`Action`), and how a collection of the monitor becomes that (`members`, `others`, `held`, `busy`).
//! Everything that can cost a container's neighbour (wanting the GPU, working, memory) comes from what the
//! host measures; the turn words are the tenant's, read only where they can cost that tenant alone (issue
//! 44). Not here: the decisions (`decide`), the reads and writes (`run`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};
use vgpu_host::attribution::Truth;
use vgpu_host::nvml::GpuReading;
use vgpu_host::usage::ContainerState;
use vgpu_ledger::region::{TurnMode, TurnSnapshot};

/// NVML's device used memory within this share of the total is memory pressure (5%).
pub const MARGIN: f64 = 0.05;

/// The arbiter's timing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// How long a holder keeps the GPU while others wait.
    pub quantum: Duration,
    /// A holder idle this long hands the GPU on early.
    pub idle: Duration,
    /// How long a container told to yield has to drain before it is frozen.
    pub grace: Duration,
    /// How long a sign of wanting the GPU counts (NVML's is read once per collection).
    pub linger: Duration,
    /// NVML's sample tail: a busy reading counts against a container told to wait only when it covers
    /// nothing from before `settle` after it was told.
    pub settle: Duration,
    /// Take turns whenever two want the GPU, whatever the memory.
    pub force: bool,
}

/// NVML's figures of the GPU at one collection.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuNvml {
    /// When the reading was finished, and the previous one (its utilisation covers the time between).
    pub at: Instant,
    pub since: Option<Instant>,
    pub total: u64,
    pub used: u64,
    /// Bytes NVML's processes not of these containers hold.
    pub others: u64,
}

/// One oversubscribe container of the GPU as a tick sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    pub id: String,
    /// Its ledger's turn words (None: no ledger to read). The tenant's to write: read only where they
    /// can cost this container alone (its drain, its waiting threads while it is told to wait).
    pub turn: Option<TurnSnapshot>,
    /// NVML at this tick's new collection: the bytes its processes hold on the GPU (None: no new
    /// collection, or NVML's process list could not be read).
    pub held: Option<u64>,
    /// NVML at this tick's new collection: its processes used the GPU (None: no new collection).
    pub busy: Option<bool>,
}

/// One tick: the time, every member, and NVML when a new collection came.
#[derive(Debug, Clone)]
pub struct Tick<'a> {
    pub now: Instant,
    /// CLOCK_MONOTONIC nanoseconds now: epochs start from it, so a restarted arbiter never reuses one.
    pub now_ns: u64,
    pub members: &'a [Seen],
    pub nvml: Option<GpuNvml>,
}

/// Why the arbiter froze a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Why {
    /// It held the GPU and did not drain within the grace after its quantum.
    Revoked,
    /// NVML saw it use the GPU while told to wait (or not to drain when told to yield).
    OutOfTurn,
}

/// What the runner is to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Write this turn into the container's ledger.
    Write {
        id: String,
        mode: TurnMode,
        epoch: u64,
    },
    Freeze {
        id: String,
        why: Why,
    },
    Thaw {
        id: String,
    },
    /// A container this arbiter holds frozen whose processes NVML still shows busy past the grace after
    /// the freeze (`decide::runs_on`): its work runs on while frozen. `after`: how long after the freeze
    /// the reading that shows it begins; `begins`: the first such reading of this freeze (logged, counted).
    BusyWhileFrozen {
        id: String,
        after: Duration,
        begins: bool,
    },
}

/// What this arbiter counted on the GPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub grants: u64,
    pub revocations: u64,
    pub out_of_turn: u64,
    /// Freezes whose work ran on while frozen (`busy_while_frozen`).
    pub busy_while_frozen: u64,
}

/// What the last contention verdict was made of.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Figures {
    /// Containers that want the GPU.
    pub wanting: usize,
    /// What their processes need on the device by NVML (each one's most in its spell of wanting the
    /// GPU), and the part of it of the ones that do not hold it.
    pub need: u64,
    pub waiting: u64,
    /// NVML: the device's used memory, its total, and what other processes hold.
    pub used: u64,
    pub total: u64,
    pub others: u64,
}

/// Each GPU's oversubscribe container GPUs (container index, GPU index), of live containers only.
pub fn members(cs: &[ContainerState]) -> BTreeMap<String, Vec<(usize, usize)>> {
    let mut out: BTreeMap<String, Vec<(usize, usize)>> = BTreeMap::new();
    for (ci, c) in cs.iter().enumerate().filter(|(_, c)| c.live) {
        for (gi, g) in c.gpus.iter().enumerate().filter(|(_, g)| g.oversubscribe) {
            out.entry(g.uuid.clone()).or_default().push((ci, gi));
        }
    }
    out
}

/// Bytes NVML's processes on the GPU hold that are none of the members'.
pub fn others(r: &GpuReading, list: &[(usize, usize)], truth: &Truth) -> u64 {
    let mine: BTreeSet<u32> = list
        .iter()
        .filter_map(|k| truth.by_gpu.get(k))
        .flatten()
        .map(|p| p.pid)
        .collect();
    r.processes
        .iter()
        .flatten()
        .filter(|(pid, _)| !mine.contains(pid))
        .map(|(_, b)| *b)
        .fold(0, u64::saturating_add)
}

/// The bytes NVML lists the member's processes holding on the GPU (None: NVML's list could not be read).
pub fn held(r: &GpuReading, truth: &Truth, c: usize, g: usize) -> Option<u64> {
    r.processes.as_ref()?;
    Some(truth.used(c, g))
}

/// Whether NVML saw the member's processes use the GPU (None: NVML cannot tell utilisation).
pub fn busy(r: &GpuReading, truth: &Truth, c: usize, g: usize) -> Option<bool> {
    let samples = r.process_utilization.as_deref()?;
    let procs = truth.by_gpu.get(&(c, g)).map_or(&[][..], |v| v.as_slice());
    Some(
        procs
            .iter()
            .any(|p| samples.iter().any(|s| s.0 == p.pid && s.1 > 0.0)),
    )
}
