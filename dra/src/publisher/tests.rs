//! Start against the API server's slices (stale ones, earlier generations) and rescans that publish only
//! on a change of the GPUs.

use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use vgpu_host::keys::dra;

fn gpu(index: u32, total_memory: u64) -> NodeGpu {
    NodeGpu {
        gpu: vgpu_host::nvml::HostGpu {
            index,
            uuid: format!("GPU-{index}"),
            total_memory,
            minor: Some(index),
        },
        model: Default::default(),
        driver_version: Some("580.65.06".into()),
        cuda_driver_version: None,
    }
}

fn existing(name: &str, pool: &str, generation: i64) -> ResourceSlice {
    let mut s = slice::build(dra::DRIVER, pool, &[gpu(0, 16 << 30)]);
    s.metadata = ObjectMeta {
        name: Some(name.into()),
        ..Default::default()
    };
    s.spec.pool.generation = generation;
    s
}

#[test]
fn a_first_start_publishes_generation_1_owned_by_the_node() {
    let st = Publisher::start(dra::DRIVER, "node-a", "uid-n", &[], &[gpu(0, 16 << 30)]);
    assert!(st.stale.is_empty());
    assert_eq!(st.slice.spec.pool.generation, 1);
    assert_eq!(
        st.slice.metadata.name.as_deref(),
        Some("node-a-gpu.vgpu.io")
    );
    let owner = &st.slice.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
        ("Node", "node-a", "uid-n")
    );
    // Otherwise the slice is the one --print-slice shows.
    let mut bare = st.slice.clone();
    bare.metadata.owner_references = None;
    assert_eq!(
        bare,
        slice::build(dra::DRIVER, "node-a", &[gpu(0, 16 << 30)])
    );
}

#[test]
fn a_restart_continues_the_generation_and_deletes_the_stale_slices() {
    let have = [
        existing("node-a-gpu.vgpu.io", "node-a", 4),
        existing("node-a-gpu.vgpu.io-old", "node-a", 7),
    ];
    let st = Publisher::start(dra::DRIVER, "node-a", "uid-n", &have, &[gpu(0, 16 << 30)]);
    assert_eq!(st.slice.spec.pool.generation, 8);
    assert_eq!(st.stale, vec!["node-a-gpu.vgpu.io-old".to_string()]);
}

#[test]
fn a_change_of_the_gpus_is_published_at_the_next_generation() {
    let mut p = Publisher::start(dra::DRIVER, "node-a", "u", &[], &[gpu(0, 16 << 30)]).publisher;
    assert_eq!(p.rescan(&[gpu(0, 16 << 30)]), None);
    // A second GPU.
    let s = p.rescan(&[gpu(0, 16 << 30), gpu(1, 16 << 30)]).unwrap();
    assert_eq!(s.spec.pool.generation, 2);
    assert_eq!(s.spec.devices.as_ref().unwrap().len(), 2);
    // Its memory changed (another card in the slot).
    let s = p.rescan(&[gpu(0, 16 << 30), gpu(1, 80 << 30)]).unwrap();
    assert_eq!(s.spec.pool.generation, 3);
    assert_eq!(
        s.spec.devices.as_ref().unwrap()[1]
            .capacity
            .as_ref()
            .unwrap()[dra::MEMORY]
            .value
            .0,
        "80Gi"
    );
    // One gone.
    let s = p.rescan(&[gpu(1, 80 << 30)]).unwrap();
    assert_eq!(s.spec.devices.as_ref().unwrap().len(), 1);
    assert_eq!(p.generation(), 4);
    assert!(s.metadata.owner_references.is_some());
    // Not published (the API server did not answer): given again at the next rescan, unchanged GPUs too.
    p.retry();
    assert_eq!(
        p.rescan(&[gpu(1, 80 << 30)]).unwrap().spec.pool.generation,
        5
    );
    assert_eq!(p.rescan(&[gpu(1, 80 << 30)]), None);
    // The driver upgraded: its version is an attribute claims select on.
    let upgraded = NodeGpu {
        driver_version: Some("590.10.01".into()),
        ..gpu(1, 80 << 30)
    };
    let s = p.rescan(std::slice::from_ref(&upgraded)).unwrap();
    assert_eq!(s.spec.pool.generation, 6);
    let attrs = s.spec.devices.as_ref().unwrap()[0]
        .attributes
        .clone()
        .unwrap();
    assert_eq!(attrs["driverVersion"].version.as_deref(), Some("590.10.1"));
}
