//! Ledger behaviour that needs real processes: fork, SIGKILL, PID namespaces, a non-root tenant.
//! (harness = false: `main` runs the scenarios one after the other on one thread, so `fork` is safe.)

use nix::sys::signal::{kill, Signal};
use nix::sys::stat::{umask, Mode};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, pipe, read, write, ForkResult, Gid, Pid, Uid};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use vgpu_ledger::{Kind, Ledger, Snapshot};

const UUID: &str = "GPU-f0f0f0f0-0000-4000-8000-000000000002";
const LIMIT: u64 = 1 << 30;

/// Run `f` in a forked child that exits with its return code (101 if it panics). Returns the child's pid.
fn spawn(f: impl FnOnce() -> i32) -> Pid {
    // SAFETY: this test's process is single-threaded when it forks (harness = false, no threads started).
    match unsafe { fork() }.expect("fork") {
        ForkResult::Child => {
            let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(101);
            // SAFETY: _exit skips the parent's atexit handlers and destructors, which a forked child must not run.
            unsafe { nix::libc::_exit(code) }
        }
        ForkResult::Parent { child } => child,
    }
}

fn send(fd: &OwnedFd, value: u32) {
    assert_eq!(write(fd, &value.to_le_bytes()).unwrap(), 4);
}

/// Read one u32 a child sent; None if it died first.
fn receive(fd: &OwnedFd) -> Option<u32> {
    let mut b = [0u8; 4];
    match read(fd, &mut b) {
        Ok(4) => Some(u32::from_le_bytes(b)),
        _ => None,
    }
}

/// Park a child until it is killed; it exits by itself once the test process is gone, so a failing test
/// leaves nothing behind. Children in another PID namespace cannot see the test's PID: they get a parent
/// death signal instead (see `pid_namespaces`).
fn sleep_forever() -> ! {
    let test = Pid::from_raw(std::env::var("VGPU_TEST_PID").unwrap().parse().unwrap());
    loop {
        std::thread::sleep(Duration::from_millis(20));
        if std::process::id() != 1 && kill(test, None).is_err() {
            // SAFETY: leaving a forked child without running the parent's destructors.
            unsafe { nix::libc::_exit(0) }
        }
    }
}

fn kill_and_reap(pid: Pid) {
    kill(pid, Signal::SIGKILL).unwrap();
    assert!(matches!(
        waitpid(pid, None).unwrap(),
        WaitStatus::Signaled(_, Signal::SIGKILL, _)
    ));
}

/// Wait until the slot is no longer alive (its last holder exited), at most 10 s.
fn wait_dead(ledger: &Ledger, index: u16) -> Snapshot {
    let t = Instant::now();
    loop {
        let snap = ledger.snapshot();
        if snap.slots.iter().all(|s| s.index != index || !s.alive) {
            return snap;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "slot {index} still alive"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn fresh(dir: &Path, name: &str) -> (PathBuf, Ledger) {
    let path = dir.join(name);
    let ledger = Ledger::open_or_create(&path, UUID, LIMIT).unwrap();
    (path, ledger)
}

/// A forked child gives up its copy of the parent's slot and attaches its own; the parent's death then
/// frees the parent's slot only.
fn fork_child_forgets_parent_slot(dir: &Path) {
    let (path, ledger) = fresh(dir, "fork.ledger");
    let (rx, tx) = pipe().unwrap();
    let parent = spawn(|| {
        let l = Ledger::open(&path).unwrap();
        let slot = l.attach().unwrap();
        l.charge(&slot, Kind::Data, 1000, LIMIT).unwrap();
        let (crx, ctx) = pipe().unwrap();
        let slot_index = slot.index() as u32;
        // Held in an Option so that only the child's code gives it up (the parent keeps it).
        let mut held = Some(slot);
        let _child = spawn(|| {
            held.take().unwrap().forget_after_fork();
            let own = l.attach().unwrap();
            l.charge(&own, Kind::Module, 500, LIMIT).unwrap();
            send(&ctx, own.index() as u32);
            sleep_forever()
        });
        let child_slot = receive(&crx).expect("child died");
        assert!(held.is_some());
        send(&tx, slot_index);
        send(&tx, child_slot);
        sleep_forever()
    });
    let parent_slot = receive(&rx).expect("parent died") as u16;
    let child_slot = receive(&rx).expect("parent died") as u16;
    assert_ne!(parent_slot, child_slot);
    let snap = ledger.snapshot();
    assert_eq!(snap.used, 1500);
    assert!(snap.slots.iter().all(|s| s.alive));
    let child_pid = snap
        .slots
        .iter()
        .find(|s| s.index == child_slot)
        .unwrap()
        .pid;

    kill_and_reap(parent);
    let snap = wait_dead(&ledger, parent_slot);
    assert!(
        snap.slots
            .iter()
            .find(|s| s.index == child_slot)
            .unwrap()
            .alive,
        "the child's own slot must live on"
    );
    assert_eq!(ledger.reclaim_dead().unwrap(), 1);
    assert_eq!(ledger.used(), 500);

    kill(Pid::from_raw(child_pid as i32), Signal::SIGKILL).unwrap(); // an orphan now; init reaps it
    wait_dead(&ledger, child_slot);
    assert_eq!(ledger.reclaim_dead().unwrap(), 1);
    assert_eq!(ledger.used(), 0);
    assert!(ledger.snapshot().slots.is_empty());
}

/// A child that never gives up the inherited slot (no `forget_after_fork`) does not keep the parent's slot
/// alive either: the slot's lock is pinned by a mapping that fork children do not inherit, and there is no
/// descriptor to inherit.
fn fork_child_keeping_the_slot_does_not_keep_parent_alive(dir: &Path) {
    let (path, ledger) = fresh(dir, "inherit.ledger");
    let (rx, tx) = pipe().unwrap();
    let parent = spawn(|| {
        let l = Ledger::open(&path).unwrap();
        let slot = l.attach().unwrap();
        l.charge(&slot, Kind::Data, 777, LIMIT).unwrap();
        let child = spawn(|| sleep_forever());
        send(&tx, slot.index() as u32);
        send(&tx, child.as_raw() as u32);
        sleep_forever()
    });
    let slot = receive(&rx).unwrap() as u16;
    let child = Pid::from_raw(receive(&rx).unwrap() as i32);
    assert!(ledger
        .snapshot()
        .slots
        .iter()
        .any(|s| s.index == slot && s.alive));
    kill_and_reap(parent);
    wait_dead(&ledger, slot);
    assert_eq!(ledger.reclaim_dead().unwrap(), 1);
    assert_eq!(ledger.used(), 0);
    kill(child, Signal::SIGKILL).unwrap(); // an orphan now; init reaps it
}

/// The measurement lock is pinned like a slot's lock: a fork child of its holder neither inherits it nor
/// keeps it alive, and it goes with the holder's death.
fn fork_child_does_not_keep_the_measurement_lock(dir: &Path) {
    let (path, ledger) = fresh(dir, "measure.ledger");
    let (rx, tx) = pipe().unwrap();
    let (crx, ctx) = pipe().unwrap();
    let holder = spawn(|| {
        let l = Ledger::open(&path).unwrap();
        let _held = l.try_measure_lock().unwrap().expect("nobody else holds it");
        let child = spawn(|| {
            // The child cannot see the parent's lock as its own: taking it must fail while the parent lives.
            let l = Ledger::open(&path).unwrap();
            let free = l.try_measure_lock().unwrap().is_some();
            send(&ctx, u32::from(free));
            sleep_forever()
        });
        send(&tx, child.as_raw() as u32);
        sleep_forever()
    });
    let child_free = receive(&crx).expect("child died");
    let child = Pid::from_raw(receive(&rx).expect("holder died") as i32);
    assert_eq!(
        child_free, 0,
        "a fork child must not hold its parent's measurement lock"
    );
    assert!(ledger.measure_locked().unwrap());
    kill_and_reap(holder);
    let t = Instant::now();
    while ledger.measure_locked().unwrap() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the live fork child keeps the measurement lock"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(ledger.try_measure_lock().unwrap().is_some());
    kill(child, Signal::SIGKILL).unwrap(); // an orphan now; init reaps it
}

/// `exec` ends the process image that owned the slot: the pin mapping goes with it, so the slot is dead
/// (and reclaimable) while the process itself lives on as another program.
fn exec_releases_the_slot(dir: &Path) {
    let (path, ledger) = fresh(dir, "exec.ledger");
    let (rx, tx) = pipe().unwrap();
    let child = spawn(|| {
        let l = Ledger::open(&path).unwrap();
        let slot = l.attach().unwrap();
        l.charge(&slot, Kind::Data, 4242, LIMIT).unwrap();
        send(&tx, slot.index() as u32);
        std::mem::forget(slot);
        let err =
            std::os::unix::process::CommandExt::exec(std::process::Command::new("sleep").arg("30"));
        panic!("exec: {err}")
    });
    let slot = receive(&rx).expect("child died") as u16;
    wait_dead(&ledger, slot);
    assert!(kill(child, None).is_ok(), "the process lives on as `sleep`");
    assert_eq!(ledger.reclaim_dead().unwrap(), 1);
    assert_eq!(ledger.used(), 0);
    kill_and_reap(child);
}

/// Close every descriptor from 3 up, except `keep`, as a daemon's cleanup does (close_range, or a loop where
/// the kernel lacks it).
fn close_all_from_3(keep: &[i32]) {
    use nix::libc;
    let mut keep: Vec<i32> = keep.to_vec();
    keep.sort_unstable();
    let mut lo = 3u32;
    for k in keep.iter().copied().chain([i32::MAX]) {
        let hi = if k == i32::MAX {
            u32::MAX
        } else {
            (k - 1) as u32
        };
        if (k as u32) >= lo && hi >= lo {
            // SAFETY: close_range on numbers this test process owns; it owns no Rust value holding them
            // but the kept ones.
            if unsafe { libc::syscall(libc::SYS_close_range, lo, hi, 0) } != 0 {
                for fd in lo..=hi.min(65_536) {
                    // SAFETY: as above, a loop for kernels without close_range.
                    unsafe { libc::close(fd as i32) };
                }
            }
        }
        if k != i32::MAX {
            lo = k as u32 + 1;
        }
    }
}

/// Fill the lowest free descriptor numbers with pipes (as the application's own files would reuse the
/// numbers it just freed). Returns (read end, write end) pairs.
fn reuse_numbers_with_pipes(count: usize) -> Vec<(OwnedFd, OwnedFd)> {
    (0..count).map(|_| pipe().unwrap()).collect()
}

/// Every pipe still carries data: a byte written comes back. Returns how many failed.
fn broken_pipes(pipes: &[(OwnedFd, OwnedFd)]) -> u32 {
    let mut bad = 0;
    for (i, (r, w)) in pipes.iter().enumerate() {
        let b = [i as u8];
        let mut got = [0u8];
        let ok = matches!(write(w, &b), Ok(1)) && matches!(read(r, &mut got), Ok(1)) && got == b;
        bad += u32::from(!ok);
    }
    bad
}

/// A live process that closes every descriptor from 3 up and reuses the numbers for pipes keeps its slot:
/// another process's reclaim leaves its usage charged; its own reclaim (as a refused charge runs) takes
/// nothing from live slots; and a fork child giving up the slot does not close the application's pipes.
fn closed_descriptors_keep_the_slot(dir: &Path) {
    let (path, ledger) = fresh(dir, "closefds.ledger");
    let other = ledger.attach().unwrap();
    ledger.charge(&other, Kind::Data, 500, LIMIT).unwrap();
    let (rx, tx) = pipe().unwrap();
    let (go_rx, go_tx) = pipe().unwrap();
    let app = spawn(|| {
        let l = Ledger::open(&path).unwrap();
        let slot = l.attach().unwrap();
        l.charge(&slot, Kind::Data, 1000, LIMIT).unwrap();
        close_all_from_3(&[tx.as_raw_fd(), go_rx.as_raw_fd()]);
        let pipes = reuse_numbers_with_pipes(64);
        send(&tx, 1); // ready: the test process reclaims now
        receive(&go_rx).expect("test process died");
        // our own reclaim, as a refused charge runs it: live slots keep their usage
        let _ = l.reclaim_dead();
        send(&tx, l.used() as u32);
        send(&tx, broken_pipes(&pipes));
        // a fork child gives the slot up: the application's pipes must stay open, in the child too
        let mut held = Some(slot);
        let child = spawn(|| {
            held.take().unwrap().forget_after_fork();
            broken_pipes(&pipes) as i32
        });
        let child_bad = match waitpid(child, None) {
            Ok(WaitStatus::Exited(_, code)) => code as u32,
            _ => 1000,
        };
        send(&tx, child_bad);
        assert!(held.is_some());
        sleep_forever()
    });
    assert_eq!(receive(&rx), Some(1), "the application process died");
    let mut failures = Vec::new();
    let reclaimed = ledger.reclaim_dead().unwrap();
    if reclaimed != 0 || ledger.used() != 1500 {
        failures.push(format!(
            "another process's reclaim took the live process's usage (reclaimed {reclaimed} slots, used {} of 1500)",
            ledger.used()
        ));
    }
    send(&go_tx, 1);
    let used_after_own = receive(&rx).expect("application died");
    let bad = receive(&rx).expect("application died");
    let child_bad = receive(&rx).expect("application died");
    if used_after_own != 1500 {
        failures.push(format!(
            "the process's own reclaim emptied live slots (used {used_after_own} of 1500 after it)"
        ));
    }
    if bad != 0 {
        failures.push(format!(
            "{bad} of the application's pipes broke in the process"
        ));
    }
    if child_bad != 0 {
        failures.push(format!(
            "{child_bad} of the application's pipes broke in the fork child"
        ));
    }
    kill_and_reap(app);
    drop(other);
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Two processes that are both PID 1, each in its own PID namespace: liveness is per slot lock, so killing
/// one returns exactly its usage. Returns false if this machine does not allow new PID namespaces.
fn pid_namespaces(dir: &Path) -> bool {
    use nix::sched::{unshare, CloneFlags};
    let (path, ledger) = fresh(dir, "pidns.ledger");
    let mut pid1s = Vec::new();
    for (i, bytes) in [(0u32, 4096u64), (1, 8192)] {
        let (rx, tx) = pipe().unwrap();
        let path = path.clone();
        let intermediate = spawn(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).unwrap();
            if unshare(CloneFlags::CLONE_NEWPID).is_err()
                && unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWPID).is_err()
            {
                return 77;
            }
            let (grx, gtx) = pipe().unwrap();
            let inner = spawn(move || {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).unwrap();
                assert_eq!(
                    std::process::id(),
                    1,
                    "first process of a new PID namespace"
                );
                let l = Ledger::open(&path).unwrap();
                let slot = l.attach().unwrap();
                l.charge(&slot, Kind::Context, bytes, LIMIT).unwrap();
                send(&gtx, slot.index() as u32);
                sleep_forever()
            });
            let slot = receive(&grx).expect("namespace child died");
            send(&tx, inner.as_raw() as u32); // its PID as our namespace sees it
            send(&tx, slot);
            let _ = waitpid(inner, None);
            0
        });
        let Some(host_pid) = receive(&rx) else {
            assert!(matches!(
                waitpid(intermediate, None).unwrap(),
                WaitStatus::Exited(_, 77)
            ));
            return false;
        };
        let slot = receive(&rx).unwrap() as u16;
        pid1s.push((intermediate, Pid::from_raw(host_pid as i32), slot, i));
    }
    let snap = ledger.snapshot();
    assert_eq!(snap.used, 4096 + 8192);
    let own_ns = std::fs::metadata("/proc/self/ns/pid")
        .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
        .unwrap();
    let (a, b) = (&snap.slots[0], &snap.slots[1]);
    assert!(a.pid == 1 && b.pid == 1, "both record PID 1: {snap:?}");
    assert!(a.pid_ns != b.pid_ns && a.pid_ns != own_ns && b.pid_ns != own_ns);
    assert!(a.alive && b.alive);

    let (intermediate, host_pid, slot, _) = pid1s.remove(0);
    kill(host_pid, Signal::SIGKILL).unwrap();
    assert!(matches!(
        waitpid(intermediate, None).unwrap(),
        WaitStatus::Exited(_, 0)
    ));
    let snap = wait_dead(&ledger, slot);
    assert!(
        snap.slots.iter().any(|s| s.index != slot && s.alive),
        "the other PID 1 is unaffected"
    );
    assert_eq!(ledger.reclaim_dead().unwrap(), 1);
    assert_eq!(ledger.used(), 8192);

    let (intermediate, host_pid, slot, _) = pid1s.remove(0);
    kill(host_pid, Signal::SIGKILL).unwrap();
    assert!(matches!(
        waitpid(intermediate, None).unwrap(),
        WaitStatus::Exited(_, 0)
    ));
    wait_dead(&ledger, slot);
    assert_eq!(ledger.reclaim_dead().unwrap(), 1);
    assert_eq!(ledger.used(), 0);
    true
}

/// The hook creates ledgers as root (whatever its umask); the container's processes may not be root and
/// must still charge them. Returns false when not run as root (nothing to switch from).
fn non_root_tenant_can_charge(dir: &Path) -> bool {
    if !Uid::effective().is_root() {
        return false;
    }
    let old = umask(Mode::from_bits_truncate(0o077));
    let (path, ledger) = fresh(dir, "tenant.ledger");
    umask(old);
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o666
    );
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let child = spawn(|| {
        nix::unistd::setgid(Gid::from_raw(65534)).unwrap();
        nix::unistd::setuid(Uid::from_raw(65534)).unwrap();
        let l = Ledger::open(&path).unwrap();
        let slot = l.attach().unwrap();
        l.charge(&slot, Kind::Data, 12345, LIMIT).unwrap();
        if l.used() != 12345 {
            return 1;
        }
        std::mem::forget(slot); // exit without detaching, as a killed process would
        0
    });
    assert!(matches!(
        waitpid(child, None).unwrap(),
        WaitStatus::Exited(_, 0)
    ));
    assert_eq!(ledger.used(), 12345);
    assert_eq!(ledger.reclaim_dead().unwrap(), 1);
    assert_eq!(ledger.used(), 0);
    true
}

/// Four processes refill and charge one compute bucket at once: no interval is earned twice and no
/// charge is lost (at a 100% share every earned nanosecond is exact, so the sum must balance).
fn compute_bucket_is_shared_exactly(dir: &Path) {
    let (path, ledger) = fresh(dir, "compute");
    let now = || {
        nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
            .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
            .unwrap()
    };
    let start = now();
    ledger
        .compute()
        .refill(start, vgpu_ledger::region::PPM, i64::MAX);
    let before = ledger.compute().snapshot();
    const CHARGES: u64 = 20_000;
    let children: Vec<Pid> = (0..4)
        .map(|_| {
            let path = path.clone();
            spawn(move || {
                let l = Ledger::open(&path).unwrap();
                for _ in 0..CHARGES {
                    l.compute()
                        .refill(now(), vgpu_ledger::region::PPM, i64::MAX);
                    l.compute().settle(7, 0);
                }
                0
            })
        })
        .collect();
    for c in children {
        assert!(matches!(
            waitpid(c, None).unwrap(),
            WaitStatus::Exited(_, 0)
        ));
    }
    let after = ledger.compute().snapshot();
    assert_eq!(after.launches - before.launches, 4 * CHARGES);
    assert_eq!(after.charged_ns - before.charged_ns, 4 * CHARGES * 7);
    let earned = (after.refilled_at - before.refilled_at) as i64;
    assert_eq!(
        after.tokens,
        before.tokens + earned - (4 * CHARGES * 7) as i64
    );
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    // A hang (deadlock) ends the test by SIGALRM instead of blocking `make test`; the children notice.
    nix::unistd::alarm::set(120);
    std::env::set_var("VGPU_TEST_PID", std::process::id().to_string());
    let dir = tempfile::tempdir().unwrap();
    let mut passed = 0;
    let mut skipped = Vec::new();
    fork_child_forgets_parent_slot(dir.path());
    passed += 1;
    println!("processes: fork child forgets the parent's slot ... ok");
    fork_child_keeping_the_slot_does_not_keep_parent_alive(dir.path());
    passed += 1;
    println!("processes: a fork child that keeps the parent's slot does not keep it alive ... ok");
    fork_child_does_not_keep_the_measurement_lock(dir.path());
    passed += 1;
    println!(
        "processes: a fork child neither holds nor keeps its parent's measurement lock ... ok"
    );
    exec_releases_the_slot(dir.path());
    passed += 1;
    println!("processes: exec releases the slot ... ok");
    compute_bucket_is_shared_exactly(dir.path());
    passed += 1;
    println!("processes: four processes share one compute bucket exactly ... ok");
    closed_descriptors_keep_the_slot(dir.path());
    passed += 1;
    println!(
        "processes: a process closing and reusing every descriptor from 3 keeps its slot ... ok"
    );
    if pid_namespaces(dir.path()) {
        passed += 1;
        println!("processes: two PID-1 processes in separate PID namespaces ... ok");
    } else {
        skipped.push("PID namespaces (unshare not permitted here)");
    }
    if non_root_tenant_can_charge(dir.path()) {
        passed += 1;
        println!(
            "processes: non-root process charges a ledger root created under umask 077 ... ok"
        );
    } else {
        skipped.push("non-root tenant (test not run as root)");
    }
    for s in &skipped {
        println!("processes: SKIPPED {s}");
    }
    println!(
        "processes: {passed} passed, 0 failed, {} skipped",
        skipped.len()
    );
}
