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

    /// The quota of a GPU. The limits file knows GPUs by UUID (a MIG instance gets its GPU's quota);
    /// a GPU it does not list is refused, never unlimited. The environment's `CUDA_DEVICE_MEMORY_LIMIT_<i>`
    /// is GPU `i` in NVML's order (HAMi-core's reading), so it follows the GPU whatever
    /// CUDA_VISIBLE_DEVICES does; each GPU or MIG instance has its own ledger `<prefix>.<uuid>`.
    pub fn lookup(&self, gpu: Gpu<'_>) -> Lookup {
        match self {
            Config::Unlimited => Lookup::NoLimit,
            Config::File { path, limits } => {
                let found = limits
                    .device_by_uuid(gpu.uuid)
                    .or_else(|| gpu.parent.and_then(|p| limits.device_by_uuid(p)));
                match found {
                    Some(d) => Lookup::Limit(DeviceSpec {
                        limit: d.memory_limit,
                        ledger: limits.ledger_path(path, d),
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
                })
            }
        }
    }

    /// Whether ledgers are the environment mode's (created on demand in a shared folder such as /tmp, so
    /// they must be this user's or root's: `quota`), rather than provisioned by the hook.
    pub fn env_mode(&self) -> bool {
        matches!(self, Config::Env { .. })
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

    fn gpu(uuid: &str, index: Option<u32>) -> Gpu<'_> {
        Gpu {
            uuid,
            parent: None,
            index,
        }
    }

    fn limit(c: &Config, g: Gpu<'_>) -> Option<u64> {
        match c.lookup(g) {
            Lookup::Limit(s) => Some(s.limit),
            _ => None,
        }
    }

    #[test]
    fn limits_file_refuses_unlisted_gpus_and_gives_mig_its_gpus_quota() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("limits.json");
        std::fs::write(
            &path,
            r#"{"version":1,"container_id":"c","devices":[{"index":0,"uuid":"GPU-a","memory_limit":4096,"ledger":"ledgers/GPU-a.ledger"}]}"#,
        )
        .unwrap();
        let env = env(&[("VGPU_LIMITS_FILE", path.to_str().unwrap())]);
        let c = Config::from_env(&env, Path::new(NOFILE)).unwrap();
        assert_eq!(limit(&c, gpu("GPU-a", Some(3))), Some(4096));
        let Lookup::Refuse(why) = c.lookup(gpu("GPU-b", Some(0))) else {
            panic!("an unlisted GPU must be refused")
        };
        assert!(
            why.contains("GPU-b") && why.contains("limits.json"),
            "{why}"
        );
        let mig = Gpu {
            uuid: "MIG-x",
            parent: Some("GPU-a"),
            index: Some(0),
        };
        let Lookup::Limit(s) = c.lookup(mig) else {
            panic!("a MIG instance gets its GPU's quota")
        };
        assert_eq!(s.ledger, dir.path().join("ledgers/GPU-a.ledger"));
        let orphan = Gpu {
            parent: Some("GPU-z"),
            ..mig
        };
        assert!(matches!(c.lookup(orphan), Lookup::Refuse(_)));
    }

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
        let Lookup::Limit(d0) = c.lookup(gpu("GPU-a", Some(0))) else {
            panic!()
        };
        assert_eq!(d0.limit, 1 << 30);
        assert_eq!(d0.ledger, PathBuf::from("/tmp/cudevshr.cache.GPU-a"));
        assert_eq!(limit(&c, gpu("GPU-b", Some(1))), Some(512 << 20));
        assert!(matches!(c.lookup(gpu("GPU-b", None)), Lookup::Refuse(m) if m.contains("index")));
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
        assert_eq!(c.lookup(gpu("GPU-a", Some(0))), Lookup::NoLimit);
        assert_eq!(limit(&c, gpu("GPU-b", Some(1))), Some(1 << 30));
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
        assert_eq!(c.lookup(gpu("GPU-a", Some(0))), Lookup::NoLimit);
        assert_eq!(limit(&c, gpu("GPU-b", Some(1))), Some(1 << 30));
    }

    #[test]
    fn shared_cache_prefix() {
        let c = Config::from_env(
            &env(&[
                ("CUDA_DEVICE_MEMORY_LIMIT", "268435456"),
                ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/x/q"),
            ]),
            Path::new(NOFILE),
        )
        .unwrap();
        assert_eq!(
            c.lookup(gpu("GPU-1", None)),
            Lookup::Limit(DeviceSpec {
                limit: 256 << 20,
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
