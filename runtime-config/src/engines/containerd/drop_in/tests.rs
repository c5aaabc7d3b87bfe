//! Unit tests of `drop_in`: vgpu's containerd drop-in written, imported and taken back.
#![cfg(test)]

use super::*;
use crate::engines::containerd::handler::RUNC_V2;
use crate::engines::containerd::marks::CREATED;
use crate::engines::containerd::testing::*;
use crate::engines::containerd::{configure, unconfigure};
use crate::engines::files::MemFiles;

/// Version 2 (containerd 1.x): an import that restates the CRI plugin section replaces the main file's
/// whole; a handler in the main file would be ignored, so vgpuctl says so and points at --drop-in.
#[test]
fn v2_import_restating_the_cri_section_needs_a_drop_in() {
    let main = "version = 2\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n";
    let cri = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"mine:1\"\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n  SystemdCgroup = true\n";
    let mut disk = MemFiles::with(&[(P, main), ("/etc/containerd/conf.d/10-cri.toml", cri)]);
    let e = configure(Path::new(P), disk.get(P), &disk, None, &s(false)).unwrap_err();
    assert!(
        matches!(&e, EngineError::RestatesMain { src, plugin, .. }
            if src.ends_with("10-cri.toml") && plugin == "io.containerd.grpc.v1.cri"),
        "{e}"
    );
    assert!(e.to_string().contains("use --drop-in"), "{e}");
    // The drop-in (covered by the glob: the main file stays as it is) restates that section with the
    // handler added.
    let entry = run_conf(&mut disk, None, &drop_in(false)).unwrap();
    assert_eq!(disk.get(P), Some(main));
    let text = disk.get(D).unwrap().to_string();
    assert!(
        is_our_drop_in(&text) && text.contains(DROP_IN_V2_NOTE),
        "{text}"
    );
    let d: DocumentMut = text.parse().unwrap();
    let cri_t = &d["plugins"]["io.containerd.grpc.v1.cri"];
    assert_eq!(cri_t["sandbox_image"].as_str(), Some("mine:1"), "{text}");
    let vgpu = &cri_t["containerd"]["runtimes"]["vgpu"];
    assert_eq!(vgpu["options"]["SystemdCgroup"].as_bool(), Some(true));
    assert_eq!(
        vgpu["options"]["BinaryName"].as_str(),
        Some("/usr/bin/vgpu-container-runtime")
    );
    assert_eq!(entry.drop_in.as_deref(), Some(Path::new(D)));
    assert_eq!(entry.import_added, None, "the glob covers it");
    // Again: nothing to do.
    let c = configure(
        Path::new(P),
        disk.get(P),
        &disk,
        Some(&entry),
        &drop_in(false),
    )
    .unwrap();
    assert!(c.changes.is_empty(), "{:?}", c.changes);
    assert_eq!(c.entry, entry);
    run_unconf(&mut disk, Some(&entry)).unwrap();
    assert_eq!(disk.get(D), None);
    assert_eq!(disk.get(P), Some(main));
}

/// --drop-in where the main file imports nothing: the entry is added (comments and keys kept), the
/// drop-in written; unconfigure takes both back, the main file byte for byte.
#[test]
fn drop_in_adds_the_import_and_unconfigure_takes_it_back() {
    for main in [
        V2.to_string(),
        "version = 2\n# mine\nimports = [\"/opt/other.toml\"] # theirs\n[debug]\n  level = \"info\"\n".into(),
    ] {
        let mut disk = MemFiles::with(&[(P, &main), ("/opt/other.toml", "version = 2\n")]);
        let entry = run_conf(&mut disk, None, &drop_in(true)).unwrap();
        let new_main = disk.get(P).unwrap().to_string();
        assert!(is_subsequence(&main, &new_main) || main.contains("imports"), "{new_main}");
        let d: DocumentMut = new_main.parse().unwrap();
        let imports = d["imports"].as_array().unwrap();
        assert_eq!(imports.iter().last().unwrap().as_str(), Some(D), "{new_main}");
        assert!(!new_main.contains("vgpu-container-runtime"), "the handler is not in the main file");
        let ia = entry.import_added.clone().unwrap();
        assert_eq!((ia.entry.as_str(), ia.created_key), (D, !main.contains("imports")));
        // The drop-in: version 2, the main file's CRI section restated, vgpu the default there.
        let dd: DocumentMut = disk.get(D).unwrap().parse().unwrap();
        let ctd = &dd["plugins"]["io.containerd.grpc.v1.cri"]["containerd"];
        assert_eq!(ctd["default_runtime_name"].as_str(), Some("vgpu"));
        assert_eq!(ctd["runtimes"]["vgpu"]["runtime_type"].as_str(), Some(RUNC_V2));
        assert_eq!(ctd["runtimes"]["runc"]["runtime_type"].as_str(), Some(RUNC_V2));
        // Idempotent.
        let before = disk.clone();
        let again = run_conf(&mut disk, Some(&entry), &drop_in(true)).unwrap();
        assert_eq!(again, entry);
        assert_eq!(disk.files, before.files);
        assert_eq!(
            entry.drop_in_dirs_created.as_deref(),
            Some(Path::new("/etc/containerd/conf.d")),
            "conf.d was made for the drop-in"
        );
        let ch = run_unconf(&mut disk, Some(&entry)).unwrap();
        assert_eq!(ch.len(), 3);
        assert_eq!(ch[0].path, Path::new(P), "the import goes before the file");
        assert_eq!(ch[1].path, Path::new(D));
        assert_eq!(
            ch[2],
            Change::remove_empty_dir("/etc/containerd/conf.d".into()),
            "then the folder made for it"
        );
        assert_eq!(disk.get(P), Some(main.as_str()));
        assert_eq!(disk.get(D), None);
    }
}

/// Regression: `--drop-in` into a folder that did not exist left the folder behind after unconfigure.
/// The folders configure made (nested ones too) go, deepest first; one that was there stays.
#[test]
fn folders_made_for_a_drop_in_go_with_it_and_others_stay() {
    let nested = Path::new("/etc/containerd/vgpu.d/rt/99-vgpu.toml");
    let st = Settings {
        drop_in: Some(nested),
        ..drop_in(false)
    };
    let mut disk = MemFiles::with(&[(P, V2)]);
    let entry = run_conf(&mut disk, None, &st).unwrap();
    assert_eq!(
        entry.drop_in_dirs_created.as_deref(),
        Some(Path::new("/etc/containerd/vgpu.d"))
    );
    let ch = run_unconf(&mut disk, Some(&entry)).unwrap();
    let dirs: Vec<&Path> = ch
        .iter()
        .filter(|c| c.dir)
        .map(|c| c.path.as_path())
        .collect();
    assert_eq!(
        dirs,
        [
            Path::new("/etc/containerd/vgpu.d/rt"),
            Path::new("/etc/containerd/vgpu.d")
        ]
    );
    // conf.d held another file before: nothing to remove but the drop-in.
    let mut disk = MemFiles::with(&[
        (P, V2),
        ("/etc/containerd/conf.d/10-x.toml", "version = 2\n"),
    ]);
    let entry = run_conf(&mut disk, None, &drop_in(false)).unwrap();
    assert_eq!(entry.drop_in_dirs_created, None);
    let ch = run_unconf(&mut disk, Some(&entry)).unwrap();
    assert!(ch.iter().all(|c| !c.dir), "{ch:?}");
}

/// Without vgpuctl's record, unconfigure still finds its drop-in among the files containerd reads
/// (by its header), and leaves the import entry it cannot tell was vgpuctl's.
#[test]
fn unconfigure_finds_the_drop_in_without_the_record() {
    let main = "version = 3\nimports = [\"conf.d/*.toml\"]\n";
    let mut disk = MemFiles::with(&[(P, main)]);
    run_conf(&mut disk, None, &drop_in(false)).unwrap();
    assert!(disk.get(D).is_some());
    run_unconf(&mut disk, None).unwrap();
    assert_eq!(disk.get(D), None);
    assert_eq!(disk.get(P), Some(main));
}

#[test]
fn drop_in_on_a_missing_main_file_creates_and_removes_it() {
    let mut disk = MemFiles::default();
    let entry = run_conf(&mut disk, None, &drop_in(false)).unwrap();
    let main = disk.get(P).unwrap();
    assert!(main.starts_with(CREATED) && main.contains(D), "{main}");
    assert!(entry.import_added.as_ref().unwrap().created_key);
    run_unconf(&mut disk, Some(&entry)).unwrap();
    assert!(disk.files.is_empty(), "{:?}", disk.files);
}

/// Version 3: the drop-in holds only what vgpu adds (containerd 2.x merges); the default and options
/// copied come from every file read before it.
#[test]
fn v3_drop_in_holds_only_the_handler() {
    let mut disk = MemFiles::with(&[
        (P, V3_MAIN),
        ("/etc/containerd/conf.d/50-nvidia.toml", V3_NVIDIA),
    ]);
    let entry = run_conf(&mut disk, None, &drop_in(true)).unwrap();
    assert_eq!(disk.get(P), Some(V3_MAIN), "covered by conf.d/*.toml");
    let text = disk.get(D).unwrap();
    let d: DocumentMut = text.parse().unwrap();
    assert_eq!(d["version"].as_integer(), Some(3));
    let ctd = d["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]
        .as_table()
        .unwrap();
    assert_eq!(ctd["default_runtime_name"].as_str(), Some("vgpu"));
    let keys: Vec<&str> = ctd["runtimes"]
        .as_table()
        .unwrap()
        .iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(keys, ["vgpu"], "only the handler: {text}");
    assert_eq!(
        ctd["runtimes"]["vgpu"]["options"]["SystemdCgroup"].as_bool(),
        Some(true)
    );
    run_unconf(&mut disk, Some(&entry)).unwrap();
    assert_eq!(disk.get(D), None);
}

/// Files read after the drop-in that would undo it are refused, whatever --force says.
#[test]
fn files_read_after_the_drop_in_that_would_override_it_are_refused() {
    let main = "version = 3\nimports = [\"conf.d/*.toml\"]\n";
    let late_default = "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd]\n  default_runtime_name = 'crun'\n";
    let disk = MemFiles::with(&[
        (P, main),
        ("/etc/containerd/conf.d/999-late.toml", late_default),
    ]);
    let e = configure(Path::new(P), disk.get(P), &disk, None, &drop_in(true)).unwrap_err();
    assert!(
        matches!(&e, EngineError::DefaultOverridden { src, drop_in: true, .. }
            if src.ends_with("999-late.toml")),
        "{e}"
    );
    assert!(configure(Path::new(P), disk.get(P), &disk, None, &drop_in(false)).is_ok());
    let v2main = "version = 2\nimports = [\"conf.d/*.toml\"]\n";
    let v2late = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"x\"\n";
    let disk = MemFiles::with(&[
        (P, v2main),
        ("/etc/containerd/conf.d/999-late.toml", v2late),
    ]);
    let e = configure(Path::new(P), disk.get(P), &disk, None, &drop_in(false)).unwrap_err();
    assert!(matches!(e, EngineError::RestatesAfterDropIn { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("choose a --drop-in path read after it"),
        "{e}"
    );
    let kata = "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.vgpu]\n  runtime_type = 'io.containerd.kata.v2'\n";
    let disk = MemFiles::with(&[(P, main), ("/etc/containerd/conf.d/999-kata.toml", kata)]);
    let forced = Settings {
        force: true,
        ..drop_in(false)
    };
    let e = configure(Path::new(P), disk.get(P), &disk, None, &forced).unwrap_err();
    assert!(
        matches!(&e, EngineError::ImportedForeign { src, .. } if src.ends_with("999-kata.toml")),
        "{e}"
    );
}

/// A foreign handler read before the drop-in: refused without --force; with it the drop-in's wins.
#[test]
fn a_foreign_handler_before_the_drop_in_yields_to_force() {
    let mut disk = MemFiles::with(&[(P, KATA)]);
    let e = configure(Path::new(P), disk.get(P), &disk, None, &drop_in(false)).unwrap_err();
    assert!(matches!(e, EngineError::Foreign { .. }), "{e}");
    assert!(e.to_string().contains("--force"), "{e}");
    let forced = Settings {
        force: true,
        ..drop_in(false)
    };
    let entry = run_conf(&mut disk, None, &forced).unwrap();
    let d: DocumentMut = disk.get(D).unwrap().parse().unwrap();
    let vgpu = &d["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["vgpu"];
    assert_eq!(
        vgpu["runtime_type"].as_str(),
        Some(RUNC_V2),
        "replaced whole"
    );
    // Unconfigure removes vgpuctl's drop-in and the import, and leaves kata's handler.
    run_unconf(&mut disk, Some(&entry)).unwrap();
    assert_eq!(disk.get(P), Some(KATA));
    assert_eq!(disk.get(D), None);
}

/// A file at the drop-in's path that vgpuctl did not write: refused, --force replaces it; unconfigure
/// leaves it. Switching between the main file and a drop-in goes through unconfigure.
#[test]
fn the_drop_in_path_and_the_modes() {
    let theirs = "version = 2\n# someone's\n";
    let mut disk = MemFiles::with(&[(P, V2), (D, theirs)]);
    let e = configure(Path::new(P), disk.get(P), &disk, None, &drop_in(false)).unwrap_err();
    assert_eq!(
        format!("{e:#}"),
        format!("{D}: the file exists and is not vgpu's (no vgpuctl header); left untouched (configure --force replaces it)")
    );
    let e = unconfigure(Path::new(P), disk.get(P), &disk, None, Some(Path::new(D))).unwrap_err();
    assert!(
        matches!(&e, EngineError::Foreign { why, .. } if why == "no vgpuctl header"),
        "{e}"
    );
    let forced = Settings {
        force: true,
        ..drop_in(false)
    };
    let entry = run_conf(&mut disk, None, &forced).unwrap();
    assert!(is_our_drop_in(disk.get(D).unwrap()));
    let e = configure(Path::new(P), disk.get(P), &disk, Some(&entry), &s(false)).unwrap_err();
    assert!(
        matches!(&e, EngineError::ConfiguredThroughDropIn { drop_in, .. } if drop_in == Path::new(D)),
        "{e}"
    );
    run_unconf(&mut disk, Some(&entry)).unwrap();
    assert_eq!(disk.get(P), Some(V2));
    run_conf(&mut disk, None, &s(false)).unwrap();
    let e = configure(Path::new(P), disk.get(P), &disk, None, &drop_in(false)).unwrap_err();
    assert!(matches!(e, EngineError::HandlerInMainFile { .. }), "{e}");
}
