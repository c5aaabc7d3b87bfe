//! The `[monitor.turns]` table of the vgpu config file, typed: the time-quanta arbiter of oversubscribed
//! GPUs (`vgpu_monitor::turns`): on or off, the quantum, the idle spell that ends a turn early, the grace
//! a holder has to drain, the tick, and `force` (turns whenever two containers want a GPU, whatever the
//! memory: a measurement knob). Not here: the rest of `[monitor]` (the parent module's `monitor`).

use serde::Deserialize;
use std::time::Duration;

/// Default time a container holds an oversubscribed GPU while others wait (libnvshare's).
pub const DEFAULT_QUANTUM: Duration = Duration::from_secs(30);
/// Default idle spell (no launch, no waiting thread) after which a holder hands the GPU on.
pub const DEFAULT_IDLE: Duration = Duration::from_secs(1);
/// Default time a holder told to yield has to drain its work.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(5);
/// Default time between the arbiter's passes (each one beats the heartbeat).
pub const DEFAULT_TICK: Duration = Duration::from_millis(50);

/// A `[monitor.turns]` key that is wrong. `Display` is one line naming the key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TurnsConfigError {
    /// An unknown key or a value of the wrong TOML type (the toml crate's words).
    #[error("[monitor.turns]: {message}")]
    Syntax { message: String },
    /// A number of seconds out of its range (`key`, the range, the value as written).
    #[error("[monitor.turns] {key} must be {min} to {max} seconds, got {got}")]
    Seconds {
        key: &'static str,
        min: f64,
        max: f64,
        got: String,
    },
    #[error("[monitor.turns] tick_ms must be 10 to 1000, got {ms}")]
    Tick { ms: u64 },
}

/// The `[monitor.turns]` keys, each `None` where the file does not set it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TurnsConfig {
    pub enabled: Option<bool>,
    pub quantum: Option<Duration>,
    pub idle: Option<Duration>,
    pub grace: Option<Duration>,
    pub tick: Option<Duration>,
    pub force: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    enabled: Option<bool>,
    quantum_seconds: Option<toml::Value>,
    idle_seconds: Option<toml::Value>,
    grace_seconds: Option<toml::Value>,
    tick_ms: Option<u64>,
    force: Option<bool>,
}

/// A number of seconds (integer or float) within `min..=max`.
fn seconds(
    key: &'static str,
    v: Option<toml::Value>,
    min: f64,
    max: f64,
) -> Result<Option<Duration>, TurnsConfigError> {
    let bad = |got: String| TurnsConfigError::Seconds { key, min, max, got };
    let s = match v {
        None => return Ok(None),
        Some(toml::Value::Integer(i)) => i as f64,
        Some(toml::Value::Float(f)) => f,
        Some(other) => return Err(bad(other.to_string())),
    };
    if !(min..=max).contains(&s) {
        return Err(bad(s.to_string()));
    }
    Ok(Some(Duration::from_secs_f64(s)))
}

/// `tick_ms` checked: 10 to 1000.
pub fn tick(ms: u64) -> Result<Duration, TurnsConfigError> {
    if !(10..=1000).contains(&ms) {
        return Err(TurnsConfigError::Tick { ms });
    }
    Ok(Duration::from_millis(ms))
}

impl TurnsConfig {
    /// The table's keys checked and typed; the error is one line naming the key.
    pub fn from_table(table: toml::Table) -> Result<TurnsConfig, TurnsConfigError> {
        let raw: Raw = table
            .try_into()
            .map_err(|e: toml::de::Error| TurnsConfigError::Syntax {
                message: e.message().to_string(),
            })?;
        Ok(TurnsConfig {
            enabled: raw.enabled,
            quantum: seconds("quantum_seconds", raw.quantum_seconds, 0.1, 3600.0)?,
            idle: seconds("idle_seconds", raw.idle_seconds, 0.05, 3600.0)?,
            grace: seconds("grace_seconds", raw.grace_seconds, 0.1, 600.0)?,
            tick: raw.tick_ms.map(tick).transpose()?,
            force: raw.force,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> Result<TurnsConfig, TurnsConfigError> {
        TurnsConfig::from_table(toml::from_str(text).unwrap())
    }

    #[test]
    fn keys_typed_and_bad_values_one_line_naming_the_key() {
        assert_eq!(table("").unwrap(), TurnsConfig::default());
        let t = table(
            "enabled = false\nquantum_seconds = 2\nidle_seconds = 0.5\ngrace_seconds = 1.5\ntick_ms = 20\nforce = true\n",
        )
        .unwrap();
        assert_eq!(
            t,
            TurnsConfig {
                enabled: Some(false),
                quantum: Some(Duration::from_secs(2)),
                idle: Some(Duration::from_millis(500)),
                grace: Some(Duration::from_millis(1500)),
                tick: Some(Duration::from_millis(20)),
                force: Some(true),
            }
        );
        for (bad, key) in [
            ("quantum = 3\n", "quantum"),
            ("quantum_seconds = 0\n", "quantum_seconds"),
            ("quantum_seconds = \"30s\"\n", "quantum_seconds"),
            ("idle_seconds = 0.01\n", "idle_seconds"),
            ("grace_seconds = 601\n", "grace_seconds"),
            ("tick_ms = 5\n", "tick_ms"),
            ("enabled = \"yes\"\n", "[monitor.turns]"),
        ] {
            let e = table(bad).unwrap_err().to_string();
            assert!(e.contains(key) && !e.contains('\n'), "{bad}: {e}");
        }
        assert!(matches!(
            table("tick_ms = 5\n"),
            Err(TurnsConfigError::Tick { ms: 5 })
        ));
        assert!(matches!(
            table("grace_seconds = -1\n"),
            Err(TurnsConfigError::Seconds {
                key: "grace_seconds",
                ..
            })
        ));
    }
}
