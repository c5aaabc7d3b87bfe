//! The kill policy's side of a collection: the watchdog pass (findings logged once when they begin; under
//! the kill policy, the processes that put a container over its quota SIGKILLed) and the kills of what the
//! share wall or the time-quanta arbiter found running on while its container is frozen, each through a
//! pidfd and only while it is still the process attributed (`vgpu_host::procs::kill_checked`). Not here:
//! the decisions (`watchdog`, `share_wall`, `turns`).

use crate::collector::{Monitor, Reading};
use crate::metrics;
use crate::share_run;
use crate::stderr::{log, who};
use crate::watchdog::{self, Finding};
use std::collections::BTreeMap;
use vgpu_host::attribution;
use vgpu_host::procs;
use vgpu_host::usage::Origin;
use vgpu_ledger::format_bytes;

impl Monitor {
    /// Kills, under the kill policy, the processes the share wall or the time-quanta arbiter (`by`) found
    /// busy while their container is frozen (`share_run::Victim`), as the watchdog kills: through a pidfd,
    /// only while each is still the process NVML listed and still the container's. Counted with the
    /// watchdog's kills.
    pub(crate) fn kill_runaways(&self, r: &Reading, victims: &[share_run::Victim], by: &str) {
        if victims.is_empty() {
            return;
        }
        let mut w = self.watch.lock().unwrap_or_else(|e| e.into_inner());
        for v in victims {
            let (cs, pid) = (&r.containers[v.c], v.proc_.pid);
            match self.kill(r, v.c, &v.proc_) {
                Ok(()) => {
                    w.kills += 1;
                    log(&format!(
                        "killed pid {pid} (SIGKILL) of {} on GPU {}: its work ran on while the container was frozen ({by})",
                        who(cs),
                        cs.gpus[v.g].uuid
                    ));
                }
                Err(e) => {
                    w.kill_failures += 1;
                    log(&format!("could not kill pid {pid} of {}: {e:#}", who(cs)));
                }
            }
        }
    }

    /// One watchdog pass over `r`: findings logged when they begin, kills under the policy. Nothing to do
    /// without NVML.
    pub(crate) fn pass_on(&self, r: &Reading) {
        if r.gpus.is_none() {
            return;
        }
        let mut w = self.watch.lock().unwrap_or_else(|e| e.into_inner());
        let findings = watchdog::decide(&r.containers, &r.truth, self.policy, &w.shrinks);
        // A state root that could not be listed shows no container: their marks are kept for the next.
        if r.state_error.is_none() {
            w.shrinks.follow(&r.containers, &r.truth);
        }
        w.passes += 1;
        let mut open = BTreeMap::new();
        for f in &findings {
            let (c, g, kind) = f.key();
            let (cs, gs) = (&r.containers[c], &r.containers[c].gpus[g]);
            let key = (cs.id.clone(), gs.uuid.clone(), kind);
            if !w.open.contains_key(&key) {
                *w.events.entry(kind).or_default() += 1;
                log(&describe(f, r));
            }
            open.insert(key, metrics::container_labels(cs, g));
            if let Finding::OverQuota { kill, procs, .. } = f {
                for &pid in kill {
                    let Some(p) = procs.iter().find(|p| p.pid == pid) else {
                        continue;
                    };
                    match self.kill(r, c, p) {
                        Ok(()) => {
                            w.kills += 1;
                            log(&format!(
                                "killed pid {pid} (SIGKILL) of {} on GPU {}: the container was over its quota",
                                who(cs),
                                gs.uuid
                            ));
                        }
                        Err(e) => {
                            w.kill_failures += 1;
                            log(&format!("could not kill pid {pid} of {}: {e:#}", who(cs)));
                        }
                    }
                }
            }
        }
        w.open = open;
    }

    /// SIGKILLs `p`, attributed to container `c`, if it is still that process and still the container's,
    /// through a pidfd (`procs::kill_checked`): the same start time, the container's as `/proc` shows it
    /// now, and the container's init still alive. A PID reused since NVML listed it is left alone.
    fn kill(
        &self,
        r: &Reading,
        c: usize,
        p: &attribution::TrueProc,
    ) -> Result<(), procs::KillError> {
        let seen = procs::HostProc {
            pid: p.pid,
            start_time: p.start_time,
            ..Default::default()
        };
        procs::kill_checked(&seen, |now| {
            if !r.containers[c].enforced() {
                return Err(
                    "a container of HAMi's folders without its bundle's spec is never enforced on",
                );
            }
            if !r.containers[c].init_alive(procs::init_alive) {
                return Err("the container's init process is gone");
            }
            match attribution::owner_of(&r.containers, now, procs::own_ns()) == Some(c) {
                true => Ok(()),
                false => Err("the process no longer belongs to the container"),
            }
        })?;
        Ok(())
    }
}

/// The log line of a finding.
fn describe(f: &Finding, r: &Reading) -> String {
    let (c, g, _) = f.key();
    let (cs, gs) = (&r.containers[c], &r.containers[c].gpus[g]);
    let at = format!("{} GPU {} ({})", who(cs), gs.index, gs.uuid);
    let line = describe_kind(f, gs, at);
    match &cs.origin {
        Origin::StateRoot => line,
        Origin::Hami {
            bundle: Some(b), ..
        } => format!(
            "{line} (HAMi's container: the quota its OCI spec holds, {:?})",
            b.join("config.json")
        ),
        Origin::Hami { bundle: None, .. } => format!(
            "{line} (report only: under HAMi the quota is what its library wrote in the ledger, a file the tenant can write)"
        ),
    }
}

/// The log line of a finding on `gs`, at `at` (the container and its GPU).
fn describe_kind(f: &Finding, gs: &vgpu_host::usage::GpuState, at: String) -> String {
    match f {
        Finding::OverQuota { truth, limit, allowed, procs, kill, .. } => {
            let list: Vec<String> = procs
                .iter()
                .map(|p| {
                    format!(
                        "pid {} {}{}",
                        p.pid,
                        format_bytes(p.used),
                        if p.tracked { "" } else { " without a ledger slot" }
                    )
                })
                .collect();
            let shrink = match allowed > limit {
                true => format!(" (lowered by vgpuctl update; it may keep {} held from before)", format_bytes(*allowed)),
                false => String::new(),
            };
            format!(
                "over quota: {at}: its processes hold {} (NVML), quota {}{shrink}, ledger {}: {}{}",
                format_bytes(*truth),
                format_bytes(*limit),
                format_bytes(gs.total),
                list.join(", "),
                if kill.is_empty() { "" } else { "; killing under the kill policy" }
            )
        }
        Finding::PendingShrink {
            truth, limit, from, held, ..
        } => format!(
            "pending shrink: {at}: its processes hold {} (NVML), over its quota {} by {} since vgpuctl update lowered it from {}; its allocations are refused until it frees that, nothing is killed while it holds no more than {} (what it held at the shrink, or less since)",
            format_bytes(*truth),
            format_bytes(*limit),
            format_bytes(truth.saturating_sub(*limit)),
            format_bytes(*from),
            format_bytes(*held)
        ),
        Finding::LedgerBelowTruth { total, truth, .. } => format!(
            "ledger below the truth: {at}: its ledger's total is {}, its own processes hold {} (NVML): tampered with or charges lost",
            format_bytes(*total),
            format_bytes(*truth)
        ),
        Finding::LedgerInconsistent { total, slots_sum, .. } => format!(
            "ledger inconsistent: {at}: its total is {}, its slots add up to {}",
            format_bytes(*total),
            format_bytes(*slots_sum)
        ),
    }
}
