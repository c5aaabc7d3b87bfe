//! The NVML-truth watchdog's logic: what is wrong (`decide`), over NVML's processes attributed to containers
//! (`vgpu_host::attribution`): a container whose processes truly hold more than its quota plus a
//! tolerance on a GPU, a ledger whose total is below what its own processes truly hold, or a ledger whose
//! total disagrees with the sum of its slots. Under the kill policy it names the processes to kill: those
//! without a ledger slot (they bypass the library) first, largest first, then the others, only as many as
//! bring the container back within quota plus tolerance. A container within its quota is never touched.
//! A quota `vgpuctl update` lowered below what the container held is a *pending shrink*: what it held then
//! (measured by the host from NVML at the shrink) is tolerated, never more, and the tolerance follows the
//! container's truth down between passes (`Shrinks`, the pass state the monitor keeps).
//! Not here: reading the state, NVML or /proc (`vgpu_host::usage`, `nvml`, `procs`), which process is whose
//! (`vgpu_host::attribution`), logging and counting (the monitor's loop).

use std::collections::BTreeMap;
use vgpu_host::attribution::{TrueProc, Truth};
use vgpu_host::usage::{ContainerState, GpuState};

/// The watchdog's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Bytes beyond a quota (or below the truth, for a ledger) that are not reported.
    pub tolerance: u64,
    /// Kill the processes that put a container over its quota.
    pub kill: bool,
}

/// The watchdog's memory of pending shrinks from one pass to the next (the monitor keeps it with its other
/// pass state): per container id and GPU UUID, the figure the shrink recorded (limits.json's
/// `held_at_shrink`) and the least NVML has shown the container holding there since. A restarted monitor
/// has none and starts again from the recorded figure.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Shrinks {
    marks: BTreeMap<(String, String), Mark>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mark {
    /// The figure the shrink recorded: another one is another shrink, whose mark starts again.
    recorded: u64,
    /// The least the container held since (never above `recorded`).
    low: u64,
}

impl Shrinks {
    /// What container `cs` may hold on its GPU `gs` while a shrink is pending there (None: none is): the
    /// quota, or what it held at the shrink when more, lowered to the least NVML showed it holding since.
    /// Memory freed during a pending shrink is not taken again: the library refuses it, and a tenant
    /// that hid the shrink from its library is over quota when it does.
    pub fn allowance(&self, cs: &ContainerState, gs: &GpuState) -> Option<u64> {
        let (limit, recorded) = (gs.limit?, recorded(gs)?);
        Some(limit.max(self.low(cs, gs, recorded)))
    }

    fn low(&self, cs: &ContainerState, gs: &GpuState, recorded: u64) -> u64 {
        match self.marks.get(&(cs.id.clone(), gs.uuid.clone())) {
            Some(m) if m.recorded == recorded => m.low,
            _ => recorded,
        }
    }

    /// After a pass: each pending shrink's mark follows what the container truly holds down, never up.
    /// Marks of GPUs no longer shrinking (grown back, the container gone) are dropped; those of a
    /// container whose limits could not be read this time are kept.
    pub fn follow(&mut self, containers: &[ContainerState], truth: &Truth) {
        let mut next = BTreeMap::new();
        for (c, cs) in containers.iter().enumerate() {
            if cs.error.is_some() {
                let kept = self.marks.iter().filter(|((id, _), _)| *id == cs.id);
                next.extend(kept.map(|(k, m)| (k.clone(), *m)));
                continue;
            }
            for (g, gs) in cs.gpus.iter().enumerate() {
                let Some(recorded) = recorded(gs) else {
                    continue;
                };
                let mut low = self.low(cs, gs, recorded);
                if cs.live && truth.knows(&gs.uuid) {
                    low = low.min(truth.used(c, g));
                }
                next.insert((cs.id.clone(), gs.uuid.clone()), Mark { recorded, low });
            }
        }
        self.marks = next;
    }
}

/// The figure a pending shrink on `gs` recorded (None: no shrink pending, or no memory quota): what the
/// container held then, never above the quota it came from; a shrink recorded before that figure existed
/// starts from the quota it came from.
fn recorded(gs: &GpuState) -> Option<u64> {
    gs.limit?;
    Some(vgpu_host::shrink::recorded(
        gs.shrunk_from?,
        gs.held_at_shrink,
    ))
}

/// What the watchdog found on one container's GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// The container's processes truly hold `truth` bytes, more than `allowed` + tolerance: `allowed` is
    /// the quota `limit`, or during a pending shrink what the container may still hold from before it
    /// (`Shrinks::allowance`).
    OverQuota {
        c: usize,
        g: usize,
        truth: u64,
        limit: u64,
        allowed: u64,
        procs: Vec<TrueProc>,
        /// Host PIDs to kill (empty without the kill policy): only as many as bring it within `allowed`.
        kill: Vec<u32>,
    },
    /// Over the quota as `OverQuota`, but `vgpuctl update` lowered the quota from `from`, the container's
    /// processes hold no more than they held at the shrink (`truth` within `held` + tolerance, `held` the
    /// shrink's allowance as it followed the truth down) and the ledger itself is over the new quota (the
    /// library knows and refuses): memory held from before the shrink, kept until freed. Never killed.
    PendingShrink {
        c: usize,
        g: usize,
        truth: u64,
        limit: u64,
        from: u64,
        held: u64,
    },
    /// The ledger says `total`, its own (tracked) processes truly hold `truth`, more than total +
    /// tolerance: the ledger was tampered with (a tenant zeroed it) or lost charges.
    LedgerBelowTruth {
        c: usize,
        g: usize,
        total: u64,
        truth: u64,
    },
    /// The ledger's total and the sum of its slots differ by more than the tolerance.
    LedgerInconsistent {
        c: usize,
        g: usize,
        total: u64,
        slots_sum: u64,
    },
}

impl Finding {
    /// Which container and GPU, and a short name of the kind (for metrics and episode tracking).
    pub fn key(&self) -> (usize, usize, &'static str) {
        match self {
            Finding::OverQuota { c, g, .. } => (*c, *g, "over_quota"),
            Finding::PendingShrink { c, g, .. } => (*c, *g, "pending_shrink"),
            Finding::LedgerBelowTruth { c, g, .. } => (*c, *g, "ledger_below_truth"),
            Finding::LedgerInconsistent { c, g, .. } => (*c, *g, "ledger_inconsistent"),
        }
    }
}

/// Compares each container's truth with its quota (during a pending shrink, with what `shrinks` allows)
/// and its ledger.
pub fn decide(
    containers: &[ContainerState],
    truth: &Truth,
    policy: Policy,
    shrinks: &Shrinks,
) -> Vec<Finding> {
    let mut out = Vec::new();
    for (c, cs) in containers.iter().enumerate() {
        for (g, gs) in cs.gpus.iter().enumerate() {
            if gs.total.abs_diff(gs.slots_sum) > policy.tolerance {
                out.push(Finding::LedgerInconsistent {
                    c,
                    g,
                    total: gs.total,
                    slots_sum: gs.slots_sum,
                });
            }
            if !truth.knows(&gs.uuid) {
                continue;
            }
            let procs = truth.by_gpu.get(&(c, g)).cloned().unwrap_or_default();
            let tracked: u64 = procs.iter().filter(|p| p.tracked).map(|p| p.used).sum();
            if tracked > gs.total.saturating_add(policy.tolerance) {
                out.push(Finding::LedgerBelowTruth {
                    c,
                    g,
                    total: gs.total,
                    truth: tracked,
                });
            }
            // A GPU listed for its compute share alone has no memory quota to pass.
            let Some(limit) = gs.limit else {
                continue;
            };
            let used = truth.used(c, g);
            // A pending shrink only while the ledger is over the new quota: one back under it cannot be
            // holding memory from before the shrink.
            let pending = shrinks
                .allowance(cs, gs)
                .zip(gs.shrunk_from)
                .filter(|_| gs.total > limit);
            let allowed = pending.map_or(limit, |(held, _)| held);
            let ceiling = allowed.saturating_add(policy.tolerance);
            if used > ceiling {
                // A container of HAMi's folders without its bundle's spec has no quota of the host's:
                // reported, never killed.
                let kill = if policy.kill && cs.enforced() {
                    victims(&procs, used, ceiling)
                } else {
                    vec![]
                };
                out.push(Finding::OverQuota {
                    c,
                    g,
                    truth: used,
                    limit,
                    allowed,
                    procs,
                    kill,
                });
            } else if let Some((held, from)) =
                pending.filter(|_| used > limit.saturating_add(policy.tolerance))
            {
                out.push(Finding::PendingShrink {
                    c,
                    g,
                    truth: used,
                    limit,
                    from,
                    held,
                });
            }
        }
    }
    out
}

/// Untracked processes first, then tracked ones, each largest first, until what is left fits `ceiling`.
fn victims(procs: &[TrueProc], mut used: u64, ceiling: u64) -> Vec<u32> {
    let mut order: Vec<&TrueProc> = procs.iter().collect();
    order.sort_by_key(|p| (p.tracked, std::cmp::Reverse(p.used), p.pid));
    let mut out = Vec::new();
    for p in order {
        if used <= ceiling {
            break;
        }
        out.push(p.pid);
        used -= p.used;
    }
    out
}

#[cfg(test)]
mod tests;
