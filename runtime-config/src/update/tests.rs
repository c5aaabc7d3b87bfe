//! Unit tests of `vgpuctl update`: the options' grammar, the change applied, admission under the node
//! lock (the sum exact with updates racing), the host's and the container's files.
use super::change::UpdateError;
use super::*;
use vgpu_host::nvml::HostGpu;
use vgpu_ledger::GpuSettings;
use vgpu_oci::plan::{Plan, PlannedGpu};
use vgpu_oci::provision::{provision, record_owner, Owner};

const GIB: u64 = 1 << 30;
const UUID: &str = "GPU-fa4ec0de-0000-4000-8000-000000000000";
const STRICT: Policy = Policy {
    overcommit: false,
    reserve: 0,
};

fn gpus() -> Result<Vec<HostGpu>, vgpu_host::nvml::NvmlError> {
    Ok(vec![HostGpu {
        index: 0,
        uuid: UUID.into(),
        total_memory: 16 * GIB,
        minor: Some(0),
    }])
}

/// A running container `id` with `memory` (and a 30% share when `share`) on the one GPU.
fn running(root: &StateRoot, id: &str, memory: u64, share: bool) {
    let plan = Plan {
        gpus: vec![PlannedGpu {
            index: 0,
            uuid: UUID.into(),
            settings: GpuSettings {
                memory_limit: Some(memory),
                compute_limit: share.then_some(30),
                ..Default::default()
            },
        }],
        kubernetes: None,
    };
    provision(root, id, &plan, Default::default(), None).unwrap();
    record_owner(root, id, Owner::of_pid(std::process::id()).unwrap()).unwrap();
}

fn req(memory: Option<&str>, compute: Option<&str>, window: Option<&str>) -> Request {
    Request::parse(None, memory, compute, window).unwrap()
}

fn limits(root: &StateRoot, id: &str) -> Limits {
    Limits::load(&root.limits_path(id).unwrap()).unwrap()
}

fn mounted(root: &StateRoot, id: &str) -> Limits {
    Limits::load(&root.container_dir(id).unwrap().join("limits.mounted.json")).unwrap()
}

#[test]
fn options_take_the_annotations_grammar_and_errors() {
    assert_eq!(
        req(Some("2Gi"), None, None).settings.memory_limit,
        Some(2 * GIB)
    );
    assert_eq!(
        req(Some("4g"), None, None).settings.memory_limit,
        Some(4 * GIB)
    );
    assert_eq!(
        req(None, Some("60"), Some("250ms"))
            .settings
            .compute_window_ms,
        Some(250)
    );
    let e = |m, c, w| Request::parse(None, m, c, w).unwrap_err();
    assert!(matches!(e(None, None, None), UpdateError::NothingAsked));
    for bad in ["4GB", "1Mi", "0", "x"] {
        let err = e(Some(bad), None, None);
        assert!(matches!(err, UpdateError::Value(_)), "{bad}: {err}");
        assert!(err.to_string().contains("--memory-limit"), "{err}");
    }
    assert!(matches!(e(None, Some("0"), None), UpdateError::Value(_)));
    assert!(matches!(
        e(None, Some("100"), None),
        UpdateError::RemoveShare
    ));
    assert!(matches!(e(None, None, Some("5ms")), UpdateError::Value(_)));
}

#[test]
fn a_grow_is_admitted_and_reaches_the_containers_mounted_copy_and_its_ledgers() {
    let d = tempfile::tempdir().unwrap();
    let root = StateRoot::new(d.path().to_path_buf());
    running(&root, "c1", GIB, true);
    let o = update(
        &root,
        STRICT,
        "c1",
        &req(Some("2Gi"), Some("60"), None),
        gpus,
    )
    .unwrap();
    assert_eq!(o.updates, 1);
    assert_eq!(
        o.changes
            .iter()
            .map(|c| (c.setting, c.from, c.to))
            .collect::<Vec<_>>(),
        vec![
            ("memory_limit", Some(GIB), 2 * GIB),
            ("compute_limit", Some(30), 60)
        ]
    );
    let host = limits(&root, "c1");
    assert_eq!(
        (host.devices[0].settings.memory_limit, host.updates),
        (Some(2 * GIB), 1)
    );
    assert!(host.init_pid.is_some() && host.updated_at.is_some());
    let inside = mounted(&root, "c1");
    assert_eq!(inside.devices[0].settings.memory_limit, Some(2 * GIB));
    assert_eq!(inside.devices[0].settings.compute_limit, Some(60));
    assert_eq!(inside.init_pid, None, "host facts stay on the host");
    let ledger = vgpu_ledger::Ledger::open(&root.ledger_path("c1", UUID).unwrap()).unwrap();
    let g = ledger.limits_generation();
    assert!(g != 0 && g.is_multiple_of(2), "published whole: {g}");
    // the same again changes nothing and counts no update
    let o = update(&root, STRICT, "c1", &req(Some("2Gi"), None, None), gpus).unwrap();
    assert!(o.changes.is_empty());
    assert_eq!(limits(&root, "c1").updates, 1);
}

#[test]
fn a_grow_past_the_gpu_is_refused_as_at_creation_with_nothing_changed() {
    let d = tempfile::tempdir().unwrap();
    let root = StateRoot::new(d.path().to_path_buf());
    running(&root, "c1", 4 * GIB, false);
    running(&root, "c2", 12 * GIB, false);
    let file = || std::fs::read(root.limits_path("c1").unwrap()).unwrap();
    let (host, inside) = (file(), mounted(&root, "c1"));
    let e = update(&root, STRICT, "c1", &req(Some("8Gi"), None, None), gpus).unwrap_err();
    assert!(matches!(e, RunError::Admission(_)), "{e}");
    // The line is admission's own, as at creation.
    let e = e.to_string();
    assert!(
        e.contains("GPU 0")
            && e.contains("20.0 GiB")
            && e.contains("12.0 GiB already")
            && e.contains("its 16.0 GiB"),
        "{e}"
    );
    assert!(!e.contains('\n'));
    assert_eq!(file(), host);
    assert_eq!(mounted(&root, "c1"), inside);
    // larger than the GPU itself: the plan's own refusal
    let e = update(&root, STRICT, "c1", &req(Some("17Gi"), None, None), gpus).unwrap_err();
    assert!(
        matches!(e, RunError::Refused(UpdateError::LargerThanGpu { .. })),
        "{e}"
    );
}

#[test]
fn what_a_running_container_was_made_without_cannot_be_added() {
    let d = tempfile::tempdir().unwrap();
    let root = StateRoot::new(d.path().to_path_buf());
    running(&root, "c1", GIB, false);
    let e = update(&root, STRICT, "c1", &req(None, Some("50"), None), gpus).unwrap_err();
    assert!(
        matches!(e, RunError::Refused(UpdateError::NoShare { .. })),
        "{e}"
    );
    let r = Request::parse(Some(3), Some("1Gi"), None, None).unwrap();
    let e = update(&root, STRICT, "c1", &r, gpus).unwrap_err();
    assert!(
        matches!(e, RunError::Refused(UpdateError::NoSuchGpu { .. })),
        "{e}"
    );
    let e = update(&root, STRICT, "nope", &req(Some("1Gi"), None, None), gpus).unwrap_err();
    assert!(
        matches!(&e, RunError::NotProvisioned { id, .. } if id == "nope"),
        "{e}"
    );
}

#[test]
fn a_shrink_remembers_the_quota_it_came_from_until_grown_back() {
    let d = tempfile::tempdir().unwrap();
    let root = StateRoot::new(d.path().to_path_buf());
    running(&root, "c1", 4 * GIB, false);
    update(&root, STRICT, "c1", &req(Some("2Gi"), None, None), gpus).unwrap();
    update(&root, STRICT, "c1", &req(Some("1Gi"), None, None), gpus).unwrap();
    assert_eq!(limits(&root, "c1").devices[0].shrunk_from, Some(4 * GIB));
    update(&root, STRICT, "c1", &req(Some("3Gi"), None, None), gpus).unwrap();
    assert_eq!(limits(&root, "c1").devices[0].shrunk_from, Some(4 * GIB));
    update(&root, STRICT, "c1", &req(Some("4Gi"), None, None), gpus).unwrap();
    assert_eq!(limits(&root, "c1").devices[0].shrunk_from, None);
    assert_eq!(limits(&root, "c1").updates, 4);
}

// Two updates racing each other: each alone fits, both together would pass the GPU. The node lock makes
// exactly one win, and the sum admission sees stays within the GPU.
#[test]
fn racing_updates_leave_admissions_sum_exact() {
    for _ in 0..5 {
        let d = tempfile::tempdir().unwrap();
        let root = StateRoot::new(d.path().to_path_buf());
        running(&root, "a", 4 * GIB, false);
        running(&root, "b", 4 * GIB, false);
        let results: Vec<bool> = std::thread::scope(|s| {
            let hs: Vec<_> = ["a", "b"]
                .map(|id| {
                    let root = &root;
                    s.spawn(move || {
                        update(root, STRICT, id, &req(Some("10Gi"), None, None), gpus).is_ok()
                    })
                })
                .into_iter()
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(results.iter().filter(|ok| **ok).count(), 1, "{results:?}");
        let (sum, _) = admission::committed(&root, "none").unwrap();
        assert_eq!(sum[UUID].plain, 14 * GIB);
    }
}

// Under allow_overcommit admission takes no lock: two updates of one container (its quota, its share) at
// once must still both land, neither writing back what the other changed.
#[test]
fn updates_of_one_container_at_once_both_land_without_the_node_lock() {
    let over = Policy {
        overcommit: true,
        reserve: 0,
    };
    for _ in 0..10 {
        let d = tempfile::tempdir().unwrap();
        let root = StateRoot::new(d.path().to_path_buf());
        running(&root, "c1", GIB, true);
        std::thread::scope(|s| {
            let r = &root;
            let a = s.spawn(move || update(r, over, "c1", &req(Some("2Gi"), None, None), gpus));
            let b = s.spawn(move || update(r, over, "c1", &req(None, Some("60"), None), gpus));
            a.join().unwrap().unwrap();
            b.join().unwrap().unwrap();
        });
        let l = limits(&root, "c1");
        assert_eq!(
            (
                l.devices[0].settings.memory_limit,
                l.devices[0].settings.compute_limit,
                l.updates
            ),
            (Some(2 * GIB), Some(60), 2)
        );
        assert_eq!(
            mounted(&root, "c1").devices[0].settings.compute_limit,
            Some(60)
        );
    }
}
