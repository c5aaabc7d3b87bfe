//! The quota HAMi's device plugin answered, read where the host keeps it: the container engine writes the
//! device plugin's Allocate answer into the container's OCI spec, and containerd's runc shim keeps that
//! spec in the container's bundle, `<task dir>/<namespace>/<id>/config.json` (the task dir is
//! `/run/containerd/io.containerd.runtime.v2.task` by default), beside `init.pid`, the host PID of the
//! container's first process, which the shim writes. Both are root's, in a folder of mode 0700 no
//! container mounts: the tenant can write neither. So, unlike the ledgers of HAMi's per-container folder
//! (`hami::scan`), what is read here may decide a kill.
//!
//! A bundle is HAMi's when its spec mounts one of HAMi's per-container folders
//! (`<containers dir>/<pod UID>_<container>`) at `/usr/local/vgpu`, as HAMi's Allocate answer does. Its
//! quota is the spec's `CUDA_DEVICE_MEMORY_LIMIT[_<i>]` (the grammar the library reads:
//! `vgpu_ledger::envlimits`), `<i>` the container's CUDA index, its compute share the spec's
//! `CUDA_DEVICE_SM_LIMIT[_<i>]` under `GPU_CORE_UTILIZATION_POLICY` (`vgpu_ledger::envcompute`) paced
//! over its `VGPU_COMPUTE_WINDOW`, and its GPUs the UUIDs of the spec's `NVIDIA_VISIBLE_DEVICES`. Its
//! processes are those of its init's cgroup, or of its init's PID namespace, as `/proc` shows them for the
//! PID the shim recorded (`procs::inspect`: the PID with its start time and namespace). Bundles of other
//! containers are passed over without a word; a HAMi bundle that cannot be used (a malformed limit, share
//! or window, no GPU UUIDs, an init that is gone) is one line naming it.

use crate::hami::split_name;
use crate::hostfile;
use crate::printable::printable;
use crate::procs::{self, HostProc};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use vgpu_ledger::envcompute::{self, EnvCompute};
use vgpu_ledger::envlimits::EnvLimits;
use vgpu_ledger::layout::check_gpu_uuid;

/// Where containerd's runc shim (v2) keeps its bundles: `<namespace>/<container id>/`.
pub const DEFAULT_TASK_DIR: &str = "/run/containerd/io.containerd.runtime.v2.task";
/// Where HAMi's Allocate answer mounts a container's per-container folder.
pub const FOLDER_MOUNT: &str = "/usr/local/vgpu";
/// The largest spec read (containerd's are a few KiB).
pub const MAX_SPEC: u64 = 4 << 20;

/// A container's quota as the host recorded it: its bundle's spec and its init process.
#[derive(Debug, Clone, PartialEq)]
pub struct HostQuota {
    /// The bundle's folder (its `config.json` is the record).
    pub bundle: PathBuf,
    /// The HAMi folder its spec mounts: `<pod UID>_<container>`.
    pub folder: String,
    /// `NVIDIA_VISIBLE_DEVICES`'s GPU UUIDs, as the spec lists them.
    pub uuids: Vec<String>,
    /// `CUDA_DEVICE_MEMORY_LIMIT[_<i>]` (0: no quota for that GPU).
    pub limits: EnvLimits,
    /// `CUDA_DEVICE_SM_LIMIT[_<i>]` and `GPU_CORE_UTILIZATION_POLICY`: the compute share HAMi's scheduler
    /// counted (`share_for`; `disable`: none). Its requests are not HAMi's and are not taken
    /// (`usage::hami::with_host_quota`).
    pub compute: EnvCompute,
    /// `VGPU_COMPUTE_WINDOW`, the library's pacing window, ms (None: its default).
    pub window_ms: Option<u32>,
    /// Its init process as `/proc` showed it (PID, namespace, start time, cgroup text).
    pub init: HostProc,
}

/// Every HAMi bundle found under a task dir, and a line for each that could not be used.
#[derive(Debug, Clone, Default)]
pub struct Found {
    pub quotas: Vec<HostQuota>,
    pub problems: Vec<String>,
}

/// Reads the bundles under `task_dir` (`<namespace>/<id>/config.json`) whose spec mounts a folder of
/// `containers_dir` at [`FOLDER_MOUNT`]. `inspect` reads a host PID's `/proc` (`procs::inspect` but in
/// tests). A missing `task_dir` is an error of kind `NotFound`.
pub fn read(
    task_dir: &Path,
    containers_dir: &Path,
    inspect: impl Fn(u32) -> Option<HostProc>,
) -> io::Result<Found> {
    let mut out = Found::default();
    let mut bundles: Vec<PathBuf> = Vec::new();
    for ns in fs::read_dir(task_dir)?.flatten() {
        if !ns.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let Ok(ids) = fs::read_dir(ns.path()) else {
            continue;
        };
        bundles.extend(
            ids.flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path()),
        );
    }
    bundles.sort();
    for b in bundles {
        match quota(&b, containers_dir, &inspect) {
            Ok(Some(q)) => out.quotas.push(q),
            Ok(None) => {}
            Err(why) => out
                .problems
                .push(format!("HAMi container bundle {:?}: {why}", b)),
        }
    }
    Ok(out)
}

/// The bundle `b`'s quota if its spec is a HAMi container's (None: not one, or not started yet).
fn quota(
    b: &Path,
    containers_dir: &Path,
    inspect: &impl Fn(u32) -> Option<HostProc>,
) -> Result<Option<HostQuota>, String> {
    let bytes = match hostfile::read_regular(&b.join("config.json"), MAX_SPEC) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("config.json: {e}")),
    };
    let spec: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| format!("config.json: {e}"))?;
    let Some(folder) = hami_folder(&spec, containers_dir) else {
        return Ok(None);
    };
    let env: Vec<(String, String)> = spec["process"]["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str()?.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let limits = EnvLimits::parse(&env).map_err(|e| printable(&e.to_string()).into_owned())?;
    let compute = EnvCompute::parse(&env).map_err(|e| printable(&e.to_string()).into_owned())?;
    // The library reads the last one (`libvgpu::config::env::window_ms`).
    let window_ms = match env.iter().rev().find(|(k, _)| k == envcompute::WINDOW_VAR) {
        Some((k, v)) if !v.trim().is_empty() => Some(
            envcompute::parse_window(v, k).map_err(|e| printable(&e.to_string()).into_owned())?,
        ),
        _ => None,
    };
    let visible = env
        .iter()
        .rev()
        .find(|(k, _)| k == "NVIDIA_VISIBLE_DEVICES")
        .map(|(_, v)| v.as_str())
        .unwrap_or("");
    let uuids: Vec<String> = visible
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_string)
        .collect();
    let uuid_ok =
        |u: &str| (u.starts_with("GPU-") || u.starts_with("MIG-")) && check_gpu_uuid(u).is_ok();
    if uuids.is_empty() || !uuids.iter().all(|u| uuid_ok(u)) {
        return Err(format!(
            "NVIDIA_VISIBLE_DEVICES={visible:?} names no list of GPU UUIDs (HAMi's answer gives them)"
        ));
    }
    // The shim writes init.pid once the container's process exists: none yet is a container being made.
    let pid = match fs::read_to_string(b.join("init.pid")) {
        Ok(s) => s
            .trim()
            .parse::<u32>()
            .map_err(|_| "init.pid holds no PID".to_string())?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("init.pid: {e}")),
    };
    let mut init = inspect(pid).ok_or_else(|| format!("its init process {pid} is gone"))?;
    let written = fs::metadata(b.join("init.pid")).and_then(|m| m.modified());
    if written.is_ok_and(|w| !started_before(&init, w)) {
        return Err(format!(
            "its init process {pid} is gone (the PID is another process's, started after init.pid was written)"
        ));
    }
    init.cgroup = Some(init.cgroup());
    Ok(Some(HostQuota {
        bundle: b.to_path_buf(),
        folder,
        uuids,
        limits,
        compute,
        window_ms,
        init,
    }))
}

/// The name of the HAMi folder (`<containers_dir>/<pod UID>_<container>`) the spec mounts at
/// [`FOLDER_MOUNT`], if it mounts one.
fn hami_folder(spec: &serde_json::Value, containers_dir: &Path) -> Option<String> {
    spec["mounts"].as_array()?.iter().find_map(|m| {
        let dest = m["destination"].as_str()?.trim_end_matches('/');
        if dest != FOLDER_MOUNT {
            return None;
        }
        let src = Path::new(m["source"].as_str()?);
        let name = src.file_name()?.to_str()?;
        (src.parent()? == containers_dir && split_name(name).is_some()).then(|| name.to_string())
    })
}

/// `p` started before `written` (give or take 2 s): the shim writes `init.pid` once the init exists, so
/// a process holding that PID but started later is another one (the PID reused after the container ended).
/// Its start is the boot time (`/proc/stat`'s `btime`) plus its start ticks at the system's clock ticks a
/// second (`procs::ticks_per_second`); unknown when `/proc/stat` cannot tell (then taken as before).
fn started_before(p: &HostProc, written: std::time::SystemTime) -> bool {
    let btime = fs::read_to_string("/proc/stat").ok().and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<u64>().ok())
    });
    let Some(btime) = btime else { return true };
    let started = btime + p.start_time / procs::ticks_per_second();
    let written = written
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    started <= written + 2
}

/// [`read`] with the host's `/proc`.
pub fn read_host(task_dir: &Path, containers_dir: &Path) -> io::Result<Found> {
    read(task_dir, containers_dir, procs::inspect)
}

#[cfg(test)]
mod tests;
