//! The NVML-truth watchdog's logic: which container each GPU process NVML lists belongs to (`attribute`),
//! and what is wrong (`decide`): a container whose processes truly hold more than its quota plus a
//! tolerance on a GPU, a ledger whose total is below what its own processes truly hold, or a ledger whose
//! total disagrees with the sum of its slots. Under the kill policy it names the processes to kill: those
//! without a ledger slot (they bypass the library) first, largest first, then the others, only as many as
//! bring the container back within quota plus tolerance. A container within its quota is never touched.
//! Not here: reading the state, NVML or /proc (`state`, `nvml`, `procs`), logging and counting (`mod`).

use super::state::ContainerState;
use std::collections::BTreeMap;
use vgpu_host::nvml::GpuReading;
use vgpu_host::procs::{cgroup_within, HostProc};

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
/// PID namespace is not its process.
pub fn owner_of(containers: &[ContainerState], p: &HostProc, host_ns: u64) -> Option<usize> {
    let live = || (0..containers.len()).filter(|&i| containers[i].live);
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
                let c = owner_of(containers, hp, host_ns)?;
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

/// The watchdog's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Bytes beyond a quota (or below the truth, for a ledger) that are not reported.
    pub tolerance: u64,
    /// Kill the processes that put a container over its quota.
    pub kill: bool,
}

/// What the watchdog found on one container's GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// The container's processes truly hold `truth` bytes, more than `limit` + tolerance.
    OverQuota {
        c: usize,
        g: usize,
        truth: u64,
        limit: u64,
        procs: Vec<TrueProc>,
        /// Host PIDs to kill (empty without the kill policy).
        kill: Vec<u32>,
    },
    /// Over the quota as `OverQuota`, but `vgpuctl update` lowered the quota from `from`, the container's
    /// processes hold no more than they may have taken under it (`truth` within `from` + tolerance) and
    /// the ledger itself is over the new quota (the library knows and refuses): memory held from before
    /// the shrink, kept until freed. Never killed.
    PendingShrink {
        c: usize,
        g: usize,
        truth: u64,
        limit: u64,
        from: u64,
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

/// Compares each container's truth with its quota and its ledger.
pub fn decide(containers: &[ContainerState], truth: &Truth, policy: Policy) -> Vec<Finding> {
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
            let ceiling = limit.saturating_add(policy.tolerance);
            let shrinking = gs
                .shrunk_from
                .filter(|&from| used <= from.saturating_add(policy.tolerance) && gs.total > limit);
            if let (true, Some(from)) = (used > ceiling, shrinking) {
                out.push(Finding::PendingShrink {
                    c,
                    g,
                    truth: used,
                    limit,
                    from,
                });
            } else if used > ceiling {
                let kill = if policy.kill {
                    victims(&procs, used, ceiling)
                } else {
                    vec![]
                };
                out.push(Finding::OverQuota {
                    c,
                    g,
                    truth: used,
                    limit,
                    procs,
                    kill,
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
mod tests {
    use super::super::state::GpuState;
    use super::*;

    const MIB: u64 = 1 << 20;
    const U0: &str = "GPU-0";
    const U1: &str = "GPU-1";

    fn container(
        id: &str,
        ns: u64,
        limit: u64,
        total: u64,
        owners: Vec<(u32, u64)>,
    ) -> ContainerState {
        ContainerState {
            id: id.into(),
            pid_ns: Some(ns),
            live: true,
            gpus: vec![GpuState {
                uuid: U0.into(),
                limit: Some(limit),
                total,
                slots_sum: total,
                owners,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn reading(uuid: &str, procs: Vec<(u32, u64)>) -> GpuReading {
        GpuReading {
            uuid: uuid.into(),
            processes: Some(procs),
            ..Default::default()
        }
    }

    /// A container that records its cgroup.
    fn in_cgroup(mut c: ContainerState, cgroup: &str) -> ContainerState {
        c.cgroup = Some(cgroup.into());
        c
    }

    /// Host PID → (ns, inner pid, cgroup) for the tests' world.
    fn world(pid: u32) -> Option<HostProc> {
        let (ns, inner, cg) = match pid {
            100 => (1, 1, "0::/a"),
            101 => (1, 7, "0::/a"),
            200 => (2, 1, "0::/b"),
            300 => (3, 1, "0::/pod/libpod-x"),
            301 => (3, 2, "4:memory:/pod/crio-y\n0::/pod/crio-y"),
            302 => (3, 3, "0::/pod/crio-y/inner"),
            303 => (3, 4, "0::/pod/sidecar"),
            400 => (9, 1, "0::/system.slice/docker-c.scope"),
            500 => (HOST, 500, "0::/user.slice/session-1.scope"),
            501 => (HOST, 501, "0::/system.slice/docker-h.scope"),
            _ => return None,
        };
        Some(HostProc {
            pid,
            ns,
            inner_pid: inner,
            start_time: 1000 + pid as u64,
            cgroup: Some(cg.into()),
        })
    }

    /// The tests' host PID namespace.
    const HOST: u64 = 1000;

    const POLICY: Policy = Policy {
        tolerance: 64 * MIB,
        kill: true,
    };

    #[test]
    fn attributes_by_recorded_cgroup_then_pid_namespace() {
        let cs = vec![
            container("a", 1, 1024 * MIB, 0, vec![(1, 1)]),
            container("b", 2, 1024 * MIB, 0, vec![]),
            // A pod sharing PID namespace 3, its cgroups named as CRI-O's and Podman's cgroupfs name them.
            in_cgroup(container("x", 3, 1024 * MIB, 0, vec![]), "/pod/libpod-x"),
            in_cgroup(container("y", 3, 1024 * MIB, 0, vec![]), "/pod/crio-y"),
            in_cgroup(
                container("c", 99, 1024 * MIB, 0, vec![]),
                "/system.slice/docker-c.scope",
            ),
        ];
        let r = vec![
            reading(
                U0,
                vec![
                    (100, 10),
                    (101, 20),
                    (200, 30),
                    (300, 40),
                    (301, 50),
                    (302, 55),
                    (303, 57),
                    (400, 60),
                    (555, 70),
                ],
            ),
            reading(U1, vec![(200, 5)]),
        ];
        let t = attribute(&cs, &r, world, HOST);
        let pids = |c: usize| -> Vec<(u32, bool)> {
            t.by_gpu[&(c, 0)]
                .iter()
                .map(|p| (p.pid, p.tracked))
                .collect()
        };
        assert_eq!(pids(0), vec![(100, true), (101, false)]);
        assert_eq!(pids(1), vec![(200, false)]);
        // Two containers share namespace 3: each recorded cgroup holds its own (and what is below it).
        assert_eq!(pids(2), vec![(300, false)]);
        assert_eq!(pids(3), vec![(301, false), (302, false)]);
        // Another namespace than the one recorded: the recorded cgroup tells container "c".
        assert_eq!(pids(4), vec![(400, false)]);
        assert_eq!(
            t.by_gpu[&(4, 0)][0].start_time,
            1400,
            "the identity is kept"
        );
        // 555 is nobody's; 303, a sidecar in the pod's namespace but in none of its containers' cgroups,
        // is nobody's either; 200 on GPU-1 is b's, but b has no quota there.
        assert_eq!(t.unattributed, 3);
        assert_eq!(t.used(0, 0), 30);
        assert!(t.knows(U1));
    }

    // A container whose init is gone (stopped, its state kept until deleted) names nothing: the kernel
    // reuses its namespace inode for another container, whose process must not be taken for its own.
    #[test]
    fn a_gone_containers_namespace_and_cgroup_name_nothing() {
        let mut stale = container("stale", 2, 512 * MIB, 0, vec![]);
        stale.live = false;
        let mut stale_cg = in_cgroup(container("old", 9, 512 * MIB, 0, vec![]), "/system.slice");
        stale_cg.live = false;
        let cs = vec![stale, stale_cg];
        let procs = [reading(U0, vec![(200, 1024 * MIB), (400, 1024 * MIB)])];
        let t = attribute(&cs, &procs, world, HOST);
        assert!(t.by_gpu.is_empty(), "{t:?}");
        assert_eq!(t.unattributed, 2);
        assert_eq!(decide(&cs, &t, POLICY), vec![]);
        // Alive (its init as recorded): both are its.
        let cs: Vec<_> = cs
            .into_iter()
            .map(|c| ContainerState { live: true, ..c })
            .collect();
        assert_eq!(attribute(&cs, &procs, world, HOST).unattributed, 0);
    }

    #[test]
    fn state_marks_a_container_live_only_with_its_init_as_recorded() {
        let mut cs = vec![
            container("a", 1, MIB, 0, vec![]),
            container("b", 2, MIB, 0, vec![]),
        ];
        cs[0].init_pid = Some(10);
        cs[0].init_start_time = Some(77);
        super::super::state::mark_live(&mut cs, |pid, ns, start| {
            (pid, ns, start) == (10, 1, Some(77))
        });
        assert!(cs[0].live);
        assert!(!cs[1].live, "no owner recorded: not live");
    }

    #[test]
    fn the_host_pid_namespace_names_no_container() {
        // Container h runs with the host's PIDs: only its cgroup can name its processes.
        let cs = vec![in_cgroup(
            container("h", HOST, 1024 * MIB, 0, vec![]),
            "/system.slice/docker-h.scope",
        )];
        let t = attribute(
            &cs,
            &[reading(U0, vec![(500, 2048 * MIB), (501, 10 * MIB)])],
            world,
            HOST,
        );
        assert_eq!(
            t.by_gpu[&(0, 0)],
            vec![TrueProc {
                pid: 501,
                start_time: 1501,
                used: 10 * MIB,
                tracked: false
            }]
        );
        assert_eq!(t.unattributed, 1, "the host's process is nobody's");
        assert_eq!(decide(&cs, &t, POLICY), vec![], "and is never killed for h");
    }

    #[test]
    fn over_quota_kills_the_untracked_process_first_and_only_as_many_as_needed() {
        // a: quota 1 GiB; its tracked process 100 holds 600 MiB, untracked 101 holds 700 MiB.
        let cs = vec![
            container("a", 1, 1024 * MIB, 600 * MIB, vec![(1, 1)]),
            container("b", 2, 1024 * MIB, 1000 * MIB, vec![(1, 2)]),
        ];
        let r = vec![reading(
            U0,
            vec![(100, 600 * MIB), (101, 700 * MIB), (200, 1000 * MIB)],
        )];
        let t = attribute(&cs, &r, world, HOST);
        let f = decide(&cs, &t, POLICY);
        assert_eq!(f.len(), 1, "{f:?}");
        match &f[0] {
            Finding::OverQuota {
                c,
                truth,
                limit,
                kill,
                ..
            } => {
                assert_eq!((*c, *truth, *limit), (0, 1300 * MIB, 1024 * MIB));
                assert_eq!(
                    kill,
                    &vec![101],
                    "the bypassing process, not the tracked one"
                );
            }
            f => panic!("{f:?}"),
        }
        // Without the policy: reported, nothing to kill.
        let f = decide(
            &cs,
            &t,
            Policy {
                kill: false,
                ..POLICY
            },
        );
        assert!(matches!(&f[0], Finding::OverQuota { kill, .. } if kill.is_empty()));
    }

    // A GPU listed for its compute share alone: its processes hold memory the library never charges
    // (no quota, no slot); they are neither over a quota nor killed as bypassing it.
    // Issue 27: a quota lowered below what the container holds read as an escape (over_quota, killed
    // under the kill policy) though the library admitted that memory under the old quota.
    #[test]
    fn a_shrink_below_use_is_pending_not_an_escape_until_memory_passes_the_old_quota() {
        let kill = Policy {
            tolerance: 0,
            kill: true,
        };
        let mut cs = vec![container("a", 1, 1024 * MIB, 1500 * MIB, vec![(1, 1)])];
        cs[0].gpus[0].shrunk_from = Some(2048 * MIB);
        let truth = |cs: &[ContainerState], used| {
            attribute(cs, &[reading(U0, vec![(100, used)])], world, HOST)
        };
        let f = decide(&cs, &truth(&cs, 1500 * MIB), kill);
        assert!(
            matches!(f[..], [Finding::PendingShrink { truth, limit, from, .. }] if (truth, limit, from) == (1500 * MIB, 1024 * MIB, 2048 * MIB)),
            "{f:?}"
        );
        // past the quota it came from: an escape again
        let f = decide(&cs, &truth(&cs, 2100 * MIB), kill);
        assert!(
            f.iter()
                .any(|f| matches!(f, Finding::OverQuota { kill, .. } if !kill.is_empty())),
            "{f:?}"
        );
        // a ledger back under the new quota cannot be holding it: the excess is not the shrink's
        cs[0].gpus[0].total = 1000 * MIB;
        cs[0].gpus[0].slots_sum = 1000 * MIB;
        assert!(decide(&cs, &truth(&cs, 1500 * MIB), kill)
            .iter()
            .any(|f| matches!(f, Finding::OverQuota { .. })));
    }

    #[test]
    fn a_compute_share_alone_has_no_quota_to_pass() {
        let mut cs = vec![container("a", 1, 0, 0, vec![])];
        cs[0].gpus[0].limit = None;
        cs[0].gpus[0].compute_limit = Some(30);
        let t = attribute(&cs, &[reading(U0, vec![(100, 8000 * MIB)])], world, HOST);
        assert_eq!(decide(&cs, &t, POLICY), vec![]);
    }

    #[test]
    fn within_quota_plus_tolerance_is_never_touched() {
        let cs = vec![container("a", 1, 1024 * MIB, 1000 * MIB, vec![(1, 1)])];
        // 1024 + 60 MiB: over the quota but within the tolerance.
        let t = attribute(
            &cs,
            &[reading(U0, vec![(100, 1000 * MIB), (101, 84 * MIB)])],
            world,
            HOST,
        );
        assert_eq!(decide(&cs, &t, POLICY), vec![]);
        // Exactly at the quota, nothing untracked.
        let t = attribute(&cs, &[reading(U0, vec![(100, 1024 * MIB)])], world, HOST);
        assert_eq!(decide(&cs, &t, POLICY), vec![]);
    }

    #[test]
    fn only_tracked_processes_over_quota_are_killed_largest_first() {
        let mut a = container("a", 1, 1024 * MIB, 0, vec![(1, 1), (7, 1)]);
        a.gpus[0].total = 2000 * MIB;
        a.gpus[0].slots_sum = 2000 * MIB;
        let t = attribute(
            &[a.clone()],
            &[reading(U0, vec![(100, 1200 * MIB), (101, 800 * MIB)])],
            world,
            HOST,
        );
        let f = decide(&[a], &t, POLICY);
        assert!(
            matches!(&f[0], Finding::OverQuota { kill, .. } if kill == &vec![100]),
            "{f:?}"
        );
    }

    #[test]
    fn a_zeroed_ledger_and_an_inconsistent_one_are_reported() {
        // The tenant zeroed the total: its process truly holds 500 MiB.
        let mut a = container("a", 1, 1024 * MIB, 0, vec![(1, 1)]);
        a.gpus[0].slots_sum = 500 * MIB;
        let t = attribute(
            &[a.clone()],
            &[reading(U0, vec![(100, 500 * MIB)])],
            world,
            HOST,
        );
        let f = decide(&[a], &t, POLICY);
        assert_eq!(
            f,
            vec![
                Finding::LedgerInconsistent {
                    c: 0,
                    g: 0,
                    total: 0,
                    slots_sum: 500 * MIB
                },
                Finding::LedgerBelowTruth {
                    c: 0,
                    g: 0,
                    total: 0,
                    truth: 500 * MIB
                },
            ]
        );
        // Without NVML's list for the GPU there is no truth to compare.
        let a = container("a", 1, 1024 * MIB, 0, vec![(1, 1)]);
        let t = attribute(
            std::slice::from_ref(&a),
            &[GpuReading {
                uuid: U0.into(),
                ..Default::default()
            }],
            world,
            HOST,
        );
        assert_eq!(decide(&[a], &t, POLICY), vec![]);
    }
}
