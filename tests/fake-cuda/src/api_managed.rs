//! Where managed memory lives: `cuMemAdvise[_v2]` and `cuMemPrefetchAsync[_v2][_ptsz]` move an
//! allocation's residency between the host and its device, and so the device's used memory (what
//! `cuMemGetInfo` and NVML report), as the real driver's migrations do. Residency is counted per
//! allocation (`Alloc::charged`, the bytes on the device), not per page: moving `count` bytes in adds
//! at most what is not yet resident, moving them out takes at most what is.

use crate::driver::*;
use crate::mem::Kind;
use crate::types::*;
use std::ffi::{c_int, c_uint};

/// `CUmemLocation`, by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemLocation {
    kind: c_int,
    id: c_int,
}

/// Where a request puts memory: on its device, on the host, or nowhere valid.
#[derive(Clone, Copy, PartialEq)]
enum Place {
    Device,
    Host,
}

fn ordinal_place(dev: CUdevice) -> Result<Place, CUresult> {
    match dev {
        -1 => Ok(Place::Host),
        d if d >= 0 => Ok(Place::Device),
        _ => Err(INVALID_DEVICE),
    }
}

fn location_place(loc: MemLocation) -> Result<Place, CUresult> {
    match loc.kind {
        1 => ordinal_place(loc.id.max(0)),
        2..=4 => Ok(Place::Host),
        _ => Err(INVALID_VALUE),
    }
}

/// Moves `count` bytes of the managed allocation holding `p` to `place` (a device: the allocation's
/// own, charged to it; `CUDA_ERROR_OUT_OF_MEMORY` when the device has no room).
fn migrate(p: u64, count: usize, place: Place) -> R {
    let d = drv()?;
    let mut mem = lock(&d.mem);
    let (_, a) = mem.find(p, count.max(1) as u64).ok_or(INVALID_VALUE)?;
    if a.kind != Kind::Managed {
        return Err(INVALID_VALUE);
    }
    let (phys, size, on_dev) = (a.phys, a.size, a.charged);
    match place {
        Place::Device => {
            let add = (count as u64).min(size - on_dev);
            drop(mem);
            d.charge(phys, add)?;
            let mut mem = lock(&d.mem);
            match mem.find(p, 1) {
                Some((_, a)) => {
                    a.charged += add;
                    crate::paging::migrated(&d.shared, phys, add, true);
                }
                None => d.refund(phys, add), // freed meanwhile
            }
        }
        Place::Host => {
            let sub = (count as u64).min(on_dev);
            a.charged -= sub;
            drop(mem);
            crate::paging::migrated(&d.shared, phys, sub, false);
            d.refund(phys, sub);
        }
    }
    Ok(())
}

/// Advice: a preferred location moves the pages there (the real driver moves them as they are next
/// touched; nothing touches memory here); every other advice is checked and accepted.
fn advise(p: u64, count: usize, advice: c_int, place: Result<Place, CUresult>) -> R {
    if !(1..=6).contains(&advice) {
        return Err(INVALID_VALUE);
    }
    if advice == 3 {
        return migrate(p, count, place?);
    }
    migrate_none(p, count)
}

/// Checks that `p` is managed memory, moving nothing.
fn migrate_none(p: u64, count: usize) -> R {
    let d = drv()?;
    let mut mem = lock(&d.mem);
    let (_, a) = mem.find(p, count.max(1) as u64).ok_or(INVALID_VALUE)?;
    if a.kind != Kind::Managed {
        return Err(INVALID_VALUE);
    }
    Ok(())
}

cu_fn! {
fn cuMemAdvise(p: u64, count: usize, advice: c_int, dev: CUdevice) {
    advise(p, count, advice, ordinal_place(dev))
}

fn cuMemAdvise_v2(p: u64, count: usize, advice: c_int, loc: MemLocation) {
    advise(p, count, advice, location_place(loc))
}

fn cuMemPrefetchAsync(p: u64, count: usize, dev: CUdevice, _s: Handle) {
    migrate(p, count, ordinal_place(dev)?)
}

fn cuMemPrefetchAsync_v2(p: u64, count: usize, loc: MemLocation, _flags: c_uint, _s: Handle) {
    migrate(p, count, location_place(loc)?)
}
}

cu_alias! {
cuMemPrefetchAsync_ptsz => cuMemPrefetchAsync(p: u64, count: usize, dev: CUdevice, s: Handle);
cuMemPrefetchAsync_v2_ptsz => cuMemPrefetchAsync_v2(p: u64, count: usize, loc: MemLocation, flags: c_uint, s: Handle);
}
