//! Claims as the API server returns them once allocated (`tests/data`, resource.k8s.io/v1's JSON) read back
//! into devices and the quota they fix.

use super::*;
use k8s_openapi::api::resource::v1::DeviceRequestAllocationResult;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::collections::BTreeMap;

fn gpus() -> Vec<HostGpu> {
    (0..2)
        .map(|i| HostGpu {
            index: i,
            uuid: format!("GPU-{i}"),
            total_memory: 16 << 30,
            minor: Some(i),
        })
        .collect()
}

pub fn recorded_claim() -> ResourceClaim {
    let path = format!(
        "{}/tests/data/claim-8gi-30.json",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn results(claim: &mut ResourceClaim) -> &mut Vec<DeviceRequestAllocationResult> {
    claim
        .status
        .as_mut()
        .unwrap()
        .allocation
        .as_mut()
        .unwrap()
        .devices
        .as_mut()
        .unwrap()
        .results
        .as_mut()
        .unwrap()
}

#[test]
fn the_recorded_claim_is_8gi_and_30_percent_of_gpu_0() {
    let d = read(&recorded_claim(), dra::DRIVER, "node-a", &gpus()).unwrap();
    assert_eq!(d.len(), 1);
    assert_eq!(
        (d[0].request.as_str(), d[0].device.as_str(), d[0].gpu.index),
        ("gpu", "gpu-0", 0)
    );
    assert_eq!(
        (d[0].settings.memory_limit, d[0].settings.compute_request),
        (Some(8 << 30), Some(30))
    );
    assert_eq!(
        quota(&d),
        "vgpu.io/memory-limit=8589934592,vgpu.io/compute-request=30"
    );
}

#[test]
fn two_gpus_that_differ_get_one_setting_each() {
    let mut c = recorded_claim();
    let mut second = results(&mut c)[0].clone();
    second.device = "gpu-1".into();
    second.consumed_capacity = Some(BTreeMap::from([("memory".into(), Quantity("4Gi".into()))]));
    results(&mut c).push(second);
    let d = read(&c, dra::DRIVER, "node-a", &gpus()).unwrap();
    assert_eq!(
        quota(&d),
        "vgpu.io/memory-limit.0=8589934592,vgpu.io/compute-request.0=30,vgpu.io/memory-limit.1=4294967296"
    );
}

#[test]
fn whole_devices_and_shares_of_none_or_all() {
    let mut c = recorded_claim();
    results(&mut c)[0].consumed_capacity = None;
    let d = read(&c, dra::DRIVER, "node-a", &gpus()).unwrap();
    assert_eq!(
        (d[0].settings.memory_limit, d[0].settings.compute_request),
        (Some(16 << 30), None)
    );
    for all_or_none in ["0", "100"] {
        results(&mut c)[0].consumed_capacity = Some(BTreeMap::from([(
            "compute".into(),
            Quantity(all_or_none.into()),
        )]));
        let d = read(&c, dra::DRIVER, "node-a", &gpus()).unwrap();
        assert_eq!(d[0].settings.compute_request, None);
    }
}

#[test]
fn claims_that_cannot_be_prepared_here() {
    let gpus = gpus();
    let err = |c: &ResourceClaim| read(c, dra::DRIVER, "node-a", &gpus).unwrap_err();
    let mut c = recorded_claim();
    c.status = None;
    assert!(matches!(err(&c), AllocationError::NotAllocated { .. }));
    let mut c = recorded_claim();
    results(&mut c)[0].driver = "gpu.nvidia.com".into();
    assert!(matches!(err(&c), AllocationError::NoDevice { .. }));
    let mut c = recorded_claim();
    results(&mut c)[0].pool = "node-b".into();
    assert!(matches!(err(&c), AllocationError::OtherPool { .. }));
    let mut c = recorded_claim();
    results(&mut c)[0].device = "gpu-7".into();
    assert!(matches!(err(&c), AllocationError::UnknownDevice { .. }));
    for (cap, v) in [
        ("memory", "8Qi"),
        ("memory", "1Mi"),
        ("memory", "17Gi"),
        ("compute", "101"),
        ("compute", "1.5"),
    ] {
        let mut c = recorded_claim();
        results(&mut c)[0].consumed_capacity =
            Some(BTreeMap::from([(cap.to_string(), Quantity(v.into()))]));
        assert!(
            matches!(err(&c), AllocationError::Capacity { .. }),
            "{cap}={v}"
        );
    }
}

#[test]
fn the_claims_consumers_are_the_pods_it_is_reserved_for() {
    let c = recorded_claim();
    assert_eq!(
        consumers(&c).unwrap(),
        vec!["0d3f5b2c-8a41-4c6e-b7f9-1e2a3c4d5e6f".to_string()]
    );
    // A consumer that is no core pod is no pod the hook can match.
    let mut c = recorded_claim();
    let r = &mut c.status.as_mut().unwrap().reserved_for.as_mut().unwrap()[0];
    r.api_group = Some("batch".into());
    assert!(matches!(consumers(&c), Err(AllocationError::NoPod { .. })));
    let mut c = recorded_claim();
    c.status.as_mut().unwrap().reserved_for = None;
    assert!(matches!(consumers(&c), Err(AllocationError::NoPod { .. })));
}

/// Issue 44: two requests the scheduler put on one GPU (a device with `allowMultipleAllocations`) were two
/// devices of one name, and the spec was refused ("CDI device ... appears twice"): the pod never started.
/// Now one device answers both, their memory and compute summed.
#[test]
fn two_requests_on_one_gpu_are_one_device_with_their_capacity_summed() {
    let mut c = recorded_claim();
    let mut second = results(&mut c)[0].clone();
    second.request = "gpu-b".into();
    second.consumed_capacity = Some(BTreeMap::from([
        ("memory".into(), Quantity("4Gi".into())),
        ("compute".into(), Quantity("20".into())),
    ]));
    results(&mut c).push(second);
    let d = read(&c, dra::DRIVER, "node-a", &gpus()).unwrap();
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(
        (d[0].request.as_str(), d[0].more_requests.as_slice()),
        ("gpu", &["gpu-b".to_string()][..])
    );
    assert_eq!(
        (d[0].settings.memory_limit, d[0].settings.compute_request),
        (Some(12 << 30), Some(50))
    );
    assert_eq!(
        quota(&d),
        "vgpu.io/memory-limit=12884901888,vgpu.io/compute-request=50"
    );
    // Together past the GPU: refused with one line naming the device.
    let mut third = results(&mut c)[0].clone();
    third.request = "gpu-c".into();
    results(&mut c).push(third);
    let e = read(&c, dra::DRIVER, "node-a", &gpus()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "claim team-a/trainer-gpu-x7k2p: device gpu-0 consumed memory=\"21474836480\": its requests together consume more than the GPU has"
    );
}
