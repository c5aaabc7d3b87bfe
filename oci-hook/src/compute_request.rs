//! The compute share a container asks for, per GPU, with its container-wide policy and pacing window, from
//! its annotations or its environment. Not here: checking it against the container's GPUs (`crate::plan`),
//! the key forms (`crate::pod_keys`), the environment's grammar (`vgpu_ledger::envcompute`), or enforcing
//! it (the library, from limits.json).
//!
//! Annotations `vgpu.io/compute-limit` (every GPU), `vgpu.io/compute-limit.<i>` (the container's i-th
//! GPU) and, in a pod, `vgpu.io/compute-limit.<container>[.<i>]` — the memory limit's forms — a whole
//! percent 1..=100 (100: no share on those GPUs; 0 or empty is an error: leave the key out for none). Or
//! env `CUDA_DEVICE_SM_LIMIT` / `CUDA_DEVICE_SM_LIMIT_<i>` (HAMi's; `0` or `100` is no share). When any
//! compute-limit annotation decides the container, its env shares are ignored (one source decides, as for
//! memory). The policy: annotation `vgpu.io/compute-policy`, else env `GPU_CORE_UTILIZATION_POLICY`;
//! `disable` drops every share. The pacing window, container-wide like the policy: annotation
//! `vgpu.io/compute-window`, else env `VGPU_COMPUTE_WINDOW` (`vgpu_ledger::envcompute::parse_window`:
//! `250ms`, `2s`); it goes with the shares, and without one it changes nothing (as the policy alone).
//!
//! The request (the floor) beside the limit (the cap): annotations `vgpu.io/compute-request` in the
//! limit's forms, or env `CUDA_DEVICE_SM_REQUEST` / `CUDA_DEVICE_SM_REQUEST_<i>`, a whole percent
//! 1..=100. Each setting is resolved on its own among a pod's keys (the keys naming this container decide
//! its limit, and apart from them its request), but one source decides both: when any compute-limit or
//! compute-request annotation decides the container, its env's limits and requests are ignored. A
//! request above the limit of its GPU (none: 100) is an error naming both settings. A limit alone is
//! its own request; a request alone has the limit 100 (`vgpu_ledger::settings::GpuSettings`).

use std::collections::BTreeMap;
use vgpu_host::compute_share::{parse_annotation_percent, parse_request_percent, PercentError};
use vgpu_ledger::envcompute::{
    self, parse_window, EnvCompute, Policy, RequestAboveLimit, WindowError,
};
use vgpu_ledger::envlimits::EnvLimitError;
use vgpu_ledger::keys::{annotation, env};

use crate::pod_keys::{keyed, KeyFormError, PodMember};

/// One share's limit or request asked for and where it came from (for error messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    /// A limit: percent of the GPU's time, 1..=99; None: no limit on these GPUs (100, or env 0). A
    /// request: 1..=100, never None.
    pub percent: Option<u32>,
    pub source: String,
}

/// The compute request of one container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ComputeRequest {
    /// The limit of every GPU without a per-GPU entry.
    pub all: Option<Share>,
    /// Per-GPU limits by the container's GPU index.
    pub per_gpu: BTreeMap<usize, Share>,
    /// The request of every GPU without a per-GPU entry.
    pub request_all: Option<Share>,
    /// Per-GPU requests by the container's GPU index.
    pub request_per_gpu: BTreeMap<usize, Share>,
    /// The shares come from keys naming this container of a pod (not the pod's default).
    pub for_container: bool,
    /// `force` or `default` (`disable` leaves no share at all).
    pub policy: Policy,
    /// The shares' pacing window in ms; None: not set (the library's default).
    pub window_ms: Option<u32>,
}

/// A compute setting that cannot be read. `Display` is one line naming the setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ComputeRequestError {
    #[error(transparent)]
    Key(#[from] KeyFormError),
    /// A malformed share or policy variable.
    #[error("env {0}")]
    Env(EnvLimitError),
    #[error("annotation {key}={value:?}: expected force, disable or default")]
    Policy { key: String, value: String },
    /// A share annotation that is no whole percent 1..=100 (the grammar's line).
    #[error(transparent)]
    Percent(#[from] PercentError),
    /// A request above the limit of its GPU (both settings named).
    #[error(transparent)]
    AboveLimit(#[from] RequestAboveLimit),
    /// A malformed window (the grammar's line).
    #[error(transparent)]
    Window(#[from] WindowError),
}

impl ComputeRequest {
    /// The limit of the container's GPU `i`, if it has one.
    pub fn share_for(&self, i: usize) -> Option<&Share> {
        self.per_gpu
            .get(&i)
            .or(self.all.as_ref())
            .filter(|s| s.percent.is_some())
    }

    /// The request of the container's GPU `i`, if it has one.
    pub fn request_for(&self, i: usize) -> Option<&Share> {
        self.request_per_gpu.get(&i).or(self.request_all.as_ref())
    }

    /// Every setting that asks for a share (a limit below 100, or a request), the limits first and the
    /// ones for every GPU before the per-GPU ones.
    pub fn shares(&self) -> impl Iterator<Item = &Share> {
        self.all
            .iter()
            .chain(self.per_gpu.values())
            .chain(self.request_all.iter())
            .chain(self.request_per_gpu.values())
            .filter(|s| s.percent.is_some())
    }

    /// True when no GPU gets a share.
    pub fn is_empty(&self) -> bool {
        self.shares().next().is_none()
    }

    /// The first per-GPU limit or request for a GPU at index `n` or above.
    pub fn first_beyond(&self, n: usize) -> Option<(usize, &Share)> {
        self.per_gpu
            .range(n..)
            .chain(self.request_per_gpu.range(n..))
            .filter(|(_, s)| s.percent.is_some())
            .min_by_key(|(&i, _)| i)
            .map(|(&i, s)| (i, s))
    }

    /// Every request is at most the limit of its GPU (none: 100): checked for every GPU a per-GPU
    /// setting names and for the others (the settings for every GPU). The first that is not is the
    /// error, naming both settings.
    fn check_requests(&self) -> Result<(), RequestAboveLimit> {
        let named = self.per_gpu.keys().chain(self.request_per_gpu.keys());
        for i in std::iter::once(None).chain(named.map(|&i| Some(i))) {
            let request = i
                .and_then(|i| self.request_per_gpu.get(&i))
                .or(self.request_all.as_ref());
            let limit = i.and_then(|i| self.per_gpu.get(&i)).or(self.all.as_ref());
            let (Some(r), Some(l)) = (request, limit) else {
                continue;
            };
            let (Some(rp), Some(lp)) = (r.percent, l.percent) else {
                continue;
            };
            if rp > lp {
                return Err(RequestAboveLimit {
                    request: r.source.clone(),
                    value: rp,
                    limit: l.source.clone(),
                    limit_value: lp,
                });
            }
        }
        Ok(())
    }
}

/// Reads the share from the annotations deciding the container `member` (winning) or the spec's env, and
/// the policy and the window. A malformed value is an error, even under `disable` (a typo must be seen).
pub fn read(
    annotations: &[(String, String)],
    vars: &[(String, String)],
    member: PodMember,
) -> Result<ComputeRequest, ComputeRequestError> {
    let from_env = EnvCompute::parse(vars).map_err(ComputeRequestError::Env)?;
    let policy = match annotations
        .iter()
        .rev()
        .find(|(k, _)| k == annotation::COMPUTE_POLICY)
    {
        Some((k, v)) => Policy::parse(v).ok_or_else(|| ComputeRequestError::Policy {
            key: k.clone(),
            value: v.clone(),
        })?,
        None => from_env.policy,
    };
    // The last of a key wins, in the annotations as in the env.
    let window_ms = match annotations
        .iter()
        .rev()
        .find(|(k, _)| k == annotation::COMPUTE_WINDOW)
        .map(|(k, v)| (format!("annotation {k}"), v))
        .or_else(|| {
            vars.iter()
                .rev()
                .find(|(k, _)| k == env::COMPUTE_WINDOW)
                .map(|(k, v)| (format!("env {k}"), v))
        }) {
        Some((source, v)) => Some(parse_window(v, &source).map_err(ComputeRequestError::Window)?),
        None => None,
    };
    let (keys, limit_mine) = keyed(annotations, member, annotation::COMPUTE_LIMIT)?;
    let (requests, request_mine) = keyed(annotations, member, annotation::COMPUTE_REQUEST)?;
    let mut req = ComputeRequest {
        for_container: limit_mine || request_mine,
        policy,
        window_ms,
        ..Default::default()
    };
    if keys.is_empty() && requests.is_empty() {
        let share = |var: String, pct: u32| Share {
            percent: (1..100).contains(&pct).then_some(pct),
            source: format!("env {var}"),
        };
        req.all = from_env
            .global
            .map(|p| share(envcompute::SM_LIMIT_VAR.to_string(), p));
        req.per_gpu = from_env
            .per_index
            .iter()
            .map(|(&i, &p)| {
                (
                    i as usize,
                    share(vgpu_ledger::keys::per_gpu_var(env::SM_LIMIT, i), p),
                )
            })
            .collect();
        // The grammar took 1..=100 only.
        let request = |var: String, pct: u32| Share {
            percent: Some(pct),
            source: format!("env {var}"),
        };
        req.request_all = from_env
            .request_global
            .map(|p| request(envcompute::SM_REQUEST_VAR.to_string(), p));
        req.request_per_gpu = from_env
            .request_per_index
            .iter()
            .map(|(&i, &p)| {
                (
                    i as usize,
                    request(vgpu_ledger::keys::per_gpu_var(env::SM_REQUEST, i), p),
                )
            })
            .collect();
    } else {
        for k in keys {
            let source = format!("annotation {}", k.key);
            let percent =
                parse_annotation_percent(k.value, &source).map_err(ComputeRequestError::Percent)?;
            let s = Share { percent, source };
            match k.gpu {
                None => req.all = Some(s),
                Some(i) => {
                    req.per_gpu.insert(i, s);
                }
            }
        }
        for k in requests {
            let source = format!("annotation {}", k.key);
            let percent =
                parse_request_percent(k.value, &source).map_err(ComputeRequestError::Percent)?;
            let s = Share {
                percent: Some(percent),
                source,
            };
            match k.gpu {
                None => req.request_all = Some(s),
                Some(i) => {
                    req.request_per_gpu.insert(i, s);
                }
            }
        }
    }
    // Even under disable, a request above its limit is seen (as a typo is).
    req.check_requests()?;
    if policy == Policy::Disable {
        req.all = None;
        req.per_gpu.clear();
        req.request_all = None;
        req.request_per_gpu.clear();
    }
    Ok(req)
}

#[cfg(test)]
mod tests;
