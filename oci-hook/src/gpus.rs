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
mod tests {
    use super::*;

    use crate::testing::kv;

    fn host() -> Vec<HostGpu> {
        (0..3)
            .map(|i| HostGpu {
                index: i,
                uuid: format!("GPU-{i}aaa"),
                total_memory: 16 << 30,
                minor: Some(i + 10),
            })
            .collect()
    }

    #[test]
    fn visible_devices_forms() {
        let s = from_spec(
            &kv(&[("NVIDIA_VISIBLE_DEVICES", "2,GPU-0aaa")]),
            &[],
            &[],
            &[],
        )
        .unwrap()
        .unwrap();
        let r = resolve(&s, &host()).unwrap();
        assert_eq!(r.iter().map(|g| g.index).collect::<Vec<_>>(), vec![2, 0]);
        let s = from_spec(&kv(&[("NVIDIA_VISIBLE_DEVICES", "all")]), &[], &[], &[])
            .unwrap()
            .unwrap();
        assert_eq!(resolve(&s, &host()).unwrap().len(), 3);
        let s = from_spec(&kv(&[("NVIDIA_VISIBLE_DEVICES", "void")]), &[], &[], &[])
            .unwrap()
            .unwrap();
        assert!(resolve(&s, &host()).unwrap().is_empty());
        assert_eq!(
            from_spec(&kv(&[("NVIDIA_VISIBLE_DEVICES", "")]), &[], &[], &[]).unwrap(),
            None
        );
    }

    /// NVIDIA's CDI spec (`nvidia-ctk cdi generate`) sets `NVIDIA_VISIBLE_DEVICES=void` (its runtime hook
    /// must not inject again) and puts the GPU's node in the spec: the node decides, not the env.
    #[test]
    fn void_leaves_the_choice_to_cdi_and_device_nodes() {
        let void = kv(&[("NVIDIA_VISIBLE_DEVICES", "void")]);
        let s = from_spec(
            &void,
            &[],
            &["/dev/nvidiactl".into(), "/dev/nvidia11".into()],
            &[],
        )
        .unwrap()
        .unwrap();
        assert_eq!(s.selectors, vec![Selector::Minor(11)]);
        assert_eq!(resolve(&s, &host()).unwrap()[0].index, 1);
        let a = kv(&[("cdi.k8s.io/x", "nvidia.com/gpu=2")]);
        let s = from_spec(&void, &a, &[], &[]).unwrap().unwrap();
        assert_eq!(s.selectors, vec![Selector::Index(2)]);
        // Nothing else names a GPU: no GPU.
        let none = from_spec(&void, &[], &[], &[]).unwrap();
        assert!(
            none.as_ref().is_none_or(|s| s.selectors.is_empty()),
            "{none:?}"
        );
    }

    #[test]
    fn cdi_and_device_nodes() {
        let a = kv(&[("cdi.k8s.io/vgpu", "nvidia.com/gpu=1,vendor.com/x=y")]);
        let s = from_spec(&[], &a, &[], &[]).unwrap().unwrap();
        assert_eq!(s.selectors, vec![Selector::Index(1)]);
        let s = from_spec(
            &[],
            &[],
            &["/dev/nvidiactl".into(), "/dev/nvidia12".into()],
            &[],
        )
        .unwrap()
        .unwrap();
        assert_eq!(resolve(&s, &host()).unwrap()[0].index, 2);
        assert_eq!(
            from_spec(&[], &[], &["/dev/nvidiactl".into()], &[]).unwrap(),
            None
        );
    }

    #[test]
    fn unknown_gpus_are_clear_errors() {
        let s = from_spec(&kv(&[("NVIDIA_VISIBLE_DEVICES", "7")]), &[], &[], &[])
            .unwrap()
            .unwrap();
        let e = resolve(&s, &host()).unwrap_err().to_string();
        assert!(
            e.contains("NVIDIA_VISIBLE_DEVICES=7") && e.contains("index 7"),
            "{e}"
        );
        let e = from_spec(&kv(&[("NVIDIA_VISIBLE_DEVICES", "x")]), &[], &[], &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("neither"), "{e}");
        let e = from_spec(&kv(&[("NVIDIA_VISIBLE_DEVICES", "0:1")]), &[], &[], &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("MIG"), "{e}");
    }

    fn indices(sel: Option<Selection>) -> Result<Vec<u32>, SelectError> {
        Ok(resolve(&sel.unwrap(), &host())?
            .iter()
            .map(|g| g.index)
            .collect())
    }

    // Regression (issue 25 item 8): the env beat CDI devices and device nodes, so a tenant granted GPU 1
    // who set NVIDIA_VISIBLE_DEVICES=0 had its quota put on GPU 0; an image's `all` beside one device put
    // the quota on every GPU; NVIDIA's CDI specs' `void` left a CDI container no GPU.
    #[test]
    fn the_devices_given_are_the_truth_and_the_env_must_agree() {
        let node1 = ["/dev/nvidiactl".to_string(), "/dev/nvidia11".to_string()];
        let env = |v: &str| kv(&[("NVIDIA_VISIBLE_DEVICES", v)]);
        let cdi = |v: &str| kv(&[("cdi.k8s.io/vgpu", v)]);
        // beside device nodes: `all`, `void`, `none` say nothing; the same GPU agrees
        for v in ["all", "void", "none", "", "1", "GPU-1aaa"] {
            let s = from_spec(&env(v), &[], &node1, &[]).unwrap();
            assert_eq!(indices(s).unwrap(), vec![1], "{v}");
        }
        // another GPU is refused, with one line naming both
        let e = indices(from_spec(&env("0"), &[], &node1, &[]).unwrap()).unwrap_err();
        assert!(matches!(&e, SelectError::Disagree { .. }), "{e:?}");
        let line = e.to_string();
        assert!(
            line.contains("env NVIDIA_VISIBLE_DEVICES=0 names GPU 0")
                && line.contains("given GPU 1 (devices /dev/nvidia11)")
                && !line.contains('\n'),
            "{line}"
        );
        // a superset too
        let e = indices(from_spec(&env("0,1"), &[], &node1, &[]).unwrap()).unwrap_err();
        assert!(matches!(e, SelectError::Disagree { .. }), "{e:?}");
        // CDI devices not applied yet (a lower runtime applies them): the same rules
        for v in ["all", "void", "1"] {
            let s = from_spec(&env(v), &cdi("nvidia.com/gpu=1"), &[], &[]).unwrap();
            assert_eq!(indices(s).unwrap(), vec![1], "{v}");
        }
        let e = indices(from_spec(&env("0"), &cdi("nvidia.com/gpu=1"), &[], &[]).unwrap());
        assert!(matches!(e, Err(SelectError::Disagree { .. })), "{e:?}");
        // CDI names beside the nodes they became agree; others are refused
        let s = from_spec(&[], &cdi("nvidia.com/gpu=1"), &node1, &[]).unwrap();
        assert_eq!(indices(s).unwrap(), vec![1]);
        let e = indices(from_spec(&[], &cdi("nvidia.com/gpu=0"), &node1, &[]).unwrap());
        assert!(matches!(e, Err(SelectError::Disagree { .. })), "{e:?}");
        // nothing given in the spec: the env decides (the legacy hook injects what it names)
        assert_eq!(
            indices(from_spec(&env("0"), &[], &[], &[]).unwrap()).unwrap(),
            vec![0]
        );
    }

    #[test]
    fn the_device_plugins_volume_mounts_list() {
        let env = kv(&[(
            "NVIDIA_VISIBLE_DEVICES",
            "/var/run/nvidia-container-devices",
        )]);
        let mounts = [
            "/proc".to_string(),
            "/var/run/nvidia-container-devices/GPU-2aaa".to_string(),
            "/var/run/nvidia-container-devices/0".to_string(),
            "/var/run/nvidia-container-devices-not/1".to_string(),
        ];
        let s = from_spec(&env, &[], &[], &mounts).unwrap().unwrap();
        assert!(s.source.contains("volume mounts"), "{}", s.source);
        assert_eq!(indices(Some(s)).unwrap(), vec![2, 0]);
        // no mount under the folder: no GPU
        let s = from_spec(&env, &[], &[], &mounts[..1]).unwrap();
        assert_eq!(indices(s).unwrap(), Vec::<u32>::new());
        // beside device nodes it must agree
        let nodes = ["/dev/nvidia12".to_string(), "/dev/nvidia10".to_string()];
        assert_eq!(
            indices(from_spec(&env, &[], &nodes, &mounts).unwrap()).unwrap(),
            vec![2, 0]
        );
        let e = indices(from_spec(&env, &[], &nodes[..1], &mounts).unwrap());
        assert!(matches!(e, Err(SelectError::Disagree { .. })), "{e:?}");
        // a name under the folder that is no GPU is one line
        let bad = ["/var/run/nvidia-container-devices/x".to_string()];
        let e = from_spec(&env, &[], &[], &bad).unwrap_err();
        assert!(matches!(e, SelectError::BadName { .. }), "{e:?}");
    }
}
