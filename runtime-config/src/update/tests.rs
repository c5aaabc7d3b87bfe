//! Unit tests of `vgpuctl update`: the options' grammar, the change applied, admission under the node
//! lock (the sum exact with updates racing), the host's and the container's files.
use super::change::UpdateError;
use super::*;
use vgpu_host::held::HeldError;
use vgpu_host::nvml::HostGpu;
use vgpu_host::request::GpuRequest;
use vgpu_ledger::GpuSettings;
use vgpu_oci::plan::Plan;
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

/// The host as the tests see it: `gpus`' one GPU, and what the container holds there by NVML (`held`
/// None: NVML did not list its processes; `fail`: NVML failed).
struct TestHost {
    held: Option<u64>,
    fail: bool,
    /// The container's recorded init no longer runs.
    exited: bool,
}

impl Host for TestHost {
    fn gpus(&self) -> Result<Vec<HostGpu>, vgpu_host::nvml::NvmlError> {
        gpus()
    }

    fn held(&self, _: &StateRoot, _: &str) -> Result<BTreeMap<String, u64>, HeldError> {
        if self.fail {
            return Err(HeldError::Nvml(vgpu_host::nvml::NvmlError::Call {
                call: "nvmlDeviceGetComputeRunningProcesses_v3(0)".into(),
                error: "Unknown Error (error 999)".into(),
            }));
        }
        Ok(self.held.iter().map(|&b| (UUID.to_string(), b)).collect())
    }

    fn init_alive(&self, _: u32, _: u64, _: Option<u64>) -> bool {
        !self.exited
    }
}

/// Holding `bytes` on the GPU by NVML.
const fn holding(bytes: u64) -> TestHost {
    TestHost {
        held: Some(bytes),
        fail: false,
        exited: false,
    }
}

/// Nothing held.
const IDLE: TestHost = holding(0);

/// A running container `id` with `memory` (and a 30% share when `share`) on the one GPU.
fn running(root: &StateRoot, id: &str, memory: u64, share: bool) {
    let plan = Plan {
        gpus: vec![GpuRequest {
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
    Request::parse(None, memory, compute, None, window).unwrap()
}

/// `--compute-request` (with `--compute-limit` when given).
fn request(r: &str, limit: Option<&str>) -> Request {
    Request::parse(None, None, limit, Some(r), None).unwrap()
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
    let e = |m, c, w| Request::parse(None, m, c, None, w).unwrap_err();
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
    // --compute-request: a whole percent 1..=100, the error naming the option.
    assert_eq!(request("100", None).settings.compute_request, Some(100));
    for bad in ["0", "101", "30%", ""] {
        let err = Request::parse(None, None, None, Some(bad), None).unwrap_err();
        assert!(matches!(err, UpdateError::Value(_)), "{bad}: {err}");
        assert!(
            err.to_string().starts_with(&format!(
                "--compute-request={bad:?}: a compute request is a whole percent"
            )),
            "{err}"
        );
    }
}

// Issue 42: `--compute-request` on a running container's share, admitted as at creation.
#[test]
fn a_request_is_changed_within_its_limit_and_admitted() {
    let d = tempfile::tempdir().unwrap();
    let root = StateRoot::new(d.path().to_path_buf());
    running(&root, "c1", GIB, true);
    // A limit of 30 alone is its own request: 30 -> 10, then the limit raised with a request of 20.
    let o = update(&root, STRICT, "c1", &request("10", None), &IDLE).unwrap();
    assert_eq!(
        o.changes
            .iter()
            .map(|c| (c.setting, c.from, c.to))
            .collect::<Vec<_>>(),
        vec![("compute_request", Some(30), 10)]
    );
    let s = mounted(&root, "c1").devices[0].settings;
    assert_eq!((s.compute_request, s.compute_limit), (Some(10), Some(30)));
    let o = update(&root, STRICT, "c1", &request("20", Some("80")), &IDLE).unwrap();
    assert_eq!(o.changes.len(), 2, "{:?}", o.changes);
    assert_eq!(
        limits(&root, "c1").devices[0].settings.request_limit(),
        Some((20, 80))
    );
    // Above the limit, asked or left by a lowered limit: one line naming the option, nothing changed.
    let before = std::fs::read(root.limits_path("c1").unwrap()).unwrap();
    for r in [request("90", None), req(None, Some("15"), None)] {
        let e = update(&root, STRICT, "c1", &r, &IDLE).unwrap_err();
        assert!(
            matches!(e, RunError::Refused(UpdateError::RequestAboveLimit { .. })),
            "{e}"
        );
        assert!(
            e.to_string()
                .starts_with("--compute-request: container c1's GPU 0"),
            "{e}"
        );
    }
    assert_eq!(
        std::fs::read(root.limits_path("c1").unwrap()).unwrap(),
        before
    );
    // Admission: the requests of the GPU add up to at most 100.
    running(&root, "c2", GIB, true);
    update(&root, STRICT, "c2", &request("30", None), &IDLE).unwrap();
    let e = update(&root, STRICT, "c1", &request("71", Some("90")), &IDLE).unwrap_err();
    assert!(matches!(e, RunError::Admission(_)), "{e}");
    assert!(
        e.to_string()
            .contains("101% of its time promised as compute requests"),
        "{e}"
    );
    update(&root, STRICT, "c1", &request("70", Some("90")), &IDLE).unwrap();
    // A GPU without a share gets no request; one with a request alone gets no limit.
    running(&root, "c3", GIB, false);
    let e = update(&root, STRICT, "c3", &request("10", None), &IDLE).unwrap_err();
    assert!(
        matches!(e, RunError::Refused(UpdateError::NoShare { .. })),
        "{e}"
    );
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
        &IDLE,
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
    let o = update(&root, STRICT, "c1", &req(Some("2Gi"), None, None), &IDLE).unwrap();
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
    let e = update(&root, STRICT, "c1", &req(Some("8Gi"), None, None), &IDLE).unwrap_err();
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
    let e = update(&root, STRICT, "c1", &req(Some("17Gi"), None, None), &IDLE).unwrap_err();
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
    let e = update(&root, STRICT, "c1", &req(None, Some("50"), None), &IDLE).unwrap_err();
    assert!(
        matches!(e, RunError::Refused(UpdateError::NoShare { .. })),
        "{e}"
    );
    let r = Request::parse(Some(3), Some("1Gi"), None, None, None).unwrap();
    let e = update(&root, STRICT, "c1", &r, &IDLE).unwrap_err();
    assert!(
        matches!(e, RunError::Refused(UpdateError::NoSuchGpu { .. })),
        "{e}"
    );
    let e = update(&root, STRICT, "nope", &req(Some("1Gi"), None, None), &IDLE).unwrap_err();
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
    update(&root, STRICT, "c1", &req(Some("2Gi"), None, None), &IDLE).unwrap();
    update(&root, STRICT, "c1", &req(Some("1Gi"), None, None), &IDLE).unwrap();
    assert_eq!(limits(&root, "c1").devices[0].shrunk_from, Some(4 * GIB));
    update(&root, STRICT, "c1", &req(Some("3Gi"), None, None), &IDLE).unwrap();
    assert_eq!(limits(&root, "c1").devices[0].shrunk_from, Some(4 * GIB));
    update(&root, STRICT, "c1", &req(Some("4Gi"), None, None), &IDLE).unwrap();
    assert_eq!(limits(&root, "c1").devices[0].shrunk_from, None);
    assert_eq!(limits(&root, "c1").updates, 4);
}

// The pending-shrink hole: the watchdog tolerated a pending shrink up to the quota it came from, so a
// tenant that hid the shrink from its processes kept its old quota. A shrink now records what NVML shows
// the container holding (never its ledger, which the tenant writes), at most what it was allowed before.
// Failed before: no held_at_shrink was recorded.
#[test]
fn a_shrink_records_what_nvml_shows_the_container_holding_not_its_ledger() {
    let d = tempfile::tempdir().unwrap();
    let root = StateRoot::new(d.path().to_path_buf());
    running(&root, "c1", 4 * GIB, false);
    // The tenant wrote its ledger up to the whole quota; NVML shows 1.5 GiB.
    let ledger = vgpu_ledger::Ledger::open(&root.ledger_path("c1", UUID).unwrap()).unwrap();
    let slot = ledger.attach().unwrap();
    ledger
        .charge(&slot, vgpu_ledger::Kind::Data, 4 * GIB, 4 * GIB)
        .unwrap();
    let dev = |root: &StateRoot| limits(root, "c1").devices[0].clone();
    update(
        &root,
        STRICT,
        "c1",
        &req(Some("1Gi"), None, None),
        &holding(3 * GIB / 2),
    )
    .unwrap();
    assert_eq!(
        (dev(&root).shrunk_from, dev(&root).held_at_shrink),
        (Some(4 * GIB), Some(3 * GIB / 2))
    );
    assert_eq!(
        mounted(&root, "c1").devices[0].held_at_shrink,
        Some(3 * GIB / 2),
        "the container's copy says the same"
    );
    // Shrunk again while it holds 3 GiB, more than it was allowed (it took memory it should not have):
    // what it was allowed, not what it took.
    update(
        &root,
        STRICT,
        "c1",
        &req(Some("512Mi"), None, None),
        &holding(3 * GIB),
    )
    .unwrap();
    assert_eq!(dev(&root).held_at_shrink, Some(3 * GIB / 2));
    // A grow short of the quota it came from measures nothing and keeps the figure (NVML silent here).
    let silent = TestHost {
        held: None,
        fail: false,
        exited: false,
    };
    update(&root, STRICT, "c1", &req(Some("2Gi"), None, None), &silent).unwrap();
    assert_eq!(
        (dev(&root).shrunk_from, dev(&root).held_at_shrink),
        (Some(4 * GIB), Some(3 * GIB / 2))
    );
    // Grown back to it: both go.
    update(&root, STRICT, "c1", &req(Some("4Gi"), None, None), &silent).unwrap();
    assert_eq!(
        (dev(&root).shrunk_from, dev(&root).held_at_shrink),
        (None, None)
    );
    // A shrink above what it holds records that too (the new quota is what it may hold).
    update(
        &root,
        STRICT,
        "c1",
        &req(Some("3Gi"), None, None),
        &holding(GIB),
    )
    .unwrap();
    assert_eq!(dev(&root).held_at_shrink, Some(GIB));
    assert_eq!(
        vgpu_host::shrink::allowed_memory(&dev(&root)),
        Some(3 * GIB)
    );
}

// Without NVML's figure there is no wall: a shrink it cannot measure is refused with one line, and
// nothing is written (neither file, nor the ledgers' generation). What measures nothing still passes.
#[test]
fn a_shrink_nvml_cannot_measure_is_refused_with_nothing_changed() {
    let d = tempfile::tempdir().unwrap();
    let root = StateRoot::new(d.path().to_path_buf());
    running(&root, "c1", 4 * GIB, true);
    let files = || {
        let dir = root.container_dir("c1").unwrap();
        (
            std::fs::read(dir.join("limits.json")).unwrap(),
            std::fs::read(dir.join("limits.mounted.json")).unwrap(),
        )
    };
    let ledger = vgpu_ledger::Ledger::open(&root.ledger_path("c1", UUID).unwrap()).unwrap();
    let (before, gen) = (files(), ledger.limits_generation());
    for host in [
        TestHost {
            held: None,
            fail: false,
            exited: false,
        },
        TestHost {
            held: Some(0),
            fail: true,
            exited: false,
        },
    ] {
        let e = update(&root, STRICT, "c1", &req(Some("1Gi"), None, None), &host).unwrap_err();
        assert!(
            matches!(&e, RunError::Unmeasured { id, index: 0, uuid, .. } if id == "c1" && uuid == UUID),
            "{e}"
        );
        assert!(!e.to_string().contains('\n'), "{e}");
        assert_eq!(files(), before);
        assert_eq!(ledger.limits_generation(), gen);
    }
    let silent = TestHost {
        held: None,
        fail: true,
        exited: false,
    };
    update(
        &root,
        STRICT,
        "c1",
        &req(Some("8Gi"), Some("60"), None),
        &silent,
    )
    .unwrap();
    assert_eq!(
        limits(&root, "c1").devices[0].settings.compute_limit,
        Some(60)
    );
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
                        update(root, STRICT, id, &req(Some("10Gi"), None, None), &IDLE).is_ok()
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
            let a = s.spawn(move || update(r, over, "c1", &req(Some("2Gi"), None, None), &IDLE));
            let b = s.spawn(move || update(r, over, "c1", &req(None, Some("60"), None), &IDLE));
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

#[test]
fn a_container_created_before_live_updates_is_refused_with_its_limits_never_rewritten() {
    use std::os::unix::fs::MetadataExt;
    let d = tempfile::tempdir().unwrap();
    let root = StateRoot::new(d.path().to_path_buf());
    running(&root, "c1", GIB, false);
    // What a package before live updates made: no second name of the mounted limits file.
    let dir = root.container_dir("c1").unwrap();
    std::fs::remove_file(dir.join("limits.mounted.json")).unwrap();
    let path = root.limits_path("c1").unwrap();
    // A second name keeps the file's inode in use, so a rewrite cannot get its number back.
    std::fs::hard_link(&path, d.path().join("kept")).unwrap();
    let (bytes, ino) = (
        std::fs::read(&path).unwrap(),
        path.metadata().unwrap().ino(),
    );
    let e = update(&root, STRICT, "c1", &req(Some("2Gi"), None, None), &IDLE).unwrap_err();
    assert!(
        matches!(&e, RunError::Publish { why: live::PublishError::NoMountedFile(p), .. } if p.ends_with("limits.mounted.json")),
        "{e}"
    );
    // Not written and put back (a window in which the host's file said 2 GiB): never written at all.
    assert_eq!(path.metadata().unwrap().ino(), ino);
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
}

// Regression (issue 44): an update of a container that had exited (not yet deleted) landed, 1 GiB -> 15
// GiB, and admission then refused another container for a quota nobody used. Only a recorded init was
// checked; now that it still runs, under the container's lock.
#[test]
fn an_exited_container_is_not_updated_and_nothing_is_written() {
    let d = tempfile::tempdir().unwrap();
    let root = StateRoot::new(d.path().to_path_buf());
    running(&root, "c1", GIB, true);
    let file = root.container_dir("c1").unwrap().join("limits.json");
    let before = std::fs::read(&file).unwrap();
    let gone = TestHost {
        held: Some(0),
        fail: false,
        exited: true,
    };
    let e = update(&root, STRICT, "c1", &req(Some("15Gi"), None, None), &gone).unwrap_err();
    assert!(matches!(&e, RunError::Exited { id } if id == "c1"), "{e}");
    assert!(!e.to_string().contains('\n'), "{e}");
    assert_eq!(std::fs::read(&file).unwrap(), before, "nothing written");
    update(&root, STRICT, "c1", &req(Some("15Gi"), None, None), &IDLE).unwrap();
}
