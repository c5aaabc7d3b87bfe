//! Where the limits come from: the container's limits file (written by vgpu-hook, mounted read-only),
//! which inside a container is the only source, or outside one a file named by VGPU_LIMITS_FILE, or the
//! HAMi-core-compatible environment. Parsing is pure so it is unit-tested without a driver. Not
//! here: the environment's grammar (`vgpu_ledger::envlimits`, shared with the hook) or the files' format.

use crate::error::Error;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use vgpu_ledger::envcompute;
use vgpu_ledger::envlimits::{self, EnvLimits};
use vgpu_ledger::limits::Limits;
use vgpu_ledger::memmode::{self, ModeSettings};
use vgpu_ledger::MemoryMode;

pub const ENV_LIMIT: &str = envlimits::LIMIT_VAR;
pub const ENV_CACHE: &str = vgpu_ledger::keys::env::SHARED_CACHE;
pub const ENV_LIMITS_FILE: &str = envlimits::LIMITS_FILE_VAR;
/// The environment mode's ledgers without CUDA_DEVICE_MEMORY_SHARED_CACHE: `<user folder>/cudevshr.cache.<uuid>`.
pub const CACHE_NAME: &str = "cudevshr.cache";
const ENV_XDG: &str = "XDG_RUNTIME_DIR";

/// The limit and ledger of one GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceSpec {
    pub limit: u64,
    pub ledger: PathBuf,
    /// Plain, spill or oversubscribe (`vgpu_ledger::memmode`).
    pub memory: MemoryMode,
}

#[derive(Debug)]
pub enum Config {
    /// No limit anywhere: every call goes straight to the driver.
    Unlimited,
    /// A limits file: the container's (`mounted`: at the container path, then the only source), or one
    /// named by VGPU_LIMITS_FILE outside a container.
    File {
        path: PathBuf,
        limits: Limits,
        mounted: bool,
    },
    /// Environment variables. `dir`: the per-user folder the default `prefix` lies in (made and checked
    /// when a ledger is opened); None when CUDA_DEVICE_MEMORY_SHARED_CACHE gave the prefix.
    Env {
        global: u64,
        per_index: BTreeMap<u32, u64>,
        prefix: String,
        dir: Option<PathBuf>,
        /// VGPU_MEMORY_MODE / VGPU_MEMORY_SPILL / VGPU_MEMORY_RESERVE / CUDA_OVERSUBSCRIBE: every GPU
        /// with a limit.
        memory: MemoryMode,
    },
}

/// How the ledgers of a configuration are opened (`quota`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LedgerMode<'a> {
    /// Listed in the container's mounted limits file: provisioned by vgpu-hook, opened and never created
    /// (a tenant who deletes it must not get a fresh, empty one); it must be a regular file.
    Provisioned,
    /// Listed in a limits file named by VGPU_LIMITS_FILE outside a container (tests): created on demand
    /// (mode 0666) when missing.
    File,
    /// The environment mode: created on demand for this user alone (0600); only files of this user's or
    /// root's that no other user can write are used; `dir`, the per-user default folder, is made first
    /// (0700, this user's).
    Env { dir: Option<&'a Path> },
}

/// A GPU as the configuration sees it (`identity` finds it): its own UUID (`GPU-…`, or `MIG-…` for a MIG
/// instance), the parent GPU's UUID for a MIG instance, and the NVML index of the GPU (the parent's for
/// MIG; None when NVML cannot tell).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gpu<'a> {
    pub uuid: &'a str,
    pub parent: Option<&'a str>,
    pub index: Option<u32>,
}

/// The quota of one GPU.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    Limit(DeviceSpec),
    NoLimit,
    /// A limit applies to the process but cannot be placed on this GPU: CUDA is refused on it (the reason
    /// is one line for the log).
    Refuse(String),
}

/// The environment mode's pacing window (`VGPU_COMPUTE_WINDOW`, ms): the default when unset or empty; a
/// malformed value is an error of one line naming the variable.
pub fn env_window_ms(env: &[(String, String)]) -> Result<u32, envcompute::WindowError> {
    match env.iter().rev().find(|(k, _)| k == envcompute::WINDOW_VAR) {
        Some((k, v)) if !v.trim().is_empty() => envcompute::parse_window(v, k),
        _ => Ok(envcompute::DEFAULT_WINDOW_MS),
    }
}

impl Config {
    /// Reads the process environment and, when present, the limits file.
    pub fn load() -> Result<Config, Error> {
        let env: Vec<(String, String)> = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .filter(|(k, _)| {
                k.starts_with("CUDA_DEVICE_MEMORY_")
                    || k.starts_with(envcompute::SM_LIMIT_VAR)
                    || k == envcompute::POLICY_VAR
                    || k == envcompute::WINDOW_VAR
                    || k.starts_with("VGPU_MEMORY_")
                    || k == memmode::OVERSUBSCRIBE_VAR
                    || k == ENV_LIMITS_FILE
                    || k == ENV_XDG
            })
            .collect();
        Self::from_env(&env, Path::new(vgpu_ledger::layout::CONTAINER_LIMITS_PATH))
    }

    /// `env`: the relevant variables; `mounted`: where a container's limits file is mounted
    /// (`vgpu_ledger::layout::CONTAINER_LIMITS_PATH`).
    pub fn from_env(env: &[(String, String)], mounted: &Path) -> Result<Config, Error> {
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        // Inside a container (its limits file is mounted) that file is the only source: any user of the
        // container could copy it with a bigger number and name the copy in VGPU_LIMITS_FILE, or set
        // CUDA_DEVICE_MEMORY_LIMIT. The variable is for tests and the standalone mode; a file it names must
        // exist. Anything at the mounted path but "not found" counts as present (and must then load).
        let in_container = !matches!(std::fs::symlink_metadata(mounted),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound);
        let file = if in_container {
            Some((mounted.to_path_buf(), true))
        } else {
            match get(ENV_LIMITS_FILE) {
                Some(p) if !p.is_empty() => Some((PathBuf::from(p), false)),
                _ => None,
            }
        };
        if let Some((path, mounted)) = file {
            let limits = Limits::load(&path)
                .map_err(|e| Error::Config(format!("limits file {}: {e}", path.display())))?;
            return Ok(Config::File {
                path,
                limits,
                mounted,
            });
        }
        // The grammar is the hook's too (vgpu_ledger::envlimits): 0 or empty is no limit for those GPUs.
        let limits = EnvLimits::parse(env).map_err(|e| Error::Config(e.to_string()))?;
        // The compute share's variables are read by `compute`; a malformed one refuses CUDA like a
        // malformed memory limit.
        envcompute::EnvCompute::parse(env).map_err(|e| Error::Config(e.to_string()))?;
        env_window_ms(env).map_err(|e| Error::Config(e.to_string()))?;
        if limits.is_unlimited() {
            return Ok(Config::Unlimited);
        }
        let memory = ModeSettings::from_env(env)
            .parse()
            .map_err(|e| Error::Config(e.to_string()))?;
        let global = limits.global.as_ref().map_or(0, |l| l.bytes);
        let per_index: BTreeMap<u32, u64> = limits
            .per_index
            .iter()
            .map(|(&i, l)| (i, l.bytes))
            .collect();
        let (prefix, dir) = env_prefix(env);
        Ok(Config::Env {
            global,
            per_index,
            prefix,
            dir,
            memory,
        })
    }

    pub fn is_unlimited(&self) -> bool {
        matches!(self, Config::Unlimited)
    }

    /// The quota of a GPU. The limits file knows GPUs by UUID (a MIG instance gets its GPU's quota);
    /// a GPU it does not list is refused, never unlimited. The environment's `CUDA_DEVICE_MEMORY_LIMIT_<i>`
    /// is GPU `i` in NVML's order (HAMi-core's reading), so it follows the GPU whatever
    /// CUDA_VISIBLE_DEVICES does; each GPU or MIG instance has its own ledger `<prefix>.<uuid>`.
    pub fn lookup(&self, gpu: Gpu<'_>) -> Lookup {
        match self {
            Config::Unlimited => Lookup::NoLimit,
            Config::File { path, limits, .. } => {
                match file_device(limits, gpu) {
                    // Listed for its compute share alone: no memory quota on it.
                    Some(d) if d.memory_limit.is_none() => Lookup::NoLimit,
                    Some(d) => Lookup::Limit(DeviceSpec {
                        limit: d.memory_limit.unwrap_or(u64::MAX),
                        ledger: limits.ledger_path(path, d),
                        memory: d.memory,
                    }),
                    None => Lookup::Refuse(format!(
                        "{}{} is not in the limits file {}",
                        gpu.uuid,
                        gpu.parent
                            .map(|p| format!(" (MIG of {p})"))
                            .unwrap_or_default(),
                        path.display()
                    )),
                }
            }
            Config::Env {
                global,
                per_index,
                prefix,
                memory,
                ..
            } => {
                let limit = match gpu.index.and_then(|i| per_index.get(&i)) {
                    Some(&l) => l,
                    None if gpu.index.is_none() && !per_index.is_empty() => {
                        return Lookup::Refuse(format!(
                            "{}: NVML cannot tell its index, which CUDA_DEVICE_MEMORY_LIMIT_<i> needs",
                            gpu.uuid
                        ))
                    }
                    None => *global,
                };
                if limit == 0 {
                    return Lookup::NoLimit;
                }
                Lookup::Limit(DeviceSpec {
                    limit,
                    ledger: env_ledger_path(prefix, gpu.uuid),
                    memory: *memory,
                })
            }
        }
    }

    /// The compute share of a GPU listed in the limits file, its ledger (where the share's bucket is) and
    /// its pacing window (ms): None without a limits file, for a GPU without a share (or with the policy
    /// `disable`), and for a GPU the file does not list (CUDA is refused on it by the memory side). The
    /// environment's shares are `compute`'s.
    pub fn file_share(&self, gpu: Gpu<'_>) -> Option<(u32, PathBuf, u32)> {
        let Config::File { path, limits, .. } = self else {
            return None;
        };
        let d = file_device(limits, gpu)?;
        Some((
            d.compute_share()?,
            limits.ledger_path(path, d),
            d.compute_window_ms.unwrap_or(envcompute::DEFAULT_WINDOW_MS),
        ))
    }

    /// The limits file, when the configuration is one: what `vgpuctl update` rewrites (`live`).
    pub fn limits_file(&self) -> Option<&Path> {
        match self {
            Config::File { path, .. } => Some(path),
            _ => None,
        }
    }

    /// Whether any GPU of the limits file has a compute share.
    pub fn file_has_shares(&self) -> bool {
        matches!(self, Config::File { limits, .. } if limits.devices.iter().any(|d| d.compute_share().is_some()))
    }

    /// Whether any GPU with a memory limit is in oversubscribe mode: its launches then wait for their
    /// turn (`turns`).
    pub fn any_oversubscribed(&self) -> bool {
        let over = |m: &MemoryMode| matches!(m, MemoryMode::Oversubscribe { .. });
        match self {
            Config::Unlimited => false,
            Config::File { limits, .. } => limits
                .devices
                .iter()
                .any(|d| d.memory_limit.is_some() && over(&d.memory)),
            Config::Env { memory, .. } => over(memory),
        }
    }

    /// How this configuration's ledgers are opened.
    pub fn ledger_mode(&self) -> LedgerMode<'_> {
        match self {
            Config::Env { dir, .. } => LedgerMode::Env {
                dir: dir.as_deref(),
            },
            Config::File { mounted: true, .. } => LedgerMode::Provisioned,
            _ => LedgerMode::File,
        }
    }
}

/// A GPU's entry of a limits file, by its UUID or, for a MIG instance, its GPU's.
fn file_device<'l>(limits: &'l Limits, gpu: Gpu<'_>) -> Option<&'l vgpu_ledger::DeviceLimit> {
    limits
        .device_by_uuid(gpu.uuid)
        .or_else(|| gpu.parent.and_then(|p| limits.device_by_uuid(p)))
}

/// The environment mode's ledger prefix and, without CUDA_DEVICE_MEMORY_SHARED_CACHE, the per-user folder
/// it lies in. Never a folder every user shares: one user could truncate another's ledger (SIGBUS) or
/// share its quota.
pub fn env_prefix(env: &[(String, String)]) -> (String, Option<PathBuf>) {
    let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    match get(ENV_CACHE) {
        Some(p) if !p.is_empty() => (p.to_string(), None),
        _ => {
            let dir = user_dir(get(ENV_XDG));
            let prefix = dir.join(CACHE_NAME).to_string_lossy().into_owned();
            (prefix, Some(dir))
        }
    }
}

/// The ledger of GPU `uuid` when configured by the environment: `<prefix>.<uuid>`.
pub fn env_ledger_path(prefix: &str, uuid: &str) -> PathBuf {
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

#[cfg(test)]
mod tests;
