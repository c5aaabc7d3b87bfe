//! `vgpuctl status`: quota, usage by kind and processes per container and GPU, read from the state root.
//! Read-only: limits files and ledgers are read as untrusted files (`vgpu_ledger::hostfile`: no link
//! followed, never blocking, read with pread, nothing mapped, so a tenant can neither hang nor kill it) and
//! liveness is asked with F_OFD_GETLK, so looking never changes what it looks at (no slot is claimed,
//! reclaimed or locked). The walk over the state
//! root is `vgpu_ledger::walk`; the garbage collector (`vgpuctl gc`) is `vgpu_oci::gc`.
use anyhow::Result;
use serde::Serialize;
use std::io::Write;
use std::path::Path;
use vgpu_ledger::hostfile;
use vgpu_ledger::layout::StateRoot;
use vgpu_ledger::walk::StateEntry;
use vgpu_ledger::{format_bytes, Kind, LedgerError, Limits, Snapshot};

#[derive(Debug, Serialize)]
pub struct Status {
    pub state_root: String,
    pub containers: Vec<Container>,
}

#[derive(Debug, Serialize)]
pub struct Container {
    pub id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub init_pid: Option<u32>,
    /// Why this container's state could not be read (the others are still shown).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub gpus: Vec<Gpu>,
}

#[derive(Debug, Serialize)]
pub struct Gpu {
    pub index: u32,
    pub uuid: String,
    /// Bytes, from limits.json (what the library enforces).
    pub quota: u64,
    /// Bytes charged in the ledger, all processes together.
    pub used: u64,
    /// Bytes per kind (context, module, data, ...), all processes together; kinds at zero left out.
    pub by_kind: serde_json::Map<String, serde_json::Value>,
    pub processes: Vec<Process>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct Process {
    pub slot: u16,
    /// PID inside the container's own PID namespace (0: not recorded).
    pub pid: u32,
    pub pid_ns: u64,
    /// The process still holds its slot; a dead one's usage is given back by the next reclaim.
    pub alive: bool,
    pub used: u64,
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
        processes: vec![],
        error: None,
    };
    let path = limits.ledger_path(limits_path, dev);
    match Snapshot::read(&path) {
        Ok(snap) => {
            g.used = snap.used;
            g.by_kind = by_kind(|k| snap.slots.iter().map(|s| s.usage[k.index()]).sum());
            g.processes = snap
                .slots
                .iter()
                .map(|s| Process {
                    slot: s.index,
                    pid: s.pid,
                    pid_ns: s.pid_ns,
                    alive: s.alive,
                    used: s.total(),
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
/// listed with an error; provisions and removals in progress are not listed.
pub fn collect(root: &StateRoot) -> Result<Status> {
    let mut status = Status {
        state_root: root.root().display().to_string(),
        containers: vec![],
    };
    for entry in root.entries()? {
        let c = match entry {
            StateEntry::Leftover(_) => continue,
            StateEntry::Foreign { entry, why } => Container {
                id: entry.name,
                init_pid: None,
                error: Some(format!("not a container's state: {why}")),
                gpus: vec![],
            },
            StateEntry::Container(dir) => {
                let mut c = Container {
                    id: dir.id,
                    init_pid: None,
                    error: None,
                    gpus: vec![],
                };
                match hostfile::load_limits(&dir.limits_path) {
                    Ok(limits) => {
                        c.init_pid = limits.init_pid;
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
    Ok(status)
}

fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}

fn processes(ps: &[Process]) -> String {
    if ps.is_empty() {
        return "-".into();
    }
    ps.iter()
        .map(|p| {
            format!(
                "{}{}",
                if p.pid == 0 {
                    "?".to_string()
                } else {
                    p.pid.to_string()
                },
                if p.alive { "" } else { "(dead)" }
            )
        })
        .collect::<Vec<_>>()
        .join(",")
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

/// The human view: one line per container and GPU.
pub fn print_table(s: &Status, out: &mut dyn Write) -> Result<()> {
    if s.containers.is_empty() {
        writeln!(
            out,
            "no containers with a GPU memory quota (state root {})",
            s.state_root
        )?;
        return Ok(());
    }
    let mut rows = vec![[
        "CONTAINER",
        "GPU",
        "UUID",
        "QUOTA",
        "USED",
        "BY KIND",
        "PIDS",
    ]
    .map(String::from)];
    for c in &s.containers {
        if let Some(e) = &c.error {
            rows.push([
                short(&c.id).into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                format!("error: {e}"),
                "-".into(),
            ]);
        }
        for g in &c.gpus {
            let kinds = match &g.error {
                Some(e) => format!("error: {e}"),
                None => kinds(&g.by_kind),
            };
            rows.push([
                short(&c.id).into(),
                g.index.to_string(),
                g.uuid.clone(),
                format_bytes(g.quota),
                format!(
                    "{} ({}%)",
                    format_bytes(g.used),
                    g.used.saturating_mul(100) / g.quota.max(1)
                ),
                kinds,
                processes(&g.processes),
            ]);
        }
    }
    let widths: Vec<usize> = (0..7)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        writeln!(out, "{}", line.join("  ").trim_end())?;
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
                memory_limit: limit,
                ledger: vgpu_ledger::layout::relative_ledger_path(uuid).unwrap(),
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
        let s = collect(&root).unwrap();
        assert!(s.containers.is_empty());
        assert!(
            !dir.path().join("nothing-here").exists(),
            "status creates nothing"
        );
        let mut out = Vec::new();
        print_table(&s, &mut out).unwrap();
        assert!(String::from_utf8(out)
            .unwrap()
            .starts_with("no containers with a GPU memory quota"));
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
        let s = collect(&root).unwrap();
        assert_eq!(
            std::fs::read(&ledger_path).unwrap(),
            before,
            "status must not write the ledger"
        );

        assert_eq!(s.containers.len(), 2);
        let g = &s.containers[0].gpus[0];
        assert_eq!((g.quota, g.used), (1 << 30, 356 << 20));
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

    /// `collect` on another thread; panics if it has not returned after a minute (it blocked).
    fn collect_or_hang(root: &StateRoot) -> Status {
        let (tx, rx) = std::sync::mpsc::channel();
        let root = root.clone();
        std::thread::spawn(move || tx.send(collect(&root).unwrap()));
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
                let s = collect(&root).unwrap();
                assert_eq!(s.containers.len(), 1);
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        });
    }
}
