//! Memory pools shared between processes: `cuMemPoolExportToShareableHandle`, `cuMemPoolExportPointer` and
//! `cuMemPoolImportPointer` (docs/libvgpu.md, "What a handle keeps").
//!
//! * An exported pool: from the export on, any of its allocations may be imported by another process (the
//!   export data of a pointer is a description the tenant can make without asking), and the driver keeps
//!   an imported allocation past the exporter's free. So no free of the exported pool's allocations gives
//!   anything back: each stays among the pool's live allocations (its charge never below them), until the
//!   process ends (a release that cannot be proven to free memory does not refund it; one warning line).
//! * `cuMemPoolExportPointer` marks the allocation exported and holds the export data's mark in the
//!   device's ledger file (`hooks/ipc`), so an import of it in this container is known to be charged here.
//! * `cuMemPoolImportPointer` is an open of another process's memory, charged as a legacy IPC open
//!   (`Interposer::ipc_open`): once in a container, to the importer otherwise; the importer's free of the
//!   pointer (`cuMemFreeAsync`, `cuMemFree`) gives back what its import charged (`import_freed`).
//! * `cuMemPoolImportFromShareableHandle` is not hooked: an imported pool holds no memory of its own and the
//!   driver allocates nothing from it; what it reaches is each pointer imported from it.
#![allow(clippy::missing_safety_doc)]

use std::ffi::c_void;

use super::super::common::{hook, interposer, Interposer};
use crate::driver::Driver;
use crate::ffi::*;
use crate::real_symbols::forward;

impl<D: Driver> Interposer<'_, D> {
    /// Whether `pool` (a key of `Records::pools`, 0 for none) was exported.
    pub(crate) fn pool_exported(&self, pool: u64) -> bool {
        pool != 0 && self.rec.pools.with(pool, |p| p.is_some_and(|p| p.exported))
    }

    /// `cuMemPoolExportToShareableHandle` of `pool`: marked exported before the call (a free racing the
    /// export keeps its charge too), unmarked again only if the call failed and it was not exported before.
    pub(crate) fn pool_export(&self, pool: u64, call: impl FnOnce() -> CUresult) -> CUresult {
        if self.drv.unlimited() {
            return call();
        }
        // a pool the library did not see made is asked where it lives (and recorded)
        let _ = self.pool_device(pool);
        let was = self.rec.pools.with(pool, |p| {
            p.map(|p| std::mem::replace(&mut p.exported, true))
        });
        let r = call();
        if r != CUDA_SUCCESS && was == Some(false) {
            self.rec.pools.with(pool, |p| {
                if let Some(p) = p {
                    p.exported = false;
                }
            });
        }
        r
    }

    /// `cuMemPoolExportPointer` of `p`: `read` gives the export data the driver wrote (64 bytes).
    pub(crate) fn pool_export_pointer(
        &self,
        p: CUdeviceptr,
        call: impl FnOnce() -> CUresult,
        read: impl FnOnce() -> CUipcMemHandle,
    ) -> CUresult {
        let r = call();
        if r == CUDA_SUCCESS && !self.drv.unlimited() {
            if let Some(dev) = self.exported(p) {
                self.ipc_mark(dev, &read());
            }
        }
        r
    }
}

hook!(cuMemPoolExportToShareableHandle(handle: *mut c_void, pool: CUmemoryPool, kind: i32, flags: u64) {
    interposer().pool_export(pool as u64, || forward!("cuMemPoolExportToShareableHandle", fn(*mut c_void, CUmemoryPool, i32, u64), handle, pool, kind, flags))
});

hook!(cuMemPoolExportPointer(data: *mut CUipcMemHandle, p: CUdeviceptr) {
    let call = || forward!("cuMemPoolExportPointer", fn(*mut CUipcMemHandle, CUdeviceptr), data, p);
    if data.is_null() {
        return call();
    }
    // SAFETY: non-null, written by the driver when it succeeded (read only then).
    interposer().pool_export_pointer(p, call, || unsafe { *data })
});

hook!(cuMemPoolImportPointer(p: *mut CUdeviceptr, pool: CUmemoryPool, data: *mut CUipcMemHandle) {
    let call = || forward!("cuMemPoolImportPointer", fn(*mut CUdeviceptr, CUmemoryPool, *mut CUipcMemHandle), p, pool, data);
    if p.is_null() || data.is_null() {
        return call();
    }
    // SAFETY: non-null: the caller's export data (64 bytes), read before the call, which only reads it.
    let bytes = unsafe { *data };
    let e = interposer();
    // SAFETY: non-null, written by the driver when it succeeded (read only then).
    e.ipc_open(&bytes, call, || unsafe { *p }, |p| e.drv.mem_free(p))
});

#[cfg(test)]
mod tests;
