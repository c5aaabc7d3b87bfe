//! The shared device state's own checks: layout, concurrency, versions.

use super::*;

fn cfg(dir: &str, totals: Vec<u64>) -> Config {
    Config {
        totals,
        state_dir: dir.to_string(),
    }
}

fn tmpdir(name: &str) -> String {
    let d = std::env::temp_dir().join(format!("fake-gpu-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d.to_string_lossy().into_owned()
}

#[test]
fn charge_refund_and_full() {
    let dir = tmpdir("charge");
    let c = cfg(&dir, vec![1000, 500]);
    let mut a = Shared::open(&c).unwrap();
    a.claim().unwrap();
    assert!(a.charge(0, 600));
    assert!(!a.charge(0, 401));
    assert!(a.charge(0, 400));
    assert_eq!(a.used(0), 1000);
    assert_eq!(a.my_usage(0), 1000);
    a.refund(0, 1000);
    assert_eq!(a.used(0), 0);
    assert!(a.charge(1, 500));
    assert!(!a.charge(1, 1));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn dead_slot_is_reclaimed() {
    let dir = tmpdir("reclaim");
    let c = cfg(&dir, vec![1 << 20]);
    let mut a = Shared::open(&c).unwrap();
    a.claim().unwrap();
    assert!(a.charge(0, 1000));
    let b = Shared::open(&c).unwrap();
    assert_eq!(
        b.snapshot().processes.len(),
        1,
        "a is alive: its lock holds"
    );
    drop(a); // closing the description drops the lock, as process death does
    let snap = b.snapshot();
    assert_eq!(snap.processes.len(), 0);
    assert_eq!(snap.devices, vec![(1 << 20, 0)]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn death_inside_an_operation_is_recounted_exactly() {
    let dir = tmpdir("midop");
    let c = cfg(&dir, vec![1 << 20]);
    let mut live = Shared::open(&c).unwrap();
    live.claim().unwrap();
    assert!(live.charge(0, 300));
    let mut a = Shared::open(&c).unwrap();
    let s = a.claim().unwrap();
    assert!(a.charge(0, 1000));
    // `a` dies after the device step of a 500-byte charge, before the slot step.
    a.layout().slots[s].in_flight.fetch_add(1, SeqCst);
    a.layout().devices[0].used.fetch_add(500, SeqCst);
    drop(a);
    let b = Shared::open(&c).unwrap();
    assert_eq!(
        b.snapshot().devices,
        vec![(1 << 20, 300)],
        "only the live process's 300 bytes remain"
    );
    // And one that died after the slot step of a refund, before the device step.
    let mut a = Shared::open(&c).unwrap();
    let s = a.claim().unwrap();
    assert!(a.charge(0, 1000));
    a.layout().slots[s].in_flight.fetch_add(1, SeqCst);
    a.layout().slots[s].used[0].fetch_sub(400, SeqCst);
    drop(a);
    assert_eq!(b.snapshot().devices, vec![(1 << 20, 300)]);
    live.refund(0, 300);
    assert_eq!(b.snapshot().devices, vec![(1 << 20, 0)]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_dead_reclaimer_does_not_block_others() {
    let dir = tmpdir("deadreclaimer");
    let c = cfg(&dir, vec![1000]);
    let mut a = Shared::open(&c).unwrap();
    a.claim().unwrap();
    // A reclaimer died with the flag up (it no longer holds the reclaim lock).
    a.layout().header.reclaiming.store(1, SeqCst);
    assert!(a.charge(0, 10));
    assert_eq!(a.layout().header.reclaiming.load(SeqCst), 0);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn other_config_is_refused_or_separate() {
    let dir = tmpdir("cfg");
    let a = Shared::open(&cfg(&dir, vec![1000])).unwrap();
    let b = Shared::open(&cfg(&dir, vec![2000])).unwrap();
    assert_eq!(a.total(0), 1000);
    assert_eq!(b.total(0), 2000);
    let path = cfg(&dir, vec![3000]).state_file();
    std::fs::write(&path, b"garbage").unwrap();
    assert!(Shared::open(&cfg(&dir, vec![3000]))
        .unwrap_err()
        .contains("not a fake-cuda state file"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn concurrent_charges_never_exceed_total() {
    let dir = tmpdir("race");
    let c = cfg(&dir, vec![10_000]);
    let shared: Vec<Shared> = (0..4)
        .map(|_| {
            let mut s = Shared::open(&c).unwrap();
            s.claim().unwrap();
            s
        })
        .collect();
    std::thread::scope(|sc| {
        for s in &shared {
            sc.spawn(move || {
                for _ in 0..20_000 {
                    if s.charge(0, 3000) {
                        assert!(s.used(0) <= 10_000);
                        s.refund(0, 3000);
                    }
                }
            });
        }
    });
    assert_eq!(shared[0].used(0), 0);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn paging_counts_the_managed_memory_of_active_processes_only() {
    let dir = tmpdir("paging");
    let c = cfg(&dir, vec![1000]);
    let (mut a, mut b, mut idle) = (
        Shared::open(&c).unwrap(),
        Shared::open(&c).unwrap(),
        Shared::open(&c).unwrap(),
    );
    a.claim().unwrap();
    b.claim().unwrap();
    idle.claim().unwrap();
    let now = crate::monotonic_ns();
    // a: 600 managed, all resident; b: 600 managed on the host (the device had no room).
    assert!(a.charge(0, 600));
    a.add_managed(0, 600, 600);
    b.add_managed(0, 600, 0);
    assert_eq!(b.my_managed(0), (600, 0));
    assert!(!a.paging(0, now), "b has no work queued: a alone fits");
    assert_eq!(a.resident_used(0, now), 600, "b's pages stay on the host");
    b.set_busy_until(now + 1_000_000_000, 1);
    assert!(a.paging(0, now), "600 + 600 of active processes pass 1000");
    assert!(!b.paging(0, now), "a has never queued work: b alone fits");
    a.set_busy_until(now + 1_000_000_000, 1);
    assert!(b.paging(0, now));
    assert!(
        !idle.paging(0, now),
        "a process without managed memory does not fault"
    );
    assert_eq!(
        a.resident_used(0, now),
        1000,
        "b pulled its pages in: the device is full"
    );
    assert!(
        !a.paging(0, now + 2_000_000_000),
        "b's work is older than the window"
    );
    assert_eq!(a.resident_used(0, now + 2_000_000_000), 600);
    b.add_managed(0, -300, 0);
    assert!(!a.paging(0, now), "600 + 300 fit");
    assert_eq!(a.resident_used(0, now), 900);
    drop((a, b, idle));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_process_coming_back_after_another_evicted_it_migrates_once() {
    let dir = tmpdir("migrate");
    let c = cfg(&dir, vec![1000]);
    let (mut a, mut b) = (Shared::open(&c).unwrap(), Shared::open(&c).unwrap());
    a.claim().unwrap();
    b.claim().unwrap();
    a.add_managed(0, 600, 600);
    b.add_managed(0, 300, 0);
    let t = crate::monotonic_ns();
    a.set_busy_until(t, 1);
    b.set_busy_until(t + 10, 1);
    assert!(
        !a.migrates(0, t + 100),
        "b's 300 and a's 600 fit: nothing was evicted"
    );
    b.add_managed(0, 300, 0);
    assert!(
        a.migrates(0, t + 100),
        "b (600) used the device after a's last work"
    );
    assert!(!b.migrates(0, t + 100), "nobody used it after b");
    assert!(
        !a.migrates(0, t - 100),
        "a is still active: its pages are in"
    );
    a.set_busy_until(t + 20, 1);
    assert!(
        !a.migrates(0, t + 100),
        "once a worked again, it is b's turn to come back"
    );
    assert!(b.migrates(0, t + 100));
    drop((a, b));
    std::fs::remove_dir_all(&dir).unwrap();
}
