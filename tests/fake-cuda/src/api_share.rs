//! CUDA 13's `cuCtxSynchronize_v2` (a context named, NULL for the current one), and VMM memory shared
//! through a file descriptor: `cuMemExportToShareableHandle` (POSIX descriptors only) and
//! `cuMemImportFromShareableHandle`. An import in the exporting process is a new handle of the same
//! physical allocation: it holds a reference, so releasing the exported handle frees nothing while the
//! import (or a mapping made through it) lives, as the real driver does.

use crate::api_pool::release_pools;
use crate::driver::*;
use crate::types::*;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::Mutex;

/// CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.
const POSIX_FD: c_int = 1;

/// Exported descriptors by (device, inode) -> the handle exported; imported handles -> the handle
/// whose physical allocation they name.
struct Shared {
    exports: HashMap<(u64, u64), u64>,
    imports: HashMap<u64, u64>,
}

static SHARED: Mutex<Option<Shared>> = Mutex::new(None);

fn with<R>(f: impl FnOnce(&mut Shared) -> R) -> R {
    let mut g = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    f(g.get_or_insert_with(|| Shared {
        exports: HashMap::new(),
        imports: HashMap::new(),
    }))
}

/// The physical allocation a handle names (an imported handle names its exporter's).
pub fn resolve(h: u64) -> u64 {
    with(|s| s.imports.get(&h).copied().unwrap_or(h))
}

/// cuMemRelease of an imported handle: the import is gone; the caller drops its reference on `resolve(h)`.
pub fn forget_import(h: u64) {
    with(|s| s.imports.remove(&h));
}

fn identity(fd: c_int) -> Option<(u64, u64)> {
    // SAFETY: all-zero is a valid stat buffer; fstat only writes it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a descriptor number and a valid out-pointer.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

cu_fn! {
fn cuCtxSynchronize_v2(ctx: Handle) {
    let d = drv()?;
    let phys = if ctx == 0 {
        current(d)?.2
    } else {
        lock(&d.objs).ctxs.get(&ctx).map(|c| c.phys).ok_or(INVALID_CONTEXT)?
    };
    crate::timeline::drain();
    release_pools(d, &mut lock(&d.objs), phys);
    Ok(())
}

fn cuMemExportToShareableHandle(out_handle: *mut c_void, h: u64, kind: c_int, _flags: u64) {
    let d = drv()?;
    if out_handle.is_null() { return Err(INVALID_VALUE); }
    if kind != POSIX_FD { return Err(NOT_SUPPORTED); }
    let h = resolve(h);
    if !lock(&d.objs).vmm.contains_key(&h) { return Err(INVALID_VALUE); }
    // A descriptor of an anonymous file stands for the allocation; its inode identifies it.
    let fd = libc::memfd_create(c"fake-cuda-vmm".as_ptr(), libc::MFD_CLOEXEC);
    if fd < 0 { return Err(OUT_OF_MEMORY); }
    let id = identity(fd).ok_or(INVALID_VALUE)?;
    with(|s| s.exports.insert(id, h));
    out(out_handle as *mut c_int, fd)
}

fn cuMemImportFromShareableHandle(h: *mut u64, os_handle: *mut c_void, kind: c_int) {
    let d = drv()?;
    if h.is_null() { return Err(INVALID_VALUE); }
    if kind != POSIX_FD { return Err(NOT_SUPPORTED); }
    let id = identity(os_handle as usize as c_int).ok_or(INVALID_VALUE)?;
    let orig = with(|s| s.exports.get(&id).copied()).ok_or(INVALID_VALUE)?;
    let mut objs = lock(&d.objs);
    let p = objs.vmm.get_mut(&orig).ok_or(INVALID_VALUE)?;
    p.refs += 1;
    let imported = new_handle() as u64;
    with(|s| s.imports.insert(imported, orig));
    out(h, imported)
}
}
