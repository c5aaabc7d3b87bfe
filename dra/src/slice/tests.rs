//! The slices of a one- and a two-GPU node against the objects recorded in `tests/data` (what the API
//! server is sent, in resource.k8s.io/v1's JSON).

use super::*;

fn gpu(index: u32, total_memory: u64) -> HostGpu {
    HostGpu {
        index,
        uuid: format!("GPU-fa4ec0de-0000-4000-8000-00000000000{index}"),
        total_memory,
        minor: Some(index),
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
