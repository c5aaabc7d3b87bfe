//! Which GPUs a container gets, read from its spec, and their resolution to host GPUs.
//! Not here: the quota on them (`crate::memory_request`, `crate::plan`) or asking NVML (`vgpu_host::nvml`).
//!
//! The devices the container is given are the truth, in this order: `/dev/nvidiaN` nodes in `linux.devices`
//! (N is the NVML minor number; CDI edits an engine applied put them there), else CDI device names
//! `nvidia.com/gpu=<index|uuid|all>` in `cdi.k8s.io/*` annotations (a lower runtime applies them). The env
//! `NVIDIA_VISIBLE_DEVICES` (indices, UUIDs, `all`, `none`/`void`, or the device plugin's volume-mounts
//! folder, whose entries name the GPUs) decides only where it is what injects them: the legacy NVIDIA hook,
//! with no device node and no CDI device in the spec. Beside given devices, `all`, `none` and `void` say
//! nothing (NVIDIA's CDI specs set `void`; an image's `all` beside one device is that device); a list, or
//! CDI names beside device nodes, must name the same GPUs, or the container is refused with one line (a
//! tenant granted GPU 1 who sets `NVIDIA_VISIBLE_DEVICES=0` would put its quota on GPU 0 and run
//! unwatched on GPU 1). The order of the deciding list is the container's GPU order, which
//! `vgpu.io/memory-limit.<i>` refers to.

use vgpu_host::nvml::HostGpu;
use vgpu_ledger::keys;

/// One GPU named by the spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    /// Every GPU of the host.
    All,
    /// NVML index on the host.
    Index(u32),
    /// `GPU-…` UUID.
    Uuid(String),
    /// Minor number of a `/dev/nvidiaN` node.
    Minor(u32),
}

/// GPUs as one source of the spec names them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    pub selectors: Vec<Selector>,
    /// Where the names came from, for messages (`devices /dev/nvidia1`, `env NVIDIA_VISIBLE_DEVICES=0`).
    pub source: String,
}

/// The GPUs the container is given, where that came from, and the other sources that must agree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    pub selectors: Vec<Selector>,
    pub source: String,
    /// Other sources naming GPUs, each of which must name the same set ([`resolve`] refuses otherwise).
    pub agree: Vec<Named>,
}

/// Why the container's GPUs cannot be told. `Display` is one line naming the source.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectError {
    #[error("{from}: MIG device {name:?} is not supported by vgpu")]
    Mig { from: String, name: String },
    #[error("{from}: {name:?} is neither a GPU index nor a GPU UUID")]
    BadName { from: String, name: String },
    #[error("{from}: no GPU with index {index} on this host ({count} GPUs)")]
    NoIndex {
        from: String,
        index: u32,
        count: usize,
    },
    #[error("{from}: no GPU {uuid} on this host")]
    NoUuid { from: String, uuid: String },
    #[error("{from}: no GPU behind /dev/nvidia{minor} on this host")]
    NoMinor { from: String, minor: u32 },
    /// Two sources name different GPUs (`given`: the devices the container gets).
    #[error("{claim} names {claim_gpus} but the container is given {given_gpus} ({given}): refused, as the GPUs it gets and the ones its quota would go on must be the same")]
    Disagree {
        given: String,
        given_gpus: String,
        claim: String,
        claim_gpus: String,
    },
}

const VISIBLE: &str = keys::env::VISIBLE_DEVICES;
/// The device plugin's `volume-mounts` strategy: `NVIDIA_VISIBLE_DEVICES` names this folder, and one mount
/// per GPU under it names the GPU (the legacy NVIDIA hook reads the list from the mounts).
pub const VOLUME_MOUNTS_DIR: &str = "/var/run/nvidia-container-devices";
const CDI_PREFIX: &str = "cdi.k8s.io/";
const CDI_KIND: &str = "nvidia.com/gpu=";

/// What `NVIDIA_VISIBLE_DEVICES` says.
enum EnvSays {
    Nothing,
    /// `none` / `void`: no GPU.
    NoGpu(String),
    /// `all`: every GPU the container can get.
    All(Named),
    /// A list (or the volume-mounts list).
    Gpus(Named),
}

fn env_says(env: &[(String, String)], mounts: &[String]) -> Result<EnvSays, SelectError> {
    let Some((_, v)) = env.iter().rev().find(|(k, _)| k == VISIBLE) else {
        return Ok(EnvSays::Nothing);
    };
    let v = v.trim();
    let source = format!("env {VISIBLE}={v}");
    if v.is_empty() {
        return Ok(EnvSays::Nothing);
    }
    if v == "none" || v == "void" {
        return Ok(EnvSays::NoGpu(source));
    }
    if v.trim_end_matches('/') == VOLUME_MOUNTS_DIR {
        let source = format!("volume mounts under {VOLUME_MOUNTS_DIR} ({source})");
        let selectors = mounts
            .iter()
            .filter_map(|m| m.strip_prefix(VOLUME_MOUNTS_DIR)?.strip_prefix('/'))
            .map(|n| parse_name(n.trim_end_matches('/'), &source))
            .collect::<Result<_, _>>()?;
        return Ok(EnvSays::Gpus(Named { selectors, source }));
    }
    let selectors = v
        .split(',')
        .map(|s| parse_name(s.trim(), &source))
        .collect::<Result<Vec<_>, _>>()?;
    let named = Named { selectors, source };
    Ok(if named.selectors == [Selector::All] {
        EnvSays::All(named)
    } else {
        EnvSays::Gpus(named)
    })
}

/// The GPUs named by `nvidia.com/gpu=` CDI devices in `cdi.k8s.io/*` annotations, if any.
fn cdi_names(annotations: &[(String, String)]) -> Result<Option<Named>, SelectError> {
    let mut selectors = Vec::new();
    let mut names = Vec::new();
    for (k, v) in annotations
        .iter()
        .filter(|(k, _)| k.starts_with(CDI_PREFIX))
    {
        for name in v.split(',').map(str::trim) {
            if let Some(n) = name.strip_prefix(CDI_KIND) {
                selectors.push(parse_name(n, &format!("annotation {k}"))?);
                names.push(name.to_string());
            }
        }
    }
    Ok((!selectors.is_empty()).then(|| Named {
        selectors,
        source: format!("CDI devices {}", names.join(",")),
    }))
}

/// The `/dev/nvidiaN` nodes of `linux.devices`, if any.
fn device_nodes(devices: &[String]) -> Option<Named> {
    let nodes: Vec<_> = devices
        .iter()
        .filter_map(|p| {
            p.strip_prefix("/dev/nvidia")?
                .parse::<u32>()
                .ok()
                .map(|m| (p, m))
        })
        .collect();
    if nodes.is_empty() {
        return None;
    }
    let names: Vec<&str> = nodes.iter().map(|(p, _)| p.as_str()).collect();
    Some(Named {
        selectors: nodes.iter().map(|&(_, m)| Selector::Minor(m)).collect(),
        source: format!("devices {}", names.join(",")),
    })
}

/// Reads the GPU selection; `None` when the spec names no GPU at all. `mounts`: the spec's mount
/// destinations (the volume-mounts list).
pub fn from_spec(
    env: &[(String, String)],
    annotations: &[(String, String)],
    devices: &[String],
    mounts: &[String],
) -> Result<Option<Selection>, SelectError> {
    let nodes = device_nodes(devices);
    let cdi = cdi_names(annotations)?;
    let env = env_says(env, mounts)?;
    let (given, mut agree) = match (nodes, cdi) {
        (Some(n), cdi) => (n, cdi.into_iter().collect::<Vec<_>>()),
        (None, Some(c)) => (c, vec![]),
        // Nothing given in the spec: the env is what injects the GPUs (the legacy NVIDIA hook).
        (None, None) => {
            return Ok(match env {
                EnvSays::Nothing => None,
                EnvSays::NoGpu(source) => Some(Selection {
                    selectors: vec![],
                    source,
                    agree: vec![],
                }),
                EnvSays::All(n) | EnvSays::Gpus(n) => Some(Selection {
                    selectors: n.selectors,
                    source: n.source,
                    agree: vec![],
                }),
            })
        }
    };
    if let EnvSays::Gpus(n) = env {
        agree.push(n);
    }
    Ok(Some(Selection {
        selectors: given.selectors,
        source: given.source,
        agree,
    }))
}

fn parse_name(s: &str, source: &str) -> Result<Selector, SelectError> {
    if s == "all" {
        return Ok(Selector::All);
    }
    if s.starts_with("MIG-") || s.contains(':') {
        return Err(SelectError::Mig {
            from: source.to_string(),
            name: s.to_string(),
        });
    }
    if s.starts_with("GPU-") {
        return Ok(Selector::Uuid(s.to_string()));
    }
    match s.parse::<u32>() {
        Ok(i) if !s.starts_with('+') => Ok(Selector::Index(i)),
        _ => Err(SelectError::BadName {
            from: source.to_string(),
            name: s.to_string(),
        }),
    }
}

/// Resolves the selection against the host's GPUs, in the container's order, without duplicates; refuses
/// a selection whose other sources name other GPUs ([`SelectError::Disagree`]).
pub fn resolve(sel: &Selection, host: &[HostGpu]) -> Result<Vec<HostGpu>, SelectError> {
    let given = resolve_named(&sel.selectors, &sel.source, host)?;
    for claim in &sel.agree {
        let named = resolve_named(&claim.selectors, &claim.source, host)?;
        let same = named.len() == given.len() && named.iter().all(|n| given.contains(n));
        if !same {
            return Err(SelectError::Disagree {
                given: sel.source.clone(),
                given_gpus: describe(&given),
                claim: claim.source.clone(),
                claim_gpus: describe(&named),
            });
        }
    }
    Ok(given)
}

/// `GPU 1` / `GPUs 0, 1` / `no GPU`, by host index.
fn describe(gpus: &[HostGpu]) -> String {
    let list: Vec<String> = gpus.iter().map(|g| g.index.to_string()).collect();
    match list.len() {
        0 => "no GPU".to_string(),
        1 => format!("GPU {}", list[0]),
        _ => format!("GPUs {}", list.join(", ")),
    }
}

fn resolve_named(
    selectors: &[Selector],
    source: &str,
    host: &[HostGpu],
) -> Result<Vec<HostGpu>, SelectError> {
    let mut out: Vec<HostGpu> = Vec::new();
    let mut push = |g: &HostGpu| {
        if !out.iter().any(|o| o.uuid == g.uuid) {
            out.push(g.clone());
        }
    };
    let source = || source.to_string();
    for s in selectors {
        match s {
            Selector::All => host.iter().for_each(&mut push),
            Selector::Index(i) => match host.iter().find(|g| g.index == *i) {
                Some(g) => push(g),
                None => {
                    return Err(SelectError::NoIndex {
                        from: source(),
                        index: *i,
                        count: host.len(),
                    })
                }
            },
            Selector::Uuid(u) => match host.iter().find(|g| g.uuid.eq_ignore_ascii_case(u)) {
                Some(g) => push(g),
                None => {
                    return Err(SelectError::NoUuid {
                        from: source(),
                        uuid: u.clone(),
                    })
                }
            },
            Selector::Minor(m) => {
                // Drivers without minor numbers in NVML number the nodes by index.
                let g = host
                    .iter()
                    .find(|g| g.minor == Some(*m))
                    .or_else(|| host.iter().find(|g| g.minor.is_none() && g.index == *m));
                match g {
                    Some(g) => push(g),
                    None => {
                        return Err(SelectError::NoMinor {
                            from: source(),
                            minor: *m,
                        })
                    }
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
