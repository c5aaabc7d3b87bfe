//! `vgpuctl update`: a running container's memory quota, compute share and pacing window changed without
//! restarting it (docs/oci.md, "Changing a running container"). The change goes through admission under
//! the node lock, exactly as a create does (a grow that would pass the GPU is refused with the same line),
//! then into the host's `limits.json` (renamed into place) and the container's mounted copy (rewritten in
//! place, bracketed by the ledgers' generation: `vgpu_host::live`), where every process's library picks
//! it up on its next allocation, memory query or launch. Not here: the options' grammar and the pure
//! change (`change`).
//!
//! A shrink records what the container holds on each GPU it lowers, measured by the host from NVML
//! (`vgpu_host::held`, the watchdog's own attribution; never the tenant-writable ledger), as
//! `held_at_shrink`: the watchdog tolerates a pending shrink only up to that, so a tenant that hides the
//! shrink from its own processes (an odd generation word) cannot keep its old quota. The figure is taken
//! under the locks, just before the files are written. Where NVML cannot list the GPU's processes the
//! shrink is refused with one line, nothing changed: without the figure there is no wall.
//!
//! The environment-only mode (`LD_PRELOAD` with `CUDA_DEVICE_MEMORY_LIMIT`, no engine) has no state on
//! the host and cannot be updated.

pub mod change;

use clap::Args;
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use vgpu_host::admission::{self, Policy};
use vgpu_host::held::HeldError;
use vgpu_host::hostfile;
use vgpu_host::inventory::{read_ledger, LedgerRead};
use vgpu_host::limits_file::WriteLimits;
use vgpu_host::live;
use vgpu_host::nvml::{HostGpu, Nvml, NvmlError};
use vgpu_host::request::GpuRequest;
use vgpu_host::state_root::StateRoot;
use vgpu_ledger::{format_bytes, Limits};

use crate::update::change::{apply, Change, Request, UpdateError};

/// Why `vgpuctl update` failed: a refusal of the change (`UpdateError`), or what it read, admitted or wrote.
/// Each is one line naming the container or the file; a cause already in the line is not also a `source`.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Refused(#[from] UpdateError),
    #[error(transparent)]
    Config(#[from] vgpu_host::config::ConfigError),
    #[error(transparent)]
    Layout(#[from] vgpu_ledger::layout::LayoutError),
    #[error(transparent)]
    Gpus(#[from] vgpu_host::nvml::NvmlError),
    #[error(transparent)]
    Limits(#[from] vgpu_ledger::LimitsError),
    #[error(transparent)]
    Admission(#[from] admission::AdmissionError),
    /// The container reference fits no container, or several.
    #[error(transparent)]
    Reference(#[from] crate::containers::RefError),
    #[error("no container {id} under {root} (the environment-only mode has no state to update)")]
    NotProvisioned { id: String, root: String },
    #[error(
        "container {id} is not running yet (its owner is not recorded): update it once it started"
    )]
    NotRunning { id: String },
    #[error(
        "container {id} has exited (its init process no longer runs): not updated, its quota goes when it is deleted"
    )]
    Exited { id: String },
    #[error("container {id}: cannot lock its state folder: {why}")]
    Lock { id: String, why: std::io::Error },
    #[error("container {id}: cannot write its limits: {why}")]
    Write { id: String, why: std::io::Error },
    #[error("container {id}: {why}")]
    Publish { id: String, why: live::PublishError },
    /// A shrink whose figure of what the container holds could not be taken from NVML.
    #[error("container {id}: GPU {index} ({uuid}): cannot measure what it holds from NVML ({why}): a quota is lowered only with that figure; nothing changed")]
    Unmeasured {
        id: String,
        index: u32,
        uuid: String,
        why: String,
    },
    /// The terminal or pipe the outcome is written to.
    #[error(transparent)]
    Output(#[from] std::io::Error),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

type Result<T, E = RunError> = std::result::Result<T, E>;

/// `vgpuctl update`'s options.
#[derive(Args, Debug)]
pub struct UpdateArgs {
    /// The container: its id (the folder name under the state root's containers/), a unique prefix of it
    /// (as `vgpuctl status` prints it), or its name: Kubernetes' (container, pod/container or
    /// namespace/pod/container), Docker's or Podman's.
    #[arg(value_name = "CONTAINER")]
    pub id: String,
    /// Change only the container's GPU of this index (its CUDA ordinal inside); default: every GPU.
    #[arg(long, value_name = "INDEX")]
    pub gpu: Option<u32>,
    /// The new memory quota, as vgpu.io/memory-limit (e.g. 2Gi, 512Mi; at least 64Mi). A shrink below
    /// what the container holds refuses its next allocations until it frees enough; nothing it holds is
    /// taken. A shrink records what the container holds, measured from NVML (refused where NVML cannot
    /// list the GPU's processes).
    #[arg(long, value_name = "SIZE")]
    pub memory_limit: Option<String>,
    /// The new compute share's limit (its cap) in percent of the GPU's time, as vgpu.io/compute-limit
    /// (1-99).
    #[arg(long, value_name = "PERCENT")]
    pub compute_limit: Option<String>,
    /// The new compute share's request (its floor) in percent of the GPU's time, as
    /// vgpu.io/compute-request (1-100, at most the limit); admitted as at creation (the requests of a
    /// GPU add up to at most 100).
    #[arg(long, value_name = "PERCENT")]
    pub compute_request: Option<String>,
    /// The new pacing window of the share, as vgpu.io/compute-window (10ms to 10s).
    #[arg(long, value_name = "DURATION")]
    pub compute_window: Option<String>,
    /// Print what changed as JSON.
    #[arg(long)]
    pub json: bool,
    /// The state root (default: state_root from /etc/vgpu/config.toml, or the file VGPU_CONFIG names).
    #[arg(long)]
    pub state_root: Option<PathBuf>,
}

/// What `update` asks of the host: its GPUs, and at a shrink what the container truly holds on each.
pub trait Host {
    /// Every GPU of the host.
    fn gpus(&self) -> Result<Vec<HostGpu>, NvmlError>;
    /// Bytes container `id`'s processes hold now by GPU UUID, by NVML, attributed as the watchdog
    /// attributes them (`vgpu_host::held::held_by`); a GPU whose processes NVML could not list is
    /// absent.
    fn held(&self, root: &StateRoot, id: &str) -> Result<BTreeMap<String, u64>, HeldError>;
    /// Whether the container's recorded init still runs: host PID `pid` in PID namespace `ns`, started at
    /// `start` when recorded (`vgpu_host::procs::init_alive`, what the garbage collector and the monitor
    /// ask).
    fn init_alive(&self, pid: u32, ns: u64, start: Option<u64>) -> bool;
}

/// The host through its NVML library (a soname or a path), loaded at the first question, once.
pub struct NvmlHost {
    lib: String,
    nvml: std::cell::OnceCell<Box<dyn Nvml>>,
}

impl NvmlHost {
    pub fn new(lib: &str) -> NvmlHost {
        NvmlHost {
            lib: lib.to_string(),
            nvml: Default::default(),
        }
    }

    fn nvml(&self) -> Result<&dyn Nvml, NvmlError> {
        match self.nvml.get() {
            Some(n) => Ok(n.as_ref()),
            None => {
                let n = vgpu_host::nvml::open(&self.lib)?;
                Ok(self.nvml.get_or_init(|| n).as_ref())
            }
        }
    }
}

impl Host for NvmlHost {
    fn gpus(&self) -> Result<Vec<HostGpu>, NvmlError> {
        self.nvml()?.devices()
    }

    fn held(&self, root: &StateRoot, id: &str) -> Result<BTreeMap<String, u64>, HeldError> {
        vgpu_host::held::held_by(root, id, self.nvml()?)
    }

    fn init_alive(&self, pid: u32, ns: u64, start: Option<u64>) -> bool {
        vgpu_host::procs::init_alive(pid, ns, start)
    }
}

/// What an update did (`--json`).
#[derive(Debug, Serialize)]
pub struct Outcome {
    pub container: String,
    /// Updates made to the container so far, this one included.
    pub updates: u64,
    /// This update's time, seconds since the Unix epoch.
    pub updated_at: u64,
    pub changes: Vec<Change>,
    /// GPUs whose usage is above their new quota: allocations there are refused until it falls under.
    pub over_quota: Vec<OverQuota>,
}

#[derive(Debug, Serialize)]
pub struct OverQuota {
    pub gpu: u32,
    pub uuid: String,
    pub used: u64,
    pub quota: u64,
}

impl UpdateArgs {
    /// Runs the update and prints what changed.
    pub fn run(&self, out: &mut dyn Write) -> Result<()> {
        let cfg = vgpu_host::config::Config::load()?;
        let root = StateRoot::new(self.state_root.clone().unwrap_or(cfg.state_root.clone()));
        let req = Request::parse(
            self.gpu,
            self.memory_limit.as_deref(),
            self.compute_limit.as_deref(),
            self.compute_request.as_deref(),
            self.compute_window.as_deref(),
        )?;
        let id = crate::containers::resolve(
            &self.id,
            &crate::containers::known(&root, &self.id),
            root.root(),
        )?;
        let host = NvmlHost::new(&cfg.nvml_library);
        let outcome = update(&root, Policy::of(&cfg), &id, &req, &host)?;
        if self.json {
            serde_json::to_writer_pretty(&mut *out, &outcome)?;
            writeln!(out)?;
        } else {
            print(&outcome, out)?;
        }
        Ok(())
    }
}

/// Updates container `id`: reads its limits, applies `req`, admits the result under the node lock and
/// publishes it. Two updates (or an update and a create) at once are serialised by that lock; an update
/// that finds the limits changed by another once it holds the lock starts again from them.
pub fn update(
    root: &StateRoot,
    policy: Policy,
    id: &str,
    req: &Request,
    host: &dyn Host,
) -> Result<Outcome> {
    let path = root.limits_path(id)?;
    if !vgpu_host::walk::is_marked(&root.container_dir(id)?) {
        return Err(RunError::NotProvisioned {
            id: id.to_string(),
            root: root.root().display().to_string(),
        });
    }
    let gpus = host.gpus()?;
    // Updates of one container one at a time, whatever the node's policy (under allow_overcommit admission
    // takes no node lock): a lock on the container's folder, taken before the node's.
    let dir = std::fs::File::open(root.container_dir(id)?).map_err(|why| RunError::Lock {
        id: id.to_string(),
        why,
    })?;
    let _container =
        nix::fcntl::Flock::lock(dir, nix::fcntl::FlockArg::LockExclusive).map_err(|(_, e)| {
            RunError::Lock {
                id: id.to_string(),
                why: e.into(),
            }
        })?;
    loop {
        let before = hostfile::load_limits(&path)?;
        if before.init_pid.is_none() {
            return Err(RunError::NotRunning { id: id.to_string() });
        }
        // An exited container (not yet deleted) holds its quota against the GPU until it is: an update
        // that grew it would make admission refuse others for a quota nobody uses. Asked under the
        // container's folder lock, as the garbage collector and the monitor ask it.
        let alive = match (before.init_pid, before.pid_ns) {
            (Some(pid), Some(ns)) => host.init_alive(pid, ns, before.init_start_time),
            _ => false,
        };
        if !alive {
            return Err(RunError::Exited { id: id.to_string() });
        }
        // A container of a package before live updates cannot follow: refused before anything is written.
        live::check_publishable(&root.container_dir(id)?).map_err(|why| RunError::Publish {
            id: id.to_string(),
            why,
        })?;
        let total = |uuid: &str| gpus.iter().find(|g| g.uuid == uuid).map(|g| g.total_memory);
        let (mut after, changes) = apply(&before, req, total)?;
        let _lock = admission::admit(root, policy, id, &GpuRequest::of_limits(&after), || {
            Ok(gpus.clone())
        })?;
        // Under the lock: another update may have come first; start again from what it wrote.
        if hostfile::load_limits(&path)? != before {
            continue;
        }
        record_held(root, id, host, &before, &mut after, &changes)?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if !changes.is_empty() {
            after.updates = before.updates + 1;
            after.updated_at = Some(now);
            write(root, id, &before, &after)?;
        }
        return Ok(Outcome {
            container: id.to_string(),
            updates: after.updates,
            updated_at: after.updated_at.unwrap_or(now),
            changes,
            over_quota: over_quota(root, &after),
        });
    }
}

/// At a shrink, records on each GPU lowered what the container holds there now (`Host::held`), at most
/// what it was allowed before (`vgpu_host::shrink::allowed_memory`: a tenant that took more since is no reason
/// to allow it more). Refused when NVML cannot tell for one of them.
fn record_held(
    root: &StateRoot,
    id: &str,
    host: &dyn Host,
    before: &Limits,
    after: &mut Limits,
    changes: &[Change],
) -> Result<()> {
    let lowered: Vec<&Change> = changes
        .iter()
        .filter(|c| c.setting == "memory_limit" && c.from.is_some_and(|from| c.to < from))
        .collect();
    if lowered.is_empty() {
        return Ok(());
    }
    let unmeasured = |c: &Change, why: String| RunError::Unmeasured {
        id: id.to_string(),
        index: c.gpu,
        uuid: c.uuid.clone(),
        why,
    };
    let held = host
        .held(root, id)
        .map_err(|e| unmeasured(lowered[0], e.to_string()))?;
    for c in lowered {
        let Some(&bytes) = held.get(&c.uuid) else {
            return Err(unmeasured(c, "its processes were not listed".into()));
        };
        let was = before
            .device_by_uuid(&c.uuid)
            .and_then(vgpu_host::shrink::allowed_memory)
            .unwrap_or(bytes);
        if let Some(d) = after.devices.iter_mut().find(|d| d.uuid == c.uuid) {
            d.held_at_shrink = Some(bytes.min(was));
        }
    }
    Ok(())
}

/// The host's file first (admission, status and the monitor read it), then the container's copy; if the
/// copy cannot be published the host's file is put back, so both keep saying one thing.
fn write(root: &StateRoot, id: &str, before: &Limits, after: &Limits) -> Result<()> {
    let path = root.limits_path(id)?;
    after.write_atomic(&path).map_err(|why| RunError::Write {
        id: id.to_string(),
        why,
    })?;
    if let Err(e) = live::publish(&root.container_dir(id)?, after) {
        let _ = before.write_atomic(&path);
        return Err(RunError::Publish {
            id: id.to_string(),
            why: e,
        });
    }
    Ok(())
}

/// The GPUs whose ledger holds more than the new quota (a pending shrink).
fn over_quota(root: &StateRoot, limits: &Limits) -> Vec<OverQuota> {
    let Ok(path) = root.limits_path(&limits.container_id) else {
        return vec![];
    };
    limits
        .devices
        .iter()
        .filter_map(|d| {
            let quota = d.settings.memory_limit?;
            let LedgerRead::Read(s) = read_ledger(&limits.ledger_path(&path, d)) else {
                return None;
            };
            (s.used > quota).then(|| OverQuota {
                gpu: d.index,
                uuid: d.uuid.clone(),
                used: s.used,
                quota,
            })
        })
        .collect()
}

fn print(o: &Outcome, out: &mut dyn Write) -> Result<()> {
    if o.changes.is_empty() {
        writeln!(
            out,
            "container {}: nothing changed (already so)",
            o.container
        )?;
    }
    for c in &o.changes {
        let show = |v: u64| match c.setting {
            "memory_limit" => format_bytes(v),
            "compute_limit" | "compute_request" => format!("{v}%"),
            _ => format!("{v} ms"),
        };
        writeln!(
            out,
            "container {}: GPU {} ({}) {} {} -> {} (update {})",
            o.container,
            c.gpu,
            c.uuid,
            c.setting.replace('_', " "),
            c.from.map_or("default".into(), show),
            show(c.to),
            o.updates
        )?;
    }
    for q in &o.over_quota {
        writeln!(
            out,
            "container {}: GPU {} holds {}, over its new quota by {} (pending shrink): its allocations are refused until it frees that much; nothing it holds is taken",
            o.container,
            q.gpu,
            format_bytes(q.used),
            format_bytes(q.used - q.quota)
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
