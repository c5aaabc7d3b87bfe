//! The driver's own wall: where the driver enforces a per-cgroup GPU memory limit itself (NVML r615+,
//! `nvmlDeviceSetMemoryLimits_v1`), the container's quota is set as its cgroup's limit too (config key
//! `driver_memory_limit`), so a process that escapes the interposer (its own loader, a static binary) still
//! meets a wall at allocation. The hook sets it at `createRuntime`. Not here: the NVML call itself
//! (`crate::nvml`).
//!
//! Unverified on hardware: the GPUs this project is tested on run driver 580, which has no such call; there
//! the hook says so once (at `info`) and the container runs with the interposer's quota alone.
//!
//! `/proc/<pid>/cgroup` is read by hand (three colon-separated fields a line), not through `procfs`: one
//! small file, read once per container, where the crate would bring its parser for all of `/proc`.

use crate::config::Config;
use crate::nvml::{self, Nvml, NvmlError};
use std::ffi::CString;
use std::path::{Path, PathBuf};
use vgpu_ledger::Limits;

/// Why the container's quotas could not be set as its cgroup's limits. `Display` is one line.
#[derive(Debug, thiserror::Error)]
pub enum DriverLimitError {
    #[error("cannot read the cgroup of pid {pid}: {err}")]
    ReadCgroup { pid: u32, err: std::io::Error },
    #[error("pid {pid}: no cgroup v2 or memory cgroup in /proc/{pid}/cgroup")]
    NoCgroup { pid: u32 },
    #[error("cgroup path {} holds a NUL byte", cgroup.display())]
    NulByte { cgroup: PathBuf },
    /// NVML could not be loaded, or refused the limits.
    #[error("driver_memory_limit for cgroup {}: {err}", cgroup.display())]
    Nvml { cgroup: PathBuf, err: NvmlError },
}

type Result<T, E = DriverLimitError> = std::result::Result<T, E>;

/// The sysfs path of the cgroup of host process `pid`: the unified hierarchy's (cgroup v2), else the
/// memory controller's (v1).
pub fn cgroup_of(pid: u32) -> Result<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .map_err(|err| DriverLimitError::ReadCgroup { pid, err })?;
    parse(&text).ok_or(DriverLimitError::NoCgroup { pid })
}

fn parse(text: &str) -> Option<PathBuf> {
    let line = |want: &dyn Fn(&str, &str) -> bool| {
        text.lines().find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (id, ctrl, path) = (f.next()?, f.next()?, f.next()?);
            want(id, ctrl).then(|| path.to_string())
        })
    };
    if let Some(p) = line(&|id, ctrl| id == "0" && ctrl.is_empty()) {
        return Some(PathBuf::from(format!("/sys/fs/cgroup{p}")));
    }
    let p = line(&|_, ctrl| ctrl.split(',').any(|c| c == "memory"))?;
    Some(PathBuf::from(format!("/sys/fs/cgroup/memory{p}")))
}

/// Sets the container's quotas (`limits`) as its cgroup's GPU memory limits, when the config asks for it.
/// A driver without the call is not an error (one line at `info`); a call that fails is.
pub fn apply(cfg: &Config, pid: u32, limits: &Limits) -> Result<()> {
    if !cfg.driver_memory_limit {
        return Ok(());
    }
    let cgroup = cgroup_of(pid)?;
    let nvml = nvml::open(&cfg.nvml_library).map_err(|err| DriverLimitError::Nvml {
        cgroup: cgroup.clone(),
        err,
    })?;
    apply_with(&*nvml, &cgroup, limits)
}

/// Sets the quotas of `limits` as the limits of `cgroup` through `nvml`.
pub fn apply_with(nvml: &dyn Nvml, cgroup: &Path, limits: &Limits) -> Result<()> {
    let c = CString::new(cgroup.as_os_str().as_encoded_bytes()).map_err(|_| {
        DriverLimitError::NulByte {
            cgroup: cgroup.into(),
        }
    })?;
    let quotas: Vec<(String, u64)> = limits
        .devices
        .iter()
        .filter_map(|d| Some((d.uuid.clone(), d.settings.memory_limit?)))
        .collect();
    let set = nvml
        .set_memory_limits(&c, &quotas)
        .map_err(|err| DriverLimitError::Nvml {
            cgroup: cgroup.into(),
            err,
        })?;
    if !set {
        tracing::info!(
            "driver_memory_limit: the driver has no per-cgroup GPU memory limit \
             (nvmlDeviceSetMemoryLimits_v1, r615+); the interposer's quota stands alone"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cgroup_path_of_v2_and_of_v1s_memory_controller() {
        assert_eq!(
            parse("0::/system.slice/docker-3f2a.scope\n"),
            Some(PathBuf::from(
                "/sys/fs/cgroup/system.slice/docker-3f2a.scope"
            ))
        );
        assert_eq!(
            parse("12:cpu,cpuacct:/x\n7:memory:/kubepods/pod1/c2\n0::/\n"),
            Some(PathBuf::from("/sys/fs/cgroup/")),
            "the unified hierarchy wins"
        );
        assert_eq!(
            parse("12:cpu,cpuacct:/x\n7:memory:/kubepods/pod1/c2\n"),
            Some(PathBuf::from("/sys/fs/cgroup/memory/kubepods/pod1/c2"))
        );
        assert_eq!(parse("12:cpu:/x\n"), None);
        assert!(cgroup_of(std::process::id()).is_ok());
    }

    #[test]
    fn each_memory_quota_becomes_the_cgroups_limit_where_the_driver_has_the_call() {
        let mut limits: Limits = serde_json::from_value(serde_json::json!({
            "version": vgpu_ledger::LIMITS_VERSION, "container_id": "c",
            "devices": [
                {"index": 0, "uuid": "GPU-fa4ec0de-0000-4000-8000-000000000000", "memory_limit": 1073741824,
                 "ledger": "ledgers/a.ledger"},
                {"index": 1, "uuid": "GPU-fa4ec0de-0000-4000-8000-000000000001", "compute_limit": 30,
                 "ledger": "ledgers/b.ledger"}
            ]
        }))
        .unwrap();
        let cg = Path::new("/sys/fs/cgroup/x.scope");
        let old = nvml::Fake::gpus(2, 16 << 30);
        apply_with(&old, cg, &limits).unwrap();
        assert!(
            old.limits_set.lock().unwrap().is_empty(),
            "no call: nothing set, no error"
        );
        let new = nvml::Fake {
            memory_limits: true,
            ..nvml::Fake::gpus(2, 16 << 30)
        };
        apply_with(&new, cg, &limits).unwrap();
        assert_eq!(
            *new.limits_set.lock().unwrap(),
            vec![(
                "/sys/fs/cgroup/x.scope".to_string(),
                "GPU-fa4ec0de-0000-4000-8000-000000000000".to_string(),
                1 << 30
            )],
            "the GPU with a compute share alone gets no memory limit"
        );
        limits.devices[0].uuid = "GPU-gone".into();
        let e = apply_with(&new, cg, &limits).unwrap_err();
        assert!(
            matches!(&e, DriverLimitError::Nvml { cgroup, .. } if cgroup == cg),
            "{e}"
        );
        assert!(e.to_string().contains("GPU-gone"), "{e}");
    }
}
