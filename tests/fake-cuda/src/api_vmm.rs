//! Virtual memory management: physical allocations (`cuMemCreate`, charged), address
//! reservations (free), mappings and access; sparse arrays' tiles (`cuMemMapArrayAsync`) and multicast
//! objects (`cuMulticast*`), each of whose tiles and bindings holds a reference on the memory, as the
//! real driver's do. Exported memory outlives its last reference while a descriptor of it is open
//! (`api_share`, `sweep_kept`).

use crate::driver::*;
use crate::types::*;
use std::ffi::{c_int, c_void};

#[repr(C)]
pub struct AllocProp {
    kind: c_int,
    handle_types: c_int,
    loc_type: c_int,
    loc_id: c_int,
    win32: *mut c_void,
    flags: [u8; 8],
}

/// Drops one reference to physical allocation `h`; refunds when none is left, unless a descriptor it was
/// exported to is still open (kept until it closes); a multicast object's last drops its bindings.
pub fn unref(d: &Driver, objs: &mut Objs, h: u64) {
    let Some(p) = objs.vmm.get_mut(&h) else {
        return;
    };
    p.refs -= 1;
    if p.refs > 0 {
        return;
    }
    let p = objs.vmm.remove(&h).unwrap();
    for (_, _, b) in p.mc.unwrap_or_default() {
        unref(d, objs, b);
    }
    if p.foreign || p.size == 0 {
        return;
    }
    if p.exports
        .iter()
        .any(|&f| crate::api_share::open_elsewhere(f))
    {
        objs.kept.push((p.phys, p.size, p.exports));
        return;
    }
    crate::api_share::close_probes(&p.exports);
    d.refund(p.phys, p.size);
}

/// Gives back exported memory kept for descriptors that are all closed now (asked at allocations and
/// memory queries: nothing tells the fake when a process closes a descriptor).
pub fn sweep_kept(d: &Driver) {
    crate::api_ipc::sweep_opened(d);
    let mut objs = lock(&d.objs);
    let kept = std::mem::take(&mut objs.kept);
    for (phys, size, probes) in kept {
        if probes.iter().any(|&f| crate::api_share::open_elsewhere(f)) {
            objs.kept.push((phys, size, probes));
        } else {
            crate::api_share::close_probes(&probes);
            d.refund(phys, size);
        }
    }
}

/// One `CUarrayMapInfo` (cuda.h), its unions as raw words.
#[repr(C)]
pub struct ArrayMapInfo {
    resource_type: c_int,
    resource: u64,
    subresource_type: c_int,
    subresource: [u64; 4],
    op: c_int,
    handle_type: c_int,
    handle: u64,
    offset: u64,
    device_mask: u32,
    flags: u32,
    reserved: [u32; 2],
}

fn check_prop(d: &Driver, prop: *const AllocProp) -> Result<usize, CUresult> {
    if prop.is_null() {
        return Err(INVALID_VALUE);
    }
    // SAFETY: non-null, the caller passes a CUmemAllocationProp.
    let p = unsafe { &*prop };
    if p.kind != 1 || p.loc_type != 1 {
        return Err(INVALID_VALUE);
    }
    d.phys(p.loc_id).map_err(|_| INVALID_DEVICE)
}

cu_fn! {
fn cuMemGetAllocationGranularity(g: *mut usize, prop: *const AllocProp, _option: c_int) {
    let d = drv()?;
    check_prop(d, prop)?;
    out(g, VMM_GRANULARITY as usize)
}

fn cuMemCreate(handle: *mut u64, size: usize, prop: *const AllocProp, flags: u64) {
    let d = drv()?;
    sweep_kept(d);
    let phys = check_prop(d, prop)?;
    if handle.is_null() || size == 0 || !(size as u64).is_multiple_of(VMM_GRANULARITY) || flags != 0 { return Err(INVALID_VALUE); }
    d.charge(phys, size as u64)?;
    let h = new_handle() as u64;
    lock(&d.objs).vmm.insert(h, Phys { phys, size: size as u64, refs: 1, ..Phys::default() });
    out(handle, h)
}

fn cuMemRelease(h: u64) {
    let d = drv()?;
    let mut objs = lock(&d.objs);
    let phys_h = crate::api_share::resolve(h);
    if !objs.vmm.contains_key(&phys_h) { return Err(INVALID_VALUE); }
    crate::api_share::forget_import(h);
    unref(d, &mut objs, phys_h);
    Ok(())
}

fn cuMemAddressReserve(ptr: *mut u64, size: usize, align: usize, addr: u64, _flags: u64) {
    let d = drv()?;
    if ptr.is_null() || size == 0 || !(size as u64).is_multiple_of(VMM_GRANULARITY) { return Err(INVALID_VALUE); }
    let align = (align as u64).max(VMM_GRANULARITY);
    if !align.is_power_of_two() { return Err(INVALID_VALUE); }
    // The requested address, as a real driver takes it: a hint, honoured when it is aligned and free
    // (a program can so place device memory below 4 GiB, where the 32-bit entry points reach it).
    if addr != 0 && addr.is_multiple_of(align) {
        if let Some(start) = crate::mem::map_noreserve_at(addr, size as u64) {
            lock(&d.objs).reservations.insert(start, size as u64);
            return out(ptr, start);
        }
    }
    // Over-map, then cut to an aligned range.
    let len = size as u64 + align;
    let raw = crate::mem::map_noreserve(len).ok_or(OUT_OF_MEMORY)?;
    let start = round_up(raw, align);
    if start > raw { libc::munmap(raw as *mut c_void, (start - raw) as usize); }
    let end = start + size as u64;
    if raw + len > end { libc::munmap(end as *mut c_void, (raw + len - end) as usize); }
    lock(&d.objs).reservations.insert(start, size as u64);
    out(ptr, start)
}

fn cuMemAddressFree(ptr: u64, size: usize) {
    let d = drv()?;
    let mut objs = lock(&d.objs);
    if objs.reservations.get(&ptr) != Some(&(size as u64)) { return Err(INVALID_VALUE); }
    if objs.mappings.range(ptr..ptr + size as u64).next().is_some() { return Err(INVALID_VALUE); }
    objs.reservations.remove(&ptr);
    libc::munmap(ptr as *mut c_void, size);
    Ok(())
}

fn cuMemMap(ptr: u64, size: usize, offset: usize, h: u64, flags: u64) {
    let d = drv()?;
    let h = crate::api_share::resolve(h);
    let mut objs = lock(&d.objs);
    let size = size as u64;
    let offset = offset as u64;
    if flags != 0 || size == 0 || !offset.is_multiple_of(VMM_GRANULARITY) { return Err(INVALID_VALUE); }
    let inside = matches!(objs.reservations.range(..=ptr).next_back(), Some((&s, &l)) if ptr + size <= s + l);
    let phys_size = objs.vmm.get(&h).map(|p| p.size).ok_or(INVALID_HANDLE)?;
    if !inside || offset.checked_add(size).is_none_or(|e| e > phys_size) { return Err(INVALID_VALUE); }
    let overlaps = objs.mappings.range(..ptr + size).next_back().is_some_and(|(&s, &(l, _))| s + l > ptr);
    if overlaps { return Err(INVALID_VALUE); }
    objs.mappings.insert(ptr, (size, h));
    objs.vmm.get_mut(&h).unwrap().refs += 1;
    Ok(())
}

fn cuMemUnmap(ptr: u64, size: usize) {
    let d = drv()?;
    let mut objs = lock(&d.objs);
    let gone: Vec<(u64, u64, u64)> = objs.mappings.range(ptr..ptr + size as u64).map(|(&s, &(l, h))| (s, l, h)).collect();
    if gone.is_empty() { return Err(INVALID_VALUE); }
    for (s, l, h) in gone {
        objs.mappings.remove(&s);
        libc::madvise(s as *mut c_void, l as usize, libc::MADV_DONTNEED);
        unref(d, &mut objs, h);
    }
    Ok(())
}

fn cuMemSetAccess(ptr: u64, size: usize, desc: *const c_void, count: usize) {
    let d = drv()?;
    if desc.is_null() || count == 0 { return Err(INVALID_VALUE); }
    let objs = lock(&d.objs);
    let mapped = matches!(objs.mappings.range(..=ptr).next_back(), Some((&s, &(l, _))) if ptr + size as u64 <= s + l);
    if mapped { Ok(()) } else { Err(INVALID_VALUE) }
}

fn cuMemRetainAllocationHandle(h: *mut u64, addr: *mut c_void) {
    let d = drv()?;
    let mut objs = lock(&d.objs);
    let p = addr as u64;
    let found = objs.mappings.range(..=p).next_back().filter(|(&s, &(l, _))| p < s + l).map(|(_, &(_, h))| h);
    let hh = found.ok_or(INVALID_VALUE)?;
    objs.vmm.get_mut(&hh).unwrap().refs += 1;
    out(h, hh)
}

fn cuMemGetAllocationPropertiesFromHandle(prop: *mut AllocProp, h: u64) {
    let d = drv()?;
    let h = crate::api_share::resolve(h);
    let objs = lock(&d.objs);
    let p = objs.vmm.get(&h).ok_or(INVALID_VALUE)?;
    out(prop, AllocProp { kind: 1, handle_types: 0, loc_type: 1, loc_id: d.ordinal(p.phys) as c_int, win32: std::ptr::null_mut(), flags: [0; 8] })
}

fn cuMemMapArrayAsync(list: *mut ArrayMapInfo, count: u32, _stream: Handle) {
    let d = drv()?;
    if list.is_null() || count == 0 { return Err(INVALID_VALUE); }
    let infos = std::slice::from_raw_parts(list, count as usize);
    let mut objs = lock(&d.objs);
    for m in infos {
        let a = objs.arrays.get(&(m.resource as Handle)).ok_or(INVALID_HANDLE)?;
        if a.flags & (0x40 | 0x80) == 0 { return Err(INVALID_VALUE); }
        match m.op {
            1 if m.handle_type == 0 && objs.vmm.get(&crate::api_share::resolve(m.handle)).is_some_and(|p| p.mc.is_none()) => {}
            2 if m.handle == 0 => {}
            _ => return Err(INVALID_VALUE),
        }
    }
    for m in infos {
        let key = (m.subresource_type, m.subresource);
        let a = objs.arrays.get_mut(&(m.resource as Handle)).unwrap();
        if m.op == 1 {
            let h = crate::api_share::resolve(m.handle);
            a.tiles.push((key, h));
            objs.vmm.get_mut(&h).unwrap().refs += 1;
        } else {
            let (gone, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut a.tiles).into_iter().partition(|t| t.0 == key);
            a.tiles = keep;
            for (_, h) in gone {
                unref(d, &mut objs, h);
            }
        }
    }
    Ok(())
}

fn cuMulticastGetGranularity(g: *mut usize, prop: *const McProp, _option: c_int) {
    drv()?;
    if prop.is_null() { return Err(INVALID_VALUE); }
    out(g, VMM_GRANULARITY as usize)
}

fn cuMulticastCreate(handle: *mut u64, prop: *const McProp) {
    let d = drv()?;
    if handle.is_null() || prop.is_null() { return Err(INVALID_VALUE); }
    let p = &*prop;
    if p.devices == 0 || p.size == 0 || !(p.size as u64).is_multiple_of(VMM_GRANULARITY) { return Err(INVALID_VALUE); }
    let h = new_handle() as u64;
    lock(&d.objs).vmm.insert(h, Phys { size: p.size as u64, refs: 1, mc: Some(Vec::new()), ..Phys::default() });
    out(handle, h)
}

fn cuMulticastAddDevice(mc: u64, dev: CUdevice) {
    let d = drv()?;
    d.phys(dev)?;
    match lock(&d.objs).vmm.get(&mc) { Some(p) if p.mc.is_some() => Ok(()), _ => Err(INVALID_HANDLE) }
}

fn cuMulticastBindMem(mc: u64, mc_offset: usize, mem: u64, mem_offset: usize, size: usize, flags: u64) {
    let d = drv()?;
    bind(d, mc, mc_offset as u64, crate::api_share::resolve(mem), mem_offset as u64, size as u64, flags)
}

fn cuMulticastBindAddr(mc: u64, mc_offset: usize, ptr: u64, size: usize, flags: u64) {
    let d = drv()?;
    let found = lock(&d.objs).mappings.range(..=ptr).next_back().filter(|(&s, &(l, _))| ptr < s + l).map(|(&s, &(_, h))| (h, ptr - s));
    let (h, off) = found.ok_or(INVALID_VALUE)?;
    bind(d, mc, mc_offset as u64, h, off, size as u64, flags)
}

fn cuMulticastUnbind(mc: u64, dev: CUdevice, mc_offset: usize, size: usize) {
    let d = drv()?;
    let ord = usize::try_from(dev).map_err(|_| INVALID_DEVICE)?;
    let mut objs = lock(&d.objs);
    let binds = objs.vmm.get_mut(&mc).and_then(|p| p.mc.as_mut()).ok_or(INVALID_HANDLE)?;
    let (lo, hi) = (mc_offset as u64, mc_offset as u64 + size as u64);
    let (gone, keep): (Vec<_>, Vec<_>) = std::mem::take(binds).into_iter().partition(|b| b.1 == ord && b.0 >= lo && b.0 < hi);
    *binds = keep;
    for (_, _, h) in gone {
        unref(d, &mut objs, h);
    }
    Ok(())
}
}

/// `CUmulticastObjectProp` (cuda.h).
#[repr(C)]
pub struct McProp {
    devices: u32,
    size: usize,
    handle_types: u64,
    flags: u64,
}

/// Binds `size` bytes of physical allocation `h` from `offset` at `mc_offset` of multicast object `mc`.
fn bind(d: &Driver, mc: u64, mc_offset: u64, h: u64, offset: u64, size: u64, flags: u64) -> R {
    let mut objs = lock(&d.objs);
    let (psize, ord) = match objs.vmm.get(&h) {
        Some(p) if p.mc.is_none() => (p.size, d.ordinal(p.phys)),
        _ => return Err(INVALID_HANDLE),
    };
    let mc_size = match objs.vmm.get(&mc) {
        Some(p) if p.mc.is_some() => p.size,
        _ => return Err(INVALID_HANDLE),
    };
    if flags != 0
        || size == 0
        || offset.checked_add(size).is_none_or(|e| e > psize)
        || mc_offset.checked_add(size).is_none_or(|e| e > mc_size)
    {
        return Err(INVALID_VALUE);
    }
    objs.vmm.get_mut(&h).unwrap().refs += 1;
    objs.vmm
        .get_mut(&mc)
        .unwrap()
        .mc
        .as_mut()
        .unwrap()
        .push((mc_offset, ord, h));
    Ok(())
}

cu_alias! {
    cuMemMapArrayAsync_ptsz => cuMemMapArrayAsync(list: *mut ArrayMapInfo, count: u32, stream: Handle);
}
