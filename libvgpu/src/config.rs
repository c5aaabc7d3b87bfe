//! Where the limits come from: the container's limits file (written by vgpu-hook, read-only), which wins,
//! or the HAMi-core-compatible environment. Parsing is pure so it is unit-tested without a driver. Not
//! here: the environment's grammar (`vgpu_ledger::envlimits`, shared with the hook) or the files' format.

use crate::error::Error;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use vgpu_ledger::envlimits::{self, EnvLimits};
use vgpu_ledger::limits::Limits;

pub const ENV_LIMIT: &str = envlimits::LIMIT_VAR;
pub const ENV_CACHE: &str = "CUDA_DEVICE_MEMORY_SHARED_CACHE";
pub const ENV_LIMITS_FILE: &str = envlimits::LIMITS_FILE_VAR;
pub const DEFAULT_CACHE: &str = "/tmp/cudevshr.cache";

/// The limit and ledger of one GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceSpec {
    pub limit: u64,
    pub ledger: PathBuf,
}

#[derive(Debug)]
pub enum Config {
    /// No limit anywhere: every call goes straight to the driver.
    Unlimited,
    /// The container's limits file.
    File { path: PathBuf, limits: Limits },
    /// Environment variables.
    Env {
        global: u64,
        per_index: BTreeMap<u32, u64>,
        prefix: String,
    },
}

/// What a UUID alone tells (NVML knows devices by UUID, the environment by CUDA ordinal).
#[derive(Debug, PartialEq, Eq)]
pub enum UuidLookup {
    Limit(DeviceSpec),
    NoLimit,
    /// Per-ordinal environment limits: the CUDA ordinal of this UUID must be found first.
    NeedsOrdinal,
}

impl Config {
    /// Reads the process environment and, when present, the limits file.
    pub fn load() -> Result<Config, Error> {
        let env: Vec<(String, String)> = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .filter(|(k, _)| k.starts_with("CUDA_DEVICE_MEMORY_") || k == ENV_LIMITS_FILE)
            .collect();
        Self::from_env(&env, Path::new(vgpu_ledger::layout::CONTAINER_LIMITS_PATH))
    }

    /// `env`: the relevant variables; `default_file`: the limits file used when VGPU_LIMITS_FILE is unset.
    pub fn from_env(env: &[(String, String)], default_file: &Path) -> Result<Config, Error> {
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        // The limits file wins. Named explicitly it must exist; at the default path it is optional.
        let file = match get(ENV_LIMITS_FILE) {
            Some(p) if !p.is_empty() => Some(PathBuf::from(p)),
            _ if default_file.exists() => Some(default_file.to_path_buf()),
            _ => None,
        };
        if let Some(path) = file {
            let limits = Limits::load(&path)
                .map_err(|e| Error::Config(format!("limits file {}: {e}", path.display())))?;
            return Ok(Config::File { path, limits });
        }
        // The grammar is the hook's too (vgpu_ledger::envlimits): 0 or empty is no limit for those GPUs.
        let limits = EnvLimits::parse(env).map_err(|e| Error::Config(e.to_string()))?;
        if limits.is_unlimited() {
            return Ok(Config::Unlimited);
        }
        let global = limits.global.as_ref().map_or(0, |l| l.bytes);
        let per_index: BTreeMap<u32, u64> = limits
            .per_index
            .iter()
            .map(|(&i, l)| (i, l.bytes))
            .collect();
        let prefix = match get(ENV_CACHE) {
            Some(p) if !p.is_empty() => p.to_string(),
            _ => DEFAULT_CACHE.to_string(),
        };
        Ok(Config::Env {
            global,
            per_index,
            prefix,
        })
    }

    pub fn is_unlimited(&self) -> bool {
        matches!(self, Config::Unlimited)
    }

    /// The quota of the GPU with CUDA ordinal `ordinal` (as this process sees it) and UUID `uuid`.
    pub fn for_device(&self, ordinal: i32, uuid: &str) -> Option<DeviceSpec> {
        match self {
            Config::Unlimited => None,
            Config::File { .. } => match self.for_uuid(uuid) {
                UuidLookup::Limit(s) => Some(s),
                _ => None,
            },
            Config::Env {
                global,
                per_index,
                prefix,
            } => {
                let limit = u32::try_from(ordinal)
                    .ok()
                    .and_then(|i| per_index.get(&i))
                    .copied()
                    .unwrap_or(*global);
                (limit > 0).then(|| DeviceSpec {
                    limit,
                    ledger: env_ledger_path(prefix, uuid),
                })
            }
        }
    }

    /// The quota of the GPU with this UUID, if the UUID alone decides it.
    pub fn for_uuid(&self, uuid: &str) -> UuidLookup {
        match self {
            Config::Unlimited => UuidLookup::NoLimit,
            Config::File { path, limits } => match limits.device_by_uuid(uuid) {
                Some(d) if d.memory_limit > 0 => UuidLookup::Limit(DeviceSpec {
                    limit: d.memory_limit,
                    ledger: limits.ledger_path(path, d),
                }),
                _ => UuidLookup::NoLimit,
            },
            Config::Env {
                global,
                per_index,
                prefix,
            } => {
                if !per_index.is_empty() {
                    UuidLookup::NeedsOrdinal
                } else if *global > 0 {
                    UuidLookup::Limit(DeviceSpec {
                        limit: *global,
                        ledger: env_ledger_path(prefix, uuid),
                    })
                } else {
                    UuidLookup::NoLimit
                }
            }
        }
    }
}

/// The ledger of GPU `uuid` when configured by the environment: `<prefix>.<uuid>`.
pub fn env_ledger_path(prefix: &str, uuid: &str) -> PathBuf {
    PathBuf::from(format!("{prefix}.{uuid}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }
    const NOFILE: &str = "/nonexistent/vgpu/limits.json";

    #[test]
    fn nothing_set_is_unlimited() {
        assert!(Config::from_env(&env(&[]), Path::new(NOFILE))
            .unwrap()
            .is_unlimited());
        assert!(Config::from_env(
            &env(&[("CUDA_DEVICE_MEMORY_LIMIT", "0")]),
            Path::new(NOFILE)
        )
        .unwrap()
        .is_unlimited());
    }

    #[test]
    fn global_and_per_index_limits() {
        let c = Config::from_env(
            &env(&[
                ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
                ("CUDA_DEVICE_MEMORY_LIMIT_1", "512Mi"),
            ]),
            Path::new(NOFILE),
        )
        .unwrap();
        let d0 = c.for_device(0, "GPU-a").unwrap();
        assert_eq!(d0.limit, 1 << 30);
        assert_eq!(d0.ledger, PathBuf::from("/tmp/cudevshr.cache.GPU-a"));
        assert_eq!(c.for_device(1, "GPU-b").unwrap().limit, 512 << 20);
        assert_eq!(c.for_uuid("GPU-a"), UuidLookup::NeedsOrdinal);
    }

    #[test]
    fn per_index_zero_means_no_limit_for_that_device() {
        let c = Config::from_env(
            &env(&[
                ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
                ("CUDA_DEVICE_MEMORY_LIMIT_0", "0"),
            ]),
            Path::new(NOFILE),
        )
        .unwrap();
        assert_eq!(c.for_device(0, "GPU-a"), None);
        assert_eq!(c.for_device(1, "GPU-b").unwrap().limit, 1 << 30);
    }

    #[test]
    fn zero_means_no_limit_as_the_hook_reads_it() {
        // The hook passes such a container through untouched; the library then runs it unlimited.
        for pairs in [
            &[("CUDA_DEVICE_MEMORY_LIMIT", "0")][..],
            &[("CUDA_DEVICE_MEMORY_LIMIT_0", "0")],
            &[
                ("CUDA_DEVICE_MEMORY_LIMIT", "0"),
                ("CUDA_DEVICE_MEMORY_LIMIT_1", ""),
            ],
        ] {
            let c = Config::from_env(&env(pairs), Path::new(NOFILE)).unwrap();
            assert!(c.is_unlimited(), "{pairs:?}");
        }
        let c = Config::from_env(
            &env(&[
                ("CUDA_DEVICE_MEMORY_LIMIT", "0"),
                ("CUDA_DEVICE_MEMORY_LIMIT_1", "1g"),
            ]),
            Path::new(NOFILE),
        )
        .unwrap();
        assert_eq!(c.for_device(0, "GPU-a"), None);
        assert_eq!(c.for_device(1, "GPU-b").unwrap().limit, 1 << 30);
    }

    #[test]
    fn shared_cache_prefix() {
        let c = Config::from_env(
            &env(&[
                ("CUDA_DEVICE_MEMORY_LIMIT", "4096"),
                ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/x/q"),
            ]),
            Path::new(NOFILE),
        )
        .unwrap();
        assert_eq!(
            c.for_uuid("GPU-1"),
            UuidLookup::Limit(DeviceSpec {
                limit: 4096,
                ledger: "/x/q.GPU-1".into()
            })
        );
    }

    #[test]
    fn bad_values_are_errors_naming_the_variable() {
        let e = Config::from_env(
            &env(&[("CUDA_DEVICE_MEMORY_LIMIT", "lots")]),
            Path::new(NOFILE),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("CUDA_DEVICE_MEMORY_LIMIT=\"lots\""), "{e}");
        let e = Config::from_env(
            &env(&[("CUDA_DEVICE_MEMORY_LIMIT_x", "1g")]),
            Path::new(NOFILE),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("CUDA_DEVICE_MEMORY_LIMIT_x"), "{e}");
        let e = Config::from_env(
            &env(&[("CUDA_DEVICE_MEMORY_LIMIT_2", "-5")]),
            Path::new(NOFILE),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("CUDA_DEVICE_MEMORY_LIMIT_2"), "{e}");
    }

    #[test]
    fn named_limits_file_must_exist() {
        let e = Config::from_env(
            &env(&[("VGPU_LIMITS_FILE", "/nonexistent/l.json")]),
            Path::new(NOFILE),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("/nonexistent/l.json"), "{e}");
    }
}
