//! limits.json: the per-container limits the hook writes once and the library reads (docs/architecture.md,
//! "limits.json"). Not here: the atomic write itself (`crate::atomic`), the file's place (`crate::layout`).
//!
//! The file is mounted read-only into the container, so a tenant cannot raise its quota.

use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::fmt;
use std::io;
use std::path::{Component, Path, PathBuf};

use crate::envcompute::Policy;
use crate::keys::kube;
use crate::layout;
use crate::memmode::MemoryMode;

/// How the limits file is written: mode 0644 whatever was there, synced (docs/architecture.md).
const WRITE_OPTIONS: crate::atomic::WriteOptions =
    crate::atomic::WriteOptions::with_mode(0o644).durable();

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
}

/// A host process told apart from a later one with its PID: the PID and its start time (field 22 of
/// `/proc/<pid>/stat`, clock ticks after boot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Creator {
    pub pid: u32,
    pub start_time: u64,
}

/// Pod namespace, pod and container name of a Kubernetes container (empty: not given).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KubeNames {
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub pod: String,
    #[serde(default)]
    pub container: String,
}

impl KubeNames {
    /// The names from a container's annotations: CRI-O's `io.kubernetes.pod.name`,
    /// `io.kubernetes.pod.namespace`, `io.kubernetes.container.name`, or containerd's
    /// `io.kubernetes.cri.sandbox-name`, `io.kubernetes.cri.sandbox-namespace`,
    /// `io.kubernetes.cri.container-name`. `None` when none is there.
    pub fn from_annotations(annotations: &[(String, String)]) -> Option<KubeNames> {
        let get = |keys: &[&str]| {
            keys.iter()
                .find_map(|k| annotations.iter().find(|(a, _)| a == k))
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        let n = KubeNames {
            namespace: get(&[kube::CRIO_POD_NAMESPACE, kube::CRI_SANDBOX_NAMESPACE]),
            pod: get(&[kube::CRIO_POD_NAME, kube::CRI_SANDBOX_NAME]),
            container: get(&[kube::CRIO_CONTAINER_NAME, kube::CRI_CONTAINER_NAME]),
        };
        (n != KubeNames::default()).then_some(n)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceLimit {
    /// The container's i-th GPU (its CUDA ordinal inside the container).
    pub index: u32,
    pub uuid: String,
    /// Bytes; never 0 in a valid file. Absent: no memory quota on this GPU (it is listed for its
    /// compute share alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit: Option<u64>,
    /// Ledger file, relative to the limits file's folder (`ledgers/<uuid>.ledger`).
    pub ledger: PathBuf,
    /// The unified-memory mode (`crate::memmode`); absent (plain) in files written before it existed.
    #[serde(default, skip_serializing_if = "MemoryMode::is_plain")]
    pub memory: MemoryMode,
    /// The compute share, a percent of the GPU's time 1..=99 (`crate::envcompute`); absent: none (and
    /// in files written before it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_limit: Option<u32>,
    /// How the share is applied; absent: the default (today the same hard cap as `force`).
    #[serde(default, skip_serializing_if = "Policy::is_default")]
    pub compute_policy: Policy,
    /// The share's pacing window in ms (`crate::envcompute::parse_window`'s bounds); absent: the default
    /// (`DEFAULT_WINDOW_MS`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_window_ms: Option<u32>,
}

impl DeviceLimit {
    /// The compute share the library enforces on this GPU: the limit, unless the policy is `disable`.
    pub fn compute_share(&self) -> Option<u32> {
        self.compute_limit
            .filter(|_| self.compute_policy != Policy::Disable)
    }
}

/// A limits file that cannot be used. `Display` names the file and the problem.
#[derive(Debug)]
pub struct LimitsError {
    pub path: PathBuf,
    pub kind: LimitsErrorKind,
}

#[derive(Debug)]
pub enum LimitsErrorKind {
    /// The file could not be read.
    Io(io::Error),
    /// Not JSON, or cut short.
    Malformed(String),
    /// A format version this build does not know.
    UnsupportedVersion { found: u64 },
    /// Well-formed JSON whose content is wrong (missing field, duplicate device, bad path, ...).
    Invalid(String),
}

impl fmt::Display for LimitsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = self.path.display();
        match &self.kind {
            LimitsErrorKind::Io(e) => write!(f, "vgpu limits file {path}: cannot read: {e}"),
            LimitsErrorKind::Malformed(e) => write!(f, "vgpu limits file {path}: not valid JSON (truncated or garbage?): {e}"),
            LimitsErrorKind::UnsupportedVersion { found } => write!(
                f,
                "vgpu limits file {path}: format version {found} is not supported (this build reads version {LIMITS_VERSION})"
            ),
            LimitsErrorKind::Invalid(e) => write!(f, "vgpu limits file {path}: {e}"),
        }
    }
}

impl std::error::Error for LimitsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            LimitsErrorKind::Io(e) => Some(e),
            _ => None,
        }
    }
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
        let limits: Limits = serde_path_to_error::deserialize(value)
            .map_err(|e| LimitsErrorKind::Invalid(e.to_string()))?;
        limits.validate().map_err(LimitsErrorKind::Invalid)?;
        Ok(limits)
    }

    /// Check what serde cannot: names usable as paths, one entry per GPU, ledgers inside the folder.
    pub fn validate(&self) -> Result<(), String> {
        if self.version != LIMITS_VERSION {
            return Err(format!(
                "format version {} is not supported (this build writes version {LIMITS_VERSION})",
                self.version
            ));
        }
        layout::check_container_id(&self.container_id).map_err(|e| e.to_string())?;
        if self.devices.is_empty() {
            return Err("lists no devices".into());
        }
        let mut indices = HashSet::new();
        let mut uuids = HashSet::new();
        for d in &self.devices {
            layout::check_gpu_uuid(&d.uuid).map_err(|e| format!("device {}: {e}", d.index))?;
            if !indices.insert(d.index) {
                return Err(format!("device index {} is listed twice", d.index));
            }
            if !uuids.insert(d.uuid.as_str()) {
                return Err(format!("GPU {} is listed twice", d.uuid));
            }
            match (d.memory_limit, d.compute_limit) {
                (Some(0), _) => {
                    return Err(format!(
                        "device {} ({}): memory_limit is 0",
                        d.index, d.uuid
                    ))
                }
                (None, None) => {
                    return Err(format!(
                        "device {} ({}): has neither memory_limit nor compute_limit",
                        d.index, d.uuid
                    ))
                }
                (None, Some(_)) if !d.memory.is_plain() => {
                    return Err(format!(
                        "device {} ({}): memory mode {} needs a memory_limit",
                        d.index,
                        d.uuid,
                        d.memory.name()
                    ))
                }
                _ => {}
            }
            if let Some(p) = d.compute_limit.filter(|p| !(1..100).contains(p)) {
                return Err(format!(
                    "device {} ({}): compute_limit {p} is not a percent 1..=99",
                    d.index, d.uuid
                ));
            }
            if let Some(w) = d.compute_window_ms.filter(|w| {
                !(crate::envcompute::MIN_WINDOW_MS..=crate::envcompute::MAX_WINDOW_MS).contains(w)
            }) {
                return Err(format!(
                    "device {} ({}): compute_window_ms {w} is not within {}..={}",
                    d.index,
                    d.uuid,
                    crate::envcompute::MIN_WINDOW_MS,
                    crate::envcompute::MAX_WINDOW_MS
                ));
            }
            if d.memory.spill_limit() == Some(0) {
                return Err(format!("device {} ({}): spill_limit is 0", d.index, d.uuid));
            }
            let safe = !d.ledger.as_os_str().is_empty()
                && d.ledger
                    .components()
                    .all(|c| matches!(c, Component::Normal(_)));
            if !safe {
                return Err(format!(
                    "device {} ({}): ledger path {:?} must be relative to the limits file's folder, without '..'",
                    d.index,
                    d.uuid,
                    d.ledger.display()
                ));
            }
        }
        Ok(())
    }

    /// Write the file atomically (temporary file in the same folder, then rename), mode 0644: readable by
    /// the container's non-root processes, writable by nobody inside (it is mounted read-only anyway).
    pub fn write_atomic(&self, path: &Path) -> io::Result<()> {
        self.validate().map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: {e}", path.display()),
            )
        })?;
        let mut text = serde_json::to_vec_pretty(self).map_err(io::Error::other)?;
        text.push(b'\n');
        crate::atomic::write_atomic(path, &text, WRITE_OPTIONS)
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

    pub fn device_by_index(&self, i: u32) -> Option<&DeviceLimit> {
        self.devices.iter().find(|d| d.index == i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Limits {
        Limits {
            version: 1,
            container_id: "3f2a".into(),
            pid_ns: Some(4026532612),
            init_pid: Some(12345),
            creator: None,
            kubernetes: None,
            devices: vec![
                DeviceLimit {
                    index: 0,
                    uuid: "GPU-aaaa".into(),
                    memory_limit: Some(1 << 30),
                    ledger: "ledgers/GPU-aaaa.ledger".into(),
                    memory: Default::default(),
                    compute_limit: None,
                    compute_policy: Default::default(),
                    compute_window_ms: None,
                },
                DeviceLimit {
                    index: 1,
                    uuid: "GPU-bbbb".into(),
                    memory_limit: Some(2 << 30),
                    ledger: "ledgers/GPU-bbbb.ledger".into(),
                    memory: Default::default(),
                    compute_limit: None,
                    compute_policy: Default::default(),
                    compute_window_ms: None,
                },
            ],
        }
    }

    fn load_text(text: &str) -> Result<Limits, String> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("limits.json");
        std::fs::write(&path, text).unwrap();
        Limits::load(&path).map_err(|e| {
            let msg = e.to_string();
            assert!(
                msg.contains(&path.display().to_string()),
                "error does not name the file: {msg}"
            );
            msg
        })
    }

    #[test]
    fn round_trip_and_lookups() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("limits.json");
        let l = sample();
        l.write_atomic(&path).unwrap();
        let back = Limits::load(&path).unwrap();
        assert_eq!(back, l);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o644
        );
        assert_eq!(back.device_by_uuid("GPU-bbbb").unwrap().index, 1);
        assert_eq!(back.device_by_index(0).unwrap().uuid, "GPU-aaaa");
        assert!(back.device_by_uuid("GPU-cccc").is_none());
        assert!(back.device_by_index(7).is_none());
        let dev = back.device_by_index(1).unwrap();
        assert_eq!(
            back.ledger_path(&path, dev),
            dir.path().join("ledgers/GPU-bbbb.ledger")
        );
        // no temporary file is left behind
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("limits.json")]);
    }

    #[test]
    fn the_documented_example_loads() {
        let text = r#"{
          "version": 1,
          "container_id": "3f2a",
          "pid_ns": 4026532612,
          "init_pid": 12345,
          "devices": [
            { "index": 0, "uuid": "GPU-0", "memory_limit": 1073741824, "ledger": "ledgers/GPU-0.ledger" }
          ]
        }"#;
        let l = load_text(text).unwrap();
        assert_eq!(l.devices[0].memory_limit, Some(1 << 30));
        assert_eq!(l.devices[0].compute_share(), None);
        // optional fields may be absent; unknown keys are tolerated
        let l = load_text(r#"{"version":1,"container_id":"c","future":true,"devices":[{"index":0,"uuid":"GPU-0","memory_limit":1,"ledger":"ledgers/GPU-0.ledger"}]}"#).unwrap();
        assert_eq!(l.pid_ns, None);
        assert_eq!(l.init_pid, None);
    }

    #[test]
    fn bad_files_get_one_clear_error() {
        let good = serde_json::to_string(&sample()).unwrap();
        let cases: Vec<(String, &str)> = vec![
            (good[..good.len() / 2].to_string(), "not valid JSON"),
            ("".into(), "not valid JSON"),
            ("\u{1}\u{2}garbage".into(), "not valid JSON"),
            (
                good.replace("\"version\":1", "\"version\":2"),
                "format version 2 is not supported (this build reads version 1)",
            ),
            (
                good.replace("\"version\":1", "\"version\":\"1\""),
                "\"version\" is not a positive integer",
            ),
            (
                good.replace("\"version\":1,", ""),
                "missing field \"version\"",
            ),
            ("[1,2]".into(), "missing field \"version\""),
            (
                good.replace("\"container_id\":\"3f2a\",", ""),
                "missing field `container_id`",
            ),
            (
                good.replace("\"container_id\":\"3f2a\"", "\"container_id\":\"../x\""),
                "invalid container id",
            ),
            (good.replace("GPU-bbbb\"", "GPU-aaaa\""), "listed twice"),
            (
                good.replace("\"index\":1", "\"index\":0"),
                "device index 0 is listed twice",
            ),
            (
                good.replace("\"memory_limit\":2147483648", "\"memory_limit\":0"),
                "memory_limit is 0",
            ),
            (
                good.replace("\"memory_limit\":2147483648", "\"memory_limit\":-1"),
                "devices[1].memory_limit: invalid value",
            ),
            (
                good.replace("ledgers/GPU-bbbb.ledger", "../../etc/x"),
                "without '..'",
            ),
            (
                good.replace("ledgers/GPU-bbbb.ledger", "/etc/x"),
                "must be relative",
            ),
            (
                r#"{"version":1,"container_id":"c","devices":[]}"#.into(),
                "lists no devices",
            ),
            (
                good.replace("\"memory_limit\":2147483648,", ""),
                "device 1 (GPU-bbbb): has neither memory_limit nor compute_limit",
            ),
            (
                good.replace("\"memory_limit\":2147483648,", "\"compute_limit\":100,"),
                "compute_limit 100 is not a percent 1..=99",
            ),
            (
                good.replace("\"memory_limit\":2147483648,", "\"compute_limit\":0,"),
                "compute_limit 0 is not a percent 1..=99",
            ),
            (
                good.replace("\"memory_limit\":2147483648,", "\"compute_limit\":-3,"),
                "devices[1].compute_limit: invalid value",
            ),
            (
                good.replace(
                    "\"memory_limit\":2147483648,",
                    "\"compute_limit\":30,\"compute_policy\":\"sometimes\",",
                ),
                "devices[1].compute_policy: unknown variant",
            ),
            (
                good.replace(
                    "\"memory_limit\":2147483648,",
                    "\"compute_limit\":30,\"compute_window_ms\":5,",
                ),
                "device 1 (GPU-bbbb): compute_window_ms 5 is not within 10..=10000",
            ),
            (
                good.replace(
                    "\"memory_limit\":2147483648,",
                    "\"compute_limit\":30,\"memory\":{\"mode\":\"spill\",\"spill_limit\":5},",
                ),
                "memory mode spill needs a memory_limit",
            ),
        ];
        for (text, want) in cases {
            let msg = load_text(&text).expect_err(&text);
            assert!(
                msg.contains(want),
                "for {text:?}: got {msg:?}, want {want:?}"
            );
            assert!(!msg.contains('\n'), "multi-line error: {msg:?}");
        }
    }

    #[test]
    fn a_compute_share_with_or_without_a_memory_quota() {
        let mut l = sample();
        l.devices[0].compute_limit = Some(30);
        l.devices[1].memory_limit = None;
        l.devices[1].compute_limit = Some(70);
        l.devices[1].compute_policy = Policy::Force;
        l.devices[1].compute_window_ms = Some(250);
        let text = serde_json::to_string(&l).unwrap();
        assert!(
            text.contains(r#""compute_limit":70,"compute_policy":"force","compute_window_ms":250"#),
            "{text}"
        );
        let back = Limits::from_slice(text.as_bytes()).unwrap();
        assert_eq!(back, l);
        assert_eq!(back.devices[0].compute_share(), Some(30));
        assert_eq!(back.devices[1].memory_limit, None);
        assert_eq!(back.devices[1].compute_share(), Some(70));
        // A file without the keys (every file written before them) has no share; `disable` switches it off.
        let old = serde_json::to_string(&sample()).unwrap();
        assert!(!old.contains("compute"), "{old}");
        l.devices[1].compute_policy = Policy::Disable;
        assert_eq!(l.devices[1].compute_share(), None);
    }

    #[test]
    fn missing_file_names_the_path() {
        let err = Limits::load(Path::new("/nonexistent/vgpu/limits.json")).unwrap_err();
        assert!(matches!(err.kind, LimitsErrorKind::Io(_)));
        assert!(err.to_string().contains("/nonexistent/vgpu/limits.json"));
    }

    #[test]
    fn write_refuses_invalid() {
        let dir = tempfile::tempdir().unwrap();
        let mut l = sample();
        l.devices[1].ledger = "../escape".into();
        assert!(l.write_atomic(&dir.path().join("limits.json")).is_err());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn kubernetes_names_from_either_runtime_and_round_trip() {
        let kv = |v: &[(&str, &str)]| -> Vec<(String, String)> {
            v.iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect()
        };
        assert_eq!(KubeNames::from_annotations(&kv(&[("x", "y")])), None);
        let crio = KubeNames::from_annotations(&kv(&[
            ("io.kubernetes.pod.name", "p"),
            ("io.kubernetes.pod.namespace", "ns"),
            ("io.kubernetes.container.name", "c"),
        ]));
        let containerd = KubeNames::from_annotations(&kv(&[
            ("io.kubernetes.cri.sandbox-name", "p"),
            ("io.kubernetes.cri.sandbox-namespace", "ns"),
            ("io.kubernetes.cri.container-name", "c"),
        ]));
        assert_eq!(crio, containerd);
        let mut l = sample();
        l.kubernetes = crio;
        let text = serde_json::to_vec(&l).unwrap();
        assert_eq!(Limits::from_slice(&text).unwrap(), l);
        // Older files have no such key.
        assert_eq!(
            Limits::from_slice(&serde_json::to_vec(&sample()).unwrap())
                .unwrap()
                .kubernetes,
            None
        );
    }

    #[test]
    fn the_creator_round_trips_and_is_optional() {
        let mut l = sample();
        let text = serde_json::to_string(&l).unwrap();
        assert!(!text.contains("creator"), "{text}");
        assert_eq!(Limits::from_slice(text.as_bytes()).unwrap().creator, None);
        l.creator = Some(Creator {
            pid: 77,
            start_time: 123456,
        });
        let text = serde_json::to_string(&l).unwrap();
        assert!(
            text.contains(r#""creator":{"pid":77,"start_time":123456}"#),
            "{text}"
        );
        assert_eq!(Limits::from_slice(text.as_bytes()).unwrap(), l);
    }
}
