//! The environment as the configuration reads it: which variables are read (every name from the key
//! registry, `vgpu_ledger::keys::env`), the pacing window, the ledgers' prefix and the per-user folder
//! they lie in. Not here: the variables' grammars (`vgpu_ledger::envlimits`, `envcompute`, `memmode`,
//! shared with the hook), what the configuration makes of them (`config`).

use std::path::{Path, PathBuf};

use vgpu_ledger::envcompute;
use vgpu_ledger::keys::env as key;

/// The environment mode's ledgers without CUDA_DEVICE_MEMORY_SHARED_CACHE: `<user folder>/cudevshr.cache.<uuid>`.
pub const CACHE_NAME: &str = "cudevshr.cache";

/// Whether the configuration reads variable `name`: the memory limits and the shared cache, the compute
/// shares' limits and requests, their policy and window, the unified-memory settings, the limits file, the session's folder.
pub fn read_by_config(name: &str) -> bool {
    name.starts_with(key::MEMORY_PREFIX)
        || name.starts_with(key::SM_LIMIT)
        || name.starts_with(key::SM_REQUEST)
        || [
            key::CORE_POLICY,
            key::COMPUTE_WINDOW,
            key::MEMORY_MODE,
            key::MEMORY_SPILL,
            key::MEMORY_RESERVE,
            key::OVERSUBSCRIBE,
            key::LIMITS_FILE,
            key::XDG_RUNTIME_DIR,
        ]
        .contains(&name)
}

/// The process environment's variables the configuration reads (those that are UTF-8).
pub fn vars() -> Vec<(String, String)> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(k, _)| read_by_config(k))
        .collect()
}

/// The value of `name`, its first occurrence.
pub fn get<'e>(env: &'e [(String, String)], name: &str) -> Option<&'e str> {
    env.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

/// The environment mode's pacing window (`VGPU_COMPUTE_WINDOW`, ms): the default when unset or empty; a
/// malformed value is an error of one line naming the variable.
pub fn window_ms(env: &[(String, String)]) -> Result<u32, envcompute::WindowError> {
    match env.iter().rev().find(|(k, _)| k == key::COMPUTE_WINDOW) {
        Some((k, v)) if !v.trim().is_empty() => envcompute::parse_window(v, k),
        _ => Ok(envcompute::DEFAULT_WINDOW_MS),
    }
}

/// The environment mode's ledger prefix and, without CUDA_DEVICE_MEMORY_SHARED_CACHE, the per-user folder
/// it lies in. Never a folder every user shares: one user could truncate another's ledger (SIGBUS) or
/// share its quota.
pub fn ledger_prefix(env: &[(String, String)]) -> (String, Option<PathBuf>) {
    match get(env, key::SHARED_CACHE) {
        Some(p) if !p.is_empty() => (p.to_string(), None),
        _ => {
            let dir = user_dir(get(env, key::XDG_RUNTIME_DIR));
            let prefix = dir.join(CACHE_NAME).to_string_lossy().into_owned();
            (prefix, Some(dir))
        }
    }
}

/// The ledger of GPU `uuid` when configured by the environment: `<prefix>.<uuid>`.
pub fn ledger_path(prefix: &str, uuid: &str) -> PathBuf {
    PathBuf::from(format!("{prefix}.{uuid}"))
}

/// The folder of this user's default ledgers: `$XDG_RUNTIME_DIR/vgpu` when that variable names a folder
/// of this (effective) user's, not through a symbolic link (the session's private folder), else
/// `/tmp/vgpu-<uid>`. Made and checked (0700, this user's, not a link) by `quota` before use.
pub fn user_dir(xdg: Option<&str>) -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    let ours = |p: &str| {
        p.starts_with('/')
            && std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir() && m.uid() == me)
    };
    match xdg {
        Some(x) if ours(x) => Path::new(x).join("vgpu"),
        _ => PathBuf::from(format!("/tmp/vgpu-{me}")),
    }
}
