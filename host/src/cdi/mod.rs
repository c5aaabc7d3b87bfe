//! vgpu's GPUs as a Container Device Interface spec (`vgpuctl cdi generate`: default `/etc/cdi/vgpu.yaml`),
//! so that an engine with CDI (Podman, Docker 25+ and containerd or CRI-O with CDI enabled) gives a container
//! its quota from `--device vgpu.io/gpu=<index|uuid|all>` and the `vgpu.io/memory-limit` annotation alone:
//! no runtime shim, no hooks.d file. Not here: the quota itself (the hook's, `vgpu_oci`), NVIDIA's GPU and
//! driver injection (NVIDIA's own spec, `nvidia-ctk cdi generate`, whose `nvidia.com/gpu=…` devices go beside
//! vgpu's).
//!
//! What the spec carries:
//! * spec-wide, applied once to a container with any vgpu device: the `createRuntime` (or the config's
//!   `hook_stage`) and `poststop` hooks running `vgpu-hook`, with the explicit environment every hook vgpu
//!   installs gets — the same hooks the hooks.d path installs. At `createRuntime` the hook provisions the
//!   container's state and bind-mounts the library, its preload list and the limits file and ledgers into
//!   the container; at `poststop` it removes the state. The library and the preload list are not CDI mounts
//!   of their own: the preload list is the container's (the library, then the image's own entries), and
//!   the limits and ledgers are per container id, which a static spec cannot name; the hook mounts all of
//!   them, resolving each path inside the rootfs.
//! * per device, the GPU's `/dev/nvidiaN` node (type, major 195 and NVML's minor given, so no engine
//!   looks for it on the host): how the hook knows which GPUs the container got (its third source, the
//!   spec's device nodes), the node NVIDIA's spec adds too (engines replace a node of the same path).
//!
//! Our own serde types (`spec`), not the `container-device-interface` crate (1.1.1, the CNCF's Rust port,
//! read): it cannot be built without its JSON-schema validator, which brings reqwest, rustls and
//! aws-lc-sys (a C library built with cmake) into vgpuctl, a binary built by zig for glibc 2.28; vgpu only
//! writes specs, which needs the fields above, the version and the name rules (`spec::Spec::validate`).

pub mod spec;
#[cfg(test)]
mod tests;

use crate::nvml::HostGpu;
use spec::{ContainerEdits, Device, DeviceNode, Hook, Spec, SpecError};
use std::path::{Path, PathBuf};

/// Where `vgpuctl cdi generate` writes by default (`/etc/cdi`, read by every engine with CDI).
pub const DEFAULT_OUTPUT: &str = "/etc/cdi/vgpu.yaml";
/// The folders engines read CDI specs from by default, in their order (a later folder wins).
pub const SPEC_DIRS: &[&str] = &["/etc/cdi", "/var/run/cdi"];
/// The major number of NVIDIA's `/dev/nvidiaN` nodes (the driver's fixed character device major).
pub const NVIDIA_MAJOR: i64 = 195;

/// Why no spec was written: one line.
#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    #[error("NVML lists no GPU: a CDI spec needs at least one device")]
    NoGpus,
    #[error(transparent)]
    Invalid(#[from] SpecError),
    #[error("cannot render the CDI spec: {0}")]
    Render(String),
    #[error("cannot write {}: {error}", path.display())]
    Write {
        path: PathBuf,
        error: std::io::Error,
    },
}

/// What the spec is built from.
#[derive(Debug, Clone)]
pub struct Inputs<'a> {
    /// The host's GPUs, from NVML.
    pub gpus: &'a [HostGpu],
    /// The installed `vgpu-hook` (the config's `hook_path`).
    pub hook_path: &'a Path,
    /// The provisioning stage (the config's `hook_stage`: `createRuntime`, or `prestart` for old runtimes).
    pub hook_stage: &'a str,
    /// The hooks' whole environment (`config::Config::hook_env`).
    pub hook_env: Vec<String>,
}

/// The spec of vgpu's devices: `<index>` and `<uuid>` of each GPU, and `all`.
pub fn build(i: &Inputs) -> Result<Spec, CdiError> {
    if i.gpus.is_empty() {
        return Err(CdiError::NoGpus);
    }
    let device = |name: String, gpus: &[&HostGpu]| Device {
        name,
        container_edits: ContainerEdits {
            device_nodes: gpus.iter().map(|g| device_node(g)).collect(),
            ..Default::default()
        },
    };
    let mut devices = Vec::new();
    for g in i.gpus {
        devices.push(device(g.index.to_string(), &[g]));
        devices.push(device(g.uuid.clone(), &[g]));
    }
    devices.push(device("all".into(), &i.gpus.iter().collect::<Vec<_>>()));
    let hook = |stage: &str| hook(stage, i.hook_path, i.hook_env.clone());
    let spec = Spec {
        cdi_version: spec::VERSION.to_string(),
        kind: crate::keys::cdi::KIND.to_string(),
        devices,
        container_edits: ContainerEdits {
            hooks: vec![hook(i.hook_stage), hook("poststop")],
            ..Default::default()
        },
    };
    spec.validate()?;
    Ok(spec)
}

/// A GPU's `/dev/nvidiaN` node (type, major and minor given, so no engine looks for it on the host).
pub fn device_node(g: &HostGpu) -> DeviceNode {
    // Drivers without minor numbers in NVML number the nodes by index (as the hook resolves them).
    let minor = g.minor.unwrap_or(g.index);
    DeviceNode {
        path: format!("/dev/nvidia{minor}"),
        kind: Some("c".into()),
        major: Some(NVIDIA_MAJOR),
        minor: Some(minor.into()),
        permissions: Some("rw".into()),
    }
}

/// The hook running `vgpu-hook <stage>` with the whole environment `env`.
pub fn hook(stage: &str, hook_path: &Path, env: Vec<String>) -> Hook {
    Hook {
        hook_name: stage.to_string(),
        path: hook_path.to_string_lossy().into_owned(),
        args: vec![crate::keys::host::HOOK_BIN.to_string(), stage.to_string()],
        env,
    }
}

/// The file format, by the output's extension as engines read it: `.json` is JSON, anything else YAML.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Yaml,
    Json,
}

impl Format {
    pub fn for_path(p: &Path) -> Format {
        match p.extension().and_then(|e| e.to_str()) {
            Some("json") => Format::Json,
            _ => Format::Yaml,
        }
    }
}

/// The first lines of a YAML spec: whose it is and when to write it again.
const YAML_HEADER: &str = "# vgpu's CDI devices, written by `vgpuctl cdi generate`: run it again when GPUs change or vgpu-hook moves.\n";

/// The spec's text in `format`.
pub fn render(spec: &Spec, format: Format) -> Result<String, CdiError> {
    match format {
        Format::Json => serde_json::to_string_pretty(spec)
            .map(|s| s + "\n")
            .map_err(|e| CdiError::Render(e.to_string())),
        Format::Yaml => serde_yaml_ng::to_string(spec)
            .map(|s| format!("{YAML_HEADER}{s}"))
            .map_err(|e| CdiError::Render(e.to_string())),
    }
}

/// Reads a spec back (either format: YAML is a superset of JSON).
pub fn parse(text: &str) -> Result<Spec, String> {
    serde_yaml_ng::from_str(text).map_err(|e| e.to_string())
}

/// Writes `text` to `path` atomically (mode 0644, the folder made if missing).
pub fn write(path: &Path, text: &str) -> Result<(), CdiError> {
    use crate::atomic::{write_atomic, WriteOptions};
    write_atomic(
        path,
        text.as_bytes(),
        WriteOptions::with_mode(0o644).create_parents().durable(),
    )
    .map_err(|error| CdiError::Write {
        path: path.to_path_buf(),
        error,
    })
}
