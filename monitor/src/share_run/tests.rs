//! What the wall is handed of a collection (issue 42): each container GPU with a share, its request and
//! limit (a limit alone its own request, a request alone the whole GPU as its limit), its processes'
//! use and the whole GPU's, from NVML alone.

use super::*;
use vgpu_host::usage::GpuState;

fn container(id: &str, request: Option<u32>, limit: Option<u32>) -> ContainerState {
    ContainerState {
        id: id.into(),
        gpus: vec![GpuState {
            uuid: "GPU-0".into(),
            compute_request: request,
            compute_limit: limit,
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn proc_(pid: u32) -> TrueProc {
    TrueProc {
        pid,
        start_time: 1,
        used: 0,
        tracked: true,
    }
}

#[test]
fn each_share_is_measured_with_its_request_limit_and_the_gpus_own_use() {
    let cs = vec![
        container("floor", Some(30), None),
        container("cap", None, Some(70)),
        container("none", None, None),
    ];
    let mut truth = Truth {
        listed: vec!["GPU-0".into()],
        ..Default::default()
    };
    truth.by_gpu.insert((0, 0), vec![proc_(10), proc_(11)]);
    truth.by_gpu.insert((1, 0), vec![proc_(20)]);
    truth.by_gpu.insert((2, 0), vec![proc_(30)]);
    let reading = GpuReading {
        index: 0,
        uuid: "GPU-0".into(),
        name: "fake".into(),
        total: 1 << 34,
        used: 0,
        // The device's own figure can read less than its processes' (different sample windows): the
        // more of the two is the GPU's use.
        utilization: Some(0.5),
        processes: Some(vec![]),
        process_utilization: Some(vec![
            (10, 0.25),
            (11, 0.25),
            (20, 0.3),
            (30, 0.1),
            (99, 0.05),
        ]),
        ..Default::default()
    };
    let uses = measure(&cs, &truth, &[reading], &BTreeMap::new());
    let got: Vec<_> = uses
        .iter()
        .map(|u| (u.container.as_str(), u.request, u.share, u.requested))
        .collect();
    // The container without a share is not the wall's.
    assert_eq!(
        got,
        vec![("floor", 0.3, 1.0, true), ("cap", 0.7, 0.7, false)]
    );
    assert!((uses[0].busy - 0.5).abs() < 1e-9, "{uses:?}");
    assert!((uses[1].busy - 0.3).abs() < 1e-9, "{uses:?}");
    for u in &uses {
        assert!((u.gpu_busy - 0.95).abs() < 1e-9, "{u:?}");
    }
    // A request alone: no burst of its own (its limit is the whole GPU).
    assert_eq!(uses[0].burst, 0.0);
}

/// A HAMi container with a bundle is the wall's at its spec's `CUDA_DEVICE_SM_LIMIT` (a cap, its own
/// request, no floor promised), whatever share its GPU state held before the spec was joined (standing
/// for a tenant's claim); one without a bundle is not the wall's, whatever share it shows.
#[test]
fn a_hami_containers_share_is_its_bundle_specs_and_none_without_one() {
    use vgpu_host::hami::bundle::HostQuota;
    use vgpu_host::usage::hami::{from_hami, join_host_quotas};
    use vgpu_ledger::envcompute::EnvCompute;
    use vgpu_ledger::envlimits::EnvLimits;
    let pod = "7c0e3d1a-0000-4000-8000-000000000002";
    let dir = std::path::Path::new("/var/lib/vgpu/containers");
    let folder = |c: &str| vgpu_host::hami::Folder {
        name: format!("{pod}_{c}"),
        pod_uid: pod.into(),
        container: c.into(),
        dir: dir.join(format!("{pod}_{c}")),
        ledgers: vec![],
    };
    let claimed = |c: &str| {
        let mut s = from_hami(&folder(c), &[]);
        s.gpus.push(GpuState {
            uuid: "GPU-0".into(),
            compute_limit: Some(90),
            compute_request: Some(90),
            ..Default::default()
        });
        s
    };
    let env: Vec<(String, String)> = vec![("CUDA_DEVICE_SM_LIMIT".into(), "10".into())];
    let quota = HostQuota {
        bundle: "/run/containerd/io.containerd.runtime.v2.task/k8s.io/c1".into(),
        folder: format!("{pod}_walled"),
        uuids: vec!["GPU-0".into()],
        limits: EnvLimits::parse(&env).unwrap(),
        compute: EnvCompute::parse(&env).unwrap(),
        window_ms: None,
        init: vgpu_host::procs::HostProc {
            pid: 77,
            ns: 4026532001,
            inner_pid: 1,
            start_time: 5,
            cgroup: Some(format!("0::/kubepods/pod{pod}/c1\n")),
        },
    };
    let mut cs = vec![claimed("walled"), claimed("loose")];
    join_host_quotas(&mut cs, &[quota], dir, &["GPU-0".into()]);
    assert_eq!(
        cs.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
        [format!("hami/{pod}_loose"), format!("hami/{pod}_walled")]
    );
    let mut truth = Truth {
        listed: vec!["GPU-0".into()],
        ..Default::default()
    };
    truth.by_gpu.insert((0, 0), vec![proc_(10)]);
    truth.by_gpu.insert((1, 0), vec![proc_(20)]);
    let reading = GpuReading {
        uuid: "GPU-0".into(),
        processes: Some(vec![]),
        process_utilization: Some(vec![(10, 0.5), (20, 0.5)]),
        ..Default::default()
    };
    let uses = measure(&cs, &truth, &[reading], &BTreeMap::new());
    let got: Vec<_> = uses
        .iter()
        .map(|u| (u.container.as_str(), u.request, u.share, u.requested))
        .collect();
    assert_eq!(got, [(&*format!("hami/{pod}_walled"), 0.1, 0.1, false)]);
    assert!((uses[0].busy - 0.5).abs() < 1e-9, "{uses:?}");
}
