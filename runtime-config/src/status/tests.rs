//! Tests of `vgpuctl status`: the model read from a real state root and ledgers, and its table.

use super::*;
use vgpu_host::limits_file::WriteLimits;
use vgpu_host::nvml::AddressingMode;
use vgpu_host::state_root::StateRoot;
use vgpu_ledger::Ledger;
use vgpu_ledger::{Kind, KubeNames, Limits};

fn provision(root: &StateRoot, id: &str, uuid: &str, limit: u64) -> (Ledger, std::path::PathBuf) {
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
    vgpu_host::walk::mark(&root.containers_dir()).unwrap();
    vgpu_host::walk::mark(&root.container_dir(id).unwrap()).unwrap();
    let mut limits = vgpu_ledger::fixtures::one_gpu(id, uuid, limit);
    limits.init_pid = Some(1);
    limits.devices[0].settings.memory = memory;
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

/// Issue 29: the time-quanta arbiter's status files (holder, queue, grants, revocations) in the table and
/// in `--json`; none while the monitor does not run.
#[test]
fn shows_the_turns_of_each_oversubscribed_gpu() {
    use vgpu_monitor::turns::record::{write_gpu, GpuTurns};
    let dir = tempfile::tempdir().unwrap();
    let root = StateRoot::new(dir.path().to_path_buf());
    let uuid = "GPU-fa4ec0de-0000-4000-8000-000000000000";
    let over = vgpu_ledger::MemoryMode::Oversubscribe { reserve: 0 };
    provision_in(&root, "aaaaaaaaaaaaaaaa", uuid, 4 << 30, over);
    provision_in(&root, "bbbbbbbbbbbbbbbb", uuid, 4 << 30, over);
    let s = collect(&root, &[]).unwrap();
    assert!(s.turns.is_empty());
    assert!(serde_json::to_value(&s).unwrap().get("turns").is_none());
    write_gpu(
        &root,
        &GpuTurns {
            uuid: uuid.into(),
            contended: true,
            holder: Some("aaaaaaaaaaaaaaaa".into()),
            held_since_unix_ms: Some(1),
            queue: vec!["bbbbbbbbbbbbbbbb".into()],
            grants: 7,
            revocations: 1,
            busy_while_frozen: 2,
            ..Default::default()
        },
    )
    .unwrap();
    let s = collect(&root, &[]).unwrap();
    let j = serde_json::to_value(&s).unwrap();
    assert_eq!(j["turns"][0]["holder"], "aaaaaaaaaaaaaaaa");
    assert_eq!(j["turns"][0]["queue"][0], "bbbbbbbbbbbbbbbb");
    assert_eq!(j["turns"][0]["revocations"], 1);
    assert_eq!(j["turns"][0]["busy_while_frozen"], 2);
    let mut out = Vec::new();
    print_table(&s, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with(uuid) && l.contains("taking turns"))
        .unwrap_or_else(|| panic!("{text}"));
    let cells: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(cells[3], "aaaaaaaaaaaa", "{line}");
    assert!(
        line.contains("bbbbbbbbbbbb") && cells.ends_with(&["7", "1", "0", "2"]),
        "{line}"
    );
}

// Issue 27: a quota lowered by `vgpuctl update` below the container's use showed only "150%".
#[test]
fn a_shrink_below_use_shows_over_quota_by_how_much_pending() {
    let dir = tempfile::tempdir().unwrap();
    let root = StateRoot::new(dir.path().to_path_buf());
    let uuid = "GPU-fa4ec0de-0000-4000-8000-000000000000";
    let (ledger, _) = provision(&root, "c1", uuid, 2 << 30);
    let slot = ledger.attach().unwrap();
    ledger
        .charge(&slot, Kind::Data, 1536 << 20, 2 << 30)
        .unwrap();
    let path = root.limits_path("c1").unwrap();
    let mut l = Limits::load(&path).unwrap();
    l.devices[0].settings.memory_limit = Some(1 << 30);
    l.devices[0].shrunk_from = Some(2 << 30);
    l.updates = 2;
    l.updated_at = Some(1_790_000_000);
    l.write_atomic(&path).unwrap();
    let s = collect(&root, &[]).unwrap();
    let (c, g) = (&s.containers[0], &s.containers[0].gpus[0]);
    assert_eq!((g.over_quota, g.pending_shrink), (Some(512 << 20), true));
    assert_eq!((c.updates, c.updated_at), (2, Some(1_790_000_000)));
    let mut out = Vec::new();
    print_table(&s, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.contains("1.50 GiB (150%), over quota by 512 MiB (pending shrink)"),
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
    vgpu_host::walk::mark(&root.container_dir("c2").unwrap()).unwrap();
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
            compute_requests: 0,
            used: 1 << 30,
            physical: Some(16 << 30),
            addressing: None,
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
        text.lines()
            .any(|l| l.starts_with(uuid) && l.contains("8.00 GiB (50%)") && l.contains("16.0 GiB")),
        "{text}"
    );
    // Lines start with their first cell (scripts match `^<id> `).
    assert!(text.lines().any(|l| l.starts_with("a ")), "{text}");
    drop(slot);
}

#[test]
fn says_per_gpu_whether_hmm_or_ats_is_on() {
    let dir = tempfile::tempdir().unwrap();
    let root = StateRoot::new(dir.path().to_path_buf());
    let (g0, g1, g2) = (
        "GPU-fa4ec0de-0000-4000-8000-000000000000",
        "GPU-fa4ec0de-0000-4000-8000-000000000001",
        "GPU-fa4ec0de-0000-4000-8000-000000000002",
    );
    let (_a, _) = provision(&root, "a", g0, 1 << 30);
    let (_b, _) = provision(&root, "b", g1, 1 << 30);
    let (_c, _) = provision(&root, "c", g2, 1 << 30);
    let mut s = collect(&root, &[]).unwrap();
    // g2: NVML could not tell (a driver without nvmlDeviceGetAddressingMode)
    s.note_addressing(&[
        (g0.into(), AddressingMode::Hmm),
        (g1.into(), AddressingMode::None),
    ]);
    let mode = |u: &str| s.gpus.iter().find(|g| g.uuid == u).unwrap().addressing;
    assert_eq!(
        (mode(g0), mode(g1), mode(g2)),
        (Some("hmm"), Some("none"), None)
    );
    let json = serde_json::to_value(&s).unwrap();
    assert_eq!(json["gpus"][0]["addressing"], "hmm");
    assert!(json["gpus"][2].get("addressing").is_none());
    let mut out = Vec::new();
    print_table(&s, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains("HMM/ATS"), "{text}");
    let line = |u: &str| {
        text.lines()
            .find(|l| l.starts_with(u))
            .unwrap()
            .trim_end()
            .to_string()
    };
    assert!(line(g0).ends_with("on (hmm)"), "{text}");
    assert!(line(g1).ends_with("off"), "{text}");
    assert!(line(g2).ends_with('?'), "{text}");
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
    l.devices[0].settings.memory_limit = None;
    l.devices[0].settings.compute_limit = Some(30);
    l.devices[0].settings.compute_policy = vgpu_ledger::envcompute::Policy::Force;
    l.devices[0].settings.compute_window_ms = Some(250);
    l.write_atomic(&lp).unwrap();
    ledger.compute().settle(1_500_000_000, 0);
    ledger.compute().settle(400_000_000, 0);
    ledger.compute().held(2_260_000_000);
    let (b, _) = provision(&root, "share2", uuid, 1 << 30);
    let lp = root.limits_path("share2").unwrap();
    let mut l = vgpu_ledger::Limits::load(&lp).unwrap();
    l.devices[0].settings.compute_limit = Some(70);
    l.write_atomic(&lp).unwrap();
    drop(b);

    let s = collect(&root, &[(uuid.to_string(), 16 << 30)]).unwrap();
    let g = &s.containers.iter().find(|c| c.id == "share").unwrap().gpus[0];
    assert_eq!(g.quota, None);
    assert_eq!(
        g.compute,
        Some(Compute {
            limit_percent: 30,
            request_percent: 30,
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
    assert_eq!(json["gpus"][0]["compute_requests"], 100);
    assert_eq!(share["compute"]["request_percent"], 30);
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
            .any(|l| l.starts_with(uuid) && l.contains(" 100% ")),
        "{text}"
    );
}

// Issue 42: a share's request beside its limit, or alone (its limit the whole GPU), and the GPU's sums.
#[test]
fn shows_each_shares_request_and_limit() {
    let dir = tempfile::tempdir().unwrap();
    let root = StateRoot::new(dir.path().to_path_buf());
    let uuid = "GPU-fa4ec0de-0000-4000-8000-000000000000";
    for (id, request, limit) in [("floor", Some(20), Some(60)), ("alone", Some(30), None)] {
        let (_, _) = provision(&root, id, uuid, 1 << 30);
        let lp = root.limits_path(id).unwrap();
        let mut l = vgpu_ledger::Limits::load(&lp).unwrap();
        l.devices[0].settings.memory_limit = None;
        l.devices[0].settings.compute_request = request;
        l.devices[0].settings.compute_limit = limit;
        l.write_atomic(&lp).unwrap();
    }
    let s = collect(&root, &[(uuid.to_string(), 16 << 30)]).unwrap();
    let share = |id: &str| {
        let c = s.containers.iter().find(|c| c.id == id).unwrap();
        let g = c.gpus[0].compute.as_ref().unwrap();
        (g.request_percent, g.limit_percent)
    };
    assert_eq!((share("floor"), share("alone")), ((20, 60), (30, 100)));
    assert_eq!(
        (s.gpus[0].compute_requests, s.gpus[0].compute_shares),
        (50, 160)
    );
    let mut out = Vec::new();
    print_table(&s, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let line = |id: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{id} ")))
            .unwrap()
    };
    assert!(
        line("floor").contains("request 20%, limit 60% (0.0 s charged"),
        "{text}"
    );
    assert!(
        line("alone").contains("request 30%, limit 100% ("),
        "{text}"
    );
    assert!(text.contains("COMPUTE REQUESTS"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with(uuid) && l.contains(" 160% ") && l.contains(" 50% ")),
        "{text}"
    );
}

/// `collect` on another thread; panics if it has not returned after a minute (it blocked).
fn collect_or_hang(root: &StateRoot) -> Status {
    let (tx, rx) = std::sync::mpsc::channel();
    let root = root.clone();
    // The send fails only when the test gave up waiting.
    std::thread::spawn(move || {
        let _ = tx.send(collect(&root, &[]).unwrap());
    });
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

/// One reader, one answer: a GPU whose ledger is not there yet (no process has used CUDA) shows its
/// quota, no usage and no error, as the monitor does (`vgpu_host::inventory`).
#[test]
fn a_gpu_without_a_ledger_yet_shows_its_quota_and_no_usage() {
    let dir = tempfile::tempdir().unwrap();
    let root = StateRoot::new(dir.path().to_path_buf());
    let uuid = "GPU-fa4ec0de-0000-4000-8000-000000000000";
    let (ledger, path) = provision(&root, "c1", uuid, 1 << 30);
    drop(ledger);
    std::fs::remove_file(&path).unwrap();
    let s = collect(&root, &[]).unwrap();
    let g = &s.containers[0].gpus[0];
    assert_eq!(
        (g.quota, g.used, g.error.as_deref()),
        (Some(1 << 30), 0, None)
    );
    assert!(g.processes.is_empty());
    let m = vgpu_host::usage::read(&root).unwrap();
    assert_eq!((m[0].gpus[0].limit, m[0].gpus[0].total), (Some(1 << 30), 0));
    assert_eq!(m[0].gpus[0].error, None);
}

// Issue 25 item 4: a pod name carrying a newline and terminal escapes was printed raw (a forged row, the
// operator's terminal cleared).
#[test]
fn a_tenants_names_cannot_forge_rows_or_drive_the_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let root = StateRoot::new(dir.path().to_path_buf());
    let uuid = "GPU-fa4ec0de-0000-4000-8000-000000000000";
    let (_a, _) = provision(&root, "a", uuid, 1 << 30);
    let lp = root.limits_path("a").unwrap();
    let mut l = vgpu_ledger::Limits::load(&lp).unwrap();
    l.kubernetes = Some(KubeNames {
        namespace: "ml\r".into(),
        pod: "p\nvictim  0  GPU-x  64.0 GiB".into(),
        container: "c\x1b[2J\u{9b}0m".into(),
    });
    l.write_atomic(&lp).unwrap();
    let s = collect(&root, &[(uuid.to_string(), 16 << 30)]).unwrap();
    let mut out = Vec::new();
    print_table(&s, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(!text.contains(['\r', '\x1b', '\u{9b}']), "{text:?}");
    assert!(!text.lines().any(|l| l.starts_with("victim")), "{text}");
    assert!(
        text.contains(r"ml\r/p\nvictim  0  GPU-x  64.0 GiB/c\u{1b}[2J\u{9b}0m"),
        "{text}"
    );
}

// Issue 26 item 6: a Docker container showed by its id alone (Docker's spec carries no name). Its name,
// asked of dockerd, shows; a Kubernetes container keeps its Kubernetes names; a name with control
// characters (Docker refuses them, a dockerd stand-in need not) cannot forge a row.
#[test]
fn docker_containers_show_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let root = StateRoot::new(dir.path().to_path_buf());
    let uuid = "GPU-fa4ec0de-0000-4000-8000-000000000000";
    let (_a, _) = provision(&root, "aaaa", uuid, 1 << 30);
    let (_b, _) = provision(&root, "bbbb", uuid, 1 << 30);
    let (_c, _) = provision(&root, "cccc", uuid, 1 << 30);
    let (_k, _) = provision(&root, "kkkk", uuid, 1 << 30);
    let lp = root.limits_path("kkkk").unwrap();
    let mut l = vgpu_ledger::Limits::load(&lp).unwrap();
    l.kubernetes = Some(KubeNames {
        namespace: "ml".into(),
        pod: "p".into(),
        container: "c".into(),
    });
    l.write_atomic(&lp).unwrap();
    let mut s = collect(&root, &[]).unwrap();
    assert!(s.wants_names());
    let names: std::collections::HashMap<String, String> = [
        ("aaaa", "web"),
        ("bbbb", "x\nvictim  0"),
        ("kkkk", "k8s_c_p_ml"),
    ]
    .into_iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    s.note_docker_names(&names);
    let by_id = |id: &str| s.containers.iter().find(|c| c.id == id).unwrap();
    assert_eq!(by_id("aaaa").docker_name.as_deref(), Some("web"));
    assert_eq!(by_id("cccc").docker_name, None);
    assert_eq!(by_id("kkkk").docker_name, None);
    let json = serde_json::to_value(&s).unwrap();
    assert_eq!(json["containers"][0]["docker_name"], "web");
    let mut out = Vec::new();
    print_table(&s, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let line = |id: &str| {
        text.lines()
            .find(|l| l.starts_with(id))
            .unwrap()
            .to_string()
    };
    assert!(line("aaaa").ends_with("  web"), "{text}");
    assert!(line("bbbb").ends_with(r"  x\nvictim  0"), "{text}");
    assert!(line("cccc").ends_with("  -"), "{text}");
    assert!(line("kkkk").ends_with("  ml/p/c"), "{text}");
    assert!(!text.lines().any(|l| l.starts_with("victim")), "{text}");
}

// Issue 46 item 2: a Podman container showed as "-" (Podman writes no name into its spec); its name, from
// Podman's containers/storage record, shows (a Kubernetes container keeps its Kubernetes names).
#[test]
fn podman_containers_show_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let root = StateRoot::new(dir.path().to_path_buf());
    let uuid = "GPU-fa4ec0de-0000-4000-8000-000000000000";
    let (_p, _c) = (
        provision(&root, "pppp", uuid, 1 << 30),
        provision(&root, "cccc", uuid, 1 << 30),
    );
    let mut s = collect(&root, &[]).unwrap();
    s.note_podman_names(&[("pppp".to_string(), "trainer".to_string())].into());
    let json = serde_json::to_value(&s).unwrap();
    let json = |id: &str| {
        json["containers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == id)
            .cloned()
    };
    assert_eq!(json("pppp").unwrap()["podman_name"], "trainer");
    assert!(json("cccc").unwrap().get("podman_name").is_none());
    let mut out = Vec::new();
    print_table(&s, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let line = |id: &str| {
        text.lines()
            .find(|l| l.starts_with(id))
            .unwrap()
            .to_string()
    };
    assert!(
        line("pppp").ends_with("  trainer") && line("cccc").ends_with("  -"),
        "{text}"
    );
}

/// Issue 48: memory no process's NVML figure shows (an export kept after its release) is a line per GPU,
/// measured from NVML alone; the container whose ledger charges past its processes' figures is named as the
/// likely holder; with none, past the threshold, the holder is unknown. Shown with no container too.
#[test]
fn shows_each_gpus_unattributed_memory_and_its_likely_holder() {
    use vgpu_host::nvml::GpuReading;
    let dir = tempfile::tempdir().unwrap();
    let root = StateRoot::new(dir.path().to_path_buf());
    let uuid = "GPU-fa4ec0de-0000-4000-8000-000000000000";
    let reading = GpuReading {
        index: 0,
        uuid: uuid.into(),
        used: 1792 << 20,
        processes: Some(vec![(4242, 256 << 20)]),
        ..Default::default()
    };
    let settings = vgpu_monitor::unattributed::Settings::default();

    // No container: the GPU's line all the same.
    let mut s = collect(&root, &[]).unwrap();
    s.note_unattributed(&root, std::slice::from_ref(&reading), settings);
    let mut out = Vec::new();
    print_table(&s, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.lines().any(|l| l.starts_with(uuid)
            && l.contains("1.75 GiB")
            && l.contains("256 MiB")
            && l.contains("1.50 GiB (past the threshold)")
            && l.ends_with("unknown")),
        "{text}"
    );

    // A container whose ledger charges 768 MiB of managed memory NVML's figure leaves out. Its limits
    // record no PID namespace, so it is not known to live and names no holder; a holder is then given by
    // hand, as the monitor's measure finds one for a live container.
    let (ledger, _) = provision(&root, "c1", uuid, 2 << 30);
    let slot = ledger.attach().unwrap();
    ledger
        .charge(&slot, Kind::Managed, 768 << 20, 2 << 30)
        .unwrap();
    let mut s = collect(&root, &[]).unwrap();
    s.note_unattributed(&root, std::slice::from_ref(&reading), settings);
    assert_eq!(
        s.unattributed,
        vec![Unattributed {
            index: 0,
            uuid: uuid.into(),
            used: 1792 << 20,
            reserved: 0,
            processes: 256 << 20,
            unattributed: 1536 << 20,
            past_threshold: true,
            likely_holders: vec![],
        }],
        "a container whose init is not known to live is no holder; its ledger lowers nothing"
    );
    s.unattributed[0].likely_holders = vec![LikelyHolder {
        container_id: "c1".into(),
        charged: 768 << 20,
        nvml: 0,
        likely: 768 << 20,
    }];
    let mut out = Vec::new();
    print_table(&s, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.lines()
            .any(|l| l.starts_with(uuid)
                && l.ends_with("container c1 (-): 768 MiB charged past NVML")),
        "{text}"
    );
    let json = serde_json::to_value(&s).unwrap();
    assert_eq!(json["unattributed"][0]["unattributed"], 1536u64 << 20);
    assert_eq!(
        json["unattributed"][0]["likely_holders"][0]["container_id"],
        "c1"
    );

    // Within the threshold: the figure, no holder, no mark.
    let quiet = GpuReading {
        used: 300 << 20,
        ..reading
    };
    s.note_unattributed(&root, &[quiet], settings);
    let mut out = Vec::new();
    print_table(&s, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.lines()
            .any(|l| l.starts_with(uuid) && l.contains(" 44.0 MiB ") && l.ends_with(" -")),
        "{text}"
    );
    drop(slot);
}

/// Issue 45 item 1: a container HAMi's device plugin started with vgpu's library is listed from HAMi's
/// per-container folder (its pod UID and container, the quota and usage its ledger holds, its process),
/// after the state root's and outside the per-GPU totals; a link and an oversized file beside its ledger
/// are skipped, one line each.
#[test]
fn containers_of_hamis_folders_are_listed_from_their_ledgers() {
    let dir = tempfile::tempdir().unwrap();
    let root = StateRoot::new(dir.path().join("state"));
    let uuid = "GPU-fa4ec0de-0000-4000-8000-000000000000";
    let (_a, _) = provision(&root, "a", uuid, 1 << 30);
    let pod = "7c0e3d1a-0000-4000-8000-000000000002";
    let hami = dir.path().join("containers");
    let folder = hami.join(format!("{pod}_main"));
    std::fs::create_dir_all(&folder).unwrap();
    let l =
        Ledger::open_or_create(&folder.join(format!("{pod}.cache.{uuid}")), uuid, 1 << 30).unwrap();
    let slot = l.attach().unwrap();
    l.charge(&slot, Kind::Data, 300 << 20, 1 << 30).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", folder.join(format!("evil.cache.{uuid}"))).unwrap();
    std::fs::File::create(folder.join(format!("big.cache.{uuid}")))
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let mut s = collect(&root, &[(uuid.to_string(), 16 << 30)]).unwrap();
    s.note_hami(&hami, true, &[uuid.to_string()]);
    assert_eq!(s.containers.len(), 2);
    let c = &s.containers[1];
    assert_eq!(c.id, format!("hami/{pod}_main"));
    assert_eq!(
        c.hami,
        Some(Hami {
            pod_uid: pod.into(),
            container: "main".into(),
            folder: folder.display().to_string(),
            spec: None,
        })
    );
    let g = &c.gpus[0];
    assert_eq!(
        (g.index, g.quota, g.used, g.memory_mode),
        (0, Some(1 << 30), 300 << 20, "unknown")
    );
    assert_eq!(g.processes.len(), 1);
    assert_eq!(g.processes[0].host_pid, Some(std::process::id()));
    assert_eq!(
        s.gpus[0].containers, 1,
        "HAMi's scheduler's, not in the totals"
    );
    assert_eq!(s.hami_skipped.len(), 2, "{:?}", s.hami_skipped);
    assert!(s
        .hami_skipped
        .iter()
        .any(|l| l.contains("evil.cache") && l.contains("symbolic link")));
    assert!(s
        .hami_skipped
        .iter()
        .any(|l| l.contains("big.cache") && l.contains("67108864 bytes")));
    // Docker's names are not for it (HAMi's folder names it).
    s.note_docker_names(&[(c.id.clone(), "x".to_string())].into());
    assert_eq!(s.containers[1].docker_name, None);
    let mut out = Vec::new();
    print_table(&s, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("hami/{pod}_main ")))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("300 MiB (29%)"), "{line}");
    assert!(
        line.ends_with(&format!("HAMi pod UID {pod}, container main")),
        "{line}"
    );
    let json = serde_json::to_value(&s).unwrap();
    assert_eq!(json["containers"][1]["hami"]["pod_uid"], pod);
    assert_eq!(json["hami_skipped"].as_array().unwrap().len(), 2);
    // A folder the config names that is missing says so; HAMi's default one missing is nothing.
    let mut s = collect(&root, &[]).unwrap();
    s.note_hami(&dir.path().join("none"), false, &[]);
    assert!(s.hami_skipped.is_empty());
    s.note_hami(&dir.path().join("none"), true, &[]);
    assert!(
        s.hami_skipped[0].contains("HAMi's containers folder"),
        "{:?}",
        s.hami_skipped
    );
    drop((slot, l));
}
