//! The spec built from GPUs, its text in both formats, the CDI name rules, the atomic write.

use super::spec::*;
use super::*;

fn gpus(n: u32) -> Vec<HostGpu> {
    (0..n)
        .map(|i| HostGpu {
            index: i,
            uuid: format!("GPU-fa4ec0de-0000-4000-8000-{i:012}"),
            total_memory: 16 << 30,
            minor: Some(i + 4),
        })
        .collect()
}

fn inputs(g: &[HostGpu]) -> Inputs<'_> {
    Inputs {
        gpus: g,
        hook_path: Path::new("/usr/bin/vgpu-hook"),
        hook_stage: "createRuntime",
        hook_env: vec!["PATH=/usr/sbin:/usr/bin:/sbin:/bin".into()],
    }
}

#[test]
fn every_gpu_by_index_and_uuid_and_all() {
    let g = gpus(2);
    let s = build(&inputs(&g)).unwrap();
    assert_eq!(s.kind, crate::keys::cdi::KIND);
    assert_eq!(s.cdi_version, "0.5.0");
    let names: Vec<&str> = s.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "0",
            "GPU-fa4ec0de-0000-4000-8000-000000000000",
            "1",
            "GPU-fa4ec0de-0000-4000-8000-000000000001",
            "all"
        ]
    );
    assert_eq!(s.device_names()[0], format!("{}=0", crate::keys::cdi::KIND));
    // Each device is its GPU's node, by NVML's minor (not its index), with type and numbers given.
    let nodes = |name: &str| -> Vec<DeviceNode> {
        s.devices
            .iter()
            .find(|d| d.name == name)
            .unwrap()
            .container_edits
            .device_nodes
            .clone()
    };
    assert_eq!(
        nodes("1"),
        [DeviceNode {
            path: "/dev/nvidia5".into(),
            kind: Some("c".into()),
            major: Some(195),
            minor: Some(5),
            permissions: Some("rw".into()),
        }]
    );
    assert_eq!(
        nodes("GPU-fa4ec0de-0000-4000-8000-000000000001"),
        nodes("1")
    );
    let all: Vec<String> = nodes("all").into_iter().map(|n| n.path).collect();
    assert_eq!(all, ["/dev/nvidia4", "/dev/nvidia5"]);
}

#[test]
fn the_hooks_are_spec_wide_with_the_hooks_env_and_nothing_else() {
    let g = gpus(1);
    let s = build(&inputs(&g)).unwrap();
    let h = &s.container_edits.hooks;
    assert_eq!(h.len(), 2);
    assert_eq!(h[0].hook_name, "createRuntime");
    assert_eq!(h[0].path, "/usr/bin/vgpu-hook");
    assert_eq!(h[0].args, ["vgpu-hook", "createRuntime"]);
    assert_eq!(h[0].env, ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]);
    assert_eq!(h[1].hook_name, "poststop");
    assert_eq!(h[1].args, ["vgpu-hook", "poststop"]);
    // No env for the container (NVIDIA's spec owns NVIDIA_VISIBLE_DEVICES), no device hooks.
    assert!(s.container_edits.env.is_empty());
    assert!(s.devices.iter().all(|d| d.container_edits.hooks.is_empty()));
    // The stage follows the config's hook_stage.
    let mut i = inputs(&g);
    i.hook_stage = "prestart";
    assert_eq!(
        build(&i).unwrap().container_edits.hooks[0].args[1],
        "prestart"
    );
}

#[test]
fn a_gpu_without_a_minor_is_its_index_node() {
    let mut g = gpus(1);
    g[0].minor = None;
    let s = build(&inputs(&g)).unwrap();
    assert_eq!(
        s.devices[0].container_edits.device_nodes[0].path,
        "/dev/nvidia0"
    );
}

#[test]
fn no_gpus_no_spec() {
    assert!(matches!(build(&inputs(&[])), Err(CdiError::NoGpus)));
}

#[test]
fn a_bad_hook_stage_is_refused_before_anything_is_written() {
    let g = gpus(1);
    let mut i = inputs(&g);
    i.hook_stage = "precreate";
    assert!(matches!(
        build(&i),
        Err(CdiError::Invalid(SpecError::HookName(s))) if s == "precreate"
    ));
    let mut i = inputs(&g);
    i.hook_path = Path::new("vgpu-hook");
    assert!(matches!(
        build(&i),
        Err(CdiError::Invalid(SpecError::RelativePath {
            what: "hook",
            ..
        }))
    ));
}

#[test]
fn yaml_and_json_read_back_as_written() {
    let g = gpus(2);
    let s = build(&inputs(&g)).unwrap();
    let yaml = render(&s, Format::Yaml).unwrap();
    assert!(yaml.starts_with("# vgpu's CDI devices"));
    assert!(yaml.contains("cdiVersion: 0.5.0"));
    assert!(yaml.contains("hookName: createRuntime"));
    assert!(yaml.contains("deviceNodes:"));
    assert_eq!(parse(&yaml).unwrap(), s);
    let json = render(&s, Format::Json).unwrap();
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["kind"], crate::keys::cdi::KIND);
    assert_eq!(
        v["devices"][0]["containerEdits"]["deviceNodes"][0]["type"],
        "c"
    );
    assert_eq!(v["containerEdits"]["hooks"][1]["hookName"], "poststop");
    assert_eq!(parse(&json).unwrap(), s);
    assert_eq!(
        Format::for_path(Path::new("/etc/cdi/vgpu.json")),
        Format::Json
    );
    assert_eq!(
        Format::for_path(Path::new("/etc/cdi/vgpu.yaml")),
        Format::Yaml
    );
}

#[test]
fn validation_follows_the_cdi_name_rules() {
    assert!(is_kind("vgpu.io/gpu"));
    assert!(is_kind("nvidia.com/gpu"));
    for bad in [
        "vgpu.io",
        "/gpu",
        "vgpu.io/",
        "vgpu.io/g.pu",
        "-vgpu.io/gpu",
        "vgpu.io/gpu/x",
    ] {
        assert!(!is_kind(bad), "{bad}");
    }
    assert!(is_device_name("0"));
    assert!(is_device_name("GPU-fa4ec0de-0000-4000-8000-000000000000"));
    assert!(is_device_name("MIG-1:0"));
    for bad in ["", "-0", "0-", "a/b", "a b"] {
        assert!(!is_device_name(bad), "{bad:?}");
    }
    let g = gpus(1);
    let good = build(&inputs(&g)).unwrap();
    let broken = |f: &dyn Fn(&mut Spec)| {
        let mut s = good.clone();
        f(&mut s);
        s.validate().unwrap_err()
    };
    assert_eq!(
        broken(&|s| s.cdi_version = "0.9.9".into()),
        SpecError::Version("0.9.9".into())
    );
    assert_eq!(
        broken(&|s| s.kind = "gpu".into()),
        SpecError::Kind("gpu".into())
    );
    assert_eq!(broken(&|s| s.devices.clear()), SpecError::NoDevices);
    assert_eq!(
        broken(&|s| s.devices[1].name = "0".into()),
        SpecError::DuplicateDevice("0".into())
    );
    assert_eq!(
        broken(&|s| s.devices[0].container_edits = ContainerEdits::default()),
        SpecError::EmptyDevice("0".into())
    );
    assert_eq!(
        broken(&|s| s.container_edits.env.push("=x".into())),
        SpecError::Env("=x".into())
    );
    assert!(matches!(
        broken(&|s| s.devices[0].container_edits.device_nodes[0].kind = Some("x".into())),
        SpecError::NodeType { .. }
    ));
    assert!(matches!(
        broken(&|s| s.devices[0].container_edits.device_nodes[0].path = "dev/nvidia0".into()),
        SpecError::RelativePath {
            what: "device node",
            ..
        }
    ));
}

#[test]
fn written_atomically_with_its_folder() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("cdi/vgpu.yaml");
    write(&p, "x: 1\n").unwrap();
    assert_eq!(std::fs::read_to_string(&p).unwrap(), "x: 1\n");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
        0o644
    );
    let e = write(Path::new("/proc/vgpu-no/x.yaml"), "x").unwrap_err();
    assert!(matches!(e, CdiError::Write { .. }));
}
