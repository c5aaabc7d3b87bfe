//! The open-file-description (OFD) lock calls: slot liveness (a process owns a slot while it holds a write
//! lock on the slot's byte range through its own open file description) and the measurement lock (a write
//! lock on the header's bytes). The ranges are in `format`. Not here: what keeps a lock (`pin`).
//!
//! The kernel drops the lock when the last reference to that description goes (its descriptors and the
//! pin mapping), which includes the owner being SIGKILLed, in any PID namespace. No PID is compared.

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg};
use nix::libc;
use std::io;
use std::os::fd::AsFd;

use super::format::{MEASURE_LOCK_LEN, MEASURE_LOCK_OFFSET, SLOTS_OFFSET, SLOT_SIZE};

fn range(start: usize, len: usize, l_type: libc::c_int) -> libc::flock {
    // SAFETY: flock is a plain C struct for which all-zero bytes are valid; OFD locks require l_pid == 0.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = l_type as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = start as libc::off_t;
    fl.l_len = len as libc::off_t;
    fl
}

fn slot_range(slot: usize, l_type: libc::c_int) -> libc::flock {
    range(SLOTS_OFFSET + slot * SLOT_SIZE, SLOT_SIZE, l_type)
}

fn try_set(fd: impl AsFd, fl: &libc::flock) -> io::Result<bool> {
    match fcntl(fd, FcntlArg::F_OFD_SETLK(fl)) {
        Ok(_) => Ok(true),
        Err(Errno::EAGAIN) | Err(Errno::EACCES) => Ok(false),
        Err(e) => Err(io::Error::from(e)),
    }
}

/// Try to take the measurement lock through `fd`'s open file description, without waiting. Ok(false):
/// another open file description (or a process's POSIX record lock) holds it.
pub fn try_lock_measure(fd: impl AsFd) -> io::Result<bool> {
    try_set(
        fd,
        &range(MEASURE_LOCK_OFFSET, MEASURE_LOCK_LEN, libc::F_WRLCK),
    )
}

/// Whether some other open file description holds the measurement lock (read-only GETLK, as for slots).
pub fn measure_is_locked(fd: impl AsFd) -> io::Result<bool> {
    let mut fl = range(MEASURE_LOCK_OFFSET, MEASURE_LOCK_LEN, libc::F_RDLCK);
    fcntl(fd, FcntlArg::F_OFD_GETLK(&mut fl)).map_err(io::Error::from)?;
    Ok(fl.l_type != libc::F_UNLCK as libc::c_short)
}

/// Try to take the write lock on `slot` through `fd`'s open file description, without waiting.
/// Ok(false): another open file description holds it (the slot is alive or being claimed/reclaimed).
pub fn try_lock_slot(fd: impl AsFd, slot: usize) -> io::Result<bool> {
    try_set(fd, &slot_range(slot, libc::F_WRLCK))
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
