//! The Container Device Interface spec as vgpu writes it: the fields it uses (devices with device nodes,
//! the spec-wide hooks and env), serialised with the names and the version of the CDI specification
//! (github.com/cncf-tags/container-device-interface, SPEC.md), and [`Spec::validate`], the checks the
//! reference library makes when an engine loads a spec, so that a spec an engine would refuse is never
//! written. Not here: which devices vgpu has and what they carry (`super`).

use serde::{Deserialize, Serialize};

/// The spec version written: the highest that Podman 4.3's CDI library (v0.5) reads, and what
/// `nvidia-ctk cdi generate` writes by default; newer engines read every older version.
pub const VERSION: &str = "0.5.0";

/// The spec versions [`Spec::validate`] accepts when reading one back (`vgpuctl doctor`).
pub const KNOWN_VERSIONS: &[&str] = &[
    "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0",
];

/// The OCI hook stages a CDI hook may name (the reference library's list).
pub const HOOK_NAMES: &[&str] = &[
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
];

/// Why a spec is not one an engine would load: one line naming the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("CDI spec version {0:?} is not one of {known}", known = KNOWN_VERSIONS.join(", "))]
    Version(String),
    #[error("CDI kind {0:?} is not vendor/class (vendor: letters, digits, '.', '-', '_'; class: letters, digits, '-', '_'; each starting and ending with a letter or digit)")]
    Kind(String),
    #[error("CDI device name {0:?}: letters, digits, '-', '_', '.' and ':', starting and ending with a letter or digit")]
    DeviceName(String),
    #[error("CDI device {0:?} appears twice")]
    DuplicateDevice(String),
    #[error("CDI device {0:?} has no edits")]
    EmptyDevice(String),
    #[error("CDI spec has no devices")]
    NoDevices,
    #[error("CDI hook stage {0:?} is not one of {names}", names = HOOK_NAMES.join(", "))]
    HookName(String),
    #[error("CDI {what} path {path:?} is not absolute")]
    RelativePath { what: &'static str, path: String },
    #[error("CDI env entry {0:?} is not NAME=VALUE")]
    Env(String),
    #[error("CDI device node {path}: type {kind:?} is not b, c, u or p")]
    NodeType { path: String, kind: String },
}

/// One spec file: the devices of one kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    pub cdi_version: String,
    pub kind: String,
    pub devices: Vec<Device>,
    /// Edits applied once to any container that gets at least one device of this spec.
    #[serde(default, skip_serializing_if = "ContainerEdits::is_empty")]
    pub container_edits: ContainerEdits,
}

/// One device: `--device <kind>=<name>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    pub name: String,
    pub container_edits: ContainerEdits,
}

/// What a device (or the whole spec) adds to a container's OCI spec.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
}

impl ContainerEdits {
    pub fn is_empty(&self) -> bool {
        self.env.is_empty() && self.device_nodes.is_empty() && self.hooks.is_empty()
    }
}

/// A device node in the container (`linux.devices` and the cgroup's device rules).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    pub path: String,
    /// `c`, `b`, `u` or `p`; with `major` given the engine does not look at the host's node.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<i64>,
    /// The cgroup access, `rwm` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<String>,
}

/// An OCI hook added to the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hook {
    pub hook_name: String,
    pub path: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
}

/// `[A-Za-z0-9]` at both ends, `allowed` in between.
fn is_name(s: &str, allowed: &[char]) -> bool {
    let ok_end = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    ok_end(s.chars().next())
        && ok_end(s.chars().last())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || allowed.contains(&c))
}

/// Whether `kind` is a CDI kind, `vendor/class`.
pub fn is_kind(kind: &str) -> bool {
    kind.split_once('/').is_some_and(|(vendor, class)| {
        is_name(vendor, &['.', '-', '_']) && is_name(class, &['-', '_'])
    })
}

/// Whether `name` is a CDI device name.
pub fn is_device_name(name: &str) -> bool {
    is_name(name, &['-', '_', '.', ':'])
}

impl ContainerEdits {
    fn validate(&self) -> Result<(), SpecError> {
        for e in &self.env {
            if e.split_once('=').is_none_or(|(k, _)| k.is_empty()) {
                return Err(SpecError::Env(e.clone()));
            }
        }
        for n in &self.device_nodes {
            if !n.path.starts_with('/') {
                return Err(SpecError::RelativePath {
                    what: "device node",
                    path: n.path.clone(),
                });
            }
            if let Some(k) = &n.kind {
                if !["b", "c", "u", "p"].contains(&k.as_str()) {
                    return Err(SpecError::NodeType {
                        path: n.path.clone(),
                        kind: k.clone(),
                    });
                }
            }
        }
        for h in &self.hooks {
            if !HOOK_NAMES.contains(&h.hook_name.as_str()) {
                return Err(SpecError::HookName(h.hook_name.clone()));
            }
            if !h.path.starts_with('/') {
                return Err(SpecError::RelativePath {
                    what: "hook",
                    path: h.path.clone(),
                });
            }
        }
        Ok(())
    }
}

impl Spec {
    /// The reference library's checks on a spec it loads: the version, the kind, every device name (unique),
    /// every device with edits, paths absolute, hook stages and env entries well formed.
    pub fn validate(&self) -> Result<(), SpecError> {
        if !KNOWN_VERSIONS.contains(&self.cdi_version.as_str()) {
            return Err(SpecError::Version(self.cdi_version.clone()));
        }
        if !is_kind(&self.kind) {
            return Err(SpecError::Kind(self.kind.clone()));
        }
        if self.devices.is_empty() {
            return Err(SpecError::NoDevices);
        }
        self.container_edits.validate()?;
        for (i, d) in self.devices.iter().enumerate() {
            if !is_device_name(&d.name) {
                return Err(SpecError::DeviceName(d.name.clone()));
            }
            if self.devices[..i].iter().any(|o| o.name == d.name) {
                return Err(SpecError::DuplicateDevice(d.name.clone()));
            }
            if d.container_edits.is_empty() {
                return Err(SpecError::EmptyDevice(d.name.clone()));
            }
            d.container_edits.validate()?;
        }
        Ok(())
    }

    /// The fully qualified names of its devices (`vgpu.io/gpu=0`).
    pub fn device_names(&self) -> Vec<String> {
        self.devices
            .iter()
            .map(|d| format!("{}={}", self.kind, d.name))
            .collect()
    }
}
