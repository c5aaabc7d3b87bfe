//! The `[monitor]` table of the vgpu config file, typed: `vgpuctl monitor`'s listen address, interval,
//! tolerance (a quantity, as bytes), kill policy, NVML library, node name (HAMi's `node` label), its
//! compute share wall (mode, window, tolerance in points), when memory no process's figure shows is
//! logged (threshold and scans), and where HAMi's per-container folders are looked for
//! (`hami_containers_dir`, also read by `vgpuctl status`); its `turns` sub-table is `turns`'s. Not here: the rest of the file (the
//! parent module), the monitor's command line over it (`vgpu_monitor::config`).

use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;
use vgpu_ledger::quantity::parse_quantity;
use vgpu_ledger::QuantityError;

/// Default listen address (HAMi's device plugin exports on 9394 too): the node's loopback only. The
/// scrape names every tenant's pods and usage; a bare node that wants a remote Prometheus to scrape it says
/// so (`listen = "0.0.0.0:9394"`), and the Helm chart fronts it with kube-rbac-proxy.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9394";
/// Default time between watchdog passes.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);
/// Default bytes beyond a quota before the watchdog reports.
pub const DEFAULT_TOLERANCE: u64 = 64 << 20;

/// Default bytes of a GPU's used memory that no process's NVML figure shows before the monitor logs it.
pub const DEFAULT_UNATTRIBUTED_THRESHOLD: u64 = 256 << 20;
/// Default consecutive collections the remainder must stay past the threshold before it is logged.
pub const DEFAULT_UNATTRIBUTED_SCANS: u32 = 3;
/// The most collections `unattributed_scans` may ask for.
pub const MAX_UNATTRIBUTED_SCANS: u32 = 1000;

/// Default window over which the share wall compares a container's GPU time with its share.
pub const DEFAULT_SHARE_WINDOW: Duration = Duration::from_secs(10);
/// Default points of the GPU's time a container may run past its share over the window.
pub const DEFAULT_SHARE_TOLERANCE: f64 = 5.0;
/// The longest share window (the monitor keeps a sample per interval over it).
pub const MAX_SHARE_WINDOW_SECONDS: u64 = 3600;

/// Where the monitor and `vgpuctl status` look for HAMi's per-container folders (`hami_containers_dir`;
/// `vgpu_host::hami`): containers HAMi's device plugin started with vgpu's library, reported from their
/// ledgers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum HamiContainers {
    /// Unset: HAMi's default folder (`hami::DEFAULT_CONTAINERS_DIR`, `/usr/local/vgpu/containers`) whenever
    /// it exists; a node without HAMi's device plugin has none, and nothing is said.
    #[default]
    Auto,
    /// `false`: not looked for.
    Off,
    /// A folder of HAMi's (`<global.gpuHookPath>/vgpu/containers` for a chart with another hook path):
    /// looked at every time; while it is missing, the monitor says so once.
    Dir(PathBuf),
}

impl HamiContainers {
    /// The folder to look at: the one set, HAMi's default one (`Auto`), none when off.
    pub fn dir(&self) -> Option<&Path> {
        match self {
            HamiContainers::Auto => Some(Path::new(crate::hami::DEFAULT_CONTAINERS_DIR)),
            HamiContainers::Off => None,
            HamiContainers::Dir(d) => Some(d),
        }
    }

    /// The folder to look at, `auto` when unset (a setting of another folder than HAMi's containers one:
    /// `hami_task_dir`).
    pub fn dir_or<'a>(&'a self, auto: &'a Path) -> Option<&'a Path> {
        match self {
            HamiContainers::Auto => Some(auto),
            HamiContainers::Off => None,
            HamiContainers::Dir(d) => Some(d),
        }
    }

    /// Whether the folder was set (a missing one is then worth a line).
    pub fn is_set(&self) -> bool {
        matches!(self, HamiContainers::Dir(_))
    }
}

/// `hami_containers_dir` checked: `false`, or an absolute path of printable characters (at most 4096
/// bytes); `got` in the error as TOML writes it.
pub fn hami_containers_dir(value: &toml::Value) -> Result<HamiContainers> {
    folder_setting(value, |got| MonitorConfigError::HamiContainersDir { got })
}

/// `hami_task_dir` checked as `hami_containers_dir` is.
pub fn hami_task_dir(value: &toml::Value) -> Result<HamiContainers> {
    folder_setting(value, |got| MonitorConfigError::HamiTaskDir { got })
}

fn folder_setting(
    value: &toml::Value,
    err: impl Fn(String) -> MonitorConfigError,
) -> Result<HamiContainers> {
    match value {
        toml::Value::Boolean(false) => Ok(HamiContainers::Off),
        toml::Value::String(p)
            if p.starts_with('/') && p.len() <= 4096 && !p.chars().any(char::is_control) =>
        {
            Ok(HamiContainers::Dir(PathBuf::from(p)))
        }
        // On one line whatever it holds (TOML writes a string with a newline over several).
        toml::Value::String(p) => Err(err(format!("{p:?}"))),
        other => Err(err(other.to_string().replace('\n', "\\n"))),
    }
}

/// What the compute share wall does with a container that ran past its share + tolerance.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ShareWall {
    /// Nothing: no measurement, no finding.
    Off,
    /// A finding (log line, metrics); the container is left alone.
    Report,
    /// The finding, and its cgroup frozen for the time it ran over (the default).
    #[default]
    Freeze,
}

impl ShareWall {
    /// The word of the table and the command line.
    pub fn name(self) -> &'static str {
        match self {
            ShareWall::Off => "off",
            ShareWall::Report => "report",
            ShareWall::Freeze => "freeze",
        }
    }
}

/// A `[monitor]` key (of the table or the monitor's command line) that is wrong. `Display` is one line
/// naming the key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MonitorConfigError {
    /// An unknown key or a value of the wrong TOML type (the toml crate's words).
    #[error("[monitor]: {message}")]
    Syntax { message: String },
    #[error("[monitor] share_wall: {value:?} is not one of \"freeze\", \"report\", \"off\"")]
    ShareWall { value: String },
    #[error(
        "[monitor] share_window_seconds must be 1 to {MAX_SHARE_WINDOW_SECONDS}, got {seconds}"
    )]
    ShareWindow { seconds: u64 },
    #[error("[monitor] share_tolerance must be 0 to 100 points of the GPU's time, got {points}")]
    ShareTolerance { points: f64 },
    /// `share_tolerance` that is no number (`got`: the value as TOML writes it).
    #[error("[monitor] share_tolerance: expected points of the GPU's time like 5, got {got}")]
    ShareToleranceType { got: String },
    #[error("[monitor] interval_seconds must be at least 1")]
    Interval,
    #[error("[monitor] tolerance: {0}")]
    Tolerance(QuantityError),
    /// `tolerance` that is neither a quantity nor a byte count (`got`: as TOML writes it).
    #[error("[monitor] tolerance: expected a quantity like \"64Mi\", got {got}")]
    ToleranceType { got: String },
    #[error("[monitor] unattributed_threshold: {0}")]
    UnattributedThreshold(QuantityError),
    /// `unattributed_threshold` that is neither a quantity nor a byte count (`got`: as TOML writes it).
    #[error("[monitor] unattributed_threshold: expected a quantity like \"256Mi\", got {got}")]
    UnattributedThresholdType { got: String },
    #[error(
        "[monitor] unattributed_scans must be 1 to {MAX_UNATTRIBUTED_SCANS} collections, got {scans}"
    )]
    UnattributedScans { scans: u64 },
    #[error("[monitor] node: expected a node name of 1 to 253 printable characters, got {node:?}")]
    Node { node: String },
    /// `hami_containers_dir` that is neither `false` nor an absolute path (`got`: as TOML writes it).
    #[error(
        "[monitor] hami_containers_dir: expected an absolute path like \"/usr/local/vgpu/containers\" or false, got {got}"
    )]
    HamiContainersDir { got: String },
    /// `hami_task_dir` that is neither `false` nor an absolute path (`got`: as TOML writes it).
    #[error(
        "[monitor] hami_task_dir: expected an absolute path like \"/run/containerd/io.containerd.runtime.v2.task\" or false, got {got}"
    )]
    HamiTaskDir { got: String },
    /// The `[monitor.turns]` table (the time-quanta arbiter).
    #[error(transparent)]
    Turns(#[from] super::turns::TurnsConfigError),
}

type Result<T, E = MonitorConfigError> = std::result::Result<T, E>;

/// `share_wall` (the table's string, or `vgpuctl monitor --share-wall`) checked.
pub fn share_wall(text: &str) -> Result<ShareWall> {
    [ShareWall::Off, ShareWall::Report, ShareWall::Freeze]
        .into_iter()
        .find(|m| m.name() == text)
        .ok_or_else(|| MonitorConfigError::ShareWall { value: text.into() })
}

/// `unattributed_threshold` given as text (the table's string, or `vgpuctl monitor
/// --unattributed-threshold`): a quantity.
pub fn unattributed_threshold(text: &str) -> Result<u64> {
    parse_quantity(text).map_err(MonitorConfigError::UnattributedThreshold)
}

/// `unattributed_scans` checked: 1 to `MAX_UNATTRIBUTED_SCANS` collections.
pub fn unattributed_scans(scans: u64) -> Result<u32> {
    match u32::try_from(scans) {
        Ok(n) if (1..=MAX_UNATTRIBUTED_SCANS).contains(&n) => Ok(n),
        _ => Err(MonitorConfigError::UnattributedScans { scans }),
    }
}

/// `share_window_seconds` checked: 1 to `MAX_SHARE_WINDOW_SECONDS`.
pub fn share_window(seconds: u64) -> Result<Duration> {
    if !(1..=MAX_SHARE_WINDOW_SECONDS).contains(&seconds) {
        return Err(MonitorConfigError::ShareWindow { seconds });
    }
    Ok(Duration::from_secs(seconds))
}

/// `share_tolerance` checked: points of the GPU's time, 0 to 100.
pub fn share_tolerance(points: f64) -> Result<f64> {
    if !(0.0..=100.0).contains(&points) {
        return Err(MonitorConfigError::ShareTolerance { points });
    }
    Ok(points)
}

/// The `[monitor]` keys, each `None` where the file does not set it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MonitorConfig {
    pub listen: Option<String>,
    /// Time between watchdog passes (`interval_seconds`, at least 1).
    pub interval: Option<Duration>,
    /// Bytes (`tolerance`: a quantity like `64Mi`, or an integer of bytes).
    pub tolerance: Option<u64>,
    pub kill: Option<bool>,
    /// Default: the file's `nvml_library`.
    pub nvml_library: Option<String>,
    /// The compute share wall's action (`share_wall`).
    pub share_wall: Option<ShareWall>,
    /// Its window (`share_window_seconds`).
    pub share_window: Option<Duration>,
    /// Its tolerance, points of the GPU's time (`share_tolerance`).
    pub share_tolerance: Option<f64>,
    /// The node's name on the host GPUs' series (HAMi's `node` label); default: `NODE_NAME`, else the host name.
    pub node: Option<String>,
    /// Bytes of a GPU's used memory no process's figure shows before it is logged
    /// (`unattributed_threshold`: a quantity like `256Mi`, or an integer of bytes).
    pub unattributed_threshold: Option<u64>,
    /// Consecutive collections it must last first (`unattributed_scans`).
    pub unattributed_scans: Option<u32>,
    /// Where HAMi's per-container folders are looked for (`hami_containers_dir`; unset: `Auto`).
    pub hami_containers_dir: HamiContainers,
    /// Where the bundles of HAMi's containers are looked for (`hami_task_dir`, containerd's runc shim's
    /// task folder; unset: `Auto`, `hami::bundle::DEFAULT_TASK_DIR`).
    pub hami_task_dir: HamiContainers,
    /// The time-quanta arbiter (`[monitor.turns]`).
    pub turns: super::turns::TurnsConfig,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    listen: Option<String>,
    interval_seconds: Option<u64>,
    tolerance: Option<toml::Value>,
    kill: Option<bool>,
    nvml_library: Option<String>,
    share_wall: Option<String>,
    share_window_seconds: Option<u64>,
    share_tolerance: Option<toml::Value>,
    node: Option<String>,
    unattributed_threshold: Option<toml::Value>,
    unattributed_scans: Option<u64>,
    hami_containers_dir: Option<toml::Value>,
    hami_task_dir: Option<toml::Value>,
    turns: Option<toml::Table>,
}

/// `interval_seconds` checked: at least one second.
pub fn interval(seconds: u64) -> Result<Duration> {
    if seconds == 0 {
        return Err(MonitorConfigError::Interval);
    }
    Ok(Duration::from_secs(seconds))
}

/// `tolerance` given as text (the table's string, or `vgpuctl monitor --tolerance`): a quantity.
pub fn tolerance(text: &str) -> Result<u64> {
    parse_quantity(text).map_err(MonitorConfigError::Tolerance)
}

impl MonitorConfig {
    /// The table's keys checked and typed; the error is one line naming the key.
    pub fn from_table(table: toml::Table) -> Result<MonitorConfig> {
        let raw: Raw =
            table
                .try_into()
                .map_err(|e: toml::de::Error| MonitorConfigError::Syntax {
                    message: e.message().to_string(),
                })?;
        let tolerance = match raw.tolerance {
            None => None,
            Some(toml::Value::Integer(i)) if i >= 0 => Some(i as u64),
            Some(toml::Value::String(s)) => Some(tolerance(&s)?),
            Some(other) => {
                return Err(MonitorConfigError::ToleranceType {
                    got: other.to_string(),
                })
            }
        };
        let threshold = match raw.unattributed_threshold {
            None => None,
            Some(toml::Value::Integer(i)) if i >= 0 => Some(i as u64),
            Some(toml::Value::String(s)) => Some(unattributed_threshold(&s)?),
            Some(other) => {
                return Err(MonitorConfigError::UnattributedThresholdType {
                    got: other.to_string(),
                })
            }
        };
        let share_tolerance = match raw.share_tolerance {
            None => None,
            Some(toml::Value::Integer(i)) => Some(share_tolerance(i as f64)?),
            Some(toml::Value::Float(f)) => Some(share_tolerance(f)?),
            Some(other) => {
                return Err(MonitorConfigError::ShareToleranceType {
                    got: other.to_string(),
                })
            }
        };
        Ok(MonitorConfig {
            listen: raw.listen,
            interval: raw.interval_seconds.map(interval).transpose()?,
            tolerance,
            kill: raw.kill,
            nvml_library: raw.nvml_library,
            share_wall: raw.share_wall.as_deref().map(share_wall).transpose()?,
            share_window: raw.share_window_seconds.map(share_window).transpose()?,
            share_tolerance,
            unattributed_threshold: threshold,
            unattributed_scans: raw.unattributed_scans.map(unattributed_scans).transpose()?,
            hami_containers_dir: match &raw.hami_containers_dir {
                None => HamiContainers::Auto,
                Some(v) => hami_containers_dir(v)?,
            },
            hami_task_dir: match &raw.hami_task_dir {
                None => HamiContainers::Auto,
                Some(v) => hami_task_dir(v)?,
            },
            turns: super::turns::TurnsConfig::from_table(raw.turns.unwrap_or_default())?,
            node: match raw.node {
                Some(n) if n.is_empty() || n.len() > 253 || n.chars().any(char::is_control) => {
                    return Err(MonitorConfigError::Node { node: n })
                }
                n => n,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> Result<MonitorConfig> {
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
                ..Default::default()
            }
        );
        let m =
            table("share_wall = \"report\"\nshare_window_seconds = 30\nshare_tolerance = 2.5\n")
                .unwrap();
        assert_eq!(
            (m.share_wall, m.share_window, m.share_tolerance),
            (
                Some(ShareWall::Report),
                Some(Duration::from_secs(30)),
                Some(2.5)
            )
        );
        assert_eq!(
            table("share_tolerance = 0\n").unwrap().share_tolerance,
            Some(0.0)
        );
        assert_eq!(table("tolerance = 5\n").unwrap().tolerance, Some(5));
        let m = table("unattributed_threshold = \"512Mi\"\nunattributed_scans = 5\n").unwrap();
        assert_eq!(
            (m.unattributed_threshold, m.unattributed_scans),
            (Some(512 << 20), Some(5))
        );
        assert_eq!(
            table("unattributed_threshold = 0\n")
                .unwrap()
                .unattributed_threshold,
            Some(0)
        );
        assert_eq!(
            table("hami_containers_dir = \"/opt/hami/vgpu/containers\"\n")
                .unwrap()
                .hami_containers_dir,
            HamiContainers::Dir("/opt/hami/vgpu/containers".into())
        );
        let off = table("hami_containers_dir = false\n")
            .unwrap()
            .hami_containers_dir;
        assert_eq!((off.dir(), off.is_set()), (None, false));
        let tasks =
            table("hami_task_dir = \"/run/k3s/containerd/io.containerd.runtime.v2.task\"\n")
                .unwrap()
                .hami_task_dir;
        assert_eq!(
            tasks.dir_or(Path::new("/x")),
            Some(Path::new(
                "/run/k3s/containerd/io.containerd.runtime.v2.task"
            ))
        );
        let auto = table("").unwrap().hami_task_dir;
        assert_eq!(auto.dir_or(Path::new("/x")), Some(Path::new("/x")));
        let off = table("hami_task_dir = false\n").unwrap().hami_task_dir;
        assert_eq!(off.dir_or(Path::new("/x")), None);
        let auto = table("").unwrap().hami_containers_dir;
        assert_eq!(
            (auto.dir(), auto.is_set()),
            (Some(Path::new("/usr/local/vgpu/containers")), false)
        );
        use MonitorConfigError as E;
        let kind = |text: &str| std::mem::discriminant(&table(text).unwrap_err());
        for (bad, want) in [
            ("kil = true\n", E::Syntax { message: "".into() }),
            ("tolerance = -1\n", E::ToleranceType { got: "".into() }),
            ("interval_seconds = 0\n", E::Interval),
            ("share_wall = \"kill\"\n", E::ShareWall { value: "".into() }),
            ("share_window_seconds = 0\n", E::ShareWindow { seconds: 0 }),
            ("share_tolerance = 150\n", E::ShareTolerance { points: 0.0 }),
            (
                "share_tolerance = \"5%\"\n",
                E::ShareToleranceType { got: "".into() },
            ),
            ("node = \"\"\n", E::Node { node: "".into() }),
            (
                "unattributed_threshold = true\n",
                E::UnattributedThresholdType { got: "".into() },
            ),
            (
                "unattributed_scans = 0\n",
                E::UnattributedScans { scans: 0 },
            ),
        ] {
            assert_eq!(kind(bad), std::mem::discriminant(&want), "{bad}");
        }
        assert!(matches!(
            table("tolerance = \"5GB\"\n"),
            Err(E::Tolerance(ref q)) if q.input() == "5GB"
        ));
        // The lines are the contract (the e2e suites and operators read them): one line naming the key.
        for (bad, names) in [
            ("kil = true\n", "kil"),
            ("tolerance = \"5GB\"\n", "tolerance"),
            ("tolerance = -1\n", "tolerance"),
            ("interval_seconds = 0\n", "interval_seconds"),
            ("kill = \"yes\"\n", "[monitor]"),
            ("share_wall = \"kill\"\n", "share_wall"),
            ("share_window_seconds = 0\n", "share_window_seconds"),
            ("share_window_seconds = 86400\n", "share_window_seconds"),
            ("share_tolerance = 150\n", "share_tolerance"),
            ("share_tolerance = -1\n", "share_tolerance"),
            ("share_tolerance = \"5%\"\n", "share_tolerance"),
            ("node = \"\"\n", "node"),
            ("node = \"a\\nb\"\n", "node"),
            (
                "unattributed_threshold = \"256MB\"\n",
                "unattributed_threshold",
            ),
            ("unattributed_threshold = -1\n", "unattributed_threshold"),
            ("unattributed_scans = 0\n", "unattributed_scans"),
            ("unattributed_scans = 100000\n", "unattributed_scans"),
            ("hami_containers_dir = true\n", "hami_containers_dir"),
            ("hami_containers_dir = \"\"\n", "hami_containers_dir"),
            (
                "hami_containers_dir = \"vgpu/containers\"\n",
                "hami_containers_dir",
            ),
            ("hami_containers_dir = \"/a\\nb\"\n", "hami_containers_dir"),
            ("hami_containers_dir = 1\n", "hami_containers_dir"),
            ("hami_task_dir = \"run\"\n", "hami_task_dir"),
            ("hami_task_dir = true\n", "hami_task_dir"),
        ] {
            let e = table(bad).unwrap_err().to_string();
            assert!(e.contains(names) && !e.contains('\n'), "{bad}: {e}");
        }
    }
}
