//! The driver's own wall: where the driver enforces a per-cgroup GPU memory limit itself (NVML r615+,
//! `nvmlDeviceSetMemoryLimits_v1`), the container's quota is set as its cgroup's limit too (config key
//! `driver_memory_limit`), so a process that escapes the interposer (its own loader, a static binary) still
//! meets a wall at allocation. The hook sets it at `createRuntime`. Not here: the NVML call itself
//! (`crate::nvml`), the cgroup's folder (`crate::cgroup::of_pid`).
//!
//! Unverified on hardware: the GPUs this project is tested on run driver 580, which has no such call; there
//! the hook says so once (at `info`) and the container runs with the interposer's quota alone.

use crate::cgroup::{self, CgroupError};
use crate::config::Config;
use crate::nvml::{self, Nvml, NvmlError};
use std::ffi::CString;
use std::path::{Path, PathBuf};
use vgpu_ledger::Limits;

/// Why the container's quotas could not be set as its cgroup's limits. `Display` is one line.
#[derive(Debug, thiserror::Error)]
pub enum DriverLimitError {
    /// The container's cgroup folder was not found.
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error("cgroup path {} holds a NUL byte", cgroup.display())]
    NulByte { cgroup: PathBuf },
    /// NVML could not be loaded, or refused the limits.
    #[error("driver_memory_limit for cgroup {}: {err}", cgroup.display())]
    Nvml { cgroup: PathBuf, err: NvmlError },
}

type Result<T, E = DriverLimitError> = std::result::Result<T, E>;

/// Sets the container's quotas (`limits`) as its cgroup's GPU memory limits, when the config asks for it.
/// A driver without the call is not an error (one line at `info`); a call that fails is.
pub fn apply(cfg: &Config, pid: u32, limits: &Limits) -> Result<()> {
    if !cfg.driver_memory_limit {
        return Ok(());
    }
    let cgroup = cgroup::of_pid(pid)?;
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
