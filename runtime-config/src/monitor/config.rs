//! The monitor's settings: the `[monitor]` table of the vgpu config file (`/etc/vgpu/config.toml`, or the
//! file `VGPU_CONFIG` names), then the command line over it. Not here: the rest of the file (`vgpu_oci::config`).

use anyhow::{anyhow, bail, Context, Result};
use serde::Deserialize;
use std::path::Path;
use std::time::Duration;

/// Default listen address (HAMi's device plugin exports on 9394 too).
pub const DEFAULT_LISTEN: &str = "0.0.0.0:9394";

/// `[monitor]` keys; every one optional.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MonitorSection {
    pub listen: Option<String>,
    pub interval_seconds: Option<u64>,
    /// A quantity (`64Mi`, `64m`) or bytes.
    pub tolerance: Option<toml::Value>,
    pub kill: Option<bool>,
    pub nvml_library: Option<String>,
}

/// The monitor's effective settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub listen: String,
    /// Time between watchdog passes.
    pub interval: Duration,
    pub tolerance: u64,
    pub kill: bool,
    pub nvml_library: String,
}

/// Reads `[monitor]` of `path` (missing file or table: defaults). `must_exist` as for the vgpu config.
pub fn section(path: &Path, must_exist: bool) -> Result<MonitorSection> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !must_exist => {
            return Ok(MonitorSection::default())
        }
        Err(e) => return Err(e).with_context(|| format!("vgpu config {}", path.display())),
    };
    parse(&text).with_context(|| format!("vgpu config {}", path.display()))
}

/// The `[monitor]` table of a config text.
pub fn parse(text: &str) -> Result<MonitorSection> {
    #[derive(Deserialize)]
    struct File {
        #[serde(default)]
        monitor: MonitorSection,
    }
    let f: File = toml::from_str(text).map_err(|e| anyhow!("[monitor]: {}", e.message()))?;
    Ok(f.monitor)
}

/// `tolerance` as bytes: a quantity string or an integer.
pub fn tolerance_bytes(v: &toml::Value) -> Result<u64> {
    match v {
        toml::Value::Integer(i) if *i >= 0 => Ok(*i as u64),
        toml::Value::String(s) => {
            vgpu_ledger::parse_quantity(s).map_err(|e| anyhow!("[monitor] tolerance: {e}"))
        }
        other => bail!("[monitor] tolerance: expected a quantity like \"64Mi\", got {other}"),
    }
}

impl Settings {
    /// The section over the defaults; `nvml_library` defaults to the vgpu config's.
    pub fn from_section(s: &MonitorSection, default_nvml: &str) -> Result<Settings> {
        let interval = s.interval_seconds.unwrap_or(10);
        if interval == 0 {
            bail!("[monitor] interval_seconds must be at least 1");
        }
        Ok(Settings {
            listen: s.listen.clone().unwrap_or_else(|| DEFAULT_LISTEN.into()),
            interval: Duration::from_secs(interval),
            tolerance: match &s.tolerance {
                Some(v) => tolerance_bytes(v)?,
                None => 64 << 20,
            },
            kill: s.kill.unwrap_or(false),
            nvml_library: s
                .nvml_library
                .clone()
                .unwrap_or_else(|| default_nvml.to_string()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_section_and_errors() {
        let d = Settings::from_section(
            &parse("state_root = \"/x\"\n").unwrap(),
            "libnvidia-ml.so.1",
        )
        .unwrap();
        assert_eq!(d.listen, DEFAULT_LISTEN);
        assert_eq!(
            (d.interval.as_secs(), d.tolerance, d.kill),
            (10, 64 << 20, false)
        );
        let s = parse(
            "state_root = \"/x\"\n[monitor]\nlisten = \"127.0.0.1:1\"\ninterval_seconds = 2\ntolerance = \"1Gi\"\nkill = true\n",
        )
        .unwrap();
        let s = Settings::from_section(&s, "n").unwrap();
        assert_eq!(
            (s.listen.as_str(), s.interval.as_secs(), s.tolerance, s.kill),
            ("127.0.0.1:1", 2, 1 << 30, true)
        );
        assert_eq!(
            Settings::from_section(&parse("[monitor]\ntolerance = 5\n").unwrap(), "n")
                .unwrap()
                .tolerance,
            5
        );
        for bad in [
            "[monitor]\nkil = true\n",
            "[monitor]\ntolerance = \"5GB\"\n",
            "[monitor]\ninterval_seconds = 0\n",
        ] {
            let e = parse(bad).and_then(|s| Settings::from_section(&s, "n").map(|_| ()));
            let msg = format!("{:#}", e.unwrap_err());
            assert!(!msg.contains('\n'), "{msg}");
        }
    }
}
