//! Unit tests of the watchdog: findings, kills, pending shrinks, on processes attributed by cgroup and PID
//! namespace (`vgpu_host::attribution`, whose cases are here beside the decisions they feed).
use super::*;
use vgpu_host::attribution::attribute;
use vgpu_host::nvml::GpuReading;
use vgpu_host::procs::HostProc;
use vgpu_host::usage::GpuState;

const MIB: u64 = 1 << 20;
const U0: &str = "GPU-0";
const U1: &str = "GPU-1";

fn container(id: &str, ns: u64, limit: u64, total: u64, owners: Vec<(u32, u64)>) -> ContainerState {
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

/// No pass before: every pending shrink allows what its limits.json recorded.
const NONE: Shrinks = Shrinks {
    marks: BTreeMap::new(),
};

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
    assert_eq!(decide(&cs, &t, POLICY, &NONE), vec![]);
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
    vgpu_host::usage::mark_live(&mut cs, |pid, ns, start| {
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
    assert_eq!(
        decide(&cs, &t, POLICY, &NONE),
        vec![],
        "and is never killed for h"
    );
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
    let f = decide(&cs, &t, POLICY, &NONE);
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
        &NONE,
    );
    assert!(matches!(&f[0], Finding::OverQuota { kill, .. } if kill.is_empty()));
}

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
    let truth =
        |cs: &[ContainerState], used| attribute(cs, &[reading(U0, vec![(100, used)])], world, HOST);
    let f = decide(&cs, &truth(&cs, 1500 * MIB), kill, &NONE);
    assert!(
        matches!(f[..], [Finding::PendingShrink { truth, limit, from, .. }] if (truth, limit, from) == (1500 * MIB, 1024 * MIB, 2048 * MIB)),
        "{f:?}"
    );
    // past the quota it came from: an escape again
    let f = decide(&cs, &truth(&cs, 2100 * MIB), kill, &NONE);
    assert!(
        f.iter()
            .any(|f| matches!(f, Finding::OverQuota { kill, .. } if !kill.is_empty())),
        "{f:?}"
    );
    // a ledger back under the new quota cannot be holding it: the excess is not the shrink's
    cs[0].gpus[0].total = 1000 * MIB;
    cs[0].gpus[0].slots_sum = 1000 * MIB;
    assert!(decide(&cs, &truth(&cs, 1500 * MIB), kill, &NONE)
        .iter()
        .any(|f| matches!(f, Finding::OverQuota { .. })));
}

/// Container "a" (quota 1 GiB) after `vgpuctl update` lowered it from 2 GiB while it held `held`; its
/// ledger says `total`.
fn shrunk(held: Option<u64>, total: u64) -> Vec<ContainerState> {
    let mut cs = vec![container("a", 1, 1024 * MIB, total, vec![(1, 1)])];
    cs[0].gpus[0].shrunk_from = Some(2048 * MIB);
    cs[0].gpus[0].held_at_shrink = held;
    cs
}

/// NVML's truth: a's process 100 holds `used`.
fn holding(cs: &[ContainerState], used: u64) -> Truth {
    attribute(cs, &[reading(U0, vec![(100, used)])], world, HOST)
}

const KILL: Policy = Policy {
    tolerance: 0,
    kill: true,
};

// The pending-shrink hole: a tenant that keeps its ledger's generation word odd never reads the shrink,
// so its processes go on allocating under the old quota, and the watchdog took all of that for memory
// held from before the shrink (pending_shrink, never killed) up to the old quota. Failed before: 1900
// MiB after a shrink at which it held 1500 MiB was a PendingShrink, and nothing was killed.
#[test]
fn memory_taken_after_a_shrink_past_what_was_held_then_is_over_quota_and_killed() {
    let cs = shrunk(Some(1500 * MIB), 1500 * MIB);
    let f = decide(&cs, &holding(&cs, 1500 * MIB), KILL, &NONE);
    assert!(
        matches!(f[..], [Finding::PendingShrink { truth, limit, from, held, .. }]
            if (truth, limit, from, held) == (1500 * MIB, 1024 * MIB, 2048 * MIB, 1500 * MIB)),
        "what it held at the shrink is kept: {f:?}"
    );
    // 400 MiB more, still under the quota it came from (the tenant also forged its ledger up)
    let cs = shrunk(Some(1500 * MIB), 1900 * MIB);
    let f = decide(&cs, &holding(&cs, 1900 * MIB), KILL, &NONE);
    assert!(
        matches!(&f[..], [Finding::OverQuota { truth, limit, allowed, kill, .. }]
            if (*truth, *limit, *allowed) == (1900 * MIB, 1024 * MIB, 1500 * MIB) && kill == &vec![100]),
        "{f:?}"
    );
    // within the tolerance past what it held: left alone
    let lenient = Policy {
        tolerance: 64 * MIB,
        ..KILL
    };
    let f = decide(&cs, &holding(&cs, 1550 * MIB), lenient, &NONE);
    assert!(matches!(f[..], [Finding::PendingShrink { .. }]), "{f:?}");
    // held less than the new quota at the shrink: the quota, as for any container
    let cs = shrunk(Some(800 * MIB), 1100 * MIB);
    let f = decide(&cs, &holding(&cs, 1100 * MIB), KILL, &NONE);
    assert!(
        matches!(&f[..], [Finding::OverQuota { allowed, kill, .. }] if *allowed == 1024 * MIB && !kill.is_empty()),
        "{f:?}"
    );
}

// The tolerance follows the truth down, pass after pass: what a container freed during a pending shrink
// it cannot take again (its library refuses; a tenant that hid the shrink from its library is over
// quota). A restarted monitor (no marks) starts again from the figure the shrink recorded; a new shrink
// (another figure) starts from its own; a shrink recorded before the figure existed starts from the
// quota it came from.
#[test]
fn a_pending_shrinks_allowance_follows_the_truth_down_and_starts_again_from_the_record() {
    let mut marks = Shrinks::default();
    let pass = |cs: &[ContainerState], used, marks: &mut Shrinks| {
        let t = holding(cs, used);
        let f = decide(cs, &t, KILL, marks);
        marks.follow(cs, &t);
        f
    };
    let cs = shrunk(Some(1500 * MIB), 1500 * MIB);
    assert!(
        matches!(pass(&cs, 1500 * MIB, &mut marks)[..], [Finding::PendingShrink { held, .. }] if held == 1500 * MIB)
    );
    assert!(
        matches!(pass(&cs, 1200 * MIB, &mut marks)[..], [Finding::PendingShrink { held, .. }] if held == 1500 * MIB)
    );
    let f = pass(&cs, 1400 * MIB, &mut marks);
    assert!(
        matches!(&f[..], [Finding::OverQuota { allowed, kill, .. }] if *allowed == 1200 * MIB && kill == &vec![100]),
        "freed, then taken again: {f:?}"
    );
    assert_eq!(
        marks.allowance(&cs[0], &cs[0].gpus[0]),
        Some(1200 * MIB),
        "never up"
    );
    // a restarted monitor: from the recorded figure
    assert!(matches!(
        decide(&cs, &holding(&cs, 1400 * MIB), KILL, &NONE)[..],
        [Finding::PendingShrink { .. }]
    ));
    // under the new quota: the quota from then on
    assert_eq!(pass(&cs, 900 * MIB, &mut marks), vec![]);
    assert_eq!(marks.allowance(&cs[0], &cs[0].gpus[0]), Some(1024 * MIB));
    // another shrink, another recorded figure: its own start
    let cs = shrunk(Some(1300 * MIB), 1300 * MIB);
    assert!(
        matches!(pass(&cs, 1300 * MIB, &mut marks)[..], [Finding::PendingShrink { held, .. }] if held == 1300 * MIB)
    );
    // from a vgpuctl before held_at_shrink: the quota it came from, then down with the truth
    let mut marks = Shrinks::default();
    let cs = shrunk(None, 1500 * MIB);
    assert!(
        matches!(pass(&cs, 1500 * MIB, &mut marks)[..], [Finding::PendingShrink { held, .. }] if held == 2048 * MIB)
    );
    let cs = shrunk(None, 1800 * MIB);
    assert!(matches!(
        pass(&cs, 1800 * MIB, &mut marks)[..],
        [Finding::OverQuota { allowed, .. }] if allowed == 1500 * MIB
    ));
    // grown back past the quota it came from: the mark goes
    let mut grown = cs.clone();
    grown[0].gpus[0].shrunk_from = None;
    pass(&grown, 500 * MIB, &mut marks);
    assert_eq!(marks, Shrinks::default());
}

// A GPU listed for its compute share alone: its processes hold memory the library never charges
// (no quota, no slot); they are neither over a quota nor killed as bypassing it.
#[test]
fn a_compute_share_alone_has_no_quota_to_pass() {
    let mut cs = vec![container("a", 1, 0, 0, vec![])];
    cs[0].gpus[0].limit = None;
    cs[0].gpus[0].compute_limit = Some(30);
    let t = attribute(&cs, &[reading(U0, vec![(100, 8000 * MIB)])], world, HOST);
    assert_eq!(decide(&cs, &t, POLICY, &NONE), vec![]);
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
    assert_eq!(decide(&cs, &t, POLICY, &NONE), vec![]);
    // Exactly at the quota, nothing untracked.
    let t = attribute(&cs, &[reading(U0, vec![(100, 1024 * MIB)])], world, HOST);
    assert_eq!(decide(&cs, &t, POLICY, &NONE), vec![]);
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
    let f = decide(&[a], &t, POLICY, &NONE);
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
    let f = decide(&[a], &t, POLICY, &NONE);
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
    assert_eq!(decide(&[a], &t, POLICY, &NONE), vec![]);
}

/// A container of HAMi's folders over the quota its ledger records: reported, never a process to kill,
/// whatever the kill policy (its quota is a file its tenant writes); with its bundle's spec, killed.
#[test]
fn a_hami_container_is_killed_only_with_its_bundles_quota() {
    let mut c = container("hami/p_main", 0, 512 * MIB, 0, vec![]);
    c.pid_ns = None;
    c.origin = vgpu_host::usage::Origin::Hami {
        pod_uid: "p".into(),
        container: "main".into(),
        dir: "/usr/local/vgpu/containers/p_main".into(),
        bundle: None,
    };
    let truth = Truth {
        by_gpu: [(
            (0, 0),
            vec![TrueProc {
                pid: 4242,
                start_time: 1,
                used: 800 * MIB,
                tracked: false,
            }],
        )]
        .into(),
        listed: vec![U0.into()],
        unattributed: 0,
    };
    let policy = Policy {
        tolerance: 64 * MIB,
        kill: true,
    };
    let f = decide(&[c.clone()], &truth, policy, &Shrinks::default());
    assert!(
        matches!(&f[..], [Finding::OverQuota { kill, truth, .. }] if kill.is_empty() && *truth == 800 * MIB),
        "{f:?}"
    );
    // The same container with its bundle's spec (the quota the host recorded), and one of the state
    // root, are killed.
    let bundle = Some("/run/containerd/io.containerd.runtime.v2.task/k8s.io/c1".into());
    if let vgpu_host::usage::Origin::Hami { bundle: b, .. } = &mut c.origin {
        *b = bundle;
    }
    for origin in [c.origin.clone(), vgpu_host::usage::Origin::StateRoot] {
        c.origin = origin;
        let f = decide(&[c.clone()], &truth, policy, &Shrinks::default());
        assert!(
            matches!(&f[..], [Finding::OverQuota { kill, .. }] if kill == &[4242]),
            "{f:?}"
        );
    }
}
