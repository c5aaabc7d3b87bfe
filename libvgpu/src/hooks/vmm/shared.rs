//! VMM memory shared between processes: `cuMemExportToShareableHandle` and
//! `cuMemImportFromShareableHandle`. The driver keeps the physical memory while any handle or mapping of
//! it lives, in any process, so a release of the exporting handle frees nothing while an import lives.
//!
//! The rules (`docs/libvgpu.md`, "What a handle keeps"): the exporter keeps an exported handle charged
//! until it ends (a descriptor, or an import elsewhere, may keep the memory after every reference of its
//! own is gone, and nothing tells it when they go: a release that cannot be proven to free memory does
//! not refund it). The importer is charged too: an import of another process's memory is charged to the
//! device the driver says the handle's memory is on (`cuMemGetAllocationPropertiesFromHandle`), by the
//! union of the ranges mapped or bound of it (the driver gives no size for a handle; memory is usable
//! only mapped), before the mapping is made; refused past the quota. An import of this process's own
//! export (the same file descriptor, known by its device and inode, for a regular file only: see
//! `fd_identity`) is one more reference on the exported handle's record: charged once. An import whose device cannot be told is released and refused
//! under a limit.
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};

use vgpu_ledger::Kind;

use super::super::common::{hook, interposer, Interposer, Target};
use crate::driver::{Driver, Place};
use crate::error::Error;
use crate::ffi::*;
use crate::quota::DeviceQuota;
use crate::real_symbols::forward;
use crate::records::{Rec, Spans, VmmRec};

/// CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: the shareable handle is a file descriptor.
const POSIX_FD: c_int = 1;

/// The identity of an open file (device and inode), the same in every process the descriptor reaches:
/// only for a regular file, whose inode is its own (a memory file). A device node's or an anonymous
/// inode's is shared by every descriptor of its kind (a driver that exports through opens of its control
/// device gives every export the same one), so none is given for those: a tenant could otherwise export
/// a small handle once and have any other process's export it imports taken for that one (charged
/// nothing). Such an import is charged as another process's, once more (on the safe side).
pub(crate) fn fd_identity(fd: c_int) -> Option<u64> {
    // SAFETY: all-zero is a valid stat buffer; fstat only writes it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a plain descriptor number and a valid out-pointer.
    if fd < 0 || unsafe { libc::fstat(fd, &mut st) } != 0 {
        return None;
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return None;
    }
    Some((st.st_ino as u64) ^ (st.st_dev as u64).rotate_left(40) | 1)
}

/// Tickets of the maps and bindings in flight of imported memory (`Spans`).
static TICKETS: AtomicU64 = AtomicU64::new(1);

impl<D: Driver> Interposer<'_, D> {
    /// cuMemExportToShareableHandle of `handle` (any handle type): `identity` gives the descriptor's
    /// identity, for a POSIX descriptor, once the driver made it. From the call on, the handle's memory may
    /// be kept by what the export made (a descriptor, a fabric handle, another process's import of either),
    /// which this process cannot see go: its record is kept charged when its last reference here goes
    /// (`VmmRec::kept`). (An import of this process's own export names a handle exported already.)
    pub(crate) fn vmm_export(
        &self,
        handle: u64,
        call: impl FnOnce() -> CUresult,
        identity: impl FnOnce() -> Option<u64>,
    ) -> CUresult {
        if self.drv.unlimited() {
            return call();
        }
        let of = self.rec.vmm.with(handle, |v| {
            v.map(|v| {
                v.exporting += 1;
                v.of
            })
        });
        let r = call();
        self.rec.vmm.with(handle, |v| {
            if let Some(v) = v {
                v.exporting = v.exporting.saturating_sub(1);
                v.exported |= r == CUDA_SUCCESS;
            }
        });
        if r != CUDA_SUCCESS {
            return r;
        }
        if let (Some(id), Some(_)) = (identity(), of) {
            self.rec
                .vmm_exports
                .insert(id, (id, of.filter(|&o| o != 0).unwrap_or(handle)));
        }
        r
    }

    /// cuMemImportFromShareableHandle: `read` gives the handle the driver wrote; `identity`: the
    /// descriptor's, for an fd.
    pub(crate) fn vmm_import(
        &self,
        identity: Option<u64>,
        call: impl FnOnce() -> CUresult,
        read: impl FnOnce() -> u64,
    ) -> CUresult {
        if self.drv.unlimited() {
            return call();
        }
        let r = call();
        if r != CUDA_SUCCESS {
            return r;
        }
        let h = read();
        if self.vmm_ref(h) {
            // the driver answered with a handle this process holds: one more reference to it
            return r;
        }
        let own = identity
            .and_then(|id| self.rec.vmm_exports.with(id, |e| e.map(|e| e.1)))
            .and_then(|orig| self.rec.vmm.with(orig, |v| v.map(|v| (orig, v.rec.dev))));
        if let Some((orig, dev)) = own {
            self.vmm_ref(orig);
            let alias = VmmRec {
                of: orig,
                ..VmmRec::new(Rec::new(dev, Kind::Vmm, 0, 0))
            };
            self.rec.vmm.insert(h, alias);
            return r;
        }
        let dev = match self.drv.handle_place(h) {
            Place::Device(d) => d,
            Place::Host => return r,
            Place::Unknown => {
                self.drv.mem_release(h);
                return self.unresolved("an imported VMM handle", h);
            }
        };
        match self.target(Some(dev)) {
            Target::Charge(_) => {
                let import = VmmRec {
                    imported: true,
                    ..VmmRec::new(Rec::new(dev, Kind::Vmm, 0, 0))
                };
                self.rec.vmm.insert(h, import);
                r
            }
            Target::Forward => r,
            Target::Fail(e) => {
                self.drv.mem_release(h);
                e.cuda()
            }
        }
    }

    /// Before mapping or binding `[offset, offset + size)` of `handle`: an import of another process's
    /// memory is charged what this adds to the union of what is mapped or bound of it (each byte once,
    /// however many windows cover it). Err: refused with this code (past the quota); Ok(Some(ticket)):
    /// charged, to be settled by `hold_range_end`; Ok(None): nothing to charge.
    pub(crate) fn hold_range(
        &self,
        handle: u64,
        offset: u64,
        size: u64,
    ) -> Result<Option<u64>, CUresult> {
        let Some(dev) = self
            .rec
            .vmm
            .with(handle, |v| v.filter(|v| v.imported).map(|v| v.rec.dev))
        else {
            return Ok(None);
        };
        let Some(q) = self.quota_of(dev) else {
            return Ok(None);
        };
        let ticket = TICKETS.fetch_add(1, Ordering::Relaxed);
        let end = offset.saturating_add(size);
        let more = self
            .rec
            .vmm_spans
            .update(handle, Spans::default, |s| s.begin(ticket, offset, end));
        if !self.admit(q, Kind::Vmm, more) {
            let kept = self
                .rec
                .vmm_spans
                .with(handle, |s| s.map(|s| s.abort(ticket).1));
            // a mapping made meanwhile by another thread counted on this one's charge for its overlap
            self.import_bytes(handle, q, kept.unwrap_or(0) as i128);
            return Err(Error::OutOfMemory.cuda());
        }
        if !self
            .rec
            .vmm
            .with(handle, |v| v.map(|v| v.rec.bytes += more).is_some())
        {
            q.refund(Kind::Vmm, more); // released meanwhile: it gave back what it held
        }
        Ok(Some(ticket))
    }

    /// A call that maps or binds `[offset, offset + size)` of `handle` (cuMemMap, cuMulticastBindMem):
    /// the range charged first (`hold_range`), the handle referenced before the call (so that a release
    /// racing it cannot give back what the call is about to keep), and both settled after it. Returns the
    /// call's result and whether the handle is ours and now held by what the call made.
    pub(crate) fn held_by(
        &self,
        handle: u64,
        offset: u64,
        size: u64,
        call: impl FnOnce() -> CUresult,
    ) -> (CUresult, bool) {
        let ticket = match self.hold_range(handle, offset, size) {
            Ok(t) => t,
            Err(r) => return (r, false),
        };
        let ours = self.vmm_ref(handle);
        let r = call();
        self.hold_range_end(handle, ticket, offset, size, r == CUDA_SUCCESS);
        if ours && r != CUDA_SUCCESS {
            self.vmm_unref(handle);
        }
        (r, ours && r == CUDA_SUCCESS)
    }

    /// The driver mapped or bound (`done`) the range `hold_range` charged under `ticket`, or did not:
    /// the charge follows (a failed map gives back what no other mapping covers).
    pub(crate) fn hold_range_end(
        &self,
        handle: u64,
        ticket: Option<u64>,
        offset: u64,
        size: u64,
        done: bool,
    ) {
        let Some(ticket) = ticket else {
            return;
        };
        let Some(q) = self
            .rec
            .vmm
            .with(handle, |v| v.map(|v| v.rec.dev))
            .and_then(|d| self.quota_of(d))
        else {
            return;
        };
        let end = offset.saturating_add(size);
        let delta = self.rec.vmm_spans.with(handle, |s| {
            s.map(|s| {
                if done {
                    s.commit(ticket, offset, end) as i128
                } else {
                    -(s.abort(ticket).0 as i128)
                }
            })
        });
        self.import_bytes(handle, q, delta.unwrap_or(0));
    }

    /// Charges (forced: the driver holds it already) or gives back `delta` bytes of an import's record.
    fn import_bytes(&self, handle: u64, q: &DeviceQuota, delta: i128) {
        let moved = self.rec.vmm.with(handle, |v| {
            v.map(|v| {
                let b = v.rec.bytes as i128 + delta;
                v.rec.bytes = b.max(0) as u64;
            })
        });
        if moved.is_none() {
            return;
        }
        match delta.cmp(&0) {
            std::cmp::Ordering::Greater => q.charge_forced(Kind::Vmm, delta as u64),
            std::cmp::Ordering::Less => q.refund(Kind::Vmm, delta.unsigned_abs() as u64),
            std::cmp::Ordering::Equal => {}
        }
    }
}

hook!(cuMemExportToShareableHandle(shareable: *mut c_void, handle: CUmemGenericAllocationHandle, kind: c_int, flags: u64) {
    let call = || forward!("cuMemExportToShareableHandle", fn(*mut c_void, CUmemGenericAllocationHandle, c_int, u64), shareable, handle, kind, flags);
    interposer().vmm_export(handle, call, || {
        if kind != POSIX_FD || shareable.is_null() {
            return None;
        }
        // SAFETY: non-null; for a POSIX descriptor the driver wrote an int there (read only on success).
        fd_identity(unsafe { *(shareable as *const c_int) })
    })
});

hook!(cuMemImportFromShareableHandle(handle: *mut CUmemGenericAllocationHandle, os_handle: *mut c_void, kind: c_int) {
    let call = || forward!("cuMemImportFromShareableHandle", fn(*mut CUmemGenericAllocationHandle, *mut c_void, c_int), handle, os_handle, kind);
    if handle.is_null() {
        return call();
    }
    // A POSIX descriptor is passed as the pointer's value.
    let identity = (kind == POSIX_FD).then(|| fd_identity(os_handle as usize as c_int)).flatten();
    // SAFETY: non-null, written by the driver when it succeeded (read only then).
    interposer().vmm_import(identity, call, || unsafe { *handle })
});

#[cfg(test)]
mod tests;
