//! Unit tests of admission: the sum against each GPU, a compute share alone, compute requests, the reserve
//! and overcommit,
//! oversubscribe quotas, unreadable limits files, the container being created left out.

use super::*;
use crate::limits_file::WriteLimits;
use vgpu_ledger::layout;
use vgpu_ledger::limits::{DeviceLimit, Limits};
use vgpu_ledger::GpuSettings;

const GIB: u64 = 1 << 30;

fn gpu(uuid: &str, total: u64) -> HostGpu {
    HostGpu {
        index: 0,
        uuid: uuid.into(),
        total_memory: total,
        minor: Some(0),
    }
}

/// A container's one GPU with a memory quota of `limit`.
fn plan(uuid: &str, limit: u64) -> Vec<GpuRequest> {
    vec![GpuRequest {
        index: 0,
        uuid: uuid.into(),
        settings: GpuSettings {
            memory_limit: Some(limit),
            ..Default::default()
        },
    }]
}

/// Container `id`'s state as provisioning leaves it (`vgpu_oci::provision`), for what admission reads:
/// marked folders and the limits file, this process its creator.
fn provision(root: &StateRoot, id: &str, gpus: &[GpuRequest]) {
    std::fs::create_dir_all(root.ledgers_dir(id).unwrap()).unwrap();
    crate::walk::mark(&root.containers_dir()).unwrap();
    crate::walk::mark(&root.container_dir(id).unwrap()).unwrap();
    let limits = Limits {
        creator: crate::creator::current(),
        devices: gpus
            .iter()
            .map(|g| DeviceLimit {
                index: g.index as u32,
                uuid: g.uuid.clone(),
                settings: g.settings,
                ledger: layout::relative_ledger_path(&g.uuid).unwrap(),
                shrunk_from: None,
                held_at_shrink: None,
            })
            .collect(),
        ..vgpu_ledger::fixtures::one_gpu(id, vgpu_ledger::fixtures::UUID, 1)
    };
    limits.write_atomic(&root.limits_path(id).unwrap()).unwrap();
}

fn plain(bytes: u64) -> Committed {
    Committed {
        plain: bytes,
        ..Default::default()
    }
}

const STRICT: Policy = Policy {
    overcommit: false,
    reserve: 0,
};

// Regression: three 12 GiB quotas were admitted on one 16 GiB GPU; the third container's allocations
// then failed below its quota.
#[test]
fn a_quota_that_would_pass_the_gpu_is_refused_with_the_figures() {
    let gpus = [gpu("GPU-a", 16 * GIB)];
    let mut c = BTreeMap::new();
    check(&plan("GPU-a", 12 * GIB), &gpus, &c, STRICT).unwrap();
    c.insert("GPU-a".to_string(), plain(12 * GIB));
    let e = check(&plan("GPU-a", 12 * GIB), &gpus, &c, STRICT).unwrap_err();
    assert!(
        matches!(e, AdmissionError::Full { asked, committed, .. }
            if asked == 12 * GIB && committed.plain == 12 * GIB),
        "{e}"
    );
    // The line is the contract: the GPU, the sum, the figure it passes.
    let e = e.to_string();
    assert!(
        e.contains("GPU-a") && e.contains("24.0 GiB") && e.contains("its 16.0 GiB"),
        "{e}"
    );
    assert!(!e.contains('\n'));
    check(&plan("GPU-a", 4 * GIB), &gpus, &c, STRICT).unwrap();
    // other GPUs' quotas do not count
    check(
        &plan("GPU-b", 16 * GIB),
        &[gpu("GPU-b", 16 * GIB)],
        &c,
        STRICT,
    )
    .unwrap();
}

#[test]
fn a_compute_share_alone_commits_no_memory_and_is_never_refused() {
    let gpus = [gpu("GPU-a", 16 * GIB)];
    let mut c = BTreeMap::new();
    c.insert("GPU-a".to_string(), plain(16 * GIB));
    let mut share = plan("GPU-a", GIB);
    share[0].settings.memory_limit = None;
    share[0].settings.compute_limit = Some(30);
    check(&share, &gpus, &c, STRICT).unwrap();
    // provisioned, it counts as nothing against a memory quota
    let d = tempfile::tempdir().unwrap();
    let root = StateRoot::new(d.path().to_path_buf());
    let uuid = "GPU-fa4ec0de-0000-4000-8000-000000000000";
    share[0].uuid = uuid.into();
    provision(&root, "s1", &share);
    let (sum, unreadable) = committed(&root, "x").unwrap();
    assert!(unreadable.is_empty());
    assert_eq!(sum.get(uuid).map(|c| c.total()), Some(0));
    check(&plan(uuid, 16 * GIB), &[gpu(uuid, 16 * GIB)], &sum, STRICT).unwrap();
}

/// One GPU's compute share alone: `request` and `limit` as limits.json holds them.
fn share(uuid: &str, request: Option<u32>, limit: Option<u32>) -> Vec<GpuRequest> {
    let mut p = plan(uuid, GIB);
    p[0].settings.memory_limit = None;
    p[0].settings.compute_request = request;
    p[0].settings.compute_limit = limit;
    p
}

#[test]
fn compute_requests_never_add_up_past_the_gpus_time() {
    let d = tempfile::tempdir().unwrap();
    let root = StateRoot::new(d.path().to_path_buf());
    let uuid = "GPU-fa4ec0de-0000-4000-8000-000000000000";
    let gpus = [gpu(uuid, 16 * GIB)];
    provision(&root, "r30", &share(uuid, Some(30), None));
    provision(&root, "r50", &share(uuid, Some(20), Some(50)));
    let (sum, _) = committed(&root, "none").unwrap();
    assert_eq!(
        (sum[uuid].requests, sum[uuid].explicit_requests),
        (50, true)
    );
    // 50 more fit; 51 do not, in one line naming the GPU, the figures and the key.
    check(&share(uuid, Some(50), None), &gpus, &sum, STRICT).unwrap();
    let e = check(&share(uuid, Some(51), Some(90)), &gpus, &sum, STRICT).unwrap_err();
    assert!(
        matches!(
            e,
            AdmissionError::ComputeFull {
                asked: 51,
                committed: 50,
                ..
            }
        ),
        "{e}"
    );
    let line = e.to_string();
    assert!(
        line.starts_with(&format!("admission: GPU 0 ({uuid}) would have 101% of its time promised as compute requests (50% already, 51% asked for), more than its 100%: lower vgpu.io/compute-request")),
        "{line}"
    );
    assert!(!line.contains('\n'));
    // Beside requests, a limit alone is its own request: a cap of 60 does not fit beside 50.
    assert!(check(&share(uuid, None, Some(60)), &gpus, &sum, STRICT).is_err());
    check(&share(uuid, None, Some(50)), &gpus, &sum, STRICT).unwrap();
    // Overcommit allows anything.
    let over = Policy {
        overcommit: true,
        reserve: 0,
    };
    check(&share(uuid, Some(100), None), &gpus, &sum, over).unwrap();
    // A memory quota beside the share changes nothing to the count.
    let mut both = share(uuid, Some(60), None);
    both[0].settings.memory_limit = Some(GIB);
    assert!(check(&both, &gpus, &sum, STRICT).is_err());
}

#[test]
fn caps_alone_may_add_up_past_the_gpu_as_they_always_could() {
    let d = tempfile::tempdir().unwrap();
    let root = StateRoot::new(d.path().to_path_buf());
    let uuid = "GPU-fa4ec0de-0000-4000-8000-000000000000";
    let gpus = [gpu(uuid, 16 * GIB)];
    provision(&root, "c60", &share(uuid, None, Some(60)));
    provision(&root, "c70", &share(uuid, None, Some(70)));
    let (sum, _) = committed(&root, "none").unwrap();
    assert_eq!(
        (sum[uuid].requests, sum[uuid].explicit_requests),
        (130, false)
    );
    // No container there has a request: caps are promised nothing, a third is admitted.
    check(&share(uuid, None, Some(50)), &gpus, &sum, STRICT).unwrap();
    // A request beside them is refused: the caps would be floors it could not get past.
    let e = check(&share(uuid, Some(10), None), &gpus, &sum, STRICT).unwrap_err();
    assert!(
        matches!(
            e,
            AdmissionError::ComputeFull {
                asked: 10,
                committed: 130,
                ..
            }
        ),
        "{e}"
    );
    // A container without a share asks nothing.
    check(&plan(uuid, GIB), &gpus, &sum, STRICT).unwrap();
    // The policy `disable` leaves no share to count.
    let mut off = share(uuid, Some(10), None);
    off[0].settings.compute_policy = vgpu_ledger::envcompute::Policy::Disable;
    check(&off, &gpus, &sum, STRICT).unwrap();
}

#[test]
fn the_reserve_is_kept_and_overcommit_allows_anything() {
    let gpus = [gpu("GPU-a", 16 * GIB)];
    let c = BTreeMap::new();
    let reserve = Policy {
        overcommit: false,
        reserve: GIB,
    };
    assert!(check(&plan("GPU-a", 16 * GIB), &gpus, &c, reserve).is_err());
    check(&plan("GPU-a", 15 * GIB), &gpus, &c, reserve).unwrap();
    let over = Policy {
        overcommit: true,
        reserve: GIB,
    };
    let mut c = BTreeMap::new();
    c.insert("GPU-a".to_string(), plain(40 * GIB));
    check(&plan("GPU-a", 16 * GIB), &gpus, &c, over).unwrap();
}

fn with_mode(uuid: &str, limit: u64, mode: vgpu_ledger::MemoryMode) -> Vec<GpuRequest> {
    let mut p = plan(uuid, limit);
    p[0].settings.memory = mode;
    p
}

fn over(uuid: &str, limit: u64) -> Vec<GpuRequest> {
    with_mode(
        uuid,
        limit,
        vgpu_ledger::MemoryMode::Oversubscribe { reserve: 0 },
    )
}

#[test]
fn oversubscribe_quotas_may_sum_past_the_gpu_among_themselves() {
    let gpus = [gpu("GPU-a", 16 * GIB)];
    let mut c = BTreeMap::new();
    c.insert(
        "GPU-a".to_string(),
        Committed {
            oversubscribe: 12 * GIB,
            ..Default::default()
        },
    );
    check(&over("GPU-a", 12 * GIB), &gpus, &c, STRICT).unwrap();
    // a spill container's device quota is admitted as a plain one
    let spill = with_mode(
        "GPU-a",
        12 * GIB,
        vgpu_ledger::MemoryMode::Spill { spill_limit: GIB },
    );
    assert!(check(&spill, &gpus, &c, STRICT).is_err());
}

// Regression (issue 25 item 6): oversubscribe quotas committed nothing, though pools, VMM, arrays,
// graphs, contexts and modules stay device memory in that mode: a 16 GiB oversubscribe container held
// 15 GiB of pool memory, a plain 12 GiB container was admitted beside it and ran out at 4 GiB. Where a
// plain quota is at stake every quota on the GPU counts in full, each being device memory it can hold.
#[test]
fn oversubscribe_quotas_count_in_full_where_a_plain_quota_is_at_stake() {
    let d = tempfile::tempdir().unwrap();
    let root = StateRoot::new(d.path().to_path_buf());
    let uuid = "GPU-fa4ec0de-0000-4000-8000-000000000000";
    let gpus = [gpu(uuid, 16 * GIB)];
    provision(&root, "o1", &over(uuid, 16 * GIB));
    let (sum, _) = committed(&root, "none").unwrap();
    // a plain container beside the oversubscribe one is refused: the 16 GiB may all be pool memory
    assert!(check(&plan(uuid, 12 * GIB), &gpus, &sum, STRICT).is_err());
    // another oversubscribe one is not: they page each other
    check(&over(uuid, 16 * GIB), &gpus, &sum, STRICT).unwrap();
    // with a plain quota on the GPU, an oversubscribe quota that does not fit beside it is refused too
    let d = tempfile::tempdir().unwrap();
    let root = StateRoot::new(d.path().to_path_buf());
    provision(&root, "p1", &plan(uuid, 12 * GIB));
    let (sum, _) = committed(&root, "none").unwrap();
    assert!(check(&over(uuid, 8 * GIB), &gpus, &sum, STRICT).is_err());
    check(&over(uuid, 4 * GIB), &gpus, &sum, STRICT).unwrap();
}

// Regression: admission read limits files with the plain loader, so a FIFO left where a limits file
// was (the container folder is host-only, but a careless or hostile host process can leave one) blocked
// every create on the node, under the node lock, until a writer came.
#[test]
fn a_fifo_where_a_limits_file_was_is_unreadable_not_waited_on() {
    let d = tempfile::tempdir().unwrap();
    let root = StateRoot::new(d.path().to_path_buf());
    let p = plan("GPU-fa4ec0de-0000-4000-8000-000000000000", 3 * GIB);
    for id in ["c1", "c2"] {
        provision(&root, id, &p);
    }
    let lp = root.limits_path("c1").unwrap();
    std::fs::remove_file(&lp).unwrap();
    nix::unistd::mkfifo(&lp, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let r = root.clone();
    std::thread::spawn(move || tx.send(committed(&r, "new").unwrap()));
    let (sum, unreadable) = rx
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("admission blocked on a FIFO");
    assert_eq!(unreadable, vec!["c1".to_string()]);
    assert_eq!(
        sum.values().copied().collect::<Vec<_>>(),
        vec![plain(3 * GIB)]
    );
}

#[test]
fn committed_counts_live_folders_but_not_the_container_being_created() {
    let d = tempfile::tempdir().unwrap();
    let root = StateRoot::new(d.path().to_path_buf());
    let p = plan("GPU-fa4ec0de-0000-4000-8000-000000000000", 3 * GIB);
    for id in ["c1", "c2"] {
        provision(&root, id, &p);
    }
    let (sum, bad) = committed(&root, "c2").unwrap();
    assert_eq!(
        sum.values().copied().collect::<Vec<_>>(),
        vec![plain(3 * GIB)]
    );
    assert!(bad.is_empty());
    let (sum, _) = committed(&root, "other").unwrap();
    assert_eq!(
        sum.values().copied().collect::<Vec<_>>(),
        vec![plain(6 * GIB)]
    );
}
