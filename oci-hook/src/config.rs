//! `/etc/vgpu/config.toml` (or the file named by `VGPU_CONFIG`): where things are on the host.
//! Not here: the paths inside a container or of the state folder (`vgpu_ledger::layout`).
//!
//! A missing default file means all defaults; a file named by `VGPU_CONFIG` must exist.
//! A key nobody knows is an error naming it (a typo in `lower_runtime` must not silently drop NVIDIA's
//! device injection); the `[monitor]` table belongs to `vgpuctl monitor`, which checks it itself.

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// Default location of the configuration file.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/vgpu/config.toml";
/// Environment variable that names another configuration file.
pub const CONFIG_ENV: &str = "VGPU_CONFIG";

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

/// Every key of the configuration file; see docs/oci.md for the operator's view.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
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
    /// `error` (default), `warn`, `info` or `debug`: what the shim, the hook and vgpuctl log.
    pub log_level: String,
    /// Where they log (appended to); none: stderr (`crate::logging`).
    pub log_file: Option<PathBuf>,
    /// Stage the shim installs the provisioning hook at.
    pub hook_stage: HookStage,
    /// State that a shim provisioned but whose hook never ran (the lower runtime failed to create the
    /// container) is garbage after this many seconds.
    pub gc_pending_grace_seconds: u64,
    /// Quotas on one GPU may add up past its memory (`crate::admission`); off by default.
    pub allow_overcommit: bool,
    /// Memory of every GPU kept out of the quotas at admission: a quantity (`512Mi`, `1G`, bytes).
    pub admission_reserve: String,
    /// A quota for containers that get a GPU and ask for none (a quantity; empty: none).
    pub default_memory_limit: String,
    /// Refuse containers that get a GPU and ask for no quota (when no default is set).
    pub require_memory_limit: bool,
    /// Also set each quota as the container cgroup's GPU memory limit in the driver, where it has one
    /// (`crate::driverlimit`).
    pub driver_memory_limit: bool,
    /// `vgpuctl monitor`'s table, read and checked by it (`vgpuctl::monitor::config`); kept here only so
    /// that it is a known key.
    #[doc(hidden)]
    pub monitor: Option<toml::Table>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            state_root: PathBuf::from("/run/vgpu"),
            library: PathBuf::from("/usr/lib/vgpu/libvgpu.so"),
            lower_runtime: "runc".into(),
            hook_path: PathBuf::from("/usr/bin/vgpu-hook"),
            nvml_library: "libnvidia-ml.so.1".into(),
            log_level: "error".into(),
            log_file: None,
            hook_stage: HookStage::CreateRuntime,
            gc_pending_grace_seconds: 300,
            allow_overcommit: false,
            admission_reserve: "0".into(),
            default_memory_limit: String::new(),
            require_memory_limit: false,
            driver_memory_limit: false,
            monitor: None,
        }
    }
}

impl Config {
    /// Loads the configuration named by `VGPU_CONFIG`, or the default file, or the defaults.
    pub fn load() -> Result<Config> {
        let (path, must_exist) = Self::path();
        Config::load_from(&path, must_exist)
    }

    /// The configuration file: the one `VGPU_CONFIG` names (which must exist), or the default.
    fn path() -> (PathBuf, bool) {
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
    pub fn load_from(path: &Path, must_exist: bool) -> Result<Config> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !must_exist => {
                return Ok(Config::default())
            }
            Err(e) => return Err(e).with_context(|| format!("vgpu config {}", path.display())),
        };
        let cfg: Config = toml::from_str(&text).map_err(|e| {
            // `path:line:column: message`, one line (the toml crate's own text spans several).
            let at = e.span().map_or(String::new(), |sp| {
                let before = &text[..sp.start.min(text.len())];
                let line = before.matches('\n').count() + 1;
                let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
                format!(":{line}:{col}")
            });
            let msg = e.message().split_whitespace().collect::<Vec<_>>().join(" ");
            anyhow::anyhow!("vgpu config {}{at}: {msg}", path.display())
        })?;
        cfg.validate()
            .with_context(|| format!("vgpu config {}", path.display()))?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<()> {
        if !self.state_root.is_absolute() {
            bail!(
                "state_root must be an absolute path, got {:?}",
                self.state_root
            );
        }
        if !self.library.is_absolute() {
            bail!("library must be an absolute path, got {:?}", self.library);
        }
        if !self.hook_path.is_absolute() {
            bail!(
                "hook_path must be an absolute path, got {:?}",
                self.hook_path
            );
        }
        if let Some(f) = self.log_file.as_ref().filter(|f| !f.is_absolute()) {
            bail!("log_file must be an absolute path, got {f:?}");
        }
        if self.lower_runtime.is_empty() {
            bail!("lower_runtime is empty");
        }
        if self.admission_reserve.trim() != "0" {
            vgpu_ledger::quantity::parse_quantity(&self.admission_reserve).map_err(|e| {
                anyhow::anyhow!("admission_reserve {:?}: {e}", self.admission_reserve)
            })?;
        }
        if !self.default_memory_limit.trim().is_empty() {
            crate::memory_request::parse_limit(&self.default_memory_limit, "default_memory_limit")?;
        }
        if !matches!(self.log_level.as_str(), "error" | "warn" | "info" | "debug") {
            bail!(
                "log_level must be error, warn, info or debug, got {:?}",
                self.log_level
            );
        }
        Ok(())
    }

    /// `admission_reserve` in bytes (checked when the file was loaded).
    pub fn admission_reserve_bytes(&self) -> u64 {
        match self.admission_reserve.trim() {
            "0" => 0,
            r => vgpu_ledger::quantity::parse_quantity(r).unwrap_or(0),
        }
    }

    /// The node's policy for GPU containers that ask for no quota.
    pub fn unquoted(&self) -> crate::plan::Unquoted {
        use crate::plan::Unquoted;
        match self.default_memory_limit.trim() {
            "" if self.require_memory_limit => Unquoted::Refuse,
            "" => Unquoted::Allow,
            d => crate::memory_request::parse_limit(d, "default_memory_limit")
                .map_or(Unquoted::Refuse, Unquoted::Default),
        }
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
mod tests {
    use super::*;

    #[test]
    fn missing_default_file_gives_defaults() {
        let c = Config::load_from(Path::new("/nonexistent/vgpu.toml"), false).unwrap();
        assert_eq!(c.state_root, PathBuf::from("/run/vgpu"));
        assert_eq!(c.lower_runtime, "runc");
        assert_eq!(c.hook_stage, HookStage::CreateRuntime);
    }

    #[test]
    fn missing_named_file_is_an_error() {
        let e = Config::load_from(Path::new("/nonexistent/vgpu.toml"), true).unwrap_err();
        assert!(format!("{e:#}").contains("/nonexistent/vgpu.toml"));
    }

    /// A typo is an error naming the key, where it is and the keys there are; the shim then refuses to
    /// create containers instead of running them without NVIDIA's runtime underneath.
    #[test]
    fn an_unknown_key_is_an_error_with_its_line() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("c.toml");
        std::fs::write(
            &p,
            "state_root = \"/tmp/x\"\n# NVIDIA's runtime underneath\nlower_runtim = \"nvidia-container-runtime\"\n",
        )
        .unwrap();
        let e = format!("{:#}", Config::load_from(&p, true).unwrap_err());
        assert!(
            e.starts_with(&format!(
                "vgpu config {}:3:1: unknown field `lower_runtim`",
                p.display()
            )),
            "{e}"
        );
        assert!(
            e.contains("`lower_runtime`"),
            "the known keys are listed: {e}"
        );
        assert!(!e.contains('\n'), "one line: {e}");
        // A syntax error carries its line too.
        std::fs::write(&p, "state_root = \"/tmp/x\"\nlog_level = \n").unwrap();
        let e = format!("{:#}", Config::load_from(&p, true).unwrap_err());
        assert!(
            e.starts_with(&format!("vgpu config {}:2:", p.display())),
            "{e}"
        );
    }

    #[test]
    fn keys_are_read_and_the_monitor_table_allowed() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("c.toml");
        std::fs::write(
            &p,
            "# comment\nstate_root = \"/tmp/x\"\nlower_runtime = \"crun\"\nhook_stage = \"prestart\"\n[monitor]\nlisten = \"0.0.0.0:9394\"\n",
        )
        .unwrap();
        let c = Config::load_from(&p, true).unwrap();
        assert_eq!(c.state_root, PathBuf::from("/tmp/x"));
        assert_eq!(c.lower_runtime, "crun");
        assert_eq!(c.hook_stage, HookStage::Prestart);
        assert_eq!(c.library, PathBuf::from("/usr/lib/vgpu/libvgpu.so"));
    }

    #[test]
    fn the_lower_runtime_is_found_in_a_broken_file_or_is_runc() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("c.toml");
        std::fs::write(&p, "lower_runtime = \"crun\"\nlog_level = \"loud\"\n").unwrap();
        assert!(Config::load_from(&p, true).is_err());
        assert_eq!(Config::lower_runtime_of(&p), "crun");
        for broken in [
            "state_root = [",
            "lower_runtime = 5\n",
            "lower_runtime = \"\"\n",
        ] {
            std::fs::write(&p, broken).unwrap();
            assert_eq!(Config::lower_runtime_of(&p), "runc", "{broken}");
        }
        assert_eq!(Config::lower_runtime_of(&d.path().join("missing")), "runc");
    }

    #[test]
    fn bad_values_name_the_file_and_key() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("c.toml");
        std::fs::write(&p, "state_root = \"relative\"\n").unwrap();
        let e = format!("{:#}", Config::load_from(&p, true).unwrap_err());
        assert!(e.contains("state_root") && e.contains("c.toml"), "{e}");
        std::fs::write(&p, "state_root = 5\n").unwrap();
        let e = format!("{:#}", Config::load_from(&p, true).unwrap_err());
        assert!(e.contains("c.toml"), "{e}");
        assert!(!e.contains('\n'), "one line: {e}");
    }
}
