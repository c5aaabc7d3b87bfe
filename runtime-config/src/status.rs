//! `vgpuctl status`: quota, usage by kind and processes per container and GPU, and per GPU what the
//! quotas commit against what it has, read from the state root. Read-only: limits files and ledgers are
//! read as untrusted files (`vgpu_ledger::hostfile`: no link followed, never blocking, read with pread,
//! nothing mapped, so a tenant can neither hang nor kill it) and liveness is asked with F_OFD_GETLK, so
//! looking never changes what it looks at (no slot is claimed, reclaimed or locked). A ledger's processes
//! are named by the PID inside their container; their host PIDs are found in `/proc` (the monitor's
//! `procs`). The walk over the state root is `vgpu_ledger::walk`; the garbage collector (`vgpuctl gc`) is
//! `vgpu_oci::gc`.
use anyhow::Result;
use comfy_table::{CellAlignment, ContentArrangement, Table};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::Path;
use vgpu_ledger::hostfile;
use vgpu_ledger::layout::StateRoot;
use vgpu_ledger::walk::StateEntry;
use vgpu_ledger::{format_bytes, Kind, KubeNames, LedgerError, Limits, Snapshot};

use crate::monitor::procs;

/// The version of `--json`'s shape: raised whenever a field changes meaning or goes away (added fields do
/// not raise it). 2: `schema_version`, `gpus` (per-GPU totals), `kubernetes`, processes' `host_pid`.
/// 3: a GPU's `quota` is null when it has a compute share and no memory quota; `compute` per GPU and
/// `compute_shares` per GPU total.
pub const SCHEMA_VERSION: u32 = 3;

#[derive(Debug, Serialize)]
pub struct Status {
    pub schema_version: u32,
    pub state_root: String,
    /// Per GPU: what the containers' quotas commit, what their ledgers hold, and what the GPU has.
    pub gpus: Vec<GpuTotal>,
    pub containers: Vec<Container>,
}

/// One GPU's totals over the containers that have a quota on it.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct GpuTotal {
    pub uuid: String,
    pub containers: usize,
    /// The sum of their quotas (what admission checks against the GPU).
    pub committed: u64,
    /// The sum of their compute shares, percent (past 100 no one can get its share).
    pub compute_shares: u32,
    /// The sum of what their ledgers hold.
    pub used: u64,
    /// The GPU's memory, from NVML (None when NVML is not there).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub physical: Option<u64>,
}

#[derive(Debug, Serialize)]
pub struct Container {
    pub id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub init_pid: Option<u32>,
    /// Kubernetes namespace, pod and container, when a CRI runtime made it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<KubeNames>,
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
    /// Bytes per kind (context, module, data, ...), all processes together; kinds at zero left out.
    pub by_kind: serde_json::Map<String, serde_json::Value>,
    /// The unified-memory mode: plain, spill or oversubscribe.
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
    /// Percent of the GPU's time.
    pub limit_percent: u32,
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

fn by_kind(usage: impl Fn(Kind) -> u64) -> serde_json::Map<String, serde_json::Value> {
    Kind::ALL
        .iter()
        .filter(|k| usage(**k) > 0)
        .map(|k| (k.name().to_string(), usage(*k).into()))
        .collect()
}

fn gpu(limits_path: &Path, limits: &Limits, dev: &vgpu_ledger::DeviceLimit) -> Gpu {
    let mut g = Gpu {
        index: dev.index,
        uuid: dev.uuid.clone(),
        quota: dev.memory_limit,
        used: 0,
        by_kind: Default::default(),
        memory_mode: dev.memory.name(),
        spill_limit: dev.memory.spill_limit(),
        spilled: 0,
        compute: dev.compute_share().map(|limit_percent| Compute {
            limit_percent,
            policy: dev.compute_policy,
            window_ms: dev
                .compute_window_ms
                .unwrap_or(vgpu_ledger::envcompute::DEFAULT_WINDOW_MS),
            charged_ns: 0,
            held_ns: 0,
            launches: 0,
        }),
        processes: vec![],
        error: None,
    };
    let path = limits.ledger_path(limits_path, dev);
    match Snapshot::read(&path) {
        Ok(snap) => {
            g.used = snap.used;
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
        // A process that has not started CUDA yet has no ledger to show.
        Err(LedgerError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => g.error = Some(e.to_string()),
    }
    g
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
    };
    for entry in root.entries()? {
        let c = match entry {
            StateEntry::Leftover(_) => continue,
            StateEntry::Foreign { entry, why } => Container {
                id: entry.name,
                init_pid: None,
                kubernetes: None,
                error: Some(format!("not a container's state: {why}")),
                gpus: vec![],
            },
            StateEntry::Container(dir) => {
                let mut c = Container {
                    id: dir.id,
                    init_pid: None,
                    kubernetes: None,
                    error: None,
                    gpus: vec![],
                };
                match hostfile::load_limits(&dir.limits_path) {
                    Ok(limits) => {
                        c.init_pid = limits.init_pid;
                        c.kubernetes = limits.kubernetes.clone();
                        c.gpus = limits
                            .devices
                            .iter()
                            .map(|d| gpu(&dir.limits_path, &limits, d))
                            .collect();
                    }
                    Err(e) => c.error = Some(e.to_string()),
                }
                c
            }
        };
        status.containers.push(c);
    }
    name_host_pids(&mut status.containers, host_pids);
    status.gpus = totals(&status.containers, physical);
    Ok(status)
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

/// Per GPU: the containers on it, their quotas and usage summed, and its memory.
fn totals(containers: &[Container], physical: &[(String, u64)]) -> Vec<GpuTotal> {
    let mut by: BTreeMap<&str, GpuTotal> = BTreeMap::new();
    for g in containers.iter().flat_map(|c| &c.gpus) {
        let t = by.entry(&g.uuid).or_insert_with(|| GpuTotal {
            uuid: g.uuid.clone(),
            containers: 0,
            committed: 0,
            compute_shares: 0,
            used: 0,
            physical: physical.iter().find(|p| p.0 == g.uuid).map(|p| p.1),
        });
        t.containers += 1;
        t.committed = t.committed.saturating_add(g.quota.unwrap_or(0));
        t.compute_shares += g.compute.as_ref().map_or(0, |c| c.limit_percent);
        t.used = t.used.saturating_add(g.used);
    }
    by.into_values().collect()
}

fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}

/// `host/inside` per process (`?` where unknown), `(dead)` for a slot whose owner is gone.
fn processes(ps: &[Process]) -> String {
    if ps.is_empty() {
        return "-".into();
    }
    let known = |v: u32| match v {
        0 => "?".to_string(),
        v => v.to_string(),
    };
    ps.iter()
        .map(|p| {
            format!(
                "{}/{}{}",
                p.host_pid.map_or("?".into(), known),
                known(p.pid),
                if p.alive { "" } else { "(dead)" }
            )
        })
        .collect::<Vec<_>>()
        .join(",")
}

fn names(k: &Option<KubeNames>) -> String {
    match k {
        Some(k) => format!("{}/{}/{}", k.namespace, k.pod, k.container),
        None => "-".into(),
    }
}

/// `30% (1.9 s charged, 4.1 s held, 512 launches)`, or `-` without a share.
fn compute(c: &Option<Compute>) -> String {
    let Some(c) = c else {
        return "-".into();
    };
    let s = |ns: u64| format!("{:.1} s", ns as f64 / 1e9);
    format!(
        "{}% ({} charged, {} held, {} launches)",
        c.limit_percent,
        s(c.charged_ns),
        s(c.held_ns),
        c.launches
    )
}

fn kinds(m: &serde_json::Map<String, serde_json::Value>) -> String {
    if m.is_empty() {
        return "-".into();
    }
    m.iter()
        .map(|(k, v)| format!("{k}={}", format_bytes(v.as_u64().unwrap_or(0))))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A table without borders, columns two spaces apart, so that lines start with their first cell.
fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_style(comfy_table::presets::NOTHING)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(header.to_vec());
    for c in t.column_iter_mut() {
        c.set_padding((0, 2));
    }
    t
}

/// The human view: one line per container and GPU, then one per GPU with its totals.
pub fn print_table(s: &Status, out: &mut dyn Write) -> Result<()> {
    if s.containers.is_empty() {
        writeln!(
            out,
            "no containers with a GPU memory quota or compute share (state root {})",
            s.state_root
        )?;
        return Ok(());
    }
    let mut t = table(&[
        "CONTAINER",
        "GPU",
        "UUID",
        "QUOTA",
        "USED",
        "BY KIND",
        "COMPUTE",
        "PIDS (HOST/INSIDE)",
        "KUBERNETES (NS/POD/CONTAINER)",
    ]);
    for c in &s.containers {
        if let Some(e) = &c.error {
            t.add_row(vec![
                short(&c.id).to_string(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                format!("error: {e}"),
                "-".into(),
                "-".into(),
                names(&c.kubernetes),
            ]);
        }
        for g in &c.gpus {
            let kinds = match &g.error {
                Some(e) => format!("error: {e}"),
                None => kinds(&g.by_kind),
            };
            t.add_row(vec![
                short(&c.id).to_string(),
                g.index.to_string(),
                g.uuid.clone(),
                g.quota.map_or("-".into(), format_bytes),
                format!(
                    "{}{}{}",
                    format_bytes(g.used),
                    match g.quota {
                        Some(q) => format!(" ({}%)", g.used.saturating_mul(100) / q.max(1)),
                        None => String::new(),
                    },
                    match (g.spill_limit, g.memory_mode) {
                        (Some(b), _) => format!(
                            " + {} spilled of {}",
                            format_bytes(g.spilled),
                            format_bytes(b)
                        ),
                        (None, "oversubscribe") => " (oversubscribe)".into(),
                        _ => String::new(),
                    }
                ),
                kinds,
                compute(&g.compute),
                processes(&g.processes),
                names(&c.kubernetes),
            ]);
        }
    }
    write_table(&t, out)?;
    if !s.gpus.is_empty() {
        writeln!(out)?;
        let mut t = table(&[
            "GPU",
            "CONTAINERS",
            "COMMITTED",
            "PHYSICAL",
            "USED",
            "COMPUTE SHARES",
        ]);
        for g in &s.gpus {
            let physical = g.physical.map_or("?".into(), format_bytes);
            let committed = match g.physical {
                Some(p) => format!(
                    "{} ({}%)",
                    format_bytes(g.committed),
                    g.committed.saturating_mul(100) / p.max(1)
                ),
                None => format_bytes(g.committed),
            };
            t.add_row(vec![
                g.uuid.clone(),
                g.containers.to_string(),
                committed,
                physical,
                format_bytes(g.used),
                format!("{}%", g.compute_shares),
            ]);
        }
        if let Some(c) = t.column_mut(1) {
            c.set_cell_alignment(CellAlignment::Right);
        }
        write_table(&t, out)?;
    }
    Ok(())
}

fn write_table(t: &Table, out: &mut dyn Write) -> Result<()> {
    for line in t.lines() {
        writeln!(out, "{}", line.trim_end())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_ledger::{DeviceLimit, Ledger};

    fn provision(
        root: &StateRoot,
        id: &str,
        uuid: &str,
        limit: u64,
    ) -> (Ledger, std::path::PathBuf) {
        provision_in(root, id, uuid, limit, Default::default())
    }

    fn provision_in(
        root: &StateRoot,
        id: &str,
        uuid: &str,
        limit: u64,
        memory: vgpu_ledger::MemoryMode,
    ) -> (Ledger, std::path::PathBuf) {
        let limits_path = root.limits_path(id).unwrap();
        std::fs::create_dir_all(root.ledgers_dir(id).unwrap()).unwrap();
        // As the hook makes them: both folders marked.
        vgpu_ledger::walk::mark(&root.containers_dir()).unwrap();
        vgpu_ledger::walk::mark(&root.container_dir(id).unwrap()).unwrap();
        let limits = Limits {
            version: vgpu_ledger::LIMITS_VERSION,
            container_id: id.into(),
            pid_ns: None,
            init_pid: Some(1),
            kubernetes: None,
            devices: vec![DeviceLimit {
                index: 0,
                uuid: uuid.into(),
                memory_limit: Some(limit),
                ledger: vgpu_ledger::layout::relative_ledger_path(uuid).unwrap(),
                memory,
                compute_limit: None,
                compute_policy: Default::default(),
                compute_window_ms: None,
            }],
        };
        limits.write_atomic(&limits_path).unwrap();
        let ledger_path = root.ledger_path(id, uuid).unwrap();
        (
            Ledger::open_or_create(&ledger_path, uuid, limit).unwrap(),
            ledger_path,
        )
    }

    #[test]
    fn empty_or_missing_root_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let root = StateRoot::new(dir.path().join("nothing-here"));
        let s = collect(&root, &[]).unwrap();
        assert!(s.containers.is_empty());
        assert!(
            !dir.path().join("nothing-here").exists(),
            "status creates nothing"
        );
        let mut out = Vec::new();
        print_table(&s, &mut out).unwrap();
        assert!(String::from_utf8(out)
            .unwrap()
            .starts_with("no containers with a GPU memory quota or compute share"));
    }

    #[test]
    fn shows_the_spilled_part_beside_the_quota() {
        let dir = tempfile::tempdir().unwrap();
        let root = StateRoot::new(dir.path().to_path_buf());
        let uuid = "GPU-fa4ec0de-0000-4000-8000-000000000000";
        let spill = vgpu_ledger::MemoryMode::Spill {
            spill_limit: 8 << 30,
        };
        let (ledger, _) = provision_in(&root, "c1", uuid, 4 << 30, spill);
        let slot = ledger.attach().unwrap();
        ledger.charge(&slot, Kind::Data, 4 << 30, 4 << 30).unwrap();
        ledger.charge_spill(&slot, 3 << 30, 8 << 30).unwrap();
        let s = collect(&root, &[]).unwrap();
        let g = &s.containers[0].gpus[0];
        assert_eq!(
            (g.used, g.spilled, g.spill_limit, g.memory_mode),
            (4 << 30, 3 << 30, Some(8 << 30), "spill")
        );
        assert_eq!(g.processes[0].spilled, 3 << 30);
        let mut out = Vec::new();
        print_table(&s, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("4.00 GiB (100%) + 3.00 GiB spilled of 8.00 GiB"),
            "{text}"
        );
    }

    #[test]
    fn shows_quota_usage_by_kind_and_processes_without_changing_anything() {
        let dir = tempfile::tempdir().unwrap();
        let root = StateRoot::new(dir.path().to_path_buf());
        let uuid = "GPU-fa4ec0de-0000-4000-8000-000000000000";
        let (ledger, ledger_path) = provision(&root, "c1", uuid, 1 << 30);
        let slot = ledger.attach().unwrap();
        ledger
            .charge(&slot, Kind::Context, 256 << 20, 1 << 30)
            .unwrap();
        ledger
            .charge(&slot, Kind::Data, 100 << 20, 1 << 30)
            .unwrap();
        // A container whose limits file is broken is reported, not fatal.
        std::fs::create_dir_all(root.container_dir("c2").unwrap()).unwrap();
        vgpu_ledger::walk::mark(&root.container_dir("c2").unwrap()).unwrap();
        std::fs::write(root.limits_path("c2").unwrap(), "{").unwrap();
        // In-progress provisions are not containers.
        std::fs::create_dir_all(root.containers_dir().join(".tmp-x")).unwrap();

        let before = std::fs::read(&ledger_path).unwrap();
        let s = collect(&root, &[]).unwrap();
        assert_eq!(
            std::fs::read(&ledger_path).unwrap(),
            before,
            "status must not write the ledger"
        );

        assert_eq!(s.containers.len(), 2);
        let g = &s.containers[0].gpus[0];
        assert_eq!((g.quota, g.used), (Some(1 << 30), 356 << 20));
        assert_eq!(g.compute, None);
        assert_eq!(g.by_kind["context"], 256u64 << 20);
        assert_eq!(g.by_kind["data"], 100u64 << 20);
        assert!(!g.by_kind.contains_key("vmm"));
        assert_eq!(g.processes.len(), 1);
        assert!(g.processes[0].alive);
        assert_eq!(g.processes[0].used, 356 << 20);
        assert!(s.containers[1].error.is_some());

        let mut out = Vec::new();
        print_table(&s, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains(uuid) && text.contains("context=") && text.contains("error:"),
            "{text}"
        );
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["containers"][0]["gpus"][0]["used"], 356u64 << 20);
        drop(slot);
    }

    // Issue: status showed in-container PIDs only, no names, no per-GPU totals, and no version in --json.
    #[test]
    fn host_pids_names_per_gpu_totals_and_a_schema_version() {
        let dir = tempfile::tempdir().unwrap();
        let root = StateRoot::new(dir.path().to_path_buf());
        let uuid = "GPU-fa4ec0de-0000-4000-8000-000000000000";
        let (a, _) = provision(&root, "a", uuid, 3 << 30);
        let (_b, _) = provision(&root, "b", uuid, 5 << 30);
        let names = KubeNames {
            namespace: "ml".into(),
            pod: "trainer-0".into(),
            container: "main".into(),
        };
        let lp = root.limits_path("a").unwrap();
        let mut l = vgpu_ledger::Limits::load(&lp).unwrap();
        l.kubernetes = Some(names.clone());
        l.write_atomic(&lp).unwrap();
        // This process holds a slot: its PID inside its namespace is its host PID here.
        let slot = a.attach().unwrap();
        a.charge(&slot, Kind::Data, 1 << 30, 3 << 30).unwrap();

        let s = collect(&root, &[(uuid.to_string(), 16 << 30)]).unwrap();
        let p = &s.containers[0].gpus[0].processes[0];
        assert_eq!(p.host_pid, Some(std::process::id()));
        assert_eq!(s.containers[0].kubernetes.as_ref(), Some(&names));
        assert_eq!(
            s.gpus,
            vec![GpuTotal {
                uuid: uuid.into(),
                containers: 2,
                committed: 8 << 30,
                compute_shares: 0,
                used: 1 << 30,
                physical: Some(16 << 30),
            }]
        );
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["schema_version"], SCHEMA_VERSION);
        assert_eq!(json["containers"][0]["kubernetes"]["pod"], "trainer-0");
        let mut out = Vec::new();
        print_table(&s, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let me = std::process::id();
        assert!(text.contains(&format!("{me}/{me}")), "{text}");
        assert!(text.contains("ml/trainer-0/main"), "{text}");
        assert!(
            text.lines().any(|l| l.starts_with(uuid)
                && l.contains("8.00 GiB (50%)")
                && l.contains("16.0 GiB")),
            "{text}"
        );
        // Lines start with their first cell (scripts match `^<id> `).
        assert!(text.lines().any(|l| l.starts_with("a ")), "{text}");
        drop(slot);
    }

    #[test]
    fn shows_each_gpus_compute_share_and_what_its_bucket_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let root = StateRoot::new(dir.path().to_path_buf());
        let uuid = "GPU-fa4ec0de-0000-4000-8000-000000000000";
        let (_, _) = provision(&root, "mem", uuid, 4 << 30);
        let (ledger, _) = provision(&root, "share", uuid, 1 << 30);
        // "share": a 30% share alone (no memory quota), force; its bucket charged twice.
        let lp = root.limits_path("share").unwrap();
        let mut l = vgpu_ledger::Limits::load(&lp).unwrap();
        l.devices[0].memory_limit = None;
        l.devices[0].compute_limit = Some(30);
        l.devices[0].compute_policy = vgpu_ledger::envcompute::Policy::Force;
        l.devices[0].compute_window_ms = Some(250);
        l.write_atomic(&lp).unwrap();
        ledger.compute().settle(1_500_000_000, 0);
        ledger.compute().settle(400_000_000, 0);
        ledger.compute().held(2_260_000_000);
        let (b, _) = provision(&root, "share2", uuid, 1 << 30);
        let lp = root.limits_path("share2").unwrap();
        let mut l = vgpu_ledger::Limits::load(&lp).unwrap();
        l.devices[0].compute_limit = Some(70);
        l.write_atomic(&lp).unwrap();
        drop(b);

        let s = collect(&root, &[(uuid.to_string(), 16 << 30)]).unwrap();
        let g = &s.containers.iter().find(|c| c.id == "share").unwrap().gpus[0];
        assert_eq!(g.quota, None);
        assert_eq!(
            g.compute,
            Some(Compute {
                limit_percent: 30,
                policy: vgpu_ledger::envcompute::Policy::Force,
                window_ms: 250,
                charged_ns: 1_900_000_000,
                held_ns: 2_260_000_000,
                launches: 2,
            })
        );
        assert_eq!(
            (s.gpus[0].committed, s.gpus[0].compute_shares),
            (5 << 30, 100)
        );
        let json = serde_json::to_value(&s).unwrap();
        let share = &json["containers"][1]["gpus"][0];
        assert_eq!(json["containers"][1]["id"], "share");
        assert!(share["quota"].is_null(), "{share}");
        assert_eq!(share["compute"]["limit_percent"], 30);
        assert_eq!(share["compute"]["policy"], "force");
        assert_eq!(share["compute"]["window_ms"], 250);
        // Not set in limits.json: the default.
        assert_eq!(
            json["containers"][2]["gpus"][0]["compute"]["window_ms"],
            1000
        );
        assert_eq!(share["compute"]["charged_ns"], 1_900_000_000u64);
        assert!(json["containers"][0]["gpus"][0].get("compute").is_none());
        assert_eq!(json["gpus"][0]["compute_shares"], 100);
        let mut out = Vec::new();
        print_table(&s, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let line = text.lines().find(|l| l.starts_with("share ")).unwrap();
        assert!(
            line.contains("30% (1.9 s charged, 2.3 s held, 2 launches)"),
            "{text}"
        );
        assert!(
            text.lines()
                .any(|l| l.starts_with(uuid) && l.trim_end().ends_with("100%")),
            "{text}"
        );
    }

    /// `collect` on another thread; panics if it has not returned after a minute (it blocked).
    fn collect_or_hang(root: &StateRoot) -> Status {
        let (tx, rx) = std::sync::mpsc::channel();
        let root = root.clone();
        std::thread::spawn(move || tx.send(collect(&root, &[]).unwrap()));
        rx.recv_timeout(std::time::Duration::from_secs(60))
            .expect("vgpuctl status blocked")
    }

    #[test]
    fn a_tenant_fifo_or_link_as_ledger_neither_blocks_nor_leaks() {
        let dir = tempfile::tempdir().unwrap();
        let root = StateRoot::new(dir.path().join("state"));
        let uuid = "GPU-fa4ec0de-0000-4000-8000-000000000000";
        let (_, fifo) = provision(&root, "fifo", uuid, 1 << 30);
        std::fs::remove_file(&fifo).unwrap();
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "TOPSECRET").unwrap();
        let (_, link) = provision(&root, "link", uuid, 1 << 30);
        std::fs::remove_file(&link).unwrap();
        std::os::unix::fs::symlink(&secret, &link).unwrap();
        let s = collect_or_hang(&root);
        let error = |i: usize| s.containers[i].gpus[0].error.clone().unwrap_or_default();
        assert_eq!(
            (s.containers[0].id.as_str(), s.containers[1].id.as_str()),
            ("fifo", "link")
        );
        assert!(
            error(0).contains("is a FIFO, not a regular file"),
            "{}",
            error(0)
        );
        assert!(error(1).contains("symbolic link"), "{}", error(1));
        let json = serde_json::to_string(&s).unwrap();
        for leak in ["TOPSECRET", "54, 4f", "[54"] {
            assert!(!json.contains(leak), "{json}");
        }
    }

    #[test]
    fn a_tenant_truncating_its_ledger_cannot_kill_status() {
        let dir = tempfile::tempdir().unwrap();
        let root = StateRoot::new(dir.path().to_path_buf());
        let uuid = "GPU-fa4ec0de-0000-4000-8000-000000000000";
        let (_, path) = provision(&root, "c1", uuid, 1 << 30);
        let size = std::fs::metadata(&path).unwrap().len();
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|sc| {
            sc.spawn(|| {
                // Shrinks the file below its header's end and back (the header stays valid).
                let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    f.set_len(4096).unwrap();
                    f.set_len(size).unwrap();
                }
            });
            // A mapping read while the file is short would SIGBUS this whole test process.
            for _ in 0..3000 {
                let s = collect(&root, &[]).unwrap();
                assert_eq!(s.containers.len(), 1);
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        });
    }
}
