//! The cost of one `vgpuctl monitor` scrape and of one collection (with its watchdog pass) on a loaded node:
//! N containers spread over the fake driver's GPUs, each with a quota, a ledger with a live slot and usage,
//! and one GPU process of its own in a PID namespace of its own (`unshare -p --fork`), so a collection
//! reads every ledger, asks NVML for every GPU and attributes every process through /proc; a scrape encodes
//! the last collection. Run by `tests/bench/monitor.sh`
//! (root: PID namespaces), which sets the fake driver's environment.
//!
//!     monitor_bench CLIENT NVML_LIB [--containers 256] [--gpus 8] [--scrapes 50]

use std::io::{BufRead, BufReader};
use std::os::unix::fs::MetadataExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use vgpu_host::limits_file::WriteLimits;
use vgpu_host::state_root::StateRoot;
use vgpu_ledger::{DeviceLimit, GpuSettings, Kind, Ledger, Limits};
use vgpu_monitor::{watchdog::Policy, Monitor};

fn arg(args: &[String], name: &str, default: usize) -> usize {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map_or(default, |v| v.parse().expect("a number"))
}

fn ns_of(path: &str) -> u64 {
    std::fs::metadata(path).map(|m| m.ino()).unwrap_or(0)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (client, nvml) = (&args[1], &args[2]);
    let n = arg(&args, "--containers", 256);
    let gpus = arg(&args, "--gpus", 8);
    let scrapes = arg(&args, "--scrapes", 50);
    let own_ns = ns_of("/proc/self/ns/pid");

    // One GPU process per container, each in a PID namespace of its own.
    let mut children: Vec<(Child, u64)> = Vec::new();
    for i in 0..n {
        let mut c = Command::new("unshare")
            .args(["-p", "--fork", "--kill-child", client, "device"])
            .arg((i % gpus).to_string())
            .args(["!alloc", "64Mi", "sleep", "600"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("unshare");
        let out = c.stdout.take().unwrap();
        let line = BufReader::new(out)
            .lines()
            .map_while(Result::ok)
            .find(|l| l.starts_with("op=alloc") || l.starts_with("fatal"));
        assert!(
            line.as_deref().is_some_and(|l| l.contains("rc=0")),
            "client {i} did not allocate: {line:?}"
        );
        let ns = ns_of(&format!("/proc/{}/ns/pid_for_children", c.id()));
        assert!(ns != 0 && ns != own_ns, "no PID namespace of its own");
        children.push((c, ns));
    }

    // On tmpfs, as /run/vgpu is on a node.
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let root = StateRoot::new(dir.path().to_path_buf());
    let mut held = Vec::new();
    for (i, (_, ns)) in children.iter().enumerate() {
        let id = format!("bench-{i:04}");
        let uuid = format!("GPU-fa4ec0de-0000-4000-8000-{:012x}", i % gpus);
        std::fs::create_dir_all(root.ledgers_dir(&id).unwrap()).unwrap();
        // marked as the hook marks what it makes (the monitor reads nothing unmarked)
        vgpu_host::walk::mark(&root.containers_dir()).unwrap();
        vgpu_host::walk::mark(&root.container_dir(&id).unwrap()).unwrap();
        Limits {
            version: vgpu_ledger::LIMITS_VERSION,
            container_id: id.clone(),
            pid_ns: Some(*ns),
            init_pid: Some(1),
            init_start_time: None,
            cgroup: None,
            creator: None,
            devices: vec![DeviceLimit {
                index: 0,
                uuid: uuid.clone(),
                settings: GpuSettings {
                    memory_limit: Some(1 << 30),
                    ..Default::default()
                },
                ledger: vgpu_ledger::layout::relative_ledger_path(&uuid).unwrap(),
                shrunk_from: None,
                held_at_shrink: None,
            }],
            kubernetes: Some(vgpu_ledger::KubeNames {
                namespace: "bench".into(),
                pod: format!("pod-{i}"),
                container: "main".into(),
            }),
            updates: 0,
            updated_at: None,
        }
        .write_atomic(&root.limits_path(&id).unwrap())
        .unwrap();
        let ledger =
            Ledger::open_or_create(&root.ledger_path(&id, &uuid).unwrap(), &uuid, 1 << 30).unwrap();
        let slot = ledger.attach().unwrap();
        ledger
            .charge(&slot, Kind::Context, 16 << 20, 1 << 30)
            .unwrap();
        ledger.charge(&slot, Kind::Data, 64 << 20, 1 << 30).unwrap();
        held.push((ledger, slot));
    }

    // Where the time goes: each part alone.
    {
        use vgpu_host::nvml::{Library, Nvml};
        use vgpu_host::procs;
        use vgpu_host::{attribution, usage};
        let part = |name: &str, f: &mut dyn FnMut()| {
            let t = Instant::now();
            for _ in 0..5 {
                f();
            }
            eprintln!(
                "  {name}: {:.2} ms (mean of 5)",
                t.elapsed().as_secs_f64() * 1e3 / 5.0
            );
        };
        let nv = Library::load(nvml).unwrap();
        let cs = usage::read(&root).unwrap();
        let rs = nv.readings().unwrap();
        part("ledgers (usage::read)", &mut || drop(usage::read(&root)));
        part("NVML (the fake's, all GPUs)", &mut || drop(nv.readings()));
        part("attribution (/proc)", &mut || {
            drop(attribution::attribute(
                &cs,
                &rs,
                procs::inspect,
                procs::own_ns(),
            ))
        });
    }
    let m = Monitor::new(
        root,
        nvml,
        Policy {
            tolerance: 64 << 20,
            kill: false,
        },
    );
    let first = m.scrape();
    let attributed = first
        .lines()
        .filter(|l| l.starts_with("vgpu_container_gpu_memory_nvml_bytes{") && !l.ends_with(" 0"))
        .count();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let stats = |mut times: Vec<Duration>| {
        times.sort();
        format!(
            "min {:.2} ms, median {:.2} ms, p90 {:.2} ms, max {:.2} ms",
            ms(times[0]),
            ms(times[times.len() / 2]),
            ms(times[times.len() * 9 / 10]),
            ms(times[times.len() - 1])
        )
    };
    let timed = |f: &dyn Fn()| {
        let t = Instant::now();
        f();
        t.elapsed()
    };
    // What a scrape costs: the collector's last reading, encoded.
    let scrape = stats(
        (0..scrapes)
            .map(|_| timed(&|| drop(std::hint::black_box(m.scrape()))))
            .collect(),
    );
    // What the collector thread does once per interval: read everything, the watchdog pass.
    let collect = stats(
        (0..scrapes.min(20))
            .map(|_| timed(&|| drop(m.collect())))
            .collect(),
    );
    println!(
        "monitor scrape: {n} containers on {gpus} GPUs, {} GPU processes ({attributed} attributed), {} KiB of text: {scrape} per scrape ({scrapes} scrapes, served from the last collection); collection + watchdog pass (once per interval): {collect} ({} passes)",
        children.len(),
        first.len() / 1024,
        scrapes.min(20),
    );
    drop(held);
    for (mut c, _) in children {
        let _ = c.kill();
        let _ = c.wait();
    }
}
