//! Virtual memory management: physical allocations (`cuMemCreate`, charged), address
//! reservations (free), mappings and access.

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

/// Drops one reference to physical allocation `h`; refunds when none is left.
fn unref(d: &Driver, objs: &mut Objs, h: u64) {
    if let Some(p) = objs.vmm.get_mut(&h) {
        p.refs -= 1;
        if p.refs == 0 {
            let p = objs.vmm.remove(&h).unwrap();
            d.refund(p.phys, p.size);
        }
    }
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
    let phys = check_prop(d, prop)?;
    if handle.is_null() || size == 0 || !(size as u64).is_multiple_of(VMM_GRANULARITY) || flags != 0 { return Err(INVALID_VALUE); }
    d.charge(phys, size as u64)?;
    let h = new_handle() as u64;
    lock(&d.objs).vmm.insert(h, Phys { phys, size: size as u64, refs: 1 });
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
    if flags != 0 || size == 0 || offset != 0 { return Err(INVALID_VALUE); }
    let inside = matches!(objs.reservations.range(..=ptr).next_back(), Some((&s, &l)) if ptr + size <= s + l);
    let phys_size = objs.vmm.get(&h).map(|p| p.size).ok_or(INVALID_HANDLE)?;
    if !inside || size > phys_size { return Err(INVALID_VALUE); }
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
}
