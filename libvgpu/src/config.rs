//! The library's one settings model: where the limits come from and what each GPU gets. The container's
//! limits file (written by vgpu-hook, mounted read-only) is inside a container the only source; outside
//! one a file named by VGPU_LIMITS_FILE, or the HAMi-core-compatible environment. Loaded once
//! (`settings`), read by the memory side (`lookup`: `devices`) and the compute share (`share`:
//! `compute::which`) alike; each GPU's limits are one `vgpu_ledger::GpuSettings`, whichever the source.
//! Parsing is pure so it is unit-tested without a driver. Not here: the environment's grammars
//! (`vgpu_ledger::envlimits`, `envcompute`, `memmode`, shared with the hook), which variables are read
//! (`config::env`), the files' format.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use vgpu_ledger::envcompute::{self, EnvCompute, Policy};
use vgpu_ledger::envlimits::EnvLimits;
use vgpu_ledger::limits::Limits;
use vgpu_ledger::memmode::ModeSettings;
use vgpu_ledger::{GpuSettings, MemoryMode};

pub mod env;
mod error;
pub use error::{ConfigError, Unplaced};

/// One GPU's settings and its ledger: what a memory quota or a compute share on it is enforced with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceSpec {
    /// The GPU's limits, as the limits file holds them (the environment's made into the same shape).
    pub settings: GpuSettings,
    pub ledger: PathBuf,
}

impl DeviceSpec {
    /// The memory quota in bytes (`lookup` gives a spec only for a GPU with one).
    pub fn limit(&self) -> u64 {
        self.settings.memory_limit.unwrap_or(u64::MAX)
    }

    /// The compute share's request and limit (percent, `GpuSettings::request_limit`) and its pacing
    /// window (ms); None: no share (or the policy `disable`), or a request of the whole GPU (nothing to
    /// hold back).
    pub fn share(&self) -> Option<((u32, u32), u32)> {
        let (request, limit) = self.settings.request_limit()?;
        (request < vgpu_ledger::envcompute::WHOLE).then_some((
            (request, limit),
            self.settings
                .compute_window_ms
                .unwrap_or(envcompute::DEFAULT_WINDOW_MS),
        ))
    }
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
    /// Environment variables: memory limits, compute shares, or both. `dir`: the per-user folder the
    /// default `prefix` lies in (made and checked when a ledger is opened); None when
    /// CUDA_DEVICE_MEMORY_SHARED_CACHE gave the prefix.
    Env {
        /// None: no memory limit (the unified-memory settings then are not read).
        memory: Option<EnvMemory>,
        /// None: no GPU has a share.
        compute: Option<EnvShares>,
        prefix: String,
        dir: Option<PathBuf>,
    },
}

/// The environment's memory limits.
#[derive(Debug)]
pub struct EnvMemory {
    /// `CUDA_DEVICE_MEMORY_LIMIT`; 0: none.
    pub global: u64,
    /// `CUDA_DEVICE_MEMORY_LIMIT_<i>` by NVML index; 0: none on that GPU.
    pub per_index: BTreeMap<u32, u64>,
    /// VGPU_MEMORY_MODE / VGPU_MEMORY_SPILL / VGPU_MEMORY_RESERVE / CUDA_OVERSUBSCRIBE: every GPU with a
    /// limit.
    pub mode: MemoryMode,
}

/// The environment's compute shares.
#[derive(Debug)]
pub struct EnvShares {
    /// `CUDA_DEVICE_SM_LIMIT[_<i>]` and the policy.
    pub shares: EnvCompute,
    /// `VGPU_COMPUTE_WINDOW` in ms, or the default.
    pub window_ms: u32,
}

impl EnvMemory {
    /// The limit of `gpu` (0: none): its index's, else the global one. `CUDA_DEVICE_MEMORY_LIMIT_<i>` is
    /// GPU `i` in NVML's order (HAMi-core's reading), so it follows the GPU whatever CUDA_VISIBLE_DEVICES
    /// does.
    fn limit_for(&self, gpu: Gpu<'_>) -> Result<u64, Unplaced> {
        match gpu.index.and_then(|i| self.per_index.get(&i)) {
            Some(&l) => Ok(l),
            None if gpu.index.is_none() && !self.per_index.is_empty() => Err(Unplaced::NoIndex {
                uuid: gpu.uuid.to_string(),
            }),
            None => Ok(self.global),
        }
    }
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

/// The memory quota of one GPU.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    Limit(DeviceSpec),
    NoLimit,
    /// A limit applies to the process but cannot be placed on this GPU: CUDA is refused on it.
    Refuse(Unplaced),
}

impl Config {
    /// Reads the process environment and, when present, the limits file.
    pub fn load() -> Result<Config, ConfigError> {
        Self::from_env(
            &env::vars(),
            Path::new(vgpu_ledger::layout::CONTAINER_LIMITS_PATH),
        )
    }

    /// `env`: the relevant variables ([`env::read_by_config`]); `mounted`: where a container's limits
    /// file is mounted (`vgpu_ledger::layout::CONTAINER_LIMITS_PATH`).
    pub fn from_env(vars: &[(String, String)], mounted: &Path) -> Result<Config, ConfigError> {
        // Inside a container (its limits file is mounted) that file is the only source: any user of the
        // container could copy it with a bigger number and name the copy in VGPU_LIMITS_FILE, or set
        // CUDA_DEVICE_MEMORY_LIMIT. The variable is for tests and the standalone mode; a file it names must
        // exist. Anything at the mounted path but "not found" counts as present (and must then load).
        let in_container = !matches!(std::fs::symlink_metadata(mounted),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound);
        let file = if in_container {
            Some((mounted.to_path_buf(), true))
        } else {
            match env::get(vars, vgpu_ledger::keys::env::LIMITS_FILE) {
                Some(p) if !p.is_empty() => Some((PathBuf::from(p), false)),
                _ => None,
            }
        };
        if let Some((path, mounted)) = file {
            return match Limits::load(&path) {
                Ok(limits) => Ok(Config::File {
                    path,
                    limits,
                    mounted,
                }),
                Err(err) => Err(ConfigError::LimitsFile { path, err }),
            };
        }
        // The grammars are the hook's too (vgpu_ledger::envlimits, envcompute): 0 or empty is no limit for
        // those GPUs. A malformed share or window refuses CUDA like a malformed memory limit.
        let limits = EnvLimits::parse(vars).map_err(ConfigError::Memory)?;
        let shares = EnvCompute::parse(vars).map_err(ConfigError::Compute)?;
        shares.check_requests().map_err(ConfigError::Request)?;
        let window_ms = env::window_ms(vars).map_err(ConfigError::Window)?;
        let memory = match limits.is_unlimited() {
            true => None,
            false => Some(EnvMemory {
                global: limits.global.as_ref().map_or(0, |l| l.bytes),
                per_index: limits
                    .per_index
                    .iter()
                    .map(|(&i, l)| (i, l.bytes))
                    .collect(),
                mode: ModeSettings::from_env(vars)
                    .parse()
                    .map_err(ConfigError::Mode)?,
            }),
        };
        // A request alone is a share too (its limit the whole GPU): lent all of it while the GPU is its
        // alone, held to its floor and what is lent beside busy neighbours (`compute::lend`).
        let any_request = shares.policy != Policy::Disable && shares.has_requests();
        let compute =
            (!shares.is_unlimited() || any_request).then_some(EnvShares { shares, window_ms });
        if memory.is_none() && compute.is_none() {
            return Ok(Config::Unlimited);
        }
        let (prefix, dir) = env::ledger_prefix(vars);
        Ok(Config::Env {
            memory,
            compute,
            prefix,
            dir,
        })
    }

    /// True when no memory limit applies anywhere (the memory hooks then only forward); the
    /// environment's compute shares may still apply ([`Config::has_shares`]).
    pub fn is_unlimited(&self) -> bool {
        matches!(self, Config::Unlimited | Config::Env { memory: None, .. })
    }

    /// The memory quota of a GPU. The limits file knows GPUs by UUID (a MIG instance gets its GPU's
    /// quota); a GPU it does not list is refused, never unlimited. The environment's limits are by NVML
    /// index; each GPU or MIG instance has its own ledger `<prefix>.<uuid>`.
    pub fn lookup(&self, gpu: Gpu<'_>) -> Lookup {
        match self {
            Config::Unlimited | Config::Env { memory: None, .. } => Lookup::NoLimit,
            Config::File { path, limits, .. } => match file_device(limits, gpu) {
                // Listed for its compute share alone: no memory quota on it.
                Some(d) if d.settings.memory_limit.is_none() => Lookup::NoLimit,
                Some(d) => Lookup::Limit(DeviceSpec {
                    settings: d.settings,
                    ledger: limits.ledger_path(path, d),
                }),
                None => Lookup::Refuse(Unplaced::NotInFile {
                    uuid: gpu.uuid.to_string(),
                    parent: gpu.parent.map(str::to_string),
                    path: path.clone(),
                }),
            },
            Config::Env {
                memory: Some(memory),
                compute,
                prefix,
                ..
            } => match memory.limit_for(gpu) {
                Err(why) => Lookup::Refuse(why),
                Ok(0) => Lookup::NoLimit,
                Ok(limit) => Lookup::Limit(DeviceSpec {
                    settings: env_settings(Some(limit), memory.mode, compute.as_ref(), gpu),
                    ledger: env::ledger_path(prefix, gpu.uuid),
                }),
            },
        }
    }

    /// The compute share of a GPU: its settings and ledger (where the share's bucket is), for a GPU with
    /// a share ([`DeviceSpec::share`]). None for a GPU without one (or under the policy `disable`), and
    /// for a GPU the limits file does not list (CUDA is refused on it by the memory side). Inside a
    /// container the shares are the limits file's alone.
    pub fn share(&self, gpu: Gpu<'_>) -> Option<DeviceSpec> {
        let spec = match self {
            Config::Unlimited | Config::Env { compute: None, .. } => return None,
            Config::File { path, limits, .. } => {
                let d = file_device(limits, gpu)?;
                DeviceSpec {
                    settings: d.settings,
                    ledger: limits.ledger_path(path, d),
                }
            }
            Config::Env {
                memory,
                compute: compute @ Some(_),
                prefix,
                ..
            } => {
                let limit = memory
                    .as_ref()
                    .and_then(|m| m.limit_for(gpu).ok())
                    .filter(|&l| l > 0);
                let mode = memory.as_ref().map(|m| m.mode).unwrap_or_default();
                DeviceSpec {
                    settings: env_settings(limit, mode, compute.as_ref(), gpu),
                    ledger: env::ledger_path(prefix, gpu.uuid),
                }
            }
        };
        spec.share().is_some().then_some(spec)
    }

    /// The limits file, when the configuration is one: what `vgpuctl update` rewrites (`live`).
    pub fn limits_file(&self) -> Option<&Path> {
        match self {
            Config::File { path, .. } => Some(path),
            _ => None,
        }
    }

    /// Whether any GPU has a compute share.
    pub fn has_shares(&self) -> bool {
        match self {
            Config::Unlimited => false,
            Config::File { limits, .. } => limits.devices.iter().any(|d| {
                d.settings
                    .request_limit()
                    .is_some_and(|(r, _)| r < vgpu_ledger::envcompute::WHOLE)
            }),
            Config::Env { compute, .. } => compute.is_some(),
        }
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
                .any(|d| d.settings.memory_limit.is_some() && over(&d.settings.memory)),
            Config::Env { memory, .. } => memory.as_ref().is_some_and(|m| over(&m.mode)),
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

/// One GPU's settings from the environment: its memory limit and mode, and its share with the policy and
/// window where it has one.
fn env_settings(
    memory_limit: Option<u64>,
    memory: MemoryMode,
    compute: Option<&EnvShares>,
    gpu: Gpu<'_>,
) -> GpuSettings {
    let limit = compute.and_then(|c| c.shares.share_for(gpu.index));
    // `CUDA_DEVICE_SM_REQUEST[_<i>]`, the floor the share lends above (`compute::lend`).
    let request = compute.and_then(|c| c.shares.request_for(gpu.index));
    let share = compute.filter(|_| limit.is_some() || request.is_some());
    GpuSettings {
        memory_limit,
        memory,
        compute_limit: limit,
        compute_request: request,
        compute_policy: share.map(|c| c.shares.policy).unwrap_or_default(),
        compute_window_ms: share.map(|c| c.window_ms),
    }
}

/// A GPU's entry of a limits file, by its UUID or, for a MIG instance, its GPU's.
fn file_device<'l>(limits: &'l Limits, gpu: Gpu<'_>) -> Option<&'l vgpu_ledger::DeviceLimit> {
    limits
        .device_by_uuid(gpu.uuid)
        .or_else(|| gpu.parent.and_then(|p| limits.device_by_uuid(p)))
}

#[cfg(test)]
mod tests;
