//! Prepare and unprepare against the recorded claim, in temporary folders: the spec and the checkpoint
//! written in order, a second plugin on the same checkpoint (a restart) knowing the claim, unprepare
//! reclaiming both, every call idempotent.

use super::*;
use crate::checkpoint::Checkpoint;

fn claim() -> ResourceClaim {
    let path = format!(
        "{}/tests/data/claim-8gi-30.json",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

const UID: &str = "6f1c2a9e-3b7d-4e0a-9c51-2d8e4f6a7b10";

fn plugin(dir: &std::path::Path) -> Plugin {
    Plugin::new(
        "gpu.vgpu.io".into(),
        "node-a".into(),
        vec![HostGpu {
            index: 0,
            uuid: "GPU-0".into(),
            total_memory: 16 << 30,
            minor: Some(0),
        }],
        dir.join("cdi"),
        Hooks {
            hook_path: "/usr/bin/vgpu-hook".into(),
            hook_stage: "createRuntime".into(),
            hook_env: vec![],
        },
        dir.join("plugin/checkpoint.json"),
    )
    .unwrap()
}

#[test]
fn prepare_restart_unprepare() {
    let dir = tempfile::tempdir().unwrap();
    let p = plugin(dir.path());
    let prepared = p.prepare(UID, &claim()).unwrap();
    assert_eq!(
        prepared.devices[0].cdi_device_ids,
        vec![format!("vgpu.io/claim={UID}-gpu-0")]
    );
    assert!(prepared.spec.is_file());
    let on_disk = Checkpoint::load(&dir.path().join("plugin/checkpoint.json")).unwrap();
    assert_eq!(on_disk.claims.get(UID), Some(&prepared));
    // Again: the same answer.
    assert_eq!(p.prepare(UID, &claim()).unwrap(), prepared);

    // A restart: the new plugin knows the claim from its checkpoint alone.
    drop(p);
    let p = plugin(dir.path());
    assert_eq!(p.prepared(UID), Some(prepared.clone()));
    p.unprepare(UID).unwrap();
    assert!(!prepared.spec.exists());
    assert_eq!(p.prepared(UID), None);
    assert!(Checkpoint::load(&dir.path().join("plugin/checkpoint.json"))
        .unwrap()
        .claims
        .is_empty());
    // Again, and a claim never prepared: no error.
    p.unprepare(UID).unwrap();
    p.unprepare("other").unwrap();
}

#[test]
fn a_claim_whose_uid_is_not_the_one_asked_is_refused_and_nothing_written() {
    let dir = tempfile::tempdir().unwrap();
    let p = plugin(dir.path());
    assert!(matches!(
        p.prepare("another-uid", &claim()),
        Err(PrepareError::UidMismatch { .. })
    ));
    let mut c = claim();
    c.status = None;
    assert!(matches!(
        p.prepare(UID, &c),
        Err(PrepareError::Allocation(_))
    ));
    assert!(!dir.path().join("cdi").exists());
    assert!(!dir.path().join("plugin/checkpoint.json").exists());
}

#[test]
fn the_claims_spec_names_the_pods_it_is_reserved_for() {
    let dir = tempfile::tempdir().unwrap();
    let p = plugin(dir.path());
    let prepared = p.prepare(UID, &claim()).unwrap();
    assert_eq!(
        prepared.pods,
        vec!["0d3f5b2c-8a41-4c6e-b7f9-1e2a3c4d5e6f".to_string()]
    );
    let spec = std::fs::read_to_string(&prepared.spec).unwrap();
    assert!(spec.contains("VGPU_CLAIM_PODS=0d3f5b2c-8a41-4c6e-b7f9-1e2a3c4d5e6f"));
    // Reserved for no pod: refused, nothing written.
    let dir = tempfile::tempdir().unwrap();
    let p = plugin(dir.path());
    let mut c = claim();
    c.status.as_mut().unwrap().reserved_for = Some(vec![]);
    assert!(matches!(
        p.prepare(UID, &c),
        Err(PrepareError::Allocation(AllocationError::NoPod { .. }))
    ));
    assert!(!dir.path().join("cdi").exists());
}

/// Issue 44: a plugin killed between writing a claim's spec and recording it left the spec in the CDI
/// folder for good (unprepare of a claim it does not know removes nothing). The next start removes it,
/// and keeps the specs of recorded claims and every file that is not a claim spec.
#[test]
fn a_spec_left_by_a_prepare_killed_before_its_checkpoint_is_removed_at_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let p = plugin(dir.path());
    let kept = p.prepare(UID, &claim()).unwrap().spec;
    drop(p);
    let cdi = dir.path().join("cdi");
    let orphan = cdi.join("vgpu.io-claim_0b7e3d52-1111-4a2b-8c3d-9e8f7a6b5c4d.json");
    std::fs::copy(&kept, &orphan).unwrap();
    let other = cdi.join("nvidia.yaml");
    std::fs::write(&other, "cdiVersion: 0.6.0\n").unwrap();
    let p = plugin(dir.path());
    assert!(!orphan.exists(), "the orphaned spec is removed");
    assert!(kept.is_file() && other.is_file());
    assert!(p.prepared(UID).is_some());
}

#[test]
fn two_requests_on_one_gpu_prepare_one_cdi_device() {
    let dir = tempfile::tempdir().unwrap();
    let p = plugin(dir.path());
    let mut c = claim();
    let results = c
        .status
        .as_mut()
        .and_then(|s| s.allocation.as_mut())
        .and_then(|a| a.devices.as_mut())
        .and_then(|d| d.results.as_mut())
        .unwrap();
    let mut second = results[0].clone();
    second.request = "gpu-b".into();
    results.push(second);
    let prepared = p.prepare(UID, &c).unwrap();
    assert_eq!(prepared.devices.len(), 1);
    assert_eq!(prepared.devices[0].more_requests, ["gpu-b"]);
    assert!(prepared.spec.is_file());
}
