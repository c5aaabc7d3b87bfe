//! The `[monitor]` table of the vgpu config file, typed: `vgpuctl monitor`'s listen address, interval,
//! tolerance (a quantity, as bytes), kill policy, NVML library and node name (HAMi's `node` label). Not here: the rest of the file (the
//! parent module), the monitor's command line over it (`vgpu_monitor::config`).

use serde::Deserialize;
use std::time::Duration;
use vgpu_ledger::quantity::parse_quantity;

/// Default listen address (HAMi's device plugin exports on 9394 too).
pub const DEFAULT_LISTEN: &str = "0.0.0.0:9394";
/// Default time between watchdog passes.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);
/// Default bytes beyond a quota before the watchdog reports.
pub const DEFAULT_TOLERANCE: u64 = 64 << 20;

/// The `[monitor]` keys, each `None` where the file does not set it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MonitorConfig {
    pub listen: Option<String>,
    /// Time between watchdog passes (`interval_seconds`, at least 1).
    pub interval: Option<Duration>,
    /// Bytes (`tolerance`: a quantity like `64Mi`, or an integer of bytes).
    pub tolerance: Option<u64>,
    pub kill: Option<bool>,
    /// Default: the file's `nvml_library`.
    pub nvml_library: Option<String>,
    /// The node's name on the host GPUs' series (HAMi's `node` label); default: the host name.
    pub node: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    listen: Option<String>,
    interval_seconds: Option<u64>,
    tolerance: Option<toml::Value>,
    kill: Option<bool>,
    nvml_library: Option<String>,
    node: Option<String>,
}

/// `interval_seconds` checked: at least one second.
pub fn interval(seconds: u64) -> Result<Duration, String> {
    if seconds == 0 {
        return Err("[monitor] interval_seconds must be at least 1".into());
    }
    Ok(Duration::from_secs(seconds))
}

/// `tolerance` given as text (the table's string, or `vgpuctl monitor --tolerance`): a quantity.
pub fn tolerance(text: &str) -> Result<u64, String> {
    parse_quantity(text).map_err(|e| format!("[monitor] tolerance: {e}"))
}

impl MonitorConfig {
    /// The table's keys checked and typed; the error is one line naming the key.
    pub fn from_table(table: toml::Table) -> Result<MonitorConfig, String> {
        let raw: Raw = table
            .try_into()
            .map_err(|e: toml::de::Error| format!("[monitor]: {}", e.message()))?;
        let tolerance = match raw.tolerance {
            None => None,
            Some(toml::Value::Integer(i)) if i >= 0 => Some(i as u64),
            Some(toml::Value::String(s)) => Some(tolerance(&s)?),
            Some(other) => {
                return Err(format!(
                    "[monitor] tolerance: expected a quantity like \"64Mi\", got {other}"
                ))
            }
        };
        Ok(MonitorConfig {
            listen: raw.listen,
            interval: raw.interval_seconds.map(interval).transpose()?,
            tolerance,
            kill: raw.kill,
            nvml_library: raw.nvml_library,
            node: match raw.node {
                Some(n) if n.is_empty() || n.len() > 253 || n.chars().any(char::is_control) => {
                    return Err(format!(
                        "[monitor] node: expected a node name of 1 to 253 printable characters, got {n:?}"
                    ))
                }
                n => n,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> Result<MonitorConfig, String> {
        MonitorConfig::from_table(toml::from_str(text).unwrap())
    }

    #[test]
    fn keys_typed_and_bad_values_one_line_naming_the_key() {
        assert_eq!(table("").unwrap(), MonitorConfig::default());
        let m = table(
            "listen = \"127.0.0.1:1\"\ninterval_seconds = 2\ntolerance = \"1Gi\"\nkill = true\nnvml_library = \"/x.so\"\nnode = \"gpu-7\"\n",
        )
        .unwrap();
        assert_eq!(
            m,
            MonitorConfig {
                listen: Some("127.0.0.1:1".into()),
                interval: Some(Duration::from_secs(2)),
                tolerance: Some(1 << 30),
                kill: Some(true),
                nvml_library: Some("/x.so".into()),
                node: Some("gpu-7".into()),
            }
        );
        assert_eq!(table("tolerance = 5\n").unwrap().tolerance, Some(5));
        for (bad, names) in [
            ("kil = true\n", "kil"),
            ("tolerance = \"5GB\"\n", "tolerance"),
            ("tolerance = -1\n", "tolerance"),
            ("interval_seconds = 0\n", "interval_seconds"),
            ("kill = \"yes\"\n", "[monitor]"),
            ("node = \"\"\n", "node"),
            ("node = \"a\\nb\"\n", "node"),
        ] {
            let e = table(bad).unwrap_err();
            assert!(e.contains(names) && !e.contains('\n'), "{bad}: {e}");
        }
    }
}
