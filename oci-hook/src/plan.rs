//! Deciding a container's quota: its request (`crate::request`, read once from the spec) checked against
//! the GPUs it gets (`crate::gpus`) and the node's policy for GPU containers without a quota. Not here:
//! asking NVML (`crate::host_gpus`, through `crate::create`), acting on the plan.
//!
//! Every check happens here, before anything is written anywhere.

use crate::gpus;
use crate::host_gpus::{HostGpu, NvmlError};
use crate::memory_request;
use crate::request::{Request, RequestError, SpecFacts};
use vgpu_ledger::envcompute::Policy;
use vgpu_ledger::format_bytes;
use vgpu_ledger::keys;
use vgpu_ledger::MemoryMode;

/// One limited GPU of the container: a memory quota, a compute share, or both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedGpu {
    /// The container's GPU index.
    pub index: usize,
    pub uuid: String,
    /// Bytes; None: no memory quota on this GPU (a compute share alone).
    pub memory_limit: Option<u64>,
    /// Percent of the GPU's time, 1..=99.
    pub compute_limit: Option<u32>,
}

/// A validated quota.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub gpus: Vec<PlannedGpu>,
    /// The Kubernetes names from the annotations, recorded for the monitor.
    pub kubernetes: Option<vgpu_ledger::KubeNames>,
    /// The unified-memory mode of every GPU of the container (`vgpu_ledger::memmode`): the
    /// `vgpu.io/memory-*` annotations, else the environment's `VGPU_MEMORY_*` / `CUDA_OVERSUBSCRIBE`.
    pub memory: MemoryMode,
    /// How the compute shares apply (`force` or `default`; `disable` leaves none).
    pub compute_policy: Policy,
    /// The compute shares' pacing window in ms (`vgpu.io/compute-window` / `VGPU_COMPUTE_WINDOW`); None:
    /// not set, the library's default.
    pub compute_window_ms: Option<u32>,
}

pub use crate::config::Unquoted;

/// Why a container's quota cannot be planned. `Display` is one line naming the setting.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Request(#[from] RequestError),
    /// A Kubernetes name annotation Kubernetes would refuse (the names are recorded for the monitor).
    #[error(transparent)]
    Name(#[from] crate::pod_keys::NameError),
    /// Listing the host's GPUs failed.
    #[error(transparent)]
    Gpus(#[from] NvmlError),
    /// The container's GPUs cannot be told: a bad name, a GPU not on this host, or sources that disagree.
    #[error(transparent)]
    Select(#[from] gpus::SelectError),
    /// `require_memory_limit` and a GPU of the container without a memory quota (`index`: the container's
    /// GPU; `gpus`: what gives it the GPUs). A compute share alone is no memory quota.
    #[error("{gpus} gives the container its GPU {index} but it asks for no memory quota there, and this node requires one (require_memory_limit): set {} or {}", memory_request::ANNOTATION, memory_request::ENV)]
    QuotaRequired { gpus: String, index: usize },
    /// A setting asks for a limit but no GPU is named.
    #[error("{setting} is set but the container gets no GPU (name one with {}, a CDI device or a /dev/nvidiaN device)", keys::env::VISIBLE_DEVICES)]
    NoGpuNamed { setting: String },
    /// A setting asks for a limit but what names the GPUs (`gpus`) gives none.
    #[error("{setting} is set but {gpus} gives the container no GPU")]
    NoGpuGiven { setting: String, gpus: String },
    /// A per-GPU setting for a GPU past the container's `count`.
    #[error("{setting}: the container has no GPU {index}: it gets {count} GPU{} ({gpus})", if *.count == 1 { "" } else { "s" })]
    NoSuchGpu {
        setting: String,
        index: usize,
        count: usize,
        gpus: String,
    },
    /// A quota larger than its GPU.
    #[error("{setting}: {} is larger than the container's GPU {index} ({uuid}, {})", format_bytes(*.bytes), format_bytes(*.total))]
    LargerThanGpu {
        setting: String,
        bytes: u64,
        index: usize,
        uuid: String,
        total: u64,
    },
}

/// Decides the quota. `None` when the container asks for none. `host_gpus` is only called when needed,
/// so a node without NVML runs unquota'd containers fine.
pub fn plan(
    facts: &SpecFacts,
    host_gpus: impl FnOnce() -> Result<Vec<HostGpu>, NvmlError>,
) -> Result<Option<Plan>, PlanError> {
    plan_with(facts, Unquoted::Allow, host_gpus)
}

/// [`plan`] under the node's policy for GPU containers without a quota.
pub fn plan_with(
    facts: &SpecFacts,
    unquoted: Unquoted,
    host_gpus: impl FnOnce() -> Result<Vec<HostGpu>, NvmlError>,
) -> Result<Option<Plan>, PlanError> {
    let Request {
        memory: q,
        compute: c,
        mode: memory,
        in_pod,
        kubernetes,
    } = Request::read(facts)?;
    let select = || {
        gpus::from_spec(
            &facts.env,
            &facts.annotations,
            &facts.devices,
            &facts.mounts,
        )
    };
    // The node's policy (below, per GPU) needs the GPUs even when nothing is asked for.
    if q.is_empty() && c.is_empty() && (unquoted == Unquoted::Allow || select()?.is_none()) {
        return Ok(None);
    }
    // What asks for a limit, with whether it is a pod's default annotation (not naming this container).
    let asks: Vec<(&str, bool)> = q
        .limits()
        .map(|r| (r.source.as_str(), q.for_container))
        .chain(c.shares().map(|s| (s.source.as_str(), c.for_container)))
        .collect();
    let setting = asks.first().map(|a| a.0.to_string()).unwrap_or_default();
    let Some(sel) = select()? else {
        // A pod's annotations reach every container of the pod — the sandbox (pause) container and
        // sidecars too (containerd and CRI-O copy the ones a handler allows into each spec). A pod-level
        // quota or share is for the pod's GPU containers; the others are left untouched. A key that names
        // this very container is a mistake worth a line.
        let pod_default = asks
            .iter()
            .all(|(src, named)| src.starts_with("annotation ") && !named);
        if in_pod && pod_default {
            return Ok(None);
        }
        return Err(PlanError::NoGpuNamed { setting });
    };
    let host = host_gpus()?;
    let gpus = gpus::resolve(&sel, &host)?;
    if gpus.is_empty() && asks.is_empty() {
        // The node's policy alone, and no GPU (`void`): nothing to limit.
        return Ok(None);
    }
    if gpus.is_empty() {
        return Err(PlanError::NoGpuGiven {
            setting,
            gpus: sel.source,
        });
    }
    let beyond = q
        .first_beyond(gpus.len())
        .map(|(i, r)| (i, &r.source))
        .or_else(|| c.first_beyond(gpus.len()).map(|(i, s)| (i, &s.source)));
    if let Some((index, setting)) = beyond {
        return Err(PlanError::NoSuchGpu {
            setting: setting.clone(),
            index,
            count: gpus.len(),
            gpus: sel.source,
        });
    }
    // The node's policy is about memory quotas, and applies to each GPU: one with a compute share alone
    // (or an env zero) has no memory quota, so it gets default_memory_limit, or is refused under
    // require_memory_limit.
    let node_default = match unquoted {
        Unquoted::Default(bytes) => Some(memory_request::Requested {
            bytes,
            source: "config default_memory_limit".into(),
        }),
        _ => None,
    };
    let mut out = Vec::new();
    for (i, g) in gpus.iter().enumerate() {
        let memory_limit = match (q.limit_for(i), unquoted) {
            (Some(r), _) => Some(r),
            (None, Unquoted::Allow) => None,
            (None, Unquoted::Default(_)) => node_default.as_ref(),
            (None, _) => {
                return Err(PlanError::QuotaRequired {
                    gpus: sel.source,
                    index: i,
                })
            }
        };
        let compute_limit = c.share_for(i).and_then(|s| s.percent);
        if memory_limit.is_none() && compute_limit.is_none() {
            continue;
        }
        if let Some(r) = memory_limit.filter(|r| r.bytes > g.total_memory) {
            return Err(PlanError::LargerThanGpu {
                setting: r.source.clone(),
                bytes: r.bytes,
                index: i,
                uuid: g.uuid.clone(),
                total: g.total_memory,
            });
        }
        out.push(PlannedGpu {
            index: i,
            uuid: g.uuid.clone(),
            memory_limit: memory_limit.map(|r| r.bytes),
            compute_limit,
        });
    }
    crate::pod_keys::check_names(&facts.annotations)?;
    Ok(Some(Plan {
        gpus: out,
        kubernetes,
        memory,
        compute_policy: c.policy,
        compute_window_ms: c.window_ms,
    }))
}

#[cfg(test)]
mod tests;
