//! `Pin`: what keeps a slot's lock (and the measurement lock) alive — a one-page `PROT_NONE` mapping made through the slot's own open
//! file description, not a descriptor. Not here: opening descriptors (`fd`), the lock calls (`lock`).
//!
//! An OFD lock lasts as long as its open file description, i.e. until the last reference to it goes; a
//! mapping holds one. So once the slot's description is mapped its descriptor can be closed at once: the
//! application may close or reuse every descriptor number and the lock stays, and it still goes when the
//! process dies or execs (the mapping goes). `MADV_DONTFORK` keeps the mapping out of fork children, so a
//! child never keeps its parent's slot alive, and there is no inherited descriptor to close in the child.

use nix::libc;
use std::io;

use super::fd::LedgerFd;

pub(super) struct Pin {
    addr: *mut libc::c_void,
    len: usize,
}

// SAFETY: the address is never dereferenced (PROT_NONE); it is only handed back to munmap, once.
unsafe impl Send for Pin {}
// SAFETY: as above; no method reads through the pointer.
unsafe impl Sync for Pin {}

impl Pin {
    /// Maps the first page of the file through `fd`'s description, out of reach of fork children.
    pub(super) fn new(fd: &LedgerFd) -> io::Result<Pin> {
        use std::os::fd::AsRawFd;
        // SAFETY: sysconf has no preconditions.
        let len = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        // SAFETY: a new PROT_NONE mapping of the file's first page (the file is far longer); the kernel picks
        // the address, so no existing mapping is touched.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let pin = Pin { addr, len };
        // SAFETY: madvise on the mapping just made.
        if unsafe { libc::madvise(addr, len, libc::MADV_DONTFORK) } != 0 {
            return Err(io::Error::last_os_error()); // `pin` drops: unmapped
        }
        Ok(pin)
    }

    /// In a fork child: the range was never copied here (MADV_DONTFORK), and something else may be mapped
    /// there by now, so nothing is unmapped.
    pub(super) fn forget(self) {
        std::mem::forget(self);
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once; dropping the last reference to the description releases
        // the slot's lock.
        unsafe { libc::munmap(self.addr, self.len) };
    }
}
