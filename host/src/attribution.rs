//! Which container each GPU process NVML lists belongs to: by the cgroup its container recorded, else by
//! its PID namespace, only among live containers (`owner_of`), and what each container's processes truly
//! hold on each of its GPUs (`attribute`, its `Truth`). The watchdog decides on it (`vgpu_monitor`), and
//! `vgpuctl update` measures a shrink by it (`held`). Containers of HAMi's folders (`usage::Origin::Hami`)
//! recorded neither cgroup nor namespace unless their containerd bundle was found (`hami::bundle`: then
//! they are matched as the state root's are); the others are given only processes no other container
//! claims (`hami_owner`), so nothing a tenant writes in its ledger takes a process from another container.
//! Not here: reading `/proc` (`procs`) or NVML (`nvml`).

use crate::nvml::GpuReading;
use crate::procs::{cgroup_within, HostProc};
use crate::usage::{ContainerState, Origin};
use std::collections::BTreeMap;

/// A GPU process attributed to a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrueProc {
    /// Host PID.
    pub pid: u32,
    /// When it started (with the PID, its identity: a kill signals only this process).
    pub start_time: u64,
    pub used: u64,
    /// It owns a live slot of the container's ledger on that GPU (it runs under the library).
    pub tracked: bool,
}

/// NVML's processes by (container, GPU) index into the states read; processes of no known container are
/// counted apart.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Truth {
    pub by_gpu: BTreeMap<(usize, usize), Vec<TrueProc>>,
    /// NVML listed each GPU's processes (else no truth to compare for it).
    pub listed: Vec<String>,
    pub unattributed: usize,
}

impl Truth {
    /// The bytes a container's processes truly hold on one of its GPUs.
    pub fn used(&self, c: usize, g: usize) -> u64 {
        self.by_gpu
            .get(&(c, g))
            .map_or(0, |ps| ps.iter().map(|p| p.used).sum())
    }

    /// True when NVML's process list for `uuid` was read.
    pub fn knows(&self, uuid: &str) -> bool {
        self.listed.iter().any(|u| u == uuid)
    }
}

/// The container a host process belongs to, among the live ones (`ContainerState::live`: a container
/// whose init is gone names nothing, its namespace inode may be another's now):
/// 1. the one whose cgroup, recorded at creation, holds the process's cgroup (equal to it or above it; the
///    deepest when nested): exact paths, whatever the engine's naming (`crio-<id>`, `libpod-<id>`,
///    `docker-<id>.scope`, ...), and right for containers sharing a PID namespace (a pod) or running
///    with the host's PIDs;
/// 2. else, among those without a recorded cgroup (state written before it was recorded, or a runtime
///    that gave the container no cgroup of its own), the only one whose PID namespace it lives in. The
///    host's own PID namespace (`host_ns`) names no container: every host process lives there.
///
/// A container with a recorded cgroup is never given a process outside it: a pod's sidecar sharing its
/// PID namespace is not its process. Containers of HAMi's folders are named here only with the bundle the
/// host recorded (`hami::bundle`: its init's cgroup and namespace); the others by [`hami_owner`].
pub fn owner_of(containers: &[ContainerState], p: &HostProc, host_ns: u64) -> Option<usize> {
    let live = || (0..containers.len()).filter(|&i| containers[i].live && containers[i].enforced());
    if let Some(cg) = p.unified_cgroup() {
        let by_cgroup = live()
            .filter_map(|i| Some((i, containers[i].cgroup.as_deref()?)))
            .filter(|(_, base)| cgroup_within(&cg, base))
            .max_by_key(|(_, base)| base.len());
        if let Some((i, _)) = by_cgroup {
            return Some(i);
        }
    }
    let by_ns: Vec<usize> = live()
        .filter(|&i| containers[i].cgroup.is_none())
        .filter(|&i| p.ns != host_ns && containers[i].pid_ns == Some(p.ns))
        .collect();
    match by_ns[..] {
        [one] => Some(one),
        _ => None,
    }
}

/// The live container of HAMi's folders without a host record (`usage::Origin::Hami`'s `bundle` None) a
/// host process belongs to, for a process no other container owns ([`owner_of`] first). Such a container
/// recorded nothing the host wrote but its folder's name, so:
/// 1. a process whose cgroup is a kubelet's pod cgroup (`hami::kubelet_pod_uid`) is only ever one of that
///    pod's containers (the host's record: a tenant names neither its cgroup nor its folder);
/// 2. among those (or, outside a pod's cgroup, among all but in the host's PID namespace), the only one
///    with a live slot of its ledgers owned by the process (its PID inside and its namespace), else the
///    only one with a live slot in the process's PID namespace (a process that bypasses the library, or
///    before its first allocation), else, in a pod's cgroup, the pod's only container.
///
/// Slots are the tenant's writing: where no pod cgroup tells, a tenant can claim a process of a namespace
/// it names (two claims name none). So these containers are reported on, never enforced on.
pub fn hami_owner(containers: &[ContainerState], p: &HostProc, host_ns: u64) -> Option<usize> {
    let pod = p
        .unified_cgroup()
        .and_then(|cg| crate::hami::kubelet_pod_uid(&cg));
    let candidates: Vec<usize> = (0..containers.len())
        .filter(|&i| containers[i].live)
        .filter(|&i| match (&containers[i].origin, &pod) {
            (
                Origin::Hami {
                    bundle: Some(_), ..
                },
                _,
            ) => false,
            (Origin::Hami { pod_uid, .. }, Some(uid)) => pod_uid.eq_ignore_ascii_case(uid),
            (Origin::Hami { .. }, None) => p.ns != host_ns,
            (Origin::StateRoot, _) => false,
        })
        .collect();
    let only = |keep: &dyn Fn(&ContainerState) -> bool| -> Option<usize> {
        match candidates
            .iter()
            .filter(|&&i| keep(&containers[i]))
            .collect::<Vec<_>>()[..]
        {
            [one] => Some(*one),
            _ => None,
        }
    };
    let owners = |c: &ContainerState| {
        c.gpus
            .iter()
            .flat_map(|g| g.owners.clone())
            .collect::<Vec<_>>()
    };
    only(&|c| owners(c).contains(&(p.inner_pid, p.ns)))
        .or_else(|| only(&|c| owners(c).iter().any(|o| o.1 == p.ns)))
        .or_else(|| match candidates[..] {
            [one] if pod.is_some() => Some(one),
            _ => None,
        })
}

/// Attributes every process NVML lists to a container's GPU. `inspect` reads a host PID's `/proc`;
/// `host_ns` is the monitor's own PID namespace.
pub fn attribute(
    containers: &[ContainerState],
    readings: &[GpuReading],
    inspect: impl Fn(u32) -> Option<HostProc>,
    host_ns: u64,
) -> Truth {
    let mut t = Truth::default();
    let mut seen: BTreeMap<u32, Option<HostProc>> = BTreeMap::new();
    for r in readings {
        let Some(procs) = &r.processes else { continue };
        t.listed.push(r.uuid.clone());
        for &(pid, used) in procs {
            let hp = seen.entry(pid).or_insert_with(|| inspect(pid));
            let place = hp.as_ref().and_then(|hp| {
                let c = owner_of(containers, hp, host_ns)
                    .or_else(|| hami_owner(containers, hp, host_ns))?;
                let g = containers[c].gpus.iter().position(|g| g.uuid == r.uuid)?;
                let tracked = containers[c].gpus[g]
                    .owners
                    .contains(&(hp.inner_pid, hp.ns));
                Some((c, g, tracked))
            });
            match place {
                Some((c, g, tracked)) => t.by_gpu.entry((c, g)).or_default().push(TrueProc {
                    pid,
                    start_time: hp.as_ref().map_or(0, |hp| hp.start_time),
                    used,
                    tracked,
                }),
                None => t.unattributed += 1,
            }
        }
    }
    t
}

#[cfg(test)]
mod tests;
