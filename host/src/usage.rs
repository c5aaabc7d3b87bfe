//! The state root's figures, as the monitor and `vgpuctl update` read them: every container's limits (with
//! the Kubernetes names and PID namespace the hook recorded) and, per GPU, its ledger's total, the sum of
//! its slots, usage by kind and the live slots' owners. Read through the host tools' one reader of the state
//! root (`inventory`: no link followed, never blocking, nothing mapped, no lock taken; a missing ledger is no
//! usage, not an error), so the monitor sees what `vgpuctl status`, admission and the garbage collector see.
//! Containers HAMi's device plugin started with vgpu's library have no state under the state root: they are
//! made from HAMi's per-container folders ([`from_hami`], read by `crate::hami`), marked [`Origin::Hami`],
//! and given the quota and init their containerd bundle holds where one is found ([`join_host_quotas`]).
//! Not here: NVML, which process is whose (`attribution`), the monitor's metrics and decisions.

use crate::inventory::{self, LedgerRead};
use crate::state_root::StateRoot;
use vgpu_ledger::region::KINDS;
use vgpu_ledger::KubeNames;

pub mod hami;

/// Where a container's state was read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Origin {
    /// vgpu's state root: the host wrote its limits file (the quota the monitor may enforce).
    #[default]
    StateRoot,
    /// HAMi's per-container folder (`crate::hami`): without its `bundle`, no file of the host's holds its
    /// quota, only what the library wrote into the ledger, a file the tenant can write: reported, never
    /// enforced. With it, the quota is its OCI spec's ([`with_host_quota`]), enforced.
    Hami {
        /// The pod's UID and the container's name, as the folder's name gives them.
        pod_uid: String,
        container: String,
        /// The folder on the host.
        dir: std::path::PathBuf,
        /// The bundle whose OCI spec holds its quota (`hami::bundle`: the host's record, enforced on
        /// like a state root's limits file); None: none found, reported only.
        bundle: Option<std::path::PathBuf>,
    },
}

/// One container's state.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ContainerState {
    /// The container id; `hami/<pod UID>_<container>` for a container of HAMi's folders.
    pub id: String,
    /// Where its state was read (vgpu's state root, or HAMi's folders: report only).
    pub origin: Origin,
    pub names: Option<KubeNames>,
    /// The name Docker gave it, when it has no Kubernetes names and dockerd knows it (the monitor's
    /// `docker::Cache`).
    pub docker_name: Option<String>,
    /// PID namespace inode of the container as the host sees it (none until the hook recorded it).
    pub pid_ns: Option<u64>,
    /// Host PID and start time of its init process, as recorded with the namespace.
    pub init_pid: Option<u32>,
    pub init_start_time: Option<u64>,
    /// Its cgroup v2 path, recorded at creation (none: not recorded, see `vgpu_ledger::Limits::cgroup`).
    pub cgroup: Option<String>,
    /// Its recorded init process still lives in its recorded namespace (`mark_live`): only then do its
    /// recorded namespace and cgroup name any process (a gone container's namespace inode is reused). A
    /// container of HAMi's folders records no init: it is live while a process holds a slot of its ledgers.
    pub live: bool,
    pub gpus: Vec<GpuState>,
    /// Live updates made to it (`vgpuctl update`) and the last one's time, Unix seconds.
    pub updates: u64,
    pub updated_at: Option<u64>,
    /// Why the limits file could not be used.
    pub error: Option<String>,
}

/// One GPU's quota and ledger.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuState {
    /// The container's GPU index (its CUDA ordinal inside).
    pub index: u32,
    pub uuid: String,
    /// Bytes, from limits.json (what the library enforces); None: no memory quota (a compute share
    /// alone).
    pub limit: Option<u64>,
    /// The compute share's limit (its cap) in percent, from limits.json (None: none, a request alone, or
    /// the policy `disable`).
    pub compute_limit: Option<u32>,
    /// The compute share's request (its floor) in percent, as limits.json gives it (None: none, a limit
    /// alone, or the policy `disable`). A limit alone is its own request: [`GpuState::request_limit`].
    pub compute_request: Option<u32>,
    /// The library's pacing window for the share, ms (None: its default).
    pub compute_window_ms: Option<u32>,
    /// The quota before `vgpuctl update` lowered it (limits.json's `shrunk_from`): usage above the quota
    /// but within this is a pending shrink (the watchdog).
    pub shrunk_from: Option<u64>,
    /// What the container held on the GPU at that shrink, as `vgpuctl update` measured it from NVML
    /// (limits.json's `held_at_shrink`; none in files from before it existed): the watchdog's starting
    /// tolerance for the pending shrink (the monitor's `watchdog::Shrinks`).
    pub held_at_shrink: Option<u64>,
    /// Its quota's memory mode is `oversubscribe` (limits.json): the time-quanta arbiter takes it in.
    pub oversubscribe: bool,
    /// The ledger's compute bucket (`COMPUTE_AREA`): GPU time charged, time held back, launches.
    pub compute: vgpu_ledger::region::ComputeSnapshot,
    /// The ledger's total (its commit word); 0 with no ledger yet.
    pub total: u64,
    /// The sum of its slots' counters.
    pub slots_sum: u64,
    /// Bytes spilled past the quota into the spill budget (spill mode; not part of `total`).
    pub spilled: u64,
    /// Bytes per kind (`Kind::index()`).
    pub by_kind: [u64; KINDS],
    /// Live slots' owners: (PID inside the owner's namespace, that namespace's inode).
    pub owners: Vec<(u32, u64)>,
    /// Allocations the quota refused, as the container's library counted them in the ledger.
    pub refusals: u64,
    /// Why the ledger could not be read (`None` also when there is none yet).
    pub error: Option<String>,
}

/// Reads every container under `root`; what cannot be read is recorded in the entry, never fatal.
pub fn read(root: &StateRoot) -> std::io::Result<Vec<ContainerState>> {
    Ok(inventory::containers(root)?.iter().map(container).collect())
}

/// Sets each container's `live` (see [`ContainerState::init_alive`]); one of HAMi's folders is live while
/// a process holds a slot of one of its ledgers (the kernel's locks say so, whatever the file's bytes).
pub fn mark_live(containers: &mut [ContainerState], alive: impl Fn(u32, u64, Option<u64>) -> bool) {
    for c in containers {
        c.live = match c.origin {
            Origin::StateRoot => c.init_alive(&alive),
            Origin::Hami { bundle: None, .. } => c.gpus.iter().any(|g| !g.owners.is_empty()),
            Origin::Hami {
                bundle: Some(_), ..
            } => c.init_alive(&alive),
        };
    }
}

impl ContainerState {
    /// The monitor may act on it: its quota is the host's (a state root's limits file, or a HAMi
    /// container's bundle spec).
    pub fn enforced(&self) -> bool {
        matches!(
            self.origin,
            Origin::StateRoot
                | Origin::Hami {
                    bundle: Some(_),
                    ..
                }
        )
    }
}

impl GpuState {
    /// The share's request and limit, percent, as `crate::division` takes them (a limit alone is
    /// its own request, a request alone has the limit 100); None: no share.
    pub fn request_limit(&self) -> Option<(u32, u32)> {
        if self.compute_request.is_none() && self.compute_limit.is_none() {
            return None;
        }
        let limit = self.compute_limit.unwrap_or(crate::division::WHOLE);
        Some((self.compute_request.unwrap_or(limit).min(limit), limit))
    }
}

impl ContainerState {
    /// Its recorded init process runs in its recorded PID namespace with its recorded start time
    /// (`alive` is `vgpu_host::procs::init_alive` but in tests); never before the owner was recorded.
    pub fn init_alive(&self, alive: impl Fn(u32, u64, Option<u64>) -> bool) -> bool {
        match (self.init_pid, self.pid_ns) {
            (Some(pid), Some(ns)) => alive(pid, ns, self.init_start_time),
            _ => false,
        }
    }
}

fn container(c: &inventory::Container) -> ContainerState {
    let mut s = ContainerState {
        id: c.id().to_string(),
        ..Default::default()
    };
    match &c.limits {
        Ok(limits) => {
            s.names = limits.kubernetes.clone();
            s.pid_ns = limits.pid_ns;
            s.init_pid = limits.init_pid;
            s.init_start_time = limits.init_start_time;
            s.cgroup = limits.cgroup.clone();
            s.updates = limits.updates;
            s.updated_at = limits.updated_at;
            s.gpus = c.ledgers().into_iter().map(|(d, l)| gpu(d, l)).collect();
        }
        Err(e) => s.error = Some(e.to_string()),
    }
    s
}

fn gpu(d: &vgpu_ledger::DeviceLimit, ledger: LedgerRead) -> GpuState {
    let mut g = GpuState {
        index: d.index,
        uuid: d.uuid.clone(),
        limit: d.settings.memory_limit,
        compute_limit: d.settings.compute_share(),
        compute_request: d
            .settings
            .compute_request
            .filter(|_| d.settings.request_limit().is_some()),
        compute_window_ms: d.settings.compute_window_ms,
        shrunk_from: d.shrunk_from,
        held_at_shrink: d.held_at_shrink,
        oversubscribe: matches!(
            d.settings.memory,
            vgpu_ledger::MemoryMode::Oversubscribe { .. }
        ),
        ..Default::default()
    };
    match ledger {
        LedgerRead::Missing => {}
        LedgerRead::Read(snap) => from_snapshot(&mut g, &snap),
        LedgerRead::Unreadable(e) => g.error = Some(e),
    }
    g
}

/// A ledger's figures into `g`: its total, refusals, spill, compute bucket, usage by kind and live owners.
fn from_snapshot(g: &mut GpuState, snap: &vgpu_ledger::Snapshot) {
    g.total = snap.used;
    g.refusals = snap.refusals;
    g.spilled = snap.spilled;
    g.compute = snap.compute;
    for s in &snap.slots {
        for (k, u) in s.usage.iter().enumerate() {
            g.by_kind[k] = g.by_kind[k].saturating_add(*u);
        }
        g.slots_sum = g.slots_sum.saturating_add(s.total());
        if s.alive {
            g.owners.push((s.pid, s.pid_ns));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits_file::WriteLimits;
    use vgpu_ledger::{DeviceLimit, Kind, Ledger, Limits};

    #[test]
    fn reads_quota_kinds_owners_and_names_and_refuses_odd_files() {
        let d = tempfile::tempdir().unwrap();
        let root = StateRoot::new(d.path().to_path_buf());
        let uuid = "GPU-fa4ec0de-0000-4000-8000-000000000000";
        std::fs::create_dir_all(root.ledgers_dir("c1").unwrap()).unwrap();
        crate::walk::mark(&root.containers_dir()).unwrap();
        crate::walk::mark(&root.container_dir("c1").unwrap()).unwrap();
        let limits = Limits {
            version: vgpu_ledger::LIMITS_VERSION,
            container_id: "c1".into(),
            pid_ns: Some(42),
            init_pid: Some(1),
            init_start_time: None,
            cgroup: None,
            creator: None,
            devices: vec![DeviceLimit {
                index: 0,
                uuid: uuid.into(),
                settings: vgpu_ledger::GpuSettings {
                    memory_limit: Some(1 << 30),
                    compute_limit: Some(40),
                    ..Default::default()
                },
                ledger: vgpu_ledger::layout::relative_ledger_path(uuid).unwrap(),
                shrunk_from: None,
                held_at_shrink: None,
            }],
            kubernetes: Some(KubeNames {
                namespace: "ns".into(),
                pod: "p".into(),
                container: "c".into(),
            }),
            updates: 0,
            updated_at: None,
        };
        limits
            .write_atomic(&root.limits_path("c1").unwrap())
            .unwrap();
        // No ledger yet: quota only.
        let s = read(&root).unwrap();
        assert_eq!((s[0].gpus[0].limit, s[0].gpus[0].total), (Some(1 << 30), 0));
        assert_eq!(s[0].gpus[0].compute_limit, Some(40));
        // A limit alone is its own request.
        assert_eq!(s[0].gpus[0].compute_request, None);
        assert_eq!(s[0].gpus[0].request_limit(), Some((40, 40)));
        assert_eq!(s[0].gpus[0].error, None);

        let path = root.ledger_path("c1", uuid).unwrap();
        let ledger = Ledger::open_or_create(&path, uuid, 1 << 30).unwrap();
        let slot = ledger.attach().unwrap();
        ledger
            .charge(&slot, Kind::Data, 100 << 20, 1 << 30)
            .unwrap();
        let before = std::fs::read(&path).unwrap();
        let s = read(&root).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), before, "read-only");
        let g = &s[0].gpus[0];
        assert_eq!((g.total, g.slots_sum), (100 << 20, 100 << 20));
        assert_eq!(g.by_kind[Kind::Data.index()], 100 << 20);
        assert_eq!(g.owners, vec![(std::process::id(), own_ns())]);
        assert_eq!(s[0].names.as_ref().unwrap().pod, "p");
        assert_eq!(s[0].pid_ns, Some(42));
        drop(slot);

        // A FIFO in place of the ledger or the limits file is refused without blocking.
        std::fs::remove_file(&path).unwrap();
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
        let s = read(&root).unwrap();
        assert!(s[0].gpus[0]
            .error
            .as_deref()
            .unwrap()
            .contains("not a regular file"));
        let lp = root.limits_path("c1").unwrap();
        std::fs::remove_file(&lp).unwrap();
        nix::unistd::mkfifo(&lp, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
        let s = read(&root).unwrap();
        assert!(
            s[0].error
                .as_deref()
                .unwrap()
                .contains("not a regular file"),
            "{s:?}"
        );
        // A symlink is not followed.
        std::fs::remove_file(&lp).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", &lp).unwrap();
        assert!(read(&root).unwrap()[0].error.is_some());
    }

    pub(super) fn own_ns() -> u64 {
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata("/proc/self/ns/pid").unwrap())
    }
}
