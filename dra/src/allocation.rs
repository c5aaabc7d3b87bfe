//! What the scheduler gave a claim on this node, read from the claim's `status.allocation`: per device of
//! this driver, the GPU and the memory and compute it consumed, and from that the quota the claim fixes
//! (the hook's `VGPU_CLAIM_QUOTA`, in the quota annotations' grammar); and from `status.reservedFor` the
//! pods the claim is for (the hook's `VGPU_CLAIM_PODS`). Several requests the scheduler put on one GPU
//! (a device with `allowMultipleAllocations`) are one device of the claim, their capacity summed: a GPU
//! is one device in the container and one quota (`merge`). Not here: fetching the claim
//! (`crate::apiserver`) or the CDI spec that carries the quota (`crate::claim_spec`).

use crate::slice;
use k8s_openapi::api::resource::v1::ResourceClaim;
use vgpu_host::keys::dra;
use vgpu_host::nvml::HostGpu;
use vgpu_ledger::keys::{self, annotation};
use vgpu_ledger::GpuSettings;

/// One device of the claim on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocated {
    /// The claim's request the device answers, and its other requests the scheduler put on the same GPU.
    pub request: String,
    pub more_requests: Vec<String>,
    /// The device (`gpu-<index>`) and its GPU.
    pub device: String,
    pub gpu: HostGpu,
    /// What the claim consumed of the GPU, as the GPU's settings (the host tools' one per-GPU shape of a
    /// memory quota and a compute share): `memory_limit`, the bytes of its memory (the whole GPU when the
    /// allocation names none: a cluster without consumable capacity allocates whole devices), always set;
    /// `compute_request`, the percent of its time, a floor that may borrow the GPU's idle time up to the
    /// whole GPU (no limit: the scheduler counts requests, as admission does; none: 0, none named, or
    /// all of it).
    pub settings: GpuSettings,
}

/// Why a claim cannot be prepared here. `Display` is one line naming the claim's field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocationError {
    #[error("claim {claim} is not allocated (no status.allocation)")]
    NotAllocated { claim: String },
    #[error("claim {claim} is reserved for no pod (status.reservedFor names none)")]
    NoPod { claim: String },
    #[error("claim {claim} has no device of driver {driver}")]
    NoDevice { claim: String, driver: String },
    #[error("claim {claim}: device {device} is in pool {pool}, not this node's ({node})")]
    OtherPool {
        claim: String,
        device: String,
        pool: String,
        node: String,
    },
    #[error("claim {claim}: device {device} is no GPU of this node")]
    UnknownDevice { claim: String, device: String },
    #[error("claim {claim}: device {device} consumed {capacity}={value:?}: {why}")]
    Capacity {
        claim: String,
        device: String,
        capacity: &'static str,
        value: String,
        why: String,
    },
}

/// The devices of `driver` in the claim's allocation, each checked against this node's pool and GPUs.
pub fn read(
    claim: &ResourceClaim,
    driver: &str,
    node: &str,
    gpus: &[HostGpu],
) -> Result<Vec<Allocated>, AllocationError> {
    let name = format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        claim.metadata.name.as_deref().unwrap_or_default()
    );
    let results = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .ok_or_else(|| AllocationError::NotAllocated {
            claim: name.clone(),
        })?
        .devices
        .as_ref()
        .and_then(|d| d.results.as_ref())
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut out = Vec::new();
    for r in results.iter().filter(|r| r.driver == driver) {
        if r.pool != node {
            return Err(AllocationError::OtherPool {
                claim: name,
                device: r.device.clone(),
                pool: r.pool.clone(),
                node: node.to_string(),
            });
        }
        let gpu = slice::device_index(&r.device)
            .and_then(|i| gpus.iter().find(|g| g.index == i))
            .ok_or_else(|| AllocationError::UnknownDevice {
                claim: name.clone(),
                device: r.device.clone(),
            })?;
        let consumed = |capacity: &'static str| {
            r.consumed_capacity
                .as_ref()
                .and_then(|c| c.get(capacity))
                .map(|q| q.0.clone())
        };
        let bad = |capacity: &'static str, value: &str, why: String| AllocationError::Capacity {
            claim: name.clone(),
            device: r.device.clone(),
            capacity,
            value: value.to_string(),
            why,
        };
        let memory = match consumed(dra::MEMORY) {
            None => gpu.total_memory,
            Some(v) => {
                let bytes = vgpu_ledger::quantity::parse_quantity(&v)
                    .map_err(|e| bad(dra::MEMORY, &v, e.to_string()))?;
                vgpu_ledger::quantity::check_min_quota(bytes)
                    .map_err(|why| bad(dra::MEMORY, &v, why.to_string()))?;
                if bytes > gpu.total_memory {
                    return Err(bad(dra::MEMORY, &v, "more than the GPU has".into()));
                }
                bytes
            }
        };
        let compute = match consumed(dra::COMPUTE) {
            None => None,
            Some(v) => match v.parse::<u32>() {
                Ok(0 | 100) => None,
                Ok(p) if p < 100 => Some(p),
                _ => {
                    return Err(bad(
                        dra::COMPUTE,
                        &v,
                        "not a whole percent from 0 to 100".into(),
                    ))
                }
            },
        };
        out.push(Allocated {
            request: r.request.clone(),
            more_requests: vec![],
            device: r.device.clone(),
            gpu: gpu.clone(),
            settings: GpuSettings {
                memory_limit: Some(memory),
                compute_request: compute,
                ..Default::default()
            },
        });
    }
    if out.is_empty() {
        return Err(AllocationError::NoDevice {
            claim: name,
            driver: driver.to_string(),
        });
    }
    merge(&name, out)
}

/// One device per GPU, in the order of their first request: the requests on one GPU answered together,
/// their memory summed (at most the GPU's), their compute requests summed (one without is 0; no share
/// when the sum is the whole GPU's time).
fn merge(claim: &str, devices: Vec<Allocated>) -> Result<Vec<Allocated>, AllocationError> {
    let mut out: Vec<Allocated> = Vec::new();
    for d in devices {
        let Some(o) = out.iter_mut().find(|o| o.device == d.device) else {
            out.push(d);
            continue;
        };
        o.more_requests.push(d.request);
        let memory = o
            .settings
            .memory_limit
            .unwrap_or(0)
            .saturating_add(d.settings.memory_limit.unwrap_or(0));
        if memory > o.gpu.total_memory {
            return Err(AllocationError::Capacity {
                claim: claim.to_string(),
                device: o.device.clone(),
                capacity: dra::MEMORY,
                value: memory.to_string(),
                why: "its requests together consume more than the GPU has".into(),
            });
        }
        o.settings.memory_limit = Some(memory);
        let sum = o.settings.compute_request.unwrap_or(0) + d.settings.compute_request.unwrap_or(0);
        o.settings.compute_request = (1..100).contains(&sum).then_some(sum);
    }
    Ok(out)
}

/// The uids of the pods the claim is reserved for (`status.reservedFor` entries of core `pods`), the
/// only pods whose containers the hook lets use the claim's devices. The kubelet prepares a claim for a
/// pod only once the pod is in that list, so it is never empty when a pod is started.
pub fn consumers(claim: &ResourceClaim) -> Result<Vec<String>, AllocationError> {
    let pods: Vec<String> = claim
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.as_ref())
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter(|r| r.resource == "pods" && r.api_group.as_deref().unwrap_or_default().is_empty())
        .map(|r| r.uid.clone())
        .filter(|u| !u.is_empty())
        .collect();
    if pods.is_empty() {
        return Err(AllocationError::NoPod {
            claim: format!(
                "{}/{}",
                claim.metadata.namespace.as_deref().unwrap_or_default(),
                claim.metadata.name.as_deref().unwrap_or_default()
            ),
        });
    }
    Ok(pods)
}

/// The quota the devices fix, as the hook reads it (`VGPU_CLAIM_QUOTA`): one setting for every GPU when
/// the devices agree, else one per GPU in the devices' order (the order of the CDI devices prepare
/// returns, which is the container's GPU order).
pub fn quota(devices: &[Allocated]) -> String {
    let same = devices.windows(2).all(|w| w[0].settings == w[1].settings);
    let mut out = Vec::new();
    for (i, d) in devices.iter().enumerate() {
        let key = |base: &str| {
            if same {
                base.to_string()
            } else {
                keys::per_gpu_annotation(base, i as u32)
            }
        };
        if let Some(bytes) = d.settings.memory_limit {
            out.push(format!("{}={bytes}", key(annotation::MEMORY_LIMIT)));
        }
        if let Some(p) = d.settings.compute_request {
            out.push(format!("{}={p}", key(annotation::COMPUTE_REQUEST)));
        }
        if same {
            break;
        }
    }
    out.join(",")
}

#[cfg(test)]
mod tests;
