//! Tests of the arbiter's thread over real ledgers in a temporary state root, NVML and attribution made up.

use super::*;
use vgpu_host::attribution::TrueProc;
use vgpu_host::usage::GpuState;
use vgpu_ledger::{Kind, Ledger};

const UUID: &str = "GPU-fa4ec0de-0000-4000-8000-000000000000";
const GIB: u64 = 1 << 30;

/// Two live oversubscribe containers with a ledger each charged `gib` GiB, NVML busy for both and listing
/// their processes holding as much (and a host process 1 GiB).
struct Node {
    _d: tempfile::TempDir,
    root: StateRoot,
    containers: Vec<ContainerState>,
    truth: Truth,
    gpus: Vec<GpuReading>,
    _ledgers: Vec<(Ledger, vgpu_ledger::Slot)>,
}

fn node(gib: u64) -> Node {
    let d = tempfile::tempdir().unwrap();
    let root = StateRoot::new(d.path().to_path_buf());
    let mut containers = vec![];
    let mut ledgers = vec![];
    let mut truth = Truth {
        listed: vec![UUID.into()],
        ..Default::default()
    };
    for (i, id) in ["c1", "c2"].iter().enumerate() {
        let path = root.ledger_path(id, UUID).unwrap();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let l = Ledger::open_or_create(&path, UUID, 12 * GIB).unwrap();
        let slot = l.attach().unwrap();
        l.charge(&slot, Kind::Data, gib * GIB, 12 * GIB).unwrap();
        ledgers.push((l, slot));
        containers.push(ContainerState {
            id: id.to_string(),
            live: true,
            gpus: vec![GpuState {
                uuid: UUID.into(),
                limit: Some(12 * GIB),
                oversubscribe: true,
                ..Default::default()
            }],
            ..Default::default()
        });
        truth.by_gpu.insert(
            (i, 0),
            vec![TrueProc {
                pid: 100 + i as u32,
                start_time: 1,
                used: gib * GIB,
                tracked: true,
            }],
        );
    }
    let gpus = vec![GpuReading {
        uuid: UUID.into(),
        total: 16 * GIB,
        used: 14 * GIB,
        processes: Some(vec![(100, gib * GIB), (101, gib * GIB), (999, GIB)]),
        process_utilization: Some(vec![(100, 0.9), (101, 0.8)]),
        ..Default::default()
    }];
    Node {
        _d: d,
        root,
        containers,
        truth,
        gpus,
        _ledgers: ledgers,
    }
}

fn turns(enabled: bool) -> Turns {
    Turns {
        enabled,
        quantum: Duration::from_secs(30),
        idle: Duration::from_secs(1),
        grace: Duration::from_secs(5),
        tick: Duration::from_millis(50),
        force: false,
    }
}

impl Node {
    fn turn(&self, id: &str) -> vgpu_ledger::region::TurnSnapshot {
        vgpu_host::hostfile::read_ledger(&self.root.ledger_path(id, UUID).unwrap())
            .unwrap()
            .turn
    }

    /// `n` collections, 10 ms apart, each ticked once.
    fn ticks(&self, a: &Arbiter, n: usize) {
        for _ in 0..n {
            std::thread::sleep(Duration::from_millis(10));
            a.tick(Some(Collection {
                containers: &self.containers,
                gpus: Some(&self.gpus),
                truth: &self.truth,
                at: Instant::now(),
            }));
        }
    }
}

#[test]
fn two_that_do_not_fit_get_hold_and_yield_in_their_ledgers_status_and_a_clean_stop_unmanages() {
    let n = node(10);
    let a = Arbiter::new(turns(true), n.root.clone(), Duration::from_secs(1));
    a.tick(None);
    n.ticks(&a, 3);
    let (t1, t2) = (n.turn("c1"), n.turn("c2"));
    let mut modes = [t1.mode, t2.mode];
    modes.sort_by_key(|m| m.to_byte());
    assert_eq!(modes, [TurnMode::Hold, TurnMode::Yield], "{t1:?} {t2:?}");
    assert!(t1.heartbeat > 0 && t2.heartbeat > 0);
    assert!(t1.epoch > 0 && t1.epoch != t2.epoch);
    // The heartbeat moves at every tick, the mode stays.
    let before = n.turn("c1").heartbeat;
    n.ticks(&a, 1);
    assert!(n.turn("c1").heartbeat > before);
    let st = record::read_gpus(&n.root);
    assert_eq!(st.len(), 1);
    assert!(st[0].contended);
    let holder = st[0].holder.clone().unwrap();
    assert_eq!(n.turn(&holder).mode, TurnMode::Hold);
    assert_eq!(st[0].grants, 1);
    assert!(st[0].held_since_unix_ms.is_some());
    // The scrape's view: one holder, contended.
    let v = a.view(|id, _| n.containers.iter().position(|c| c.id == id).map(|c| (c, 0)));
    assert_eq!(v.gpus.len(), 1);
    assert!(v.gpus[0].1);
    assert_eq!(v.members.iter().filter(|m| m.2).count(), 1);
    a.stop();
    assert_eq!(n.turn("c1").mode, TurnMode::Unmanaged);
    assert_eq!(n.turn("c2").mode, TurnMode::Unmanaged);
    assert!(record::read_gpus(&n.root).is_empty(), "status removed");
    n.ticks(&a, 1);
    assert_eq!(
        n.turn("c1").mode,
        TurnMode::Unmanaged,
        "no tick after the stop"
    );
}

#[test]
fn two_that_fit_are_free_and_a_tampered_ledger_is_never_written_through_a_link() {
    let mut n = node(4);
    n.gpus[0].used = 9 * GIB;
    let a = Arbiter::new(turns(true), n.root.clone(), Duration::from_secs(1));
    n.ticks(&a, 3);
    assert_eq!(n.turn("c1").mode, TurnMode::Free);
    assert_eq!(n.turn("c2").mode, TurnMode::Free);
    assert!(!record::read_gpus(&n.root)[0].contended);
    // c2's ledger replaced by a hard link to another file (a host file, say): not written.
    let p = n.root.ledger_path("c2", UUID).unwrap();
    let other = n.root.root().join("host-file");
    std::fs::copy(&p, &other).unwrap();
    std::fs::remove_file(&p).unwrap();
    std::fs::hard_link(&other, &p).unwrap();
    let before = std::fs::read(&other).unwrap();
    n.ticks(&a, 2);
    assert_eq!(std::fs::read(&other).unwrap(), before);
}

/// Issue 44's attack: a container that runs no CUDA at all writes 12 GiB into its ledger's total and keeps
/// moving its `launches` and waiting words, beside an honest neighbour that NVML shows busy with 3 GiB on
/// a 16 GiB GPU. The old arbiter read the words (wanting, working, 15 GiB charged past the 15 GiB left)
/// and took turns: the neighbour was told to yield. Now NVML decides: the forger holds nothing and never
/// used the GPU, so nobody is told anything but Free.
#[test]
fn a_forged_total_and_moving_words_cost_no_neighbour() {
    let mut n = node(12);
    n.truth.by_gpu.get_mut(&(0, 0)).unwrap()[0].used = 3 * GIB;
    n.truth.by_gpu.remove(&(1, 0));
    n.gpus[0].used = 4 * GIB;
    n.gpus[0].processes = Some(vec![(100, 3 * GIB), (999, GIB)]);
    n.gpus[0].process_utilization = Some(vec![(100, 0.9)]);
    let a = Arbiter::new(turns(true), n.root.clone(), Duration::from_secs(1));
    let (forger, _) = &n._ledgers[1];
    for _ in 0..20 {
        forger.turn().note_launch();
        forger.turn().add_waiting(1);
        forger.turn().add_waited(50_000_000);
        n.ticks(&a, 1);
    }
    let st = record::read_gpus(&n.root);
    assert!(!st[0].contended, "{st:?}");
    assert_eq!(n.turn("c1").mode, TurnMode::Free, "the honest one runs");
    assert_eq!(
        (st[0].grants, st[0].out_of_turn, st[0].revocations),
        (0, 0, 0)
    );
}

#[test]
fn switched_off_it_only_unmanages_what_a_previous_run_left() {
    let n = node(10);
    let on = Arbiter::new(turns(true), n.root.clone(), Duration::from_secs(1));
    n.ticks(&on, 3);
    assert_ne!(n.turn("c1").mode, TurnMode::Unmanaged);
    // That run crashed (no stop); the next one runs switched off.
    let off = Arbiter::new(turns(false), n.root.clone(), Duration::from_secs(1));
    n.ticks(&off, 2);
    assert_eq!(n.turn("c1").mode, TurnMode::Unmanaged);
    assert_eq!(n.turn("c2").mode, TurnMode::Unmanaged);
}

#[test]
fn a_restart_thaws_what_the_last_run_recorded_frozen() {
    let d = tempfile::tempdir().unwrap();
    let root = StateRoot::new(d.path().to_path_buf());
    // A cgroup outside the mount is never touched; one under it would be thawed (not made here: the
    // test runs without a cgroup of its own to freeze).
    let outside = d.path().join("cg");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("cgroup.freeze"), "1").unwrap();
    record::frozen_record(&root)
        .write(&[crate::frozen::Frozen {
            container: "c1".into(),
            cgroup: outside.clone(),
        }])
        .unwrap();
    Arbiter::new(turns(true), root.clone(), Duration::from_secs(1)).thaw_left_frozen();
    if vgpu_host::cgroup::host_v2_mount().is_some() {
        assert_eq!(
            std::fs::read_to_string(outside.join("cgroup.freeze")).unwrap(),
            "1"
        );
        assert!(
            record::frozen_record(&root).read().is_empty(),
            "the record is done"
        );
    }
}
