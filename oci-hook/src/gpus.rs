//! Which GPUs a container gets, read from its spec, and their resolution to host GPUs.
//! Not here: the quota on them (`crate::quota`, `crate::plan`) or asking NVML (`crate::nvml`).
//!
//! Sources, first present wins: env `NVIDIA_VISIBLE_DEVICES` (indices, UUIDs, `all`, `none`), CDI device
//! names `nvidia.com/gpu=<index|uuid|all>` in `cdi.k8s.io/*` annotations, then `/dev/nvidiaN` nodes in
//! `linux.devices` (N is the NVML minor number). `NVIDIA_VISIBLE_DEVICES=void` decides nothing: NVIDIA's
//! CDI spec sets it so that its runtime hook does not inject again, and puts the GPUs in the spec itself. The order of the list is the container's GPU
//! order, which `vgpu.io/memory-limit.<i>` refers to.

use crate::nvml::HostGpu;
use anyhow::{bail, Result};

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

/// The GPUs named by a spec and where the names came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    pub selectors: Vec<Selector>,
    pub source: String,
}

const VISIBLE: &str = "NVIDIA_VISIBLE_DEVICES";
const CDI_PREFIX: &str = "cdi.k8s.io/";
const CDI_KIND: &str = "nvidia.com/gpu=";

/// Reads the GPU selection; `None` when the spec names no GPU at all.
pub fn from_spec(
    env: &[(String, String)],
    annotations: &[(String, String)],
    devices: &[String],
) -> Result<Option<Selection>> {
    if let Some((_, v)) = env.iter().rev().find(|(k, _)| k == VISIBLE) {
        let v = v.trim();
        if !v.is_empty() && v != "void" {
            let source = format!("env {VISIBLE}={v}");
            if v == "none" {
                return Ok(Some(Selection {
                    selectors: vec![],
                    source,
                }));
            }
            let selectors = v
                .split(',')
                .map(|s| parse_name(s.trim(), &source))
                .collect::<Result<_>>()?;
            return Ok(Some(Selection { selectors, source }));
        }
    }
    let mut cdi = Vec::new();
    let mut cdi_src = Vec::new();
    for (k, v) in annotations
        .iter()
        .filter(|(k, _)| k.starts_with(CDI_PREFIX))
    {
        for name in v.split(',').map(str::trim) {
            if let Some(n) = name.strip_prefix(CDI_KIND) {
                cdi.push(parse_name(n, &format!("annotation {k}"))?);
                cdi_src.push(name.to_string());
            }
        }
    }
    if !cdi.is_empty() {
        return Ok(Some(Selection {
            selectors: cdi,
            source: format!("CDI devices {}", cdi_src.join(",")),
        }));
    }
    let nodes: Vec<_> = devices
        .iter()
        .filter_map(|p| {
            p.strip_prefix("/dev/nvidia")?
                .parse::<u32>()
                .ok()
                .map(|m| (p, m))
        })
        .collect();
    if !nodes.is_empty() {
        let names: Vec<&str> = nodes.iter().map(|(p, _)| p.as_str()).collect();
        return Ok(Some(Selection {
            selectors: nodes.iter().map(|&(_, m)| Selector::Minor(m)).collect(),
            source: format!("devices {}", names.join(",")),
        }));
    }
    Ok(None)
}

fn parse_name(s: &str, source: &str) -> Result<Selector> {
    if s == "all" {
        return Ok(Selector::All);
    }
    if s.starts_with("MIG-") || s.contains(':') {
        bail!("{source}: MIG device {s:?} is not supported by vgpu");
    }
    if s.starts_with("GPU-") {
        return Ok(Selector::Uuid(s.to_string()));
    }
    match s.parse::<u32>() {
        Ok(i) if !s.starts_with('+') => Ok(Selector::Index(i)),
        _ => bail!("{source}: {s:?} is neither a GPU index nor a GPU UUID"),
    }
}

/// Resolves the selection against the host's GPUs, in the container's order, without duplicates.
pub fn resolve(sel: &Selection, host: &[HostGpu]) -> Result<Vec<HostGpu>> {
    let mut out: Vec<HostGpu> = Vec::new();
    let mut push = |g: &HostGpu| {
        if !out.iter().any(|o| o.uuid == g.uuid) {
            out.push(g.clone());
        }
    };
    for s in &sel.selectors {
        match s {
            Selector::All => host.iter().for_each(&mut push),
            Selector::Index(i) => match host.iter().find(|g| g.index == *i) {
                Some(g) => push(g),
                None => bail!(
                    "{}: no GPU with index {i} on this host ({} GPUs)",
                    sel.source,
                    host.len()
                ),
            },
            Selector::Uuid(u) => match host.iter().find(|g| g.uuid.eq_ignore_ascii_case(u)) {
                Some(g) => push(g),
                None => bail!("{}: no GPU {u} on this host", sel.source),
            },
            Selector::Minor(m) => {
                // Drivers without minor numbers in NVML number the nodes by index.
                let g = host
                    .iter()
                    .find(|g| g.minor == Some(*m))
                    .or_else(|| host.iter().find(|g| g.minor.is_none() && g.index == *m));
                match g {
                    Some(g) => push(g),
                    None => bail!("{}: no GPU behind /dev/nvidia{m} on this host", sel.source),
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
        let s = from_spec(&kv(&[("NVIDIA_VISIBLE_DEVICES", "2,GPU-0aaa")]), &[], &[])
            .unwrap()
            .unwrap();
        let r = resolve(&s, &host()).unwrap();
        assert_eq!(r.iter().map(|g| g.index).collect::<Vec<_>>(), vec![2, 0]);
        let s = from_spec(&kv(&[("NVIDIA_VISIBLE_DEVICES", "all")]), &[], &[])
            .unwrap()
            .unwrap();
        assert_eq!(resolve(&s, &host()).unwrap().len(), 3);
        let s = from_spec(&kv(&[("NVIDIA_VISIBLE_DEVICES", "none")]), &[], &[])
            .unwrap()
            .unwrap();
        assert!(resolve(&s, &host()).unwrap().is_empty());
        assert_eq!(
            from_spec(&kv(&[("NVIDIA_VISIBLE_DEVICES", "")]), &[], &[]).unwrap(),
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
        )
        .unwrap()
        .unwrap();
        assert_eq!(s.selectors, vec![Selector::Minor(11)]);
        assert_eq!(resolve(&s, &host()).unwrap()[0].index, 1);
        let a = kv(&[("cdi.k8s.io/x", "nvidia.com/gpu=2")]);
        let s = from_spec(&void, &a, &[]).unwrap().unwrap();
        assert_eq!(s.selectors, vec![Selector::Index(2)]);
        // Nothing else names a GPU: none.
        assert_eq!(from_spec(&void, &[], &[]).unwrap(), None);
    }

    #[test]
    fn cdi_and_device_nodes() {
        let a = kv(&[("cdi.k8s.io/vgpu", "nvidia.com/gpu=1,vendor.com/x=y")]);
        let s = from_spec(&[], &a, &[]).unwrap().unwrap();
        assert_eq!(s.selectors, vec![Selector::Index(1)]);
        let s = from_spec(&[], &[], &["/dev/nvidiactl".into(), "/dev/nvidia12".into()])
            .unwrap()
            .unwrap();
        assert_eq!(resolve(&s, &host()).unwrap()[0].index, 2);
        assert_eq!(
            from_spec(&[], &[], &["/dev/nvidiactl".into()]).unwrap(),
            None
        );
    }

    #[test]
    fn unknown_gpus_are_clear_errors() {
        let s = from_spec(&kv(&[("NVIDIA_VISIBLE_DEVICES", "7")]), &[], &[])
            .unwrap()
            .unwrap();
        let e = resolve(&s, &host()).unwrap_err().to_string();
        assert!(
            e.contains("NVIDIA_VISIBLE_DEVICES=7") && e.contains("index 7"),
            "{e}"
        );
        let e = from_spec(&kv(&[("NVIDIA_VISIBLE_DEVICES", "x")]), &[], &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("neither"), "{e}");
        let e = from_spec(&kv(&[("NVIDIA_VISIBLE_DEVICES", "0:1")]), &[], &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("MIG"), "{e}");
    }
}
