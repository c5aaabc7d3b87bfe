//! Legacy CUDA IPC: `cuIpcGetMemHandle`, `cuIpcOpenMemHandle[_v2]` and `cuIpcCloseMemHandle`. The handle
//! carries the allocation's base, the exporter's PID, its size and physical device, so another process
//! opens it without asking the exporter. As an H200 does, the exporter's allocation is kept past its free
//! until the exporter ends (`Objs::ipc`), and counted in the exporter's process meanwhile; an open maps
//! the same memory, counted there too. Once the exporter ended, the memory an open still maps is kept and
//! counted in the importer's process instead (`sweep_opened`), until it is closed: memory is kept while a
//! reference to it exists.

use crate::driver::*;
use crate::mem::Kind;
use crate::types::*;
use std::ffi::c_uint;

/// `CUipcMemHandle` passed by value, as C passes a struct.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IpcHandle {
    reserved: [u8; 64],
}

/// Memory of another process opened here: (physical device, bytes, exporter's PID, counted here now).
pub struct Opened {
    pub phys: usize,
    pub size: u64,
    pub exporter: u32,
    pub moved: bool,
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
    let mut h = [0u8; 64];
    h[..8].copy_from_slice(&p.to_le_bytes());
    h[8..12].copy_from_slice(&std::process::id().to_le_bytes());
    h[12..20].copy_from_slice(&size.to_le_bytes());
    h[20..28].copy_from_slice(&(phys as u64).to_le_bytes());
    out(handle, h)
}

fn cuIpcOpenMemHandle_v2(dptr: *mut u64, handle: IpcHandle, flags: c_uint) {
    let d = drv()?;
    if dptr.is_null() || flags > 1 { return Err(INVALID_VALUE); }
    let (ctx, _, _) = current(d)?;
    let h = &handle.reserved;
    let (exporter, size, phys) = (word(h, 8) as u32, word(h, 12), word(h, 20) as usize);
    // the driver refuses a handle of the process's own memory, and one whose exporter is gone
    if exporter == std::process::id() { return Err(INVALID_CONTEXT); }
    if size == 0 || phys >= d.shared.ndev() || !alive(exporter) { return Err(INVALID_VALUE); }
    let p = lock(&d.mem).alloc(phys, d.shared.total(phys), size, Kind::Data, ctx, 0, 0).ok_or(OUT_OF_MEMORY)?;
    lock(&d.objs).ipc_opened.insert(p, Opened { phys, size, exporter, moved: false });
    out(dptr, p)
}

fn cuIpcCloseMemHandle(p: u64) {
    let d = drv()?;
    let o = lock(&d.objs).ipc_opened.remove(&p).ok_or(INVALID_VALUE)?;
    lock(&d.mem).release(p);
    if o.moved {
        d.refund(o.phys, o.size);
    }
    Ok(())
}
}

cu_alias! {
    cuIpcOpenMemHandle => cuIpcOpenMemHandle_v2(dptr: *mut u64, handle: IpcHandle, flags: c_uint);
}
