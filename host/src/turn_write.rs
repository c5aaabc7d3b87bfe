//! The time-quanta arbiter's writes into a container's ledger (`vgpuctl monitor`, `vgpu_monitor::turns`):
//! the turn's mode and epoch, and the heartbeat, each one `pwrite` at the offsets the ledger's format
//! fixes (`vgpu_ledger::region::TurnArea`). Host tools never map a ledger; the file is opened as
//! `hostfile::open_regular_for_update` opens it. Not here: the words' layout and the library's side of
//! them (`vgpu_ledger::region`'s turn), the arbiter's decisions (the monitor).

use std::fs::File;
use std::io;
use std::mem::offset_of;
use std::os::unix::fs::FileExt;
use vgpu_ledger::region::{TurnArea, TurnMode, TURN_OFFSET};

/// Writes a turn into the ledger open as `file`: the heartbeat, the epoch, then the one mode byte, each
/// one `pwrite`, so a reader that sees the new mode sees its epoch or a later one.
pub fn write_turn(file: &File, mode: TurnMode, epoch: u64, heartbeat_ns: u64) -> io::Result<()> {
    write_heartbeat(file, heartbeat_ns)?;
    file.write_all_at(
        &epoch.to_le_bytes(),
        TURN_OFFSET + offset_of!(TurnArea, epoch) as u64,
    )?;
    file.write_all_at(
        &[mode.to_byte()],
        TURN_OFFSET + offset_of!(TurnArea, mode) as u64,
    )
}

/// Writes only the heartbeat (the arbiter's pass over a GPU whose turn did not change).
pub fn write_heartbeat(file: &File, heartbeat_ns: u64) -> io::Result<()> {
    file.write_all_at(
        &heartbeat_ns.to_le_bytes(),
        TURN_OFFSET + offset_of!(TurnArea, heartbeat) as u64,
    )
}

#[cfg(test)]
mod tests;
