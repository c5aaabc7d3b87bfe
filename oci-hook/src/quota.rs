//! The quota a container asks for, from its annotations or its environment. Not here: checking it against
//! the container's GPUs (`crate::plan`), or the environment grammar itself (`vgpu_ledger::envlimits`).
//!
//! Annotations `vgpu.io/memory-limit` (every GPU) and `vgpu.io/memory-limit.<i>` (the container's i-th
//! GPU); or env `CUDA_DEVICE_MEMORY_LIMIT` / `CUDA_DEVICE_MEMORY_LIMIT_<i>` (HAMi-compatible, and what
//! Docker 20.10 can pass). When any quota annotation is present the env quotas are ignored entirely, so
//! one source decides the whole quota.
//!
//! In a Kubernetes pod every container gets the pod's annotations, so a pod names a container in the key:
//! `vgpu.io/memory-limit.<container>` and `vgpu.io/memory-limit.<container>.<i>`, matched against the
//! container name the CRI runtime writes into the spec. Keys naming a container decide that container's
//! quota entirely; a container no key names gets the plain keys (the pod's default). Container names are
//! DNS labels and a segment of digits is a GPU index, so the two never mix up (a container whose name is
//! all digits cannot be named). In the env `0` means "no limit" for the GPUs it covers (as HAMi-core
//! reads it); in an annotation `0` is an error (a quota of nothing is a mistake).

use anyhow::{anyhow, bail, Result};
use std::collections::BTreeMap;
use vgpu_ledger::envlimits::{self, EnvLimit, EnvLimits};
use vgpu_ledger::keys::{self, kube};

/// Annotation for every GPU of the container.
pub const ANNOTATION: &str = keys::annotation::MEMORY_LIMIT;
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
    /// The request comes from keys naming this container of a pod (not the pod's default).
    pub for_container: bool,
}

/// Annotations a CRI runtime writes with the container's name in its pod (containerd, CRI-O).
const CONTAINER_NAME_KEYS: [&str; 2] = [kube::CRI_CONTAINER_NAME, kube::CRIO_CONTAINER_NAME];

/// Where the container stands, for the container-keyed quota annotations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodMember<'a> {
    /// Not made by a CRI runtime: `vgpu.io/memory-limit.<name>` is a mistake.
    NotInPod,
    /// In a pod without a container name (the sandbox): keys naming containers are not for it.
    Unnamed,
    /// The pod's container of this name.
    Named(&'a str),
}

impl<'a> PodMember<'a> {
    /// From the spec's annotations.
    pub fn of(annotations: &'a [(String, String)]) -> PodMember<'a> {
        let named = annotations
            .iter()
            .find(|(k, v)| CONTAINER_NAME_KEYS.contains(&k.as_str()) && !v.is_empty());
        if let Some((_, name)) = named {
            return PodMember::Named(name);
        }
        if annotations
            .iter()
            .any(|(k, _)| kube::POD_MARKERS.contains(&k.as_str()))
        {
            return PodMember::Unnamed;
        }
        PodMember::NotInPod
    }

    pub fn in_a_pod(self) -> bool {
        self != PodMember::NotInPod
    }
}

/// Whether `s` can be a Kubernetes container name (a DNS label: `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most
/// 63 characters).
fn is_container_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
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
    let from_ann = from_annotations(annotations, PodMember::of(annotations))?;
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
        for_container: false,
    })
}

/// What the part of a key after `<base>.` addresses.
enum Target<'k> {
    /// `<i>`: the container's GPU i.
    Gpu(&'k str),
    /// `<container>` or `<container>.<i>`: a container of the pod, all its GPUs or GPU i.
    Container(&'k str, Option<&'k str>),
}

fn target(rest: &str) -> Target<'_> {
    if rest.bytes().all(|c| c.is_ascii_digit()) {
        return Target::Gpu(rest);
    }
    match rest.split_once('.') {
        Some((name, idx)) => Target::Container(name, Some(idx)),
        None => Target::Container(rest, None),
    }
}

/// One annotation of a per-GPU setting that decides this container: its key, its value, and the
/// container's GPU it is for (None: every GPU).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keyed<'a> {
    pub key: &'a str,
    pub value: &'a str,
    pub gpu: Option<usize>,
}

/// The annotations `base`, `base.<i>` and, in a pod, `base.<container>[.<i>]` that decide this
/// container (the memory limit's grammar, shared by the compute limit), and whether they name it. The
/// last occurrence of a key wins (as for env). Keys naming this container and the pod's plain keys are
/// gathered apart: the first decide alone when present. A key no container name can match, or one
/// naming a container outside a pod, or a GPU index out of range, is one line naming it.
pub fn keyed<'a>(
    pairs: &'a [(String, String)],
    member: PodMember,
    base: &str,
) -> Result<(Vec<Keyed<'a>>, bool)> {
    let mut pod: BTreeMap<&str, &str> = BTreeMap::new();
    let mut mine: BTreeMap<&str, &str> = BTreeMap::new();
    for (k, v) in pairs {
        let rest = if k == base {
            None
        } else if let Some(r) = k.strip_prefix(base).and_then(|r| r.strip_prefix('.')) {
            Some(r)
        } else {
            continue;
        };
        let Some(Target::Container(name, _)) = rest.map(target) else {
            pod.insert(k, v);
            continue;
        };
        let source = format!("annotation {k}");
        if member == PodMember::NotInPod {
            bail!(
                "{source}: {name:?} is not a GPU index (expected {base}.<0..{}>; {base}.<container>[.<i>] is for the containers of a Kubernetes pod)",
                envlimits::MAX_INDEX
            );
        }
        if !is_container_name(name) {
            bail!("{source}: {name:?} is neither a GPU index nor a container name (a DNS label: lowercase letters, digits, '-')");
        }
        if member == PodMember::Named(name) {
            mine.insert(k, v);
        }
    }
    let (chosen, for_container) = if mine.is_empty() {
        (pod, false)
    } else {
        (mine, true)
    };
    let mut out = Vec::new();
    for (key, value) in chosen {
        let idx = match key
            .strip_prefix(base)
            .and_then(|r| r.strip_prefix('.'))
            .map(target)
        {
            None | Some(Target::Container(_, None)) => None,
            Some(Target::Gpu(i)) | Some(Target::Container(_, Some(i))) => Some(i),
        };
        let gpu = match idx.map(|i| (i, envlimits::parse_index(i))) {
            None => None,
            Some((_, Some(i))) => Some(i as usize),
            Some((i, None)) => bail!(
                "annotation {key}: {i:?} is not a GPU index (expected {base}.<0..{}>)",
                envlimits::MAX_INDEX
            ),
        };
        out.push(Keyed { key, value, gpu });
    }
    Ok((out, for_container))
}

fn from_annotations(pairs: &[(String, String)], member: PodMember) -> Result<QuotaRequest> {
    let (keys, for_container) = keyed(pairs, member, ANNOTATION)?;
    let mut q = QuotaRequest {
        for_container,
        ..Default::default()
    };
    for k in keys {
        let source = format!("annotation {}", k.key);
        let bytes = parse_limit(k.value, &source)?;
        let r = Requested { bytes, source };
        match k.gpu {
            None => q.all = Some(r),
            Some(i) => {
                q.per_gpu.insert(i, r);
            }
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

    fn in_pod(name: &str, ann: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut a = kv(&[("io.kubernetes.cri.container-name", name)]);
        a.extend(kv(ann));
        a
    }

    #[test]
    fn a_pods_containers_get_their_own_keys_or_the_pods_default() {
        let pod = [
            ("vgpu.io/memory-limit", "4Gi"),
            ("vgpu.io/memory-limit.1", "3Gi"),
            ("vgpu.io/memory-limit.trainer", "8Gi"),
            ("vgpu.io/memory-limit.trainer.1", "2Gi"),
            ("vgpu.io/memory-limit.eval-2", "1Gi"),
        ];
        let q = from_spec(&in_pod("trainer", &pod), &[]).unwrap();
        assert!(q.for_container);
        assert_eq!(q.limit_for(0).unwrap().bytes, 8 << 30);
        assert_eq!(
            q.limit_for(1).unwrap().source,
            "annotation vgpu.io/memory-limit.trainer.1"
        );
        assert_eq!(q.limit_for(1).unwrap().bytes, 2 << 30);
        // CRI-O writes the name under another key; the pod's per-GPU default does not leak in.
        let mut a = kv(&[("io.kubernetes.container.name", "eval-2")]);
        a.extend(kv(&pod));
        let q = from_spec(&a, &[]).unwrap();
        assert_eq!(
            (q.limit_for(0).unwrap().bytes, q.limit_for(1).unwrap().bytes),
            (1 << 30, 1 << 30)
        );
        // A container no key names, and the sandbox (no name), get the pod's default.
        let mut sandbox = kv(&[("io.kubernetes.cri.container-type", "sandbox")]);
        sandbox.extend(kv(&pod));
        for a in [in_pod("web", &pod), sandbox] {
            let q = from_spec(&a, &[]).unwrap();
            assert!(!q.for_container);
            assert_eq!(
                (q.limit_for(0).unwrap().bytes, q.limit_for(1).unwrap().bytes),
                (4 << 30, 3 << 30)
            );
        }
        // Without a pod default, a container no key names has no annotation quota: its env decides.
        let q = from_spec(
            &in_pod("web", &[("vgpu.io/memory-limit.trainer", "8Gi")]),
            &kv(&[("CUDA_DEVICE_MEMORY_LIMIT", "2G")]),
        )
        .unwrap();
        assert_eq!(
            q.limit_for(0).unwrap().source,
            "env CUDA_DEVICE_MEMORY_LIMIT"
        );
        // Another container's bad value is that container's error, not this one's.
        let q = from_spec(
            &in_pod("web", &[("vgpu.io/memory-limit.trainer", "4Qi")]),
            &[],
        )
        .unwrap();
        assert!(q.is_empty());
    }

    #[test]
    fn container_keys_that_cannot_match_are_one_line() {
        // Outside a pod there are no container names.
        let e = from_spec(&kv(&[("vgpu.io/memory-limit.trainer", "1Gi")]), &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(
                "annotation vgpu.io/memory-limit.trainer: \"trainer\" is not a GPU index"
            ),
            "{e}"
        );
        assert!(e.contains("for the containers of a Kubernetes pod"), "{e}");
        // In a pod, a key that no container name can match is refused by every container.
        for k in [
            "vgpu.io/memory-limit.Trainer",
            "vgpu.io/memory-limit.trainer_1",
            "vgpu.io/memory-limit.-x",
        ] {
            let e = from_spec(&in_pod("web", &[(k, "1Gi")]), &[])
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with(&format!("annotation {k}: "))
                    && e.contains("neither a GPU index nor a container name"),
                "{e}"
            );
            assert!(!e.contains('\n'));
        }
        // The named container's own bad keys and values.
        for (k, v, want) in [
            (
                "vgpu.io/memory-limit.trainer.x",
                "1Gi",
                "is not a GPU index",
            ),
            (
                "vgpu.io/memory-limit.trainer.1.2",
                "1Gi",
                "is not a GPU index",
            ),
            (
                "vgpu.io/memory-limit.trainer",
                "4Qi",
                "vgpu.io/memory-limit.trainer=\"4Qi\"",
            ),
            ("vgpu.io/memory-limit.trainer", "0", "greater than zero"),
        ] {
            let e = from_spec(&in_pod("trainer", &[(k, v)]), &[])
                .unwrap_err()
                .to_string();
            assert!(e.contains(k) && e.contains(want), "{e}");
        }
    }
}
