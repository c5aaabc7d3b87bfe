//! Slot liveness through open-file-description (OFD) locks: a process owns a slot while it holds a write
//! lock on the slot's byte range through its own open file description. Not here: what keeps it (`pin`).
//!
//! The kernel drops the lock when the last reference to that description goes (its descriptors and the
//! slot's pin mapping), which includes the owner being SIGKILLed, in any PID namespace. No PID is compared.

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg};
use nix::libc;
use std::io;
use std::os::fd::AsFd;

use super::format::{SLOTS_OFFSET, SLOT_SIZE};

fn slot_range(slot: usize, l_type: libc::c_int) -> libc::flock {
    // SAFETY: flock is a plain C struct for which all-zero bytes are valid; OFD locks require l_pid == 0.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = l_type as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = (SLOTS_OFFSET + slot * SLOT_SIZE) as libc::off_t;
    fl.l_len = SLOT_SIZE as libc::off_t;
    fl
}

/// Try to take the write lock on `slot` through `fd`'s open file description, without waiting.
/// Ok(false): another open file description holds it (the slot is alive or being claimed/reclaimed).
pub fn try_lock_slot(fd: impl AsFd, slot: usize) -> io::Result<bool> {
    let fl = slot_range(slot, libc::F_WRLCK);
    match fcntl(fd, FcntlArg::F_OFD_SETLK(&fl)) {
        Ok(_) => Ok(true),
        Err(Errno::EAGAIN) | Err(Errno::EACCES) => Ok(false),
        Err(e) => Err(io::Error::from(e)),
    }
}

/// Release the lock on `slot` taken through `fd`'s open file description.
pub fn unlock_slot(fd: impl AsFd, slot: usize) -> io::Result<()> {
    let fl = slot_range(slot, libc::F_UNLCK);
    fcntl(fd, FcntlArg::F_OFD_SETLK(&fl))
        .map(|_| ())
        .map_err(io::Error::from)
}

/// Whether some other open file description holds a lock on `slot`. Asks for a *read* lock with GETLK,
/// which works through a read-only descriptor and changes nothing (the monitor's view).
pub fn slot_is_locked(fd: impl AsFd, slot: usize) -> io::Result<bool> {
    let mut fl = slot_range(slot, libc::F_RDLCK);
    fcntl(fd, FcntlArg::F_OFD_GETLK(&mut fl)).map_err(io::Error::from)?;
    Ok(fl.l_type != libc::F_UNLCK as libc::c_short)
}
