//! `Allocate`'s answers: the quota as the runtime reads it, and the refusals.

use super::*;
use crate::devices::device_id;
use vgpu_host::nvml::HostGpu;

const GIB: u64 = 1 << 30;

fn inv() -> Inventory {
    let gpus: Vec<HostGpu> = (0..2)
        .map(|i| HostGpu {
            index: i,
            uuid: format!("GPU-{i}"),
            total_memory: 16 * GIB,
            minor: Some(i),
        })
        .collect();
    Inventory::new(&gpus, GIB, 0).unwrap()
}

fn ids(uuid: &str, range: std::ops::Range<u64>) -> Vec<String> {
    range.map(|n| device_id(uuid, n)).collect()
}

fn dev_root(nodes: &[&str]) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for n in nodes {
        std::fs::write(d.path().join(n), "").unwrap();
    }
    d
}

#[test]
fn memory_on_one_gpu_is_its_quota_annotation_env_and_device() {
    let dev = dev_root(&["nvidia1", "nvidiactl", "nvidia-uvm"]);
    let r = container_response(&inv(), Resource::Memory, &ids("GPU-1", 3..11), dev.path()).unwrap();
    assert_eq!(r.annotations["vgpu.io/memory-limit"], (8 * GIB).to_string());
    assert_eq!(r.envs["CUDA_DEVICE_MEMORY_LIMIT"], "8192m");
    assert_eq!(r.envs["NVIDIA_VISIBLE_DEVICES"], "GPU-1");
    let paths: Vec<(&str, String)> = r
        .devices
        .iter()
        .map(|d| (d.container_path.as_str(), d.host_path.clone()))
        .collect();
    let host = |n: &str| dev.path().join(n).display().to_string();
    assert_eq!(
        paths,
        [
            ("/dev/nvidia1", host("nvidia1")),
            ("/dev/nvidiactl", host("nvidiactl")),
            ("/dev/nvidia-uvm", host("nvidia-uvm")),
        ]
    );
    assert!(r.devices.iter().all(|d| d.permissions == "rw"));
}

#[test]
fn compute_is_a_share_of_the_memorys_gpu_without_a_device() {
    let dev = dev_root(&[]);
    let r =
        container_response(&inv(), Resource::Compute, &ids("GPU-0", 0..30), dev.path()).unwrap();
    assert_eq!(r.annotations["vgpu.io/compute-limit"], "30");
    assert_eq!(r.envs["CUDA_DEVICE_SM_LIMIT"], "30");
    assert!(r.devices.is_empty());
    assert!(!r.envs.contains_key("NVIDIA_VISIBLE_DEVICES"));
}

#[test]
fn ids_on_two_gpus_refuse_the_container_naming_the_spread() {
    let dev = dev_root(&["nvidia0", "nvidia1"]);
    let spread = [ids("GPU-0", 0..8), ids("GPU-1", 0..4)].concat();
    let e = container_response(&inv(), Resource::Memory, &spread, dev.path()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "vgpu.io/memory: the 12.0 GiB given to one container are spread over GPUs (GPU 0: 8.00 GiB, GPU 1: 4.00 GiB): no GPU of this node had 12.0 GiB free, which the scheduler cannot see (it counts the node's sum); refused rather than started past a GPU"
    );
    let spread = [ids("GPU-0", 0..60), ids("GPU-1", 0..50)].concat();
    let e = container_response(&inv(), Resource::Compute, &spread, dev.path()).unwrap_err();
    assert!(
        e.to_string().starts_with("vgpu.io/compute: the 110% given"),
        "{e}"
    );
}

#[test]
fn ids_not_the_plugins_or_given_twice_are_refused() {
    let dev = dev_root(&["nvidia0"]);
    let inv = inv();
    for bad in ["GPU-7::0", "GPU-0::16", "nvidia0", "GPU-0::x"] {
        let e =
            container_response(&inv, Resource::Memory, &[bad.to_string()], dev.path()).unwrap_err();
        assert!(matches!(e, AllocateError::Unknown { .. }), "{bad}: {e}");
    }
    // 16 GiB are units 0..16; compute has 100.
    assert!(
        container_response(&inv, Resource::Compute, &ids("GPU-0", 99..100), dev.path()).is_ok()
    );
    let twice = vec![device_id("GPU-0", 1), device_id("GPU-0", 1)];
    let e = container_response(&inv, Resource::Memory, &twice, dev.path()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "vgpu.io/memory: device \"GPU-0::1\" given twice to one container"
    );
    let e = container_response(&inv, Resource::Memory, &[], dev.path()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "vgpu.io/memory: the kubelet gave a container no device"
    );
}

#[test]
fn a_gpu_without_its_device_node_is_refused() {
    let dev = dev_root(&[]);
    let e =
        container_response(&inv(), Resource::Memory, &ids("GPU-0", 0..1), dev.path()).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "GPU 0 (GPU-0): its device node {}/nvidia0 is missing (--dev-root)",
            dev.path().display()
        )
    );
}
