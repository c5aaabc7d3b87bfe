//! The names only the host tools use: the binaries' names, the hooks' `PATH`, the config's variable and the
//! DRA claim's variables (`host`), the CDI kinds (`cdi`), the device plugin's resources (`device_plugin`),
//! the DRA driver's name and capacities (`dra`), the Kubernetes annotations CRI runtimes write (`kube`). Not
//! here: the names a container carries, which the library reads too (`vgpu_ledger::keys`).

/// Names of the host side: binaries, the hooks' environment, the config's variable.
pub mod host {
    /// The OCI hook; also `args[0]` of every hook vgpu adds to a spec (how a re-edit finds them).
    pub const HOOK_BIN: &str = "vgpu-hook";
    /// The runtime shim; also the value of `vgpu_ledger::keys::annotation::PROVISIONED_BY`.
    pub const RUNTIME_BIN: &str = "vgpu-container-runtime";
    /// The admin tool.
    pub const CTL_BIN: &str = "vgpuctl";
    /// The whole environment every hook vgpu installs starts from: nothing from the container (an image's
    /// `LD_PRELOAD` must never reach a process with host privileges).
    pub const HOOK_PATH_ENV: &str = "PATH=/usr/sbin:/usr/bin:/sbin:/bin";
    /// Names the vgpu config file of the hook and the shim.
    pub const CONFIG_VAR: &str = "VGPU_CONFIG";
    /// The quota a Kubernetes DRA claim fixes, in the environment vgpu-dra-plugin's CDI spec gives the
    /// hook (never the container's): `vgpu.io/memory-limit=8Gi,vgpu.io/compute-limit=30`.
    pub const CLAIM_QUOTA_VAR: &str = "VGPU_CLAIM_QUOTA";
    /// The pods a DRA claim is reserved for (its `status.reservedFor`), in the same environment: their
    /// uids, comma-separated. The hook refuses the claim's devices to a container of any other pod.
    pub const CLAIM_PODS_VAR: &str = "VGPU_CLAIM_PODS";
}

/// Container Device Interface names: the kind of vgpu's devices (`vgpuctl cdi generate`) and NVIDIA's, whose
/// spec (`nvidia-ctk cdi generate`) gives the container its GPU and driver beside vgpu's.
pub mod cdi {
    /// vgpu's CDI kind: `--device vgpu.io/gpu=<index|uuid|all>`.
    pub const KIND: &str = "vgpu.io/gpu";
    /// NVIDIA's CDI kind.
    pub const NVIDIA_KIND: &str = "nvidia.com/gpu";
    /// The kind of the per-claim specs vgpu-dra-plugin writes: `vgpu.io/claim=<claim uid>-gpu-<index>`.
    pub const CLAIM_KIND: &str = "vgpu.io/claim";
}

/// vgpu-device-plugin's extended resources (the kubelet's device plugin API): what a pod's
/// `resources.limits` name.
pub mod device_plugin {
    /// GPU memory, in the plugin's unit (`--memory-unit`, 1 GiB by default), on one GPU.
    pub const MEMORY: &str = "vgpu.io/memory";
    /// A GPU's compute share, whole percents (100 a GPU), on the GPU of the container's memory.
    pub const COMPUTE: &str = "vgpu.io/compute";
}

/// Kubernetes Dynamic Resource Allocation: vgpu-dra-plugin's driver and its devices' capacities.
pub mod dra {
    /// The driver name (DeviceClass selectors, ResourceSlices, the kubelet plugin's name).
    pub const DRIVER: &str = "gpu.vgpu.io";
    /// A GPU's memory, bytes, as consumable capacity.
    pub const MEMORY: &str = "memory";
    /// A GPU's compute, percent (100 a GPU), as consumable capacity.
    pub const COMPUTE: &str = "compute";
}

/// The annotations CRI runtimes write into a Kubernetes container's spec, as vgpu reads them (the hook: a
/// pod's container, its pod's UID, the names the limits file records).
pub mod kube {
    use vgpu_ledger::KubeNames;

    /// containerd's (CRI plugin's) names.
    pub const CRI_CONTAINER_NAME: &str = "io.kubernetes.cri.container-name";
    pub const CRI_CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
    pub const CRI_SANDBOX_ID: &str = "io.kubernetes.cri.sandbox-id";
    pub const CRI_SANDBOX_NAME: &str = "io.kubernetes.cri.sandbox-name";
    pub const CRI_SANDBOX_NAMESPACE: &str = "io.kubernetes.cri.sandbox-namespace";
    /// The pod's uid, from the kubelet's sandbox metadata; containerd writes it after the pod annotations
    /// its `pod_annotations` lets through, so a pod annotation of this name cannot replace it.
    pub const CRI_SANDBOX_UID: &str = "io.kubernetes.cri.sandbox-uid";
    /// CRI-O's names.
    pub const CRIO_CONTAINER_NAME: &str = "io.kubernetes.container.name";
    pub const CRIO_CONTAINER_TYPE: &str = "io.kubernetes.cri-o.ContainerType";
    pub const CRIO_POD_NAME: &str = "io.kubernetes.pod.name";
    pub const CRIO_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
    /// The pod's uid: a label the kubelet sets on every container, which CRI-O writes into the spec after
    /// the container's annotations.
    pub const CRIO_POD_UID: &str = "io.kubernetes.pod.uid";
    /// Where a container's pod uid is read from (every one present must name a pod the claim is for).
    pub const POD_UID_KEYS: [&str; 2] = [CRI_SANDBOX_UID, CRIO_POD_UID];

    /// Keys that say a CRI runtime made the container for a pod (the sandbox has no container name).
    pub const POD_MARKERS: [&str; 4] = [
        CRI_CONTAINER_TYPE,
        CRI_SANDBOX_ID,
        CRIO_CONTAINER_TYPE,
        CRIO_POD_NAME,
    ];

    /// The names from a container's annotations: CRI-O's `io.kubernetes.pod.name`,
    /// `io.kubernetes.pod.namespace`, `io.kubernetes.container.name`, or containerd's
    /// `io.kubernetes.cri.sandbox-name`, `io.kubernetes.cri.sandbox-namespace`,
    /// `io.kubernetes.cri.container-name`. `None` when none is there.
    pub fn names(annotations: &[(String, String)]) -> Option<KubeNames> {
        let get = |keys: &[&str]| {
            keys.iter()
                .find_map(|k| annotations.iter().find(|(a, _)| a == k))
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        let n = KubeNames {
            namespace: get(&[CRIO_POD_NAMESPACE, CRI_SANDBOX_NAMESPACE]),
            pod: get(&[CRIO_POD_NAME, CRI_SANDBOX_NAME]),
            container: get(&[CRIO_CONTAINER_NAME, CRI_CONTAINER_NAME]),
        };
        (n != KubeNames::default()).then_some(n)
    }
}

#[cfg(test)]
mod tests {
    use super::kube;
    use vgpu_ledger::KubeNames;

    #[test]
    fn kubernetes_names_from_either_runtime() {
        let kv = |v: &[(&str, &str)]| -> Vec<(String, String)> {
            v.iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect()
        };
        assert_eq!(kube::names(&kv(&[("x", "y")])), None);
        let crio = kube::names(&kv(&[
            ("io.kubernetes.pod.name", "p"),
            ("io.kubernetes.pod.namespace", "ns"),
            ("io.kubernetes.container.name", "c"),
        ]));
        let containerd = kube::names(&kv(&[
            ("io.kubernetes.cri.sandbox-name", "p"),
            ("io.kubernetes.cri.sandbox-namespace", "ns"),
            ("io.kubernetes.cri.container-name", "c"),
        ]));
        assert_eq!(crio, containerd);
        assert_eq!(
            crio,
            Some(KubeNames {
                namespace: "ns".into(),
                pod: "p".into(),
                container: "c".into(),
            })
        );
    }
}
