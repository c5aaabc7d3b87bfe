//! `Allocate`'s answer for one container: the quota the scheduler counted, written where vgpu's runtime
//! reads it. For `vgpu.io/memory` (N units on one GPU): the annotation `vgpu.io/memory-limit` (bytes; the
//! kubelet passes a plugin's annotations to the CRI runtime as the container's, which containerd copies into
//! the spec for a handler whose `container_annotations` allow `vgpu.io/*`, as `vgpuctl runtime configure`
//! writes it), `CUDA_DEVICE_MEMORY_LIMIT` (HAMi's variable, read by the runtime where annotations do not
//! arrive), `NVIDIA_VISIBLE_DEVICES` (the GPU's UUID, for NVIDIA's runtime underneath) and the GPU's device
//! node (plus `nvidiactl` and `nvidia-uvm*` where the node has them). For `vgpu.io/compute` (N percent):
//! `vgpu.io/compute-limit` and `CUDA_DEVICE_SM_LIMIT`, no device: a share is of the GPU the container's
//! memory is on. IDs on several GPUs, or not the plugin's, refuse the container with one line: the kubelet
//! then fails the pod (`UnexpectedAdmissionError`) instead of starting it over a GPU's memory.

use crate::devices::{uuid_of, Gpu, Inventory, Resource};
use crate::proto::v1beta1::{ContainerAllocateResponse, DeviceSpec};
use std::collections::BTreeMap;
use std::path::Path;
use vgpu_ledger::keys::{annotation, env};
use vgpu_ledger::quantity::format_bytes;

/// The control nodes a CUDA process opens beside its GPU's, given where the node has them.
pub const CONTROL_NODES: [&str; 3] = ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"];

/// A container the plugin refuses. `Display` is the one line the pod's event shows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocateError {
    #[error("{resource}: the kubelet gave a container no device")]
    Empty { resource: &'static str },
    #[error("{resource}: device {id:?} is not one this plugin lists (its GPUs: {gpus}); was the plugin restarted with other GPUs?")]
    Unknown {
        resource: &'static str,
        id: String,
        gpus: String,
    },
    #[error("{resource}: device {id:?} given twice to one container")]
    Twice { resource: &'static str, id: String },
    #[error("{resource}: the {asked} given to one container are spread over GPUs ({spread}): no GPU of this node had {asked} free, which the scheduler cannot see (it counts the node's sum); refused rather than started past a GPU")]
    Spread {
        resource: &'static str,
        asked: String,
        spread: String,
    },
    #[error("GPU {index} ({uuid}): its device node {path} is missing (--dev-root)")]
    NoNode {
        index: u32,
        uuid: String,
        path: String,
    },
}

/// What `resource`'s `n` units are, in words: `12.0 GiB`, `30%`.
fn amount(inv: &Inventory, resource: Resource, n: u64) -> String {
    match resource {
        Resource::Memory => format_bytes(n * inv.memory_unit),
        Resource::Compute => format!("{n}%"),
    }
}

/// The one GPU `ids` are on, and how many they are.
pub fn grant<'a>(
    inv: &'a Inventory,
    resource: Resource,
    ids: &[String],
) -> Result<(&'a Gpu, u64), AllocateError> {
    let name = resource.name();
    let mut per_gpu: BTreeMap<u32, (&Gpu, u64)> = BTreeMap::new();
    let mut seen = std::collections::BTreeSet::new();
    for id in ids {
        let gpu = uuid_of(id)
            .and_then(|u| inv.gpu(u))
            .filter(|g| {
                let n: u64 = id
                    .rsplit_once("::")
                    .map_or(u64::MAX, |(_, n)| n.parse().unwrap_or(u64::MAX));
                n < inv.units(resource, g)
            })
            .ok_or_else(|| AllocateError::Unknown {
                resource: name,
                id: id.clone(),
                gpus: inv
                    .gpus
                    .iter()
                    .map(|g| g.uuid.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        if !seen.insert(id.as_str()) {
            return Err(AllocateError::Twice {
                resource: name,
                id: id.clone(),
            });
        }
        per_gpu.entry(gpu.index).or_insert((gpu, 0)).1 += 1;
    }
    match per_gpu.len() {
        0 => Err(AllocateError::Empty { resource: name }),
        1 => Ok(per_gpu.into_values().next().expect("one GPU")),
        _ => Err(AllocateError::Spread {
            resource: name,
            asked: amount(inv, resource, ids.len() as u64),
            spread: per_gpu
                .values()
                .map(|(g, n)| format!("GPU {}: {}", g.index, amount(inv, resource, *n)))
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// The answer for one container given `ids` of `resource`; device nodes are looked for under `dev_root`.
pub fn container_response(
    inv: &Inventory,
    resource: Resource,
    ids: &[String],
    dev_root: &Path,
) -> Result<ContainerAllocateResponse, AllocateError> {
    let (gpu, n) = grant(inv, resource, ids)?;
    let mut r = ContainerAllocateResponse::default();
    match resource {
        Resource::Memory => {
            let bytes = n * inv.memory_unit;
            r.annotations
                .insert(annotation::MEMORY_LIMIT.into(), bytes.to_string());
            r.envs
                .insert(env::MEMORY_LIMIT.into(), format!("{}m", bytes >> 20));
            r.envs.insert(env::VISIBLE_DEVICES.into(), gpu.uuid.clone());
            let node = gpu.minor.map(|m| format!("nvidia{m}"));
            let host = node.as_ref().map(|n| dev_root.join(n));
            match (node, host) {
                (Some(node), Some(host)) if host.exists() => r.devices.push(spec(&node, &host)),
                (_, host) => {
                    return Err(AllocateError::NoNode {
                        index: gpu.index,
                        uuid: gpu.uuid.clone(),
                        path: host
                            .map_or("(NVML gives no minor)".into(), |h| h.display().to_string()),
                    })
                }
            }
            for c in CONTROL_NODES {
                let host = dev_root.join(c);
                if host.exists() {
                    r.devices.push(spec(c, &host));
                }
            }
        }
        Resource::Compute => {
            r.annotations
                .insert(annotation::COMPUTE_LIMIT.into(), n.to_string());
            r.envs.insert(env::SM_LIMIT.into(), n.to_string());
        }
    }
    Ok(r)
}

/// `/dev/<name>` in the container, `host` on the node, read-write.
fn spec(name: &str, host: &Path) -> DeviceSpec {
    DeviceSpec {
        container_path: format!("/dev/{name}"),
        host_path: host.display().to_string(),
        permissions: "rw".into(),
    }
}

#[cfg(test)]
mod tests;
