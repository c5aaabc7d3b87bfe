//! Micro-benchmark of the ledger's hot path: nanoseconds per charge+refund pair, in one process, in several
//! threads of one process sharing its slot, and in several processes (each with its own slot) at once.
//!
//!     cargo run --release -p vgpu-ledger --example bench -- [--pairs N] [--procs 1,2,8] [--threads 1,4]
//!
//! For scale it also times the same loop on a bare shared AtomicU64 (fetch_add + fetch_sub), the least any
//! shared counter can cost.

use memmap2::MmapMut;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::Instant;
use vgpu_ledger::{Kind, Ledger};

const UUID: &str = "GPU-be4c4000-0000-4000-8000-000000000000";
const LIMIT: u64 = 1 << 40;

/// A tiny mapped file shared with the worker processes: [ready, go, ns of worker 0, ns of worker 1, ...].
fn shared_words(path: &Path, words: usize) -> MmapMut {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .unwrap();
    file.set_len((words * 8) as u64).unwrap();
    // SAFETY: a private file of this benchmark, accessed only through atomics.
    unsafe { MmapMut::map_mut(&file).unwrap() }
}

fn word(map: &MmapMut, i: usize) -> &AtomicU64 {
    assert!((i + 1) * 8 <= map.len());
    // SAFETY: in bounds (checked) and 8-aligned (page-aligned mapping).
    unsafe { &*(map.as_ptr().add(i * 8) as *const AtomicU64) }
}

/// Run `pairs` charge+refund pairs on one slot; returns elapsed nanoseconds.
fn run_pairs(ledger: &Ledger, slot: &vgpu_ledger::Slot, pairs: u64) -> u64 {
    let t = Instant::now();
    for i in 0..pairs {
        let bytes = 4096 + (i & 0xff) * 512;
        ledger
            .charge(slot, Kind::Data, bytes, LIMIT)
            .expect("charge refused");
        ledger.refund(slot, Kind::Data, bytes);
    }
    t.elapsed().as_nanos() as u64
}

fn worker(ledger_path: &Path, sync_path: &Path, index: usize, pairs: u64) {
    let sync = shared_words(sync_path, 2 + index + 1);
    let ledger = Ledger::open(ledger_path).unwrap();
    let slot = ledger.attach().unwrap();
    run_pairs(&ledger, &slot, pairs / 10); // warm up
    word(&sync, 0).fetch_add(1, SeqCst);
    while word(&sync, 1).load(SeqCst) == 0 {
        std::thread::yield_now();
    }
    let ns = run_pairs(&ledger, &slot, pairs);
    word(&sync, 2 + index).store(ns, SeqCst);
}

fn processes(exe: &Path, ledger_path: &Path, dir: &Path, procs: usize, pairs: u64) {
    let sync_path = dir.join(format!("sync-{procs}"));
    let sync = shared_words(&sync_path, 2 + procs);
    let children: Vec<_> = (0..procs)
        .map(|i| {
            Command::new(exe)
                .args([
                    "--worker",
                    &ledger_path.display().to_string(),
                    &sync_path.display().to_string(),
                ])
                .args([i.to_string(), pairs.to_string()])
                .stdin(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    while word(&sync, 0).load(SeqCst) < procs as u64 {
        std::thread::yield_now();
    }
    let t = Instant::now();
    word(&sync, 1).store(1, SeqCst);
    for mut c in children {
        assert!(c.wait().unwrap().success(), "worker failed");
    }
    let wall = t.elapsed().as_nanos() as f64;
    let per_proc: Vec<f64> = (0..procs)
        .map(|i| word(&sync, 2 + i).load(SeqCst) as f64 / pairs as f64)
        .collect();
    let mean = per_proc.iter().sum::<f64>() / procs as f64;
    let total = (procs as u64 * pairs) as f64;
    println!(
        "ledger bench: {procs:>2} process(es): {mean:>7.1} ns per charge+refund pair per process, \
         aggregate {:>6.2} M pairs/s ({:.1} ns per pair of wall time)",
        total / wall * 1e3,
        wall / total
    );
}

fn threads(ledger: &Ledger, threads: usize, pairs: u64) {
    let slot = ledger.attach().unwrap();
    let t = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| run_pairs(ledger, &slot, pairs));
        }
    });
    let wall = t.elapsed().as_nanos() as f64;
    let total = (threads as u64 * pairs) as f64;
    println!(
        "ledger bench: {threads:>2} thread(s) sharing one slot: aggregate {:>6.2} M pairs/s ({:.1} ns per pair of wall time)",
        total / wall * 1e3,
        wall / total
    );
}

fn bare_atomic(dir: &Path, pairs: u64) {
    let map = shared_words(&dir.join("bare"), 1);
    let w = word(&map, 0);
    let t = Instant::now();
    for i in 0..pairs {
        let bytes = 4096 + (i & 0xff) * 512;
        w.fetch_add(bytes, SeqCst);
        w.fetch_sub(bytes, SeqCst);
    }
    let ns = t.elapsed().as_nanos() as f64 / pairs as f64;
    println!("ledger bench: baseline: {ns:>7.1} ns per fetch_add+fetch_sub pair on a bare shared AtomicU64");
}

fn list(arg: Option<String>, default: &[usize]) -> Vec<usize> {
    match arg {
        Some(s) => s
            .split(',')
            .map(|x| x.trim().parse().expect("a comma-separated list of numbers"))
            .collect(),
        None => default.to_vec(),
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut pairs = 2_000_000u64;
    let (mut procs_arg, mut threads_arg) = (None, None);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--worker" => {
                let ledger = PathBuf::from(args.next().unwrap());
                let sync = PathBuf::from(args.next().unwrap());
                let index = args.next().unwrap().parse().unwrap();
                let pairs = args.next().unwrap().parse().unwrap();
                return worker(&ledger, &sync, index, pairs);
            }
            "--pairs" => pairs = args.next().and_then(|p| p.parse().ok()).expect("--pairs N"),
            "--procs" => procs_arg = args.next(),
            "--threads" => threads_arg = args.next(),
            "--bench" => {} // cargo bench passes this
            other => {
                eprintln!("bench: unknown argument {other:?} (use --pairs N, --procs 1,2,8, --threads 1,4)");
                std::process::exit(2);
            }
        }
    }
    let procs = list(procs_arg, &[1, 2, 8]);
    let thread_counts = list(threads_arg, &[1, 4]);
    let dir = tempfile::tempdir().unwrap();
    let ledger_path = dir.path().join("bench.ledger");
    let ledger = Ledger::open_or_create(&ledger_path, UUID, LIMIT).unwrap();
    let exe = std::env::current_exe().unwrap();
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    println!("ledger bench: {pairs} pairs per process/thread, {cpus} CPUs");
    bare_atomic(dir.path(), pairs);
    for &t in &thread_counts {
        threads(&ledger, t, pairs);
    }
    for &p in &procs {
        processes(&exe, &ledger_path, dir.path(), p, pairs);
    }
    assert_eq!(ledger.used(), 0);
}
