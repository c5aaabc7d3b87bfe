//! limits.json: the per-container limits the hook writes once and the library reads (docs/architecture.md,
//! "limits.json"). Not here: writing the file on the host (`vgpu_host::limits_file`: these bytes, replaced
//! atomically), the file's place (`crate::layout`).
//!
//! The file is mounted read-only into the container, so a tenant cannot raise its quota; `vgpuctl update`
//! changes a running container's limits through `crate::live`.

use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::io;
use std::path::{Component, Path, PathBuf};

use crate::layout;
use crate::settings::{GpuSettings, InvalidSettings};

/// Largest limits file a host tool reads (one entry per GPU is some 200 bytes; 1024 GPUs fit), and so
/// the largest one written (`vgpu_host::hostfile` reads no more).
pub const MAX_LIMITS_FILE: u64 = 1 << 20;

/// Longest cgroup path a limits file records (the kernel's `PATH_MAX`).
pub const MAX_CGROUP_PATH: usize = 4096;

/// The only format version this build reads and writes.
pub const LIMITS_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    pub version: u32,
    pub container_id: String,
    /// Inode of the container's PID namespace as the host sees it (for the garbage collector).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid_ns: Option<u64>,
    /// Host PID of the container's first process (for the garbage collector).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_pid: Option<u32>,
    /// When that process started (clock ticks after boot, `/proc/<pid>/stat` field 22): with the PID, its
    /// identity (PIDs and namespace inodes are reused). Absent in files written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_start_time: Option<u64>,
    /// The container's cgroup v2 path as its init process was in it when the owner was recorded (the
    /// `0::` line of `/proc/<pid>/cgroup`, as the host sees it): the monitor attributes a process to the
    /// container when its cgroup is this one or below it. Absent when there was none of the container's
    /// own (no unified hierarchy, the root, or the runtime's own cgroup).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    pub devices: Vec<DeviceLimit>,
    /// The process that provisioned the state (for the garbage collector and admission: state without an
    /// owner whose creator is gone was left by a create that was killed). Absent in files written before
    /// it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creator: Option<Creator>,
    /// The container's Kubernetes names from the CRI annotations at creation (informational: the monitor's
    /// labels). Absent for containers not made by a CRI runtime, and in files written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<KubeNames>,
    /// How many times `vgpuctl update` changed the running container's limits (`crate::live`: the
    /// ledgers' generation is twice this). Absent: never.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub updates: u64,
    /// When the last update was made, seconds since the Unix epoch. Absent: never updated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<u64>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A host process told apart from a later one with its PID: the PID and its start time (field 22 of
/// `/proc/<pid>/stat`, clock ticks after boot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Creator {
    pub pid: u32,
    pub start_time: u64,
}

/// Pod namespace, pod and container name of a Kubernetes container (empty: not given), as the hook read
/// them from the CRI runtime's annotations (`vgpu_host::keys::kube::names`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KubeNames {
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub pod: String,
    #[serde(default)]
    pub container: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceLimit {
    /// The container's i-th GPU (its CUDA ordinal inside the container).
    pub index: u32,
    pub uuid: String,
    /// The GPU's settings (`crate::settings`): memory quota and mode, compute share, policy and window.
    /// Flattened: on disk each is a key of the device, as before the struct existed.
    #[serde(flatten)]
    pub settings: GpuSettings,
    /// Ledger file, relative to the limits file's folder (`ledgers/<uuid>.ledger`).
    pub ledger: PathBuf,
    /// Set by `vgpuctl update` when it lowered `memory_limit`: the limit before (the highest of the
    /// shrinks not yet grown back past). Memory the container held under it is kept, so until its
    /// usage falls under the new limit it is a *pending shrink*, not an escape (the watchdog, status).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shrunk_from: Option<u64>,
    /// Set with `shrunk_from` by the shrink that lowered `memory_limit` below what the container held:
    /// the bytes its processes held on the GPU then, as the host measured them from NVML (never the
    /// tenant-writable ledger), at most what it was allowed before. The watchdog tolerates a pending
    /// shrink up to this (or the quota, when more), not up to `shrunk_from`: memory taken after the
    /// shrink by a tenant that hid it from its own processes is over quota. Absent in files written
    /// before it existed (the watchdog then starts from `shrunk_from`). What either allows:
    /// `vgpu_host::shrink`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_at_shrink: Option<u64>,
}

/// A limits file that cannot be used. `Display` names the file and the problem.
#[derive(Debug, thiserror::Error)]
#[error("vgpu limits file {}: {kind}", path.display())]
pub struct LimitsError {
    pub path: PathBuf,
    #[source]
    pub kind: LimitsErrorKind,
}

#[derive(Debug, thiserror::Error)]
pub enum LimitsErrorKind {
    /// The file could not be read.
    #[error("cannot read: {0}")]
    Io(#[source] io::Error),
    /// Not JSON, or cut short.
    #[error("not valid JSON (truncated or garbage?): {0}")]
    Malformed(String),
    /// A format version this build does not know.
    #[error("format version {found} is not supported (this build reads version {LIMITS_VERSION})")]
    UnsupportedVersion { found: u64 },
    /// Well-formed JSON that does not fit the format (missing field, wrong type): serde's path and words.
    #[error("{0}")]
    Invalid(String),
    /// Content the format allows but vgpu does not (duplicate device, bad path, ...).
    #[error(transparent)]
    Rejected(#[from] InvalidLimits),
}

/// Content of a limits file that [`Limits::validate`] refuses. `Display` is one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidLimits {
    #[error(
        "format version {found} is not supported (this build writes version {LIMITS_VERSION})"
    )]
    Version { found: u32 },
    #[error(transparent)]
    ContainerId(layout::LayoutError),
    /// The cgroup as written, its first 80 characters.
    #[error("cgroup {cgroup:?} is not a cgroup path (absolute, at most {MAX_CGROUP_PATH} bytes, no control characters)")]
    Cgroup { cgroup: String },
    #[error("lists no devices")]
    NoDevices,
    #[error("device {index}: {err}")]
    Uuid {
        index: u32,
        err: layout::LayoutError,
    },
    #[error("device index {index} is listed twice")]
    DuplicateIndex { index: u32 },
    #[error("GPU {uuid} is listed twice")]
    DuplicateUuid { uuid: String },
    /// A device's settings break a rule of `crate::settings`.
    #[error("device {index} ({uuid}): {err}")]
    Settings {
        index: u32,
        uuid: String,
        err: InvalidSettings,
    },
    #[error("device {index} ({uuid}): ledger path {:?} must be relative to the limits file's folder, without '..'", ledger.display())]
    LedgerPath {
        index: u32,
        uuid: String,
        ledger: PathBuf,
    },
}

/// The line of a device setting serde refused, naming its key as every other field's line does.
/// `#[serde(flatten)]` reads a device's settings from a buffered copy of its keys, out of
/// `serde_path_to_error`'s sight, so the path of a bad one stops at the device (`devices[1]`); the
/// device's settings read again alone give the rest (`devices[1].memory_limit: invalid value: ...`).
fn naming_the_setting(
    value: &serde_json::Value,
    err: &serde_path_to_error::Error<serde_json::Error>,
) -> Option<String> {
    use serde_path_to_error::Segment;
    let path: Vec<&Segment> = err.path().iter().collect();
    let [Segment::Map { key }, Segment::Seq { index }] = path[..] else {
        return None;
    };
    let device = value.get(key.as_str())?.get(*index)?;
    let inner = serde_path_to_error::deserialize::<_, GpuSettings>(device).err()?;
    matches!(inner.path().iter().next(), Some(Segment::Map { .. }))
        .then(|| format!("{key}[{index}].{inner}"))
}

impl Limits {
    /// Read and validate a limits file.
    pub fn load(path: &Path) -> Result<Limits, LimitsError> {
        let err = |kind| LimitsError {
            path: path.to_path_buf(),
            kind,
        };
        let bytes = std::fs::read(path).map_err(|e| err(LimitsErrorKind::Io(e)))?;
        Self::from_slice(&bytes).map_err(err)
    }

    /// Parse and validate the bytes of a limits file.
    pub fn from_slice(bytes: &[u8]) -> Result<Limits, LimitsErrorKind> {
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| LimitsErrorKind::Malformed(e.to_string()))?;
        // The version decides how to read the rest, so look at it first.
        let version = match value.get("version") {
            None => return Err(LimitsErrorKind::Invalid("missing field \"version\"".into())),
            Some(v) => v.as_u64().ok_or_else(|| {
                LimitsErrorKind::Invalid(format!("\"version\" is not a positive integer: {v}"))
            })?,
        };
        if version != LIMITS_VERSION as u64 {
            return Err(LimitsErrorKind::UnsupportedVersion { found: version });
        }
        let limits: Limits = serde_path_to_error::deserialize(&value).map_err(|e| {
            LimitsErrorKind::Invalid(
                naming_the_setting(&value, &e).unwrap_or_else(|| e.to_string()),
            )
        })?;
        limits.validate()?;
        Ok(limits)
    }

    /// Check what serde cannot: names usable as paths, one entry per GPU, ledgers inside the folder.
    pub fn validate(&self) -> Result<(), InvalidLimits> {
        if self.version != LIMITS_VERSION {
            return Err(InvalidLimits::Version {
                found: self.version,
            });
        }
        layout::check_container_id(&self.container_id).map_err(InvalidLimits::ContainerId)?;
        if let Some(c) = &self.cgroup {
            if !c.starts_with('/') || c.len() > MAX_CGROUP_PATH || c.chars().any(char::is_control) {
                return Err(InvalidLimits::Cgroup {
                    cgroup: c.chars().take(80).collect(),
                });
            }
        }
        if self.devices.is_empty() {
            return Err(InvalidLimits::NoDevices);
        }
        let mut indices = HashSet::new();
        let mut uuids = HashSet::new();
        for d in &self.devices {
            let (index, uuid) = (d.index, || d.uuid.clone());
            layout::check_gpu_uuid(&d.uuid).map_err(|err| InvalidLimits::Uuid { index, err })?;
            if !indices.insert(d.index) {
                return Err(InvalidLimits::DuplicateIndex { index });
            }
            if !uuids.insert(d.uuid.as_str()) {
                return Err(InvalidLimits::DuplicateUuid { uuid: uuid() });
            }
            d.settings
                .validate()
                .map_err(|err| InvalidLimits::Settings {
                    index,
                    uuid: uuid(),
                    err,
                })?;
            let safe = !d.ledger.as_os_str().is_empty()
                && d.ledger
                    .components()
                    .all(|c| matches!(c, Component::Normal(_)));
            if !safe {
                return Err(InvalidLimits::LedgerPath {
                    index,
                    uuid: uuid(),
                    ledger: d.ledger.clone(),
                });
            }
        }
        Ok(())
    }

    /// Absolute path of a device's ledger: the `ledger` entry resolved against the limits file's folder.
    pub fn ledger_path(&self, limits_path: &Path, dev: &DeviceLimit) -> PathBuf {
        limits_path
            .parent()
            .unwrap_or_else(|| Path::new("."))
            .join(&dev.ledger)
    }

    pub fn device_by_uuid(&self, uuid: &str) -> Option<&DeviceLimit> {
        self.devices.iter().find(|d| d.uuid == uuid)
    }
}

#[cfg(test)]
mod tests;
