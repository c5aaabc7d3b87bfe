//! `/etc/vgpu/config.toml` (or the file named by `VGPU_CONFIG`), the whole file, parsed once into typed
//! values: paths, the hook stage, the log level ([`LogLevel`]), quantities as bytes, the node's policy for
//! containers without a quota ([`Unquoted`]) and the `[monitor]` table ([`MonitorConfig`]). Every reader
//! (the shim, the hook, vgpuctl and its monitor) gets its values from here; nobody parses a string of it
//! again. Not here: the paths inside a container or of the state folder (`vgpu_ledger::layout`), the
//! monitor's command line over its table (`vgpu_monitor::config`).
//!
//! A missing default file means all defaults; a file named by `VGPU_CONFIG` must exist. A key nobody knows
//! is an error naming it (a typo in `lower_runtime` must not silently drop NVIDIA's device injection), and
//! so is a bad value; each error is one line naming the file. The `[monitor]` table is parsed with the rest
//! but its errors are kept apart ([`Config::monitor`]): they stop `vgpuctl monitor`, never a container's
//! creation (the shim and the hook have no use for the table).

pub mod monitor;
pub mod turns;

pub use monitor::{
    HamiContainers, MonitorConfig, MonitorConfigError, ShareWall, DEFAULT_INTERVAL, DEFAULT_LISTEN,
    DEFAULT_SHARE_TOLERANCE, DEFAULT_SHARE_WINDOW, DEFAULT_TOLERANCE, DEFAULT_UNATTRIBUTED_SCANS,
    DEFAULT_UNATTRIBUTED_THRESHOLD,
};
pub use turns::{TurnsConfig, TurnsConfigError};

use crate::memory_limit::{self, LimitError};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use vgpu_ledger::quantity::{parse_quantity, QuantityError};

/// Default location of the configuration file.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/vgpu/config.toml";
/// Environment variable that names another configuration file.
pub const CONFIG_ENV: &str = "VGPU_CONFIG";

/// Why the configuration could not be used: one line, naming the file.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read (a missing default file is not an error: all defaults).
    #[error("vgpu config {}: {error}", path.display())]
    Read { path: PathBuf, error: String },
    /// Not TOML, an unknown key or a value of the wrong type; `at` is `:line:column` where known.
    #[error("vgpu config {}{at}: {message}", path.display())]
    Syntax {
        path: PathBuf,
        at: String,
        message: String,
    },
    /// A value of the right type that is not allowed (a relative path, a bad quantity).
    #[error("vgpu config {}: {problem}", path.display())]
    Invalid {
        path: PathBuf,
        problem: Box<InvalidValue>,
    },
    /// The `[monitor]` table (its key or value named in `err`).
    #[error("vgpu config {}: {err}", path.display())]
    Monitor {
        path: PathBuf,
        err: MonitorConfigError,
    },
}

/// A key of the right type whose value is not allowed. `Display` names the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidValue {
    #[error("{key} must be an absolute path, got {path:?}")]
    NotAbsolute { key: &'static str, path: PathBuf },
    #[error("log_max_files must be at least 1")]
    NoLogFiles,
    #[error("lower_runtime is empty")]
    NoLowerRuntime,
    #[error("admission_reserve {value:?}: {err}")]
    AdmissionReserve { value: String, err: QuantityError },
    #[error(transparent)]
    Limit(#[from] LimitError),
    #[error("log_level must be error, warn, info or debug, got {value:?}")]
    LogLevel { value: String },
}

/// The hook stage the shim installs for provisioning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum HookStage {
    /// OCI 1.0.2+ `createRuntime` (runc ≥ 1.0, crun ≥ 0.14).
    #[serde(rename = "createRuntime")]
    CreateRuntime,
    /// The older `prestart` stage (deprecated in the spec, still run by every runtime).
    #[serde(rename = "prestart")]
    Prestart,
}

impl HookStage {
    /// Name of the stage in the spec's `hooks` object and on the hook's command line.
    pub fn as_str(self) -> &'static str {
        match self {
            HookStage::CreateRuntime => "createRuntime",
            HookStage::Prestart => "prestart",
        }
    }
}

/// What the shim, the hook and vgpuctl log (`log_level`), least first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum LogLevel {
    #[default]
    Error,
    Warn,
    Info,
    Debug,
}

impl std::str::FromStr for LogLevel {
    type Err = InvalidValue;
    fn from_str(s: &str) -> Result<LogLevel, InvalidValue> {
        match s {
            "error" => Ok(LogLevel::Error),
            "warn" => Ok(LogLevel::Warn),
            "info" => Ok(LogLevel::Info),
            "debug" => Ok(LogLevel::Debug),
            _ => Err(InvalidValue::LogLevel { value: s.into() }),
        }
    }
}

/// When the log file starts a new file (`log_rotation`): never (the default: `log_file` is the file, for
/// logrotate to handle), or every hour or day, the file then named `<log_file>.<date>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogRotation {
    #[default]
    Never,
    Hourly,
    Daily,
}

/// What the node does with a container that gets a GPU but asks for no quota (`default_memory_limit`,
/// `require_memory_limit`). A container without a GPU is never touched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unquoted {
    /// Runs with the whole GPU (the default).
    Allow,
    /// Gets this quota on every GPU.
    Default(u64),
    /// Is refused.
    Refuse,
}

/// Every key of the configuration file, typed; see docs/oci.md for the operator's view.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Root of the per-container state on the host.
    pub state_root: PathBuf,
    /// Host path of the interposer mounted into containers.
    pub library: PathBuf,
    /// The runtime the shim execs: a name looked up in `PATH` or an absolute path.
    pub lower_runtime: String,
    /// Host path of `vgpu-hook`, written into the hooks the shim adds.
    pub hook_path: PathBuf,
    /// NVML library used to resolve GPUs to UUIDs and sizes (a name for the loader or a path).
    pub nvml_library: String,
    /// What the shim, the hook and vgpuctl log.
    pub log_level: LogLevel,
    /// Where they log (appended to); none: stderr.
    pub log_file: Option<PathBuf>,
    /// When the log file starts a new one.
    pub log_rotation: LogRotation,
    /// Rotated files kept (the oldest removed past it); none: all.
    pub log_max_files: Option<usize>,
    /// Stage the shim installs the provisioning hook at.
    pub hook_stage: HookStage,
    /// State that a shim provisioned but whose hook never ran (the lower runtime failed to create the
    /// container) is garbage after this many seconds.
    pub gc_pending_grace_seconds: u64,
    /// Quotas on one GPU may add up past its memory (admission); off by default.
    pub allow_overcommit: bool,
    /// Bytes of every GPU kept out of the quotas at admission (`admission_reserve`, a quantity).
    pub admission_reserve: u64,
    /// A quota for containers that get a GPU and ask for none, bytes (`default_memory_limit`).
    pub default_memory_limit: Option<u64>,
    /// Refuse containers that get a GPU and ask for no quota (when no default is set).
    pub require_memory_limit: bool,
    /// Also set each quota as the container cgroup's GPU memory limit in the driver, where it has one.
    pub driver_memory_limit: bool,
    /// The `[monitor]` table, or why it cannot be used (see the module's header).
    pub monitor: Result<MonitorConfig, ConfigError>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            state_root: PathBuf::from("/run/vgpu"),
            library: PathBuf::from("/usr/lib/vgpu/libvgpu.so"),
            lower_runtime: "runc".into(),
            hook_path: PathBuf::from("/usr/bin/vgpu-hook"),
            nvml_library: "libnvidia-ml.so.1".into(),
            log_level: LogLevel::Error,
            log_file: None,
            log_rotation: LogRotation::Never,
            log_max_files: None,
            hook_stage: HookStage::CreateRuntime,
            gc_pending_grace_seconds: 300,
            allow_overcommit: false,
            admission_reserve: 0,
            default_memory_limit: None,
            require_memory_limit: false,
            driver_memory_limit: false,
            monitor: Ok(MonitorConfig::default()),
        }
    }
}

/// The file as written: every key optional, strings where the typed value needs checking.
#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct Raw {
    state_root: Option<PathBuf>,
    library: Option<PathBuf>,
    lower_runtime: Option<String>,
    hook_path: Option<PathBuf>,
    nvml_library: Option<String>,
    log_level: Option<String>,
    log_file: Option<PathBuf>,
    log_rotation: Option<LogRotation>,
    log_max_files: Option<usize>,
    hook_stage: Option<HookStage>,
    gc_pending_grace_seconds: Option<u64>,
    allow_overcommit: Option<bool>,
    admission_reserve: Option<String>,
    default_memory_limit: Option<String>,
    require_memory_limit: Option<bool>,
    driver_memory_limit: Option<bool>,
    monitor: Option<toml::Table>,
}

impl Config {
    /// Loads the configuration named by `VGPU_CONFIG`, or the default file, or the defaults.
    pub fn load() -> Result<Config, ConfigError> {
        let (path, must_exist) = Self::path();
        Config::load_from(&path, must_exist)
    }

    /// The configuration file: the one `VGPU_CONFIG` names (which must exist), or the default.
    pub fn path() -> (PathBuf, bool) {
        match std::env::var_os(CONFIG_ENV) {
            Some(p) if !p.is_empty() => (PathBuf::from(p), true),
            _ => (PathBuf::from(DEFAULT_CONFIG_PATH), false),
        }
    }

    /// The lower runtime when the configuration cannot be loaded, for the verbs the shim only passes
    /// through (a container's `list`, `kill` or `delete` must not depend on vgpu's config): the file's
    /// `lower_runtime` when it still says one, else `runc`.
    pub fn lower_runtime_despite_errors() -> String {
        Self::lower_runtime_of(&Self::path().0)
    }

    /// `lower_runtime` of the file at `path` if the file parses as TOML and has it as a non-empty string
    /// (whatever else is wrong in it), else `runc`.
    pub fn lower_runtime_of(path: &Path) -> String {
        std::fs::read_to_string(path)
            .ok()
            .and_then(|t| toml::from_str::<toml::Table>(&t).ok())
            .and_then(|t| {
                t.get("lower_runtime")
                    .and_then(|v| v.as_str())
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
            })
            .unwrap_or_else(|| Config::default().lower_runtime)
    }

    /// Loads `path`; when `must_exist` is false a missing file gives the defaults.
    pub fn load_from(path: &Path, must_exist: bool) -> Result<Config, ConfigError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !must_exist => {
                return Ok(Config::default())
            }
            Err(e) => {
                return Err(ConfigError::Read {
                    path: path.into(),
                    error: e.to_string(),
                })
            }
        };
        Config::parse(&text, path)
    }

    /// The configuration in `text`, read from `path` (named in errors).
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let raw: Raw = toml::from_str(text).map_err(|e| {
            // `path:line:column: message`, one line (the toml crate's own text spans several).
            let at = e.span().map_or(String::new(), |sp| {
                let before = &text[..sp.start.min(text.len())];
                let line = before.matches('\n').count() + 1;
                let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
                format!(":{line}:{col}")
            });
            ConfigError::Syntax {
                path: path.into(),
                at,
                message: e.message().split_whitespace().collect::<Vec<_>>().join(" "),
            }
        })?;
        let invalid = |problem: InvalidValue| ConfigError::Invalid {
            path: path.into(),
            problem: Box::new(problem),
        };
        let d = Config::default();
        let absolute = |key: &'static str, p: Option<PathBuf>, default: PathBuf| match p {
            Some(path) if !path.is_absolute() => {
                Err(invalid(InvalidValue::NotAbsolute { key, path }))
            }
            p => Ok(p.unwrap_or(default)),
        };
        let state_root = absolute("state_root", raw.state_root, d.state_root)?;
        let library = absolute("library", raw.library, d.library)?;
        let hook_path = absolute("hook_path", raw.hook_path, d.hook_path)?;
        if let Some(f) = raw.log_file.as_ref().filter(|f| !f.is_absolute()) {
            return Err(invalid(InvalidValue::NotAbsolute {
                key: "log_file",
                path: f.clone(),
            }));
        }
        if raw.log_max_files == Some(0) {
            return Err(invalid(InvalidValue::NoLogFiles));
        }
        let lower_runtime = raw.lower_runtime.unwrap_or(d.lower_runtime);
        if lower_runtime.is_empty() {
            return Err(invalid(InvalidValue::NoLowerRuntime));
        }
        let admission_reserve = match raw.admission_reserve.as_deref() {
            None => 0,
            Some(r) if r.trim() == "0" => 0,
            Some(r) => parse_quantity(r).map_err(|err| {
                invalid(InvalidValue::AdmissionReserve {
                    value: r.into(),
                    err,
                })
            })?,
        };
        let default_memory_limit = match raw.default_memory_limit.as_deref() {
            Some(l) if !l.trim().is_empty() => Some(
                memory_limit::parse(l, "default_memory_limit").map_err(|e| invalid(e.into()))?,
            ),
            _ => None,
        };
        let log_level = match raw.log_level.as_deref() {
            Some(l) => l.parse().map_err(invalid)?,
            None => d.log_level,
        };
        let monitor = MonitorConfig::from_table(raw.monitor.unwrap_or_default()).map_err(|err| {
            ConfigError::Monitor {
                path: path.into(),
                err,
            }
        });
        Ok(Config {
            state_root,
            library,
            lower_runtime,
            hook_path,
            nvml_library: raw.nvml_library.unwrap_or(d.nvml_library),
            log_level,
            log_file: raw.log_file,
            log_rotation: raw.log_rotation.unwrap_or_default(),
            log_max_files: raw.log_max_files,
            hook_stage: raw.hook_stage.unwrap_or(d.hook_stage),
            gc_pending_grace_seconds: raw
                .gc_pending_grace_seconds
                .unwrap_or(d.gc_pending_grace_seconds),
            allow_overcommit: raw.allow_overcommit.unwrap_or(d.allow_overcommit),
            admission_reserve,
            default_memory_limit,
            require_memory_limit: raw.require_memory_limit.unwrap_or(d.require_memory_limit),
            driver_memory_limit: raw.driver_memory_limit.unwrap_or(d.driver_memory_limit),
            monitor,
        })
    }

    /// `admission_reserve` in bytes.
    pub fn admission_reserve_bytes(&self) -> u64 {
        self.admission_reserve
    }

    /// The node's policy for GPU containers that ask for no quota.
    pub fn unquoted(&self) -> Unquoted {
        match self.default_memory_limit {
            Some(bytes) => Unquoted::Default(bytes),
            None if self.require_memory_limit => Unquoted::Refuse,
            None => Unquoted::Allow,
        }
    }

    /// The `[monitor]` table, or the one-line error that makes it unusable.
    pub fn monitor(&self) -> Result<&MonitorConfig, ConfigError> {
        self.monitor.as_ref().map_err(Clone::clone)
    }

    /// The explicit env of every hook vgpu installs (the shim's spec edit, hooks.d's, the CDI specs):
    /// nothing from the container (an image's `LD_PRELOAD` must never reach a process with host
    /// privileges), the fixed `PATH` and the configuration file when it is not the default.
    pub fn hook_env() -> Vec<String> {
        let mut env = vec![crate::keys::host::HOOK_PATH_ENV.to_string()];
        env.extend(Config::env_for_hooks());
        env
    }

    /// The configuration file to hand to hooks through their explicit env (only when it is not the default).
    pub fn env_for_hooks() -> Option<String> {
        let p = std::env::var_os(CONFIG_ENV).filter(|p| !p.is_empty())?;
        let p = PathBuf::from(p);
        let abs = if p.is_absolute() {
            p
        } else {
            std::env::current_dir().ok()?.join(p)
        };
        Some(format!("{}={}", CONFIG_ENV, abs.display()))
    }
}

#[cfg(test)]
mod tests;
