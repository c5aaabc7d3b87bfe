//! The attribution of processes to containers of HAMi's folders (`hami_owner`); the state root's cases are
//! the monitor's watchdog tests, beside the decisions they feed.
use super::*;
use crate::usage::GpuState;

const HOST: u64 = 4026531836;
const U0: &str = "GPU-0";
const P1: &str = "7c0e3d1a-0000-4000-8000-000000000001";
const P2: &str = "7c0e3d1a-0000-4000-8000-000000000002";

fn hami(pod: &str, owners: Vec<(u32, u64)>) -> ContainerState {
    ContainerState {
        id: format!("hami/{pod}_main"),
        origin: Origin::Hami {
            pod_uid: pod.into(),
            container: "main".into(),
            dir: format!("/usr/local/vgpu/containers/{pod}_main").into(),
            bundle: None,
        },
        gpus: vec![GpuState {
            uuid: U0.into(),
            limit: Some(1 << 30),
            owners,
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn proc_(pid: u32, ns: u64, inner: u32, cgroup: &str) -> HostProc {
    HostProc {
        pid,
        ns,
        inner_pid: inner,
        start_time: 1,
        cgroup: Some(format!("0::{cgroup}\n")),
    }
}

fn live(mut cs: Vec<ContainerState>) -> Vec<ContainerState> {
    crate::usage::mark_live(&mut cs, |_, _, _| true);
    cs
}

#[test]
fn a_hami_folders_container_gets_only_what_no_state_root_container_claims() {
    // A state root container in namespace 10 (no cgroup recorded); two HAMi containers, the first of
    // which also claims namespace 10 in a slot it forged.
    let vgpu = ContainerState {
        id: "a".into(),
        pid_ns: Some(10),
        init_pid: Some(1),
        gpus: vec![GpuState {
            uuid: U0.into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let cs = live(vec![
        vgpu,
        hami(P1, vec![(5, 20), (1, 10)]),
        hami(P2, vec![(7, 30)]),
    ]);
    assert!(
        cs.iter().all(|c| c.live),
        "a slot held makes a HAMi container live"
    );
    let owner = |p: &HostProc| owner_of(&cs, p, HOST).or_else(|| hami_owner(&cs, p, HOST));
    assert_eq!(
        owner(&proc_(100, 10, 1, "/x")),
        Some(0),
        "the state root's first"
    );
    assert_eq!(owner_of(&cs, &proc_(101, 20, 5, "/x"), HOST), None);
    assert_eq!(owner(&proc_(101, 20, 5, "/x")), Some(1), "its own slot");
    assert_eq!(
        owner(&proc_(102, 20, 9, "/x")),
        Some(1),
        "its slots' namespace"
    );
    assert_eq!(owner(&proc_(103, 30, 1, "/x")), Some(2));
    assert_eq!(owner(&proc_(104, 40, 1, "/x")), None, "nobody's namespace");
    assert_eq!(
        owner(&proc_(105, HOST, 5, "/x")),
        None,
        "the host's namespace names no one"
    );
    // A kubelet's pod cgroup is the host's word: the process is that pod's, whatever the slots claim.
    let in_p2 = format!("/kubepods/besteffort/pod{P2}/0123abcd");
    assert_eq!(owner(&proc_(106, 20, 5, &in_p2)), Some(2));
    let in_p1 = format!(
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-1.scope",
        P1.replace('-', "_")
    );
    assert_eq!(
        owner(&proc_(107, HOST, 1, &in_p1)),
        Some(1),
        "a pod with the host's PIDs"
    );
    let elsewhere = "/kubepods/besteffort/pod7c0e3d1a-0000-4000-8000-00000000ffff/1";
    assert_eq!(owner(&proc_(108, 20, 5, elsewhere)), None, "another pod's");
}

#[test]
fn two_claims_name_none_and_a_gone_container_nothing() {
    // Two HAMi containers claiming one namespace, neither the process's own slot: none of them.
    let mut cs = live(vec![hami(P1, vec![(5, 20)]), hami(P2, vec![(6, 20)])]);
    assert_eq!(hami_owner(&cs, &proc_(1, 20, 9, "/x"), HOST), None);
    // ... but a process's own slot names its container (a pod sharing one PID namespace).
    assert_eq!(hami_owner(&cs, &proc_(1, 20, 6, "/x"), HOST), Some(1));
    // Two containers of one pod: the pod's cgroup does not choose, the slots do.
    cs[1] = hami(P1, vec![(6, 20)]);
    let cs = live(cs);
    let pod = format!("/kubepods/pod{P1}/c");
    assert_eq!(hami_owner(&cs, &proc_(1, 20, 6, &pod), HOST), Some(1));
    assert_eq!(hami_owner(&cs, &proc_(1, 20, 9, &pod), HOST), None);
    // No slot held: not live, nothing.
    let cs = live(vec![hami(P1, vec![])]);
    assert!(!cs[0].live);
    assert_eq!(
        hami_owner(&cs, &proc_(1, 20, 5, &format!("/kubepods/pod{P1}/c")), HOST),
        None
    );
}

#[test]
fn attribute_puts_hami_processes_on_their_gpu_tracked_or_not() {
    let cs = live(vec![hami(P1, vec![(5, 20)])]);
    let r = GpuReading {
        uuid: U0.into(),
        processes: Some(vec![(101, 300 << 20), (102, 100 << 20), (999, 1)]),
        ..Default::default()
    };
    let t = attribute(
        &cs,
        &[r],
        |pid| match pid {
            101 => Some(proc_(101, 20, 5, "/x")),
            102 => Some(proc_(102, 20, 9, "/x")),
            _ => None,
        },
        HOST,
    );
    let ps = &t.by_gpu[&(0, 0)];
    assert_eq!(
        ps.iter().map(|p| (p.pid, p.tracked)).collect::<Vec<_>>(),
        [(101, true), (102, false)]
    );
    assert_eq!(t.used(0, 0), 400 << 20);
    assert_eq!(t.unattributed, 1);
}
