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

use std::collections::BTreeMap;
use vgpu_ledger::envcompute::{
    self, parse_annotation_percent, parse_window, EnvCompute, PercentError, Policy, WindowError,
};
use vgpu_ledger::envlimits::EnvLimitError;
use vgpu_ledger::keys::{annotation, env};

use crate::pod_keys::{keyed, KeyFormError, PodMember};

/// One share asked for and where it came from (for error messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    /// Percent of the GPU's time, 1..=99; None: no share on these GPUs (100, or env 0).
    pub percent: Option<u32>,
    pub source: String,
}

/// The compute request of one container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ComputeRequest {
    /// The share of every GPU without a per-GPU entry.
    pub all: Option<Share>,
    /// Per-GPU shares by the container's GPU index.
    pub per_gpu: BTreeMap<usize, Share>,
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
    /// A malformed window (the grammar's line).
    #[error(transparent)]
    Window(#[from] WindowError),
}

impl ComputeRequest {
    /// The share of the container's GPU `i`, if it has one.
    pub fn share_for(&self, i: usize) -> Option<&Share> {
        self.per_gpu
            .get(&i)
            .or(self.all.as_ref())
            .filter(|s| s.percent.is_some())
    }

    /// Every setting that asks for a share, the one for every GPU first.
    pub fn shares(&self) -> impl Iterator<Item = &Share> {
        self.all
            .iter()
            .chain(self.per_gpu.values())
            .filter(|s| s.percent.is_some())
    }

    /// True when no GPU gets a share.
    pub fn is_empty(&self) -> bool {
        self.shares().next().is_none()
    }

    /// The first per-GPU share for a GPU at index `n` or above.
    pub fn first_beyond(&self, n: usize) -> Option<(usize, &Share)> {
        self.per_gpu
            .range(n..)
            .find(|(_, s)| s.percent.is_some())
            .map(|(&i, s)| (i, s))
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
    let (keys, for_container) = keyed(annotations, member, annotation::COMPUTE_LIMIT)?;
    let mut req = ComputeRequest {
        for_container,
        policy,
        window_ms,
        ..Default::default()
    };
    if keys.is_empty() {
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
    }
    if policy == Policy::Disable {
        req.all = None;
        req.per_gpu.clear();
    }
    Ok(req)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::kv;

    fn from_spec(
        annotations: &[(String, String)],
        env: &[(String, String)],
    ) -> Result<ComputeRequest, ComputeRequestError> {
        read(annotations, env, PodMember::of(annotations))
    }

    fn req(
        ann: &[(&str, &str)],
        env: &[(&str, &str)],
    ) -> Result<ComputeRequest, ComputeRequestError> {
        from_spec(&kv(ann), &kv(env))
    }

    fn pct(r: &ComputeRequest, i: usize) -> Option<u32> {
        r.share_for(i).and_then(|s| s.percent)
    }

    #[test]
    fn annotations_per_gpu_and_for_every_gpu() {
        let r = req(
            &[
                ("vgpu.io/compute-limit", "30"),
                ("vgpu.io/compute-limit.1", "70"),
                ("vgpu.io/compute-limit.2", "100"),
            ],
            &[("CUDA_DEVICE_SM_LIMIT", "10")],
        )
        .unwrap();
        assert_eq!(
            (pct(&r, 0), pct(&r, 1), pct(&r, 2)),
            (Some(30), Some(70), None)
        );
        assert_eq!(
            r.share_for(1).unwrap().source,
            "annotation vgpu.io/compute-limit.1"
        );
        assert_eq!(r.policy, Policy::Default);
        // 100 alone is no share at all, and still the annotations' decision: the env is not read.
        let r = req(
            &[("vgpu.io/compute-limit", "100")],
            &[("CUDA_DEVICE_SM_LIMIT", "10")],
        )
        .unwrap();
        assert!(r.is_empty());
    }

    #[test]
    fn the_environment_as_hami_reads_it() {
        let r = req(
            &[],
            &[
                ("CUDA_DEVICE_SM_LIMIT", "30"),
                ("CUDA_DEVICE_SM_LIMIT_1", "0"),
                ("CUDA_DEVICE_SM_LIMIT_2", "50"),
            ],
        )
        .unwrap();
        assert_eq!(
            (pct(&r, 0), pct(&r, 1), pct(&r, 2)),
            (Some(30), None, Some(50))
        );
        assert_eq!(r.share_for(2).unwrap().source, "env CUDA_DEVICE_SM_LIMIT_2");
        assert!(req(&[], &[("CUDA_DEVICE_SM_LIMIT", "0")])
            .unwrap()
            .is_empty());
        assert!(req(&[], &[("CUDA_DEVICE_SM_LIMIT", "100")])
            .unwrap()
            .is_empty());
        assert!(req(&[], &[]).unwrap().is_empty());
    }

    #[test]
    fn the_policy_annotation_wins_and_disable_drops_every_share() {
        let r = req(
            &[("vgpu.io/compute-limit", "30")],
            &[("GPU_CORE_UTILIZATION_POLICY", "disable")],
        )
        .unwrap();
        assert!(r.is_empty());
        let r = req(
            &[
                ("vgpu.io/compute-limit", "30"),
                ("vgpu.io/compute-policy", "force"),
            ],
            &[("GPU_CORE_UTILIZATION_POLICY", "disable")],
        )
        .unwrap();
        assert_eq!((pct(&r, 0), r.policy), (Some(30), Policy::Force));
        let r = req(
            &[("vgpu.io/compute-policy", "Disable")],
            &[("CUDA_DEVICE_SM_LIMIT", "30")],
        )
        .unwrap();
        assert!(r.is_empty());
    }

    #[test]
    fn the_window_annotation_wins_over_the_env_and_absent_is_none() {
        let r = req(
            &[
                ("vgpu.io/compute-limit", "30"),
                ("vgpu.io/compute-window", "250ms"),
            ],
            &[("VGPU_COMPUTE_WINDOW", "2s")],
        )
        .unwrap();
        assert_eq!((pct(&r, 0), r.window_ms), (Some(30), Some(250)));
        // The env alone (the last of a variable wins, as for the other variables); with the env's share.
        let r = req(
            &[],
            &[
                ("CUDA_DEVICE_SM_LIMIT", "30"),
                ("VGPU_COMPUTE_WINDOW", "100ms"),
                ("VGPU_COMPUTE_WINDOW", "2s"),
            ],
        )
        .unwrap();
        assert_eq!((pct(&r, 0), r.window_ms), (Some(30), Some(2000)));
        // The env's window goes with an annotation's share too: it is container-wide, as the policy.
        let r = req(
            &[("vgpu.io/compute-limit", "30")],
            &[("VGPU_COMPUTE_WINDOW", "10s")],
        )
        .unwrap();
        assert_eq!(r.window_ms, Some(10_000));
        let r = req(&[("vgpu.io/compute-limit", "30")], &[]).unwrap();
        assert_eq!(r.window_ms, None);
        // A window without a share asks for nothing.
        let r = req(&[("vgpu.io/compute-window", "250ms")], &[]).unwrap();
        assert!(r.is_empty());
    }

    #[test]
    fn a_pods_containers_get_their_own_shares_or_the_pods_default() {
        let pod = |name: &str| {
            kv(&[
                ("io.kubernetes.cri.container-name", name),
                ("vgpu.io/compute-limit", "20"),
                ("vgpu.io/compute-limit.trainer", "60"),
                ("vgpu.io/compute-limit.trainer.1", "100"),
            ])
        };
        let r = from_spec(&pod("trainer"), &[]).unwrap();
        assert!(r.for_container);
        assert_eq!((pct(&r, 0), pct(&r, 1)), (Some(60), None));
        let r = from_spec(&pod("web"), &[]).unwrap();
        assert!(!r.for_container);
        assert_eq!((pct(&r, 0), pct(&r, 1)), (Some(20), Some(20)));
    }

    #[test]
    fn bad_values_are_the_variant_of_their_setting() {
        use ComputeRequestError as E;
        let kind = |ann: (&str, &str), env: (&str, &str)| match req(&[ann], &[env]).unwrap_err() {
            E::Key(_) => "key",
            E::Env(e) => {
                assert_eq!(e.var, env.0);
                "env"
            }
            E::Policy { key, .. } => {
                assert_eq!(key, ann.0);
                "policy"
            }
            E::Percent(_) => "percent",
            E::Window(_) => "window",
        };
        let none = ("", "");
        assert_eq!(kind(("vgpu.io/compute-limit", "0"), none), "percent");
        assert_eq!(kind(("vgpu.io/compute-limit.0", "30%"), none), "percent");
        assert_eq!(kind(("vgpu.io/compute-limit.trainer", "30"), none), "key");
        assert_eq!(
            kind(("vgpu.io/compute-policy", "sometimes"), none),
            "policy"
        );
        assert_eq!(kind(("x", ""), ("CUDA_DEVICE_SM_LIMIT", "150")), "env");
        assert_eq!(
            kind(("x", ""), ("GPU_CORE_UTILIZATION_POLICY", "sometimes")),
            "env"
        );
        assert_eq!(kind(("vgpu.io/compute-window", "1m"), none), "window");
        // Even under disable, a typo is seen.
        assert_eq!(
            kind(
                ("vgpu.io/compute-policy", "disable"),
                ("CUDA_DEVICE_SM_LIMIT_x", "30")
            ),
            "env"
        );
    }

    /// The lines users read (the e2e suites match several): one line, naming the setting and its value.
    #[test]
    fn bad_values_are_one_line_naming_the_setting() {
        for (ann, env, want) in [
            (
                ("vgpu.io/compute-limit", "0"),
                ("", ""),
                "annotation vgpu.io/compute-limit=\"0\": a compute limit is a whole percent",
            ),
            (
                ("vgpu.io/compute-limit.0", "30%"),
                ("", ""),
                "annotation vgpu.io/compute-limit.0=\"30%\"",
            ),
            (
                ("vgpu.io/compute-limit", ""),
                ("", ""),
                "annotation vgpu.io/compute-limit=\"\": a compute limit is a whole percent",
            ),
            (
                ("vgpu.io/compute-limit.trainer", "30"),
                ("", ""),
                "annotation vgpu.io/compute-limit.trainer: \"trainer\" is not a GPU index",
            ),
            (
                ("vgpu.io/compute-policy", "sometimes"),
                ("", ""),
                "annotation vgpu.io/compute-policy=\"sometimes\": expected force, disable or default",
            ),
            (
                ("x", ""),
                ("CUDA_DEVICE_SM_LIMIT", "150"),
                "env CUDA_DEVICE_SM_LIMIT=\"150\": not a whole percent",
            ),
            (
                ("x", ""),
                ("GPU_CORE_UTILIZATION_POLICY", "sometimes"),
                "env GPU_CORE_UTILIZATION_POLICY=\"sometimes\"",
            ),
            (
                ("vgpu.io/compute-window", "1m"),
                ("", ""),
                "annotation vgpu.io/compute-window=\"1m\": unknown unit; a compute window is a whole number of ms or s, 10ms to 10s",
            ),
            // The annotation is read (and refused) before the env's good value.
            (
                ("vgpu.io/compute-window", "250"),
                ("VGPU_COMPUTE_WINDOW", "250ms"),
                "annotation vgpu.io/compute-window=\"250\": no unit",
            ),
            (
                ("x", ""),
                ("VGPU_COMPUTE_WINDOW", "20s"),
                "env VGPU_COMPUTE_WINDOW=\"20s\": out of range",
            ),
            // Even under disable, a typo is seen.
            (
                ("vgpu.io/compute-policy", "disable"),
                ("VGPU_COMPUTE_WINDOW", "1.5s"),
                "env VGPU_COMPUTE_WINDOW=\"1.5s\": not a whole number",
            ),
            (
                ("vgpu.io/compute-policy", "disable"),
                ("CUDA_DEVICE_SM_LIMIT_x", "30"),
                "env CUDA_DEVICE_SM_LIMIT_x",
            ),
        ] {
            let e = req(&[ann], &[env]).unwrap_err().to_string();
            assert!(e.starts_with(want), "{e} (wanted {want})");
            assert!(!e.contains('\n'), "{e}");
        }
    }
}
