//! Tests of the ledger as a whole, through its handles: files, slots, charging, reclaim, views, threads,
//! and a model-checked property test. Tests of `Kind` and of the byte format sit beside their code.

use super::format::FILE_SIZE;
use super::slot::own_pid_namespace;
use super::{
    Kind, Ledger, LedgerError, Refused, Slot, Snapshot, KINDS, MAX_TOTAL, PPM, SLOT_COUNT,
};
use proptest::prelude::*;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::atomic::Ordering::SeqCst;

/// The host tools' view (`vgpu_host::hostfile::read_ledger` opens the file as untrusted first).
fn read_file(path: &std::path::Path) -> Result<Snapshot, LedgerError> {
    let file = std::fs::File::open(path).map_err(|source| LedgerError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    Snapshot::from_file(path, &file)
}

const GI: u64 = 1 << 30;
const UUID: &str = "GPU-11111111-2222-3333-4444-555555555555";

fn fresh() -> (tempfile::TempDir, PathBuf, Ledger) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.ledger");
    let ledger = Ledger::open_or_create(&path, UUID, GI).unwrap();
    (dir, path, ledger)
}

fn slot_usage(l: &Ledger, slot: &Slot) -> [u64; KINDS] {
    l.shared().slot_usage(slot.index() as usize)
}

/// Σ of all slots' usage, counting the operation in the commit word if it is not applied yet.
fn snapshot_sum(l: &Ledger) -> u64 {
    l.snapshot().slots.iter().map(|s| s.total()).sum()
}

#[test]
fn create_then_join() {
    let (_dir, path, a) = fresh();
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.len(), FILE_SIZE as u64);
    // Allocated, not sparse: a full file system fails the creation, never a later charge with SIGBUS.
    assert!(
        std::os::unix::fs::MetadataExt::blocks(&meta) * 512 >= FILE_SIZE as u64,
        "the ledger is sparse: {} blocks",
        std::os::unix::fs::MetadataExt::blocks(&meta)
    );
    assert_eq!(meta.permissions().mode() & 0o777, 0o666);
    assert_eq!(a.uuid(), UUID);
    assert_eq!(a.provisioned_limit(), GI);
    assert_eq!(a.used(), 0);
    // joining keeps the existing file (and its provisioned limit)
    let b = Ledger::open_or_create(&path, UUID, 2 * GI).unwrap();
    assert_eq!(b.provisioned_limit(), GI);
    let sa = a.attach().unwrap();
    a.charge(&sa, Kind::Data, 100, GI).unwrap();
    assert_eq!(b.used(), 100);
    assert_eq!(Ledger::open(&path).unwrap().used(), 100);
    // a ledger of another GPU at this path is an error, not silently joined
    let err = Ledger::open_or_create(&path, "GPU-other", GI)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("belongs to GPU") && err.contains(&path.display().to_string()),
        "{err}"
    );
    // only the ledger in the folder: no temporary file left behind
    assert_eq!(
        std::fs::read_dir(path.parent().unwrap()).unwrap().count(),
        1
    );
}

#[test]
fn create_arguments_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.ledger");
    assert!(Ledger::open_or_create(&path, "", GI)
        .unwrap_err()
        .to_string()
        .contains("GPU uuid"));
    assert!(Ledger::open_or_create(&path, &"u".repeat(97), GI).is_err());
    // "unlimited" is recorded as the most a ledger can hold
    let big = Ledger::open_or_create(&dir.path().join("big.ledger"), UUID, u64::MAX).unwrap();
    assert_eq!(big.provisioned_limit(), MAX_TOTAL);
    let missing = dir.path().join("no/such/dir/x.ledger");
    let err = Ledger::open_or_create(&missing, UUID, GI)
        .unwrap_err()
        .to_string();
    assert!(err.contains("no/such/dir"), "{err}");
    let err = Ledger::open(&path).unwrap_err();
    assert!(
        matches!(&err, LedgerError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    );
}

#[test]
fn racing_creators_share_one_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("race.ledger");
    let ledgers: Vec<Ledger> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| s.spawn(|| Ledger::open_or_create(&path, UUID, GI).unwrap()))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let slot = ledgers[0].attach().unwrap();
    ledgers[0].charge(&slot, Kind::Data, 4096, GI).unwrap();
    assert!(ledgers.iter().all(|l| l.used() == 4096));
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

/// Write `bytes` as a ledger file and return the error opening it gives (read-write and read-only agree).
fn open_error(bytes: &[u8]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.ledger");
    std::fs::write(&path, bytes).unwrap();
    let rw = Ledger::open(&path).unwrap_err().to_string();
    let ro = Ledger::open_readonly(&path).unwrap_err().to_string();
    let joined = Ledger::open_or_create(&path, UUID, GI)
        .unwrap_err()
        .to_string();
    let host = read_file(&path).unwrap_err().to_string();
    assert_eq!(rw, ro);
    assert_eq!(rw, joined);
    assert_eq!(rw, host, "the host tools' reader checks the same way");
    assert!(
        rw.contains(&path.display().to_string()),
        "error does not name the file: {rw}"
    );
    assert_eq!(
        std::fs::read(&path).unwrap(),
        bytes,
        "a bad file must be left as it was"
    );
    rw
}

fn good_bytes() -> Vec<u8> {
    let (_dir, path, _l) = fresh();
    std::fs::read(path).unwrap()
}

#[test]
fn header_validation() {
    let good = good_bytes();

    let mut wrong_magic = good.clone();
    wrong_magic[..8].copy_from_slice(b"NOTVGPU!");
    let e = open_error(&wrong_magic);
    assert!(e.ends_with("not a vgpu ledger (bad magic)"), "{e}");
    // No byte of the file in the message (it may be a host file a link led to, or a tenant's).
    assert!(!e.contains("4e") && !e.contains("NOTVGPU"), "{e}");

    let mut v2 = good.clone();
    v2[8..12].copy_from_slice(&2u32.to_le_bytes());
    let e = open_error(&v2);
    assert!(
        e.contains("format version 2; this build supports version 1"),
        "{e}"
    );
    // another version is reported as such even if its size differs
    assert!(open_error(&v2[..300]).contains("format version 2"));

    for cut in [0, 5, 100, 255, 1000, FILE_SIZE - 1] {
        let e = open_error(&good[..cut]);
        assert!(
            e.contains(&format!("truncated: {cut} bytes, expected {FILE_SIZE}")),
            "cut {cut}: {e}"
        );
    }

    let mut longer = good.clone();
    longer.extend_from_slice(&[0; 4096]);
    assert!(open_error(&longer).contains("corrupt header"));

    let mut geometry = good.clone();
    geometry[32..36].copy_from_slice(&7u32.to_le_bytes());
    assert!(open_error(&geometry).contains("geometry"));

    let mut size_field = good.clone();
    size_field[16..24].copy_from_slice(&1u64.to_le_bytes());
    assert!(open_error(&size_field).contains("header says the file has 1 bytes"));

    let mut uuid_len = good.clone();
    uuid_len[48..52].copy_from_slice(&500u32.to_le_bytes());
    assert!(open_error(&uuid_len).contains("GPU uuid length 500"));

    let garbage: Vec<u8> = (0..FILE_SIZE).map(|i| (i * 7919 % 251) as u8).collect();
    assert!(open_error(&garbage).contains("not a vgpu ledger (bad magic)"));
    assert!(open_error(b"{\"version\": 1}\n").contains("not a vgpu ledger (bad magic)"));
}

#[test]
fn charge_refund_and_refusal() {
    let (_dir, _path, l) = fresh();
    let s = l.attach().unwrap();
    l.charge(&s, Kind::Data, 600 << 20, GI).unwrap();
    l.charge(&s, Kind::Context, 300 << 20, GI).unwrap();
    let r = l.charge(&s, Kind::Data, 200 << 20, GI).unwrap_err();
    assert_eq!(
        r,
        Refused {
            requested: 200 << 20,
            used: 900 << 20,
            limit: GI
        }
    );
    assert_eq!(
        r.to_string(),
        "GPU memory quota exceeded: requested 200 MiB, 900 MiB of 1.00 GiB already in use"
    );
    // exactly up to the limit is allowed, one byte more is not
    l.charge(&s, Kind::Module, GI - (900 << 20), GI).unwrap();
    assert_eq!(l.used(), GI);
    assert!(l.charge(&s, Kind::Module, 1, GI).is_err());
    assert_eq!(l.used(), GI);
    // the limit is the caller's: a lower one refuses, zero bytes always pass
    l.charge(&s, Kind::Data, 0, 0).unwrap();
    l.refund(&s, Kind::Module, GI - (900 << 20));
    assert!(l.charge(&s, Kind::Data, 1, 900 << 20).is_err());
    assert!(l.charge(&s, Kind::Data, u64::MAX, u64::MAX).is_err());
    assert!(l.charge(&s, Kind::Data, MAX_TOTAL, u64::MAX).is_err());
    // refunds never go below zero, per kind
    l.refund(&s, Kind::Context, 1 << 40);
    assert_eq!(slot_usage(&l, &s)[Kind::Context.index()], 0);
    assert_eq!(l.used(), 600 << 20);
    l.refund(&s, Kind::Graph, 5);
    assert_eq!(l.used(), 600 << 20);
    let mut want = [0; KINDS];
    want[Kind::Data.index()] = 600 << 20;
    assert_eq!(slot_usage(&l, &s), want);
}

#[test]
fn slots_detach_and_reclaim() {
    let (_dir, path, l) = fresh();
    let a = l.attach().unwrap();
    let b = l.attach().unwrap();
    assert_ne!(a.index(), b.index());
    l.charge(&a, Kind::Data, 1000, GI).unwrap();
    l.charge(&b, Kind::Vmm, 500, GI).unwrap();
    // live slots (held by this process through their own descriptors) are not reclaimed
    assert_eq!(l.reclaim_dead().unwrap(), 0);
    assert_eq!(l.used(), 1500);
    let snap = l.snapshot();
    assert_eq!(snap.slots.len(), 2);
    assert!(snap
        .slots
        .iter()
        .all(|s| s.alive && s.pid == std::process::id()));
    // dropping a slot detaches it: its usage comes back, the slot is free again
    drop(a);
    assert_eq!(l.used(), 500);
    assert_eq!(l.snapshot().slots.len(), 1);
    // a slot whose owner dies without refunding leaves usage behind: the owner
    // looks dead now, so reclaim returns it
    let b_index = b.index();
    b.die();
    assert_eq!(l.used(), 500);
    let snap = l.snapshot();
    assert_eq!(snap.slots.len(), 1);
    assert_eq!(snap.slots[0].index, b_index);
    assert!(!snap.slots[0].alive);
    let other = Ledger::open(&path).unwrap();
    assert_eq!(other.reclaim_dead().unwrap(), 1);
    assert_eq!(l.used(), 0);
    assert!(l.snapshot().slots.is_empty());
    assert_eq!(l.reclaim_dead().unwrap(), 0);
}

#[test]
fn attach_reuses_a_dead_slot_after_reclaiming_it() {
    // (slots hold no descriptor: all 1024 fit under the usual limit of 1024 open files)
    let (_dir, _path, l) = fresh();
    let a = l.attach().unwrap();
    let index = a.index();
    l.charge(&a, Kind::Managed, 4096, GI).unwrap();
    a.die();
    // the dead slot still records its owner, so the first pass skips it; a slot that looks free is taken
    let b = l.attach().unwrap();
    assert_ne!(b.index(), index);
    assert_eq!(l.used(), 4096);
    // fill every slot that looks free: the dead one is claimed last, emptied first
    let mut held = vec![b];
    let dead_claim = loop {
        let s = l.attach().unwrap();
        if s.index() == index {
            break s;
        }
        held.push(s);
        assert!(held.len() < SLOT_COUNT, "dead slot never reused");
    };
    assert_eq!(slot_usage(&l, &dead_claim), [0; KINDS]);
    assert_eq!(l.used(), 0);
    // every slot is held now
    assert_eq!(held.len() + 1, SLOT_COUNT);
    let err = l.attach().unwrap_err().to_string();
    assert!(err.contains("all 1024 process slots are held"), "{err}");
    drop(held);
    assert!(l.attach().is_ok());
}

#[test]
fn operation_left_unapplied_is_finished_by_others() {
    let (_dir, path, l) = fresh();
    let a = l.attach().unwrap();
    let b = l.attach().unwrap();
    l.charge(&a, Kind::Data, 100, GI).unwrap();
    // a process killed right after its commit: the total moved, its counter not yet
    a.commit_unapplied(Kind::Data, 50, false);
    assert_eq!(l.used(), 150);
    assert_eq!(slot_usage(&l, &a)[Kind::Data.index()], 100);
    assert_eq!(
        snapshot_sum(&l),
        150,
        "the snapshot counts the pending operation"
    );
    // the next operation by anyone applies it first
    l.charge(&b, Kind::Data, 1, GI).unwrap();
    assert_eq!(slot_usage(&l, &a)[Kind::Data.index()], 150);
    // the same for a pending refund, finished by the reclaimer
    a.commit_unapplied(Kind::Data, 30, true);
    assert_eq!(l.used(), 121);
    a.die();
    let other = Ledger::open(&path).unwrap();
    assert_eq!(other.reclaim_dead().unwrap(), 1);
    assert_eq!(l.used(), 1);
    drop(b);
    assert_eq!(l.used(), 0);
    // and repeated unapplied operations on the same counter (seq wraps mod 8) stay exact
    let c = l.attach().unwrap();
    for i in 0..20u64 {
        c.commit_unapplied(Kind::Array, 10 + i, false);
    }
    l.refund(&c, Kind::Array, 0);
    assert_eq!(
        slot_usage(&l, &c)[Kind::Array.index()],
        (0..20).map(|i| 10 + i).sum::<u64>()
    );
    drop(c);
    assert_eq!(l.used(), 0);
}

#[test]
fn readonly_view_never_writes() {
    let (_dir, path, l) = fresh();
    let s = l.attach().unwrap();
    l.charge(&s, Kind::Data, 12345, GI).unwrap();
    l.charge(&s, Kind::Graph, 5, GI).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444)).unwrap();
    let before = std::fs::read(&path).unwrap();
    let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
    let ro = Ledger::open_readonly(&path).unwrap();
    assert_eq!(ro.used(), 12350);
    let snap = ro.snapshot();
    assert_eq!(snap.uuid, UUID);
    assert_eq!(snap.limit, GI);
    assert_eq!(snap.used, 12350);
    assert_eq!(snap.slots.len(), 1);
    let slot = &snap.slots[0];
    assert!(slot.alive);
    assert_eq!(slot.pid, std::process::id());
    assert_eq!(slot.pid_ns, own_pid_namespace());
    assert_eq!(slot.usage[Kind::Data.index()], 12345);
    assert_eq!(slot.usage[Kind::Graph.index()], 5);
    assert!(matches!(ro.attach(), Err(LedgerError::ReadOnly { .. })));
    assert!(matches!(
        ro.reclaim_dead(),
        Err(LedgerError::ReadOnly { .. })
    ));
    assert_eq!(std::fs::read(&path).unwrap(), before);
    assert_eq!(std::fs::metadata(&path).unwrap().modified().unwrap(), mtime);
    // the monitor's lock query did not disturb the owner: it still holds its slot
    assert!(ro.snapshot().slots[0].alive);
    // the host tools' view, read with pread, is the same snapshot
    assert_eq!(read_file(&path).unwrap(), snap);
    assert_eq!(std::fs::read(&path).unwrap(), before);
    drop(s);
    assert!(ro.snapshot().slots.is_empty());
    assert!(read_file(&path).unwrap().slots.is_empty());
}

#[test]
fn host_view_of_a_ledger_truncated_under_it_is_an_error_never_a_sigbus() {
    let (_dir, path, l) = fresh();
    let s = l.attach().unwrap();
    l.charge(&s, Kind::Data, 4096, GI).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (mut ok, mut errors) = (0, 0);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            while !stop.load(SeqCst) {
                f.set_len(4096).unwrap();
                f.set_len(FILE_SIZE as u64).unwrap();
            }
        });
        for _ in 0..3000 {
            match read_file(&path) {
                Ok(_) => ok += 1,
                Err(e) => {
                    assert!(e.to_string().contains("truncated"), "{e}");
                    errors += 1;
                }
            }
        }
        stop.store(true, SeqCst);
    });
    assert_eq!(ok + errors, 3000);
}

/// Writes `pid` as slot `index`'s owner straight into the file, as a tenant (or an older library) could.
fn poke_slot_pid(path: &std::path::Path, index: usize, pid: u32) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(
        &pid.to_le_bytes(),
        (super::format::SLOTS_OFFSET + index * super::format::SLOT_SIZE) as u64,
    )
    .unwrap();
}

fn poke_high_water(path: &std::path::Path, mark: u32) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&mark.to_le_bytes(), super::stats::HIGH_WATER_OFFSET as u64)
        .unwrap();
}

#[test]
fn the_host_reads_only_the_slots_below_the_high_water_mark() {
    let (_dir, path, l) = fresh();
    let held: Vec<Slot> = (0..3).map(|_| l.attach().unwrap()).collect();
    for s in &held {
        l.charge(s, Kind::Data, 100, GI).unwrap();
    }
    // A slot far above the mark, never claimed through attach: not read.
    poke_slot_pid(&path, 700, 4242);
    let snap = read_file(&path).unwrap();
    assert_eq!(
        snap.slots.iter().map(|s| s.index).collect::<Vec<_>>(),
        [0, 1, 2]
    );
    assert_eq!(snap.used, 300);
    assert!(snap.slots.iter().all(|s| s.alive));
    // The library's own view trusts no mark.
    assert!(l.snapshot().slots.iter().any(|s| s.index == 700));
    // A mark of 0 (a ledger of a library that kept none) reads every slot.
    poke_high_water(&path, 0);
    let all = read_file(&path).unwrap();
    assert!(all.slots.iter().any(|s| s.index == 700 && s.pid == 4242));
    // A tenant lowering the mark hides its slots' detail, not its total.
    poke_high_water(&path, 1);
    let hidden = read_file(&path).unwrap();
    assert_eq!(hidden.slots.len(), 1);
    assert_eq!(hidden.used, 300);
    // Attaching again raises the mark past every slot in use.
    drop(held);
    let again = l.attach().unwrap();
    assert_eq!(again.index(), 0);
    let s = read_file(&path).unwrap();
    assert!(s.slots.iter().any(|s| s.index == 0 && s.alive));
}

#[test]
fn refusals_are_counted_for_the_host() {
    let (_dir, path, l) = fresh();
    assert_eq!(read_file(&path).unwrap().refusals, 0);
    l.count_refusal();
    l.count_refusal();
    assert_eq!(l.refusals(), 2);
    assert_eq!(read_file(&path).unwrap().refusals, 2);
    assert_eq!(l.snapshot().refusals, 2);
    // A read-only ledger (the host's) never counts.
    Ledger::open_readonly(&path).unwrap().count_refusal();
    assert_eq!(l.refusals(), 2);
}

#[test]
fn the_compute_bucket_is_read_by_the_host_as_the_library_sees_it() {
    let (_dir, path, l) = fresh();
    assert_eq!(read_file(&path).unwrap().compute, Default::default());
    let area = l.compute();
    area.refill(5_000_000, PPM / 2, i64::MAX);
    area.settle(3_000_000, 0);
    area.settle(4_000_000, 0);
    area.held(1_500);
    let host = read_file(&path).unwrap().compute;
    assert_eq!(host, l.snapshot().compute);
    assert_eq!(host, area.snapshot());
    assert_eq!(
        (host.tokens, host.charged_ns, host.held_ns, host.launches),
        (2_500_000 - 7_000_000, 7_000_000, 1_500, 2)
    );
}

#[test]
fn threads_share_slots_without_passing_the_limit() {
    let (_dir, _path, l) = fresh();
    let limit: u64 = 10 << 20;
    let slots: Vec<Slot> = (0..3).map(|_| l.attach().unwrap()).collect();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(SeqCst) {
                assert!(l.used() <= limit);
            }
        });
        let workers: Vec<_> = (0..6u64)
            .map(|t| {
                let (l, slot) = (&l, &slots[t as usize % 3]);
                s.spawn(move || {
                    let mut rng = t.wrapping_mul(0x9E3779B97F4A7C15) | 1;
                    let mut held = Vec::new();
                    for _ in 0..20_000 {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        let kind = Kind::ALL[(rng % 8) as usize];
                        if rng % 3 != 0 || held.is_empty() {
                            let bytes = (rng >> 20) % (1 << 20) + 1;
                            if l.charge(slot, kind, bytes, limit).is_ok() {
                                held.push((kind, bytes));
                            }
                        } else {
                            let (kind, bytes) = held.swap_remove((rng >> 8) as usize % held.len());
                            l.refund(slot, kind, bytes);
                        }
                    }
                    held
                })
            })
            .collect();
        let mut expected = 0;
        for w in workers {
            expected += w.join().unwrap().iter().map(|(_, b)| b).sum::<u64>();
        }
        stop.store(true, SeqCst);
        assert_eq!(l.used(), expected);
        assert_eq!(snapshot_sum(&l), expected);
    });
    drop(slots);
    assert_eq!(l.used(), 0);
}

#[derive(Debug, Clone)]
enum Step {
    Charge {
        slot: usize,
        kind: usize,
        bytes: u64,
    },
    Refund {
        slot: usize,
        kind: usize,
        bytes: u64,
    },
    /// Commit without applying, as a process killed between the two steps leaves it.
    Crash {
        slot: usize,
        kind: usize,
        bytes: u64,
        refund: bool,
    },
    Detach {
        slot: usize,
    },
}

fn step() -> impl Strategy<Value = Step> {
    let bytes = prop_oneof![0u64..10, 1u64..5000, 4000u64..20_000];
    prop_oneof![
        4 => (0..4usize, 0..KINDS, bytes.clone()).prop_map(|(slot, kind, bytes)| Step::Charge { slot, kind, bytes }),
        3 => (0..4usize, 0..KINDS, bytes.clone()).prop_map(|(slot, kind, bytes)| Step::Refund { slot, kind, bytes }),
        1 => (0..4usize, 0..KINDS, bytes, any::<bool>())
            .prop_map(|(slot, kind, bytes, refund)| Step::Crash { slot, kind, bytes, refund }),
        1 => (0..4usize).prop_map(|slot| Step::Detach { slot }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Admission against a model: every charge is accepted exactly when the model's total stays within the
    /// limit, usage per slot and kind equals the model after every step, and the total never passes it.
    #[test]
    fn admission_matches_the_model(limit in 1u64..60_000, steps in proptest::collection::vec(step(), 1..200)) {
        let (_dir, _path, l) = fresh();
        let mut slots: Vec<Option<Slot>> = (0..4).map(|_| Some(l.attach().unwrap())).collect();
        let mut model = [[0u64; KINDS]; 4];
        for st in steps {
            match st {
                Step::Charge { slot, kind, bytes } => {
                    let s = slots[slot].get_or_insert_with(|| l.attach().unwrap());
                    let total: u64 = model.iter().flatten().sum();
                    let ok = l.charge(s, Kind::ALL[kind], bytes, limit).is_ok();
                    prop_assert_eq!(ok, total + bytes <= limit);
                    if ok { model[slot][kind] += bytes; }
                }
                Step::Refund { slot, kind, bytes } => {
                    let s = slots[slot].get_or_insert_with(|| l.attach().unwrap());
                    l.refund(s, Kind::ALL[kind], bytes);
                    model[slot][kind] -= bytes.min(model[slot][kind]);
                }
                Step::Crash { slot, kind, bytes, refund } => {
                    let s = slots[slot].get_or_insert_with(|| l.attach().unwrap());
                    let total: u64 = model.iter().flatten().sum();
                    if refund {
                        s.commit_unapplied(Kind::ALL[kind], bytes, true);
                        model[slot][kind] -= bytes.min(model[slot][kind]);
                    } else if total + bytes <= limit {
                        s.commit_unapplied(Kind::ALL[kind], bytes, false);
                        model[slot][kind] += bytes;
                    }
                }
                Step::Detach { slot } => {
                    slots[slot] = None;
                    model[slot] = [0; KINDS];
                }
            }
            let total: u64 = model.iter().flatten().sum();
            prop_assert!(l.used() <= limit.max(total));
            prop_assert_eq!(l.used(), total);
            prop_assert_eq!(snapshot_sum(&l), total);
        }
        // once everything pending is applied, each counter equals the model
        l.shared().help_pending(super::book::Book::Device);
        for (i, s) in slots.iter().enumerate() {
            if let Some(s) = s {
                prop_assert_eq!(slot_usage(&l, s), model[i]);
            }
        }
        drop(slots);
        prop_assert_eq!(l.used(), 0);
    }
}

#[test]
fn a_path_that_names_another_file_now_is_not_trusted() {
    let (dir, path, l) = fresh();
    let a = l.attach().unwrap();
    l.charge(&a, Kind::Data, 100, GI).unwrap();
    a.die();
    // the path now names another (valid) ledger: reclaiming through it would lock the wrong file
    let other = dir.path().join("other.ledger");
    drop(Ledger::open_or_create(&other, UUID, GI).unwrap());
    std::fs::rename(&other, &path).unwrap();
    let err = l.reclaim_dead().unwrap_err().to_string();
    assert!(err.contains("no longer names this ledger file"), "{err}");
    assert!(l.attach().is_err());
    assert_eq!(l.used(), 100, "nothing reclaimed through the wrong file");
}

#[test]
fn the_measurement_lock_is_a_range_of_the_ledger_apart_from_the_slots() {
    let (dir, path, a) = fresh();
    let b = Ledger::open(&path).unwrap();
    assert!(!b.measure_locked().unwrap());
    let held = a.try_measure_lock().unwrap().expect("free");
    // Another description (another process, or another thread of this one) must wait for it.
    assert!(b.try_measure_lock().unwrap().is_none());
    assert!(
        a.try_measure_lock().unwrap().is_none(),
        "each take is its own description"
    );
    assert!(b.measure_locked().unwrap());
    // Slots neither take nor wait for it, and a held slot is not mistaken for it.
    let slot = b.attach().unwrap();
    b.charge(&slot, Kind::Data, 10, GI).unwrap();
    assert_eq!(a.reclaim_dead().unwrap(), 0);
    assert!(a.snapshot().slots.iter().all(|s| s.alive));
    drop(held);
    assert!(!b.measure_locked().unwrap(), "released on drop");
    let again = b.try_measure_lock().unwrap().expect("free again");
    assert!(a.snapshot().slots.iter().all(|s| s.alive));
    drop((again, slot));
    // No file of its own: the folder holds the ledger alone.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    // The monitor's read-only view cannot take it.
    assert!(Ledger::open_readonly(&path)
        .unwrap()
        .try_measure_lock()
        .is_err());
}

#[test]
fn spill_is_a_book_of_its_own_exact_across_death() {
    let (_dir, path, l) = fresh();
    let a = l.attach().unwrap();
    let b = l.attach().unwrap();
    l.charge(&a, Kind::Data, 700, 1000).unwrap();
    // spilled bytes are charged against the spill budget only, never against the quota's total
    l.charge_spill(&a, 600, 1000).unwrap();
    l.charge_spill(&b, 300, 1000).unwrap();
    assert_eq!((l.used(), l.spilled()), (700, 900));
    let refused = l.charge_spill(&b, 101, 1000).unwrap_err();
    assert_eq!((refused.used, refused.limit), (900, 1000));
    l.charge_spill(&b, 100, 1000).unwrap();
    l.refund_spill(&b, 50);
    assert_eq!(l.spilled(), 950);
    // a refund is clamped to what the slot holds
    l.refund_spill(&b, 10_000);
    assert_eq!(l.spilled(), 600);
    // the snapshot (mapped and host views) shows both parts per slot
    let snap = l.snapshot();
    assert_eq!((snap.used, snap.spilled), (700, 600));
    let sa = snap.slots.iter().find(|s| s.index == a.index()).unwrap();
    assert_eq!((sa.total(), sa.spilled), (700, 600));
    let host = read_file(&path).unwrap();
    assert_eq!((host.used, host.spilled), (700, 600));
    // killed between commit and apply: the pending spill is counted by the snapshot, finished by the next
    a.commit_spill_unapplied(40);
    assert_eq!(l.spilled(), 640);
    let snap = l.snapshot();
    let sa = snap.slots.iter().find(|s| s.index == a.index()).unwrap();
    assert_eq!(sa.spilled, 640, "the snapshot counts the pending operation");
    // a dead owner's spill comes back with the reclaim, to exactly zero
    a.die();
    let other = Ledger::open(&path).unwrap();
    assert_eq!(other.reclaim_dead().unwrap(), 1);
    assert_eq!((l.used(), l.spilled()), (0, 0));
    // a slot holding only spilled bytes is reclaimed too
    l.charge_spill(&b, 5, 1000).unwrap();
    b.die();
    assert_eq!(other.reclaim_dead().unwrap(), 1);
    assert_eq!(l.spilled(), 0);
    // detaching refunds spill as it refunds device usage
    let c = l.attach().unwrap();
    l.charge_spill(&c, 77, 1000).unwrap();
    drop(c);
    assert_eq!(l.spilled(), 0);
    assert!(l.snapshot().slots.is_empty());
}
