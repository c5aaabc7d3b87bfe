//! No silent typos: a `vgpu.io/*` annotation the project does not define, or a near miss of a quota
//! variable (`CUDA_DEVICE_MEMORY_LIMT`), would otherwise mean *no limit* without a word. Both fail the
//! container with one line naming the key and what exists. Not here: parsing the keys that do exist
//! (`crate::quota`, `vgpu_ledger::envlimits`).

use anyhow::{bail, Result};

use crate::edits::MARKER_ANNOTATION;
use crate::quota::ANNOTATION;
use vgpu_ledger::envcompute::{
    LIMIT_ANNOTATION as COMPUTE, POLICY_ANNOTATION as POLICY, WINDOW_ANNOTATION as WINDOW,
    WINDOW_VAR,
};
use vgpu_ledger::memmode;

/// The prefix of every annotation the project defines.
pub const ANNOTATION_PREFIX: &str = "vgpu.io/";

/// Variables of the quota's environment (HAMi-core's and ours), without their `_<i>` index suffix.
const ENV_BASES: [&str; 10] = [
    "CUDA_DEVICE_MEMORY_LIMIT",
    "CUDA_DEVICE_MEMORY_SHARED_CACHE",
    "CUDA_DEVICE_SM_LIMIT",
    "CUDA_OVERSUBSCRIBE",
    "GPU_CORE_UTILIZATION_POLICY",
    WINDOW_VAR,
    "VGPU_LIMITS_FILE",
    memmode::MODE_VAR,
    memmode::SPILL_VAR,
    memmode::RESERVE_VAR,
];
/// The unified-memory annotations (`vgpu_ledger::memmode`).
const MODE_ANNOTATIONS: [&str; 3] = [
    memmode::MODE_ANNOTATION,
    memmode::SPILL_ANNOTATION,
    memmode::RESERVE_ANNOTATION,
];
/// Bases that take a `_<i>` suffix.
const INDEXED: [&str; 2] = ["CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_SM_LIMIT"];
/// How far (edits) a name may be from a base to count as its misspelling.
const NEAR: usize = 3;

/// Checks a container's annotations and environment for keys that look meant for vgpu but are not.
pub fn check(annotations: &[(String, String)], env: &[(String, String)]) -> Result<()> {
    for (k, _) in annotations {
        let Some(rest) = k.strip_prefix(ANNOTATION_PREFIX) else {
            continue;
        };
        let keyed =
            |base: &str| k == base || k.strip_prefix(base).is_some_and(|r| r.starts_with('.'));
        let known = keyed(ANNOTATION)
            || keyed(COMPUTE)
            || k == POLICY
            || k == WINDOW
            || k == MARKER_ANNOTATION
            || MODE_ANNOTATIONS.contains(&k.as_str());
        if !known {
            let far = |key: &str| distance(rest, &key[ANNOTATION_PREFIX.len()..]);
            // The nearest compute key (the share's on a tie).
            let (d, meant) = [COMPUTE, POLICY, WINDOW]
                .iter()
                .map(|key| (far(key), *key))
                .min_by_key(|(d, _)| *d)
                .unwrap_or((usize::MAX, COMPUTE));
            let hint = if d <= NEAR || rest.contains("compute") {
                format!(" (did you mean {meant}?)")
            } else if far(ANNOTATION) <= NEAR || rest.contains("memory") {
                format!(" (did you mean {ANNOTATION}?)")
            } else {
                String::new()
            };
            let [m, s, r] = MODE_ANNOTATIONS;
            bail!(
                "annotation {k} is not one vgpu defines{hint}: the vgpu.io annotations are {ANNOTATION}, {ANNOTATION}.<i>, {ANNOTATION}.<container>[.<i>] (for a pod's container), {m}, {s}, {r}, {COMPUTE}, {COMPUTE}.<i>, {COMPUTE}.<container>[.<i>], {POLICY} and {WINDOW}"
            );
        }
    }
    for (k, _) in env {
        if let Some(base) = misspelt(k) {
            bail!("env {k} is not a variable vgpu knows: did you mean {base}?");
        }
    }
    Ok(())
}

/// The variable `name` looks like a misspelling of, if it is not a variable vgpu knows.
fn misspelt(name: &str) -> Option<&'static str> {
    if ENV_BASES.contains(&name) {
        return None;
    }
    // `<base>_<digits>` of an indexed base is known (its index is checked by the grammar).
    if let Some((base, idx)) = name.rsplit_once('_') {
        if INDEXED.contains(&base) && !idx.is_empty() {
            return None;
        }
    }
    let stem = match name.rsplit_once('_') {
        Some((b, i)) if i.bytes().all(|c| c.is_ascii_digit()) && !i.is_empty() => b,
        _ => name,
    };
    // A name about memory is a memory variable's misspelling, whatever else is close.
    let memory = stem.contains("MEM");
    let near = ENV_BASES
        .iter()
        .filter(|b| !memory || b.contains("MEMORY"))
        .map(|b| (distance(stem, b), *b))
        .min()
        .filter(|(d, _)| *d <= NEAR)
        .map(|(_, b)| b);
    near.or_else(|| {
        name.starts_with("CUDA_DEVICE_MEMORY_")
            .then_some("CUDA_DEVICE_MEMORY_LIMIT")
    })
}

/// Levenshtein distance between two short ASCII names.
fn distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, &ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, &cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != cb))
                .min(prev[j + 1] + 1)
                .min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::kv;

    // Regression: `vgpu.io/memory_limit`, `vgpu.io/memory-limits` and `CUDA_DEVICE_MEMORY_LIMT` each
    // meant no limit, silently.
    #[test]
    fn misspelt_keys_are_one_line_naming_them() {
        for k in [
            "vgpu.io/memory_limit",
            "vgpu.io/memory-limits",
            "vgpu.io/memlimit",
            "vgpu.io/other",
            // Near misses of the container-keyed form.
            "vgpu.io/memory-limits.trainer",
            "vgpu.io/memory_limit.trainer",
            "vgpu.io/trainer.memory-limit",
            "vgpu.io/memory-limit-trainer",
        ] {
            let e = check(&kv(&[(k, "4Gi")]), &[]).unwrap_err().to_string();
            assert!(
                e.contains(k) && e.contains("vgpu.io/memory-limit.<i>"),
                "{e}"
            );
            assert!(!e.contains('\n'));
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
            ("CUDA_DEVICE_SM_LIMT", "CUDA_DEVICE_SM_LIMIT"),
        ] {
            let e = check(&[], &kv(&[(k, "4G")])).unwrap_err().to_string();
            assert!(
                e.contains(k) && e.ends_with(&format!("did you mean {want}?")),
                "{e}"
            );
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
            ("vgpu.io/compute-polcy", "vgpu.io/compute-policy"),
            ("vgpu.io/compute-policies", "vgpu.io/compute-policy"),
            ("vgpu.io/compute-windows", "vgpu.io/compute-window"),
            ("vgpu.io/compute_window", "vgpu.io/compute-window"),
            ("vgpu.io/compute-window.1", "vgpu.io/compute-window"),
            ("vgpu.io/compute-windw", "vgpu.io/compute-window"),
            ("vgpu.io/sm-limit", ""),
        ] {
            let e = check(&kv(&[(k, "30")]), &[]).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("annotation {k} is not one vgpu defines")),
                "{e}"
            );
            if !want.is_empty() {
                assert!(e.contains(&format!("(did you mean {want}?)")), "{e}");
            }
            assert!(
                e.contains("vgpu.io/compute-limit.<i>")
                    && e.contains("vgpu.io/compute-policy")
                    && e.contains("vgpu.io/compute-window"),
                "{e}"
            );
            assert!(!e.contains('\n'));
        }
        let e = check(&[], &kv(&[("GPU_CORE_UTILISATION_POLICY", "force")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.ends_with("did you mean GPU_CORE_UTILIZATION_POLICY?"),
            "{e}"
        );
        for k in [
            "VGPU_COMPUTE_WINDOWS",
            "VGPU_COMPUTE_WINDW",
            "VGPU_COMPUTEWINDOW",
        ] {
            let e = check(&[], &kv(&[(k, "250ms")])).unwrap_err().to_string();
            assert_eq!(
                e,
                format!("env {k} is not a variable vgpu knows: did you mean VGPU_COMPUTE_WINDOW?")
            );
        }
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
