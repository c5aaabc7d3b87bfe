//! Deciding a container's quota: its request (`crate::request`, read once from the spec) checked against
//! the GPUs it gets (`crate::gpus`) and the node's policy for GPU containers without a quota. Not here:
//! asking NVML (`vgpu_host::nvml`, through `crate::create`), acting on the plan.
//!
//! Every check happens here, before anything is written anywhere.

use crate::gpus;
use crate::memory_request;
use crate::request::{Request, RequestError, SpecFacts};
use vgpu_host::nvml::{HostGpu, NvmlError};
use vgpu_host::request::GpuRequest;
use vgpu_ledger::format_bytes;
use vgpu_ledger::keys;
use vgpu_ledger::{GpuSettings, MemoryMode};

/// A validated quota.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The container's limited GPUs, each with what it gets there (a memory quota, a compute share, or
    /// both): the request's values for the GPU, the node's default quota, each container-wide value where
    /// it applies.
    pub gpus: Vec<GpuRequest>,
    /// The Kubernetes names from the annotations, recorded for the monitor.
    pub kubernetes: Option<vgpu_ledger::KubeNames>,
}

impl Plan {
    /// The unified-memory mode of the container's memory quotas (one mode per container, `tied` to each
    /// quota): its first GPU with a quota's; plain when none has one.
    pub fn memory_mode(&self) -> MemoryMode {
        self.gpus
            .iter()
            .find(|g| g.settings.memory_limit.is_some())
            .map(|g| g.settings.memory)
            .unwrap_or_default()
    }
}

pub use vgpu_host::config::Unquoted;

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
    let request = Request::read(facts)?;
    let (q, c, in_pod) = (&request.memory, &request.compute, request.in_pod);
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
        let settings = GpuSettings {
            memory_limit: memory_limit.map(|r| r.bytes),
            ..request.settings_for(i)
        }
        .tied();
        if settings.is_unlimited() {
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
        out.push(GpuRequest {
            index: i,
            uuid: g.uuid.clone(),
            settings,
        });
    }
    crate::pod_keys::check_names(&facts.annotations)?;
    Ok(Some(Plan {
        gpus: out,
        kubernetes: request.kubernetes,
    }))
}

#[cfg(test)]
mod tests;
