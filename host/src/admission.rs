//! Quota admission: a container is refused when its quota on a GPU would make the quotas of that GPU's
//! containers add up past the GPU's memory (less a reserve the node keeps), or its compute request the
//! requests of that GPU's containers past 100% of its time, unless the node allows overcommit. Requests
//! are floors (`crate::division`): they hold only when they fit. A compute limit without a request
//! is its own request (a hard cap), and counts as one only on a GPU where a container asks for a request
//! of its own (asked, or committed): on a GPU of caps alone nothing is promised and caps may add up
//! past 100, as they always could. Run by the shim and the hook at a container's creation and by `vgpuctl update` on a running
//! one, each with the container's GPUs and what it asks on each ([`GpuRequest`]). Not here: deciding the
//! quota (`vgpu_oci::plan`), writing the state (`vgpu_oci::provision`).
//!
//! The containers counted are the state root's container folders: a container's quota is committed from
//! its provisioning until its poststop (or the garbage collector) removes its folder. Deciding and
//! provisioning happen under one node-level lock (`<state_root>/admission.lock`, `flock`), so two
//! containers created at once cannot both take the last room; the lock is held only from the decision to
//! the folder's rename into place, never across the container's life.

use crate::config::Config;
use crate::inventory;
use crate::nvml::{HostGpu, NvmlError};
use crate::request::GpuRequest;
use crate::state_root::StateRoot;
use crate::walk::PrepareError;
use nix::fcntl::{Flock, FlockArg};
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use vgpu_ledger::{format_bytes, GpuSettings};

/// Name of the lock file in the state root.
pub const LOCK_FILE_NAME: &str = "admission.lock";

/// The node's admission policy (config keys `allow_overcommit`, `admission_reserve`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Quotas may add up past a GPU's memory: no check at all.
    pub overcommit: bool,
    /// Bytes of every GPU kept out of the quotas (the driver's own use, node daemons).
    pub reserve: u64,
}

impl Policy {
    pub fn of(cfg: &Config) -> Policy {
        Policy {
            overcommit: cfg.allow_overcommit,
            reserve: cfg.admission_reserve_bytes(),
        }
    }
}

/// Held while a container is admitted and provisioned; dropping it lets the next container decide.
pub struct Admitted {
    _lock: Option<Flock<File>>,
}

/// Why a container is not admitted. `Display` is the one line the shim or the hook prints.
#[derive(Debug, thiserror::Error)]
pub enum AdmissionError {
    /// A GPU asked for that NVML no longer lists.
    #[error("admission: GPU {uuid} is not on this node any more")]
    GpuGone { uuid: String },
    /// The quota asked for, with what is committed already, passes the GPU's memory less the reserve.
    #[error("{}", full_line(*index, uuid, *asked, committed, *total, *reserve))]
    Full {
        index: u32,
        uuid: String,
        asked: u64,
        committed: Committed,
        total: u64,
        reserve: u64,
    },
    /// The compute request asked for, with the requests committed already, passes the GPU's whole time.
    #[error("admission: GPU {index} ({uuid}) would have {}% of its time promised as compute requests ({committed}% already, {asked}% asked for), more than its 100%: lower vgpu.io/compute-request (a compute limit without a request is its own request on a GPU where a container has a request); set allow_overcommit = true in the vgpu config to allow it", committed + asked)]
    ComputeFull {
        index: u32,
        uuid: String,
        asked: u32,
        committed: u32,
    },
    /// The state root or its lock file (`what`: which, and what was done).
    #[error("{what}: {err}")]
    Io { what: String, err: std::io::Error },
    #[error("admission lock {}: {err}", path.display())]
    Lock {
        path: std::path::PathBuf,
        err: nix::errno::Errno,
    },
    #[error(transparent)]
    Gpus(#[from] NvmlError),
    /// The state root is not vgpu's, or `containers/` cannot be made.
    #[error(transparent)]
    StateRoot(#[from] PrepareError),
}

/// [`AdmissionError::Full`]'s line: the GPU, the sum and the figure it passes.
fn full_line(
    index: u32,
    uuid: &str,
    asked: u64,
    here: &Committed,
    total: u64,
    reserve: u64,
) -> String {
    let room = total.saturating_sub(reserve);
    let others = here.total();
    let sum = others.saturating_add(asked);
    let what = if reserve > 0 {
        format!(
            "the {} it has for quotas ({} less a reserve of {})",
            format_bytes(room),
            format_bytes(total),
            format_bytes(reserve)
        )
    } else {
        format!("its {}", format_bytes(total))
    };
    // Oversubscribe quotas count here in full: say so, or the figure looks wrong to whoever knows their
    // memory pages.
    let over = if here.oversubscribe > 0 && here.plain > 0 {
        format!(
            ", {} of it oversubscribe quotas, which may all be device memory",
            format_bytes(here.oversubscribe)
        )
    } else if here.oversubscribe > 0 {
        " of oversubscribe quotas, which may all be device memory".to_string()
    } else {
        String::new()
    };
    format!(
        "admission: GPU {index} ({uuid}) would have {} of quotas committed ({} already{over}, {} asked for), more than {what}; set allow_overcommit = true in the vgpu config to allow it",
        format_bytes(sum),
        format_bytes(others),
        format_bytes(asked),
    )
}

/// What the quotas of the live containers commit on one GPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Committed {
    /// Quotas of plain and spill containers: device memory they are promised.
    pub plain: u64,
    /// Quotas of oversubscribe containers. Their `cuMemAlloc` memory pages, but pools, VMM, arrays,
    /// graphs, contexts and modules stay device memory in that mode (docs/libvgpu.md), so each may hold
    /// its whole quota on the device.
    pub oversubscribe: u64,
    /// The compute requests of the containers with a share, percent (a limit alone counts as its
    /// request: `GpuSettings::request_limit`).
    pub requests: u32,
    /// Some container here asked for a request of its own (not a limit alone): the requests are
    /// promised, so they must fit.
    pub explicit_requests: bool,
}

impl Committed {
    fn add(&mut self, bytes: u64, oversubscribe: bool) {
        let n = if oversubscribe {
            &mut self.oversubscribe
        } else {
            &mut self.plain
        };
        *n = n.saturating_add(bytes);
    }

    fn total(&self) -> u64 {
        self.plain.saturating_add(self.oversubscribe)
    }

    /// Counts a GPU's compute request, when it has a share.
    fn add_share(&mut self, s: &GpuSettings) {
        if let Some((request, _)) = s.request_limit() {
            self.requests = self.requests.saturating_add(request);
            self.explicit_requests |= s.compute_request.is_some();
        }
    }
}

/// What the quotas of the live containers commit on each GPU (by UUID), `except` one container (the one
/// being created: its own earlier state is replaced, not added), read through the host tools' one reader of
/// the state root (`crate::inventory`: no link followed, no FIFO waited on). Folders whose limits file
/// cannot be read are counted as nothing and named in `unreadable`.
pub fn committed(
    root: &StateRoot,
    except: &str,
) -> Result<(BTreeMap<String, Committed>, Vec<String>), AdmissionError> {
    let mut sum: BTreeMap<String, Committed> = BTreeMap::new();
    let mut unreadable = Vec::new();
    let containers = inventory::containers(root).map_err(|err| AdmissionError::Io {
        what: format!("admission: {}", root.root().display()),
        err,
    })?;
    // State left by a killed create holds no room (`crate::abandoned`).
    for c in containers
        .into_iter()
        .filter(|c| c.id() != except && !crate::abandoned::container_abandoned(c))
    {
        match &c.limits {
            Ok(l) => {
                // A GPU listed for its compute share alone commits no memory.
                for d in &l.devices {
                    let here = sum.entry(d.uuid.clone()).or_default();
                    if let Some(bytes) = d.settings.memory_limit {
                        here.add(bytes, d.settings.memory.is_oversubscribe());
                    }
                    here.add_share(&d.settings);
                }
            }
            Err(_) => unreadable.push(c.dir.id),
        }
    }
    Ok((sum, unreadable))
}

/// The refusal, if any, of a container's GPUs and what it asks on each (`asked`) given what is committed:
/// one line naming the GPU, the sum and the figure.
///
/// Every quota counts in full wherever a plain (or spill) quota is at stake on the GPU, committed or asked
/// for: each container may hold its whole quota as device memory, oversubscribe ones included. Only
/// oversubscribe quotas among themselves may add up past the GPU (they opted into sharing it by paging);
/// each is still at most the GPU (`vgpu_oci::plan`).
pub fn check(
    asked: &[GpuRequest],
    gpus: &[HostGpu],
    committed: &BTreeMap<String, Committed>,
    policy: Policy,
) -> Result<(), AdmissionError> {
    if policy.overcommit {
        return Ok(());
    }
    check_requests(asked, gpus, committed)?;
    for (g, asked) in asked
        .iter()
        .filter_map(|g| Some((g, g.settings.memory_limit?)))
    {
        let asks_oversubscribe = g.settings.memory.is_oversubscribe();
        let Some(host) = gpus.iter().find(|h| h.uuid == g.uuid) else {
            return Err(AdmissionError::GpuGone {
                uuid: g.uuid.clone(),
            });
        };
        let here = committed.get(&g.uuid).copied().unwrap_or_default();
        if asks_oversubscribe && here.plain == 0 {
            continue;
        }
        let room = host.total_memory.saturating_sub(policy.reserve);
        let others = here.total();
        let sum = others.saturating_add(asked);
        if sum > room {
            return Err(AdmissionError::Full {
                index: host.index,
                uuid: g.uuid.clone(),
                asked,
                committed: here,
                total: host.total_memory,
                reserve: policy.reserve,
            });
        }
    }
    Ok(())
}

/// The refusal, if any, of a container's compute requests given what is committed: on each GPU where
/// it or a committed container asks for a request of its own, the requests (a limit alone counting as
/// its request) must fit in the GPU's whole time.
fn check_requests(
    asked: &[GpuRequest],
    gpus: &[HostGpu],
    committed: &BTreeMap<String, Committed>,
) -> Result<(), AdmissionError> {
    for g in asked {
        let mut mine = Committed::default();
        mine.add_share(&g.settings);
        if mine.requests == 0 {
            continue;
        }
        let here = committed.get(&g.uuid).copied().unwrap_or_default();
        if !(mine.explicit_requests || here.explicit_requests) {
            continue;
        }
        if here.requests.saturating_add(mine.requests) > crate::division::WHOLE {
            let index = gpus
                .iter()
                .find(|h| h.uuid == g.uuid)
                .map_or(g.index as u32, |h| h.index);
            return Err(AdmissionError::ComputeFull {
                index,
                uuid: g.uuid.clone(),
                asked: mine.requests,
                committed: here.requests,
            });
        }
    }
    Ok(())
}

/// Admits what container `id` asks on its GPUs (`asked`), or refuses it. The returned guard must be held
/// until the container's state is in place.
pub fn admit(
    root: &StateRoot,
    policy: Policy,
    id: &str,
    asked: &[GpuRequest],
    gpus: impl FnOnce() -> Result<Vec<HostGpu>, NvmlError>,
) -> Result<Admitted, AdmissionError> {
    if policy.overcommit {
        return Ok(Admitted { _lock: None });
    }
    // A state root that is not vgpu's gets nothing written into it, the lock file neither.
    root.prepare_containers()?;
    let lock = lock(root)?;
    let collected = crate::abandoned::collect(root);
    if !collected.is_empty() {
        tracing::info!(removed = %collected.join(", "), "admission: collected state of killed creates");
    }
    let (committed, unreadable) = committed(root, id)?;
    if !unreadable.is_empty() {
        // Not fatal: the garbage collector or `vgpuctl status` reports such folders.
        tracing::warn!(
            "admission: limits of container(s) {} cannot be read; counted as no quota",
            unreadable.join(", ")
        );
    }
    check(asked, &gpus()?, &committed, policy)?;
    Ok(Admitted { _lock: Some(lock) })
}

/// The node-level lock: `<state_root>/admission.lock`, never through a symbolic link.
fn lock(root: &StateRoot) -> Result<Flock<File>, AdmissionError> {
    std::fs::create_dir_all(root.root()).map_err(|err| AdmissionError::Io {
        what: format!("cannot create {}", root.root().display()),
        err,
    })?;
    let path = root.root().join(LOCK_FILE_NAME);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(0o600)
        .custom_flags((nix::fcntl::OFlag::O_NOFOLLOW | nix::fcntl::OFlag::O_CLOEXEC).bits())
        .open(&path)
        .map_err(|err| AdmissionError::Io {
            what: format!("admission lock {}", path.display()),
            err,
        })?;
    Flock::lock(f, FlockArg::LockExclusive).map_err(|(_, err)| AdmissionError::Lock {
        path: path.clone(),
        err,
    })
}

#[cfg(test)]
mod tests;
