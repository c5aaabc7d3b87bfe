//! VMM memory shared between processes: `cuMemExportToShareableHandle` and
//! `cuMemImportFromShareableHandle`. The driver keeps the physical memory while any handle or mapping of
//! it lives, in any process, so a release of the exporting handle frees nothing while an import lives.
//!
//! The rule (`docs/libvgpu.md`): the importer is charged. An import of another process's memory is
//! charged to the device the driver says the handle's memory is on (`cuMemGetAllocationPropertiesFromHandle`),
//! by what is mapped of it (the driver gives no size for a handle; memory is usable only mapped), before
//! the mapping is made; refused past the quota. An import of this process's own export (the same file
//! descriptor, known by its device and inode) is one more reference on the exported handle's record: it
//! stays charged, once, while either lives. An import whose device cannot be told is released and
//! refused under a limit.
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_int, c_void};

use vgpu_ledger::Kind;

use super::super::common::{hook, interposer, Interposer, Target};
use crate::driver::{Driver, Place};
use crate::error::Error;
use crate::ffi::*;
use crate::real_symbols::forward;
use crate::records::{Rec, VmmRec};

/// CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: the shareable handle is a file descriptor.
const POSIX_FD: c_int = 1;

/// The identity of an open file (device and inode), the same in every process the descriptor reaches.
pub(crate) fn fd_identity(fd: c_int) -> Option<u64> {
    // SAFETY: all-zero is a valid stat buffer; fstat only writes it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a plain descriptor number and a valid out-pointer.
    if fd < 0 || unsafe { libc::fstat(fd, &mut st) } != 0 {
        return None;
    }
    Some((st.st_ino as u64) ^ (st.st_dev as u64).rotate_left(40) | 1)
}

impl<D: Driver> Interposer<'_, D> {
    /// cuMemExportToShareableHandle of `handle` succeeded; `identity`: its descriptor's, for an fd.
    pub(crate) fn vmm_exported(&self, handle: u64, identity: Option<u64>) {
        if let Some(id) = identity {
            if self.rec.vmm.with(handle, |v| v.is_some()) {
                self.rec.vmm_exports.insert(id, (id, handle));
            }
        }
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
        if self.rec.vmm.with(h, |v| v.is_some()) {
            // the driver answered with a handle this process holds: one more reference to it
            self.rec.vmm.with(h, |v| v.map(|v| v.refs += 1));
            return r;
        }
        let own = identity
            .and_then(|id| self.rec.vmm_exports.with(id, |e| e.map(|e| e.1)))
            .and_then(|orig| self.rec.vmm.with(orig, |v| v.map(|v| (orig, v.rec.dev))));
        if let Some((orig, dev)) = own {
            self.rec.vmm.with(orig, |v| v.map(|v| v.refs += 1));
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

    /// Before mapping `size` bytes of `handle`: an import of another process's memory is charged what
    /// is mapped beyond what it was charged so far. Err: the map is refused with this code; Ok: what was
    /// charged now (given back by `vmm_map_failed` if the driver does not map it).
    pub(crate) fn vmm_map_import(&self, handle: u64, size: u64) -> Result<u64, CUresult> {
        let Some((dev, bytes)) = self.rec.vmm.with(handle, |v| {
            v.filter(|v| v.imported).map(|v| (v.rec.dev, v.rec.bytes))
        }) else {
            return Ok(0);
        };
        let more = size.saturating_sub(bytes);
        let Some(q) = self.quota_of(dev) else {
            return Ok(0);
        };
        if !self.admit(q, Kind::Vmm, more) {
            return Err(Error::OutOfMemory.cuda());
        }
        self.rec
            .vmm
            .with(handle, |v| v.map(|v| v.rec.bytes += more));
        Ok(more)
    }

    /// The driver did not map: give back what `vmm_map_import` charged for it.
    pub(crate) fn vmm_map_failed(&self, handle: u64, charged: u64) {
        if charged == 0 {
            return;
        }
        let dev = self.rec.vmm.with(handle, |v| {
            v.map(|v| {
                v.rec.bytes -= charged.min(v.rec.bytes);
                v.rec.dev
            })
        });
        if let Some(q) = dev.and_then(|d| self.quota_of(d)) {
            q.refund(Kind::Vmm, charged);
        }
    }
}

hook!(cuMemExportToShareableHandle(shareable: *mut c_void, handle: CUmemGenericAllocationHandle, kind: c_int, flags: u64) {
    let r = forward!("cuMemExportToShareableHandle", fn(*mut c_void, CUmemGenericAllocationHandle, c_int, u64), shareable, handle, kind, flags);
    let e = interposer();
    if r == CUDA_SUCCESS && kind == POSIX_FD && !shareable.is_null() && !e.drv.unlimited() {
        // SAFETY: non-null; for a POSIX descriptor the driver wrote an int there.
        let fd = unsafe { *(shareable as *const c_int) };
        e.vmm_exported(handle, fd_identity(fd));
    }
    r
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
