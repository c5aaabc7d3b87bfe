//! Unit tests of `docker`: daemon.json configured and unconfigured through its syntax tree.
#![cfg(test)]

use super::*;
use crate::engines::change::apply_in_memory;
use proptest::prelude::*;

const P: &str = "/etc/docker/daemon.json";
fn settings(def: bool) -> Settings<'static> {
    Settings {
        runtime_path: "/usr/bin/vgpu-container-runtime",
        set_as_default: def,
        force: false,
    }
}

/// Through the engine interface on a pretend disk: --set-as-default's replaced default goes to the
/// record first, ownership follows the entry, unconfigure restores the file and forgets the record.
#[test]
fn the_engine_records_the_replaced_default() {
    use crate::engines::api::Install;
    use crate::engines::files::MemFiles;
    const R: &str = "/var/lib/vgpu/engines.json";
    let orig = "{\n  \"default-runtime\": \"crun\"\n}\n";
    let mut disk = MemFiles::with(&[(P, orig)]);
    let install = Install::default();
    let t = ConfigFile::default();
    let set = SetAsDefault {
        set_as_default: true,
    };
    let cx = |d: &MemFiles| -> Vec<Change> {
        let cx = Context {
            files: d,
            record: Path::new(R),
            install: &install,
            force: false,
        };
        Docker.configure(&t, &set, &cx).unwrap()
    };
    let ch = cx(&disk);
    assert_eq!(
        (ch[0].path.as_path(), ch[1].path.as_path()),
        (Path::new(R), Path::new(P))
    );
    disk.apply(&ch);
    assert!(disk.get(R).unwrap().contains("crun"));
    assert!(cx(&disk).is_empty(), "again: nothing to change");
    let cx = Context {
        files: &disk,
        record: Path::new(R),
        install: &install,
        force: false,
    };
    assert_eq!(Docker.ownership(&t, &cx).unwrap(), Ownership::Ours);
    let ch = Docker.unconfigure(&t, &cx).unwrap();
    disk.apply(&ch);
    assert_eq!((disk.get(P), disk.get(R)), (Some(orig), None));
}

/// Issue 46: `dpkg -r` left `{}` where there was no daemon.json. configure records that it created the
/// file; unconfigure removes it when nothing else was put in it, and keeps it when the operator added keys.
#[test]
fn a_daemon_json_configure_created_goes_at_unconfigure() {
    use crate::engines::api::Install;
    use crate::engines::files::MemFiles;
    const R: &str = "/var/lib/vgpu/engines.json";
    let install = Install::default();
    let t = ConfigFile::default();
    let set = SetAsDefault::default();
    fn cx<'a>(d: &'a MemFiles, install: &'a Install) -> Context<'a> {
        Context {
            files: d,
            record: Path::new(R),
            install,
            force: false,
        }
    }
    for (added, kept) in [(None, false), (Some("  \"log-level\": \"warn\",\n"), true)] {
        let mut disk = MemFiles::with(&[]);
        let ch = Docker.configure(&t, &set, &cx(&disk, &install)).unwrap();
        disk.apply(&ch);
        assert!(
            disk.get(R).unwrap().contains("\"created_config\": true"),
            "{:?}",
            disk.get(R)
        );
        if let Some(line) = added {
            let text = disk
                .get(P)
                .unwrap()
                .replacen("{\n", &format!("{{\n{line}"), 1);
            disk.apply(&[Change::write(P.into(), text, 0o644)]);
        }
        let ch = Docker.unconfigure(&t, &cx(&disk, &install)).unwrap();
        disk.apply(&ch);
        assert_eq!(disk.get(P).is_some(), kept, "{:?}", disk.get(P));
        assert_eq!(disk.get(R), None, "the record's entry goes");
    }
    // A daemon.json that was there, empty object and all, stays.
    let mut disk = MemFiles::with(&[(P, "{}\n")]);
    let ch = Docker.configure(&t, &set, &cx(&disk, &install)).unwrap();
    disk.apply(&ch);
    let ch = Docker.unconfigure(&t, &cx(&disk, &install)).unwrap();
    disk.apply(&ch);
    assert_eq!(disk.get(P), Some("{}\n"));
}

/// A `vgpu` runtime someone else defined (another runtime under that name) is refused by configure and
/// left alone by unconfigure; --force replaces it with vgpu's.
#[test]
fn foreign_vgpu_runtime_is_never_clobbered() {
    let orig = "{\n  \"runtimes\": {\n    \"vgpu\": {\n      \"path\": \"/opt/other/bin/gpu-runtime\",\n      \"runtimeArgs\": [\"--x\"]\n    }\n  },\n  \"default-runtime\": \"vgpu\"\n}\n";
    let e = configure(Path::new(P), Some(orig), &settings(false)).unwrap_err();
    assert!(
        matches!(&e, EngineError::Foreign { what, why, .. }
            if what == "runtimes.vgpu" && why == "its path is /opt/other/bin/gpu-runtime"),
        "{e}"
    );
    let e = unconfigure(Path::new(P), Some(orig), None).unwrap_err();
    assert!(matches!(e, EngineError::Foreign { .. }), "{e}");
    let forced = Settings {
        force: true,
        ..settings(false)
    };
    let ch = configure(Path::new(P), Some(orig), &forced)
        .unwrap()
        .changes;
    let out = apply_in_memory(&ch, P, Some(orig)).unwrap();
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v["runtimes"]["vgpu"],
        serde_json::json!({"path": "/usr/bin/vgpu-container-runtime"}),
        "replaced whole: {out}"
    );
    // Ours at another path is still ours: updated in place, and removed by unconfigure.
    let ours = "{\"runtimes\": {\"vgpu\": {\"path\": \"/opt/vgpu/vgpu-container-runtime\"}}}";
    assert!(configure(Path::new(P), Some(ours), &settings(false)).is_ok());
    let ch = unconfigure(Path::new(P), Some(ours), None).unwrap();
    assert_eq!(apply_in_memory(&ch, P, Some(ours)).unwrap(), "{}");
}
fn conf(text: Option<&str>, def: bool) -> Option<String> {
    let ch = configure(Path::new(P), text, &settings(def))
        .unwrap()
        .changes;
    apply_in_memory(&ch, P, text)
}

#[test]
fn adds_runtime_keeping_other_keys_in_order() {
    let orig = "{\n    \"log-driver\": \"journald\",\n    \"runtimes\": {\n        \"crun\": {\n            \"path\": \"/usr/bin/crun\"\n        }\n    },\n    \"storage-driver\": \"overlay2\"\n}\n";
    let out = conf(Some(orig), false).unwrap();
    assert_eq!(
        out,
        "{\n    \"log-driver\": \"journald\",\n    \"runtimes\": {\n        \"crun\": {\n            \"path\": \"/usr/bin/crun\"\n        },\n        \"vgpu\": {\n            \"path\": \"/usr/bin/vgpu-container-runtime\"\n        }\n    },\n    \"storage-driver\": \"overlay2\"\n}\n"
    );
    // Idempotent: a second configure changes nothing.
    assert!(configure(Path::new(P), Some(&out), &settings(false))
        .unwrap()
        .changes
        .is_empty());
    // And unconfigure gives back the original bytes.
    let ch = unconfigure(Path::new(P), Some(&out), None).unwrap();
    assert_eq!(apply_in_memory(&ch, P, Some(&out)).unwrap(), orig);
}

#[test]
fn missing_or_empty_file_gets_a_minimal_one() {
    for start in [None, Some(""), Some("  \n")] {
        let out = conf(start, false).unwrap();
        assert_eq!(out, "{\n  \"runtimes\": {\n    \"vgpu\": {\n      \"path\": \"/usr/bin/vgpu-container-runtime\"\n    }\n  }\n}\n");
        assert!(
            unconfigure(Path::new(P), Some(&out), None).unwrap()[0]
                .contents
                .as_deref()
                == Some("{}\n")
        );
    }
}

#[test]
fn set_as_default_reports_the_replaced_default_and_unconfigure_restores_it() {
    let orig = "{\n  \"default-runtime\": \"crun\",\n  \"debug\": true\n}\n";
    let c = configure(Path::new(P), Some(orig), &settings(true)).unwrap();
    assert_eq!(c.changes.len(), 1, "only daemon.json: no file beside it");
    assert_eq!(c.replaced_default, Some(Some("crun".into())));
    let out = apply_in_memory(&c.changes, P, Some(orig)).unwrap();
    assert!(out.contains("\"default-runtime\": \"vgpu\""));
    // Again: nothing replaced (vgpu is the default already), nothing written.
    let again = configure(Path::new(P), Some(&out), &settings(true)).unwrap();
    assert!(again.changes.is_empty() && again.replaced_default.is_none());
    let ch = unconfigure(Path::new(P), Some(&out), Some("crun")).unwrap();
    assert_eq!(apply_in_memory(&ch, P, Some(&out)).unwrap(), orig);
    // Unset before: reported as such.
    let c = configure(Path::new(P), Some("{}"), &settings(true)).unwrap();
    assert_eq!(c.replaced_default, Some(None));
}

/// daemon.json files configured by an older vgpuctl: the replaced default is in a hidden file beside.
#[test]
fn the_legacy_file_is_read() {
    assert_eq!(
        legacy_path(Path::new(P)),
        Path::new("/etc/docker/.daemon.json.vgpuctl-previous-default")
    );
    assert_eq!(
        read_legacy("{\"default-runtime\":\"crun\"}\n").as_deref(),
        Some("crun")
    );
    assert_eq!(read_legacy("garbage"), None);
}

#[test]
fn set_as_default_without_previous_removes_key_on_undo() {
    let orig = "{\n  \"debug\": true\n}\n";
    let out = conf(Some(orig), true).unwrap();
    let ch = unconfigure(Path::new(P), Some(&out), None).unwrap();
    assert_eq!(apply_in_memory(&ch, P, Some(&out)).unwrap(), orig);
}

#[test]
fn empty_objects_round_trip() {
    // (`{\n}` comes back as `{}`: the one layout the syntax tree does not restore.)
    for orig in ["{}\n", "{}"] {
        let out = conf(Some(orig), false).unwrap();
        let ch = unconfigure(Path::new(P), Some(&out), None).unwrap();
        assert_eq!(
            apply_in_memory(&ch, P, Some(&out)).unwrap(),
            orig,
            "from {orig:?} via {out:?}"
        );
    }
}

#[test]
fn unconfigure_of_unconfigured_file_touches_nothing() {
    assert!(unconfigure(Path::new(P), Some("{\"a\": 1}"), None)
        .unwrap()
        .is_empty());
    assert!(unconfigure(Path::new(P), None, None).unwrap().is_empty());
}

/// tests/golden/docker: daemon.json files → the exact file vgpuctl writes; unconfigure gives the input
/// back (for set-as-default through the remembered previous default).
#[test]
fn golden() {
    let n = crate::engines::change::golden("docker", "json", |case, input| {
        let def = case.ends_with("set-as-default");
        let c = configure(Path::new(P), Some(input), &settings(def)).unwrap();
        let out = apply_in_memory(&c.changes, P, Some(input)).unwrap();
        let prev = c.replaced_default.flatten();
        let back = unconfigure(Path::new(P), Some(&out), prev.as_deref()).unwrap();
        let restored = apply_in_memory(&back, P, Some(&out)).unwrap();
        // An empty file comes back as an empty object, the one case where configure wrote from scratch.
        if input.trim().is_empty() {
            assert_eq!(restored, "{}\n");
        } else {
            assert_eq!(restored, input, "{case}: unconfigure restores the bytes");
        }
        out
    });
    assert!(n >= 3, "golden cases: {n}");
}

#[test]
fn parse_error_names_path_and_line() {
    let e = configure(
        Path::new(P),
        Some("{\n  \"a\": 1,\n  oops\n}"),
        &settings(false),
    )
    .unwrap_err();
    assert!(matches!(e, EngineError::Syntax { line: 3, .. }), "{e}");
    assert!(
        e.to_string().starts_with("/etc/docker/daemon.json:3:"),
        "{e}"
    );
    let e = configure(Path::new(P), Some("[1]"), &settings(false)).unwrap_err();
    assert!(
        matches!(&e, EngineError::Shape { what, .. } if what == NOT_OBJECT),
        "{e}"
    );
    let e = configure(Path::new(P), Some("{\"runtimes\": 3}"), &settings(false)).unwrap_err();
    let runtimes = "\"runtimes\" is not a JSON object";
    assert!(
        matches!(&e, EngineError::Shape { what, .. } if what == runtimes),
        "{e}"
    );
}

proptest! {
    // Any daemon.json made of other keys, in any of the usual layouts, survives configure +
    // unconfigure byte for byte.
    #[test]
    fn round_trip(keys in proptest::collection::btree_map("[a-z-]{1,12}", any::<u32>(), 1..8),
                  with_runtimes in any::<bool>(), def in any::<bool>(), tabs in any::<bool>(),
                  inline_array in any::<bool>()) {
        let ind = if tabs { "\t" } else { "    " };
        let mut lines: Vec<String> = keys.iter()
            .filter(|(k, _)| k.as_str() != "runtimes" && k.as_str() != "default-runtime")
            .map(|(k, v)| format!("{ind}\"{k}\": {v}")).collect();
        if inline_array { lines.push(format!("{ind}\"hosts\": [\"unix:///run/a.sock\", \"tcp://0.0.0.0:1\"]")); }
        if with_runtimes { lines.push(format!("{ind}\"runtimes\": {{\n{ind}{ind}\"crun\": {{\"path\": \"/usr/bin/crun\"}}\n{ind}}}")); }
        let orig = format!("{{\n{}\n}}\n", lines.join(",\n"));
        let out = conf(Some(&orig), def).unwrap();
        let v: Value = serde_json::from_str(&out).unwrap();
        prop_assert_eq!(v["runtimes"]["vgpu"]["path"].as_str(), Some("/usr/bin/vgpu-container-runtime"));
        let again = configure(Path::new(P), Some(&out), &settings(def)).unwrap();
        prop_assert!(again.changes.is_empty());
        let ch = unconfigure(Path::new(P), Some(&out), None).unwrap();
        prop_assert_eq!(apply_in_memory(&ch, P, Some(&out)).unwrap(), orig);
    }
}
