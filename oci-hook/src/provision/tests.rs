//! Unit tests of `provision`: the state made, marked, refused over an existing or foreign folder,
//! owned, removed.

use super::*;
use vgpu_host::removal::{remove, RemoveError};
use vgpu_host::request::GpuRequest;
use vgpu_ledger::envcompute::Policy;
use vgpu_ledger::GpuSettings;

/// The entries of `<root>/containers/` but its marker.
fn entries(root: &StateRoot) -> usize {
    fs::read_dir(root.containers_dir())
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name() != vgpu_host::state_root::MARKER_FILE_NAME)
        .count()
}

fn plan(limit: u64) -> Plan {
    Plan {
        kubernetes: None,
        gpus: vec![GpuRequest {
            index: 0,
            uuid: "GPU-fa4ec0de-0000-4000-8000-000000000000".into(),
            settings: GpuSettings {
                memory_limit: Some(limit),
                ..Default::default()
            },
        }],
    }
}

// A compute share without a memory quota: the GPU is listed for its share alone and gets its ledger
// (the share's bucket lives there), with no memory limit (the plan gives it a plain mode:
// `GpuSettings::tied`).
#[test]
fn a_compute_share_alone_gets_its_ledger_and_no_memory_limit() {
    let d = tempfile::tempdir().unwrap();
    let root = StateRoot::new(d.path().join("state"));
    let mut p = plan(1 << 30);
    p.gpus[0].settings = GpuSettings {
        compute_limit: Some(30),
        compute_policy: Policy::Force,
        ..Default::default()
    };
    let dir = provision(&root, "c1", &p, Owner::default(), None)
        .unwrap()
        .dir;
    let limits = Limits::load(&dir.join("limits.json")).unwrap();
    let dev = &limits.devices[0];
    assert_eq!(dev.settings, p.gpus[0].settings);
    assert_eq!(dev.settings.compute_share(), Some(30));
    let ledger = dir.join("ledgers/GPU-fa4ec0de-0000-4000-8000-000000000000.ledger");
    let snap = vgpu_host::hostfile::read_ledger(&ledger).unwrap();
    assert_eq!((snap.used, snap.compute.launches), (0, 0));
}

// Each GPU's settings are written as the plan gives them (the window beside its share; the plan gives
// none to a GPU with a memory quota alone: `GpuSettings::tied`), and a window not asked is no field at
// all (as before the window existed).
#[test]
fn the_compute_window_is_written_beside_each_share_and_absent_otherwise() {
    let d = tempfile::tempdir().unwrap();
    let root = StateRoot::new(d.path().join("state"));
    let mut p = plan(1 << 30);
    p.gpus[0].settings.compute_limit = Some(30);
    p.gpus[0].settings.compute_window_ms = Some(250);
    p.gpus.push(GpuRequest {
        index: 1,
        uuid: "GPU-fa4ec0de-0000-4000-8000-000000000001".into(),
        settings: GpuSettings {
            memory_limit: Some(1 << 30),
            ..Default::default()
        },
    });
    let dir = provision(&root, "c1", &p, Owner::default(), None)
        .unwrap()
        .dir;
    // The file is pretty-printed: compared without its whitespace.
    let compact = |dir: &Path| -> String {
        fs::read_to_string(dir.join("limits.json"))
            .unwrap()
            .split_whitespace()
            .collect()
    };
    let text = compact(&dir);
    assert!(
        text.contains(r#""compute_limit":30,"compute_window_ms":250"#),
        "{text}"
    );
    assert_eq!(text.matches("compute_window_ms").count(), 1, "{text}");
    let limits = Limits::load(&dir.join("limits.json")).unwrap();
    assert_eq!(
        (
            limits.devices[0].settings.compute_window_ms,
            limits.devices[1].settings.compute_window_ms
        ),
        (Some(250), None)
    );
    // Not asked: no field, on a GPU with a share too.
    p.gpus[0].settings.compute_window_ms = None;
    let dir = provision(&root, "c2", &p, Owner::default(), None)
        .unwrap()
        .dir;
    let text = compact(&dir);
    assert!(text.contains(r#""compute_limit":30"#), "{text}");
    assert!(!text.contains("compute_window"), "{text}");
}

#[test]
fn preload_keeps_image_entries_after_the_library() {
    assert_eq!(preload_contents(None), "/usr/local/vgpu/libvgpu.so\n");
    assert_eq!(
        preload_contents(Some(
            "/lib/a.so:/lib/b.so\n /usr/local/vgpu/libvgpu.so\t/lib/a.so\n"
        )),
        "/usr/local/vgpu/libvgpu.so\n/lib/a.so\n/lib/b.so\n"
    );
}

#[test]
fn provision_is_complete_idempotent_and_removable() {
    let d = tempfile::tempdir().unwrap();
    let root = StateRoot::new(d.path().join("state"));
    let dir = provision(
        &root,
        "c1",
        &plan(1 << 30),
        Owner::default(),
        Some("/x.so\n"),
    )
    .unwrap()
    .dir;
    let limits = Limits::load(&dir.join("limits.json")).unwrap();
    assert_eq!(limits.devices[0].settings.memory_limit, Some(1 << 30));
    assert_eq!(limits.init_pid, None);
    assert!(dir
        .join("ledgers/GPU-fa4ec0de-0000-4000-8000-000000000000.ledger")
        .is_file());
    assert_eq!(
        fs::read_to_string(dir.join("ld.so.preload")).unwrap(),
        "/usr/local/vgpu/libvgpu.so\n/x.so\n"
    );
    let ino = |p: &Path| std::os::unix::fs::MetadataExt::ino(&fs::metadata(p).unwrap());
    // The owner is recorded in a new file (the container's mount keeps the old one, see record_owner).
    let me = Owner::of_pid(std::process::id()).unwrap();
    let before = ino(&dir.join("limits.json"));
    record_owner(&root, "c1", me.clone()).unwrap();
    let l = Limits::load(&dir.join("limits.json")).unwrap();
    assert_eq!((l.init_pid, l.pid_ns), (Some(me.init_pid), Some(me.pid_ns)));
    assert_eq!(l.init_start_time, Some(me.start_time));
    assert_ne!(ino(&dir.join("limits.json")), before);
    // ... and the inode as provisioned, the one the container's mount holds, keeps its second name for
    // `vgpuctl update` (before: nothing named it once the owner was recorded).
    assert_eq!(ino(&dir.join("limits.mounted.json")), before);
    assert!(owned_by(&root, "c1", &me));
    let reused = Owner {
        start_time: me.start_time + 1,
        ..me.clone()
    };
    assert!(
        !owned_by(&root, "c1", &reused),
        "another process with the PID"
    );
    assert!(remove(&root, "c1").unwrap());
    assert!(!remove(&root, "c1").unwrap());
    assert_eq!(entries(&root), 0, "nothing left behind");
}

#[test]
fn a_second_create_of_one_id_changes_nothing_and_cleans_up_only_its_own() {
    let d = tempfile::tempdir().unwrap();
    let root = StateRoot::new(d.path().join("state"));
    let first = provision(&root, "c1", &plan(1 << 30), Owner::default(), None).unwrap();
    let limits = fs::read(first.dir.join("limits.json")).unwrap();
    // Same id again (the container lives, or its create is in progress), with the same or another quota.
    for limit in [1 << 30, 2 << 30] {
        let e = provision(&root, "c1", &plan(limit), Owner::default(), None).unwrap_err();
        assert!(
            matches!(&e, ProvisionError::AlreadyExists(AlreadyExists { id, .. }) if id == "c1"),
            "{e}"
        );
        assert_eq!(fs::read(first.dir.join("limits.json")).unwrap(), limits);
    }
    assert_eq!(entries(&root), 1, "the losers left no temporary folder");
    // The first container went (poststop) and another took the id: the first create's clean-up
    // must not remove the newcomer's state.
    assert!(remove(&root, "c1").unwrap());
    let second = provision(&root, "c1", &plan(2 << 30), Owner::default(), None).unwrap();
    assert_ne!(first.token(), second.token());
    assert!(!first.remove().unwrap());
    assert!(second.dir.join("limits.json").is_file());
    assert!(second.remove().unwrap());
    assert!(!second.dir.exists());
    assert_eq!(entries(&root), 0);
}

#[test]
fn bad_ids_provision_nothing() {
    let d = tempfile::tempdir().unwrap();
    let root = StateRoot::new(d.path().join("state"));
    for id in ["../x", "a/b", ".hidden", ""] {
        assert!(provision(&root, id, &plan(1 << 30), Owner::default(), None).is_err());
    }
    assert!(
        !d.path().join("state").exists()
            || fs::read_dir(root.containers_dir()).unwrap().count() == 0
    );
}

#[test]
fn folders_are_marked_and_one_vgpu_did_not_make_is_never_replaced_or_removed() {
    let d = tempfile::tempdir().unwrap();
    let root = StateRoot::new(d.path().join("state"));
    let dir = provision(&root, "c1", &plan(1 << 30), Owner::default(), None)
        .unwrap()
        .dir;
    assert!(walk::is_marked(&root.containers_dir()) && walk::is_marked(&dir));
    // Someone else's folder under a container's name: refused, kept byte for byte.
    let theirs = root.container_dir("c2").unwrap();
    fs::create_dir_all(theirs.join("keep")).unwrap();
    fs::write(theirs.join("limits.json"), "theirs").unwrap();
    let e = provision(&root, "c2", &plan(1 << 30), Owner::default(), None).unwrap_err();
    assert!(
        matches!(&e, ProvisionError::NotOurs { dir } if *dir == theirs),
        "{e}"
    );
    // The line is the contract: it names the folder, the marker and what to do.
    let e = e.to_string();
    assert!(
        e.contains("c2 exists and was not made by vgpu (no .vgpu-state marker"),
        "{e}"
    );
    assert!(!e.contains('\n'));
    let e = remove(&root, "c2").unwrap_err();
    assert!(matches!(e, RemoveError::Unmarked { .. }), "{e}");
    let me = Owner::of_pid(std::process::id()).unwrap();
    assert!(matches!(
        record_owner(&root, "c2", me),
        Err(ProvisionError::Unmarked { .. })
    ));
    assert_eq!(
        fs::read_to_string(theirs.join("limits.json")).unwrap(),
        "theirs"
    );
    assert!(theirs.join("keep").is_dir());
}

#[test]
fn a_containers_folder_of_someone_else_is_refused_and_an_empty_one_adopted() {
    let d = tempfile::tempdir().unwrap();
    let root = StateRoot::new(d.path().join("varlib"));
    fs::create_dir_all(root.containers_dir().join("storage")).unwrap();
    let e = provision(&root, "c1", &plan(1 << 30), Owner::default(), None).unwrap_err();
    assert!(
        matches!(&e, ProvisionError::ForeignRoot { dir } if *dir == root.containers_dir()),
        "{e}"
    );
    let names: Vec<_> = fs::read_dir(root.containers_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["storage"], "nothing written there");
    // An empty one (made by an operator, say) is adopted.
    fs::remove_dir(root.containers_dir().join("storage")).unwrap();
    provision(&root, "c1", &plan(1 << 30), Owner::default(), None).unwrap();
    assert!(walk::is_marked(&root.containers_dir()));
}

#[test]
fn the_longest_id_provisions_and_a_longer_one_is_refused_in_one_clear_line() {
    let d = tempfile::tempdir().unwrap();
    let root = StateRoot::new(d.path().join("state"));
    let longest = "x".repeat(layout::MAX_NAME_LEN);
    provision(&root, &longest, &plan(1 << 30), Owner::default(), None).unwrap();
    assert!(remove(&root, &longest).unwrap());
    let e = provision(
        &root,
        &"x".repeat(256),
        &plan(1 << 30),
        Owner::default(),
        None,
    )
    .unwrap_err();
    assert!(matches!(e, ProvisionError::Name(_)), "{e}");
    let e = e.to_string();
    assert!(
        e.starts_with("invalid container id \"xxx") && e.contains("longer than 200 bytes"),
        "{e}"
    );
}

// Issue 25: record_owner rewrote limits.json in place (write over, then truncate) while admission, gc and
// the monitor read it: a reader that had read part of the file read the rest from the new text (torn JSON,
// or the new text with the old one's tail). Now the file is replaced whole (a new file renamed over it): a
// reader reads the old file or the new one to its end, and the container's bind mount keeps the old inode,
// all the container reads of it (`devices`) unchanged.
#[test]
fn recording_the_owner_never_shows_a_reader_half_a_file() {
    use std::io::Read;
    let d = tempfile::tempdir().unwrap();
    let root = StateRoot::new(d.path().join("state"));
    let dir = provision(&root, "c1", &plan(1 << 30), Owner::default(), None)
        .unwrap()
        .dir;
    let path = dir.join("limits.json");
    let me = Owner::of_pid(std::process::id()).unwrap();
    let mut owner = me.clone();
    for pid in [1_000_000_000, 1, 4_000_000] {
        // A reader (admission, gc, the monitor; or the container through its mount) is half-way through.
        let mut reader = fs::File::open(&path).unwrap();
        let mut text = vec![0u8; 40];
        reader.read_exact(&mut text).unwrap();
        let before = Limits::load(&path).unwrap();
        owner.init_pid = pid;
        record_owner(&root, "c1", owner.clone()).unwrap();
        reader.read_to_end(&mut text).unwrap();
        let read = Limits::from_slice(&text).expect("the reader read one whole file");
        assert_eq!(read, before, "the file as it was when the reader opened it");
        assert_eq!(Limits::load(&path).unwrap().init_pid, Some(pid));
    }
}
