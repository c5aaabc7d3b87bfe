//! The claims this node has prepared, kept in `<plugin dir>/checkpoint.json` (written atomically after
//! every change) so that a restarted plugin answers the kubelet's repeated `NodePrepareResources` with the
//! same devices without asking the API server, and unprepares claims it prepared before the restart.
//! Not here: preparing (`crate::plugin`).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The file's format version.
pub const VERSION: u32 = 1;

/// One device as the kubelet is told it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedDevice {
    pub request: String,
    /// The claim's other requests the same GPU answers (several requests on one GPU: one device).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub more_requests: Vec<String>,
    pub pool: String,
    pub device: String,
    pub cdi_device_ids: Vec<String>,
}

/// One prepared claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedClaim {
    pub namespace: String,
    pub name: String,
    /// The claim's CDI spec file.
    pub spec: PathBuf,
    /// The quota it fixes (`VGPU_CLAIM_QUOTA`).
    pub quota: String,
    /// The uids of the pods it is reserved for (`VGPU_CLAIM_PODS`).
    #[serde(default)]
    pub pods: Vec<String>,
    pub devices: Vec<PreparedDevice>,
}

/// Every prepared claim, by uid.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub version: u32,
    pub claims: BTreeMap<String, PreparedClaim>,
}

/// A checkpoint that cannot be read or written. `Display` is one line naming the file.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("cannot read the checkpoint {}: {error}", path.display())]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("the checkpoint {} is not one this plugin wrote: {why}", path.display())]
    Malformed { path: PathBuf, why: String },
    #[error("cannot write the checkpoint {}: {error}", path.display())]
    Write {
        path: PathBuf,
        error: std::io::Error,
    },
}

impl Checkpoint {
    /// Reads `path`; an absent file is an empty checkpoint (the plugin's first start).
    pub fn load(path: &Path) -> Result<Checkpoint, CheckpointError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Checkpoint {
                    version: VERSION,
                    ..Default::default()
                })
            }
            Err(error) => {
                return Err(CheckpointError::Read {
                    path: path.to_path_buf(),
                    error,
                })
            }
        };
        let malformed = |why: String| CheckpointError::Malformed {
            path: path.to_path_buf(),
            why,
        };
        let c: Checkpoint = serde_json::from_str(&text).map_err(|e| malformed(e.to_string()))?;
        if c.version != VERSION {
            return Err(malformed(format!(
                "version {} (this plugin writes {VERSION})",
                c.version
            )));
        }
        Ok(c)
    }

    /// Writes it to `path` atomically (mode 0600: the plugin's own bookkeeping).
    pub fn save(&self, path: &Path) -> Result<(), CheckpointError> {
        use vgpu_host::atomic::{write_atomic, WriteOptions};
        let text = serde_json::to_string_pretty(self).expect("a checkpoint serialises");
        write_atomic(
            path,
            text.as_bytes(),
            WriteOptions::with_mode(0o600).create_parents().durable(),
        )
        .map_err(|error| CheckpointError::Write {
            path: path.to_path_buf(),
            error,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saved_and_loaded_back() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/checkpoint.json");
        let empty = Checkpoint::load(&p).unwrap();
        assert!(empty.claims.is_empty());
        let mut c = empty;
        c.claims.insert(
            "uid-1".into(),
            PreparedClaim {
                namespace: "ns".into(),
                name: "c".into(),
                spec: "/var/run/cdi/x.json".into(),
                quota: "vgpu.io/memory-limit=1".into(),
                pods: vec!["pod-1".into()],
                devices: vec![PreparedDevice {
                    request: "gpu".into(),
                    more_requests: vec![],
                    pool: "node".into(),
                    device: "gpu-0".into(),
                    cdi_device_ids: vec!["vgpu.io/claim=uid-1-gpu-0".into()],
                }],
            },
        );
        c.save(&p).unwrap();
        assert_eq!(Checkpoint::load(&p).unwrap(), c);
        std::fs::write(&p, "{").unwrap();
        assert!(matches!(
            Checkpoint::load(&p),
            Err(CheckpointError::Malformed { .. })
        ));
        std::fs::write(&p, r#"{"version":9,"claims":{}}"#).unwrap();
        assert!(matches!(
            Checkpoint::load(&p),
            Err(CheckpointError::Malformed { .. })
        ));
    }
}
