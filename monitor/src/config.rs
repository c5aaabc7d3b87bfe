//! The monitor's effective settings: the `[monitor]` table of the vgpu config file (typed by its one owner,
//! `vgpu_host::config`), then the command line over it, then the defaults. Not here: reading the file.

use std::time::Duration;
use vgpu_host::config::monitor::{
    interval, share_tolerance, share_wall, share_window, tolerance, unattributed_scans,
    unattributed_threshold,
};
use vgpu_host::config::{
    HamiContainers, MonitorConfig, MonitorConfigError, ShareWall, TurnsConfig, DEFAULT_INTERVAL,
    DEFAULT_LISTEN, DEFAULT_SHARE_TOLERANCE, DEFAULT_SHARE_WINDOW, DEFAULT_TOLERANCE,
    DEFAULT_UNATTRIBUTED_SCANS, DEFAULT_UNATTRIBUTED_THRESHOLD,
};

/// What the command line sets (each `None`/false where it does not).
#[derive(Debug, Clone, Default)]
pub struct Flags {
    pub listen: Option<String>,
    pub interval_seconds: Option<u64>,
    /// A quantity, as typed.
    pub tolerance: Option<String>,
    pub kill: bool,
    pub nvml_library: Option<String>,
    /// `freeze`, `report` or `off`, as typed.
    pub share_wall: Option<String>,
    pub share_window_seconds: Option<u64>,
    /// Points of the GPU's time.
    pub share_tolerance: Option<f64>,
    /// A quantity, as typed.
    pub unattributed_threshold: Option<String>,
    pub unattributed_scans: Option<u64>,
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
    /// The compute share wall: what it does, its window and tolerance (points of the GPU's time).
    pub share_wall: ShareWall,
    pub share_window: Duration,
    pub share_tolerance: f64,
    /// A GPU's used memory that no process's figure shows is logged past this many bytes, once it lasted
    /// `unattributed_scans` collections.
    pub unattributed_threshold: u64,
    pub unattributed_scans: u32,
    /// HAMi's `node` label: `[monitor] node`, else `NODE_NAME`, else the host name.
    pub node: String,
    /// Where HAMi's per-container folders are looked for (`[monitor] hami_containers_dir`; no flag).
    pub hami_containers: HamiContainers,
    /// Where the bundles of HAMi's containers are looked for (`[monitor] hami_task_dir`; no flag).
    pub hami_tasks: HamiContainers,
    /// The time-quanta arbiter (`[monitor.turns]`).
    pub turns: Turns,
}

/// The time-quanta arbiter's settings (`[monitor.turns]` over the defaults).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Turns {
    pub enabled: bool,
    pub quantum: Duration,
    pub idle: Duration,
    pub grace: Duration,
    pub tick: Duration,
    pub force: bool,
}

impl Turns {
    /// The table over the defaults.
    pub fn new(t: &TurnsConfig) -> Turns {
        use vgpu_host::config::turns::{
            DEFAULT_GRACE, DEFAULT_IDLE, DEFAULT_QUANTUM, DEFAULT_TICK,
        };
        Turns {
            enabled: t.enabled.unwrap_or(true),
            quantum: t.quantum.unwrap_or(DEFAULT_QUANTUM),
            idle: t.idle.unwrap_or(DEFAULT_IDLE),
            grace: t.grace.unwrap_or(DEFAULT_GRACE),
            tick: t.tick.unwrap_or(DEFAULT_TICK),
            force: t.force.unwrap_or(false),
        }
    }
}

impl Settings {
    /// The flags over the table over the defaults; `nvml_library` defaults to the vgpu config's. A flag
    /// is checked as its key in the table is (the error names the key).
    pub fn new(
        table: &MonitorConfig,
        flags: Flags,
        default_nvml: &str,
    ) -> Result<Settings, MonitorConfigError> {
        let interval = match flags.interval_seconds {
            Some(s) => interval(s)?,
            None => table.interval.unwrap_or(DEFAULT_INTERVAL),
        };
        let tolerance = match &flags.tolerance {
            Some(t) => tolerance(t)?,
            None => table.tolerance.unwrap_or(DEFAULT_TOLERANCE),
        };
        let share_wall = match &flags.share_wall {
            Some(m) => share_wall(m)?,
            None => table.share_wall.unwrap_or_default(),
        };
        let share_window = match flags.share_window_seconds {
            Some(s) => share_window(s)?,
            None => table.share_window.unwrap_or(DEFAULT_SHARE_WINDOW),
        };
        let share_tolerance = match flags.share_tolerance {
            Some(p) => share_tolerance(p)?,
            None => table.share_tolerance.unwrap_or(DEFAULT_SHARE_TOLERANCE),
        };
        let threshold = match &flags.unattributed_threshold {
            Some(t) => unattributed_threshold(t)?,
            None => table
                .unattributed_threshold
                .unwrap_or(DEFAULT_UNATTRIBUTED_THRESHOLD),
        };
        let scans = match flags.unattributed_scans {
            Some(n) => unattributed_scans(n)?,
            None => table
                .unattributed_scans
                .unwrap_or(DEFAULT_UNATTRIBUTED_SCANS),
        };
        Ok(Settings {
            turns: Turns::new(&table.turns),
            unattributed_threshold: threshold,
            unattributed_scans: scans,
            share_wall,
            share_window,
            share_tolerance,
            listen: flags
                .listen
                .or_else(|| table.listen.clone())
                .unwrap_or_else(|| DEFAULT_LISTEN.into()),
            interval,
            tolerance,
            kill: flags.kill || table.kill.unwrap_or(false),
            nvml_library: flags
                .nvml_library
                .or_else(|| table.nvml_library.clone())
                .unwrap_or_else(|| default_nvml.to_string()),
            node: node_name(table.node.as_deref(), std::env::var("NODE_NAME").ok()),
            hami_containers: table.hami_containers_dir.clone(),
            hami_tasks: table.hami_task_dir.clone(),
        })
    }
}

/// HAMi's `node` label: `[monitor] node`, else the environment's `NODE_NAME` (the Kubernetes node's name,
/// which the chart passes from the downward API, as HAMi's own monitor takes it), else the host name.
pub fn node_name(configured: Option<&str>, env: Option<String>) -> String {
    match (configured, env) {
        (Some(n), _) => n.to_string(),
        (None, Some(n)) if !n.is_empty() => n,
        _ => nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_then_the_table_then_the_flags() {
        let d = Settings::new(
            &MonitorConfig::default(),
            Flags::default(),
            "libnvidia-ml.so.1",
        )
        .unwrap();
        assert_eq!(d.listen, DEFAULT_LISTEN);
        // Issue 44: a bare node's exporter listened on every address by default, and the scrape names
        // every tenant's pods and usage: by default only the node reaches it now.
        let addr: std::net::SocketAddr = d.listen.parse().unwrap();
        assert!(addr.ip().is_loopback(), "{addr}");
        assert_eq!(
            (
                d.interval.as_secs(),
                d.tolerance,
                d.kill,
                d.nvml_library.as_str()
            ),
            (10, 64 << 20, false, "libnvidia-ml.so.1")
        );
        assert_eq!(
            (d.share_wall, d.share_window.as_secs(), d.share_tolerance),
            (ShareWall::Freeze, 10, 5.0),
            "the share wall acts by default"
        );
        let table = MonitorConfig {
            listen: Some("127.0.0.1:1".into()),
            interval: Some(Duration::from_secs(2)),
            tolerance: Some(1 << 30),
            kill: Some(true),
            nvml_library: Some("/t.so".into()),
            share_wall: Some(ShareWall::Report),
            share_window: Some(Duration::from_secs(20)),
            share_tolerance: Some(2.0),
            node: Some("gpu-7".into()),
            unattributed_threshold: Some(1 << 30),
            unattributed_scans: Some(5),
            hami_containers_dir: HamiContainers::Off,
            hami_task_dir: HamiContainers::Off,
            turns: TurnsConfig {
                quantum: Some(Duration::from_secs(2)),
                force: Some(true),
                ..Default::default()
            },
        };
        let s = Settings::new(&table, Flags::default(), "n").unwrap();
        assert_eq!(
            (
                s.listen.as_str(),
                s.interval.as_secs(),
                s.tolerance,
                s.kill,
                s.nvml_library.as_str()
            ),
            ("127.0.0.1:1", 2, 1 << 30, true, "/t.so")
        );
        assert_eq!(
            (s.share_wall, s.share_window.as_secs(), s.share_tolerance),
            (ShareWall::Report, 20, 2.0)
        );
        assert_eq!(s.node, "gpu-7");
        assert_eq!(
            (&d.hami_containers, &s.hami_containers),
            (&HamiContainers::Auto, &HamiContainers::Off),
            "HAMi's default folder whenever it exists, unless the table says otherwise"
        );
        assert_eq!(
            (s.unattributed_threshold, s.unattributed_scans),
            (1 << 30, 5)
        );
        assert_eq!(
            node_name(Some("gpu-7"), Some("k8s-node".into())),
            "gpu-7",
            "the config wins"
        );
        assert_eq!(
            node_name(None, Some("k8s-node".into())),
            "k8s-node",
            "then NODE_NAME (the chart's downward API)"
        );
        assert_eq!(
            node_name(None, Some(String::new())),
            nix::unistd::gethostname().unwrap().to_string_lossy(),
            "an empty NODE_NAME is no name"
        );
        assert_eq!(
            (d.turns.enabled, d.turns.quantum.as_secs(), d.turns.force),
            (true, 30, false),
            "the arbiter runs by default, 30 s turns"
        );
        assert_eq!(
            (d.unattributed_threshold, d.unattributed_scans),
            (256 << 20, 3),
            "unattributed memory is logged past 256 MiB for 3 collections"
        );
        assert_eq!(
            (s.turns.enabled, s.turns.quantum.as_secs(), s.turns.force),
            (true, 2, true)
        );
        assert_eq!(
            d.node,
            nix::unistd::gethostname().unwrap().to_string_lossy(),
            "the host name by default"
        );
        let flags = Flags {
            listen: Some("127.0.0.1:2".into()),
            interval_seconds: Some(5),
            tolerance: Some("1Mi".into()),
            kill: false,
            nvml_library: Some("/f.so".into()),
            share_wall: Some("off".into()),
            share_window_seconds: Some(3),
            share_tolerance: Some(0.0),
            unattributed_threshold: Some("64Mi".into()),
            unattributed_scans: Some(1),
        };
        let s = Settings::new(&table, flags, "n").unwrap();
        assert_eq!(
            (s.unattributed_threshold, s.unattributed_scans),
            (64 << 20, 1),
            "the flags win"
        );
        assert_eq!(
            (s.share_wall, s.share_window.as_secs(), s.share_tolerance),
            (ShareWall::Off, 3, 0.0)
        );
        let interval_zero = Flags {
            interval_seconds: Some(0),
            ..Flags::default()
        };
        assert_eq!(
            Settings::new(&table, interval_zero, "n"),
            Err(MonitorConfigError::Interval),
            "a flag is checked as its key is"
        );
        assert_eq!(
            (
                s.listen.as_str(),
                s.interval.as_secs(),
                s.tolerance,
                s.nvml_library.as_str()
            ),
            ("127.0.0.1:2", 5, 1 << 20, "/f.so")
        );
        for bad in [
            Flags {
                interval_seconds: Some(0),
                ..Flags::default()
            },
            Flags {
                tolerance: Some("5GB".into()),
                ..Flags::default()
            },
            Flags {
                share_wall: Some("stop".into()),
                ..Flags::default()
            },
            Flags {
                share_window_seconds: Some(0),
                ..Flags::default()
            },
            Flags {
                share_tolerance: Some(101.0),
                ..Flags::default()
            },
            Flags {
                unattributed_threshold: Some("256MB".into()),
                ..Flags::default()
            },
            Flags {
                unattributed_threshold: Some("lots".into()),
                ..Flags::default()
            },
            Flags {
                unattributed_scans: Some(0),
                ..Flags::default()
            },
        ] {
            let e = Settings::new(&table, bad, "n").unwrap_err();
            assert!(!matches!(e, MonitorConfigError::Syntax { .. }), "{e}");
            let msg = e.to_string();
            assert!(
                msg.starts_with("[monitor] ") && !msg.contains('\n'),
                "{msg}"
            );
        }
    }
}
