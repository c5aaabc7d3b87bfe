//! The CDI spec of one prepared claim (`<cdi dir>/vgpu.io-claim_<uid>.json`, kind `vgpu.io/claim`): a
//! device per allocated GPU (`<claim uid>-gpu-<index>`, its `/dev/nvidiaN` node), and, spec-wide so it
//! runs once per container, the hooks of `vgpuctl cdi generate`'s spec with the claim's quota in the
//! provisioning hook's own environment (`VGPU_CLAIM_QUOTA`): the hook takes it in place of every quota
//! setting of the container's; beside it the uids of the pods the claim is reserved for
//! (`VGPU_CLAIM_PODS`), the only pods whose containers the hook lets use it (the device names carry the
//! claim's uid, which a tenant able to write CDI annotations could name from another pod). The kubelet hands the device names to the runtime, whose CDI support
//! applies the edits. Not here: the spec's types and checks (`vgpu_host::cdi`).

use crate::allocation::{self, Allocated};
use std::path::{Path, PathBuf};
use vgpu_host::cdi::spec::{ContainerEdits, Device, Spec};
use vgpu_host::cdi::{self, CdiError};

/// How the hooks run (`vgpuctl cdi generate`'s inputs).
#[derive(Debug, Clone)]
pub struct Hooks {
    pub hook_path: PathBuf,
    pub hook_stage: String,
    pub hook_env: Vec<String>,
}

/// The spec's file for claim `uid`, in `cdi_dir`.
pub fn path(cdi_dir: &Path, uid: &str) -> PathBuf {
    cdi_dir.join(format!("vgpu.io-claim_{uid}.json"))
}

/// The spec of claim `uid` with its devices, in the order given (the container's GPU order), for the
/// containers of `pods` (uids).
pub fn build(
    uid: &str,
    devices: &[Allocated],
    pods: &[String],
    hooks: &Hooks,
) -> Result<Spec, CdiError> {
    let mut env = hooks.hook_env.clone();
    env.push(format!(
        "{}={}",
        vgpu_host::keys::host::CLAIM_QUOTA_VAR,
        allocation::quota(devices)
    ));
    env.push(format!(
        "{}={}",
        vgpu_host::keys::host::CLAIM_PODS_VAR,
        pods.join(",")
    ));
    let spec = Spec {
        cdi_version: cdi::spec::VERSION.to_string(),
        kind: vgpu_host::keys::cdi::CLAIM_KIND.to_string(),
        devices: devices
            .iter()
            .map(|d| Device {
                name: format!("{uid}-{}", d.device),
                container_edits: ContainerEdits {
                    device_nodes: vec![cdi::device_node(&d.gpu)],
                    ..Default::default()
                },
            })
            .collect(),
        container_edits: ContainerEdits {
            hooks: vec![
                cdi::hook(&hooks.hook_stage, &hooks.hook_path, env),
                cdi::hook("poststop", &hooks.hook_path, hooks.hook_env.clone()),
            ],
            ..Default::default()
        },
    };
    spec.validate()?;
    Ok(spec)
}

/// Writes the spec (JSON, atomically).
pub fn write(cdi_dir: &Path, uid: &str, spec: &Spec) -> Result<PathBuf, CdiError> {
    let p = path(cdi_dir, uid);
    cdi::write(&p, &cdi::render(spec, cdi::Format::Json)?)?;
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_host::nvml::HostGpu;
    use vgpu_ledger::GpuSettings;

    #[test]
    fn a_claims_spec_carries_its_quota_and_pods_in_the_hooks_env_only() {
        let gpu = HostGpu {
            index: 1,
            uuid: "GPU-1".into(),
            total_memory: 16 << 30,
            minor: Some(3),
        };
        let d = Allocated {
            request: "gpu".into(),
            more_requests: vec![],
            device: "gpu-1".into(),
            gpu,
            settings: GpuSettings {
                memory_limit: Some(8 << 30),
                compute_request: Some(30),
                ..Default::default()
            },
        };
        let hooks = Hooks {
            hook_path: "/usr/bin/vgpu-hook".into(),
            hook_stage: "createRuntime".into(),
            hook_env: vec!["PATH=/usr/bin".into()],
        };
        let pods = vec!["pod-1".to_string(), "pod-2".into()];
        let s = build("6f1c2a9e-3b7d", &[d], &pods, &hooks).unwrap();
        assert_eq!(s.device_names(), vec!["vgpu.io/claim=6f1c2a9e-3b7d-gpu-1"]);
        assert_eq!(
            s.devices[0].container_edits.device_nodes[0].path,
            "/dev/nvidia3"
        );
        assert!(s.devices[0].container_edits.env.is_empty());
        let h = &s.container_edits.hooks;
        assert_eq!(
            (h[0].hook_name.as_str(), h[1].hook_name.as_str()),
            ("createRuntime", "poststop")
        );
        assert_eq!(
            h[0].env,
            vec![
                "PATH=/usr/bin".to_string(),
                "VGPU_CLAIM_QUOTA=vgpu.io/memory-limit=8589934592,vgpu.io/compute-request=30"
                    .into(),
                "VGPU_CLAIM_PODS=pod-1,pod-2".into()
            ]
        );
        assert_eq!(h[1].env, vec!["PATH=/usr/bin".to_string()]);
        // A uid that is no CDI name is refused before anything is written.
        assert!(build("bad/uid", &s_devices(), &pods, &hooks).is_err());
    }

    fn s_devices() -> Vec<Allocated> {
        vec![Allocated {
            request: "gpu".into(),
            more_requests: vec![],
            device: "gpu-0".into(),
            gpu: HostGpu {
                index: 0,
                uuid: "GPU-0".into(),
                total_memory: 1 << 30,
                minor: None,
            },
            settings: GpuSettings {
                memory_limit: Some(1 << 30),
                ..Default::default()
            },
        }]
    }
}
