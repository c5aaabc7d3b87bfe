//! What a container asks of vgpu, read once from its spec into one typed value: per GPU its memory quota
//! (`crate::memory_request`) and compute share's limit and request (`crate::compute_request`); container-wide its
//! unified-memory mode, the shares' policy and window, whether it is a pod's, its Kubernetes names. Every
//! key is checked against the registry first (`crate::unknown_keys`). Not here: checking the request
//! against the container's GPUs (`crate::plan`).
//!
//! [`Request::settings_for`] turns it into one GPU's settings (`vgpu_ledger::GpuSettings`), which the plan
//! and limits.json carry whole. Adding a per-GPU value: its entry in `vgpu_ledger::keys`, its field in
//! `GpuSettings`, its parser (called in [`Request::read`], its value set in [`Request::settings_for`]).

use crate::compute_request::{self, ComputeRequest, ComputeRequestError};
use crate::memory_request::{self, MemoryRequest, MemoryRequestError};
use crate::pod_keys::PodMember;
use crate::spec::Spec;
use crate::unknown_keys::{self, UnknownKey};
use vgpu_host::keys::kube;
use vgpu_ledger::memmode::{ModeError, ModeSettings};
use vgpu_ledger::{GpuSettings, KubeNames, MemoryMode};

/// What is read from a spec.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecFacts {
    /// `process.env`, in order.
    pub env: Vec<(String, String)>,
    /// The spec's annotations (string values).
    pub annotations: Vec<(String, String)>,
    /// `linux.devices[].path`.
    pub devices: Vec<String>,
    /// `mounts[].destination` (the device plugin's volume-mounts list of GPUs is there).
    pub mounts: Vec<String>,
}

impl SpecFacts {
    /// The facts of `spec` (the one place they are read from a spec).
    pub fn of(spec: &Spec) -> SpecFacts {
        SpecFacts {
            env: spec.env(),
            annotations: spec.annotations(),
            devices: spec.device_paths(),
            mounts: spec.mount_destinations(),
        }
    }

    /// With the annotations of the OCI state (hooks.d path) winning over, and adding to, the spec's.
    pub fn with_state_annotations(mut self, state: &[(String, String)]) -> SpecFacts {
        for (k, v) in state {
            self.annotations.retain(|(ak, _)| ak != k);
            self.annotations.push((k.clone(), v.clone()));
        }
        self
    }
}

/// The container's request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Memory quota per GPU.
    pub memory: MemoryRequest,
    /// Compute share per GPU, with the policy and window.
    pub compute: ComputeRequest,
    /// The unified-memory mode of every GPU of the container.
    pub mode: MemoryMode,
    /// Made by a CRI runtime for a pod (the pod's annotations reach every container of it).
    pub in_pod: bool,
    /// The Kubernetes names, recorded for the monitor.
    pub kubernetes: Option<KubeNames>,
}

/// Why a request cannot be read. `Display` is one line naming the setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error(transparent)]
    Unknown(#[from] UnknownKey),
    #[error(transparent)]
    Memory(#[from] MemoryRequestError),
    #[error(transparent)]
    Compute(#[from] ComputeRequestError),
    /// The unified-memory settings are malformed or contradict each other (the grammar's line).
    #[error(transparent)]
    Mode(#[from] ModeError),
}

impl Request {
    /// What the container asks for its GPU `i`: the GPU's own values or those for every GPU, and the
    /// container-wide ones (the mode, the policy, the window), before the node's default quota and
    /// [`GpuSettings::tied`] (`crate::plan`). The one place the request becomes a GPU's settings.
    pub fn settings_for(&self, i: usize) -> GpuSettings {
        GpuSettings {
            memory_limit: self.memory.limit_for(i).map(|r| r.bytes),
            memory: self.mode,
            compute_limit: self.compute.share_for(i).and_then(|s| s.percent),
            compute_request: self.compute.request_for(i).and_then(|s| s.percent),
            compute_policy: self.compute.policy,
            compute_window_ms: self.compute.window_ms,
        }
    }

    /// Reads the request; the first malformed setting is the error (in this order: unknown keys, memory,
    /// compute, mode), even when the request asks for nothing (a typo must be seen).
    pub fn read(facts: &SpecFacts) -> Result<Request, RequestError> {
        let (ann, env) = (&facts.annotations, &facts.env);
        unknown_keys::check(ann, env)?;
        let member = PodMember::of(ann);
        let memory = memory_request::read(ann, env, member)?;
        let compute = compute_request::read(ann, env, member)?;
        // The annotations decide the mode when they say anything about it.
        let annotated = memory_request::mode_settings(ann);
        let settings = if annotated.is_empty() {
            ModeSettings::from_env(env)
        } else {
            annotated
        };
        let mode = settings.parse()?;
        Ok(Request {
            memory,
            compute,
            mode,
            in_pod: member.in_a_pod(),
            kubernetes: kube::names(ann),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::kv;
    use vgpu_ledger::envcompute::Policy;

    fn read(ann: &[(&str, &str)], env: &[(&str, &str)]) -> Result<Request, RequestError> {
        Request::read(&SpecFacts {
            env: kv(env),
            annotations: kv(ann),
            ..Default::default()
        })
    }

    #[test]
    fn one_read_gives_every_setting() {
        let r = read(
            &[
                ("vgpu.io/memory-limit.1", "2Gi"),
                ("vgpu.io/compute-limit", "30"),
                ("vgpu.io/compute-policy", "force"),
                ("vgpu.io/compute-window", "250ms"),
                ("vgpu.io/memory-mode", "spill"),
                ("vgpu.io/memory-spill", "8Gi"),
                ("io.kubernetes.pod.name", "p"),
            ],
            &[("CUDA_OVERSUBSCRIBE", "true")],
        )
        .unwrap();
        assert_eq!(r.memory.limit_for(1).unwrap().bytes, 2 << 30);
        assert_eq!(r.memory.limit_for(0), None);
        assert_eq!(r.compute.share_for(0).unwrap().percent, Some(30));
        assert_eq!(r.settings_for(0).compute_request, None);
        // With a request beside the limit, each GPU's settings carry both.
        let q = read(
            &[
                ("vgpu.io/compute-limit", "30"),
                ("vgpu.io/compute-request.1", "10"),
            ],
            &[],
        )
        .unwrap();
        assert_eq!(
            (
                q.settings_for(1).compute_request,
                q.settings_for(1).compute_limit
            ),
            (Some(10), Some(30))
        );
        assert_eq!(q.settings_for(0).compute_request, None);
        assert_eq!(
            (r.compute.policy, r.compute.window_ms),
            (Policy::Force, Some(250))
        );
        assert_eq!(
            r.mode,
            MemoryMode::Spill {
                spill_limit: 8 << 30
            }
        );
        assert!(r.in_pod);
        assert_eq!(r.kubernetes.unwrap().pod, "p");
        // The environment's mode when no annotation says anything about it.
        let r = read(&[], &[("CUDA_OVERSUBSCRIBE", "true")]).unwrap();
        assert!(r.mode.is_oversubscribe());
        assert!(!r.in_pod);
    }

    #[test]
    fn the_first_bad_setting_is_the_error_even_without_a_quota() {
        assert!(matches!(
            read(&[("vgpu.io/memory-limits", "1Gi")], &[]),
            Err(RequestError::Unknown(UnknownKey::Annotation { .. }))
        ));
        assert!(matches!(
            read(&[("vgpu.io/memory-limit", "0")], &[]),
            Err(RequestError::Memory(MemoryRequestError::Limit(
                vgpu_host::memory_limit::LimitError::Zero { .. }
            )))
        ));
        assert!(matches!(
            read(&[("vgpu.io/compute-window", "1m")], &[]),
            Err(RequestError::Compute(ComputeRequestError::Window(_)))
        ));
        assert!(matches!(
            read(&[("vgpu.io/memory-mode", "spill")], &[]),
            Err(RequestError::Mode(_))
        ));
        // Unknown keys are seen before a bad value.
        assert!(matches!(
            read(
                &[("vgpu.io/memory-limit", "0")],
                &[("CUDA_DEVICE_MEMORY_LIMT", "1G")]
            ),
            Err(RequestError::Unknown(UnknownKey::Env { .. }))
        ));
    }

    #[test]
    fn facts_of_a_spec_and_state_annotations_winning() {
        let spec = Spec::parse(
            r#"{"process":{"env":["A=1"]},"annotations":{"x":"1","y":"2"},"linux":{"devices":[{"path":"/dev/nvidia0"}]}}"#,
            std::path::Path::new("c"),
        )
        .unwrap();
        let f = SpecFacts::of(&spec).with_state_annotations(&kv(&[("y", "3"), ("z", "4")]));
        assert_eq!(f.env, kv(&[("A", "1")]));
        assert_eq!(f.annotations, kv(&[("x", "1"), ("y", "3"), ("z", "4")]));
        assert_eq!(f.devices, vec!["/dev/nvidia0".to_string()]);
    }
}
