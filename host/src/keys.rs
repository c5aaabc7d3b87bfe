//! The names only the host tools use: the binaries' names, the hooks' `PATH`, the config's variable and the
//! DRA claim's variables (`host`), the CDI kinds (`cdi`), the device plugin's resources (`device_plugin`),
//! the DRA driver's name and capacities (`dra`). Not here: the names a container carries, which the library reads too (`vgpu_ledger::keys`).

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
