//! The slices of a one- and a two-GPU node against the objects recorded in `tests/data` (what the API
//! server is sent, in resource.k8s.io/v1's JSON).

use super::*;

use vgpu_host::nvml::{GpuModel, HostGpu};

/// A GPU as the fake NVML describes it (so the e2e suite's slice, read through the real binding from the
/// fake libnvidia-ml, is the same recorded object): an H100 under driver 580.65.06 (CUDA 13.0).
fn gpu(index: u32, total_memory: u64) -> NodeGpu {
    let name = if total_memory.is_multiple_of(1 << 30) {
        format!("NVIDIA H100 (fake, {} GiB)", total_memory >> 30)
    } else {
        format!("NVIDIA H100 (fake, {} MiB)", total_memory >> 20)
    };
    NodeGpu {
        gpu: HostGpu {
            index,
            uuid: format!("GPU-fa4ec0de-0000-4000-8000-00000000000{index}"),
            total_memory,
            minor: Some(index),
        },
        model: GpuModel {
            name: Some(name),
            architecture: Some("Hopper".into()),
            compute_capability: Some((9, 0)),
        },
        driver_version: Some("580.65.06".into()),
        cuda_driver_version: Some(13000),
    }
}

fn recorded(name: &str) -> serde_json::Value {
    let path = format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

#[test]
fn a_one_gpu_node() {
    let s = build(dra::DRIVER, "node-a", &[gpu(0, 16 << 30)]);
    assert_eq!(
        serde_json::to_value(&s).unwrap(),
        recorded("slice-one-gpu.json")
    );
}

#[test]
fn a_two_gpu_node() {
    // An H100's 81559 MiB is no whole number of GiB.
    let s = build(
        dra::DRIVER,
        "node-b",
        &[gpu(0, 16 << 30), gpu(1, 81559 << 20)],
    );
    assert_eq!(
        serde_json::to_value(&s).unwrap(),
        recorded("slice-two-gpus.json")
    );
}

#[test]
fn what_nvml_cannot_tell_is_left_out() {
    let mut g = gpu(0, 16 << 30);
    g.model = GpuModel::default();
    g.driver_version = Some("not-a-version".into());
    g.cuda_driver_version = None;
    let s = build(dra::DRIVER, "node-a", &[g]);
    let attrs = s.spec.devices.unwrap()[0].attributes.clone().unwrap();
    assert_eq!(
        attrs.keys().collect::<Vec<_>>(),
        ["index", "uuid"],
        "only what is known"
    );
}

#[test]
fn a_claim_selects_on_the_model_and_versions() {
    let s = build(dra::DRIVER, "node-a", &[gpu(0, 16 << 30)]);
    let attrs = s.spec.devices.unwrap()[0].attributes.clone().unwrap();
    assert_eq!(
        attrs["productName"].string.as_deref(),
        Some("NVIDIA H100 (fake, 16 GiB)")
    );
    assert_eq!(attrs["architecture"].string.as_deref(), Some("Hopper"));
    assert_eq!(
        attrs["cudaComputeCapability"].version.as_deref(),
        Some("9.0.0")
    );
    assert_eq!(attrs["driverVersion"].version.as_deref(), Some("580.65.6"));
    assert_eq!(
        attrs["cudaDriverVersion"].version.as_deref(),
        Some("13.0.0")
    );
}

#[test]
fn names_and_quantities() {
    assert_eq!(device_index(&device_name(12)), Some(12));
    for bad in ["gpu-", "gpu-x", "gpu--1", "GPU-0", "gpu-+1", "0"] {
        assert_eq!(device_index(bad), None, "{bad}");
    }
    assert_eq!(bytes_quantity(8 << 30).0, "8Gi");
    assert_eq!(bytes_quantity(81559 << 20).0, "81559Mi");
    assert_eq!(bytes_quantity(1000).0, "1000");
    assert_eq!(bytes_quantity(0).0, "0");
}
