//! What `vgpuctl update` asks and what it changes: the options read with the annotations' grammar and
//! one-line errors, the request applied to a container's limits (pure: no file, no lock). What admission
//! checks is the changed limits' GPUs (`vgpu_host::request::GpuRequest::of_limits`). Not here: the lock,
//! the files (`update::apply`).

use serde::Serialize;
use vgpu_host::compute_share::{parse_annotation_percent, parse_request_percent};
use vgpu_ledger::envcompute::parse_window;
use vgpu_ledger::limits::{DeviceLimit, Limits};
use vgpu_ledger::GpuSettings;

/// Why an update is refused. Each is one line; nothing was changed.
#[derive(Debug, thiserror::Error)]
pub enum UpdateError {
    #[error("nothing to change: give --memory-limit, --compute-limit, --compute-request or --compute-window")]
    NothingAsked,
    /// A value the annotations' grammar refuses (the message names the option).
    #[error("{0}")]
    Value(String),
    #[error("--compute-limit=100: a compute share cannot be removed from a running container (100 is no share); recreate it without one")]
    RemoveShare,
    #[error("container {id} has no GPU {index} (its GPUs: {have})")]
    NoSuchGpu {
        id: String,
        index: u32,
        have: String,
    },
    #[error("container {id}'s GPU {index} ({uuid}) has no memory quota: one cannot be added to a running container")]
    NoMemoryQuota {
        id: String,
        index: u32,
        uuid: String,
    },
    #[error("container {id}'s GPU {index} ({uuid}) has no compute share: one cannot be added to a running container")]
    NoShare {
        id: String,
        index: u32,
        uuid: String,
    },
    #[error("container {id}'s GPU {index} ({uuid}) has a compute request alone (its limit is the whole GPU): a limit cannot be added to a running container")]
    NoLimit {
        id: String,
        index: u32,
        uuid: String,
    },
    #[error("--compute-request: container {id}'s GPU {index} ({uuid}) would have a compute request of {request}% above its compute limit of {limit}%: a request is at most its limit (give --compute-request and --compute-limit together)")]
    RequestAboveLimit {
        id: String,
        index: u32,
        uuid: String,
        request: u32,
        limit: u32,
    },
    #[error("--memory-limit: {} is larger than the container's GPU {index} ({uuid}, {})", vgpu_ledger::format_bytes(*asked), vgpu_ledger::format_bytes(*total))]
    LargerThanGpu {
        index: u32,
        uuid: String,
        asked: u64,
        total: u64,
    },
}

/// What was asked: each setting for every GPU of the container, or for `gpu` alone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Request {
    pub gpu: Option<u32>,
    /// The values asked, as the GPUs' settings hold them (`vgpu_ledger::settings`): `memory_limit`,
    /// `compute_limit`, `compute_request` and `compute_window_ms` where given. The mode and the policy are no options of
    /// update: they stay unset (their defaults) and are never applied.
    pub settings: GpuSettings,
}

impl Request {
    /// Reads the options as the annotations are read (`vgpu.io/memory-limit`, `vgpu.io/compute-limit`,
    /// `vgpu.io/compute-request`, `vgpu.io/compute-window`): the same grammar, the same floor, the error
    /// naming the option.
    pub fn parse(
        gpu: Option<u32>,
        memory: Option<&str>,
        compute: Option<&str>,
        request: Option<&str>,
        window: Option<&str>,
    ) -> Result<Request, UpdateError> {
        if memory.is_none() && compute.is_none() && request.is_none() && window.is_none() {
            return Err(UpdateError::NothingAsked);
        }
        let compute_request = request
            .map(|v| parse_request_percent(v, "--compute-request"))
            .transpose()
            .map_err(|e| UpdateError::Value(e.to_string()))?;
        let memory_limit = memory
            .map(|v| vgpu_host::memory_limit::parse(v, "--memory-limit"))
            .transpose()
            .map_err(|e| UpdateError::Value(e.to_string()))?;
        let compute_limit = match compute {
            None => None,
            Some(v) => Some(
                parse_annotation_percent(v, "--compute-limit")
                    .map_err(|e| UpdateError::Value(e.to_string()))?
                    .ok_or(UpdateError::RemoveShare)?,
            ),
        };
        let compute_window_ms = window
            .map(|v| parse_window(v, "--compute-window"))
            .transpose()
            .map_err(|e| UpdateError::Value(e.to_string()))?;
        Ok(Request {
            gpu,
            settings: GpuSettings {
                memory_limit,
                compute_limit,
                compute_request,
                compute_window_ms,
                ..Default::default()
            },
        })
    }
}

/// One setting of one GPU that changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Change {
    pub gpu: u32,
    pub uuid: String,
    /// `memory_limit` (bytes), `compute_limit` or `compute_request` (percent) or `compute_window_ms`.
    pub setting: &'static str,
    pub from: Option<u64>,
    pub to: u64,
}

/// `limits` with `req` applied, and what changed. The memory quota of a GPU is set only where it has one,
/// the share's limit only where it has one, its request and window only where it has a share (a limit
/// or a request): adding either to a running container is refused (its processes have set up their
/// devices without it). A request ends at most the limit. `gpu_total`: a GPU's memory by UUID, when
/// known.
pub fn apply(
    limits: &Limits,
    req: &Request,
    gpu_total: impl Fn(&str) -> Option<u64>,
) -> Result<(Limits, Vec<Change>), UpdateError> {
    let id = &limits.container_id;
    if let Some(i) = req
        .gpu
        .filter(|&i| !limits.devices.iter().any(|d| d.index == i))
    {
        return Err(UpdateError::NoSuchGpu {
            id: id.clone(),
            index: i,
            have: limits
                .devices
                .iter()
                .map(|d| d.index.to_string())
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    let mut out = limits.clone();
    let mut changes = vec![];
    for d in out
        .devices
        .iter_mut()
        .filter(|d| req.gpu.is_none() || req.gpu == Some(d.index))
    {
        let (index, uuid) = (d.index, d.uuid.clone());
        let refuse = |share: bool| {
            let (id, uuid) = (id.clone(), uuid.clone());
            if share {
                UpdateError::NoShare { id, index, uuid }
            } else {
                UpdateError::NoMemoryQuota { id, index, uuid }
            }
        };
        let asked = &req.settings;
        if let Some(bytes) = asked.memory_limit {
            let Some(old) = d.settings.memory_limit else {
                return Err(refuse(false));
            };
            if let Some(total) = gpu_total(&d.uuid).filter(|&t| bytes > t) {
                return Err(UpdateError::LargerThanGpu {
                    index: d.index,
                    uuid: d.uuid.clone(),
                    asked: bytes,
                    total,
                });
            }
            set_memory(d, old, bytes, &mut changes);
        }
        let compute = asked.compute_limit.is_some()
            || asked.compute_request.is_some()
            || asked.compute_window_ms.is_some();
        if compute {
            let Some((old_request, _)) = d.settings.request_limit() else {
                return Err(refuse(true));
            };
            if let Some(p) = asked.compute_limit {
                let Some(old) = d.settings.compute_limit else {
                    return Err(UpdateError::NoLimit {
                        id: id.clone(),
                        index,
                        uuid: uuid.clone(),
                    });
                };
                if p != old {
                    changes.push(change(d, "compute_limit", Some(old as u64), p as u64));
                    d.settings.compute_limit = Some(p);
                }
            }
            if let Some(r) = asked.compute_request {
                if d.settings.compute_request != Some(r) {
                    let from = Some(old_request as u64);
                    changes.push(change(d, "compute_request", from, r as u64));
                    d.settings.compute_request = Some(r);
                }
            }
            if let Some((request, limit)) = d
                .settings
                .compute_request
                .map(|r| (r, d.settings.compute_limit.unwrap_or(100)))
                .filter(|(r, l)| r > l)
            {
                return Err(UpdateError::RequestAboveLimit {
                    id: id.clone(),
                    index,
                    uuid,
                    request,
                    limit,
                });
            }
            let old_window = d.settings.compute_window_ms;
            if let Some(w) = asked.compute_window_ms.filter(|&w| Some(w) != old_window) {
                changes.push(change(
                    d,
                    "compute_window_ms",
                    old_window.map(u64::from),
                    w as u64,
                ));
                d.settings.compute_window_ms = Some(w);
            }
        }
    }
    Ok((out, changes))
}

/// A memory quota set from `old` to `new`: a shrink remembers the highest quota not yet grown back past
/// (`shrunk_from`, the watchdog's pending shrink); a grow to it or past it forgets it, and what the
/// container held at the shrink with it (`held_at_shrink`, which the caller measures at each shrink; a
/// grow short of `shrunk_from` keeps it).
fn set_memory(d: &mut DeviceLimit, old: u64, new: u64, changes: &mut Vec<Change>) {
    if new == old {
        return;
    }
    changes.push(change(d, "memory_limit", Some(old), new));
    d.settings.memory_limit = Some(new);
    d.shrunk_from = match d.shrunk_from.max(Some(old)) {
        Some(from) if from > new => Some(from),
        _ => None,
    };
    if d.shrunk_from.is_none() {
        d.held_at_shrink = None;
    }
}

fn change(d: &DeviceLimit, setting: &'static str, from: Option<u64>, to: u64) -> Change {
    Change {
        gpu: d.index,
        uuid: d.uuid.clone(),
        setting,
        from,
        to,
    }
}
