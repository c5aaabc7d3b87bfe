//! The planner's tests: quotas and shares checked against the container's GPUs, pods, the node's policy.

use super::*;

use crate::testing::kv;
use vgpu_ledger::envcompute::Policy;

fn host() -> Result<Vec<HostGpu>, NvmlError> {
    Ok((0..2)
        .map(|i| HostGpu {
            index: i,
            uuid: format!("GPU-{i}"),
            total_memory: 16 << 30,
            minor: None,
        })
        .collect())
}

fn run(env: &[(&str, &str)], ann: &[(&str, &str)]) -> Result<Option<Plan>, PlanError> {
    let (e, a) = (kv(env), kv(ann));
    plan(
        &SpecFacts {
            env: e,
            annotations: a,
            ..Default::default()
        },
        host,
    )
}

#[test]
fn memory_modes_from_annotations_over_the_environment() {
    let facts = |ann: &[(&str, &str)], env: &[(&str, &str)]| SpecFacts {
        env: kv(env),
        annotations: kv(ann),
        ..Default::default()
    };
    let gpu_env = [
        ("NVIDIA_VISIBLE_DEVICES", "0"),
        ("CUDA_DEVICE_MEMORY_LIMIT", "4Gi"),
    ];
    let f = facts(
        &[
            ("vgpu.io/memory-mode", "spill"),
            ("vgpu.io/memory-spill", "8Gi"),
        ],
        &[&gpu_env[..], &[("CUDA_OVERSUBSCRIBE", "true")]].concat(),
    );
    assert_eq!(
        plan(&f, host).unwrap().unwrap().memory_mode(),
        MemoryMode::Spill {
            spill_limit: 8 << 30
        }
    );
    let f = facts(
        &[],
        &[&gpu_env[..], &[("CUDA_OVERSUBSCRIBE", "true")]].concat(),
    );
    assert!(plan(&f, host)
        .unwrap()
        .unwrap()
        .memory_mode()
        .is_oversubscribe());
    let e = plan(&facts(&[("vgpu.io/memory-mode", "spill")], &gpu_env), host)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("vgpu.io/memory-mode=spill needs a spill budget"),
        "{e}"
    );
}

#[test]
fn a_compute_share_with_or_without_a_memory_quota() {
    let facts = |ann: &[(&str, &str)], env: &[(&str, &str)]| SpecFacts {
        env: kv(env),
        annotations: kv(ann),
        ..Default::default()
    };
    let gpus = |p: Option<Plan>| -> Vec<(usize, Option<u64>, Option<u32>)> {
        p.unwrap()
            .gpus
            .iter()
            .map(|g| (g.index, g.settings.memory_limit, g.settings.compute_limit))
            .collect()
    };
    // A share alone: every GPU listed for it, no memory quota.
    let p = plan(
        &facts(
            &[("vgpu.io/compute-limit", "30")],
            &[("NVIDIA_VISIBLE_DEVICES", "0,1")],
        ),
        host,
    )
    .unwrap();
    assert_eq!(gpus(p), vec![(0, None, Some(30)), (1, None, Some(30))]);
    // Both, on different GPUs; the env share is HAMi's variable.
    let p = plan(
        &facts(
            &[],
            &[
                ("NVIDIA_VISIBLE_DEVICES", "0,1"),
                ("CUDA_DEVICE_MEMORY_LIMIT_0", "1G"),
                ("CUDA_DEVICE_SM_LIMIT_1", "70"),
            ],
        ),
        host,
    )
    .unwrap();
    assert_eq!(gpus(p), vec![(0, Some(1 << 30), None), (1, None, Some(70))]);
    // The policy goes with the plan; disable (or 100, or env 0) is no share: nothing to do.
    let p = plan(
        &facts(
            &[
                ("vgpu.io/compute-limit", "30"),
                ("vgpu.io/compute-policy", "force"),
            ],
            &[("NVIDIA_VISIBLE_DEVICES", "0")],
        ),
        host,
    )
    .unwrap()
    .unwrap();
    assert_eq!(p.gpus[0].settings.compute_policy, Policy::Force);
    for (ann, env) in [
        (
            &[
                ("vgpu.io/compute-limit", "30"),
                ("vgpu.io/compute-policy", "disable"),
            ][..],
            &[("NVIDIA_VISIBLE_DEVICES", "0")][..],
        ),
        (
            &[("vgpu.io/compute-limit", "100")],
            &[("NVIDIA_VISIBLE_DEVICES", "0")],
        ),
        (
            &[],
            &[
                ("NVIDIA_VISIBLE_DEVICES", "0"),
                ("CUDA_DEVICE_SM_LIMIT", "0"),
            ],
        ),
    ] {
        assert_eq!(
            plan(&facts(ann, env), || panic!("NVML loaded")).unwrap(),
            None
        );
    }
    // require_memory_limit is about memory: a share alone does not satisfy it; a default memory
    // quota comes beside the share.
    let f = facts(
        &[("vgpu.io/compute-limit", "30")],
        &[("NVIDIA_VISIBLE_DEVICES", "0")],
    );
    assert!(plan_with(&f, Unquoted::Refuse, host).is_err());
    let p = plan_with(&f, Unquoted::Default(4 << 30), host).unwrap();
    assert_eq!(gpus(p), vec![(0, Some(4 << 30), Some(30))]);
}

#[test]
fn a_compute_request_beside_or_without_a_limit() {
    let facts = |ann: &[(&str, &str)], env: &[(&str, &str)]| SpecFacts {
        env: kv(env),
        annotations: kv(ann),
        ..Default::default()
    };
    let shares = |f: SpecFacts| -> Vec<(usize, Option<u32>, Option<u32>)> {
        plan(&f, host)
            .unwrap()
            .unwrap()
            .gpus
            .iter()
            .map(|g| {
                (
                    g.index,
                    g.settings.compute_request,
                    g.settings.compute_limit,
                )
            })
            .collect()
    };
    // A request alone lists every GPU for it (its limit the whole GPU), the policy with it.
    let f = facts(
        &[
            ("vgpu.io/compute-request", "30"),
            ("vgpu.io/compute-policy", "force"),
        ],
        &[("NVIDIA_VISIBLE_DEVICES", "0,1")],
    );
    let p = plan(&f, host).unwrap().unwrap();
    assert_eq!(p.gpus[1].settings.compute_policy, Policy::Force);
    assert_eq!(shares(f), vec![(0, Some(30), None), (1, Some(30), None)]);
    // Request and limit, per GPU; the env's as the annotations'.
    let f = facts(
        &[
            ("vgpu.io/compute-request.0", "20"),
            ("vgpu.io/compute-limit", "60"),
        ],
        &[("NVIDIA_VISIBLE_DEVICES", "0,1")],
    );
    assert_eq!(
        shares(f),
        vec![(0, Some(20), Some(60)), (1, None, Some(60))]
    );
    let f = facts(
        &[],
        &[
            ("NVIDIA_VISIBLE_DEVICES", "0,1"),
            ("CUDA_DEVICE_SM_REQUEST_1", "100"),
        ],
    );
    assert_eq!(shares(f), vec![(1, Some(100), None)]);
    // Refusals, one line naming the key; nothing planned.
    for (ann, env, want) in [
        (
            &[("vgpu.io/compute-request.1", "30")][..],
            &[("NVIDIA_VISIBLE_DEVICES", "0")][..],
            "annotation vgpu.io/compute-request.1: the container has no GPU 1: it gets 1 GPU",
        ),
        (
            &[("vgpu.io/compute-request", "30")],
            &[],
            "annotation vgpu.io/compute-request is set but the container gets no GPU",
        ),
        (
            &[("vgpu.io/compute-request", "60"), ("vgpu.io/compute-limit", "50")],
            &[("NVIDIA_VISIBLE_DEVICES", "0")],
            "annotation vgpu.io/compute-request=60: a compute request is at most its limit, and annotation vgpu.io/compute-limit is 50",
        ),
        (
            &[("vgpu.io/compute-request", "ten")],
            &[("NVIDIA_VISIBLE_DEVICES", "0")],
            "annotation vgpu.io/compute-request=\"ten\": a compute request is a whole percent",
        ),
        (
            &[],
            &[
                ("NVIDIA_VISIBLE_DEVICES", "0"),
                ("CUDA_DEVICE_SM_REQUEST", "101"),
            ],
            "env CUDA_DEVICE_SM_REQUEST=\"101\": a compute request is a whole percent 1..=100",
        ),
    ] {
        let e = plan(&facts(ann, env), host).unwrap_err().to_string();
        assert!(e.starts_with(want), "{e} (wanted {want})");
        assert!(!e.contains('\n'));
    }
}

// Each GPU's settings whole: the container-wide mode only where there is a memory quota, the policy and
// the window only where there is a share (limits.json gets them as planned).
#[test]
fn each_gpu_gets_the_container_wide_values_that_go_with_its_own() {
    let f = SpecFacts {
        env: kv(&[("NVIDIA_VISIBLE_DEVICES", "0,1")]),
        annotations: kv(&[
            ("vgpu.io/memory-limit.0", "1Gi"),
            ("vgpu.io/memory-mode", "oversubscribe"),
            ("vgpu.io/compute-limit.1", "30"),
            ("vgpu.io/compute-policy", "force"),
            ("vgpu.io/compute-window", "250ms"),
        ]),
        ..Default::default()
    };
    let p = plan(&f, host).unwrap().unwrap();
    let settings: Vec<GpuSettings> = p.gpus.iter().map(|g| g.settings).collect();
    assert_eq!(
        settings,
        vec![
            GpuSettings {
                memory_limit: Some(1 << 30),
                memory: MemoryMode::Oversubscribe {
                    reserve: vgpu_ledger::memmode::DEFAULT_RESERVE
                },
                ..Default::default()
            },
            GpuSettings {
                compute_limit: Some(30),
                compute_policy: Policy::Force,
                compute_window_ms: Some(250),
                ..Default::default()
            },
        ]
    );
    assert!(p.memory_mode().is_oversubscribe());
}

#[test]
fn the_compute_window_goes_with_the_plan() {
    let facts = |ann: &[(&str, &str)], env: &[(&str, &str)]| SpecFacts {
        env: kv(env),
        annotations: kv(ann),
        ..Default::default()
    };
    let window = |ann: &[(&str, &str)], env: &[(&str, &str)]| {
        plan(&facts(ann, env), host).unwrap().unwrap().gpus[0]
            .settings
            .compute_window_ms
    };
    let gpu = ("NVIDIA_VISIBLE_DEVICES", "0");
    let share = ("vgpu.io/compute-limit", "30");
    assert_eq!(
        window(
            &[share, ("vgpu.io/compute-window", "250ms")],
            &[gpu, ("VGPU_COMPUTE_WINDOW", "2s")]
        ),
        Some(250)
    );
    assert_eq!(
        window(
            &[],
            &[
                gpu,
                ("CUDA_DEVICE_SM_LIMIT", "30"),
                ("VGPU_COMPUTE_WINDOW", "2s")
            ]
        ),
        Some(2000)
    );
    assert_eq!(window(&[share], &[gpu]), None);
    // A window alone asks for nothing, as the policy alone: no plan, NVML untouched.
    for (ann, env) in [
        (&[("vgpu.io/compute-window", "250ms")][..], &[gpu][..]),
        (&[], &[gpu, ("VGPU_COMPUTE_WINDOW", "250ms")]),
        (
            &[share, ("vgpu.io/compute-policy", "disable")],
            &[gpu, ("VGPU_COMPUTE_WINDOW", "250ms")],
        ),
    ] {
        assert_eq!(
            plan(&facts(ann, env), || panic!("NVML loaded")).unwrap(),
            None
        );
    }
    // A malformed window is refused even without a share, with one line naming it.
    for (ann, env, want) in [
        (
            &[("vgpu.io/compute-window", "1m")][..],
            &[gpu][..],
            "annotation vgpu.io/compute-window=\"1m\": unknown unit",
        ),
        (
            &[share],
            &[gpu, ("VGPU_COMPUTE_WINDOW", "5ms")],
            "env VGPU_COMPUTE_WINDOW=\"5ms\": out of range",
        ),
    ] {
        let e = plan(&facts(ann, env), || panic!("NVML loaded"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with(want), "{e} (wanted {want})");
        assert!(!e.contains('\n'), "{e}");
    }
}

#[test]
fn compute_share_refusals() {
    let facts = |ann: &[(&str, &str)], env: &[(&str, &str)]| SpecFacts {
        env: kv(env),
        annotations: kv(ann),
        ..Default::default()
    };
    for (ann, env, want) in [
        (
            &[("vgpu.io/compute-limit.1", "30")][..],
            &[("NVIDIA_VISIBLE_DEVICES", "0")][..],
            "annotation vgpu.io/compute-limit.1: the container has no GPU 1: it gets 1 GPU",
        ),
        (
            &[("vgpu.io/compute-limit", "30")],
            &[],
            "annotation vgpu.io/compute-limit is set but the container gets no GPU",
        ),
        (
            &[],
            &[
                ("NVIDIA_VISIBLE_DEVICES", "0"),
                ("CUDA_DEVICE_SM_LIMIT", "abc"),
            ],
            "env CUDA_DEVICE_SM_LIMIT=\"abc\"",
        ),
        (
            &[("vgpu.io/compute-limit", "0")],
            &[("NVIDIA_VISIBLE_DEVICES", "0")],
            "annotation vgpu.io/compute-limit=\"0\"",
        ),
    ] {
        let e = plan(&facts(ann, env), host).unwrap_err().to_string();
        assert!(e.starts_with(want), "{e} (wanted {want})");
        assert!(!e.contains('\n'));
    }
    // A pod's default share leaves its pause container alone, as its default quota does.
    let f = facts(
        &[
            ("io.kubernetes.cri.container-type", "sandbox"),
            ("vgpu.io/compute-limit", "30"),
        ],
        &[],
    );
    assert_eq!(plan(&f, || panic!("NVML loaded")).unwrap(), None);
}

// Regression: containerd copies the pod's annotations into the sandbox (pause) container's spec too,
// and the quota on a container without a GPU was refused: the documented pod never started.
#[test]
fn a_pods_quota_leaves_its_pause_container_and_sidecars_alone() {
    let facts = |ann: &[(&str, &str)], env: &[(&str, &str)]| SpecFacts {
        env: kv(env),
        annotations: kv(ann),
        ..Default::default()
    };
    for pod in [
        ("io.kubernetes.cri.container-type", "sandbox"),
        ("io.kubernetes.cri.container-type", "container"),
        ("io.kubernetes.cri-o.ContainerType", "sandbox"),
    ] {
        let f = facts(&[pod, ("vgpu.io/memory-limit", "4Gi")], &[]);
        assert_eq!(plan(&f, || panic!("NVML loaded")).unwrap(), None, "{pod:?}");
    }
    // The pod's GPU container gets the quota.
    let f = facts(
        &[
            ("io.kubernetes.cri.container-type", "container"),
            ("vgpu.io/memory-limit", "4Gi"),
        ],
        &[("NVIDIA_VISIBLE_DEVICES", "0")],
    );
    assert_eq!(
        plan(&f, host).unwrap().unwrap().gpus[0]
            .settings
            .memory_limit,
        Some(4 << 30)
    );
    // Outside a pod, a quota on a container without a GPU is still a mistake worth a line.
    let f = facts(&[("vgpu.io/memory-limit", "4Gi")], &[]);
    assert!(plan(&f, host).is_err());
}

#[test]
fn the_nodes_policy_for_gpu_containers_without_a_quota() {
    let facts = |env: &[(&str, &str)]| SpecFacts {
        env: kv(env),
        ..Default::default()
    };
    let gpu = facts(&[("NVIDIA_VISIBLE_DEVICES", "0")]);
    let none = facts(&[("PATH", "/bin")]);
    let p = plan_with(&gpu, Unquoted::Default(4 << 30), host)
        .unwrap()
        .unwrap();
    assert_eq!(p.gpus[0].settings.memory_limit, Some(4 << 30));
    let e = plan_with(&gpu, Unquoted::Refuse, host)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("NVIDIA_VISIBLE_DEVICES") && e.contains("require_memory_limit"),
        "{e}"
    );
    // a container without a GPU (a pod's pause container, a sidecar) is never touched
    for u in [Unquoted::Default(4 << 30), Unquoted::Refuse] {
        assert_eq!(plan_with(&none, u, || panic!("NVML loaded")).unwrap(), None);
    }
    // a quota asked for wins over the default
    let own = facts(&[
        ("NVIDIA_VISIBLE_DEVICES", "0"),
        ("CUDA_DEVICE_MEMORY_LIMIT", "1G"),
    ]);
    let p = plan_with(&own, Unquoted::Default(4 << 30), host)
        .unwrap()
        .unwrap();
    assert_eq!(p.gpus[0].settings.memory_limit, Some(1 << 30));
}

#[test]
fn no_quota_never_touches_nvml() {
    let e = kv(&[("NVIDIA_VISIBLE_DEVICES", "all")]);
    let p = plan(
        &SpecFacts {
            env: e,
            ..Default::default()
        },
        || panic!("NVML loaded"),
    )
    .unwrap();
    assert_eq!(p, None);
}

#[test]
fn per_gpu_and_all() {
    let p = run(
        &[
            ("NVIDIA_VISIBLE_DEVICES", "1,0"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "1G"),
        ],
        &[("vgpu.io/memory-limit.1", "2Gi")],
    )
    .unwrap()
    .unwrap();
    // The annotation wins, so only GPU 1 of the container (host GPU 0) is limited.
    assert_eq!(
        p.gpus,
        vec![GpuRequest {
            index: 1,
            uuid: "GPU-0".into(),
            settings: GpuSettings {
                memory_limit: Some(2 << 30),
                ..Default::default()
            },
        }]
    );
    let p = run(
        &[
            ("NVIDIA_VISIBLE_DEVICES", "all"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "1G"),
        ],
        &[],
    )
    .unwrap()
    .unwrap();
    assert_eq!(p.gpus.len(), 2);
}

#[test]
fn env_zero_is_no_quota_and_never_touches_nvml() {
    for env in [
        &[
            ("NVIDIA_VISIBLE_DEVICES", "0"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "0"),
        ][..],
        &[("CUDA_DEVICE_MEMORY_LIMIT_0", "0")],
    ] {
        let e = kv(env);
        let p = plan(
            &SpecFacts {
                env: e,
                ..Default::default()
            },
            || panic!("NVML loaded"),
        )
        .unwrap();
        assert_eq!(p, None, "{env:?}");
    }
    // Zero for one GPU leaves that GPU unlimited, and is no refusal for a GPU the container lacks.
    let p = run(
        &[
            ("NVIDIA_VISIBLE_DEVICES", "0,1"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "1G"),
            ("CUDA_DEVICE_MEMORY_LIMIT_0", "0"),
        ],
        &[],
    )
    .unwrap()
    .unwrap();
    assert_eq!(
        p.gpus,
        vec![GpuRequest {
            index: 1,
            uuid: "GPU-1".into(),
            settings: GpuSettings {
                memory_limit: Some(1 << 30),
                ..Default::default()
            },
        }]
    );
    let p = run(
        &[
            ("NVIDIA_VISIBLE_DEVICES", "0"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "1G"),
            ("CUDA_DEVICE_MEMORY_LIMIT_1", "0"),
        ],
        &[],
    )
    .unwrap()
    .unwrap();
    assert_eq!(
        p.gpus,
        vec![GpuRequest {
            index: 0,
            uuid: "GPU-0".into(),
            settings: GpuSettings {
                memory_limit: Some(1 << 30),
                ..Default::default()
            },
        }]
    );
}

#[test]
fn refusals() {
    let e = run(&[("CUDA_DEVICE_MEMORY_LIMIT", "1G")], &[]).unwrap_err();
    assert!(
        matches!(&e, PlanError::NoGpuNamed { setting } if setting == "env CUDA_DEVICE_MEMORY_LIMIT"),
        "{e:?}"
    );
    let e = run(
        &[
            ("NVIDIA_VISIBLE_DEVICES", "none"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "1G"),
        ],
        &[],
    )
    .unwrap_err();
    assert!(matches!(e, PlanError::NoGpuGiven { .. }), "{e:?}");
    let e = run(
        &[("NVIDIA_VISIBLE_DEVICES", "0")],
        &[("vgpu.io/memory-limit.1", "1Gi")],
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            PlanError::NoSuchGpu {
                index: 1,
                count: 1,
                ..
            }
        ),
        "{e:?}"
    );
    let e = run(
        &[("NVIDIA_VISIBLE_DEVICES", "0")],
        &[("vgpu.io/memory-limit", "17Gi")],
    )
    .unwrap_err();
    assert!(
        matches!(e, PlanError::LargerThanGpu { bytes, index: 0, .. } if bytes == 17 << 30),
        "{e:?}"
    );
    let e = run(
        &[
            ("NVIDIA_VISIBLE_DEVICES", "5"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "1G"),
        ],
        &[],
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            PlanError::Select(crate::gpus::SelectError::NoIndex { index: 5, .. })
        ),
        "{e:?}"
    );
    // The lines users read, one each.
    assert_eq!(e.to_string().lines().count(), 1, "{e}");
    let e = run(
        &[("NVIDIA_VISIBLE_DEVICES", "0")],
        &[("vgpu.io/memory-limit", "17Gi")],
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "annotation vgpu.io/memory-limit: 17.0 GiB is larger than the container's GPU 0 (GPU-0, 16.0 GiB)"
    );
}

#[test]
fn a_pod_gives_its_containers_different_quotas() {
    let facts = |name: &str, env: &[(&str, &str)]| SpecFacts {
        env: kv(env),
        annotations: kv(&[
            ("io.kubernetes.cri.container-type", "container"),
            ("io.kubernetes.cri.container-name", name),
            ("vgpu.io/memory-limit", "2Gi"),
            ("vgpu.io/memory-limit.trainer", "6Gi"),
            ("vgpu.io/memory-limit.sidecar", "1Gi"),
        ]),
        ..Default::default()
    };
    let gpu = [("NVIDIA_VISIBLE_DEVICES", "1")];
    let limit = |name| {
        plan(&facts(name, &gpu), host).unwrap().unwrap().gpus[0]
            .settings
            .memory_limit
            .unwrap()
    };
    assert_eq!(limit("trainer"), 6 << 30);
    assert_eq!(limit("web"), 2 << 30);
    // The pod's default leaves a container without a GPU alone ...
    assert_eq!(
        plan(&facts("web", &[]), || panic!("NVML loaded")).unwrap(),
        None
    );
    // ... but a key naming a container without a GPU is a mistake, named.
    let e = plan(&facts("sidecar", &[]), host).unwrap_err().to_string();
    assert!(
        e.starts_with(
            "annotation vgpu.io/memory-limit.sidecar is set but the container gets no GPU"
        ),
        "{e}"
    );
}

// Regression (issue 25 item 7): with require_memory_limit and default_memory_limit the node's policy was
// applied to the container as a whole, so `CUDA_DEVICE_MEMORY_LIMIT_0=64Mi CUDA_DEVICE_SM_LIMIT_1=99` left
// GPU 1 without a memory quota: its tenant took 15 GiB and a 12 GiB container admitted there ran out.
#[test]
fn the_nodes_policy_applies_to_each_gpu() {
    let f = SpecFacts {
        env: kv(&[
            ("NVIDIA_VISIBLE_DEVICES", "0,1"),
            ("CUDA_DEVICE_MEMORY_LIMIT_0", "64Mi"),
            ("CUDA_DEVICE_SM_LIMIT_1", "99"),
        ]),
        ..Default::default()
    };
    let p = plan_with(&f, Unquoted::Default(4 << 30), host)
        .unwrap()
        .unwrap();
    let gpus: Vec<_> = p
        .gpus
        .iter()
        .map(|g| (g.index, g.settings.memory_limit, g.settings.compute_limit))
        .collect();
    assert_eq!(
        gpus,
        vec![(0, Some(64 << 20), None), (1, Some(4 << 30), Some(99))]
    );
    match plan_with(&f, Unquoted::Refuse, host) {
        Err(PlanError::QuotaRequired { index: 1, .. }) => {}
        other => panic!("{other:?}"),
    }
    // A GPU with neither a quota nor a share gets the default too; an env zero is no quota.
    let f = SpecFacts {
        env: kv(&[
            ("NVIDIA_VISIBLE_DEVICES", "0,1"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "1G"),
            ("CUDA_DEVICE_MEMORY_LIMIT_1", "0"),
        ]),
        ..Default::default()
    };
    let p = plan_with(&f, Unquoted::Default(4 << 30), host)
        .unwrap()
        .unwrap();
    let limits: Vec<_> = p.gpus.iter().map(|g| g.settings.memory_limit).collect();
    assert_eq!(limits, vec![Some(1 << 30), Some(4 << 30)]);
    // A container that gets no GPU (`void`) is left alone under either policy.
    let void = SpecFacts {
        env: kv(&[("NVIDIA_VISIBLE_DEVICES", "void")]),
        ..Default::default()
    };
    for u in [Unquoted::Default(4 << 30), Unquoted::Refuse] {
        assert_eq!(plan_with(&void, u, host).unwrap(), None);
    }
}

// Regression (issue 25 item 8): the quota went on the GPUs the env named, not on the ones the container is
// given. A tenant granted GPU 1 (its device node) who set NVIDIA_VISIBLE_DEVICES=0 had its quota put on
// GPU 0 and ran unlimited on GPU 1; an image's `all` beside one device put the quota on every GPU; NVIDIA's
// CDI specs' `void` beside the device left a quota'd container "no GPU"; the device plugin's volume-mounts
// list was refused outright.
#[test]
fn the_quota_goes_on_the_gpus_the_container_is_given() {
    let facts = |visible: &str, devices: &[&str], mounts: &[&str]| SpecFacts {
        env: kv(&[
            ("NVIDIA_VISIBLE_DEVICES", visible),
            ("CUDA_DEVICE_MEMORY_LIMIT", "1G"),
        ]),
        devices: devices.iter().map(|d| d.to_string()).collect(),
        mounts: mounts.iter().map(|d| d.to_string()).collect(),
        ..Default::default()
    };
    let on = |f: &SpecFacts| -> Vec<String> {
        plan(f, host)
            .unwrap()
            .unwrap()
            .gpus
            .iter()
            .map(|g| g.uuid.clone())
            .collect()
    };
    let node1 = ["/dev/nvidiactl", "/dev/nvidia1"];
    match plan(&facts("0", &node1, &[]), host) {
        Err(PlanError::Select(crate::gpus::SelectError::Disagree { .. })) => {}
        other => panic!("{other:?}"),
    }
    for v in ["all", "void", "1"] {
        assert_eq!(on(&facts(v, &node1, &[])), vec!["GPU-1"], "{v}");
    }
    let vm = facts(
        "/var/run/nvidia-container-devices",
        &[],
        &["/var/run/nvidia-container-devices/1"],
    );
    assert_eq!(on(&vm), vec!["GPU-1"]);
}
