//! The memory quota a container asks for, per GPU, from its annotations or its environment. Not here:
//! checking it against the container's GPUs (`crate::plan`), the key forms (`crate::pod_keys`), or the
//! environment grammar itself (`vgpu_ledger::envlimits`).
//!
//! Annotations `vgpu.io/memory-limit` (every GPU), `vgpu.io/memory-limit.<i>` (the container's i-th GPU)
//! and, in a pod, `vgpu.io/memory-limit.<container>[.<i>]`; or env `CUDA_DEVICE_MEMORY_LIMIT` /
//! `CUDA_DEVICE_MEMORY_LIMIT_<i>` (HAMi-compatible, and what Docker 20.10 can pass). When any quota
//! annotation decides the container the env quotas are ignored entirely, so one source decides the whole
//! quota. In the env `0` means "no limit" for the GPUs it covers (as HAMi-core reads it); in an annotation
//! `0` is an error (a quota of nothing is a mistake).

use std::collections::BTreeMap;
use vgpu_host::memory_limit;
use vgpu_ledger::envlimits::{EnvLimit, EnvLimitError, EnvLimits};
use vgpu_ledger::keys;
use vgpu_ledger::memmode::ModeSettings;

use crate::pod_keys::{keyed, KeyFormError, PodMember};

/// Annotation for every GPU of the container.
pub const ANNOTATION: &str = keys::annotation::MEMORY_LIMIT;
/// Environment variable for every GPU of the container.
pub const ENV: &str = keys::env::MEMORY_LIMIT;

/// One requested limit and where it came from (for error messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requested {
    /// Bytes; 0 (env only) is "no limit for these GPUs".
    pub bytes: u64,
    pub source: String,
}

/// The memory quota request of one container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryRequest {
    /// Limit for every GPU without a per-GPU entry.
    pub all: Option<Requested>,
    /// Per-GPU limits by the container's GPU index.
    pub per_gpu: BTreeMap<usize, Requested>,
    /// The request comes from keys naming this container of a pod (not the pod's default).
    pub for_container: bool,
}

/// A memory quota that cannot be read. `Display` is one line naming the setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemoryRequestError {
    #[error(transparent)]
    Key(#[from] KeyFormError),
    /// Not a quantity, `0`, or below `vgpu_ledger::MIN_QUOTA`: the one rule of a memory quantity, shared
    /// with the config file's keys (`vgpu_host::memory_limit`).
    #[error(transparent)]
    Limit(#[from] vgpu_host::memory_limit::LimitError),
    /// A malformed limit variable.
    #[error("env {0}")]
    Env(EnvLimitError),
}

impl MemoryRequest {
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

/// Reads the quota from the annotations deciding the container `member` (winning) or the spec's env.
pub fn read(
    annotations: &[(String, String)],
    env: &[(String, String)],
    member: PodMember,
) -> Result<MemoryRequest, MemoryRequestError> {
    let from_ann = from_annotations(annotations, member)?;
    if !from_ann.is_empty() {
        return Ok(from_ann);
    }
    let env = EnvLimits::parse(env).map_err(MemoryRequestError::Env)?;
    let req = |l: EnvLimit| Requested {
        bytes: l.bytes,
        source: format!("env {}", l.var),
    };
    Ok(MemoryRequest {
        all: env.global.map(req),
        per_gpu: env
            .per_index
            .into_iter()
            .map(|(i, l)| (i as usize, req(l)))
            .collect(),
        for_container: false,
    })
}

fn from_annotations(
    pairs: &[(String, String)],
    member: PodMember,
) -> Result<MemoryRequest, MemoryRequestError> {
    let (keys, for_container) = keyed(pairs, member, ANNOTATION)?;
    let mut q = MemoryRequest {
        for_container,
        ..Default::default()
    };
    for k in keys {
        let source = format!("annotation {}", k.key);
        let bytes = memory_limit::parse(k.value, &source)?;
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

/// The unified-memory mode's settings from a container's annotations (`vgpu.io/memory-mode`,
/// `-spill`, `-reserve`; the environment's names mean nothing here): the mode's grammar is the library's
/// too (`vgpu_ledger::memmode`), these keys only the hook's.
pub fn mode_settings(annotations: &[(String, String)]) -> ModeSettings<'_> {
    ModeSettings::from_pairs(
        annotations,
        keys::annotation::MEMORY_MODE,
        keys::annotation::MEMORY_SPILL,
        keys::annotation::MEMORY_RESERVE,
        None,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_ledger::memmode::ModeError;
    use vgpu_ledger::MemoryMode;

    use crate::testing::kv;

    fn from_spec(
        annotations: &[(String, String)],
        env: &[(String, String)],
    ) -> Result<MemoryRequest, MemoryRequestError> {
        read(annotations, env, PodMember::of(annotations))
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
        // Names that merely start with the base are not quotas (`crate::unknown_keys` refuses the near misses).
        let q = from_spec(&[], &kv(&[("CUDA_DEVICE_MEMORY_LIMITX", "5")])).unwrap();
        assert!(q.is_empty());
    }

    #[test]
    fn bad_values_are_refused_naming_the_setting() {
        use vgpu_host::memory_limit::LimitError as L;
        use MemoryRequestError as E;
        let setting = |e: &E| match e {
            E::Limit(L::Quantity { setting, .. } | L::Zero { setting, .. }) => setting.clone(),
            E::Limit(L::BelowFloor { setting, .. }) => setting.clone(),
            E::Key(KeyFormError::NotAnIndex { key, .. })
            | E::Key(KeyFormError::ContainerOutsidePod { key, .. }) => format!("annotation {key}"),
            other => panic!("{other:?}"),
        };
        for (k, v, zero) in [
            ("vgpu.io/memory-limit", "4Qi", false),
            ("vgpu.io/memory-limit", "0", true),
            ("vgpu.io/memory-limit", "-1Gi", false),
            ("vgpu.io/memory-limit", "", false),
            ("vgpu.io/memory-limit.-1", "1Gi", false),
            ("vgpu.io/memory-limit.1024", "1Gi", false),
        ] {
            let e = from_spec(&kv(&[(k, v)]), &[]).unwrap_err();
            assert_eq!(setting(&e), format!("annotation {k}"), "{e:?}");
            assert_eq!(matches!(e, E::Limit(L::Zero { .. })), zero, "{e:?}");
        }
        for (k, v) in [
            ("CUDA_DEVICE_MEMORY_LIMIT", "4Qi"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "-1"),
            ("CUDA_DEVICE_MEMORY_LIMIT_x", "1G"),
            ("CUDA_DEVICE_MEMORY_LIMIT_+1", "1G"),
            ("CUDA_DEVICE_MEMORY_LIMIT_1024", "1G"),
        ] {
            match from_spec(&[], &kv(&[(k, v)])) {
                Err(E::Env(e)) => assert_eq!(e.var, k),
                other => panic!("{k}: {other:?}"),
            }
        }
        // The line users read.
        let e = from_spec(&kv(&[("vgpu.io/memory-limit", "0")]), &[]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "annotation vgpu.io/memory-limit=\"0\": a memory limit must be greater than zero"
        );
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

    #[test]
    fn annotations_use_their_own_keys_and_ignore_the_environment_names() {
        let a = kv(&[
            ("vgpu.io/memory-mode", "spill"),
            ("vgpu.io/memory-spill", "2Gi"),
            ("CUDA_OVERSUBSCRIBE", "true"),
        ]);
        assert_eq!(
            mode_settings(&a).parse(),
            Ok(MemoryMode::Spill {
                spill_limit: 2 << 30
            })
        );
        let e = mode_settings(&kv(&[("vgpu.io/memory-mode", "spill")]))
            .parse()
            .unwrap_err();
        assert!(
            matches!(e, ModeError::SpillWithoutBudget { ref setting } if setting == "vgpu.io/memory-mode"),
            "{e}"
        );
    }
}
