//! Refusing keys meant for vgpu that vgpu does not know: a `vgpu.io/*` annotation the registry
//! (`vgpu_ledger::keys`) does not hold, or a near miss of one of its variables (`CUDA_DEVICE_MEMORY_LIMT`),
//! would otherwise mean *no limit* without a word. Both fail the container with one line naming the key
//! and what exists. Not here: parsing the keys that do exist (`crate::request` and what it calls).
//!
//! Near misses are measured with `strsim`'s Levenshtein distance.

use vgpu_ledger::keys::{self, annotation::MEMORY_LIMIT, Topic, ANNOTATION_PREFIX};

/// How far (edits) a name may be from a base to count as its misspelling.
const NEAR: usize = 3;

/// A key that looks meant for vgpu but is not one of its own. `Display` is one line naming it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnknownKey {
    /// A `vgpu.io/` annotation the registry does not hold, with the key probably meant.
    #[error("annotation {key} is not one vgpu defines{}: the vgpu.io annotations are {}", hint(.meant), keys::annotation_forms())]
    Annotation {
        key: String,
        meant: Option<&'static str>,
    },
    /// A near miss of a registry variable.
    #[error("env {key} is not a variable vgpu knows: did you mean {meant}?")]
    Env { key: String, meant: &'static str },
}

fn hint(meant: &Option<&'static str>) -> String {
    meant
        .map(|m| format!(" (did you mean {m}?)"))
        .unwrap_or_default()
}

/// Checks a container's annotations and environment for keys that look meant for vgpu but are not.
pub fn check(annotations: &[(String, String)], env: &[(String, String)]) -> Result<(), UnknownKey> {
    for (k, _) in annotations {
        let Some(rest) = k.strip_prefix(ANNOTATION_PREFIX) else {
            continue;
        };
        if keys::annotation(k).is_none() {
            let far = |key: &str| distance(rest, &key[ANNOTATION_PREFIX.len()..]);
            // The nearest compute key (the first listed on a tie: the share's).
            let (d, nearest) = keys::ANNOTATIONS
                .iter()
                .filter(|key| key.topic == Topic::Compute)
                .map(|key| (far(key.name), key.name))
                .min_by_key(|(d, _)| *d)
                .unwrap_or((usize::MAX, MEMORY_LIMIT));
            let meant = if d <= NEAR || rest.contains("compute") {
                Some(nearest)
            } else if far(MEMORY_LIMIT) <= NEAR || rest.contains("memory") {
                Some(MEMORY_LIMIT)
            } else {
                None
            };
            return Err(UnknownKey::Annotation {
                key: k.clone(),
                meant,
            });
        }
    }
    for (k, _) in env {
        if let Some(meant) = misspelt(k) {
            return Err(UnknownKey::Env {
                key: k.clone(),
                meant,
            });
        }
    }
    Ok(())
}

/// The variable `name` looks like a misspelling of, if it is not a variable vgpu knows.
fn misspelt(name: &str) -> Option<&'static str> {
    if keys::env_var(name).is_some() {
        return None;
    }
    let stem = match name.rsplit_once('_') {
        Some((b, i)) if i.bytes().all(|c| c.is_ascii_digit()) && !i.is_empty() => b,
        _ => name,
    };
    // A name about memory is a memory variable's misspelling, whatever else is close.
    let memory = stem.contains("MEM");
    let near = keys::ENV
        .iter()
        .map(|k| k.name)
        .filter(|b| !memory || b.contains("MEMORY"))
        .map(|b| (distance(stem, b), b))
        .min()
        .filter(|(d, _)| *d <= NEAR)
        .map(|(_, b)| b);
    near.or_else(|| {
        name.starts_with(keys::env::MEMORY_PREFIX)
            .then_some(keys::env::MEMORY_LIMIT)
    })
}

fn distance(a: &str, b: &str) -> usize {
    strsim::levenshtein(a, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::kv;

    fn annotation_meant(k: &str) -> Option<&'static str> {
        match check(&kv(&[(k, "4Gi")]), &[]) {
            Err(UnknownKey::Annotation { key, meant }) if key == k => meant,
            other => panic!("{k}: {other:?}"),
        }
    }

    fn env_meant(k: &str) -> &'static str {
        match check(&[], &kv(&[(k, "4G")])) {
            Err(UnknownKey::Env { key, meant }) if key == k => meant,
            other => panic!("{k}: {other:?}"),
        }
    }

    // Regression: `vgpu.io/memory_limit`, `vgpu.io/memory-limits` and `CUDA_DEVICE_MEMORY_LIMT` each
    // meant no limit, silently.
    #[test]
    fn misspelt_keys_are_refused_naming_the_one_meant() {
        for (k, want) in [
            ("vgpu.io/memory_limit", Some(MEMORY_LIMIT)),
            ("vgpu.io/memory-limits", Some(MEMORY_LIMIT)),
            ("vgpu.io/memlimit", None),
            ("vgpu.io/other", None),
            // Near misses of the container-keyed form.
            ("vgpu.io/memory-limits.trainer", Some(MEMORY_LIMIT)),
            ("vgpu.io/memory_limit.trainer", Some(MEMORY_LIMIT)),
            ("vgpu.io/trainer.memory-limit", Some(MEMORY_LIMIT)),
            ("vgpu.io/memory-limit-trainer", Some(MEMORY_LIMIT)),
        ] {
            assert_eq!(annotation_meant(k), want, "{k}");
        }
        for (k, want) in [
            ("CUDA_DEVICE_MEMORY_LIMT", "CUDA_DEVICE_MEMORY_LIMIT"),
            ("CUDA_DEVICE_MEMORY_LIMITS", "CUDA_DEVICE_MEMORY_LIMIT"),
            ("CUDA_DEVICE_MEM_LIMIT", "CUDA_DEVICE_MEMORY_LIMIT"),
            ("CUDA_DEVICE_MEMORY_LIMT_1", "CUDA_DEVICE_MEMORY_LIMIT"),
            (
                "CUDA_DEVICE_MEMORY_SHARED_CACH",
                "CUDA_DEVICE_MEMORY_SHARED_CACHE",
            ),
            ("CUDA_DEVICE_MEMORY_QUOTA", "CUDA_DEVICE_MEMORY_LIMIT"),
            ("CUDA_DEVICE_MEMORY_LIMIT_1_2", "CUDA_DEVICE_MEMORY_LIMIT"),
            ("CUDA_DEVICE_SM_LIMT", "CUDA_DEVICE_SM_LIMIT"),
            ("CUDA_DEVICE_SM_REQEST", "CUDA_DEVICE_SM_REQUEST"),
            ("CUDA_DEVICE_SM_REQUESTS_1", "CUDA_DEVICE_SM_REQUEST"),
            ("GPU_CORE_UTILISATION_POLICY", "GPU_CORE_UTILIZATION_POLICY"),
            ("VGPU_COMPUTE_WINDOWS", "VGPU_COMPUTE_WINDOW"),
            ("VGPU_COMPUTE_WINDW", "VGPU_COMPUTE_WINDOW"),
            ("VGPU_COMPUTEWINDOW", "VGPU_COMPUTE_WINDOW"),
        ] {
            assert_eq!(env_meant(k), want, "{k}");
        }
    }

    #[test]
    fn misspelt_compute_keys_name_the_one_meant() {
        for (k, want) in [
            ("vgpu.io/compute-limits", "vgpu.io/compute-limit"),
            ("vgpu.io/compute_limit", "vgpu.io/compute-limit"),
            ("vgpu.io/compute-limit-trainer", "vgpu.io/compute-limit"),
            ("vgpu.io/computelimit.1", "vgpu.io/compute-limit"),
            ("vgpu.io/compute-share", "vgpu.io/compute-limit"),
            ("vgpu.io/compute-requests", "vgpu.io/compute-request"),
            ("vgpu.io/compute_request.1", "vgpu.io/compute-request"),
            ("vgpu.io/compute-reqest", "vgpu.io/compute-request"),
            ("vgpu.io/compute-polcy", "vgpu.io/compute-policy"),
            ("vgpu.io/compute-policies", "vgpu.io/compute-policy"),
            ("vgpu.io/compute-windows", "vgpu.io/compute-window"),
            ("vgpu.io/compute_window", "vgpu.io/compute-window"),
            ("vgpu.io/compute-window.1", "vgpu.io/compute-window"),
            ("vgpu.io/compute-windw", "vgpu.io/compute-window"),
        ] {
            assert_eq!(annotation_meant(k), Some(want), "{k}");
        }
        assert_eq!(annotation_meant("vgpu.io/sm-limit"), None);
    }

    /// The lines users read (the e2e suites match them): one line, the key, the one meant, every form.
    #[test]
    fn the_lines_users_read() {
        let e = check(&kv(&[("vgpu.io/compute-limits", "30")]), &[])
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            format!(
                "annotation vgpu.io/compute-limits is not one vgpu defines (did you mean vgpu.io/compute-limit?): the vgpu.io annotations are {}",
                keys::annotation_forms()
            )
        );
        let e = check(&kv(&[("vgpu.io/other", "1")]), &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("annotation vgpu.io/other is not one vgpu defines: the vgpu.io"),
            "{e}"
        );
        let e = check(&[], &kv(&[("VGPU_COMPUTE_WINDW", "250ms")]))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "env VGPU_COMPUTE_WINDW is not a variable vgpu knows: did you mean VGPU_COMPUTE_WINDOW?"
        );
    }

    #[test]
    fn the_keys_that_exist_and_other_programs_keys_pass() {
        check(
            &kv(&[
                ("vgpu.io/memory-limit", "4Gi"),
                ("vgpu.io/memory-limit.1", "2Gi"),
                ("vgpu.io/memory-limit.trainer", "2Gi"),
                ("vgpu.io/memory-limit.trainer.1", "2Gi"),
                ("vgpu.io/provisioned-by", "vgpu-container-runtime"),
                ("vgpu.io/compute-limit", "30"),
                ("vgpu.io/compute-limit.1", "70"),
                ("vgpu.io/compute-limit.trainer", "50"),
                ("vgpu.io/compute-limit.trainer.0", "100"),
                ("vgpu.io/compute-request", "10"),
                ("vgpu.io/compute-request.1", "70"),
                ("vgpu.io/compute-request.trainer.0", "50"),
                ("vgpu.io/compute-policy", "force"),
                ("vgpu.io/compute-window", "250ms"),
                ("io.kubernetes.pod.name", "p"),
                ("nvidia.com/gpu", "0"),
            ]),
            &kv(&[
                ("CUDA_DEVICE_MEMORY_LIMIT", "4G"),
                ("CUDA_DEVICE_MEMORY_LIMIT_12", "1G"),
                ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/tmp/x"),
                ("CUDA_DEVICE_SM_LIMIT_0", "30"),
                ("CUDA_DEVICE_SM_LIMIT", "30"),
                ("CUDA_DEVICE_SM_REQUEST", "30"),
                ("CUDA_DEVICE_SM_REQUEST_3", "30"),
                ("GPU_CORE_UTILIZATION_POLICY", "force"),
                ("VGPU_COMPUTE_WINDOW", "2s"),
                ("CUDA_OVERSUBSCRIBE", "true"),
                ("CUDA_VISIBLE_DEVICES", "0"),
                ("CUDA_DEVICE_ORDER", "PCI_BUS_ID"),
                ("CUDA_DEVICE_MAX_CONNECTIONS", "1"),
                ("CUDA_MODULE_LOADING", "LAZY"),
                ("NVIDIA_VISIBLE_DEVICES", "all"),
                ("PATH", "/bin"),
            ]),
        )
        .unwrap();
    }
}
