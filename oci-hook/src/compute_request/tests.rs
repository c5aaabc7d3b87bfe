//! The compute request's tests: annotations and env, per GPU and per pod container, the policy and window,
//! requests beside limits, and the one-line refusals users read.

use super::*;

use crate::testing::kv;

fn from_spec(
    annotations: &[(String, String)],
    env: &[(String, String)],
) -> Result<ComputeRequest, ComputeRequestError> {
    read(annotations, env, PodMember::of(annotations))
}

fn req(ann: &[(&str, &str)], env: &[(&str, &str)]) -> Result<ComputeRequest, ComputeRequestError> {
    from_spec(&kv(ann), &kv(env))
}

fn pct(r: &ComputeRequest, i: usize) -> Option<u32> {
    r.share_for(i).and_then(|s| s.percent)
}

#[test]
fn annotations_per_gpu_and_for_every_gpu() {
    let r = req(
        &[
            ("vgpu.io/compute-limit", "30"),
            ("vgpu.io/compute-limit.1", "70"),
            ("vgpu.io/compute-limit.2", "100"),
        ],
        &[("CUDA_DEVICE_SM_LIMIT", "10")],
    )
    .unwrap();
    assert_eq!(
        (pct(&r, 0), pct(&r, 1), pct(&r, 2)),
        (Some(30), Some(70), None)
    );
    assert_eq!(
        r.share_for(1).unwrap().source,
        "annotation vgpu.io/compute-limit.1"
    );
    assert_eq!(r.policy, Policy::Default);
    // 100 alone is no share at all, and still the annotations' decision: the env is not read.
    let r = req(
        &[("vgpu.io/compute-limit", "100")],
        &[("CUDA_DEVICE_SM_LIMIT", "10")],
    )
    .unwrap();
    assert!(r.is_empty());
}

#[test]
fn the_environment_as_hami_reads_it() {
    let r = req(
        &[],
        &[
            ("CUDA_DEVICE_SM_LIMIT", "30"),
            ("CUDA_DEVICE_SM_LIMIT_1", "0"),
            ("CUDA_DEVICE_SM_LIMIT_2", "50"),
        ],
    )
    .unwrap();
    assert_eq!(
        (pct(&r, 0), pct(&r, 1), pct(&r, 2)),
        (Some(30), None, Some(50))
    );
    assert_eq!(r.share_for(2).unwrap().source, "env CUDA_DEVICE_SM_LIMIT_2");
    assert!(req(&[], &[("CUDA_DEVICE_SM_LIMIT", "0")])
        .unwrap()
        .is_empty());
    assert!(req(&[], &[("CUDA_DEVICE_SM_LIMIT", "100")])
        .unwrap()
        .is_empty());
    assert!(req(&[], &[]).unwrap().is_empty());
}

#[test]
fn the_policy_annotation_wins_and_disable_drops_every_share() {
    let r = req(
        &[("vgpu.io/compute-limit", "30")],
        &[("GPU_CORE_UTILIZATION_POLICY", "disable")],
    )
    .unwrap();
    assert!(r.is_empty());
    let r = req(
        &[
            ("vgpu.io/compute-limit", "30"),
            ("vgpu.io/compute-policy", "force"),
        ],
        &[("GPU_CORE_UTILIZATION_POLICY", "disable")],
    )
    .unwrap();
    assert_eq!((pct(&r, 0), r.policy), (Some(30), Policy::Force));
    let r = req(
        &[("vgpu.io/compute-policy", "Disable")],
        &[("CUDA_DEVICE_SM_LIMIT", "30")],
    )
    .unwrap();
    assert!(r.is_empty());
}

#[test]
fn the_window_annotation_wins_over_the_env_and_absent_is_none() {
    let r = req(
        &[
            ("vgpu.io/compute-limit", "30"),
            ("vgpu.io/compute-window", "250ms"),
        ],
        &[("VGPU_COMPUTE_WINDOW", "2s")],
    )
    .unwrap();
    assert_eq!((pct(&r, 0), r.window_ms), (Some(30), Some(250)));
    // The env alone (the last of a variable wins, as for the other variables); with the env's share.
    let r = req(
        &[],
        &[
            ("CUDA_DEVICE_SM_LIMIT", "30"),
            ("VGPU_COMPUTE_WINDOW", "100ms"),
            ("VGPU_COMPUTE_WINDOW", "2s"),
        ],
    )
    .unwrap();
    assert_eq!((pct(&r, 0), r.window_ms), (Some(30), Some(2000)));
    // The env's window goes with an annotation's share too: it is container-wide, as the policy.
    let r = req(
        &[("vgpu.io/compute-limit", "30")],
        &[("VGPU_COMPUTE_WINDOW", "10s")],
    )
    .unwrap();
    assert_eq!(r.window_ms, Some(10_000));
    let r = req(&[("vgpu.io/compute-limit", "30")], &[]).unwrap();
    assert_eq!(r.window_ms, None);
    // A window without a share asks for nothing.
    let r = req(&[("vgpu.io/compute-window", "250ms")], &[]).unwrap();
    assert!(r.is_empty());
}

fn request(r: &ComputeRequest, i: usize) -> Option<u32> {
    r.request_for(i).and_then(|s| s.percent)
}

#[test]
fn requests_beside_limits_from_the_annotations_or_the_env() {
    let r = req(
        &[
            ("vgpu.io/compute-request", "20"),
            ("vgpu.io/compute-request.1", "100"),
            ("vgpu.io/compute-limit", "60"),
            ("vgpu.io/compute-limit.1", "100"),
        ],
        &[("CUDA_DEVICE_SM_REQUEST", "90")],
    )
    .unwrap();
    assert_eq!((request(&r, 0), pct(&r, 0)), (Some(20), Some(60)));
    assert_eq!((request(&r, 1), pct(&r, 1)), (Some(100), None));
    assert_eq!(
        r.request_for(1).unwrap().source,
        "annotation vgpu.io/compute-request.1"
    );
    // A request alone is a share (its limit is the whole GPU).
    let r = req(&[("vgpu.io/compute-request", "30")], &[]).unwrap();
    assert!(!r.is_empty());
    assert_eq!((request(&r, 0), pct(&r, 0)), (Some(30), None));
    // One source decides both: an annotation's limit makes the env's request ignored.
    let r = req(
        &[("vgpu.io/compute-limit", "50")],
        &[("CUDA_DEVICE_SM_REQUEST", "30")],
    )
    .unwrap();
    assert_eq!((request(&r, 0), pct(&r, 0)), (None, Some(50)));
    // The env's, per GPU over every GPU.
    let r = req(
        &[],
        &[
            ("CUDA_DEVICE_SM_REQUEST", "10"),
            ("CUDA_DEVICE_SM_REQUEST_1", "40"),
            ("CUDA_DEVICE_SM_LIMIT", "50"),
        ],
    )
    .unwrap();
    assert_eq!((request(&r, 0), pct(&r, 0)), (Some(10), Some(50)));
    assert_eq!((request(&r, 1), pct(&r, 1)), (Some(40), Some(50)));
    assert_eq!(
        r.request_for(1).unwrap().source,
        "env CUDA_DEVICE_SM_REQUEST_1"
    );
    // A per-GPU request past the container's GPUs is what `first_beyond` finds.
    let r = req(&[("vgpu.io/compute-request.3", "10")], &[]).unwrap();
    assert_eq!(r.first_beyond(1).map(|(i, _)| i), Some(3));
    // Disable drops the requests too.
    let r = req(
        &[
            ("vgpu.io/compute-request", "30"),
            ("vgpu.io/compute-policy", "disable"),
        ],
        &[],
    )
    .unwrap();
    assert!(r.is_empty());
}

#[test]
fn a_pods_request_and_limit_are_each_resolved_on_their_own() {
    let pod = |name: &str| {
        kv(&[
            ("io.kubernetes.cri.container-name", name),
            ("vgpu.io/compute-limit", "50"),
            ("vgpu.io/compute-request.trainer", "30"),
        ])
    };
    // The trainer's request names it; its limit is the pod's.
    let r = from_spec(&pod("trainer"), &[]).unwrap();
    assert!(r.for_container);
    assert_eq!((request(&r, 0), pct(&r, 0)), (Some(30), Some(50)));
    // Another container: the pod's limit alone (its own request).
    let r = from_spec(&pod("web"), &[]).unwrap();
    assert!(!r.for_container);
    assert_eq!((request(&r, 0), pct(&r, 0)), (None, Some(50)));
}

#[test]
fn a_request_above_its_limit_is_one_line_naming_both() {
    for (ann, env, want) in [
        (
            &[("vgpu.io/compute-request", "40"), ("vgpu.io/compute-limit", "30")][..],
            &[][..],
            "annotation vgpu.io/compute-request=40: a compute request is at most its limit, and annotation vgpu.io/compute-limit is 30 on the same GPU",
        ),
        (
            &[("vgpu.io/compute-request.1", "40"), ("vgpu.io/compute-limit", "30")][..],
            &[][..],
            "annotation vgpu.io/compute-request.1=40: a compute request is at most its limit, and annotation vgpu.io/compute-limit is 30 on the same GPU",
        ),
        (
            &[("vgpu.io/compute-request", "40"), ("vgpu.io/compute-limit.2", "30")][..],
            &[][..],
            "annotation vgpu.io/compute-request=40: a compute request is at most its limit, and annotation vgpu.io/compute-limit.2 is 30 on the same GPU",
        ),
        (
            &[][..],
            &[("CUDA_DEVICE_SM_REQUEST", "40"), ("CUDA_DEVICE_SM_LIMIT_0", "30")][..],
            "env CUDA_DEVICE_SM_REQUEST=40: a compute request is at most its limit, and env CUDA_DEVICE_SM_LIMIT_0 is 30 on the same GPU",
        ),
        // Even under disable.
        (
            &[
                ("vgpu.io/compute-request", "40"),
                ("vgpu.io/compute-limit", "30"),
                ("vgpu.io/compute-policy", "disable"),
            ][..],
            &[][..],
            "annotation vgpu.io/compute-request=40: a compute request is at most",
        ),
    ] {
        let e = req(ann, env).unwrap_err();
        assert!(matches!(e, ComputeRequestError::AboveLimit(_)), "{e:?}");
        let e = e.to_string();
        assert!(e.starts_with(want), "{e} (wanted {want})");
        assert!(!e.contains('\n'));
    }
    // At the limit, or under a limit of 100 (none), a request is fine.
    req(
        &[
            ("vgpu.io/compute-request", "30"),
            ("vgpu.io/compute-limit", "30"),
        ],
        &[],
    )
    .unwrap();
    req(
        &[
            ("vgpu.io/compute-request", "100"),
            ("vgpu.io/compute-limit", "100"),
        ],
        &[],
    )
    .unwrap();
    // A GPU whose own limit lifts the one for every GPU.
    req(
        &[
            ("vgpu.io/compute-request.1", "80"),
            ("vgpu.io/compute-limit", "30"),
            ("vgpu.io/compute-limit.1", "90"),
        ],
        &[],
    )
    .unwrap();
}

#[test]
fn a_pods_containers_get_their_own_shares_or_the_pods_default() {
    let pod = |name: &str| {
        kv(&[
            ("io.kubernetes.cri.container-name", name),
            ("vgpu.io/compute-limit", "20"),
            ("vgpu.io/compute-limit.trainer", "60"),
            ("vgpu.io/compute-limit.trainer.1", "100"),
        ])
    };
    let r = from_spec(&pod("trainer"), &[]).unwrap();
    assert!(r.for_container);
    assert_eq!((pct(&r, 0), pct(&r, 1)), (Some(60), None));
    let r = from_spec(&pod("web"), &[]).unwrap();
    assert!(!r.for_container);
    assert_eq!((pct(&r, 0), pct(&r, 1)), (Some(20), Some(20)));
}

#[test]
fn bad_values_are_the_variant_of_their_setting() {
    use ComputeRequestError as E;
    let kind = |ann: (&str, &str), env: (&str, &str)| match req(&[ann], &[env]).unwrap_err() {
        E::Key(_) => "key",
        E::Env(e) => {
            assert_eq!(e.var, env.0);
            "env"
        }
        E::Policy { key, .. } => {
            assert_eq!(key, ann.0);
            "policy"
        }
        E::Percent(_) => "percent",
        E::AboveLimit(_) => "above",
        E::Window(_) => "window",
    };
    let none = ("", "");
    assert_eq!(kind(("vgpu.io/compute-limit", "0"), none), "percent");
    assert_eq!(kind(("vgpu.io/compute-limit.0", "30%"), none), "percent");
    assert_eq!(kind(("vgpu.io/compute-limit.trainer", "30"), none), "key");
    assert_eq!(
        kind(("vgpu.io/compute-policy", "sometimes"), none),
        "policy"
    );
    assert_eq!(kind(("x", ""), ("CUDA_DEVICE_SM_LIMIT", "150")), "env");
    assert_eq!(
        kind(("x", ""), ("GPU_CORE_UTILIZATION_POLICY", "sometimes")),
        "env"
    );
    assert_eq!(kind(("vgpu.io/compute-window", "1m"), none), "window");
    assert_eq!(kind(("vgpu.io/compute-request", "0"), none), "percent");
    assert_eq!(kind(("vgpu.io/compute-request.1", "x"), none), "percent");
    assert_eq!(kind(("vgpu.io/compute-request.trainer", "30"), none), "key");
    assert_eq!(kind(("x", ""), ("CUDA_DEVICE_SM_REQUEST", "0")), "env");
    // Even under disable, a typo is seen.
    assert_eq!(
        kind(
            ("vgpu.io/compute-policy", "disable"),
            ("CUDA_DEVICE_SM_LIMIT_x", "30")
        ),
        "env"
    );
}

/// The lines users read (the e2e suites match several): one line, naming the setting and its value.
#[test]
fn bad_values_are_one_line_naming_the_setting() {
    for (ann, env, want) in [
        (
            ("vgpu.io/compute-limit", "0"),
            ("", ""),
            "annotation vgpu.io/compute-limit=\"0\": a compute limit is a whole percent",
        ),
        (
            ("vgpu.io/compute-limit.0", "30%"),
            ("", ""),
            "annotation vgpu.io/compute-limit.0=\"30%\"",
        ),
        (
            ("vgpu.io/compute-limit", ""),
            ("", ""),
            "annotation vgpu.io/compute-limit=\"\": a compute limit is a whole percent",
        ),
        (
            ("vgpu.io/compute-limit.trainer", "30"),
            ("", ""),
            "annotation vgpu.io/compute-limit.trainer: \"trainer\" is not a GPU index",
        ),
        (
            ("vgpu.io/compute-policy", "sometimes"),
            ("", ""),
            "annotation vgpu.io/compute-policy=\"sometimes\": expected force, disable or default",
        ),
        (
            ("vgpu.io/compute-request", "0"),
            ("", ""),
            "annotation vgpu.io/compute-request=\"0\": a compute request is a whole percent of the GPU's time, 1 to 100",
        ),
        (
            ("vgpu.io/compute-request.0", "150"),
            ("", ""),
            "annotation vgpu.io/compute-request.0=\"150\": a compute request is a whole percent",
        ),
        (
            ("x", ""),
            ("CUDA_DEVICE_SM_REQUEST", "0"),
            "env CUDA_DEVICE_SM_REQUEST=\"0\": a compute request is a whole percent 1..=100",
        ),
        (
            ("x", ""),
            ("CUDA_DEVICE_SM_REQUEST_1", "abc"),
            "env CUDA_DEVICE_SM_REQUEST_1=\"abc\": a compute request is a whole percent 1..=100",
        ),
        (
            ("x", ""),
            ("CUDA_DEVICE_SM_LIMIT", "150"),
            "env CUDA_DEVICE_SM_LIMIT=\"150\": not a whole percent",
        ),
        (
            ("x", ""),
            ("GPU_CORE_UTILIZATION_POLICY", "sometimes"),
            "env GPU_CORE_UTILIZATION_POLICY=\"sometimes\"",
        ),
        (
            ("vgpu.io/compute-window", "1m"),
            ("", ""),
            "annotation vgpu.io/compute-window=\"1m\": unknown unit; a compute window is a whole number of ms or s, 10ms to 10s",
        ),
        // The annotation is read (and refused) before the env's good value.
        (
            ("vgpu.io/compute-window", "250"),
            ("VGPU_COMPUTE_WINDOW", "250ms"),
            "annotation vgpu.io/compute-window=\"250\": no unit",
        ),
        (
            ("x", ""),
            ("VGPU_COMPUTE_WINDOW", "20s"),
            "env VGPU_COMPUTE_WINDOW=\"20s\": out of range",
        ),
        // Even under disable, a typo is seen.
        (
            ("vgpu.io/compute-policy", "disable"),
            ("VGPU_COMPUTE_WINDOW", "1.5s"),
            "env VGPU_COMPUTE_WINDOW=\"1.5s\": not a whole number",
        ),
        (
            ("vgpu.io/compute-policy", "disable"),
            ("CUDA_DEVICE_SM_LIMIT_x", "30"),
            "env CUDA_DEVICE_SM_LIMIT_x",
        ),
    ] {
        let e = req(&[ann], &[env]).unwrap_err().to_string();
        assert!(e.starts_with(want), "{e} (wanted {want})");
        assert!(!e.contains('\n'), "{e}");
    }
}
