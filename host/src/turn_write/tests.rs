//! The arbiter's `pwrite`s as the library sees them through its mapping, and as a host tool reads them
//! back (`Snapshot::from_file`).

use super::{write_heartbeat, write_turn};
use vgpu_ledger::region::{TurnMode, FILE_SIZE};
use vgpu_ledger::{Ledger, Snapshot};

const UUID: &str = "GPU-11111111-2222-3333-4444-555555555555";

#[test]
fn the_arbiters_writes_reach_the_mapping() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.ledger");
    let l = Ledger::open_or_create(&path, UUID, 1 << 30).unwrap();
    let file = crate::hostfile::open_regular_for_update(&path, FILE_SIZE as u64).unwrap();
    for (mode, epoch) in [
        (TurnMode::Free, 1),
        (TurnMode::Hold, 2),
        (TurnMode::Yield, 3),
        (TurnMode::Wait, 4),
    ] {
        write_turn(&file, mode, epoch, 1_000 + epoch).unwrap();
        assert_eq!(l.turn().heartbeat(), 1_000 + epoch);
        assert_eq!((l.turn().mode(), l.turn().epoch()), (mode, epoch));
    }
    write_heartbeat(&file, 7_777).unwrap();
    assert_eq!(
        (l.turn().mode(), l.turn().epoch(), l.turn().heartbeat()),
        (TurnMode::Wait, 4, 7_777)
    );
    let host = Snapshot::from_file(&path, &std::fs::File::open(&path).unwrap())
        .unwrap()
        .turn;
    assert_eq!(host, l.turn().snapshot());
}

/// The bytes themselves: the format's offsets (mode at 0, epoch at 8, heartbeat at 48 of the turn area),
/// little-endian, and nothing else of the file touched.
#[test]
fn the_writes_land_on_the_formats_bytes_and_nowhere_else() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.ledger");
    drop(Ledger::open_or_create(&path, UUID, 1 << 30).unwrap());
    let before = std::fs::read(&path).unwrap();
    let file = crate::hostfile::open_regular_for_update(&path, FILE_SIZE as u64).unwrap();
    write_turn(
        &file,
        TurnMode::Yield,
        0x0102_0304_0506_0708,
        0x1112_1314_1516_1718,
    )
    .unwrap();
    let after = std::fs::read(&path).unwrap();
    let at = vgpu_ledger::region::TURN_OFFSET as usize;
    let mut want = before.clone();
    want[at] = TurnMode::Yield.to_byte();
    want[at + 8..at + 16].copy_from_slice(&0x0102_0304_0506_0708u64.to_le_bytes());
    want[at + 48..at + 56].copy_from_slice(&0x1112_1314_1516_1718u64.to_le_bytes());
    assert!(after == want, "the turn's writes touched other bytes");
}
