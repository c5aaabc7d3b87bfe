//! Memory of one process opened in another: legacy CUDA IPC (`cuIpcGetMemHandle`, `cuIpcOpenMemHandle[_v2]`,
//! `cuIpcCloseMemHandle`) and shared pools (`cuMemPoolExportToShareableHandle`,
//! `cuMemPoolImportFromShareableHandle`, `cuMemPoolExportPointer`, `cuMemPoolImportPointer`). A legacy handle
//! and a pointer's export data carry the allocation's address, the exporter's PID, its size and physical
//! device, so another process opens it without asking the exporter. As an H200 does for legacy IPC, the
//! exporter's allocation (or exported pool pointer) is kept past its free until the exporter ends
//! (`Objs::ipc`; a pool's kept allocation stays used in the pool, so neither a trim nor the pool's
//! destruction gives it back), counted in the exporter's process meanwhile; an open maps the same memory,
//! counted there too. Once the exporter ended, the memory an open still maps is kept and counted in the
//! importer's process instead (`sweep_opened`), until it is closed (`cuIpcCloseMemHandle`) or freed (an
//! imported pool pointer: `cuMemFreeAsync`, `cuMemFree`): memory is kept while a reference to it exists.

use crate::driver::*;
use crate::mem::Kind;
use crate::types::*;
use std::ffi::{c_int, c_uint, c_void};

/// CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.
const POSIX_FD: c_int = 1;

/// `CUipcMemHandle` passed by value, as C passes a struct.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IpcHandle {
    reserved: [u8; 64],
}

fn word(h: &[u8; 64], at: usize) -> u64 {
    u64::from_le_bytes(h[at..at + 8].try_into().unwrap_or_default())
}

fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only asks whether the process exists.
    unsafe { libc::kill(pid as libc::pid_t, 0) == 0 || *libc::__errno_location() == libc::EPERM }
}

/// Opens whose exporter ended are counted in this process from now on (the driver keeps the memory for
/// the mapping).
pub fn sweep_opened(d: &Driver) {
    let mut objs = lock(&d.objs);
    for o in objs
        .ipc_opened
        .values_mut()
        .filter(|o| !o.moved && !alive(o.exporter))
    {
        if d.charge(o.phys, o.size).is_ok() {
            o.moved = true;
        }
    }
}

/// A legacy handle's or a pool pointer's export data: the address, this process's PID, size and device.
fn describe(p: u64, size: u64, phys: usize) -> [u8; 64] {
    let mut h = [0u8; 64];
    h[..8].copy_from_slice(&p.to_le_bytes());
    h[8..12].copy_from_slice(&std::process::id().to_le_bytes());
    h[12..20].copy_from_slice(&size.to_le_bytes());
    h[20..28].copy_from_slice(&(phys as u64).to_le_bytes());
    h
}

/// Maps the memory `h` describes at an address of this process (in the current context), counted in
/// the exporter's process. The driver refuses a description of the process's own memory, and one whose
/// exporter is gone.
fn open(d: &Driver, h: &[u8; 64]) -> Result<u64, CUresult> {
    let (ctx, _, _) = current(d)?;
    let (exporter, size, phys) = (word(h, 8) as u32, word(h, 12), word(h, 20) as usize);
    if exporter == std::process::id() {
        return Err(INVALID_CONTEXT);
    }
    if size == 0 || phys >= d.shared.ndev() || !alive(exporter) {
        return Err(INVALID_VALUE);
    }
    let total = d.shared.total(phys);
    let p = lock(&d.mem)
        .alloc(phys, total, size, Kind::Data, ctx, 0, 0)
        .ok_or(OUT_OF_MEMORY)?;
    let opened = Opened {
        phys,
        size,
        exporter,
        moved: false,
    };
    lock(&d.objs).ipc_opened.insert(p, opened);
    Ok(p)
}

/// The importer freed or closed `p`: if it was counted here (its exporter ended), given back.
pub fn forget_opened(d: &Driver, p: u64) -> bool {
    let Some(o) = lock(&d.objs).ipc_opened.remove(&p) else {
        return false;
    };
    if o.moved {
        d.refund(o.phys, o.size);
    }
    true
}

cu_fn! {
fn cuIpcGetMemHandle(handle: *mut [u8; 64], p: u64) {
    let d = drv()?;
    if handle.is_null() { return Err(INVALID_VALUE); }
    let mut mem = lock(&d.mem);
    let (start, a) = mem.find(p, 1).ok_or(INVALID_VALUE)?;
    // Device memory from cuMemAlloc/cuMemAllocPitch only, from its base (the driver's rule): managed,
    // pool and graph memory are refused.
    if start != p || !matches!(a.kind, Kind::Data | Kind::Pitch) { return Err(INVALID_VALUE); }
    let (size, phys) = (a.size, a.phys);
    drop(mem);
    lock(&d.objs).ipc.insert(p);
    out(handle, describe(p, size, phys))
}

fn cuIpcOpenMemHandle_v2(dptr: *mut u64, handle: IpcHandle, flags: c_uint) {
    let d = drv()?;
    if dptr.is_null() || flags > 1 { return Err(INVALID_VALUE); }
    out(dptr, open(d, &handle.reserved)?)
}

fn cuMemPoolExportToShareableHandle(out_handle: *mut c_void, pool: Handle, kind: c_int, _flags: u64) {
    let d = drv()?;
    if out_handle.is_null() { return Err(INVALID_VALUE); }
    if kind != POSIX_FD { return Err(NOT_SUPPORTED); }
    let phys = match lock(&d.objs).pools.get(&pool) {
        Some(p) if p.shareable => p.phys,
        _ => return Err(INVALID_VALUE),
    };
    // a descriptor of an anonymous file stands for the pool: its device written into it
    let fd = libc::memfd_create(c"fake-cuda-pool".as_ptr(), libc::MFD_CLOEXEC);
    if fd < 0 { return Err(OUT_OF_MEMORY); }
    if libc::pwrite(fd, (&(phys as u64) as *const u64).cast(), 8, 0) != 8 {
        libc::close(fd);
        return Err(UNKNOWN);
    }
    out(out_handle as *mut c_int, fd)
}

fn cuMemPoolImportFromShareableHandle(pool: *mut Handle, handle: *mut c_void, kind: c_int, _flags: u64) {
    let d = drv()?;
    if pool.is_null() { return Err(INVALID_VALUE); }
    if kind != POSIX_FD { return Err(NOT_SUPPORTED); }
    let mut phys = 0u64;
    if libc::pread(handle as usize as c_int, (&mut phys as *mut u64).cast(), 8, 0) != 8 || phys as usize >= d.shared.ndev() {
        return Err(INVALID_VALUE);
    }
    let h = new_handle();
    lock(&d.objs).imported_pools.insert(h, phys as usize);
    out(pool, h)
}

fn cuMemPoolExportPointer(data: *mut [u8; 64], p: u64) {
    let d = drv()?;
    if data.is_null() { return Err(INVALID_VALUE); }
    let mut mem = lock(&d.mem);
    let (start, a) = mem.find(p, 1).ok_or(INVALID_VALUE)?;
    if start != p || a.kind != Kind::Pool { return Err(INVALID_VALUE); }
    let (size, phys, pool) = (a.size, a.phys, a.pool);
    drop(mem);
    let mut objs = lock(&d.objs);
    if !objs.pools.get(&pool).is_some_and(|p| p.shareable) { return Err(INVALID_VALUE); }
    objs.ipc.insert(p);
    out(data, describe(p, size, phys))
}

fn cuMemPoolImportPointer(dptr: *mut u64, pool: Handle, data: *mut [u8; 64]) {
    let d = drv()?;
    if dptr.is_null() || data.is_null() { return Err(INVALID_VALUE); }
    let phys = lock(&d.objs).imported_pools.get(&pool).copied().ok_or(INVALID_VALUE)?;
    if word(&*data, 20) as usize != phys { return Err(INVALID_VALUE); }
    out(dptr, open(d, &*data)?)
}

fn cuIpcCloseMemHandle(p: u64) {
    let d = drv()?;
    if !forget_opened(d, p) { return Err(INVALID_VALUE); }
    lock(&d.mem).release(p);
    Ok(())
}
}

cu_alias! {
    cuIpcOpenMemHandle => cuIpcOpenMemHandle_v2(dptr: *mut u64, handle: IpcHandle, flags: c_uint);
}
