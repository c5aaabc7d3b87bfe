//! The ResourceSlice this node publishes (resource.k8s.io/v1, Kubernetes 1.34): one pool named after the
//! node, one device per GPU (`gpu-<NVML index>`) that many claims may share (`allowMultipleAllocations`),
//! with its memory (bytes) and compute (percent, 100 a GPU) as consumable capacity. The scheduler then
//! places a claim for "8Gi and 30" only on a GPU with that much left, and records what it consumed in the
//! claim's allocation (`crate::allocation` reads it back). Not here: sending it (`crate::apiserver`).
//!
//! Each device's attributes, what a claim's CEL selector reads (`device.attributes["gpu.vgpu.io"].…`),
//! are named as NVIDIA's DRA driver (k8s-dra-driver-gpu) names them, so a selector written for its GPUs
//! reads ours: `index`, `uuid`, `productName`, `architecture` (strings and an int), `cudaComputeCapability`,
//! `driverVersion` and `cudaDriverVersion` (versions). The memory is the `memory` capacity
//! (`device.capacity["gpu.vgpu.io"].memory`). An attribute NVML cannot tell is left out.
//!
//! The request policies: a claim that names no memory takes the whole GPU's (the safe reading of "a GPU"),
//! one that names no compute takes 0 (no share: it runs unpaced, as a container without a share does
//! today); memory at least vgpu's smallest quota, compute in whole percents. The compute a claim consumes
//! is its compute request (its floor, `vgpu.io/compute-request`: the scheduler keeps a GPU's at most
//! 100, as admission does), with no limit: it borrows the GPU's idle time (`crate::allocation`).

use crate::node_gpus::{cuda_semver, semver, NodeGpu};
use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Device, DeviceAttribute, DeviceCapacity,
    ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::BTreeMap;
use vgpu_host::keys::dra;

/// The device name of the GPU at NVML index `index`.
pub fn device_name(index: u32) -> String {
    format!("gpu-{index}")
}

/// The NVML index a device name stands for (`gpu-<index>`), if it is one.
pub fn device_index(name: &str) -> Option<u32> {
    let digits = name.strip_prefix("gpu-")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The ResourceSlice's name: the node's, then the driver's (one slice per node and driver).
pub fn slice_name(node: &str, driver: &str) -> String {
    format!("{node}-{driver}")
}

/// Bytes as the shortest exact quantity (`16Gi`, `81559Mi`, `1000`).
pub fn bytes_quantity(bytes: u64) -> Quantity {
    const GI: u64 = 1 << 30;
    const MI: u64 = 1 << 20;
    Quantity(if bytes != 0 && bytes.is_multiple_of(GI) {
        format!("{}Gi", bytes / GI)
    } else if bytes != 0 && bytes.is_multiple_of(MI) {
        format!("{}Mi", bytes / MI)
    } else {
        bytes.to_string()
    })
}

fn device(node_gpu: &NodeGpu) -> Device {
    let g = &node_gpu.gpu;
    let total = bytes_quantity(g.total_memory);
    let memory = DeviceCapacity {
        value: total.clone(),
        request_policy: Some(CapacityRequestPolicy {
            default: Some(total.clone()),
            valid_range: Some(CapacityRequestPolicyRange {
                min: bytes_quantity(vgpu_ledger::quantity::MIN_QUOTA),
                max: Some(total),
                step: None,
            }),
            valid_values: None,
        }),
    };
    let compute = DeviceCapacity {
        value: Quantity("100".into()),
        request_policy: Some(CapacityRequestPolicy {
            default: Some(Quantity("0".into())),
            valid_range: Some(CapacityRequestPolicyRange {
                min: Quantity("0".into()),
                max: Some(Quantity("100".into())),
                step: Some(Quantity("1".into())),
            }),
            valid_values: None,
        }),
    };
    let string = |s: &str| DeviceAttribute {
        string: Some(s.to_string()),
        ..Default::default()
    };
    let int = |i: u32| DeviceAttribute {
        int: Some(i.into()),
        ..Default::default()
    };
    let version = |v: String| DeviceAttribute {
        version: Some(v),
        ..Default::default()
    };
    let model = &node_gpu.model;
    let mut attributes = BTreeMap::from([
        ("index".to_string(), int(g.index)),
        ("uuid".to_string(), string(&g.uuid)),
    ]);
    let optional = [
        ("productName", model.name.as_deref().map(string)),
        ("architecture", model.architecture.as_deref().map(string)),
        (
            "cudaComputeCapability",
            model
                .compute_capability
                .map(|(major, minor)| version(format!("{major}.{minor}.0"))),
        ),
        (
            "driverVersion",
            node_gpu
                .driver_version
                .as_deref()
                .and_then(semver)
                .map(version),
        ),
        (
            "cudaDriverVersion",
            node_gpu
                .cuda_driver_version
                .map(|v| version(cuda_semver(v))),
        ),
    ];
    for (name, value) in optional {
        if let Some(v) = value {
            attributes.insert(name.to_string(), v);
        }
    }
    Device {
        name: device_name(g.index),
        allow_multiple_allocations: Some(true),
        attributes: Some(attributes),
        capacity: Some(BTreeMap::from([
            (dra::COMPUTE.to_string(), compute),
            (dra::MEMORY.to_string(), memory),
        ])),
        ..Default::default()
    }
}

/// The node's slice: every GPU of `gpus` a device of the pool `node`, generation 1, no owner
/// (`crate::publisher` sets both when it publishes).
pub fn build(driver: &str, node: &str, gpus: &[NodeGpu]) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(slice_name(node, driver)),
            ..Default::default()
        },
        spec: ResourceSliceSpec {
            driver: driver.to_string(),
            node_name: Some(node.to_string()),
            pool: ResourcePool {
                name: node.to_string(),
                // One slice in the pool, replaced whole (at a higher generation) when the GPUs change.
                generation: 1,
                resource_slice_count: 1,
            },
            devices: Some(gpus.iter().map(device).collect()),
            ..Default::default()
        },
    }
}

#[cfg(test)]
mod tests;
