//! Unit tests of `limits`: the format read, validation, the names, the owner facts (the host's
//! write, its bytes and its refusals: `vgpu_host::limits_file`'s tests).
use super::*;
use crate::envcompute::Policy;

fn sample() -> Limits {
    Limits {
        version: 1,
        container_id: "3f2a".into(),
        pid_ns: Some(4026532612),
        init_pid: Some(12345),
        init_start_time: None,
        cgroup: None,
        creator: None,
        kubernetes: None,
        updates: 0,
        updated_at: None,
        devices: vec![
            DeviceLimit {
                index: 0,
                uuid: "GPU-aaaa".into(),
                settings: GpuSettings {
                    memory_limit: Some(1 << 30),
                    ..Default::default()
                },
                ledger: "ledgers/GPU-aaaa.ledger".into(),
                shrunk_from: None,
                held_at_shrink: None,
            },
            DeviceLimit {
                index: 1,
                uuid: "GPU-bbbb".into(),
                settings: GpuSettings {
                    memory_limit: Some(2 << 30),
                    ..Default::default()
                },
                ledger: "ledgers/GPU-bbbb.ledger".into(),
                shrunk_from: None,
                held_at_shrink: None,
            },
        ],
    }
}

fn load_text(text: &str) -> Result<Limits, String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limits.json");
    std::fs::write(&path, text).unwrap();
    Limits::load(&path).map_err(|e| {
        let msg = e.to_string();
        assert!(
            msg.contains(&path.display().to_string()),
            "error does not name the file: {msg}"
        );
        msg
    })
}

#[test]
fn round_trip_and_lookups() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limits.json");
    let l = sample();
    std::fs::write(&path, serde_json::to_vec_pretty(&l).unwrap()).unwrap();
    let back = Limits::load(&path).unwrap();
    assert_eq!(back, l);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o644
    );
    assert_eq!(back.device_by_uuid("GPU-bbbb").unwrap().index, 1);
    assert!(back.device_by_uuid("GPU-cccc").is_none());
    let dev = back.device_by_uuid("GPU-bbbb").unwrap();
    assert_eq!(
        back.ledger_path(&path, dev),
        dir.path().join("ledgers/GPU-bbbb.ledger")
    );
    // no temporary file is left behind
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("limits.json")]);
}

#[test]
fn the_documented_example_loads() {
    let text = r#"{
      "version": 1,
      "container_id": "3f2a",
      "pid_ns": 4026532612,
      "init_pid": 12345,
      "devices": [
        { "index": 0, "uuid": "GPU-0", "memory_limit": 1073741824, "ledger": "ledgers/GPU-0.ledger" }
      ]
    }"#;
    let l = load_text(text).unwrap();
    assert_eq!(l.devices[0].settings.memory_limit, Some(1 << 30));
    assert_eq!(l.devices[0].settings.compute_share(), None);
    // optional fields may be absent; unknown keys are tolerated
    let l = load_text(r#"{"version":1,"container_id":"c","future":true,"devices":[{"index":0,"uuid":"GPU-0","memory_limit":1,"ledger":"ledgers/GPU-0.ledger"}]}"#).unwrap();
    assert_eq!(l.pid_ns, None);
    assert_eq!(l.init_pid, None);
}

#[test]
fn bad_files_get_one_clear_error() {
    let good = serde_json::to_string(&sample()).unwrap();
    let cases: Vec<(String, &str)> = vec![
        (good[..good.len() / 2].to_string(), "not valid JSON"),
        ("".into(), "not valid JSON"),
        ("\u{1}\u{2}garbage".into(), "not valid JSON"),
        (
            good.replace("\"version\":1", "\"version\":2"),
            "format version 2 is not supported (this build reads version 1)",
        ),
        (
            good.replace("\"version\":1", "\"version\":\"1\""),
            "\"version\" is not a positive integer",
        ),
        (
            good.replace("\"version\":1,", ""),
            "missing field \"version\"",
        ),
        ("[1,2]".into(), "missing field \"version\""),
        (
            good.replace("\"container_id\":\"3f2a\",", ""),
            "missing field `container_id`",
        ),
        (
            good.replace("\"container_id\":\"3f2a\"", "\"container_id\":\"../x\""),
            "invalid container id",
        ),
        (good.replace("GPU-bbbb\"", "GPU-aaaa\""), "listed twice"),
        (
            good.replace("\"index\":1", "\"index\":0"),
            "device index 0 is listed twice",
        ),
        (
            good.replace("\"memory_limit\":2147483648", "\"memory_limit\":0"),
            "memory_limit is 0",
        ),
        (
            good.replace("\"memory_limit\":2147483648", "\"memory_limit\":-1"),
            "devices[1].memory_limit: invalid value",
        ),
        (
            good.replace("ledgers/GPU-bbbb.ledger", "../../etc/x"),
            "without '..'",
        ),
        (
            good.replace("ledgers/GPU-bbbb.ledger", "/etc/x"),
            "must be relative",
        ),
        (
            r#"{"version":1,"container_id":"c","devices":[]}"#.into(),
            "lists no devices",
        ),
        (
            good.replace("\"memory_limit\":2147483648,", ""),
            "device 1 (GPU-bbbb): has no memory_limit, compute_limit or compute_request",
        ),
        (
            good.replace("\"memory_limit\":2147483648,", "\"compute_request\":0,"),
            "device 1 (GPU-bbbb): compute_request 0 is not a percent 1..=100",
        ),
        (
            good.replace(
                "\"memory_limit\":2147483648,",
                "\"compute_limit\":30,\"compute_request\":40,",
            ),
            "device 1 (GPU-bbbb): compute_request 40 is above compute_limit 30",
        ),
        (
            good.replace("\"memory_limit\":2147483648,", "\"compute_request\":\"x\","),
            "devices[1].compute_request: invalid type: string \"x\", expected u32",
        ),
        (
            good.replace("\"memory_limit\":2147483648,", "\"compute_limit\":100,"),
            "compute_limit 100 is not a percent 1..=99",
        ),
        (
            good.replace("\"memory_limit\":2147483648,", "\"compute_limit\":0,"),
            "compute_limit 0 is not a percent 1..=99",
        ),
        (
            good.replace("\"memory_limit\":2147483648,", "\"compute_limit\":-3,"),
            "devices[1].compute_limit: invalid value",
        ),
        (
            good.replace(
                "\"memory_limit\":2147483648,",
                "\"compute_limit\":30,\"compute_policy\":\"sometimes\",",
            ),
            "devices[1].compute_policy: unknown variant",
        ),
        // A bad setting's line names its key (the settings are flattened into the device: serde's path
        // alone would stop at `devices[1]`), as a bad key of the device's own does.
        (
            good.replace(
                "\"memory_limit\":2147483648,",
                "\"memory_limit\":1,\"compute_window_ms\":\"x\",",
            ),
            "devices[1].compute_window_ms: invalid type: string \"x\", expected u32",
        ),
        (
            good.replace(
                "\"memory_limit\":2147483648,",
                "\"memory_limit\":1,\"memory\":{\"mode\":\"swap\"},",
            ),
            "devices[1].memory.mode: unknown variant `swap`",
        ),
        (
            good.replace("\"index\":1", "\"index\":\"a\""),
            "devices[1].index: invalid type: string \"a\", expected u32",
        ),
        (
            good.replace(
                "\"memory_limit\":2147483648,",
                "\"compute_limit\":30,\"compute_window_ms\":5,",
            ),
            "device 1 (GPU-bbbb): compute_window_ms 5 is not within 10..=10000",
        ),
        (
            good.replace(
                "\"memory_limit\":2147483648,",
                "\"compute_limit\":30,\"memory\":{\"mode\":\"spill\",\"spill_limit\":5},",
            ),
            "memory mode spill needs a memory_limit",
        ),
    ];
    for (text, want) in cases {
        let msg = load_text(&text).expect_err(&text);
        assert!(
            msg.contains(want),
            "for {text:?}: got {msg:?}, want {want:?}"
        );
        assert!(!msg.contains('\n'), "multi-line error: {msg:?}");
    }
}

#[test]
fn a_compute_share_with_or_without_a_memory_quota() {
    let mut l = sample();
    l.devices[0].settings.compute_limit = Some(30);
    l.devices[1].settings.memory_limit = None;
    l.devices[1].settings.compute_limit = Some(70);
    l.devices[1].settings.compute_policy = Policy::Force;
    l.devices[1].settings.compute_window_ms = Some(250);
    let text = serde_json::to_string(&l).unwrap();
    assert!(
        text.contains(r#""compute_limit":70,"compute_policy":"force","compute_window_ms":250"#),
        "{text}"
    );
    let back = Limits::from_slice(text.as_bytes()).unwrap();
    assert_eq!(back, l);
    assert_eq!(back.devices[0].settings.compute_share(), Some(30));
    assert_eq!(back.devices[1].settings.memory_limit, None);
    assert_eq!(back.devices[1].settings.compute_share(), Some(70));
    // A file without the keys (every file written before them) has no share; `disable` switches it off.
    let old = serde_json::to_string(&sample()).unwrap();
    assert!(!old.contains("compute"), "{old}");
    l.devices[1].settings.compute_policy = Policy::Disable;
    assert_eq!(l.devices[1].settings.compute_share(), None);
}

// Issue 42: a request beside the limit, or alone (no limit: the whole GPU), on disk as its own key;
// absent in every file written before it (a limit alone, its own request).
#[test]
fn a_compute_request_with_or_without_a_limit() {
    let mut l = sample();
    l.devices[0].settings.compute_limit = Some(60);
    l.devices[0].settings.compute_request = Some(20);
    l.devices[1].settings.memory_limit = None;
    l.devices[1].settings.compute_request = Some(30);
    let text = serde_json::to_string(&l).unwrap();
    assert!(
        text.contains(r#""compute_limit":60,"compute_request":20,"#),
        "{text}"
    );
    let back = Limits::from_slice(text.as_bytes()).unwrap();
    assert_eq!(back, l);
    assert_eq!(back.devices[0].settings.request_limit(), Some((20, 60)));
    assert_eq!(back.devices[1].settings.request_limit(), Some((30, 100)));
    // The library's cap: none for a request alone.
    assert_eq!(back.devices[1].settings.compute_share(), None);
    let mut cap = sample();
    cap.devices[0].settings.compute_limit = Some(30);
    let text = serde_json::to_string(&cap).unwrap();
    assert!(!text.contains("compute_request"), "{text}");
    assert_eq!(cap.devices[0].settings.request_limit(), Some((30, 30)));
}

#[test]
fn missing_file_names_the_path() {
    let err = Limits::load(Path::new("/nonexistent/vgpu/limits.json")).unwrap_err();
    assert!(matches!(err.kind, LimitsErrorKind::Io(_)));
    assert!(err.to_string().contains("/nonexistent/vgpu/limits.json"));
}

#[test]
fn a_ledger_path_out_of_the_folder_is_invalid() {
    let mut l = sample();
    l.devices[1].ledger = "../escape".into();
    assert!(l.validate().is_err());
}

#[test]
fn kubernetes_names_round_trip() {
    let mut l = sample();
    l.kubernetes = Some(KubeNames {
        namespace: "ns".into(),
        pod: "p".into(),
        container: "c".into(),
    });
    let text = serde_json::to_vec(&l).unwrap();
    assert_eq!(Limits::from_slice(&text).unwrap(), l);
    // Older files have no such key.
    assert_eq!(
        Limits::from_slice(&serde_json::to_vec(&sample()).unwrap())
            .unwrap()
            .kubernetes,
        None
    );
}

// (A file past the host readers' cap, issue 25, is never written: `vgpu_host::limits_file`'s tests.)
#[test]
fn a_bad_cgroup_is_invalid() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limits.json");
    // The owner facts: an absolute cgroup path, or none.
    let mut l = sample();
    l.init_start_time = Some(42);
    l.cgroup = Some("/kubepods/pod1/crio-3f2a".into());
    std::fs::write(&path, serde_json::to_vec_pretty(&l).unwrap()).unwrap();
    assert_eq!(Limits::load(&path).unwrap(), l);
    for bad in [
        "kubepods",
        "/a\nb",
        &format!("/{}", "x".repeat(MAX_CGROUP_PATH)),
    ] {
        l.cgroup = Some(bad.into());
        assert!(l.validate().is_err(), "{bad:?}");
    }
}

#[test]
fn the_creator_round_trips_and_is_optional() {
    let mut l = sample();
    let text = serde_json::to_string(&l).unwrap();
    assert!(!text.contains("creator"), "{text}");
    assert_eq!(Limits::from_slice(text.as_bytes()).unwrap().creator, None);
    l.creator = Some(Creator {
        pid: 77,
        start_time: 123456,
    });
    let text = serde_json::to_string(&l).unwrap();
    assert!(
        text.contains(r#""creator":{"pid":77,"start_time":123456}"#),
        "{text}"
    );
    assert_eq!(Limits::from_slice(text.as_bytes()).unwrap(), l);
}

// Issue 26 item 7 (version skew): what each side of an upgrade reads. The file as the first version-1
// writer wrote it (no owner start time, cgroup, creator, Kubernetes names, compute share or memory mode:
// each came later as an optional field) still loads, its absent fields absent; a newer writer's fields
// this build does not know (a generation, a device's new setting, a new Kubernetes name) are ignored at
// every level; a version other than this build's, older or newer, is refused as that version.
#[test]
fn version_skew_older_fields_absent_newer_fields_ignored_other_versions_refused() {
    let oldest = r#"{"version":1,"container_id":"c0","pid_ns":4026532612,"init_pid":4242,
        "devices":[{"index":0,"uuid":"GPU-0","memory_limit":1073741824,"ledger":"ledgers/GPU-0.ledger"}]}"#;
    let l = load_text(oldest).unwrap();
    assert_eq!(
        (l.init_start_time, &l.cgroup, l.creator, &l.kubernetes),
        (None, &None, None, &None)
    );
    assert_eq!(l.devices[0].settings.compute_limit, None);
    assert_eq!(l.devices[0].settings.memory, Default::default());

    let newer_minor = r#"{"version":1,"container_id":"c1","generation":7,"rebalanced_at":"2027-01-01",
        "kubernetes":{"namespace":"n","pod":"p","container":"c","uid":"u-1"},
        "devices":[{"index":0,"uuid":"GPU-0","memory_limit":1073741824,"ledger":"ledgers/GPU-0.ledger",
                    "compute_burst":{"percent":50}}]}"#;
    let l = load_text(newer_minor).unwrap();
    assert_eq!(l.devices[0].settings.memory_limit, Some(1 << 30));
    assert_eq!(l.kubernetes.unwrap().pod, "p");

    for v in [0u64, 2, 100] {
        let text = oldest.replace("\"version\":1", &format!("\"version\":{v}"));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("limits.json");
        std::fs::write(&path, text).unwrap();
        match Limits::load(&path).unwrap_err().kind {
            LimitsErrorKind::UnsupportedVersion { found } => assert_eq!(found, v),
            k => panic!("version {v}: {k:?}"),
        }
    }
}

#[test]
fn validation_says_which_rule_a_file_breaks() {
    let broken = |edit: fn(&mut Limits)| {
        let mut l = sample();
        edit(&mut l);
        l.validate().unwrap_err()
    };
    assert_eq!(
        broken(|l| l.devices[1].index = 0),
        InvalidLimits::DuplicateIndex { index: 0 }
    );
    assert!(matches!(
        broken(|l| l.devices[1].uuid = "GPU-aaaa".into()),
        InvalidLimits::DuplicateUuid { .. }
    ));
    assert!(matches!(
        broken(|l| l.devices[0].ledger = "../x.ledger".into()),
        InvalidLimits::LedgerPath { index: 0, .. }
    ));
    assert!(matches!(
        broken(|l| l.devices[0].settings.compute_limit = Some(100)),
        InvalidLimits::Settings {
            index: 0,
            err: InvalidSettings::ComputeLimit { percent: 100 },
            ..
        }
    ));
    assert_eq!(broken(|l| l.devices.clear()), InvalidLimits::NoDevices);
    assert!(matches!(
        broken(|l| l.container_id = "../etc".into()),
        InvalidLimits::ContainerId(_)
    ));
    // Read from a file, the same rule is the error's kind.
    let mut l = sample();
    l.devices[1].index = 0;
    let text = serde_json::to_vec(&l).unwrap();
    assert!(matches!(
        Limits::from_slice(&text),
        Err(LimitsErrorKind::Rejected(InvalidLimits::DuplicateIndex {
            index: 0
        }))
    ));
}

// A shrink's figures (`vgpuctl update`): what the container held then rides along with the quota it came
// from; a file from before `held_at_shrink` existed reads it absent; a reader that predates it ignores it
// (the version-skew test above: unknown device fields are ignored). What they allow: `vgpu_host::shrink`.
#[test]
fn a_shrinks_held_figure_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limits.json");
    let mut l = sample();
    l.devices[0].settings.memory_limit = Some(1 << 30);
    l.devices[0].shrunk_from = Some(4 << 30);
    l.devices[0].held_at_shrink = Some(3 << 30);
    std::fs::write(&path, serde_json::to_vec_pretty(&l).unwrap()).unwrap();
    let back = Limits::load(&path).unwrap();
    assert_eq!(back, l);
    let older = r#"{"version":1,"container_id":"c0","devices":[{"index":0,"uuid":"GPU-0",
        "memory_limit":1073741824,"shrunk_from":4294967296,"ledger":"ledgers/GPU-0.ledger"}]}"#;
    let d = &load_text(older).unwrap().devices[0];
    assert_eq!((d.held_at_shrink, d.shrunk_from), (None, Some(4 << 30)));
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("\"held_at_shrink\""), "{text}");
}
