//! Stream-ordered allocation: `cuMemAllocAsync`, pools, and their reservation model.
//!
//! A pool takes device memory in [`POOL_CHUNK`] steps as its allocations grow; freed memory stays
//! reserved (charged to the process) until a stream or context synchronisation releases what
//! exceeds the release threshold, or `cuMemPoolTrimTo` releases it. That is what a quota has to
//! follow: the reservation, not the allocation.

use crate::driver::*;
use crate::mem::Kind;
use crate::types::*;
use std::ffi::{c_int, c_void};

#[repr(C)]
pub struct PoolProps {
    alloc_type: c_int,
    handle_types: c_int,
    loc_type: c_int,
    loc_id: c_int,
    win32: *mut c_void,
    max_size: usize,
    usage: u16,
    reserved: [u8; 54],
}

const ATTR_RELEASE_THRESHOLD: c_int = 4;
const ATTR_RESERVED_MEM_CURRENT: c_int = 5;
const ATTR_RESERVED_MEM_HIGH: c_int = 6;
const ATTR_USED_MEM_CURRENT: c_int = 7;
const ATTR_USED_MEM_HIGH: c_int = 8;

fn new_pool(objs: &mut Objs, phys: usize) -> Handle {
    let h = new_handle();
    objs.pools.insert(
        h,
        Pool {
            phys,
            reserved: 0,
            used: 0,
            reserved_high: 0,
            used_high: 0,
            threshold: 0,
            shareable: false,
        },
    );
    h
}

/// The device's default pool, made on first use.
fn default_pool(objs: &mut Objs, phys: usize) -> Handle {
    if objs.default_pool[phys] == 0 {
        let h = new_pool(objs, phys);
        objs.default_pool[phys] = h;
    }
    objs.default_pool[phys]
}

fn current_pool(objs: &mut Objs, phys: usize) -> Handle {
    if objs.current_pool[phys] == 0 || !objs.pools.contains_key(&objs.current_pool[phys]) {
        objs.current_pool[phys] = default_pool(objs, phys);
    }
    objs.current_pool[phys]
}

/// Shrinks a pool's reservation to `keep` (never below what its allocations use), refunding.
fn shrink(d: &Driver, pool: &mut Pool, keep: u64) {
    let target =
        round_up(pool.used, POOL_CHUNK).max(round_up(keep.min(u64::MAX - POOL_CHUNK), POOL_CHUNK));
    if pool.reserved > target {
        d.refund(pool.phys, pool.reserved - target);
        pool.reserved = target;
    }
}

/// At a synchronisation: every pool of the device gives back what exceeds its release threshold.
pub fn release_pools(d: &Driver, objs: &mut Objs, phys: usize) {
    for pool in objs.pools.values_mut().filter(|p| p.phys == phys) {
        let keep = pool.threshold;
        shrink(d, pool, keep);
    }
}

fn alloc_from(d: &Driver, objs: &mut Objs, pool_h: Handle, size: u64) -> Result<u64, CUresult> {
    if size == 0 {
        return Err(INVALID_VALUE);
    }
    let top = stack_top();
    let ctx = if objs.ctxs.contains_key(&top) { top } else { 0 };
    let pool = objs.pools.get_mut(&pool_h).ok_or(INVALID_VALUE)?;
    let need = pool.used + size;
    let mut grew = 0;
    if need > pool.reserved {
        grew = round_up(need - pool.reserved, POOL_CHUNK);
        d.charge(pool.phys, grew)?;
        pool.reserved += grew;
    }
    let phys = pool.phys;
    let Some(addr) =
        lock(&d.mem).alloc(phys, d.shared.total(phys), size, Kind::Pool, ctx, 0, pool_h)
    else {
        pool.reserved -= grew;
        d.refund(phys, grew);
        return Err(OUT_OF_MEMORY);
    };
    pool.used = need;
    pool.used_high = pool.used_high.max(pool.used);
    pool.reserved_high = pool.reserved_high.max(pool.reserved);
    Ok(addr)
}

/// Frees a pool allocation: it stops being used; its memory stays reserved.
/// The last allocation of a destroyed pool takes the pool's whole reservation with it.
pub fn pool_free(d: &Driver, objs: &mut Objs, p: u64) -> R {
    let a = lock(&d.mem).release(p).ok_or(INVALID_VALUE)?;
    // An exported pointer (`api_ipc`): another process may map it; kept used until this process ends.
    if objs.ipc.remove(&p) {
        return Ok(());
    }
    if let Some(pool) = objs.pools.get_mut(&a.pool) {
        pool.used -= a.size.min(pool.used);
    } else if let Some(pool) = objs.dead_pools.get_mut(&a.pool) {
        pool.used -= a.size.min(pool.used);
        if pool.used == 0 {
            let (phys, reserved) = (pool.phys, pool.reserved);
            objs.dead_pools.remove(&a.pool);
            d.refund(phys, reserved);
        }
    }
    Ok(())
}

cu_fn! {
fn cuMemAllocAsync(dptr: *mut u64, size: usize, stream: Handle) {
    let d = drv()?;
    if dptr.is_null() { return Err(INVALID_VALUE); }
    let mut objs = lock(&d.objs);
    let phys = stream_phys(d, &objs, stream)?;
    let pool = current_pool(&mut objs, phys);
    out(dptr, alloc_from(d, &mut objs, pool, size as u64)?)
}

fn cuMemAllocFromPoolAsync(dptr: *mut u64, size: usize, pool: Handle, stream: Handle) {
    let d = drv()?;
    if dptr.is_null() { return Err(INVALID_VALUE); }
    let mut objs = lock(&d.objs);
    stream_phys(d, &objs, stream)?;
    out(dptr, alloc_from(d, &mut objs, pool, size as u64)?)
}

fn cuMemPoolCreate(pool: *mut Handle, props: *const PoolProps) {
    let d = drv()?;
    if pool.is_null() || props.is_null() { return Err(INVALID_VALUE); }
    let p = &*props;
    if p.alloc_type != 1 || p.loc_type != 1 { return Err(INVALID_VALUE); }
    let phys = d.phys(p.loc_id).map_err(|_| INVALID_VALUE)?;
    let mut objs = lock(&d.objs);
    let h = new_pool(&mut objs, phys);
    if let Some(pool) = objs.pools.get_mut(&h) {
        pool.shareable = p.handle_types & 1 != 0;
    }
    drop(objs);
    out(pool, h)
}

fn cuMemPoolDestroy(pool: Handle) {
    let d = drv()?;
    let mut objs = lock(&d.objs);
    if objs.default_pool.contains(&pool) { return Err(INVALID_VALUE); }
    let p = objs.pools.remove(&pool).ok_or(INVALID_VALUE)?;
    for c in objs.current_pool.iter_mut().filter(|c| **c == pool) { *c = 0; }
    if p.used > 0 {
        // Live allocations stay valid: the memory goes when the last of them is freed.
        objs.dead_pools.insert(pool, p);
    } else {
        d.refund(p.phys, p.reserved);
    }
    Ok(())
}

fn cuDeviceGetDefaultMemPool(pool: *mut Handle, dev: CUdevice) {
    let d = drv()?;
    let phys = d.phys(dev)?;
    let h = default_pool(&mut lock(&d.objs), phys);
    out(pool, h)
}

fn cuDeviceGetMemPool(pool: *mut Handle, dev: CUdevice) {
    let d = drv()?;
    let phys = d.phys(dev)?;
    let h = current_pool(&mut lock(&d.objs), phys);
    out(pool, h)
}

fn cuDeviceSetMemPool(dev: CUdevice, pool: Handle) {
    let d = drv()?;
    let phys = d.phys(dev)?;
    let mut objs = lock(&d.objs);
    if objs.pools.get(&pool).map(|p| p.phys) != Some(phys) { return Err(INVALID_VALUE); }
    objs.current_pool[phys] = pool;
    Ok(())
}

fn cuMemPoolTrimTo(pool: Handle, keep: usize) {
    let d = drv()?;
    let mut objs = lock(&d.objs);
    let p = objs.pools.get_mut(&pool).ok_or(INVALID_VALUE)?;
    shrink(d, p, keep as u64);
    Ok(())
}

fn cuMemPoolSetAttribute(pool: Handle, attr: c_int, value: *mut c_void) {
    let d = drv()?;
    if value.is_null() { return Err(INVALID_VALUE); }
    let mut objs = lock(&d.objs);
    let p = objs.pools.get_mut(&pool).ok_or(INVALID_VALUE)?;
    match attr {
        1..=3 => Ok(()),
        ATTR_RELEASE_THRESHOLD => { p.threshold = *(value as *const u64); Ok(()) }
        ATTR_RESERVED_MEM_HIGH => { p.reserved_high = p.reserved; Ok(()) }
        ATTR_USED_MEM_HIGH => { p.used_high = p.used; Ok(()) }
        _ => Err(INVALID_VALUE),
    }
}

fn cuMemPoolGetAttribute(pool: Handle, attr: c_int, value: *mut c_void) {
    let d = drv()?;
    if value.is_null() { return Err(INVALID_VALUE); }
    let objs = lock(&d.objs);
    let p = objs.pools.get(&pool).ok_or(INVALID_VALUE)?;
    match attr {
        1..=3 => out(value as *mut c_int, 1),
        ATTR_RELEASE_THRESHOLD => out(value as *mut u64, p.threshold),
        ATTR_RESERVED_MEM_CURRENT => out(value as *mut u64, p.reserved),
        ATTR_RESERVED_MEM_HIGH => out(value as *mut u64, p.reserved_high),
        ATTR_USED_MEM_CURRENT => out(value as *mut u64, p.used),
        ATTR_USED_MEM_HIGH => out(value as *mut u64, p.used_high),
        _ => Err(INVALID_VALUE),
    }
}
}

cu_alias! {
    cuMemAllocAsync_ptsz => cuMemAllocAsync(dptr: *mut u64, size: usize, stream: Handle);
    cuMemAllocFromPoolAsync_ptsz => cuMemAllocFromPoolAsync(dptr: *mut u64, size: usize, pool: Handle, stream: Handle);
}
