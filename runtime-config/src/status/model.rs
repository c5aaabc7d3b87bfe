//! The model of `vgpuctl status`: per container and GPU its quota, usage by kind, compute share and
//! processes, and per GPU what the quotas commit against what it has and whether HMM/ATS is on, as one
//! value (`--json` writes it as it is). Read from the state root through the host tools' one reader (`vgpu_host::inventory`: nothing
//! followed, waited on, mapped, locked or written, so looking never changes what it looks at; a missing
//! ledger is no usage, not an error). A ledger's processes are named by the PID inside their container;
//! their host PIDs are found in `/proc` (the monitor's `procs`). Containers HAMi's device plugin started with
//! vgpu's library are listed from HAMi's per-container folders (`note_hami`, `vgpu_host::hami`), marked
//! `hami`: their quota is the one their library wrote in the ledger (no file of the host's holds it), and
//! they are not in the per-GPU totals (HAMi's scheduler commits them, not vgpu's admission). Not here: the
//! table (`render`), HAMi's containers listed (`hami_folders`) and their bundles' quotas (`hami_quota`),
//! memory no process's figure shows (`unattributed`).
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::io::Result;
use vgpu_host::inventory::{self, Entry, LedgerRead};
use vgpu_host::state_root::StateRoot;
use vgpu_ledger::{Kind, KubeNames};

use vgpu_host::nvml::AddressingMode;
use vgpu_host::procs;

/// The version of `--json`'s shape: raised whenever a field changes meaning or goes away (added fields do
/// not raise it). 2: `schema_version`, `gpus` (per-GPU totals), `kubernetes`, processes' `host_pid`.
/// 3: a GPU's `quota` is null when it has a compute share and no memory quota; `compute` per GPU and
/// `compute_shares` per GPU total. (Added since, without a raise: a share's `request_percent` and the
/// totals' `compute_requests`.)
pub const SCHEMA_VERSION: u32 = 3;

#[derive(Debug, Serialize)]
pub struct Status {
    pub schema_version: u32,
    pub state_root: String,
    /// Per GPU: what the containers' quotas commit, what their ledgers hold, and what the GPU has.
    pub gpus: Vec<GpuTotal>,
    pub containers: Vec<Container>,
    /// Per oversubscribed GPU, the time-quanta arbiter's turns (holder, queue, grants, revocations), as
    /// `vgpuctl monitor` last wrote them; none while it does not run.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub turns: Vec<vgpu_monitor::turns::record::GpuTurns>,
    /// Per GPU NVML lists, its used memory that no process's NVML figure shows, and which containers
    /// likely hold it (`note_unattributed`); none without NVML.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unattributed: Vec<Unattributed>,
    /// What was skipped in HAMi's per-container folders (a link, a FIFO, a file of the wrong size or
    /// header, ...), or why the folder could not be read: one line each.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hami_skipped: Vec<String>,
    /// HAMi's folders as read (`note_hami`), for `note_unattributed`.
    #[serde(skip)]
    hami_folders: Vec<vgpu_host::hami::Folder>,
}

/// Where a container of HAMi's per-container folders was found.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct Hami {
    /// The pod's UID and the container's name, as the folder's name `<pod UID>_<container>` gives them.
    pub pod_uid: String,
    pub container: String,
    /// The folder on the host.
    pub folder: String,
    /// The OCI spec whose quota replaces the ledger's (`note_hami_quotas`: its containerd bundle's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spec: Option<String>,
}

/// One GPU's used memory against NVML's per-process figures, as `vgpuctl monitor` measures it
/// (`vgpu_monitor::unattributed`), read once for the command.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct Unattributed {
    /// NVML's index and UUID.
    pub index: u32,
    pub uuid: String,
    /// NVML's used memory, the driver's reserve within it, and every listed process's figure added up.
    pub used: u64,
    pub reserved: u64,
    pub processes: u64,
    /// `used − reserved − processes`: what no process's figure shows (exported handles kept after their
    /// release, managed memory, the driver's references).
    pub unattributed: u64,
    /// Past `[monitor] unattributed_threshold` (the monitor logs it once it lasts).
    pub past_threshold: bool,
    /// The live containers whose ledgers charge past their processes' NVML figures on this GPU, largest
    /// first: the likely holders (a hint from files the tenants write). Only past the threshold.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub likely_holders: Vec<LikelyHolder>,
}

/// A container that likely holds some of a GPU's unattributed memory.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct LikelyHolder {
    pub container_id: String,
    /// Its ledger's total on the GPU, and what NVML shows its processes holding there.
    pub charged: u64,
    pub nvml: u64,
    /// `charged − nvml`, at most the GPU's unattributed memory.
    pub likely: u64,
}

/// One GPU's totals over the containers that have a quota on it.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct GpuTotal {
    pub uuid: String,
    pub containers: usize,
    /// The sum of their quotas (what admission checks against the GPU).
    pub committed: u64,
    /// The sum of their compute shares' limits, percent (100 for a request alone).
    pub compute_shares: u32,
    /// The sum of their compute shares' requests, percent (a limit alone is its own request; past 100
    /// no one can get its floor).
    pub compute_requests: u32,
    /// The sum of what their ledgers hold.
    pub used: u64,
    /// The GPU's memory, from NVML (None when NVML is not there).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub physical: Option<u64>,
    /// Whether the GPU's kernels can reach pageable host memory, from NVML
    /// (`nvmlDeviceGetAddressingMode`): `none`, `hmm` or `ats`; absent when NVML cannot tell. Under `hmm`
    /// or `ats` the driver may move `malloc` memory onto the GPU with no call the quota sees
    /// (docs/libvgpu.md, "Pageable memory: HMM and ATS").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub addressing: Option<&'static str>,
}

#[derive(Debug, Serialize)]
pub struct Container {
    pub id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub init_pid: Option<u32>,
    /// Kubernetes namespace, pod and container, when a CRI runtime made it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<KubeNames>,
    /// The name Docker gave it (asked of dockerd: `note_docker_names`), when Docker made it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub docker_name: Option<String>,
    /// The name Podman gave it (its containers/storage record: `note_podman_names`), when Podman made it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub podman_name: Option<String>,
    /// Found in HAMi's per-container folders (`note_hami`): its id is `hami/<pod UID>_<container>`, its
    /// quota the one its library wrote in the ledger.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hami: Option<Hami>,
    /// Live updates made to it (`vgpuctl update`), and the last one's time (Unix seconds).
    #[serde(skip_serializing_if = "is_zero")]
    pub updates: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<u64>,
    /// Why this container's state could not be read (the others are still shown).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub gpus: Vec<Gpu>,
}

#[derive(Debug, Serialize)]
pub struct Gpu {
    pub index: u32,
    pub uuid: String,
    /// Bytes, from limits.json (what the library enforces); null: no memory quota (a compute share
    /// alone).
    pub quota: Option<u64>,
    /// Bytes charged in the ledger, all processes together.
    pub used: u64,
    /// Bytes `used` is past `quota`, when it is: after `vgpuctl update` lowered the quota below the
    /// container's use (a pending shrink: refused until freed) or a forced overrun.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub over_quota: Option<u64>,
    /// The quota `vgpuctl update` lowered, while usage is still above the new one.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub pending_shrink: bool,
    /// Bytes per kind (context, module, data, ...), all processes together; kinds at zero left out.
    pub by_kind: serde_json::Map<String, serde_json::Value>,
    /// The unified-memory mode: plain, spill or oversubscribe; `unknown` for a container of HAMi's folders
    /// (its environment's `CUDA_OVERSUBSCRIBE` is not recorded on the host).
    pub memory_mode: &'static str,
    /// Spill mode: the host budget and the bytes spilled past the quota (not part of `used`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spill_limit: Option<u64>,
    pub spilled: u64,
    /// The compute share and what its bucket recorded, when the GPU has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compute: Option<Compute>,
    pub processes: Vec<Process>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A GPU's compute share (limits.json) and its bucket (the ledger's `COMPUTE_AREA`, all the container's
/// processes together, since the ledger was made).
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct Compute {
    /// The share's limit (its cap), percent of the GPU's time (100: a request alone).
    pub limit_percent: u32,
    /// The share's request (its floor), percent of the GPU's time (a limit alone is its own request).
    pub request_percent: u32,
    /// `force` or `default` (both a hard cap today).
    pub policy: vgpu_ledger::envcompute::Policy,
    /// The share's pacing window, ms (limits.json's `compute_window_ms`, else the default).
    pub window_ms: u32,
    /// GPU time charged to the bucket, nanoseconds.
    pub charged_ns: u64,
    /// Time launching threads were held back, nanoseconds, summed over threads.
    pub held_ns: u64,
    /// Launches (kernels and graphs) measured and charged.
    pub launches: u64,
}

#[derive(Debug, Serialize)]
pub struct Process {
    pub slot: u16,
    /// PID inside the container's own PID namespace (0: not recorded).
    pub pid: u32,
    pub pid_ns: u64,
    /// The same process's PID on the host, when it lives and `/proc` shows it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_pid: Option<u32>,
    /// The process still holds its slot; a dead one's usage is given back by the next reclaim.
    pub alive: bool,
    pub used: u64,
    /// Bytes spilled past the quota (spill mode).
    pub spilled: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn by_kind(usage: impl Fn(Kind) -> u64) -> serde_json::Map<String, serde_json::Value> {
    Kind::ALL
        .iter()
        .filter(|k| usage(**k) > 0)
        .map(|k| (k.name().to_string(), usage(*k).into()))
        .collect()
}

fn gpu(dev: &vgpu_ledger::DeviceLimit, ledger: LedgerRead) -> Gpu {
    let mut g = Gpu {
        index: dev.index,
        uuid: dev.uuid.clone(),
        quota: dev.settings.memory_limit,
        used: 0,
        over_quota: None,
        pending_shrink: false,
        by_kind: Default::default(),
        memory_mode: dev.settings.memory.name(),
        spill_limit: dev.settings.memory.spill_limit(),
        spilled: 0,
        compute: dev
            .settings
            .request_limit()
            .map(|(request_percent, limit_percent)| Compute {
                limit_percent,
                request_percent,
                policy: dev.settings.compute_policy,
                window_ms: dev
                    .settings
                    .compute_window_ms
                    .unwrap_or(vgpu_ledger::envcompute::DEFAULT_WINDOW_MS),
                charged_ns: 0,
                held_ns: 0,
                launches: 0,
            }),
        processes: vec![],
        error: None,
    };
    match ledger {
        LedgerRead::Read(snap) => {
            from_snapshot(&mut g, &snap);
            g.pending_shrink = g.over_quota.is_some() && dev.shrunk_from.is_some();
        }
        // No process has started CUDA there yet: nothing to show.
        LedgerRead::Missing => {}
        LedgerRead::Unreadable(e) => g.error = Some(e),
    }
    g
}

/// A ledger's figures into `g` (whose quota and compute share are set): its use and what is past the
/// quota, spill, compute bucket, usage by kind and processes.
fn from_snapshot(g: &mut Gpu, snap: &vgpu_ledger::Snapshot) {
    g.used = snap.used;
    g.over_quota = g.quota.filter(|&q| snap.used > q).map(|q| snap.used - q);
    g.spilled = snap.spilled;
    if let Some(c) = &mut g.compute {
        c.charged_ns = snap.compute.charged_ns;
        c.held_ns = snap.compute.held_ns;
        c.launches = snap.compute.launches;
    }
    g.by_kind = by_kind(|k| snap.slots.iter().map(|s| s.usage[k.index()]).sum());
    g.processes = snap
        .slots
        .iter()
        .map(|s| Process {
            slot: s.index,
            pid: s.pid,
            pid_ns: s.pid_ns,
            host_pid: None,
            alive: s.alive,
            used: s.total(),
            spilled: s.spilled,
        })
        .collect();
}

/// Reads every container under `root`. Entries of the state root that are not a container's state are
/// listed with an error; provisions and removals in progress are not listed. `physical`: each GPU's memory
/// by UUID, when NVML could tell.
pub fn collect(root: &StateRoot, physical: &[(String, u64)]) -> Result<Status> {
    let mut status = Status {
        schema_version: SCHEMA_VERSION,
        state_root: root.root().display().to_string(),
        gpus: vec![],
        containers: vec![],
        turns: vgpu_monitor::turns::record::read_gpus(root),
        unattributed: vec![],
        hami_skipped: vec![],
        hami_folders: vec![],
    };
    for entry in inventory::read(root)? {
        let c = match entry {
            Entry::Leftover(_) => continue,
            Entry::Foreign { entry, why } => Container {
                id: entry.name,
                init_pid: None,
                updates: 0,
                updated_at: None,
                kubernetes: None,
                docker_name: None,
                podman_name: None,
                hami: None,
                error: Some(format!("not a container's state: {why}")),
                gpus: vec![],
            },
            Entry::Container(c) => {
                let mut out = Container {
                    id: c.id().to_string(),
                    init_pid: None,
                    updates: 0,
                    updated_at: None,
                    kubernetes: None,
                    docker_name: None,
                    podman_name: None,
                    hami: None,
                    error: None,
                    gpus: vec![],
                };
                match &c.limits {
                    Ok(limits) => {
                        out.init_pid = limits.init_pid;
                        out.updates = limits.updates;
                        out.updated_at = limits.updated_at;
                        out.kubernetes = limits.kubernetes.clone();
                        out.gpus = c.ledgers().into_iter().map(|(d, l)| gpu(d, l)).collect();
                    }
                    Err(e) => out.error = Some(e.to_string()),
                }
                out
            }
        };
        status.containers.push(c);
    }
    name_host_pids(&mut status.containers, host_pids);
    status.gpus = totals(&status.containers, physical);
    Ok(status)
}

impl Status {
    /// Whether a container has no name yet: the ones Kubernetes named need not ask dockerd, nor those of
    /// HAMi's folders.
    pub fn wants_names(&self) -> bool {
        self.containers
            .iter()
            .any(|c| c.kubernetes.is_none() && c.hami.is_none())
    }

    /// Names the containers Docker knows by their id (`vgpu_monitor::docker::names`); a Kubernetes
    /// container keeps its Kubernetes names (dockershim's are Docker's, and say less).
    pub fn note_docker_names(&mut self, names: &HashMap<String, String>) {
        for c in self
            .containers
            .iter_mut()
            .filter(|c| c.kubernetes.is_none() && c.hami.is_none())
        {
            c.docker_name = names.get(&c.id).cloned();
        }
    }

    /// Names the containers Podman knows by their id (`crate::containers::podman_names`); as with
    /// Docker's, a Kubernetes container keeps its Kubernetes names.
    pub fn note_podman_names(&mut self, names: &HashMap<String, String>) {
        for c in self
            .containers
            .iter_mut()
            .filter(|c| c.kubernetes.is_none() && c.hami.is_none())
        {
            c.podman_name = names.get(&c.id).cloned();
        }
    }

    /// Notes each GPU's addressing mode (by UUID, as NVML answered it) in the per-GPU totals.
    pub fn note_addressing(&mut self, modes: &[(String, AddressingMode)]) {
        for g in &mut self.gpus {
            g.addressing = modes.iter().find(|m| m.0 == g.uuid).map(|m| m.1.name());
        }
    }
}

/// Every live process of the host, by (PID namespace, PID inside it) — what a ledger's slot records.
fn host_pids() -> HashMap<(u64, u32), u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return HashMap::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(procs::inspect)
        .map(|p| ((p.ns, p.inner_pid), p.pid))
        .collect()
}

/// Fills in the host PIDs of the live processes (`/proc` is read only when there is one).
fn name_host_pids(containers: &mut [Container], scan: impl FnOnce() -> HashMap<(u64, u32), u32>) {
    let live = |c: &Container| c.gpus.iter().any(|g| g.processes.iter().any(|p| p.alive));
    if !containers.iter().any(live) {
        return;
    }
    let host = scan();
    for p in containers
        .iter_mut()
        .flat_map(|c| c.gpus.iter_mut())
        .flat_map(|g| g.processes.iter_mut())
        .filter(|p| p.alive && p.pid != 0)
    {
        p.host_pid = host.get(&(p.pid_ns, p.pid)).copied();
    }
}

/// Per GPU: the containers on it, their quotas and usage summed, and its memory (the state root's
/// containers: those of HAMi's folders are listed after the totals are made).
fn totals(containers: &[Container], physical: &[(String, u64)]) -> Vec<GpuTotal> {
    let mut by: BTreeMap<&str, GpuTotal> = BTreeMap::new();
    for g in containers.iter().flat_map(|c| &c.gpus) {
        let t = by.entry(&g.uuid).or_insert_with(|| GpuTotal {
            uuid: g.uuid.clone(),
            containers: 0,
            committed: 0,
            compute_shares: 0,
            compute_requests: 0,
            used: 0,
            physical: physical.iter().find(|p| p.0 == g.uuid).map(|p| p.1),
            addressing: None,
        });
        t.containers += 1;
        t.committed = t.committed.saturating_add(g.quota.unwrap_or(0));
        t.compute_shares += g.compute.as_ref().map_or(0, |c| c.limit_percent);
        t.compute_requests += g.compute.as_ref().map_or(0, |c| c.request_percent);
        t.used = t.used.saturating_add(g.used);
    }
    by.into_values().collect()
}

mod hami_folders;
mod hami_quota;
mod unattributed;
