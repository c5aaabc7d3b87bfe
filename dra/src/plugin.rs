//! Preparing and unpreparing claims on this node: a claim's allocation (`crate::allocation`) becomes its
//! CDI spec (`crate::claim_spec`) and a checkpoint entry (`crate::checkpoint`), in that order, so that a
//! claim in the checkpoint always has its spec; unprepare removes the spec, then the entry. Both are
//! idempotent, as the kubelet may call them again for the same claim (after its restart or ours). A plugin
//! killed between the spec and the checkpoint (SIGKILL, a node's power) leaves a spec of a claim it never
//! recorded, which no unprepare would name: at its start the plugin removes every claim spec of its CDI
//! folder whose claim its checkpoint does not hold (`sweep_orphans`). Not here: the gRPC services (`crate::kubelet`), fetching the claim (`crate::apiserver`).

use crate::allocation::{self, AllocationError};
use crate::checkpoint::{Checkpoint, CheckpointError, PreparedClaim, PreparedDevice};
use crate::claim_spec::{self, Hooks};
use k8s_openapi::api::resource::v1::ResourceClaim;
use std::path::PathBuf;
use std::sync::Mutex;
use vgpu_host::cdi::CdiError;
use vgpu_host::nvml::HostGpu;

/// This node's driver.
pub struct Plugin {
    pub driver: String,
    pub node: String,
    /// The node's GPUs as last read (the publisher's rescans replace them).
    gpus: Mutex<Vec<HostGpu>>,
    pub cdi_dir: PathBuf,
    pub hooks: Hooks,
    pub checkpoint_path: PathBuf,
    state: Mutex<Checkpoint>,
}

/// Why a claim was not prepared or unprepared. `Display` is one line (the kubelet shows it in the pod's
/// events).
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error(transparent)]
    Allocation(#[from] AllocationError),
    #[error(
        "claim {claim}: the API server's claim has uid {found}, the kubelet asked for {asked}"
    )]
    UidMismatch {
        claim: String,
        asked: String,
        found: String,
    },
    #[error("claim {claim}: {error}")]
    Cdi { claim: String, error: CdiError },
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("cannot remove {}: {error}", path.display())]
    Remove {
        path: PathBuf,
        error: std::io::Error,
    },
}

impl Plugin {
    /// The plugin with the claims its checkpoint says are prepared.
    pub fn new(
        driver: String,
        node: String,
        gpus: Vec<HostGpu>,
        cdi_dir: PathBuf,
        hooks: Hooks,
        checkpoint_path: PathBuf,
    ) -> Result<Plugin, CheckpointError> {
        let checkpoint = Checkpoint::load(&checkpoint_path)?;
        for (path, e) in sweep_orphans(&cdi_dir, &checkpoint) {
            match e {
                None => eprintln!(
                    "vgpu-dra-plugin: removed {}: the spec of a claim the checkpoint does not hold (a prepare killed before it was recorded)",
                    path.display()
                ),
                Some(e) => eprintln!("vgpu-dra-plugin: cannot remove {}: {e}", path.display()),
            }
        }
        let state = Mutex::new(checkpoint);
        Ok(Plugin {
            driver,
            node,
            gpus: Mutex::new(gpus),
            cdi_dir,
            hooks,
            checkpoint_path,
            state,
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, Checkpoint> {
        // A panic while holding the lock left the checkpoint as it was on disk or newer: keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Replaces the node's GPUs (the slice published for them changed).
    pub fn set_gpus(&self, gpus: Vec<HostGpu>) {
        *self.gpus.lock().unwrap_or_else(|p| p.into_inner()) = gpus;
    }

    /// The claim `uid` if it is prepared.
    pub fn prepared(&self, uid: &str) -> Option<PreparedClaim> {
        self.state().claims.get(uid).cloned()
    }

    /// Prepares claim `uid` from its API object: the spec written, then the checkpoint.
    pub fn prepare(&self, uid: &str, claim: &ResourceClaim) -> Result<PreparedClaim, PrepareError> {
        let namespace = claim.metadata.namespace.clone().unwrap_or_default();
        let name = claim.metadata.name.clone().unwrap_or_default();
        let found = claim.metadata.uid.clone().unwrap_or_default();
        if found != uid {
            return Err(PrepareError::UidMismatch {
                claim: format!("{namespace}/{name}"),
                asked: uid.to_string(),
                found,
            });
        }
        let mut state = self.state();
        if let Some(p) = state.claims.get(uid) {
            return Ok(p.clone());
        }
        let gpus = self.gpus.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let devices = allocation::read(claim, &self.driver, &self.node, &gpus)?;
        let pods = allocation::consumers(claim)?;
        let cdi_err = |error| PrepareError::Cdi {
            claim: format!("{namespace}/{name}"),
            error,
        };
        let spec = claim_spec::build(uid, &devices, &pods, &self.hooks).map_err(cdi_err)?;
        let path = claim_spec::write(&self.cdi_dir, uid, &spec).map_err(cdi_err)?;
        let ids = spec.device_names();
        let prepared = PreparedClaim {
            namespace,
            name,
            spec: path.clone(),
            quota: allocation::quota(&devices),
            pods,
            devices: devices
                .iter()
                .zip(ids)
                .map(|(d, id)| PreparedDevice {
                    request: d.request.clone(),
                    more_requests: d.more_requests.clone(),
                    pool: self.node.clone(),
                    device: d.device.clone(),
                    cdi_device_ids: vec![id],
                })
                .collect(),
        };
        state.claims.insert(uid.to_string(), prepared.clone());
        if let Err(e) = state.save(&self.checkpoint_path) {
            state.claims.remove(uid);
            let _ = std::fs::remove_file(&path);
            return Err(e.into());
        }
        Ok(prepared)
    }

    /// Unprepares claim `uid`: its spec removed, then its entry. A claim not prepared here is no error.
    pub fn unprepare(&self, uid: &str) -> Result<(), PrepareError> {
        let mut state = self.state();
        let Some(p) = state.claims.get(uid).cloned() else {
            return Ok(());
        };
        match std::fs::remove_file(&p.spec) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => {
                return Err(PrepareError::Remove {
                    path: p.spec,
                    error,
                })
            }
        }
        state.claims.remove(uid);
        if let Err(e) = state.save(&self.checkpoint_path) {
            state.claims.insert(uid.to_string(), p);
            return Err(e.into());
        }
        Ok(())
    }
}

/// Removes the claim specs (`vgpu.io-claim_<uid>.json`, `claim_spec::path`) of `cdi_dir` whose claim the
/// checkpoint does not hold; what it removed, or could not (with why). A folder that cannot be read has
/// nothing to sweep (the plugin writes it at its first prepare).
pub fn sweep_orphans(
    cdi_dir: &std::path::Path,
    checkpoint: &Checkpoint,
) -> Vec<(PathBuf, Option<std::io::Error>)> {
    let Ok(entries) = std::fs::read_dir(cdi_dir) else {
        return vec![];
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(uid) = name
            .strip_prefix("vgpu.io-claim_")
            .and_then(|n| n.strip_suffix(".json"))
        else {
            continue;
        };
        let path = claim_spec::path(cdi_dir, uid);
        if checkpoint.claims.contains_key(uid) || path != e.path() {
            continue;
        }
        match std::fs::remove_file(&path) {
            Ok(()) => out.push((path, None)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => out.push((path, Some(e))),
        }
    }
    out
}

#[cfg(test)]
mod tests;
