//! `vgpuctl monitor`: a Prometheus exporter of the state root's quotas and usage and of NVML's truth, with
//! the NVML-truth watchdog, the compute share's host wall and the time-quanta arbiter. The root only names
//! the rooms:
//!
//! * the loop (`serve`): a collector thread reads everything once per interval (`collector`: the state
//!   root's figures, NVML, which process is whose: `vgpu_host::{usage, attribution}`) and runs the watchdog
//!   pass and the kill policy on that reading (`kill`); the HTTP server (`http`) answers `GET /metrics` from
//!   the last reading, so a scrape costs the encoding alone (`vgpu_monitor_reading_age_seconds` says how old
//!   it is);
//! * the decisions: `watchdog` (over quota, pending shrinks, ledgers below the truth), `unattributed`
//!   (each GPU's used memory that no process's figure shows, and the container that likely holds it), the compute share's
//!   wall (`share_wall` its decisions, `share_run` its passes, `freezer` the cgroup writes, `frozen` the
//!   walls' record of what they froze, thawed by the next start), the
//!   time-quanta arbiter of oversubscribed GPUs (`turns`, a thread of its own);
//! * what is shown: `metrics` (every family registered and encoded), `labels` (label values, escaped),
//!   `docker` (the names Docker gave its containers), `stderr` (the log lines); `config` its settings;
//! * `older`: the cgroup of a container whose state an older release wrote without one, found from its
//!   recorded init and recorded, so the walls can freeze it.
//!
//! Kills go through a pidfd and only while the process is still the one attributed
//! (`vgpu_host::procs::kill_checked`); containers whose recorded init is gone name no process. Takes no lock
//! on a ledger, and writes to the state root only as the time-quanta arbiter (the turn words of
//! oversubscribed ledgers, its host-only files under `<root>/turns/`), as the walls' record of what they
//! froze, and to add a missing cgroup to a limits file (`older`). NVML and `/proc` are the host tools'
//! (`vgpu_host::nvml`, `vgpu_host::procs`).

mod collector;
pub mod config;
pub mod docker;
pub mod freezer;
pub mod frozen;
pub mod http;
mod kill;
pub mod labels;
pub mod metrics;
pub mod older;
mod serve;
pub mod share_run;
pub mod share_wall;
mod stderr;
pub mod turns;
pub mod unattributed;
pub mod watchdog;

pub use collector::{Collected, Monitor, Reading};
pub use serve::{run, RunError};
