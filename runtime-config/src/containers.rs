//! Which container a command line names (`vgpuctl update ID`): the full id, a unique prefix of it (as
//! `vgpuctl status` prints twelve characters), or a name — the Kubernetes names the hook recorded
//! (`container`, `pod/container`, `namespace/pod/container`), Docker's (asked of dockerd) and Podman's
//! (its containers/storage record, [`podman_names`]). As Docker's CLI decides: the full id first, then an
//! exact name, then an id prefix; two containers a reference fits at one step is an error that lists them.
//! Not here: reading the state root (`vgpu_host::inventory`), dockerd's API (`vgpu_monitor::docker`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// One container of the state root and every name it is known by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Known {
    pub id: String,
    pub names: Vec<String>,
}

/// Why a reference names no one container. Each is one line.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RefError {
    #[error("no container {reference} under {root}: no id, id prefix or name (Kubernetes, Docker or Podman) fits it (the environment-only mode has no state)")]
    None { reference: String, root: String },
    #[error("{reference} is ambiguous: it is {}; give more of the id", .matches.join(", "))]
    Ambiguous {
        reference: String,
        matches: Vec<String>,
    },
}

/// The names a container is known by: its Kubernetes names (when recorded), Docker's and Podman's.
pub fn names_of(
    kubernetes: Option<&vgpu_ledger::KubeNames>,
    docker: Option<&String>,
    podman: Option<&String>,
) -> Vec<String> {
    let mut names = vec![];
    if let Some(k) = kubernetes.filter(|k| !k.container.is_empty()) {
        names.push(k.container.clone());
        if !k.pod.is_empty() {
            names.push(format!("{}/{}", k.pod, k.container));
            if !k.namespace.is_empty() {
                names.push(format!("{}/{}/{}", k.namespace, k.pod, k.container));
            }
        }
    }
    names.extend(docker.cloned());
    names.extend(podman.cloned());
    names
}

/// Every container of the state root under `root` with its names. dockerd is asked (its socket from
/// `DOCKER_HOST`, within `vgpu_monitor::docker::DEADLINE`) only when `reference` is no full id there; a
/// dockerd that does not answer names nothing. A state root that cannot be read lists no container.
pub fn known(root: &vgpu_host::state_root::StateRoot, reference: &str) -> Vec<Known> {
    use vgpu_monitor::docker;
    let containers = vgpu_host::inventory::containers(root).unwrap_or_default();
    if containers.iter().any(|c| c.id() == reference) {
        return vec![Known {
            id: reference.to_string(),
            names: vec![],
        }];
    }
    let dockerd = docker::socket(std::env::var("DOCKER_HOST").ok().as_deref())
        .filter(|s| s.exists())
        .and_then(|s| docker::names(&s, docker::DEADLINE).ok())
        .unwrap_or_default();
    let podman = podman_names(&podman_graphroot(
        std::env::var("CONTAINERS_STORAGE_CONF").ok().as_deref(),
    ));
    containers
        .iter()
        .map(|c| Known {
            id: c.id().to_string(),
            names: names_of(
                c.limits.as_ref().ok().and_then(|l| l.kubernetes.as_ref()),
                dockerd.get(c.id()),
                podman.get(c.id()),
            ),
        })
        .collect()
}

/// The one container `reference` names among `known` (the state root's, under `root`).
pub fn resolve(reference: &str, known: &[Known], root: &Path) -> Result<String, RefError> {
    if let Some(k) = known.iter().find(|k| k.id == reference) {
        return Ok(k.id.clone());
    }
    let by_name: Vec<&Known> = known
        .iter()
        .filter(|k| k.names.iter().any(|n| n == reference))
        .collect();
    let by_prefix: Vec<&Known> = if reference.is_empty() {
        vec![]
    } else {
        known
            .iter()
            .filter(|k| k.id.starts_with(reference))
            .collect()
    };
    let (found, how) = if by_name.is_empty() {
        (by_prefix, "id prefix")
    } else {
        (by_name, "name")
    };
    match found[..] {
        [one] => Ok(one.id.clone()),
        [] => Err(RefError::None {
            reference: reference.to_string(),
            root: root.display().to_string(),
        }),
        _ => Err(RefError::Ambiguous {
            reference: reference.to_string(),
            matches: found
                .iter()
                .map(|k| format!("the {how} of {}", short(&k.id)))
                .collect(),
        }),
    }
}

fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}

/// Largest containers/storage record read (a few hundred bytes per container).
const MAX_RECORD: u64 = 16 << 20;

/// Podman's storage root: `graphroot` of the `[storage]` table of containers' `storage.conf`
/// (`CONTAINERS_STORAGE_CONF`, else `/etc/containers/storage.conf`), else `/var/lib/containers/storage`.
pub fn podman_graphroot(conf: Option<&str>) -> PathBuf {
    let path = conf.unwrap_or("/etc/containers/storage.conf");
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| t.parse::<toml_edit::DocumentMut>().ok())
        .and_then(|d| {
            d.get("storage")?
                .get("graphroot")?
                .as_str()
                .map(PathBuf::from)
        })
        .unwrap_or_else(|| PathBuf::from("/var/lib/containers/storage"))
}

/// The names Podman gave its containers, by full id: the first name of each container in its
/// containers/storage record (`<graphroot>/<driver>-containers/containers.json`, every driver's). Podman
/// writes no name into the OCI spec (4.3: its hostname is the short id, its annotations hold none), so this
/// record is where it is kept. A record that cannot be read names nothing.
pub fn podman_names(graphroot: &Path) -> HashMap<String, String> {
    #[derive(serde::Deserialize)]
    struct Entry {
        id: String,
        #[serde(default)]
        names: Vec<String>,
    }
    let mut out = HashMap::new();
    let Ok(dirs) = std::fs::read_dir(graphroot) else {
        return out;
    };
    for d in dirs.flatten() {
        if !d.file_name().to_string_lossy().ends_with("-containers") {
            continue;
        }
        let record = d.path().join("containers.json");
        let small =
            std::fs::symlink_metadata(&record).is_ok_and(|m| m.is_file() && m.len() <= MAX_RECORD);
        let Some(entries) = small
            .then(|| std::fs::read(&record).ok())
            .flatten()
            .and_then(|b| serde_json::from_slice::<Vec<Entry>>(&b).ok())
        else {
            continue;
        };
        for e in entries {
            if let Some(n) = e.names.into_iter().next() {
                out.insert(e.id, n);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
