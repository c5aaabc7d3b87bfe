//! The turn words as both sides see them: the library's counters through the host's `pread`, and a
//! fresh or foreign byte read as "go". The arbiter's `pwrite`s through the mapping: `vgpu_host::turn_write`'s
//! tests.

use super::super::{Ledger, LedgerError, Snapshot};
use super::{TurnMode, TurnSnapshot};

/// The host tools' view (`vgpu_host::hostfile::read_ledger` opens the file as untrusted first).
fn read_file(path: &std::path::Path) -> Result<Snapshot, LedgerError> {
    let file = std::fs::File::open(path).map_err(|source| LedgerError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    Snapshot::from_file(path, &file)
}

const UUID: &str = "GPU-11111111-2222-3333-4444-555555555555";

#[test]
fn a_fresh_ledger_is_unmanaged_and_every_launch_goes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.ledger");
    let l = Ledger::open_or_create(&path, UUID, 1 << 30).unwrap();
    assert_eq!(l.turn().mode(), TurnMode::Unmanaged);
    assert!(l.turn().mode().launches_go());
    assert_eq!(read_file(&path).unwrap().turn, TurnSnapshot::default());
}

#[test]
fn the_arbiters_words_and_the_librarys_counters_reach_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.ledger");
    let l = Ledger::open_or_create(&path, UUID, 1 << 30).unwrap();
    for (mode, epoch) in [
        (TurnMode::Free, 1),
        (TurnMode::Hold, 2),
        (TurnMode::Yield, 3),
        (TurnMode::Wait, 4),
    ] {
        l.turn().set(mode, epoch, 1_000 + epoch);
        assert_eq!(l.turn().heartbeat(), 1_000 + epoch);
        assert_eq!((l.turn().mode(), l.turn().epoch()), (mode, epoch));
        assert_eq!(
            mode.launches_go(),
            matches!(mode, TurnMode::Free | TurnMode::Hold)
        );
    }
    let t = l.turn();
    t.note_launch();
    t.note_launch();
    t.add_waiting(2);
    t.add_waiting(-1);
    t.add_waited(1_500);
    t.set_drained(3);
    let host = read_file(&path).unwrap().turn;
    assert_eq!(host, t.snapshot());
    assert_eq!(
        (
            host.mode,
            host.epoch,
            host.waiting,
            host.launches,
            host.drained,
            host.waited_ns
        ),
        (TurnMode::Wait, 4, 1, 2, 3, 1_500)
    );
}

#[test]
fn an_unknown_mode_byte_never_blocks_and_waiting_never_wraps() {
    assert_eq!(TurnMode::from_byte(200), TurnMode::Unmanaged);
    for m in [
        TurnMode::Unmanaged,
        TurnMode::Free,
        TurnMode::Hold,
        TurnMode::Wait,
        TurnMode::Yield,
    ] {
        assert_eq!(TurnMode::from_byte(m.to_byte()), m);
    }
    let dir = tempfile::tempdir().unwrap();
    let l = Ledger::open_or_create(&dir.path().join("x.ledger"), UUID, 1 << 30).unwrap();
    // The tenant stored 0 while a thread waited: its end of waiting leaves 0, not 2^64 - 1.
    l.turn().add_waiting(-1);
    assert_eq!(l.turn().snapshot().waiting, 0);
}
