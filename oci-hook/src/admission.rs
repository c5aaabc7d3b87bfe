//! Quota admission: a container is refused when its quota on a GPU would make the quotas of that GPU's
//! containers add up past the GPU's memory (less a reserve the node keeps), unless the node allows
//! overcommit. Not here: the quota itself (`crate::plan`), writing the state (`crate::provision`).
//!
//! The containers counted are the state root's container folders: a container's quota is committed from
//! its provisioning until its poststop (or the garbage collector) removes its folder. Deciding and
//! provisioning happen under one node-level lock (`<state_root>/admission.lock`, `flock`), so two
//! containers created at once cannot both take the last room; the lock is held only from the decision to
//! the folder's rename into place, never across the container's life.

use crate::plan::Plan;
use crate::provision::ProvisionError;
use nix::fcntl::{Flock, FlockArg};
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use vgpu_host::config::Config;
use vgpu_host::inventory;
use vgpu_host::nvml::{HostGpu, NvmlError};
use vgpu_host::state_root::StateRoot;
use vgpu_ledger::format_bytes;

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
    /// The plan names a GPU NVML no longer lists.
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
    StateRoot(#[from] ProvisionError),
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
}

/// What the quotas of the live containers commit on each GPU (by UUID), `except` one container (the one
/// being created: its own earlier state is replaced, not added), read through the host tools' one reader of
/// the state root (`vgpu_host::inventory`: no link followed, no FIFO waited on). Folders whose limits file
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
    // State left by a killed create holds no room (`vgpu_host::abandoned`).
    for c in containers
        .into_iter()
        .filter(|c| c.id() != except && !vgpu_host::abandoned::container_abandoned(c))
    {
        match &c.limits {
            Ok(l) => {
                // A GPU listed for its compute share alone commits no memory.
                for d in &l.devices {
                    if let Some(bytes) = d.settings.memory_limit {
                        sum.entry(d.uuid.clone())
                            .or_default()
                            .add(bytes, d.settings.memory.is_oversubscribe());
                    }
                }
            }
            Err(_) => unreadable.push(c.dir.id),
        }
    }
    Ok((sum, unreadable))
}

/// The refusal, if any, of a plan given what is committed: one line naming the GPU, the sum and the figure.
///
/// Every quota counts in full wherever a plain (or spill) quota is at stake on the GPU, committed or asked
/// for: each container may hold its whole quota as device memory, oversubscribe ones included. Only
/// oversubscribe quotas among themselves may add up past the GPU (they opted into sharing it by paging);
/// each is still at most the GPU (`plan`).
pub fn check(
    plan: &Plan,
    gpus: &[HostGpu],
    committed: &BTreeMap<String, Committed>,
    policy: Policy,
) -> Result<(), AdmissionError> {
    if policy.overcommit {
        return Ok(());
    }
    for (g, asked) in plan
        .gpus
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

/// Admits `plan` for container `id`, or refuses it. The returned guard must be held until the
/// container's state is in place.
pub fn admit(
    root: &StateRoot,
    policy: Policy,
    id: &str,
    plan: &Plan,
    gpus: impl FnOnce() -> Result<Vec<HostGpu>, NvmlError>,
) -> Result<Admitted, AdmissionError> {
    if policy.overcommit {
        return Ok(Admitted { _lock: None });
    }
    // A state root that is not vgpu's gets nothing written into it, the lock file neither.
    crate::provision::containers_dir(root)?;
    let lock = lock(root)?;
    let collected = vgpu_host::abandoned::collect(root);
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
    check(plan, &gpus()?, &committed, policy)?;
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
mod tests {
    use super::*;
    use crate::plan::PlannedGpu;
    use vgpu_ledger::GpuSettings;

    const GIB: u64 = 1 << 30;

    fn gpu(uuid: &str, total: u64) -> HostGpu {
        HostGpu {
            index: 0,
            uuid: uuid.into(),
            total_memory: total,
            minor: Some(0),
        }
    }

    fn plan(uuid: &str, limit: u64) -> Plan {
        Plan {
            gpus: vec![PlannedGpu {
                index: 0,
                uuid: uuid.into(),
                settings: GpuSettings {
                    memory_limit: Some(limit),
                    ..Default::default()
                },
            }],
            kubernetes: None,
        }
    }

    fn plain(bytes: u64) -> Committed {
        Committed {
            plain: bytes,
            oversubscribe: 0,
        }
    }

    const STRICT: Policy = Policy {
        overcommit: false,
        reserve: 0,
    };

    // Regression: three 12 GiB quotas were admitted on one 16 GiB GPU; the third container's allocations
    // then failed below its quota.
    #[test]
    fn a_quota_that_would_pass_the_gpu_is_refused_with_the_figures() {
        let gpus = [gpu("GPU-a", 16 * GIB)];
        let mut c = BTreeMap::new();
        check(&plan("GPU-a", 12 * GIB), &gpus, &c, STRICT).unwrap();
        c.insert("GPU-a".to_string(), plain(12 * GIB));
        let e = check(&plan("GPU-a", 12 * GIB), &gpus, &c, STRICT).unwrap_err();
        assert!(
            matches!(e, AdmissionError::Full { asked, committed, .. }
                if asked == 12 * GIB && committed.plain == 12 * GIB),
            "{e}"
        );
        // The line is the contract: the GPU, the sum, the figure it passes.
        let e = e.to_string();
        assert!(
            e.contains("GPU-a") && e.contains("24.0 GiB") && e.contains("its 16.0 GiB"),
            "{e}"
        );
        assert!(!e.contains('\n'));
        check(&plan("GPU-a", 4 * GIB), &gpus, &c, STRICT).unwrap();
        // other GPUs' quotas do not count
        check(
            &plan("GPU-b", 16 * GIB),
            &[gpu("GPU-b", 16 * GIB)],
            &c,
            STRICT,
        )
        .unwrap();
    }

    #[test]
    fn a_compute_share_alone_commits_no_memory_and_is_never_refused() {
        let gpus = [gpu("GPU-a", 16 * GIB)];
        let mut c = BTreeMap::new();
        c.insert("GPU-a".to_string(), plain(16 * GIB));
        let mut share = plan("GPU-a", GIB);
        share.gpus[0].settings.memory_limit = None;
        share.gpus[0].settings.compute_limit = Some(30);
        check(&share, &gpus, &c, STRICT).unwrap();
        // provisioned, it counts as nothing against a memory quota
        let d = tempfile::tempdir().unwrap();
        let root = StateRoot::new(d.path().to_path_buf());
        let uuid = "GPU-fa4ec0de-0000-4000-8000-000000000000";
        share.gpus[0].uuid = uuid.into();
        crate::provision::provision(&root, "s1", &share, Default::default(), None).unwrap();
        let (sum, unreadable) = committed(&root, "x").unwrap();
        assert!(unreadable.is_empty());
        assert_eq!(sum.get(uuid), None);
        check(&plan(uuid, 16 * GIB), &[gpu(uuid, 16 * GIB)], &sum, STRICT).unwrap();
    }

    #[test]
    fn the_reserve_is_kept_and_overcommit_allows_anything() {
        let gpus = [gpu("GPU-a", 16 * GIB)];
        let c = BTreeMap::new();
        let reserve = Policy {
            overcommit: false,
            reserve: GIB,
        };
        assert!(check(&plan("GPU-a", 16 * GIB), &gpus, &c, reserve).is_err());
        check(&plan("GPU-a", 15 * GIB), &gpus, &c, reserve).unwrap();
        let over = Policy {
            overcommit: true,
            reserve: GIB,
        };
        let mut c = BTreeMap::new();
        c.insert("GPU-a".to_string(), plain(40 * GIB));
        check(&plan("GPU-a", 16 * GIB), &gpus, &c, over).unwrap();
    }

    fn with_mode(uuid: &str, limit: u64, mode: vgpu_ledger::MemoryMode) -> Plan {
        let mut p = plan(uuid, limit);
        p.gpus[0].settings.memory = mode;
        p
    }

    fn over(uuid: &str, limit: u64) -> Plan {
        with_mode(
            uuid,
            limit,
            vgpu_ledger::MemoryMode::Oversubscribe { reserve: 0 },
        )
    }

    #[test]
    fn oversubscribe_quotas_may_sum_past_the_gpu_among_themselves() {
        let gpus = [gpu("GPU-a", 16 * GIB)];
        let mut c = BTreeMap::new();
        c.insert(
            "GPU-a".to_string(),
            Committed {
                plain: 0,
                oversubscribe: 12 * GIB,
            },
        );
        check(&over("GPU-a", 12 * GIB), &gpus, &c, STRICT).unwrap();
        // a spill container's device quota is admitted as a plain one
        let spill = with_mode(
            "GPU-a",
            12 * GIB,
            vgpu_ledger::MemoryMode::Spill { spill_limit: GIB },
        );
        assert!(check(&spill, &gpus, &c, STRICT).is_err());
    }

    // Regression (issue 25 item 6): oversubscribe quotas committed nothing, though pools, VMM, arrays,
    // graphs, contexts and modules stay device memory in that mode: a 16 GiB oversubscribe container held
    // 15 GiB of pool memory, a plain 12 GiB container was admitted beside it and ran out at 4 GiB. Where a
    // plain quota is at stake every quota on the GPU counts in full, each being device memory it can hold.
    #[test]
    fn oversubscribe_quotas_count_in_full_where_a_plain_quota_is_at_stake() {
        let d = tempfile::tempdir().unwrap();
        let root = StateRoot::new(d.path().to_path_buf());
        let uuid = "GPU-fa4ec0de-0000-4000-8000-000000000000";
        let gpus = [gpu(uuid, 16 * GIB)];
        crate::provision::provision(&root, "o1", &over(uuid, 16 * GIB), Default::default(), None)
            .unwrap();
        let (sum, _) = committed(&root, "none").unwrap();
        // a plain container beside the oversubscribe one is refused: the 16 GiB may all be pool memory
        assert!(check(&plan(uuid, 12 * GIB), &gpus, &sum, STRICT).is_err());
        // another oversubscribe one is not: they page each other
        check(&over(uuid, 16 * GIB), &gpus, &sum, STRICT).unwrap();
        // with a plain quota on the GPU, an oversubscribe quota that does not fit beside it is refused too
        let d = tempfile::tempdir().unwrap();
        let root = StateRoot::new(d.path().to_path_buf());
        crate::provision::provision(&root, "p1", &plan(uuid, 12 * GIB), Default::default(), None)
            .unwrap();
        let (sum, _) = committed(&root, "none").unwrap();
        assert!(check(&over(uuid, 8 * GIB), &gpus, &sum, STRICT).is_err());
        check(&over(uuid, 4 * GIB), &gpus, &sum, STRICT).unwrap();
    }

    // Regression: admission read limits files with the plain loader, so a FIFO left where a limits file
    // was (the container folder is host-only, but a careless or hostile host process can leave one) blocked
    // every create on the node, under the node lock, until a writer came.
    #[test]
    fn a_fifo_where_a_limits_file_was_is_unreadable_not_waited_on() {
        let d = tempfile::tempdir().unwrap();
        let root = StateRoot::new(d.path().to_path_buf());
        let p = plan("GPU-fa4ec0de-0000-4000-8000-000000000000", 3 * GIB);
        for id in ["c1", "c2"] {
            crate::provision::provision(&root, id, &p, Default::default(), None).unwrap();
        }
        let lp = root.limits_path("c1").unwrap();
        std::fs::remove_file(&lp).unwrap();
        nix::unistd::mkfifo(&lp, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let r = root.clone();
        std::thread::spawn(move || tx.send(committed(&r, "new").unwrap()));
        let (sum, unreadable) = rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("admission blocked on a FIFO");
        assert_eq!(unreadable, vec!["c1".to_string()]);
        assert_eq!(
            sum.values().copied().collect::<Vec<_>>(),
            vec![plain(3 * GIB)]
        );
    }

    #[test]
    fn committed_counts_live_folders_but_not_the_container_being_created() {
        let d = tempfile::tempdir().unwrap();
        let root = StateRoot::new(d.path().to_path_buf());
        let p = plan("GPU-fa4ec0de-0000-4000-8000-000000000000", 3 * GIB);
        for id in ["c1", "c2"] {
            crate::provision::provision(&root, id, &p, Default::default(), None).unwrap();
        }
        let (sum, bad) = committed(&root, "c2").unwrap();
        assert_eq!(
            sum.values().copied().collect::<Vec<_>>(),
            vec![plain(3 * GIB)]
        );
        assert!(bad.is_empty());
        let (sum, _) = committed(&root, "other").unwrap();
        assert_eq!(
            sum.values().copied().collect::<Vec<_>>(),
            vec![plain(6 * GIB)]
        );
    }
}
