//! Legacy CUDA IPC between processes: the importer's side (`cuIpcOpenMemHandle[_v2]`,
//! `cuIpcCloseMemHandle`) and the export marks that tell it where the memory is charged already. The
//! exporter's own side (`cuIpcGetMemHandle`: its allocation stays charged past its free, until it ends)
//! is `memory`'s.
//!
//! The rules (`docs/libvgpu.md`, "What a handle keeps"; `docs/security.md`):
//! * An exporting process holds, for its whole life, a read lock of one byte of the device's ledger file
//!   at the handle's mark (`IPC_MARK_OFFSET` + its hash), far past the file's end (`hold_mark`). Only
//!   processes of the same container open that file, and the lock goes with the process (never to a fork
//!   child).
//! * An open whose mark another live process holds is of memory this container's exporter holds charged
//!   until it ends: it is recorded but charged nothing (never twice in one container). Once the mark is
//!   gone (the exporter ended while this process still holds the memory) the open is charged here, at the
//!   process's next admission (`settle_ipc_opens`).
//! * Any other open (another container's memory, or a mark that cannot be read) is charged to this
//!   process by the allocation's size on its device, refused past the quota (the open is closed again).
//!   The exporter's container stays charged whatever the importer does: nothing here touches its charge.
//! * `cuIpcCloseMemHandle` gives back only what the open charged here, never the exporter's charge.
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_int, c_uint};
use std::sync::atomic::Ordering;

use vgpu_ledger::region::{IPC_MARK_OFFSET, IPC_MARK_SPAN};
use vgpu_ledger::Kind;

use super::common::{hook, interposer, Interposer, Target};
use crate::driver::Driver;
use crate::error::Error;
use crate::ffi::*;
use crate::quota::DeviceQuota;
use crate::real_symbols::forward;
use crate::records::IpcOpen;

/// Where the mark of `handle` lies in a ledger file (FNV-1a of its 64 bytes within the marks' span).
pub(crate) fn mark_of(handle: &CUipcMemHandle) -> u64 {
    let h = handle.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    IPC_MARK_OFFSET + h % IPC_MARK_SPAN
}

fn one_byte(kind: c_int, at: u64) -> libc::flock {
    // SAFETY: all-zero is a valid flock; OFD locks require l_pid == 0.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as _;
    fl.l_whence = libc::SEEK_SET as _;
    fl.l_start = at as libc::off_t;
    fl.l_len = 1;
    fl
}

/// A new read-only description of `q`'s ledger file (close-on-exec), or None.
fn open_ledger(q: &DeviceQuota) -> Option<c_int> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(q.ledger_path().as_os_str().as_bytes()).ok()?;
    // SAFETY: a NUL-terminated path.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    (fd >= 0).then_some(fd)
}

fn page() -> usize {
    // SAFETY: sysconf has no preconditions.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096)
}

/// Takes `mark` in `q`'s ledger file for the rest of the process: a read lock through a description of its
/// own, kept alive by a one-page `PROT_NONE` mapping of the file out of fork children's reach
/// (`MADV_DONTFORK`), its descriptor closed at once (as the ledger keeps a slot's lock). So the mark goes
/// when the process ends or execs, never lives on in a fork child, and no descriptor of the application's
/// (closed or reused) can drop it. Returns the mapping's address, or None.
fn hold_mark(q: &DeviceQuota, mark: u64) -> Option<usize> {
    let fd = open_ledger(q)?;
    let fl = one_byte(libc::F_RDLCK, mark);
    let len = page();
    // SAFETY: our own descriptor and a valid flock.
    let locked = unsafe { libc::fcntl(fd, libc::F_OFD_SETLK, &fl) } == 0;
    let addr = if locked {
        // SAFETY: a new PROT_NONE mapping of the file's first page (the file is longer); the kernel picks
        // the address, so nothing existing is touched.
        unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        }
    } else {
        libc::MAP_FAILED
    };
    // SAFETY: madvise of the mapping just made.
    let pinned =
        addr != libc::MAP_FAILED && unsafe { libc::madvise(addr, len, libc::MADV_DONTFORK) } == 0;
    if addr != libc::MAP_FAILED && !pinned {
        unpin(addr as usize);
    }
    // SAFETY: the descriptor opened above, closed once (the mapping keeps the description).
    unsafe { libc::close(fd) };
    pinned.then_some(addr as usize)
}

/// Drops a mark `hold_mark` took (its mapping).
pub(crate) fn unpin(addr: usize) {
    // SAFETY: a PROT_NONE mapping of ours, never read, unmapped once.
    unsafe { libc::munmap(addr as *mut libc::c_void, page()) };
}

/// Whether another open file description (another live process of the container) holds `mark` in `q`'s
/// ledger file. None when the file cannot be asked.
fn marked_elsewhere(q: &DeviceQuota, mark: u64) -> Option<bool> {
    let fd = open_ledger(q)?;
    let mut fl = one_byte(libc::F_WRLCK, mark);
    // SAFETY: our own descriptor and a valid flock; closed right after.
    let r = unsafe { libc::fcntl(fd, libc::F_OFD_GETLK, &mut fl) };
    // SAFETY: the descriptor opened above, closed once.
    unsafe { libc::close(fd) };
    (r == 0).then_some(fl.l_type != libc::F_UNLCK as libc::c_short)
}

impl<D: Driver> Interposer<'_, D> {
    /// The exporter (`cuIpcGetMemHandle` or `cuMemPoolExportPointer` succeeded for memory on `dev`): holds
    /// the mark of `handle` in the device's ledger file for the rest of the process's life (`hold_mark`).
    /// Where it cannot, an import in this container is charged a second time (on the safe side), said once.
    pub(crate) fn ipc_mark(&self, dev: CUdevice, handle: &CUipcMemHandle) {
        let Some(q) = self.quota_of(dev) else {
            return;
        };
        let mark = mark_of(handle);
        if self.rec.ipc_marks.with(mark, |m| m.is_some()) {
            return; // the same handle again (the driver gives one allocation one handle)
        }
        match hold_mark(q, mark) {
            Some(pin) => {
                if let Some(other) = self.rec.ipc_marks.insert(mark, pin) {
                    unpin(other); // a racing thread held it too: one is enough
                }
            }
            None => {
                static SAID: std::sync::atomic::AtomicBool =
                    std::sync::atomic::AtomicBool::new(false);
                if !SAID.swap(true, Ordering::Relaxed) {
                    crate::log::warn(format_args!(
                        "quota: could not mark a CUDA IPC export in {}: a process of this container that \
                         opens it is charged for it a second time",
                        q.ledger_path().display()
                    ));
                }
            }
        }
    }

    /// `cuIpcOpenMemHandle[_v2]` of `handle` (or `cuMemPoolImportPointer` of its export data): `read` gives
    /// the pointer the driver wrote, `undo` gives it back when it cannot be charged.
    pub(crate) fn ipc_open(
        &self,
        handle: &CUipcMemHandle,
        call: impl FnOnce() -> CUresult,
        read: impl FnOnce() -> u64,
        undo: impl FnOnce(u64),
    ) -> CUresult {
        if self.drv.unlimited() {
            return call();
        }
        let r = call();
        if r != CUDA_SUCCESS {
            return r;
        }
        let p = read();
        let Some((_, bytes, dev)) = self.drv.ptr_range(p) else {
            undo(p);
            return self.unresolved("another process's memory opened", p);
        };
        let q = match self.target(Some(dev)) {
            Target::Charge(q) => q,
            Target::Forward => return r,
            Target::Fail(e) => {
                undo(p);
                return e.cuda();
            }
        };
        let mark = mark_of(handle);
        let open = IpcOpen {
            dev,
            bytes,
            ctx: self.drv.ctx_current(),
            mark,
            charged: false,
        };
        if marked_elsewhere(q, mark) == Some(true) {
            // counted before it is recorded: a settle never misses it
            self.rec.ipc_uncharged.fetch_add(1, Ordering::AcqRel);
            self.rec.ipc_opens.insert(p, open);
            return r;
        }
        if !self.admit(q, Kind::Data, bytes) {
            undo(p);
            return Error::OutOfMemory.cuda();
        }
        self.rec.ipc_opens.insert(
            p,
            IpcOpen {
                charged: true,
                ..open
            },
        );
        r
    }

    /// `cuIpcCloseMemHandle(p)`: what the open charged here goes back; the exporter's charge stays.
    pub(crate) fn ipc_close_hooked(&self, p: u64, call: impl FnOnce() -> CUresult) -> CUresult {
        let r = call();
        if r == CUDA_SUCCESS {
            if let Some(o) = self.rec.ipc_opens.remove(p) {
                self.ipc_gone(&o);
            }
        }
        r
    }

    /// A free of a pointer no table of ours holds: one imported from another process's pool
    /// (`cuMemPoolImportPointer`) gives back what its import charged here once the driver took the free.
    pub(crate) fn import_freed(&self, p: u64, call: impl FnOnce() -> CUresult) -> CUresult {
        let Some(o) = self.rec.ipc_opens.remove(p) else {
            return call();
        };
        let r = call();
        if r == CUDA_SUCCESS {
            self.ipc_gone(&o);
        } else {
            self.rec.ipc_opens.insert(p, o);
        }
        r
    }

    /// The contexts' end: the opens made in `ctx` are unmapped with it.
    pub(crate) fn ipc_context_gone(&self, ctx: usize) {
        for (_, o) in self.rec.ipc_opens.drain_where(|o| o.ctx == ctx) {
            self.ipc_gone(&o);
        }
    }

    fn ipc_gone(&self, o: &IpcOpen) {
        if !o.charged {
            self.rec.ipc_uncharged.fetch_sub(1, Ordering::AcqRel);
        } else if let Some(q) = self.quota_of(o.dev) {
            q.refund(Kind::Data, o.bytes);
        }
    }

    /// Opens charged to nobody here whose exporter's mark is gone (it ended: its charge went with its
    /// slot, while this process still maps the memory) are charged here now. Called before each
    /// admission; nothing to do (one atomic load) while no such open exists.
    pub(crate) fn settle_ipc_opens(&self) {
        if self.rec.ipc_uncharged.load(Ordering::Acquire) == 0 {
            return;
        }
        for k in self.rec.ipc_opens.keys() {
            let Some(o) = self.rec.ipc_opens.with(k, |o| o.copied()) else {
                continue;
            };
            let Some(q) = self.quota_of(o.dev).filter(|_| !o.charged) else {
                continue;
            };
            if marked_elsewhere(q, o.mark) != Some(false) {
                continue;
            }
            let settled = self.rec.ipc_opens.with(k, |o| match o {
                Some(o) if !o.charged => {
                    o.charged = true;
                    q.charge_forced(Kind::Data, o.bytes);
                    true
                }
                _ => false,
            });
            if settled {
                self.rec.ipc_uncharged.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
}

hook!(cuIpcOpenMemHandle(p: *mut CUdeviceptr, handle: CUipcMemHandleValue, flags: c_uint) {
    let call = || forward!("cuIpcOpenMemHandle", fn(*mut CUdeviceptr, CUipcMemHandleValue, c_uint), p, handle, flags);
    if p.is_null() {
        return call();
    }
    let e = interposer();
    // SAFETY: non-null, written by the driver when it succeeded (read only then).
    e.ipc_open(&handle.reserved, call, || unsafe { *p }, |p| e.drv.ipc_close(p))
});

hook!(cuIpcOpenMemHandle_v2(p: *mut CUdeviceptr, handle: CUipcMemHandleValue, flags: c_uint) {
    let call = || forward!("cuIpcOpenMemHandle_v2", fn(*mut CUdeviceptr, CUipcMemHandleValue, c_uint), p, handle, flags);
    if p.is_null() {
        return call();
    }
    let e = interposer();
    // SAFETY: as above.
    e.ipc_open(&handle.reserved, call, || unsafe { *p }, |p| e.drv.ipc_close(p))
});

hook!(cuIpcCloseMemHandle(p: CUdeviceptr) {
    interposer().ipc_close_hooked(p, || forward!("cuIpcCloseMemHandle", fn(CUdeviceptr), p))
});

#[cfg(test)]
mod tests;
