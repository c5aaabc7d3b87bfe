//! Multi-process stress test of the ledger (harness = false: this file's `main` is the test).
//!
//! The coordinator re-executes this binary as worker processes that all join one ledger file (racing to
//! create it) and charge/refund random amounts of random kinds against a small limit as fast as they can.
//! Meanwhile it SIGKILLs random workers at random moments and starts new ones, reclaims dead slots while the
//! others run (as the garbage collector would), and an observer thread samples `used()` continuously.
//!
//! It fails if the total is ever seen above the limit, if a refusal was not justified, if anything hangs
//! (every wait has a deadline), or if after the last reclaim the ledger's total or any slot is not exactly 0.

use memmap2::MmapMut;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{exit, Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vgpu_ledger::{Kind, Ledger};

const UUID: &str = "GPU-5eed5eed-0000-4000-8000-000000000001";
const LIMIT: u64 = 64 << 20;
const WORKERS: usize = 16;
/// Each worker runs a random number of cycles in this range (long enough that kills land mid-run).
const CYCLES_PER_WORKER: (u64, u64) = (300_000, 1_500_000);
const KILL_PHASE: Duration = Duration::from_secs(12);
const DEADLINE: Duration = Duration::from_secs(150);

/// Counters shared by all processes through a small mapped file.
struct Counters {
    map: MmapMut,
}

const CYCLES: usize = 0;
const REFUSALS: usize = 1;
const CHARGES: usize = 2;
const FAILURES: usize = 3;

impl Counters {
    fn open(path: &Path) -> Counters {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .unwrap();
        file.set_len(64).unwrap();
        // SAFETY: a private 64-byte file of this test, only accessed through atomics.
        let map = unsafe { MmapMut::map_mut(&file).unwrap() };
        Counters { map }
    }

    fn get(&self, i: usize) -> &AtomicU64 {
        // SAFETY: the mapping is 64 bytes, page-aligned; index i < 8 is inside and 8-aligned.
        unsafe { &*(self.map.as_ptr().add(i * 8) as *const AtomicU64) }
    }
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn worker() -> ! {
    let env = |k: &str| std::env::var(k).unwrap();
    let path = PathBuf::from(env("VGPU_STRESS_LEDGER"));
    let counters = Counters::open(Path::new(&env("VGPU_STRESS_COUNTERS")));
    let mut rng = Rng(env("VGPU_STRESS_SEED").parse::<u64>().unwrap() | 1);
    let fail = |what: String| -> ! {
        counters.get(FAILURES).fetch_add(1, SeqCst);
        eprintln!("worker {}: {what}", std::process::id());
        exit(3)
    };
    let ledger = Ledger::open_or_create(&path, UUID, LIMIT).unwrap_or_else(|e| fail(e.to_string()));
    let slot = ledger.attach().unwrap_or_else(|e| fail(e.to_string()));
    let cycles = CYCLES_PER_WORKER.0 + rng.next() % (CYCLES_PER_WORKER.1 - CYCLES_PER_WORKER.0);
    let mut held: Vec<(Kind, u64)> = Vec::new();
    let (mut refusals, mut charges) = (0, 0);
    for cycle in 1..=cycles {
        let r = rng.next();
        let kind = Kind::ALL[(r % 8) as usize];
        let bytes = match (r >> 3) % 4 {
            0 => (r >> 8) % 4096 + 1,
            1 | 2 => ((r >> 8) % 512 + 1) * 4096,
            _ => ((r >> 8) % 8 + 1) << 20,
        };
        match ledger.charge(&slot, kind, bytes, LIMIT) {
            Ok(()) => {
                charges += 1;
                held.push((kind, bytes));
                let used = ledger.used();
                if used > LIMIT {
                    fail(format!("used {used} > limit {LIMIT} right after a charge"));
                }
            }
            Err(refused) => {
                refusals += 1;
                if refused.used + refused.requested <= LIMIT {
                    fail(format!("unjustified refusal: {refused:?}"));
                }
            }
        }
        if !held.is_empty() && (held.len() > 6 || rng.next().is_multiple_of(2)) {
            let (kind, bytes) = held.swap_remove(rng.next() as usize % held.len());
            ledger.refund(&slot, kind, bytes);
        }
        if cycle % 256 == 0 {
            counters.get(CYCLES).fetch_add(256, SeqCst);
            counters.get(REFUSALS).fetch_add(refusals, SeqCst);
            counters.get(CHARGES).fetch_add(charges, SeqCst);
            (refusals, charges) = (0, 0);
        }
    }
    drop(slot); // detach: refunds what is still held
    exit(0)
}

fn spawn(exe: &Path, ledger: &Path, counters: &Path, seed: u64) -> Child {
    Command::new(exe)
        .env("VGPU_STRESS_ROLE", "worker")
        .env("VGPU_STRESS_LEDGER", ledger)
        .env("VGPU_STRESS_COUNTERS", counters)
        .env("VGPU_STRESS_SEED", seed.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn worker")
}

fn main() {
    if std::env::var("VGPU_STRESS_ROLE").as_deref() == Ok("worker") {
        worker();
    }
    if std::env::args().any(|a| a == "--list") {
        return; // test listing: nothing to enumerate, and no reason to run
    }
    let start = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let ledger_path = dir.path().join("stress.ledger");
    let counters_path = dir.path().join("counters");
    let counters = Counters::open(&counters_path);
    let exe = std::env::current_exe().unwrap();
    let mut rng = Rng(std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1);
    println!("stress: seed {}", rng.0);

    // The first wave races to create the ledger.
    let mut workers: Vec<Child> = (0..WORKERS)
        .map(|_| spawn(&exe, &ledger_path, &counters_path, rng.next()))
        .collect();
    let mut spawned = WORKERS;
    let wait_for_file = Instant::now();
    let ledger = loop {
        match Ledger::open(&ledger_path) {
            Ok(l) => break l,
            Err(_) if wait_for_file.elapsed() < Duration::from_secs(30) => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(e) => panic!("ledger never appeared: {e}"),
        }
    };

    // The observer: samples the total through a read-only view (the monitor's) and a read-write one.
    let stop = Arc::new(AtomicBool::new(false));
    let observer = {
        let stop = Arc::clone(&stop);
        let ro = Ledger::open_readonly(&ledger_path).unwrap();
        let rw = Ledger::open(&ledger_path).unwrap();
        std::thread::spawn(move || {
            let (mut samples, mut max, mut snapshots) = (0u64, 0u64, 0u64);
            while !stop.load(SeqCst) {
                for _ in 0..1000 {
                    let used = ro.used().max(rw.used());
                    assert!(used <= LIMIT, "observer saw used {used} > limit {LIMIT}");
                    max = max.max(used);
                    samples += 2;
                }
                let snap = ro.snapshot();
                assert!(snap.used <= LIMIT);
                assert!(snap.slots.iter().all(|s| s.total() <= LIMIT));
                snapshots += 1;
            }
            (samples, max, snapshots)
        })
    };

    // Kill phase: SIGKILL a random worker every few milliseconds, keep the population up, and reclaim dead
    // slots now and then while everybody else keeps charging.
    let (mut kills, mut finished, mut reclaimed_live) = (0u64, 0u64, 0usize);
    let mut last_reclaim = Instant::now();
    let check_exit = |status: std::process::ExitStatus| {
        use std::os::unix::process::ExitStatusExt;
        assert!(
            status.success() || status.signal() == Some(9),
            "worker failed: {status:?}"
        );
    };
    while start.elapsed() < KILL_PHASE {
        std::thread::sleep(Duration::from_micros(rng.next() % 10_000));
        let victim = rng.next() as usize % workers.len();
        let _ = workers[victim].kill(); // SIGKILL; an already finished worker is simply reaped below
        let status = workers.swap_remove(victim).wait().unwrap();
        check_exit(status);
        if status.success() {
            finished += 1;
        } else {
            kills += 1;
        }
        // reap the ones that finished on their own
        let mut i = 0;
        while i < workers.len() {
            if let Some(status) = workers[i].try_wait().unwrap() {
                check_exit(status);
                finished += status.success() as u64;
                kills += (!status.success()) as u64;
                #[allow(clippy::zombie_processes)] // reaped by the try_wait above
                workers.swap_remove(i);
            } else {
                i += 1;
            }
        }
        while workers.len() < WORKERS {
            workers.push(spawn(&exe, &ledger_path, &counters_path, rng.next()));
            spawned += 1;
        }
        if last_reclaim.elapsed() > Duration::from_millis(50) {
            reclaimed_live += ledger.reclaim_dead().unwrap();
            last_reclaim = Instant::now();
        }
    }

    // Kill half of the last wave at random moments, so the final reclaim has leftovers to return; let the
    // others finish. A hang fails the test instead of blocking it.
    for _ in 0..WORKERS / 2 {
        std::thread::sleep(Duration::from_micros(rng.next() % 20_000));
        let victim = rng.next() as usize % workers.len();
        let _ = workers[victim].kill();
        let status = workers.swap_remove(victim).wait().unwrap();
        check_exit(status);
        finished += status.success() as u64;
        kills += (!status.success()) as u64;
    }
    for mut w in workers {
        loop {
            if let Some(status) = w.try_wait().unwrap() {
                check_exit(status);
                finished += 1;
                break;
            }
            if start.elapsed() > DEADLINE {
                let _ = w.kill();
                eprintln!(
                    "stress: FAILED: a worker did not finish within {DEADLINE:?} (deadlock?)"
                );
                exit(1);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    stop.store(true, SeqCst);
    let (samples, max_seen, snapshots) = observer.join().expect("observer failed");
    assert_eq!(
        counters.get(FAILURES).load(SeqCst),
        0,
        "a worker reported a failure"
    );

    // Everyone is gone. Leftovers of killed workers are exact: the total equals the sum over the slots.
    let before = ledger.snapshot();
    let slot_sum: u64 = before.slots.iter().map(|s| s.total()).sum();
    assert_eq!(before.used, slot_sum, "total and per-slot usage disagree");
    assert!(
        before.slots.iter().all(|s| !s.alive),
        "a slot is still held after every worker exited"
    );
    let reclaimed = ledger.reclaim_dead().unwrap();
    let after = ledger.snapshot();
    assert_eq!(ledger.used(), 0, "usage left after reclaim");
    assert!(
        after.slots.is_empty(),
        "slots left after reclaim: {:?}",
        after.slots
    );

    let cycles = counters.get(CYCLES).load(SeqCst);
    println!(
        "stress: {spawned} processes ({WORKERS} at a time), {cycles} charge/refund cycles \
         ({} charges admitted, {} refused at the limit), {kills} SIGKILLs, {finished} clean exits",
        counters.get(CHARGES).load(SeqCst),
        counters.get(REFUSALS).load(SeqCst)
    );
    println!(
        "stress: observer {samples} samples + {snapshots} snapshots, max used {max_seen} <= limit {LIMIT}; \
         reclaimed {reclaimed_live} dead slots while running, {reclaimed} at the end ({} bytes); used now 0",
        before.used
    );
    println!(
        "stress: elapsed {:.1} s; PASSED",
        start.elapsed().as_secs_f64()
    );
}
