//! Unit tests of `edits`: the container's edits computed from a plan, as a spec edit and as mounts.

use super::*;
use vgpu_host::request::GpuRequest;
use vgpu_ledger::GpuSettings;

#[test]
fn the_ledgers_are_mounted_as_files_and_any_gpus_are_stripped() {
    let plan = |uuids: &[&str]| Plan {
        gpus: uuids
            .iter()
            .enumerate()
            .map(|(i, u)| GpuRequest {
                index: i,
                uuid: u.to_string(),
                settings: GpuSettings {
                    memory_limit: Some(1 << 30),
                    ..Default::default()
                },
            })
            .collect(),
        kubernetes: None,
    };
    let root = StateRoot::new("/s".into());
    let cfg = Config::default();
    let edits = ContainerEdits::new(&plan(&["GPU-a", "GPU-b"]), &root, "c1", &cfg).unwrap();
    let ledgers: Vec<(&str, &Path, bool)> = edits
        .mounts
        .iter()
        .filter(|m| m.destination.starts_with("/run/vgpu/ledgers"))
        .map(|m| (m.destination.as_str(), m.source.as_path(), m.read_only))
        .collect();
    assert_eq!(
        ledgers,
        [
            (
                "/run/vgpu/ledgers/GPU-a.ledger",
                Path::new("/s/containers/c1/ledgers/GPU-a.ledger"),
                false
            ),
            (
                "/run/vgpu/ledgers/GPU-b.ledger",
                Path::new("/s/containers/c1/ledgers/GPU-b.ledger"),
                false
            )
        ],
        "one writable file per GPU, never the folder"
    );
    // A bundle edited for other GPUs (or by an earlier version, which mounted the folder) is stripped
    // of all of it; another mount under /run/vgpu is not ours.
    let mut spec = Spec::parse(
        r#"{"mounts":[{"destination":"/run/vgpu/ledgers","source":"/old"},{"destination":"/run/vgpu/ledgers/x/y","source":"/z"}]}"#,
        Path::new("c"),
    )
    .unwrap();
    edits.apply_to_spec(&mut spec).unwrap();
    ContainerEdits::strip_from_spec(&mut spec);
    ContainerEdits::new(&plan(&["GPU-c"]), &root, "c1", &cfg)
        .unwrap()
        .apply_to_spec(&mut spec)
        .unwrap();
    let dests: Vec<&str> = spec.0["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["destination"].as_str().unwrap())
        .filter(|d| d.starts_with("/run/vgpu/ledgers"))
        .collect();
    assert_eq!(
        dests,
        ["/run/vgpu/ledgers/x/y", "/run/vgpu/ledgers/GPU-c.ledger"]
    );
    assert!(!is_our_destination("/run/vgpu/ledgers/"));
    assert!(!is_our_destination("/run/vgpu/ledgersX/a"));
}

#[test]
fn editing_twice_gives_one_set_for_the_last_id() {
    let mut spec = Spec::parse(
        r#"{"process":{"env":["A=1"]},"mounts":[{"destination":"/proc","type":"proc","source":"proc"}],
            "hooks":{"prestart":[{"path":"/usr/bin/other-hook"}]}}"#,
        Path::new("config.json"),
    )
    .unwrap();
    let plan = Plan {
        kubernetes: None,
        gpus: vec![GpuRequest {
            index: 0,
            uuid: "GPU-1".into(),
            settings: GpuSettings {
                memory_limit: Some(1 << 30),
                ..Default::default()
            },
        }],
    };
    let cfg = Config::default();
    let root = StateRoot::new("/run/vgpu".into());
    ContainerEdits::new(&plan, &root, "first", &cfg)
        .unwrap()
        .apply_to_spec(&mut spec)
        .unwrap();
    assert!(shim_ran(&spec.annotations()));
    ContainerEdits::strip_from_spec(&mut spec);
    ContainerEdits::new(&plan, &root, "second", &cfg)
        .unwrap()
        .apply_to_spec(&mut spec)
        .unwrap();
    let text = spec.to_text();
    assert!(!text.contains("containers/first"), "{text}");
    let v = &spec.0;
    assert_eq!(
        v["mounts"].as_array().unwrap().len(),
        1 + 4 + usize::from(core_library(&cfg).is_some())
    );
    assert_eq!(v["hooks"]["createRuntime"].as_array().unwrap().len(), 1);
    assert_eq!(v["hooks"]["poststop"].as_array().unwrap().len(), 1);
    assert_eq!(v["hooks"]["prestart"][0]["path"], "/usr/bin/other-hook");
    assert_eq!(
        spec.env_var("CUDA_DEVICE_MEMORY_LIMIT_0").as_deref(),
        Some("1073741824")
    );
    assert_eq!(
        spec.env()
            .iter()
            .filter(|(k, _)| k == "VGPU_LIMITS_FILE")
            .count(),
        1
    );
}

/// The shim's edit, byte for byte (a guard for refactoring: the spec a runtime sees must not change).
#[test]
fn the_shim_edit_byte_for_byte() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("libvgpu.so"), "").unwrap();
    std::fs::write(d.path().join("libvgpu_core.so"), "").unwrap();
    let cfg = Config {
        library: d.path().join("libvgpu.so"),
        hook_path: "/usr/bin/vgpu-hook".into(),
        ..Config::default()
    };
    let plan = Plan {
        kubernetes: None,
        gpus: vec![
            GpuRequest {
                index: 0,
                uuid: "GPU-0".into(),
                settings: GpuSettings {
                    memory_limit: Some(1 << 30),
                    ..Default::default()
                },
            },
            GpuRequest {
                index: 2,
                uuid: "GPU-2".into(),
                settings: GpuSettings {
                    memory_limit: Some(512 << 20),
                    ..Default::default()
                },
            },
        ],
    };
    let mut spec = Spec::parse(
        r#"{"ociVersion":"1.0.2","process":{"env":["PATH=/bin"]},"annotations":{"a":"b"}}"#,
        Path::new("c"),
    )
    .unwrap();
    ContainerEdits::new(&plan, &StateRoot::new("/s".into()), "c1", &cfg)
        .unwrap()
        .apply_to_spec(&mut spec)
        .unwrap();
    let lib = d.path().display();
    let hook_env: Vec<String> = Config::hook_env()
        .iter()
        .map(|e| format!("{e:?}"))
        .collect();
    let hook_env = hook_env.join(",");
    let want = format!(
        r#"{{"ociVersion":"1.0.2","process":{{"env":["PATH=/bin","CUDA_DEVICE_MEMORY_LIMIT_0=1073741824","CUDA_DEVICE_MEMORY_LIMIT_2=536870912","VGPU_LIMITS_FILE=/run/vgpu/limits.json"]}},"annotations":{{"a":"b","vgpu.io/provisioned-by":"vgpu-container-runtime"}},"mounts":[{{"destination":"/run/vgpu/limits.json","type":"bind","source":"/s/containers/c1/limits.json","options":["rbind","ro","nosuid","nodev","noexec"]}},{{"destination":"/run/vgpu/ledgers/GPU-0.ledger","type":"bind","source":"/s/containers/c1/ledgers/GPU-0.ledger","options":["rbind","rw","nosuid","nodev","noexec"]}},{{"destination":"/run/vgpu/ledgers/GPU-2.ledger","type":"bind","source":"/s/containers/c1/ledgers/GPU-2.ledger","options":["rbind","rw","nosuid","nodev","noexec"]}},{{"destination":"/usr/local/vgpu/libvgpu.so","type":"bind","source":"{lib}/libvgpu.so","options":["rbind","ro","nosuid","nodev"]}},{{"destination":"/usr/local/vgpu/libvgpu_core.so","type":"bind","source":"{lib}/libvgpu_core.so","options":["rbind","ro","nosuid","nodev"]}},{{"destination":"/etc/ld.so.preload","type":"bind","source":"/s/containers/c1/ld.so.preload","options":["rbind","ro","nosuid","nodev","noexec"]}}],"hooks":{{"createRuntime":[{{"path":"/usr/bin/vgpu-hook","args":["vgpu-hook","createRuntime"],"env":[{hook_env}]}}],"poststop":[{{"path":"/usr/bin/vgpu-hook","args":["vgpu-hook","poststop"],"env":[{hook_env}]}}]}}}}"#
    );
    assert_eq!(serde_json::to_string(&spec.0).unwrap(), want);
    // The precreate stage adds the env alone.
    let mut spec = Spec::parse(
        r#"{"process":{"env":["CUDA_DEVICE_MEMORY_LIMIT_0=1"]}}"#,
        Path::new("c"),
    )
    .unwrap();
    ContainerEdits::env_only(&plan)
        .apply_to_spec(&mut spec)
        .unwrap();
    assert_eq!(
        serde_json::to_string(&spec.0).unwrap(),
        r#"{"process":{"env":["CUDA_DEVICE_MEMORY_LIMIT_0=1073741824","CUDA_DEVICE_MEMORY_LIMIT_2=536870912","VGPU_LIMITS_FILE=/run/vgpu/limits.json"]}}"#
    );
}

/// The hooks.d path mounts the same things as the shim's spec edit: same sources, destinations and
/// flags (read-only, noexec) — one value, two ways of applying it.
#[test]
fn the_mounts_are_the_same_whichever_way_they_are_applied() {
    let plan = Plan {
        kubernetes: None,
        gpus: vec![GpuRequest {
            index: 0,
            uuid: "GPU-1".into(),
            settings: GpuSettings {
                memory_limit: Some(1 << 30),
                ..Default::default()
            },
        }],
    };
    let edits = ContainerEdits::new(
        &plan,
        &StateRoot::new("/s".into()),
        "c1",
        &Config::default(),
    )
    .unwrap();
    let mut spec = Spec::parse("{}", Path::new("c")).unwrap();
    edits.apply_to_spec(&mut spec).unwrap();
    let in_spec = spec.0["mounts"].as_array().unwrap();
    assert_eq!(in_spec.len(), edits.mounts.len());
    for (m, s) in edits.mounts.iter().zip(in_spec) {
        assert_eq!(s["destination"], m.destination);
        assert_eq!(s["source"], m.source.to_str().unwrap());
        let opts: Vec<&str> = s["options"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o.as_str().unwrap())
            .collect();
        assert_eq!(opts.contains(&"ro"), m.read_only);
        assert_eq!(opts.contains(&"noexec"), m.noexec);
    }
    // Every mount is one a re-edit strips.
    assert!(edits
        .mounts
        .iter()
        .all(|m| is_our_destination(&m.destination)));
    ContainerEdits::strip_from_spec(&mut spec);
    assert_eq!(spec.0["mounts"], serde_json::json!([]));
    assert_eq!(
        spec.0["hooks"],
        serde_json::json!({"createRuntime": [], "poststop": []})
    );
}
