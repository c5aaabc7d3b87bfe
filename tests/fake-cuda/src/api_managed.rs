//! Where managed memory lives: `cuMemAdvise[_v2]` and `cuMemPrefetchAsync[_v2][_ptsz]` move an
//! allocation's residency between the host and its device, and so the device's used memory (what
//! `cuMemGetInfo` and NVML report), as the real driver's migrations do. Residency is counted per
//! allocation (`Alloc::charged`, the bytes on the device), not per page: moving `count` bytes in adds
//! at most what is not yet resident, moving them out takes at most what is. With
//! `FAKE_CUDA_MANAGED_FAULTS=1` a kernel on another device faults the process's managed memory in there
//! (`fault_in`; `Alloc::away`), as a real kernel's first touch does.

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
/// touched; nothing touches memory here); read-mostly is remembered (`fault_in` copies such pages);
/// every other advice is checked and accepted.
fn advise(p: u64, count: usize, advice: c_int, place: Result<Place, CUresult>) -> R {
    if !(1..=6).contains(&advice) {
        return Err(INVALID_VALUE);
    }
    if advice == 3 {
        return migrate(p, count, place?);
    }
    migrate_none(p, count)?;
    if advice == 1 || advice == 2 {
        let d = drv()?;
        if let Some((_, a)) = lock(&d.mem).find(p, count.max(1) as u64) {
            a.read_mostly = advice == 1;
        }
    }
    Ok(())
}

/// A kernel launched on physical device `phys` (`FAKE_CUDA_MANAGED_FAULTS=1`) touches every managed
/// allocation of the process, as a real kernel may: pages not on `phys` are faulted in there, `size`
/// bytes charged to `phys` (skipped when it has no room: the real driver would evict). Read-mostly
/// memory is copied (it stays where it was too); other memory moves (its own device and every other
/// device holding it give their bytes back). A kernel on its own device brings moved memory home.
pub fn fault_in(d: &Driver, phys: usize) {
    let bit = 1u64 << phys;
    let mut mem = lock(&d.mem);
    for a in mem.allocs.values_mut().filter(|a| a.kind == Kind::Managed) {
        if phys == a.phys {
            if a.read_mostly || a.away == 0 {
                continue;
            }
            d.refund_away(a);
            a.away = 0;
            let add = a.size - a.charged;
            if d.charge(phys, add).is_ok() {
                a.charged += add;
                crate::paging::migrated(&d.shared, phys, add, true);
            }
        } else if a.away & bit == 0 && d.charge(phys, a.size).is_ok() {
            if !a.read_mostly {
                d.refund_away(a);
                a.away = 0;
                let home = std::mem::take(&mut a.charged);
                crate::paging::migrated(&d.shared, a.phys, home, false);
                d.refund(a.phys, home);
            }
            a.away |= bit;
        }
    }
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
