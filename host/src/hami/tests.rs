//! Unit tests of `hami`: the names HAMi gives its folders and the library its ledgers, a kubelet's pod
//! cgroup, and a folder read with the tenant's hostile files beside its ledger, each skipped with one line.
use super::*;
use std::os::unix::fs::symlink;
use vgpu_ledger::{Kind, Ledger as Region};

const GPU0: &str = "GPU-fa4ec0de-0000-4000-8000-000000000000";
const GPU1: &str = "GPU-fa4ec0de-0000-4000-8000-000000000001";
const POD: &str = "7c0e3d1a-0000-4000-8000-000000000002";

/// A ledger as vgpu's library makes it under HAMi (`<prefix>.<uuid>`, 0600), `bytes` charged by a live slot
/// (kept in the returned pair while the test runs).
fn ledger(dir: &Path, prefix: &str, uuid: &str, bytes: u64) -> (Region, vgpu_ledger::Slot) {
    let l = Region::open_or_create_with_mode(
        &dir.join(format!("{prefix}.{uuid}")),
        uuid,
        1 << 30,
        0o600,
    )
    .unwrap();
    let s = l.attach().unwrap();
    l.charge(&s, Kind::Data, bytes, 1 << 30).unwrap();
    (l, s)
}

#[test]
fn names_as_hami_makes_them() {
    assert_eq!(split_name(&format!("{POD}_main")), Some((POD, "main")));
    // A static pod's UID is a hash without dashes.
    assert_eq!(
        split_name("0123456789abcdef0123456789abcdef_c-1"),
        Some(("0123456789abcdef0123456789abcdef", "c-1"))
    );
    for bad in [
        "main",
        "_main",
        "pod_",
        "xyz_main",
        &format!("{POD}_Main"),
        &format!("{POD}_-a"),
        &format!("{POD}_a_b"),
    ] {
        assert_eq!(split_name(bad), None, "{bad}");
    }
    assert_eq!(ledger_uuid(&format!("{POD}.cache.{GPU0}")), Some(GPU0));
    assert_eq!(ledger_uuid("x.cache.MIG-1234abcd"), Some("MIG-1234abcd"));
    for not in [
        "libvgpu.so",
        GPU0,
        &format!(".{POD}.cache.{GPU0}.Ab12.tmp"),
        "x.GPU-",
        "x.GPU-a/b",
    ] {
        assert_eq!(ledger_uuid(not), None, "{not}");
    }
}

#[test]
fn the_pod_a_kubelet_cgroup_names() {
    let uid = "7c0e3d1a-0000-4000-8000-000000000002";
    assert_eq!(
        kubelet_pod_uid(&format!("/kubepods/besteffort/pod{uid}/0123abcd")).as_deref(),
        Some(uid)
    );
    assert_eq!(
        kubelet_pod_uid(&format!("/kubepods/pod{uid}/0123abcd")).as_deref(),
        Some(uid)
    );
    assert_eq!(
        kubelet_pod_uid(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod7c0e3d1a_0000_4000_8000_000000000002.slice/cri-containerd-0123.scope"
        )
        .as_deref(),
        Some(uid)
    );
    for none in [
        "/",
        "/system.slice/docker-0123.scope",
        "/podman/pod",
        "/user.slice/user-0.slice",
    ] {
        assert_eq!(kubelet_pod_uid(none), None, "{none}");
    }
}

/// A folder as the suite leaves it after a container ran under HAMi, and the tenant's hostile files beside
/// its ledger: each is skipped with one line, the ledger is still read.
#[test]
fn reads_each_folders_ledgers_and_skips_hostile_files_with_one_line() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("containers");
    let ctr = root.join(format!("{POD}_main"));
    fs::create_dir_all(&ctr).unwrap();
    let prefix = format!("{POD}.cache");
    let (_l, _s) = ledger(&ctr, &prefix, GPU0, 300 << 20);
    // What runc leaves in the host folder: the mount point of the library; and a ledger being made.
    fs::write(ctr.join("libvgpu.so"), b"").unwrap();
    fs::write(ctr.join(format!(".{prefix}.{GPU1}.x1.tmp")), b"").unwrap();
    // The tenant's: a link to a host file, an oversized file, a FIFO, a folder, the GPU0 ledger's bytes
    // under GPU1's name, and garbage of a ledger's size.
    symlink("/etc/shadow", ctr.join(format!("evil.cache.{GPU0}"))).unwrap();
    let big = fs::File::create(ctr.join(format!("big.cache.{GPU0}"))).unwrap();
    big.set_len(64 << 20).unwrap();
    nix::unistd::mkfifo(
        &ctr.join(format!("fifo.cache.{GPU0}")),
        nix::sys::stat::Mode::from_bits_truncate(0o666),
    )
    .unwrap();
    fs::create_dir(ctr.join(format!("dir.cache.{GPU0}"))).unwrap();
    fs::copy(
        ctr.join(format!("{prefix}.{GPU0}")),
        ctr.join(format!("other.cache.{GPU1}")),
    )
    .unwrap();
    fs::write(ctr.join(format!("junk.cache.{GPU1}")), vec![7u8; FILE_SIZE]).unwrap();
    // A folder without ledgers (a container that never used CUDA), a name HAMi never makes, a file.
    fs::create_dir(root.join(format!("{POD}_idle"))).unwrap();
    fs::create_dir(root.join("lost+found")).unwrap();
    fs::write(root.join("stray"), b"x").unwrap();

    let s = scan(&root).unwrap();
    assert_eq!(s.folders.len(), 1, "{s:?}");
    let f = &s.folders[0];
    assert_eq!((f.pod_uid.as_str(), f.container.as_str()), (POD, "main"));
    assert_eq!(f.name, format!("{POD}_main"));
    assert_eq!(f.ledgers.len(), 1);
    let l = &f.ledgers[0];
    assert_eq!(l.uuid, GPU0);
    assert_eq!(
        (l.snapshot.used, l.snapshot.limit),
        (300 << 20, 1 << 30),
        "the usage and the quota the library recorded"
    );
    assert!(l.snapshot.slots.iter().any(|s| s.alive));
    let why = |name: &str| -> String {
        let hits: Vec<&Skipped> = s
            .skipped
            .iter()
            .filter(|k| k.path.file_name().unwrap() == name)
            .collect();
        assert_eq!(hits.len(), 1, "{name}: {:?}", s.skipped);
        assert!(!hits[0].why.contains('\n'));
        hits[0].why.clone()
    };
    assert!(why(&format!("evil.cache.{GPU0}")).contains("symbolic link"));
    let big = why(&format!("big.cache.{GPU0}"));
    assert!(big.contains("67108864 bytes, more than"), "{big}");
    assert!(why(&format!("fifo.cache.{GPU0}")).contains("FIFO"));
    assert!(why(&format!("dir.cache.{GPU0}")).contains("directory"));
    let other = why(&format!("other.cache.{GPU1}"));
    assert!(
        other.contains(&format!("belongs to GPU {GPU0}, not {GPU1}")),
        "{other}"
    );
    assert!(why(&format!("junk.cache.{GPU1}")).contains("not a vgpu ledger"));
    assert!(why("stray").contains("not a folder"));
    assert!(why("lost+found").contains("not named <pod UID>_<container>"));
    assert_eq!(s.skipped.len(), 8, "{:?}", s.skipped);
    // Every line names the file it is about.
    for k in &s.skipped {
        assert!(k.why.contains(&k.path.display().to_string()), "{k:?}");
    }
}

#[test]
fn a_folder_of_two_gpus_and_a_tenants_second_ledger_for_one() {
    let d = tempfile::tempdir().unwrap();
    let ctr = d.path().join(format!("{POD}_main"));
    fs::create_dir_all(&ctr).unwrap();
    let _a = ledger(&ctr, "a.cache", GPU1, 1 << 20);
    let _b = ledger(&ctr, "a.cache", GPU0, 2 << 20);
    // A copy under another prefix: its slots are not live (no one holds their locks), so the live one wins.
    fs::copy(
        ctr.join(format!("a.cache.{GPU0}")),
        ctr.join(format!("z.cache.{GPU0}")),
    )
    .unwrap();
    let s = scan(d.path()).unwrap();
    let uuids: Vec<&str> = s.folders[0]
        .ledgers
        .iter()
        .map(|l| l.uuid.as_str())
        .collect();
    assert_eq!(uuids, [GPU0, GPU1]);
    assert_eq!(
        s.folders[0].ledgers[0].path,
        ctr.join(format!("a.cache.{GPU0}"))
    );
    assert_eq!(s.skipped.len(), 1);
    assert!(
        s.skipped[0].why.contains("another ledger of GPU"),
        "{:?}",
        s.skipped
    );
}

#[test]
fn a_folder_full_of_entries_is_looked_at_only_so_far() {
    let d = tempfile::tempdir().unwrap();
    let ctr = d.path().join(format!("{POD}_main"));
    fs::create_dir_all(&ctr).unwrap();
    for i in 0..MAX_ENTRIES + 10 {
        fs::write(ctr.join(format!("f{i}")), b"").unwrap();
    }
    let s = scan(d.path()).unwrap();
    assert!(s.folders.is_empty());
    assert_eq!(s.skipped.len(), 1);
    assert!(s.skipped[0].why.contains("more than 256 entries"));
}

#[test]
fn the_containers_folder_must_be_one() {
    let d = tempfile::tempdir().unwrap();
    assert_eq!(
        scan(&d.path().join("none")).unwrap_err().kind(),
        io::ErrorKind::NotFound
    );
    fs::create_dir(d.path().join("real")).unwrap();
    symlink(d.path().join("real"), d.path().join("link")).unwrap();
    let e = scan(&d.path().join("link")).unwrap_err().to_string();
    assert!(e.contains("not a folder"), "{e}");
    assert!(scan(&d.path().join("real")).unwrap().folders.is_empty());
}

/// Names from the tenant's folder (and a stray folder name) carrying ESC and a newline: every skip line is
/// one line with them escaped (Debug form), so the tenant cannot forge log lines or drive a terminal.
#[test]
fn control_characters_in_names_are_escaped_in_skip_lines() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("containers");
    let ctr = root.join(format!("{POD}_main"));
    fs::create_dir_all(&ctr).unwrap();
    let _l = ledger(&ctr, "a.cache", GPU0, 1 << 20);
    // A second ledger of GPU0 (a copy: no live slot), a link and a non-ledger under names the tenant chose.
    fs::copy(
        ctr.join(format!("a.cache.{GPU0}")),
        ctr.join(format!("z\u{1b}[2J.cache.{GPU0}")),
    )
    .unwrap();
    symlink("/etc/shadow", ctr.join(format!("x\nforged.cache.{GPU1}"))).unwrap();
    fs::create_dir(root.join("bad\u{1b}]0;title\u{7}\nname")).unwrap();
    let s = scan(&root).unwrap();
    assert_eq!(s.folders.len(), 1, "{s:?}");
    assert_eq!(s.skipped.len(), 3, "{:?}", s.skipped);
    for k in &s.skipped {
        assert!(
            !k.why.chars().any(|c| c.is_control()),
            "a control character in {:?}",
            k.why
        );
    }
    let line = |part: &str| -> &str {
        let hits: Vec<&Skipped> = s.skipped.iter().filter(|k| k.why.contains(part)).collect();
        assert_eq!(hits.len(), 1, "{part}: {:?}", s.skipped);
        &hits[0].why
    };
    let dup = line("another ledger of GPU");
    assert!(dup.contains(r"z\u{1b}[2J.cache."), "{dup}");
    let link = line("symbolic link");
    assert!(link.contains(r"x\nforged.cache."), "{link}");
    let folder = line("not named <pod UID>_<container>");
    assert!(folder.contains(r"bad\u{1b}]0;title\u{7}\nname"), "{folder}");
}
