//! The quota a container asks for, from its annotations or its environment. Not here: checking it against
//! the container's GPUs (`crate::plan`), or the environment grammar itself (`vgpu_ledger::envlimits`).
//!
//! Annotations `vgpu.io/memory-limit` (every GPU) and `vgpu.io/memory-limit.<i>` (the container's i-th
//! GPU); or env `CUDA_DEVICE_MEMORY_LIMIT` / `CUDA_DEVICE_MEMORY_LIMIT_<i>` (HAMi-compatible, and what
//! Docker 20.10 can pass). When any quota annotation is present the env quotas are ignored entirely, so
//! one source decides the whole quota. In the env `0` means "no limit" for the GPUs it covers (as HAMi-core
//! reads it); in an annotation `0` is an error (a quota of nothing is a mistake).

use anyhow::{anyhow, bail, Result};
use std::collections::BTreeMap;
use vgpu_ledger::envlimits::{self, EnvLimit, EnvLimits};

/// Annotation for every GPU of the container.
pub const ANNOTATION: &str = "vgpu.io/memory-limit";
/// Environment variable for every GPU of the container.
pub const ENV: &str = envlimits::LIMIT_VAR;

/// One requested limit and where it came from (for error messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requested {
    /// Bytes; 0 (env only) is "no limit for these GPUs".
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
    /// True when the container asks for no quota at all (nothing set, or only env zeros).
    pub fn is_empty(&self) -> bool {
        self.limits().next().is_none()
    }

    /// The limit of the container's GPU `i`, if any.
    pub fn limit_for(&self, i: usize) -> Option<&Requested> {
        self.per_gpu
            .get(&i)
            .or(self.all.as_ref())
            .filter(|r| r.bytes > 0)
    }

    /// Every setting that asks for a limit (zeros left out), the one for every GPU first.
    pub fn limits(&self) -> impl Iterator<Item = &Requested> {
        self.all
            .iter()
            .chain(self.per_gpu.values())
            .filter(|r| r.bytes > 0)
    }

    /// The first per-GPU limit (zeros left out) for a GPU at index `n` or above.
    pub fn first_beyond(&self, n: usize) -> Option<(usize, &Requested)> {
        self.per_gpu
            .range(n..)
            .find(|(_, r)| r.bytes > 0)
            .map(|(&i, r)| (i, r))
    }
}

/// Parses an annotation's quantity through the ledger crate's parser, and refuses zero (a quota of nothing
/// is a mistake; no quota is written by leaving the annotation out) and anything below
/// `vgpu_ledger::MIN_QUOTA` (no CUDA context fits in less).
pub fn parse_limit(value: &str, source: &str) -> Result<u64> {
    let v = value.trim();
    let bytes = match vgpu_ledger::quantity::parse_quantity(v) {
        Ok(b) => b,
        Err(e) => bail!("{source}={value:?}: {e}"),
    };
    if bytes == 0 {
        bail!("{source}={value:?}: a memory limit must be greater than zero");
    }
    if let Err(e) = vgpu_ledger::quantity::check_min_quota(bytes) {
        bail!("{source}={value:?}: {e}");
    }
    Ok(bytes)
}

/// Reads the quota from annotations (winning) or the spec's env.
pub fn from_spec(
    annotations: &[(String, String)],
    env: &[(String, String)],
) -> Result<QuotaRequest> {
    let from_ann = from_annotations(annotations)?;
    if !from_ann.is_empty() {
        return Ok(from_ann);
    }
    let env = EnvLimits::parse(env).map_err(|e| anyhow!("env {e}"))?;
    let req = |l: EnvLimit| Requested {
        bytes: l.bytes,
        source: format!("env {}", l.var),
    };
    Ok(QuotaRequest {
        all: env.global.map(req),
        per_gpu: env
            .per_index
            .into_iter()
            .map(|(i, l)| (i as usize, req(l)))
            .collect(),
    })
}

fn from_annotations(pairs: &[(String, String)]) -> Result<QuotaRequest> {
    let mut q = QuotaRequest::default();
    // The last occurrence wins (as for env).
    let mut latest: BTreeMap<&str, &str> = BTreeMap::new();
    for (k, v) in pairs {
        if k == ANNOTATION
            || k.strip_prefix(ANNOTATION)
                .is_some_and(|r| r.starts_with('.'))
        {
            latest.insert(k, v);
        }
    }
    for (k, v) in latest {
        let source = format!("annotation {k}");
        let bytes = parse_limit(v, &source)?;
        let r = Requested {
            bytes,
            source: source.clone(),
        };
        if k == ANNOTATION {
            q.all = Some(r);
            continue;
        }
        let idx = &k[ANNOTATION.len() + 1..];
        match envlimits::parse_index(idx) {
            Some(i) => {
                q.per_gpu.insert(i as usize, r);
            }
            None => bail!(
                "{source}: {idx:?} is not a GPU index (expected {ANNOTATION}.<0..{}>)",
                envlimits::MAX_INDEX
            ),
        }
    }
    Ok(q)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::kv;

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
            &kv(&[
                ("CUDA_DEVICE_MEMORY_LIMIT", "1G"),
                ("CUDA_DEVICE_MEMORY_LIMIT_1", "512m"),
            ]),
        )
        .unwrap();
        assert_eq!(q.limit_for(0).unwrap().bytes, 1 << 30);
        assert_eq!(q.limit_for(1).unwrap().bytes, 512 << 20);
        assert_eq!(
            q.limit_for(1).unwrap().source,
            "env CUDA_DEVICE_MEMORY_LIMIT_1"
        );
    }

    #[test]
    fn no_quota_is_empty() {
        let q = from_spec(
            &kv(&[("other.io/memory-limit", "x")]),
            &kv(&[("CUDA_DEVICE_MEMORY_LIMIT", "")]),
        )
        .unwrap();
        assert!(q.is_empty());
        // Names that merely start with the base are not quotas (`crate::typos` refuses the near misses).
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
        for (k, v) in [
            ("CUDA_DEVICE_MEMORY_LIMIT", "4Qi"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "-1"),
            ("CUDA_DEVICE_MEMORY_LIMIT_x", "1G"),
            ("CUDA_DEVICE_MEMORY_LIMIT_+1", "1G"),
            ("CUDA_DEVICE_MEMORY_LIMIT_1024", "1G"),
        ] {
            let e = from_spec(&[], &kv(&[(k, v)])).unwrap_err().to_string();
            assert!(e.starts_with(&format!("env {k}")), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
        let e = from_spec(&kv(&[("vgpu.io/memory-limit", "0")]), &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("greater than zero"), "{e}");
    }

    #[test]
    fn quotas_below_the_floor_are_refused_from_either_source() {
        for v in ["1", "0.0000001Gi", "63Mi"] {
            let e = from_spec(&kv(&[("vgpu.io/memory-limit.0", v)]), &[])
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with(&format!("annotation vgpu.io/memory-limit.0={v:?}: "))
                    && e.contains("below the smallest quota vgpu accepts, 64.0 MiB"),
                "{e}"
            );
            let e = from_spec(&[], &kv(&[("CUDA_DEVICE_MEMORY_LIMIT", v)]))
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with("env CUDA_DEVICE_MEMORY_LIMIT=") && e.contains("below"),
                "{e}"
            );
        }
        let q = from_spec(&kv(&[("vgpu.io/memory-limit", "64Mi")]), &[]).unwrap();
        assert_eq!(q.limit_for(0).unwrap().bytes, vgpu_ledger::MIN_QUOTA);
    }

    #[test]
    fn env_zero_means_no_limit_for_that_gpu_as_hami_core_reads_it() {
        // The whole container: no quota at all.
        let q = from_spec(&[], &kv(&[("CUDA_DEVICE_MEMORY_LIMIT", "0")])).unwrap();
        assert!(q.is_empty());
        let q = from_spec(
            &[],
            &kv(&[
                ("CUDA_DEVICE_MEMORY_LIMIT", "0"),
                ("CUDA_DEVICE_MEMORY_LIMIT_1", "0"),
            ]),
        )
        .unwrap();
        assert!(q.is_empty());
        // One GPU: zero overrides the limit for every GPU.
        let q = from_spec(
            &[],
            &kv(&[
                ("CUDA_DEVICE_MEMORY_LIMIT", "1G"),
                ("CUDA_DEVICE_MEMORY_LIMIT_0", "0"),
            ]),
        )
        .unwrap();
        assert!(!q.is_empty());
        assert_eq!(q.limit_for(0), None);
        assert_eq!(q.limit_for(1).unwrap().bytes, 1 << 30);
    }
}
