//! The registry of the names a container carries: every annotation and environment variable vgpu reads or
//! writes, with the forms a per-GPU setting takes; the `vgpu.io/` prefix as each engine wants it. The
//! hook's key check and its parsers, this crate's grammars (`envlimits`, `envcompute`, `memmode`) and
//! vgpuctl's engine configurations take their names from here, and so does the library's settings loader
//! (its `config::env` names every variable it reads from [`env`]). Not here: what a value means (each
//! grammar's own module), the names only the host tools use (binaries, the hooks' `PATH`, CDI kinds, the
//! DRA driver's, the Kubernetes annotations CRI runtimes write: `vgpu_host::keys`).
//!
//! Adding a setting is one entry in [`ANNOTATIONS`] or [`ENV`] (plus its constant) and its parser; the key
//! check ([`annotation`], [`env_var`]) and the list of keys in its messages follow from the tables.

/// The prefix of every annotation vgpu defines.
pub const ANNOTATION_PREFIX: &str = "vgpu.io/";
/// The prefix as a glob (containerd's `pod_annotations` / `container_annotations`); CRI-O's
/// `allowed_annotations` takes [`ANNOTATION_PREFIX`] itself.
pub const ANNOTATION_GLOB: &str = "vgpu.io/*";

/// Largest GPU index a per-GPU form may name (`<NAME>_<i>`, `<key>.<i>`).
pub const MAX_GPU_INDEX: u32 = 1023;

/// The annotations (a container's, or its pod's).
pub mod annotation {
    /// Memory quota, bytes as a quantity ("4Gi"); per GPU.
    pub const MEMORY_LIMIT: &str = "vgpu.io/memory-limit";
    /// Unified-memory mode: plain, spill or oversubscribe; container-wide.
    pub const MEMORY_MODE: &str = "vgpu.io/memory-mode";
    /// Spill budget of spill mode; container-wide.
    pub const MEMORY_SPILL: &str = "vgpu.io/memory-spill";
    /// Headroom of oversubscribe mode; container-wide.
    pub const MEMORY_RESERVE: &str = "vgpu.io/memory-reserve";
    /// Compute share's limit (its cap), a whole percent; per GPU.
    pub const COMPUTE_LIMIT: &str = "vgpu.io/compute-limit";
    /// Compute share's request (its floor), a whole percent; per GPU.
    pub const COMPUTE_REQUEST: &str = "vgpu.io/compute-request";
    /// How the shares apply: force, disable or default; container-wide.
    pub const COMPUTE_POLICY: &str = "vgpu.io/compute-policy";
    /// The shares' pacing window ("250ms"); container-wide.
    pub const COMPUTE_WINDOW: &str = "vgpu.io/compute-window";
    /// Written by the shim into a spec it edited, so the later hook only records the owner.
    pub const PROVISIONED_BY: &str = "vgpu.io/provisioned-by";
}

/// The environment variables of a container (the spec's `process.env`, or a process's environment).
pub mod env {
    /// Memory quota (HAMi-core's); per GPU: `_<i>`.
    pub const MEMORY_LIMIT: &str = "CUDA_DEVICE_MEMORY_LIMIT";
    /// The prefix of HAMi-core's memory variables (a name under it that is none of them is a near miss).
    pub const MEMORY_PREFIX: &str = "CUDA_DEVICE_MEMORY_";
    /// The environment mode's ledger prefix (HAMi-core's).
    pub const SHARED_CACHE: &str = "CUDA_DEVICE_MEMORY_SHARED_CACHE";
    /// Compute share's limit (HAMi-core's); per GPU: `_<i>`.
    pub const SM_LIMIT: &str = "CUDA_DEVICE_SM_LIMIT";
    /// Compute share's request (vgpu's, beside HAMi-core's limit); per GPU: `_<i>`.
    pub const SM_REQUEST: &str = "CUDA_DEVICE_SM_REQUEST";
    /// HAMi's oversubscribe switch.
    pub const OVERSUBSCRIBE: &str = "CUDA_OVERSUBSCRIBE";
    /// The compute shares' policy (HAMi-core's).
    pub const CORE_POLICY: &str = "GPU_CORE_UTILIZATION_POLICY";
    /// The compute shares' pacing window.
    pub const COMPUTE_WINDOW: &str = "VGPU_COMPUTE_WINDOW";
    /// The session's private folder (not vgpu's; the environment mode's default ledgers lie in its
    /// `vgpu/` folder).
    pub const XDG_RUNTIME_DIR: &str = "XDG_RUNTIME_DIR";
    /// The limits file the library reads (set by the hook to the mounted one).
    pub const LIMITS_FILE: &str = "VGPU_LIMITS_FILE";
    /// Unified-memory mode, spill budget and reserve (the annotations' equivalents).
    pub const MEMORY_MODE: &str = "VGPU_MEMORY_MODE";
    pub const MEMORY_SPILL: &str = "VGPU_MEMORY_SPILL";
    pub const MEMORY_RESERVE: &str = "VGPU_MEMORY_RESERVE";
    /// The library's log level (diagnostics only; not a setting of the quota).
    pub const LOG_LEVEL: &str = "LIBCUDA_LOG_LEVEL";
    /// `0`: launches under a compute share may go unmeasured while the share has room (the driver's figure
    /// charges them; opt-in until measured on a GPU). Unset or `1`: every launch measured by events.
    pub const COMPUTE_METERED: &str = "VGPU_COMPUTE_METERED";
    /// NVIDIA's device list, read to find the container's GPUs (never written).
    pub const VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";
}

/// How far a setting reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Every GPU, with per-GPU forms: annotation `<key>.<i>` and, in a pod, `<key>.<container>[.<i>]`;
    /// variable `<NAME>_<i>`.
    PerGpu,
    /// The whole container.
    Container,
}

/// What a setting is about (which one a near miss was probably meant as).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topic {
    Memory,
    Compute,
    /// Written by vgpu itself, not a setting a user writes.
    Written,
}

/// One name of the registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key {
    pub name: &'static str,
    pub scope: Scope,
    pub topic: Topic,
}

const fn key(name: &'static str, scope: Scope, topic: Topic) -> Key {
    Key { name, scope, topic }
}

/// Every `vgpu.io/` annotation, in the order messages list them.
pub const ANNOTATIONS: &[Key] = &[
    key(annotation::MEMORY_LIMIT, Scope::PerGpu, Topic::Memory),
    key(annotation::MEMORY_MODE, Scope::Container, Topic::Memory),
    key(annotation::MEMORY_SPILL, Scope::Container, Topic::Memory),
    key(annotation::MEMORY_RESERVE, Scope::Container, Topic::Memory),
    key(annotation::COMPUTE_LIMIT, Scope::PerGpu, Topic::Compute),
    key(annotation::COMPUTE_REQUEST, Scope::PerGpu, Topic::Compute),
    key(annotation::COMPUTE_POLICY, Scope::Container, Topic::Compute),
    key(annotation::COMPUTE_WINDOW, Scope::Container, Topic::Compute),
    key(annotation::PROVISIONED_BY, Scope::Container, Topic::Written),
];

/// Every variable of a container's environment that sets (or, for `VGPU_LIMITS_FILE`, points at) its
/// limits: the ones whose near misses are refused. Not here: `LIBCUDA_LOG_LEVEL` and
/// `VGPU_COMPUTE_METERED` (diagnostics) and `NVIDIA_VISIBLE_DEVICES` (NVIDIA's).
pub const ENV: &[Key] = &[
    key(env::MEMORY_LIMIT, Scope::PerGpu, Topic::Memory),
    key(env::SHARED_CACHE, Scope::Container, Topic::Memory),
    key(env::SM_LIMIT, Scope::PerGpu, Topic::Compute),
    key(env::SM_REQUEST, Scope::PerGpu, Topic::Compute),
    key(env::OVERSUBSCRIBE, Scope::Container, Topic::Memory),
    key(env::CORE_POLICY, Scope::Container, Topic::Compute),
    key(env::COMPUTE_WINDOW, Scope::Container, Topic::Compute),
    key(env::LIMITS_FILE, Scope::Container, Topic::Written),
    key(env::MEMORY_MODE, Scope::Container, Topic::Memory),
    key(env::MEMORY_SPILL, Scope::Container, Topic::Memory),
    key(env::MEMORY_RESERVE, Scope::Container, Topic::Memory),
];

/// The registry's annotation `name` is one of its forms (`name` itself, or `name.<suffix>` of a per-GPU
/// key: the suffix's grammar is its parser's), if any.
pub fn annotation(name: &str) -> Option<&'static Key> {
    ANNOTATIONS.iter().find(|k| {
        name == k.name
            || (k.scope == Scope::PerGpu
                && name
                    .strip_prefix(k.name)
                    .is_some_and(|r| r.starts_with('.')))
    })
}

/// The registry's variable `name` is one of its forms (`NAME`, or `NAME_<suffix>` of a per-GPU variable,
/// the suffix non-empty and without `_`: the index's grammar is its parser's), if any.
pub fn env_var(name: &str) -> Option<&'static Key> {
    ENV.iter().find(|k| {
        name == k.name
            || (k.scope == Scope::PerGpu
                && name
                    .strip_prefix(k.name)
                    .and_then(|r| r.strip_prefix('_'))
                    .is_some_and(|i| !i.is_empty() && !i.contains('_')))
    })
}

/// The variable of GPU `i` of a per-GPU variable `base`: `<base>_<i>`.
pub fn per_gpu_var(base: &str, i: u32) -> String {
    format!("{base}_{i}")
}

/// The annotation of GPU `i` of a per-GPU key `base`: `<base>.<i>`.
pub fn per_gpu_annotation(base: &str, i: u32) -> String {
    format!("{base}.{i}")
}

/// The forms a user writes, as messages list them: `k, k.<i>, k.<container>[.<i>] (for a pod's
/// container), m, ... and w` (the pod note on the first per-GPU key only).
pub fn annotation_forms() -> String {
    let mut forms = Vec::new();
    let mut noted = false;
    for k in ANNOTATIONS.iter().filter(|k| k.topic != Topic::Written) {
        match k.scope {
            Scope::Container => forms.push(k.name.to_string()),
            Scope::PerGpu => {
                let pod = if noted {
                    ""
                } else {
                    " (for a pod's container)"
                };
                noted = true;
                forms.push(k.name.to_string());
                forms.push(format!("{}.<i>", k.name));
                forms.push(format!("{}.<container>[.<i>]{pod}", k.name));
            }
        }
    }
    match forms.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => forms.concat(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_annotation_has_the_prefix_and_the_glob_is_the_prefix() {
        for k in ANNOTATIONS {
            assert!(k.name.starts_with(ANNOTATION_PREFIX), "{}", k.name);
        }
        assert_eq!(ANNOTATION_GLOB.strip_suffix('*'), Some(ANNOTATION_PREFIX));
        for k in [env::MEMORY_LIMIT, env::SHARED_CACHE] {
            assert!(k.starts_with(env::MEMORY_PREFIX), "{k}");
        }
    }

    #[test]
    fn names_are_unique() {
        let mut all: Vec<&str> = ANNOTATIONS.iter().chain(ENV).map(|k| k.name).collect();
        all.sort_unstable();
        let n = all.len();
        all.dedup();
        assert_eq!(all.len(), n);
    }

    #[test]
    fn forms_of_per_gpu_and_container_keys() {
        assert_eq!(
            annotation("vgpu.io/memory-limit.trainer.1").map(|k| k.name),
            Some(annotation::MEMORY_LIMIT)
        );
        assert_eq!(
            annotation("vgpu.io/compute-limit").map(|k| k.name),
            Some(annotation::COMPUTE_LIMIT)
        );
        // A container-wide key has no suffixed form; near misses are no form at all.
        for n in [
            "vgpu.io/compute-window.1",
            "vgpu.io/memory-limits",
            "vgpu.io/memory-limit-x",
        ] {
            assert_eq!(annotation(n), None, "{n}");
        }
        assert_eq!(
            env_var("CUDA_DEVICE_SM_LIMIT_3").map(|k| k.name),
            Some(env::SM_LIMIT)
        );
        assert_eq!(
            env_var("CUDA_DEVICE_SM_REQUEST_3").map(|k| k.name),
            Some(env::SM_REQUEST)
        );
        assert_eq!(
            annotation("vgpu.io/compute-request.trainer.0").map(|k| k.name),
            Some(annotation::COMPUTE_REQUEST)
        );
        for n in [
            "CUDA_DEVICE_SM_LIMIT_",
            "CUDA_OVERSUBSCRIBE_1",
            "CUDA_DEVICE_MEMORY_LIMIT_1_2",
            "CUDA_DEVICE_MEMORY_LIMITX",
        ] {
            assert_eq!(env_var(n), None, "{n}");
        }
        assert_eq!(
            per_gpu_var(env::MEMORY_LIMIT, 2),
            "CUDA_DEVICE_MEMORY_LIMIT_2"
        );
        assert_eq!(
            per_gpu_annotation(annotation::COMPUTE_LIMIT, 0),
            "vgpu.io/compute-limit.0"
        );
    }

    /// The list users read in a refusal (the e2e suites match it).
    #[test]
    fn the_forms_listed() {
        assert_eq!(
            annotation_forms(),
            "vgpu.io/memory-limit, vgpu.io/memory-limit.<i>, vgpu.io/memory-limit.<container>[.<i>] (for a pod's container), vgpu.io/memory-mode, vgpu.io/memory-spill, vgpu.io/memory-reserve, vgpu.io/compute-limit, vgpu.io/compute-limit.<i>, vgpu.io/compute-limit.<container>[.<i>], vgpu.io/compute-request, vgpu.io/compute-request.<i>, vgpu.io/compute-request.<container>[.<i>], vgpu.io/compute-policy and vgpu.io/compute-window"
        );
    }
}
