//! Unit tests of `gpus`: the container's GPUs from its env, devices and mounts, and resolved against the host's.

use super::*;

use crate::testing::kv;

fn host() -> Vec<HostGpu> {
    (0..3)
        .map(|i| HostGpu {
            index: i,
            uuid: format!("GPU-{i}aaa"),
            total_memory: 16 << 30,
            minor: Some(i + 10),
        })
        .collect()
}

#[test]
fn visible_devices_forms() {
    let s = from_spec(
        &kv(&[("NVIDIA_VISIBLE_DEVICES", "2,GPU-0aaa")]),
        &[],
        &[],
        &[],
    )
    .unwrap()
    .unwrap();
    let r = resolve(&s, &host()).unwrap();
    assert_eq!(r.iter().map(|g| g.index).collect::<Vec<_>>(), vec![2, 0]);
    let s = from_spec(&kv(&[("NVIDIA_VISIBLE_DEVICES", "all")]), &[], &[], &[])
        .unwrap()
        .unwrap();
    assert_eq!(resolve(&s, &host()).unwrap().len(), 3);
    let s = from_spec(&kv(&[("NVIDIA_VISIBLE_DEVICES", "void")]), &[], &[], &[])
        .unwrap()
        .unwrap();
    assert!(resolve(&s, &host()).unwrap().is_empty());
    assert_eq!(
        from_spec(&kv(&[("NVIDIA_VISIBLE_DEVICES", "")]), &[], &[], &[]).unwrap(),
        None
    );
}

/// NVIDIA's CDI spec (`nvidia-ctk cdi generate`) sets `NVIDIA_VISIBLE_DEVICES=void` (its runtime hook
/// must not inject again) and puts the GPU's node in the spec: the node decides, not the env.
#[test]
fn void_leaves_the_choice_to_cdi_and_device_nodes() {
    let void = kv(&[("NVIDIA_VISIBLE_DEVICES", "void")]);
    let s = from_spec(
        &void,
        &[],
        &["/dev/nvidiactl".into(), "/dev/nvidia11".into()],
        &[],
    )
    .unwrap()
    .unwrap();
    assert_eq!(s.selectors, vec![Selector::Minor(11)]);
    assert_eq!(resolve(&s, &host()).unwrap()[0].index, 1);
    let a = kv(&[("cdi.k8s.io/x", "nvidia.com/gpu=2")]);
    let s = from_spec(&void, &a, &[], &[]).unwrap().unwrap();
    assert_eq!(s.selectors, vec![Selector::Index(2)]);
    // Nothing else names a GPU: no GPU.
    let none = from_spec(&void, &[], &[], &[]).unwrap();
    assert!(
        none.as_ref().is_none_or(|s| s.selectors.is_empty()),
        "{none:?}"
    );
}

#[test]
fn cdi_and_device_nodes() {
    let a = kv(&[("cdi.k8s.io/vgpu", "nvidia.com/gpu=1,vendor.com/x=y")]);
    let s = from_spec(&[], &a, &[], &[]).unwrap().unwrap();
    assert_eq!(s.selectors, vec![Selector::Index(1)]);
    let s = from_spec(
        &[],
        &[],
        &["/dev/nvidiactl".into(), "/dev/nvidia12".into()],
        &[],
    )
    .unwrap()
    .unwrap();
    assert_eq!(resolve(&s, &host()).unwrap()[0].index, 2);
    assert_eq!(
        from_spec(&[], &[], &["/dev/nvidiactl".into()], &[]).unwrap(),
        None
    );
}

#[test]
fn unknown_gpus_are_clear_errors() {
    let s = from_spec(&kv(&[("NVIDIA_VISIBLE_DEVICES", "7")]), &[], &[], &[])
        .unwrap()
        .unwrap();
    let e = resolve(&s, &host()).unwrap_err().to_string();
    assert!(
        e.contains("NVIDIA_VISIBLE_DEVICES=7") && e.contains("index 7"),
        "{e}"
    );
    let e = from_spec(&kv(&[("NVIDIA_VISIBLE_DEVICES", "x")]), &[], &[], &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("neither"), "{e}");
    let e = from_spec(&kv(&[("NVIDIA_VISIBLE_DEVICES", "0:1")]), &[], &[], &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("MIG"), "{e}");
}

fn indices(sel: Option<Selection>) -> Result<Vec<u32>, SelectError> {
    Ok(resolve(&sel.unwrap(), &host())?
        .iter()
        .map(|g| g.index)
        .collect())
}

// Regression (issue 25 item 8): the env beat CDI devices and device nodes, so a tenant granted GPU 1
// who set NVIDIA_VISIBLE_DEVICES=0 had its quota put on GPU 0; an image's `all` beside one device put
// the quota on every GPU; NVIDIA's CDI specs' `void` left a CDI container no GPU.
#[test]
fn the_devices_given_are_the_truth_and_the_env_must_agree() {
    let node1 = ["/dev/nvidiactl".to_string(), "/dev/nvidia11".to_string()];
    let env = |v: &str| kv(&[("NVIDIA_VISIBLE_DEVICES", v)]);
    let cdi = |v: &str| kv(&[("cdi.k8s.io/vgpu", v)]);
    // beside device nodes: `all`, `void`, `none` say nothing; the same GPU agrees
    for v in ["all", "void", "none", "", "1", "GPU-1aaa"] {
        let s = from_spec(&env(v), &[], &node1, &[]).unwrap();
        assert_eq!(indices(s).unwrap(), vec![1], "{v}");
    }
    // another GPU is refused, with one line naming both
    let e = indices(from_spec(&env("0"), &[], &node1, &[]).unwrap()).unwrap_err();
    assert!(matches!(&e, SelectError::Disagree { .. }), "{e:?}");
    let line = e.to_string();
    assert!(
        line.contains("env NVIDIA_VISIBLE_DEVICES=0 names GPU 0")
            && line.contains("given GPU 1 (devices /dev/nvidia11)")
            && !line.contains('\n'),
        "{line}"
    );
    // a superset too
    let e = indices(from_spec(&env("0,1"), &[], &node1, &[]).unwrap()).unwrap_err();
    assert!(matches!(e, SelectError::Disagree { .. }), "{e:?}");
    // CDI devices not applied yet (a lower runtime applies them): the same rules
    for v in ["all", "void", "1"] {
        let s = from_spec(&env(v), &cdi("nvidia.com/gpu=1"), &[], &[]).unwrap();
        assert_eq!(indices(s).unwrap(), vec![1], "{v}");
    }
    let e = indices(from_spec(&env("0"), &cdi("nvidia.com/gpu=1"), &[], &[]).unwrap());
    assert!(matches!(e, Err(SelectError::Disagree { .. })), "{e:?}");
    // CDI names beside the nodes they became agree; others are refused
    let s = from_spec(&[], &cdi("nvidia.com/gpu=1"), &node1, &[]).unwrap();
    assert_eq!(indices(s).unwrap(), vec![1]);
    let e = indices(from_spec(&[], &cdi("nvidia.com/gpu=0"), &node1, &[]).unwrap());
    assert!(matches!(e, Err(SelectError::Disagree { .. })), "{e:?}");
    // nothing given in the spec: the env decides (the legacy hook injects what it names)
    assert_eq!(
        indices(from_spec(&env("0"), &[], &[], &[]).unwrap()).unwrap(),
        vec![0]
    );
}

#[test]
fn the_device_plugins_volume_mounts_list() {
    let env = kv(&[(
        "NVIDIA_VISIBLE_DEVICES",
        "/var/run/nvidia-container-devices",
    )]);
    let mounts = [
        "/proc".to_string(),
        "/var/run/nvidia-container-devices/GPU-2aaa".to_string(),
        "/var/run/nvidia-container-devices/0".to_string(),
        "/var/run/nvidia-container-devices-not/1".to_string(),
    ];
    let s = from_spec(&env, &[], &[], &mounts).unwrap().unwrap();
    assert!(s.source.contains("volume mounts"), "{}", s.source);
    assert_eq!(indices(Some(s)).unwrap(), vec![2, 0]);
    // no mount under the folder: no GPU
    let s = from_spec(&env, &[], &[], &mounts[..1]).unwrap();
    assert_eq!(indices(s).unwrap(), Vec::<u32>::new());
    // beside device nodes it must agree
    let nodes = ["/dev/nvidia12".to_string(), "/dev/nvidia10".to_string()];
    assert_eq!(
        indices(from_spec(&env, &[], &nodes, &mounts).unwrap()).unwrap(),
        vec![2, 0]
    );
    let e = indices(from_spec(&env, &[], &nodes[..1], &mounts).unwrap());
    assert!(matches!(e, Err(SelectError::Disagree { .. })), "{e:?}");
    // a name under the folder that is no GPU is one line
    let bad = ["/var/run/nvidia-container-devices/x".to_string()];
    let e = from_spec(&env, &[], &[], &bad).unwrap_err();
    assert!(matches!(e, SelectError::BadName { .. }), "{e:?}");
}
