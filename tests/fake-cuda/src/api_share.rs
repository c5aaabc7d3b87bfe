//! CUDA 13's `cuCtxSynchronize_v2` (a context named, NULL for the current one), and VMM memory shared
//! through a file descriptor: `cuMemExportToShareableHandle` (POSIX descriptors only) and
//! `cuMemImportFromShareableHandle`. An import in the exporting process is a new handle of the same
//! physical allocation: it holds a reference, so releasing the exported handle frees nothing while the
//! import (or a mapping made through it) lives, as the real driver does. The descriptor itself keeps the
//! memory too, as on an H200 (issue 48: three 1 GiB allocations exported and released held 3 GiB): the
//! export takes an OFD lock through the descriptor's open file description and keeps a probe description
//! of its own, so the memory is given back once every copy of the descriptor, in any process, is closed
//! (`open_elsewhere`). Another process imports the descriptor by the allocation's device and size,
//! written into it at the export: its handle names the same memory, counted in the exporter's process.

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
    crate::timeline::drain(None);
    release_pools(d, &mut lock(&d.objs), phys);
    Ok(())
}

fn cuMemExportToShareableHandle(out_handle: *mut c_void, h: u64, kind: c_int, _flags: u64) {
    let d = drv()?;
    if out_handle.is_null() { return Err(INVALID_VALUE); }
    if kind != POSIX_FD { return Err(NOT_SUPPORTED); }
    let h = resolve(h);
    let mut objs = lock(&d.objs);
    let Some(p) = objs.vmm.get_mut(&h) else { return Err(INVALID_VALUE) };
    // A descriptor of an anonymous file stands for the allocation; its inode identifies it.
    let fd = libc::memfd_create(c"fake-cuda-vmm".as_ptr(), libc::MFD_CLOEXEC);
    if fd < 0 { return Err(OUT_OF_MEMORY); }
    let probe = if p.foreign || p.mc.is_some() { None } else { keep_alive(fd, p.phys, p.size) };
    let id = identity(fd).ok_or(INVALID_VALUE)?;
    if let Some(probe) = probe {
        p.exports.push(probe);
    }
    with(|s| s.exports.insert(id, h));
    out(out_handle as *mut c_int, fd)
}

fn cuMemImportFromShareableHandle(h: *mut u64, os_handle: *mut c_void, kind: c_int) {
    let d = drv()?;
    if h.is_null() { return Err(INVALID_VALUE); }
    if kind != POSIX_FD { return Err(NOT_SUPPORTED); }
    let fd = os_handle as usize as c_int;
    let id = identity(fd).ok_or(INVALID_VALUE)?;
    let Some(orig) = with(|s| s.exports.get(&id).copied()) else {
        // another process's export: the same memory, counted where it was made
        let (phys, size) = exported_memory(fd).ok_or(INVALID_VALUE)?;
        if phys >= d.shared.ndev() { return Err(INVALID_VALUE); }
        let imported = new_handle() as u64;
        lock(&d.objs).vmm.insert(imported, Phys { phys, size, refs: 1, foreign: true, ..Phys::default() });
        return out(h, imported);
    };
    let mut objs = lock(&d.objs);
    let p = objs.vmm.get_mut(&orig).ok_or(INVALID_VALUE)?;
    p.refs += 1;
    let imported = new_handle() as u64;
    with(|s| s.imports.insert(imported, orig));
    out(h, imported)
}
}

/// Marks `fd` as the descriptor of `size` bytes on physical device `phys`: the two words written into
/// it (for another process's import), an OFD lock through its description, and a probe description of
/// our own that sees the lock. None when the lock cannot be taken (the memory is then not kept).
fn keep_alive(fd: c_int, phys: usize, size: u64) -> Option<c_int> {
    let words = [phys as u64, size];
    // SAFETY: 16 bytes from a local array into a descriptor we made.
    let n = unsafe { libc::pwrite(fd, words.as_ptr().cast(), 16, 0) };
    // SAFETY: a plain fcntl on our descriptor with a valid flock.
    let locked =
        n == 16 && unsafe { libc::fcntl(fd, libc::F_OFD_SETLK, &lock_range(libc::F_WRLCK)) } == 0;
    let path = std::ffi::CString::new(format!("/proc/self/fd/{fd}")).ok()?;
    // SAFETY: a NUL-terminated path.
    let probe = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    (locked && probe >= 0).then_some(probe)
}

fn lock_range(kind: c_int) -> libc::flock {
    // SAFETY: all-zero is a valid flock.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as _;
    fl.l_whence = libc::SEEK_SET as _;
    fl.l_len = 1;
    fl
}

/// Whether the exported descriptor `probe` watches is still open somewhere (its lock is held).
pub fn open_elsewhere(probe: c_int) -> bool {
    let mut fl = lock_range(libc::F_WRLCK);
    // SAFETY: a plain fcntl on our probe with a valid flock.
    let r = unsafe { libc::fcntl(probe, libc::F_OFD_GETLK, &mut fl) };
    r != 0 || fl.l_type != libc::F_UNLCK as _
}

pub fn close_probes(probes: &[c_int]) {
    for &p in probes {
        // SAFETY: our own probe descriptor, closed once.
        unsafe { libc::close(p) };
    }
}

/// The (physical device, size) an export wrote into descriptor `fd`.
fn exported_memory(fd: c_int) -> Option<(usize, u64)> {
    let mut words = [0u64; 2];
    // SAFETY: 16 bytes into a local array.
    let n = unsafe { libc::pread(fd, words.as_mut_ptr().cast(), 16, 0) };
    (n == 16 && words[1] > 0).then_some((words[0] as usize, words[1]))
}
