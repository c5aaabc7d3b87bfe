//! The quota a container asks for, from its annotations or its environment.
//!
//! Annotations `vgpu.io/memory-limit` (every GPU) and `vgpu.io/memory-limit.<i>` (the container's i-th
//! GPU); or env `CUDA_DEVICE_MEMORY_LIMIT` / `CUDA_DEVICE_MEMORY_LIMIT_<i>` (HAMi-compatible, and what
//! Docker 20.10 can pass). When any quota annotation is present the env quotas are ignored entirely, so
//! one source decides the whole quota.

use anyhow::{bail, Result};
use std::collections::BTreeMap;

/// Annotation for every GPU of the container.
pub const ANNOTATION: &str = "vgpu.io/memory-limit";
/// Environment variable for every GPU of the container.
pub const ENV: &str = "CUDA_DEVICE_MEMORY_LIMIT";

/// One requested limit and where it came from (for error messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requested {
    pub bytes: u64,
    pub source: String,
}

/// The quota request of one container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QuotaRequest {
    /// Limit for every GPU without a per-GPU entry.
    pub all: Option<Requested>,
    /// Per-GPU limits by the container's GPU index.
    pub per_gpu: BTreeMap<usize, Requested>,
}

impl QuotaRequest {
    /// True when the container asks for no quota at all.
    pub fn is_empty(&self) -> bool {
        self.all.is_none() && self.per_gpu.is_empty()
    }

    /// The limit of the container's GPU `i`, if any.
    pub fn limit_for(&self, i: usize) -> Option<&Requested> {
        self.per_gpu.get(&i).or(self.all.as_ref())
    }
}

/// Parses a quantity through the ledger crate's parser, and refuses zero (a quota of nothing is a mistake;
/// no quota is written by leaving the setting out).
pub fn parse_limit(value: &str, source: &str) -> Result<u64> {
    let v = value.trim();
    let bytes = match vgpu_ledger::quantity::parse_quantity(v) {
        Ok(b) => b,
        Err(e) => bail!("{source}={value:?}: {e}"),
    };
    if bytes == 0 {
        bail!("{source}={value:?}: a memory limit must be greater than zero");
    }
    Ok(bytes)
}

/// Reads the quota from annotations (winning) or the spec's env.
pub fn from_spec(annotations: &[(String, String)], env: &[(String, String)]) -> Result<QuotaRequest> {
    let from_ann = collect(annotations, ANNOTATION, '.', "annotation ", false)?;
    if !from_ann.is_empty() {
        return Ok(from_ann);
    }
    collect(env, ENV, '_', "env ", true)
}

fn collect(
    pairs: &[(String, String)],
    base: &str,
    sep: char,
    what: &str,
    empty_is_unset: bool,
) -> Result<QuotaRequest> {
    let mut q = QuotaRequest::default();
    // The last occurrence wins (what a process would see for a repeated env entry).
    let mut latest: BTreeMap<&str, &str> = BTreeMap::new();
    for (k, v) in pairs {
        if k == base || k.strip_prefix(base).is_some_and(|r| r.starts_with(sep)) {
            latest.insert(k, v);
        }
    }
    for (k, v) in latest {
        if empty_is_unset && v.trim().is_empty() {
            continue;
        }
        let source = format!("{what}{k}");
        let bytes = parse_limit(v, &source)?;
        let r = Requested { bytes, source: source.clone() };
        if k == base {
            q.all = Some(r);
            continue;
        }
        let idx = &k[base.len() + 1..];
        match idx.parse::<usize>() {
            Ok(i) if !idx.starts_with('+') && i < 1024 => {
                q.per_gpu.insert(i, r);
            }
            _ => bail!("{source}: {idx:?} is not a GPU index (expected {base}{sep}<0..1023>)"),
        }
    }
    Ok(q)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn annotation_wins_over_env() {
        let q = from_spec(
            &kv(&[("vgpu.io/memory-limit.1", "2Gi")]),
            &kv(&[("CUDA_DEVICE_MEMORY_LIMIT", "1G")]),
        )
        .unwrap();
        assert!(q.all.is_none());
        assert_eq!(q.per_gpu[&1].bytes, 2 << 30);
        assert_eq!(q.limit_for(0), None);
    }

    #[test]
    fn env_quota_and_per_gpu_override() {
        let q = from_spec(
            &kv(&[("other.io/x", "1")]),
            &kv(&[("CUDA_DEVICE_MEMORY_LIMIT", "1G"), ("CUDA_DEVICE_MEMORY_LIMIT_1", "512m")]),
        )
        .unwrap();
        assert_eq!(q.limit_for(0).unwrap().bytes, 1 << 30);
        assert_eq!(q.limit_for(1).unwrap().bytes, 512 << 20);
        assert_eq!(q.limit_for(1).unwrap().source, "env CUDA_DEVICE_MEMORY_LIMIT_1");
    }

    #[test]
    fn no_quota_is_empty() {
        let q = from_spec(&kv(&[("vgpu.io/other", "x")]), &kv(&[("CUDA_DEVICE_MEMORY_LIMIT", "")])).unwrap();
        assert!(q.is_empty());
        // Names that merely start with the base are not quotas.
        let q = from_spec(&[], &kv(&[("CUDA_DEVICE_MEMORY_LIMITX", "5")])).unwrap();
        assert!(q.is_empty());
    }

    #[test]
    fn bad_values_are_one_line_naming_the_setting() {
        for (k, v) in [
            ("vgpu.io/memory-limit", "4Qi"),
            ("vgpu.io/memory-limit", "0"),
            ("vgpu.io/memory-limit", "-1Gi"),
            ("vgpu.io/memory-limit", ""),
            ("vgpu.io/memory-limit.x", "1Gi"),
            ("vgpu.io/memory-limit.-1", "1Gi"),
        ] {
            let e = from_spec(&kv(&[(k, v)]), &[]).unwrap_err().to_string();
            assert!(e.contains(k), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
        let e = from_spec(&[], &kv(&[("CUDA_DEVICE_MEMORY_LIMIT", "0")])).unwrap_err().to_string();
        assert!(e.contains("greater than zero"), "{e}");
    }
}
