//! Memory no process's figure shows: per GPU, NVML's used memory against what the monitor can account for
//! by process, and the container that likely holds the rest.
//!
//! `used` (`nvmlDeviceGetMemoryInfo`) counts every byte of the GPU in use: what each process allocated, its
//! contexts included, and the driver's own reserve. NVML's per-process figures leave out memory that is
//! no process's allocation any more, or never was one: the physical memory an exported handle
//! (`cuMemExportToShareableHandle`) keeps after its process released the handle (the descriptor, passed on
//! or not, holds it), managed memory resident on the GPU, and memory of references the driver keeps for
//! sparse arrays and multicast objects. The remainder is
//!
//! ```text
//! unattributed = used − reserved − Σ every listed process's figure
//! ```
//!
//! from what the host measures alone: NVML's `used`, its `reserved` (`nvmlDeviceGetMemoryInfo_v2`), and the
//! compute, graphics and MPS client lists (one figure per PID, the largest where a PID is in two lists),
//! every process counted whoever it belongs to (a container, the host). No ledger lowers it: a ledger is a
//! file the tenant can write. The ledgers only *name a suspect*: a live container whose ledger charges more
//! on that GPU than NVML shows for its processes (past the watchdog's tolerance) is the likely holder,
//! since the library keeps memory charged that its processes' figures no longer show (exported handles,
//! managed memory). A GPU whose process list could not be read, or that lists a process without a figure,
//! has no remainder.
//!
//! The remainder is served for every GPU at every collection (`metrics::unattributed`); the log line waits
//! for it to stay past `threshold` for `scans` collections in a row (a process that allocates between
//! NVML's two readings leaves a transient remainder), says it again when it grows by another threshold, and
//! once when it falls back under (`Episodes`). Not here: reading NVML or the state (`vgpu_host`), which
//! process is whose (`vgpu_host::attribution`).

use crate::stderr::who;
use std::collections::BTreeMap;
use vgpu_host::attribution::Truth;
use vgpu_host::nvml::GpuReading;
use vgpu_host::usage::ContainerState;
use vgpu_ledger::{format_bytes, Kind};

/// When the remainder is logged and whose it likely is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Bytes past which the remainder is logged (after `scans` collections) and a holder is named.
    pub threshold: u64,
    /// Collections in a row the remainder must stay past `threshold` before it is logged.
    pub scans: u32,
    /// A ledger charging this much more than its processes' NVML figures is normal (a context the library
    /// measured with other tenants active, NVML's rounding): the watchdog's tolerance.
    pub tolerance: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            threshold: vgpu_host::config::DEFAULT_UNATTRIBUTED_THRESHOLD,
            scans: vgpu_host::config::DEFAULT_UNATTRIBUTED_SCANS,
            tolerance: vgpu_host::config::DEFAULT_TOLERANCE,
        }
    }
}

/// One GPU's used memory against what its processes' figures account for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remainder {
    /// NVML's index and UUID.
    pub index: u32,
    pub uuid: String,
    /// NVML's used memory (`nvmlDeviceGetMemoryInfo`).
    pub used: u64,
    /// The driver's and firmware's reserve within it (0 where NVML cannot tell).
    pub reserved: u64,
    /// Every listed process's figure, added up (containers' and the host's).
    pub processes: u64,
    /// The part of `processes` attributed to containers with a quota.
    pub containers: u64,
    /// `used − reserved − processes`: what no process's figure shows.
    pub unattributed: u64,
    /// The live containers whose ledgers charge past their processes' NVML figures, largest first; only
    /// while `unattributed` is past the threshold.
    pub holders: Vec<Holder>,
}

/// A container that likely holds some of a GPU's unattributed memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// Indexes into the containers read and their GPUs.
    pub c: usize,
    pub g: usize,
    /// Its ledger's total on the GPU (what the library charges: the tenant's own account).
    pub charged: u64,
    /// What NVML shows its processes holding there.
    pub nvml: u64,
    /// `charged − nvml`, at most the GPU's unattributed memory: the part it likely holds.
    pub likely: u64,
}

/// Every GPU's remainder (those whose processes NVML listed, each with a figure), in NVML's order.
pub fn remainders(
    containers: &[ContainerState],
    gpus: &[GpuReading],
    truth: &Truth,
    s: Settings,
) -> Vec<Remainder> {
    gpus.iter()
        .filter_map(|r| remainder(containers, r, truth, s))
        .collect()
}

fn remainder(
    containers: &[ContainerState],
    r: &GpuReading,
    truth: &Truth,
    s: Settings,
) -> Option<Remainder> {
    let listed = r.processes.as_ref()?;
    if r.unmeasured_processes > 0 {
        return None;
    }
    let mut by_pid: BTreeMap<u32, u64> = BTreeMap::new();
    for &(pid, bytes) in listed.iter().chain(r.other_processes.iter().flatten()) {
        let e = by_pid.entry(pid).or_default();
        *e = (*e).max(bytes);
    }
    let processes = by_pid.values().fold(0u64, |a, b| a.saturating_add(*b));
    let reserved = r.reserved.unwrap_or(0).min(r.used);
    let unattributed = r.used.saturating_sub(reserved).saturating_sub(processes);
    let on_gpu = || {
        containers.iter().enumerate().flat_map(move |(c, cs)| {
            cs.gpus
                .iter()
                .enumerate()
                .filter(move |(_, gs)| gs.uuid == r.uuid)
                .map(move |(g, gs)| (c, cs, g, gs))
        })
    };
    let attributed = on_gpu()
        .map(|(c, _, g, _)| truth.used(c, g))
        .fold(0u64, u64::saturating_add);
    let mut holders: Vec<Holder> = match unattributed > s.threshold {
        false => vec![],
        true => on_gpu()
            .filter(|(_, cs, _, gs)| cs.live && gs.error.is_none())
            .filter_map(|(c, _, g, gs)| {
                let nvml = truth.used(c, g);
                let beyond = gs.total.saturating_sub(nvml);
                (beyond > s.tolerance).then(|| Holder {
                    c,
                    g,
                    charged: gs.total,
                    nvml,
                    likely: beyond.min(unattributed),
                })
            })
            .collect(),
    };
    holders.sort_by_key(|h| (std::cmp::Reverse(h.charged - h.nvml), h.c, h.g));
    Some(Remainder {
        index: r.index,
        uuid: r.uuid.clone(),
        used: r.used,
        reserved,
        processes,
        containers: attributed,
        unattributed,
        holders,
    })
}

/// What changed in a GPU's episode at a collection (`Episodes::scan`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The remainder has stayed past the threshold for `scans` collections: index into the remainders.
    Began(usize),
    /// Past what was last logged by another threshold.
    Grew(usize),
    /// Back under the threshold (index into the remainders) after an episode that was logged.
    Ended(usize),
}

/// Per GPU UUID, how many collections in a row its remainder has been past the threshold, and what was
/// last logged while that lasts (the monitor keeps it between collections).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Episodes {
    gpus: BTreeMap<String, Episode>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Episode {
    over: u32,
    logged: Option<u64>,
}

impl Episodes {
    /// One collection's remainders. A GPU without a remainder this time (its list unread, NVML down)
    /// keeps its count: an unread collection neither starts nor ends anything.
    pub fn scan(&mut self, rs: &[Remainder], s: Settings) -> Vec<Event> {
        let mut out = Vec::new();
        for (i, r) in rs.iter().enumerate() {
            let e = self.gpus.entry(r.uuid.clone()).or_default();
            if r.unattributed <= s.threshold {
                if e.logged.is_some() {
                    out.push(Event::Ended(i));
                }
                *e = Episode::default();
                continue;
            }
            e.over = e.over.saturating_add(1);
            match e.logged {
                None if e.over >= s.scans.max(1) => {
                    e.logged = Some(r.unattributed);
                    out.push(Event::Began(i));
                }
                Some(at) if r.unattributed > at.saturating_add(s.threshold.max(1)) => {
                    e.logged = Some(r.unattributed);
                    out.push(Event::Grew(i));
                }
                _ => {}
            }
        }
        out
    }
}

/// "GPU 0 (GPU-…)".
fn gpu(r: &Remainder) -> String {
    format!("GPU {} ({})", r.index, r.uuid)
}

/// Who likely holds it, for a log line or `vgpuctl status`: "likely held by container X (pod …), whose
/// ledger charges 1.00 GiB more than NVML shows for its processes (its ledger: vmm 1.00 GiB)", or that
/// no ledger explains it.
pub fn suspects(r: &Remainder, containers: &[ContainerState]) -> String {
    if r.holders.is_empty() {
        return "no container's ledger charges more than NVML shows for its processes: the holder is not known (a process the library does not govern, a descriptor passed to a process without CUDA, or the driver)".into();
    }
    let each: Vec<String> = r
        .holders
        .iter()
        .map(|h| {
            let (cs, gs) = (&containers[h.c], &containers[h.c].gpus[h.g]);
            // The kinds NVML's per-process figure is known to leave out, as the ledger has them.
            let kinds: Vec<String> = [Kind::Vmm, Kind::Managed]
                .into_iter()
                .filter(|k| gs.by_kind[k.index()] > 0)
                .map(|k| format!("{} {}", k.name(), format_bytes(gs.by_kind[k.index()])))
                .collect();
            format!(
                "{}, whose ledger charges {} more than NVML shows for its processes ({} against {}{})",
                who(cs),
                format_bytes(h.charged - h.nvml),
                format_bytes(h.charged),
                format_bytes(h.nvml),
                match kinds.is_empty() {
                    true => String::new(),
                    false => format!("; its ledger: {}", kinds.join(", ")),
                }
            )
        })
        .collect();
    format!(
        "likely held by {} (a hint from its ledger, a file the tenant writes)",
        each.join("; and by ")
    )
}

/// The log line of an event.
pub fn describe(
    ev: &Event,
    rs: &[Remainder],
    containers: &[ContainerState],
    s: Settings,
) -> String {
    match *ev {
        Event::Began(i) | Event::Grew(i) => {
            let r = &rs[i];
            format!(
                "unattributed memory: {}: {} in use that no process's NVML figure shows{} (used {}, driver reserve {}, processes {}); {}",
                gpu(r),
                format_bytes(r.unattributed),
                match ev {
                    Event::Began(_) => format!(", past {} for {} collections", format_bytes(s.threshold), s.scans.max(1)),
                    _ => ", grown".into(),
                },
                format_bytes(r.used),
                format_bytes(r.reserved),
                format_bytes(r.processes),
                suspects(r, containers)
            )
        }
        Event::Ended(i) => {
            let r = &rs[i];
            format!(
                "unattributed memory: {}: back to {}, within {}",
                gpu(r),
                format_bytes(r.unattributed),
                format_bytes(s.threshold)
            )
        }
    }
}

#[cfg(test)]
mod tests;
