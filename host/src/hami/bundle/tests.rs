//! Unit tests of `hami::bundle`: the bundles of a task folder as containerd's runc shim leaves them, HAMi's
//! found by the folder their spec mounts, the others passed over, the unusable ones one line each.
use super::*;
use std::os::unix::fs::symlink;

const GPU0: &str = "GPU-fa4ec0de-0000-4000-8000-000000000000";
const GPU1: &str = "GPU-fa4ec0de-0000-4000-8000-000000000001";
const POD: &str = "7c0e3d1a-0000-4000-8000-000000000002";

/// A bundle `<tasks>/k8s.io/<id>` whose spec has `env` and mounts `folder` (a host path) at
/// `/usr/local/vgpu`, with `init.pid` when `pid` is given.
fn bundle(tasks: &Path, id: &str, folder: &Path, env: &[&str], pid: Option<u32>) -> PathBuf {
    let b = tasks.join("k8s.io").join(id);
    fs::create_dir_all(&b).unwrap();
    let spec = serde_json::json!({
        "ociVersion": "1.2.0",
        "process": {"env": env, "args": ["sh"]},
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/usr/local/vgpu", "type": "bind", "source": folder, "options": ["rbind", "rw"]},
            {"destination": "/usr/local/vgpu/libvgpu.so", "type": "bind", "source": "/usr/local/vgpu/libvgpu.so"},
        ],
    });
    fs::write(b.join("config.json"), spec.to_string()).unwrap();
    if let Some(pid) = pid {
        fs::write(b.join("init.pid"), pid.to_string()).unwrap();
    }
    b
}

#[test]
fn hamis_bundles_are_found_by_the_folder_they_mount_the_others_passed_over() {
    let d = tempfile::tempdir().unwrap();
    let (tasks, ctrs) = (d.path().join("tasks"), d.path().join("containers"));
    let me = std::process::id();
    let hami = &[
        "PATH=/bin",
        "CUDA_DEVICE_MEMORY_LIMIT_0=1024m",
        "CUDA_DEVICE_MEMORY_LIMIT_1=2048m",
        "CUDA_DEVICE_SM_LIMIT=30",
        "NVIDIA_VISIBLE_DEVICES=GPU-fa4ec0de-0000-4000-8000-000000000001,GPU-fa4ec0de-0000-4000-8000-000000000000",
    ];
    let b = bundle(
        &tasks,
        "c1",
        &ctrs.join(format!("{POD}_main")),
        hami,
        Some(me),
    );
    // Another container's; one mounting a folder elsewhere; one being made (no init.pid yet).
    bundle(&tasks, "c2", Path::new("/srv/data"), hami, Some(me));
    bundle(
        &tasks,
        "c3",
        &d.path().join("elsewhere").join(format!("{POD}_main")),
        hami,
        Some(me),
    );
    bundle(&tasks, "c4", &ctrs.join(format!("{POD}_side")), hami, None);
    fs::write(tasks.join("stray"), b"").unwrap();
    let f = read_host(&tasks, &ctrs).unwrap();
    assert!(f.problems.is_empty(), "{:?}", f.problems);
    assert_eq!(f.quotas.len(), 1, "{f:?}");
    let q = &f.quotas[0];
    assert_eq!(
        (q.bundle.as_path(), q.folder.as_str()),
        (b.as_path(), &*format!("{POD}_main"))
    );
    assert_eq!(q.uuids, [GPU1, GPU0]);
    assert_eq!(
        (q.limits.bytes_for(0), q.limits.bytes_for(1)),
        (1 << 30, 2 << 30)
    );
    assert_eq!(
        (q.compute.share_for(Some(0)), q.compute.share_for(Some(1))),
        (Some(30), Some(30))
    );
    assert_eq!(q.window_ms, None, "the library's default");
    assert_eq!(q.init.pid, me);
    assert_eq!(q.init.start_time, procs::start_time(me).unwrap());
    assert!(q.init.unified_cgroup().is_some());
    assert!(
        matches!(read_host(&d.path().join("none"), &ctrs), Err(e) if e.kind() == io::ErrorKind::NotFound)
    );
}

#[test]
fn a_hami_bundle_that_cannot_be_used_is_one_line_naming_it() {
    let d = tempfile::tempdir().unwrap();
    let (tasks, ctrs) = (d.path().join("tasks"), d.path().join("containers"));
    let me = std::process::id();
    let folder = |c: &str| ctrs.join(format!("{POD}_{c}"));
    let gpu = format!("NVIDIA_VISIBLE_DEVICES={GPU0}");
    bundle(
        &tasks,
        "index",
        &folder("a"),
        &["CUDA_DEVICE_MEMORY_LIMIT_0=1g", "NVIDIA_VISIBLE_DEVICES=0"],
        Some(me),
    );
    bundle(
        &tasks,
        "limit",
        &folder("b"),
        &["CUDA_DEVICE_MEMORY_LIMIT_0=lots\u{1b}[2J", &gpu],
        Some(me),
    );
    bundle(
        &tasks,
        "gone",
        &folder("c"),
        &["CUDA_DEVICE_MEMORY_LIMIT_0=1g", &gpu],
        Some(999_999_999),
    );
    // This process's PID in an init.pid written before it started: a PID reused since.
    let r = bundle(
        &tasks,
        "reused",
        &folder("e"),
        &["CUDA_DEVICE_MEMORY_LIMIT_0=1g", &gpu],
        Some(me),
    );
    let long_ago =
        std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
    fs::File::options()
        .write(true)
        .open(r.join("init.pid"))
        .unwrap()
        .set_modified(long_ago)
        .unwrap();
    bundle(
        &tasks,
        "share",
        &folder("f"),
        &["CUDA_DEVICE_SM_LIMIT_0=half", &gpu],
        Some(me),
    );
    bundle(
        &tasks,
        "window",
        &folder("g"),
        &["CUDA_DEVICE_SM_LIMIT=10", "VGPU_COMPUTE_WINDOW=1m", &gpu],
        Some(me),
    );
    let l = bundle(&tasks, "link", &folder("d"), &[&gpu], Some(me));
    fs::remove_file(l.join("config.json")).unwrap();
    symlink("/etc/passwd", l.join("config.json")).unwrap();
    let f = read_host(&tasks, &ctrs).unwrap();
    assert!(f.quotas.is_empty(), "{f:?}");
    let line = |id: &str| -> String {
        let hits: Vec<&String> = f
            .problems
            .iter()
            .filter(|p| p.contains(&format!("/{id}\"")))
            .collect();
        assert_eq!(hits.len(), 1, "{id}: {:?}", f.problems);
        assert!(!hits[0].chars().any(char::is_control), "{hits:?}");
        hits[0].clone()
    };
    assert!(line("index").contains("names no list of GPU UUIDs"));
    assert!(line("limit").contains("CUDA_DEVICE_MEMORY_LIMIT_0"));
    assert!(line("gone").contains("its init process 999999999 is gone"));
    assert!(line("link").contains("symbolic link"));
    assert!(line("reused").contains("started after init.pid was written"));
    assert!(line("share").contains("CUDA_DEVICE_SM_LIMIT_0"));
    assert!(line("window").contains("VGPU_COMPUTE_WINDOW"));
    assert_eq!(f.problems.len(), 7);
}

/// The share as the spec gives it: per GPU over the global one, the policy `disable` none, and the
/// library's pacing window (the wall's burst) as the spec sets it.
#[test]
fn the_specs_compute_share_policy_and_window_are_read() {
    let d = tempfile::tempdir().unwrap();
    let (tasks, ctrs) = (d.path().join("tasks"), d.path().join("containers"));
    let me = std::process::id();
    let gpus = format!("NVIDIA_VISIBLE_DEVICES={GPU0},{GPU1}");
    let folder = |c: &str| ctrs.join(format!("{POD}_{c}"));
    let env = [
        "CUDA_DEVICE_SM_LIMIT=20",
        "CUDA_DEVICE_SM_LIMIT_1=40",
        "VGPU_COMPUTE_WINDOW=250ms",
        &gpus,
    ];
    bundle(&tasks, "a", &folder("a"), &env, Some(me));
    let off = [
        "CUDA_DEVICE_SM_LIMIT=20",
        "GPU_CORE_UTILIZATION_POLICY=DISABLE",
        &gpus,
    ];
    bundle(&tasks, "b", &folder("b"), &off, Some(me));
    let f = read_host(&tasks, &ctrs).unwrap();
    assert!(f.problems.is_empty(), "{:?}", f.problems);
    let share = |q: &HostQuota| (q.compute.share_for(Some(0)), q.compute.share_for(Some(1)));
    assert_eq!(share(&f.quotas[0]), (Some(20), Some(40)));
    assert_eq!(f.quotas[0].window_ms, Some(250));
    assert_eq!(share(&f.quotas[1]), (None, None), "disable: no share");
}
