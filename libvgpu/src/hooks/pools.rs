//! Stream-ordered allocations and memory pools: `cuMemAllocAsync*`, `cuMemAllocFromPoolAsync*`,
//! `cuMemFreeAsync*`, pool create/destroy/trim, and the synchronisations after which pools are reconciled
//! (the stream and event calls where only the compute share acts are `streams`').
//! Graph memory (also stream-ordered when captured) lives in `graphs`.
//!
//! Scheme: per pool we keep `charged` = max(reservation, live allocations), never below what the driver
//! really holds. An allocation first charges whatever its size adds above `charged` (before the driver
//! call, so the quota is exact), then the pool's RESERVED_MEM_CURRENT is read and any growth beyond it is
//! charged too. A stream-ordered free does not refund at once (the memory stays reserved); at the next
//! synchronisation, trim, cuMemFree or cuMemGetInfo the reservation is read again and the shrink refunded.
//! If the driver's chunked growth does not fit in the quota, the allocation is undone (free, synchronise
//! that stream, trim the pool back) and out-of-memory returned: the charge never exceeds the quota.
//! All ledger operations of one pool happen under that pool's table lock, so they never reorder.
#![allow(clippy::missing_safety_doc)]

use std::sync::atomic::Ordering;

use vgpu_ledger::Kind;

use super::common::{hook, interposer, Interposer, Target};
use crate::driver::{Driver, Place};
use crate::error::Error;
use crate::ffi::*;
use crate::quota::DeviceQuota;
use crate::real_symbols::forward;
use crate::records::{self, PoolState, Rec};
use crate::settings::Applies;
pub use shared::*;

impl<D: Driver> Interposer<'_, D> {
    /// Brings a pool's charge to max(reservation, live allocations).
    pub(crate) fn reconcile_pool(&self, pool: u64) {
        if records::is_dead_pool(pool) {
            return self.reconcile_dead_pool(pool);
        }
        let Some(reserved) = self.drv.pool_reserved(pool) else {
            return;
        };
        self.rec.pools.with(pool, |p| {
            let Some(p) = p else { return };
            if !p.device_memory {
                return;
            }
            let Some(q) = self.quota_of(p.dev) else {
                return;
            };
            let want = reserved.max(p.outstanding);
            if want > p.charged {
                q.charge_forced(Kind::AsyncPool, want - p.charged);
            } else {
                q.refund(Kind::AsyncPool, p.charged - want);
            }
            p.charged = want;
        });
    }

    /// Reconciles every pool if a stream-ordered free happened since the last time. The flag stays set
    /// while a pool still reserves more than its live allocations: a free may still be pending on its
    /// stream (the driver shrinks the reservation when the stream reaches it), so a `cuMemGetInfo` before
    /// that must not clear it for the synchronisation after (which once left a freed 32 MiB chunk
    /// charged for good).
    pub(crate) fn reconcile_dirty_pools(&self) {
        // A plain load first: cuMemGetInfo and synchronisations call this often, a write would bounce the line.
        let dirty = &self.rec.pools_dirty;
        if dirty.load(Ordering::Relaxed) && dirty.swap(false, Ordering::AcqRel) {
            let mut holding = false;
            for pool in self.rec.pools.keys() {
                self.reconcile_pool(pool);
                holding |= self.rec.pools.with(pool, |p| {
                    p.is_some_and(|p| p.device_memory && p.charged > p.outstanding)
                });
            }
            if holding {
                dirty.store(true, Ordering::Release);
            }
        }
    }

    /// Before a refusal on `q`: every pool of the process is reconciled (a synchronisation no hook saw
    /// may have released memory), then the pools charged to `q` that hold freed memory are trimmed to
    /// their live allocations and reconciled again; if frees are still pending on their streams (the
    /// driver keeps memory freed on a stream until the stream reaches the free), the current context is
    /// synchronised and they are trimmed once more. Driver calls only, no lock of ours held. `except`: a
    /// pool whose driver-made growth is being decided (its reservation is not to be forced in).
    pub(crate) fn reclaim_pools(&self, q: &DeviceQuota, except: u64) {
        let mut pools = self.rec.pools.keys();
        pools.retain(|&p| p != except);
        for &pool in &pools {
            self.reconcile_pool(pool);
        }
        for round in 0..2 {
            let freed = self.freed_pools(q, &pools);
            if freed.is_empty() {
                return;
            }
            if round == 1 {
                self.drv.ctx_synchronize();
            }
            for (pool, keep) in freed {
                self.drv.pool_trim(pool, keep);
                self.reconcile_pool(pool);
            }
        }
    }

    /// Of `pools`, those charged to `q` that hold freed memory, with what stays live in each.
    fn freed_pools(&self, q: &DeviceQuota, pools: &[u64]) -> Vec<(u64, u64)> {
        pools
            .iter()
            // the driver trims a destroyed pool itself as its allocations go
            .filter(|&&p| !records::is_dead_pool(p))
            .filter_map(|&pool| {
                let freed = self.rec.pools.with(pool, |p| {
                    p.filter(|p| p.device_memory && p.charged > p.outstanding)
                        .map(|p| (p.dev, p.outstanding))
                });
                let (dev, keep) = freed?;
                self.quota_of(dev)
                    .is_some_and(|pq| std::ptr::eq(pq, q))
                    .then_some((pool, keep))
            })
            .collect()
    }

    /// An allocation of `bytes` from `pool` of `dev` on `stream`. `ptsz`: it came through a
    /// per-thread-default-stream entry point (undo it the same way).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn pool_alloc(
        &self,
        dptr: *mut CUdeviceptr,
        bytes: u64,
        pool: u64,
        dev: CUdevice,
        stream: usize,
        ptsz: bool,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        if dptr.is_null() {
            return call();
        }
        let q = match self.target(Some(dev)) {
            Target::Charge(q) => q,
            Target::Forward => return call(),
            Target::Fail(e) => return e.cuda(),
        };
        let pools = &self.rec.pools;
        // Charge what this allocation adds above the pool's current charge, before the driver call. A
        // refusal first reclaims what the process's pools hold freed (outside this pool's lock).
        let precharge = |last: bool| {
            pools.update(
                pool,
                || PoolState::new(dev, true),
                |p| {
                    if !p.device_memory {
                        return None;
                    }
                    let need = (p.outstanding + bytes).saturating_sub(p.charged);
                    if !charge_or_try(q, need, last) {
                        return Some(false);
                    }
                    p.charged += need;
                    p.outstanding += bytes;
                    Some(true)
                },
            )
        };
        let mut charged = precharge(false);
        if charged == Some(false) {
            self.reclaim_pools(q, 0);
            charged = precharge(true);
        }
        match charged {
            None => return call(),
            Some(false) => return Error::OutOfMemory.cuda(),
            Some(true) => {}
        }
        let r = call();
        if r != CUDA_SUCCESS {
            pools.with(pool, |p| {
                if let Some(p) = p {
                    p.outstanding = p.outstanding.saturating_sub(bytes);
                }
            });
            self.reconcile_pool(pool);
            return r;
        }
        // SAFETY: non-null, written by the driver.
        let ptr = unsafe { *dptr };
        // The driver may have grown the reservation by more than the allocation (it reserves in chunks).
        // Charge the growth within the quota; if it does not fit, give the allocation back, trim the pool
        // and report out of memory, so the quota is never exceeded.
        let grow = |last: bool| match self.drv.pool_reserved(pool) {
            Some(reserved) => pools.update(
                pool,
                || PoolState::new(dev, true),
                |p| {
                    let want = reserved.max(p.outstanding);
                    if want <= p.charged {
                        return true;
                    }
                    if !charge_or_try(q, want - p.charged, last) {
                        return false;
                    }
                    p.charged = want;
                    true
                },
            ),
            None => true,
        };
        let mut fits = grow(false);
        if !fits {
            self.reclaim_pools(q, pool);
            fits = grow(true);
        }
        if !fits {
            self.drv.free_async_and_sync(ptr, stream, ptsz);
            let keep = pools.update(
                pool,
                || PoolState::new(dev, true),
                |p| {
                    p.outstanding = p.outstanding.saturating_sub(bytes);
                    p.outstanding
                },
            );
            self.drv.pool_trim(pool, keep);
            self.reconcile_pool(pool);
            return Error::OutOfMemory.cuda();
        }
        let rec = Rec {
            pool,
            ..Rec::new(dev, Kind::AsyncPool, bytes, self.drv.ctx_current())
        };
        self.rec.allocs.insert(ptr, rec);
        r
    }

    /// Whether a stream-ordered allocation on `stream` is charged here: not without a limit, nor on a
    /// stream being captured into a graph (it becomes graph memory, charged when the graph runs).
    fn stream_alloc_charged(&self, stream: usize, ptsz: bool) -> Result<bool, Error> {
        match self.drv.applies() {
            Applies::Nowhere => Ok(false),
            Applies::Broken => Err(Error::Refused),
            Applies::Somewhere => Ok(!self.drv.capturing(stream, ptsz)),
        }
    }

    /// cuMemAllocAsync: from the current pool of the stream's device.
    pub(crate) fn alloc_async(
        &self,
        dptr: *mut CUdeviceptr,
        bytes: u64,
        stream: usize,
        ptsz: bool,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        match self.stream_alloc_charged(stream, ptsz) {
            Ok(true) => {}
            Ok(false) => return call(),
            Err(e) => return e.cuda(),
        }
        // The stream's device, which need not be the current context's.
        let Some(dev) = self
            .drv
            .stream_device(stream, ptsz)
            .or_else(|| self.current_device())
        else {
            return self.unresolved("a stream", stream as u64);
        };
        let Some(pool) = self.drv.device_pool(dev) else {
            return self.unresolved("the current pool of a device", dev as u64);
        };
        self.pool_alloc(dptr, bytes, pool, dev, stream, ptsz, call)
    }

    /// cuMemAllocFromPoolAsync: from an explicit pool (its device known from its creation).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn alloc_from_pool(
        &self,
        dptr: *mut CUdeviceptr,
        bytes: u64,
        pool: u64,
        stream: usize,
        ptsz: bool,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        match self.stream_alloc_charged(stream, ptsz) {
            Ok(true) => {}
            Ok(false) => return call(),
            Err(e) => return e.cuda(),
        }
        let Some(dev) = self.pool_device(pool) else {
            return call(); // host memory
        };
        let Some(dev) = dev else {
            return self.unresolved("a pool", pool);
        };
        self.pool_alloc(dptr, bytes, pool, dev, stream, ptsz, call)
    }

    /// The device of `pool`: Some(None) when it cannot be told, None for host memory. A pool created
    /// under the library is known from its properties; any other (a device's default or current pool,
    /// the host's) is asked of the driver once and remembered.
    fn pool_device(&self, pool: u64) -> Option<Option<CUdevice>> {
        let known = self
            .rec
            .pools
            .with(pool, |p| p.map(|p| (p.dev, p.device_memory)));
        match known {
            Some((dev, true)) => return Some(Some(dev)),
            Some((_, false)) => return None,
            None => {}
        }
        match self.drv.pool_place(pool) {
            Place::Device(dev) => {
                self.rec
                    .pools
                    .update(pool, || PoolState::new(dev, true), |_| ());
                Some(Some(dev))
            }
            Place::Host => {
                self.rec
                    .pools
                    .update(pool, || PoolState::new(0, false), |_| ());
                None
            }
            Place::Unknown => Some(None),
        }
    }

    /// A pool was created: remember its device and whether it holds device memory.
    pub(crate) fn pool_created(&self, pool: u64, location_type: i32, dev: CUdevice) {
        let device_memory = location_type == CU_MEM_LOCATION_TYPE_DEVICE;
        self.rec
            .pools
            .insert(pool, PoolState::new(dev, device_memory));
    }

    /// A pool was destroyed. Without live allocations its charge goes back. With some, the driver keeps
    /// them valid and the pool's memory reserved until the last is freed: the charge stays, under a key
    /// of its own (a new pool may get the same handle at once), and goes back at the first
    /// reconciliation after the last of them is freed.
    pub(crate) fn pool_destroyed(&self, pool: u64) {
        let Some(p) = self.rec.pools.remove(pool) else {
            return;
        };
        if !p.device_memory {
            return;
        }
        if p.outstanding == 0 {
            if let Some(q) = self.quota_of(p.dev) {
                q.refund(Kind::AsyncPool, p.charged);
            }
            return;
        }
        let dead = records::dead_pool_key();
        self.rec.pools.insert(dead, p);
        for (ptr, rec) in self.rec.allocs.drain_where(|r| r.pool == pool) {
            self.rec.allocs.insert(ptr, Rec { pool: dead, ..rec });
        }
    }

    /// A destroyed pool keeps its charge while any of its allocations lives.
    fn reconcile_dead_pool(&self, key: u64) {
        let done = self.rec.pools.with(key, |p| {
            p.filter(|p| p.outstanding == 0).map(|p| (p.dev, p.charged))
        });
        if let Some((dev, charged)) = done {
            if self.rec.pools.remove(key).is_some() {
                if let Some(q) = self.quota_of(dev) {
                    q.refund(Kind::AsyncPool, charged);
                }
            }
        }
    }

    /// After a synchronisation: pools may have released memory, and launches may have grown the stack.
    pub(crate) fn after_sync(&self, r: CUresult) -> CUresult {
        if r == CUDA_SUCCESS {
            self.reconcile_dirty_pools();
            self.reconcile_stack();
            self.reconcile_truth();
        }
        r
    }
}

/// A pool charge inside a pool's lock: the last try logs its refusal, the first leaves it to `reclaim_pools`.
fn charge_or_try(q: &DeviceQuota, bytes: u64, last: bool) -> bool {
    if last {
        q.charge(Kind::AsyncPool, bytes)
    } else {
        q.try_charge(Kind::AsyncPool, bytes) == Some(true)
    }
}

hook!(cuMemAllocAsync(dptr: *mut CUdeviceptr, bytes: usize, s: CUstream) {
    interposer().alloc_async(dptr, bytes as u64, s as usize, false, || forward!("cuMemAllocAsync", fn(*mut CUdeviceptr, usize, CUstream), dptr, bytes, s))
});
hook!(cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytes: usize, s: CUstream) {
    interposer().alloc_async(dptr, bytes as u64, s as usize, true, || forward!("cuMemAllocAsync_ptsz", fn(*mut CUdeviceptr, usize, CUstream), dptr, bytes, s))
});
hook!(cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytes: usize, pool: CUmemoryPool, s: CUstream) {
    interposer().alloc_from_pool(dptr, bytes as u64, pool as u64, s as usize, false, || forward!("cuMemAllocFromPoolAsync", fn(*mut CUdeviceptr, usize, CUmemoryPool, CUstream), dptr, bytes, pool, s))
});
hook!(cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, bytes: usize, pool: CUmemoryPool, s: CUstream) {
    interposer().alloc_from_pool(dptr, bytes as u64, pool as u64, s as usize, true, || forward!("cuMemAllocFromPoolAsync_ptsz", fn(*mut CUdeviceptr, usize, CUmemoryPool, CUstream), dptr, bytes, pool, s))
});
hook!(cuMemFreeAsync(p: CUdeviceptr, s: CUstream) {
    let e = interposer();
    e.tracked_free(&e.rec.allocs, p, || forward!("cuMemFreeAsync", fn(CUdeviceptr, CUstream), p, s))
});
hook!(cuMemFreeAsync_ptsz(p: CUdeviceptr, s: CUstream) {
    let e = interposer();
    e.tracked_free(&e.rec.allocs, p, || forward!("cuMemFreeAsync_ptsz", fn(CUdeviceptr, CUstream), p, s))
});

hook!(cuMemPoolCreate(pool: *mut CUmemoryPool, props: *const CUmemAllocationPropHead) {
    let r = forward!("cuMemPoolCreate", fn(*mut CUmemoryPool, *const CUmemAllocationPropHead), pool, props);
    let e = interposer();
    if r == CUDA_SUCCESS && !pool.is_null() && !props.is_null() && !e.drv.unlimited() {
        // SAFETY: both non-null; the driver accepted the props and wrote the pool.
        let (p, props) = unsafe { (*pool as u64, &*props) };
        e.pool_created(p, props.location_type, props.location_id);
    }
    r
});

hook!(cuMemPoolDestroy(pool: CUmemoryPool) {
    let r = forward!("cuMemPoolDestroy", fn(CUmemoryPool), pool);
    if r == CUDA_SUCCESS {
        interposer().pool_destroyed(pool as u64);
    }
    r
});

hook!(cuMemPoolTrimTo(pool: CUmemoryPool, keep: usize) {
    let r = forward!("cuMemPoolTrimTo", fn(CUmemoryPool, usize), pool, keep);
    if r == CUDA_SUCCESS { interposer().reconcile_pool(pool as u64); }
    r
});

// After a synchronisation the compute share retires what finished (`compute::sync::synchronized`); one that
// waited for the newest launch dates its span's end (`compute::sync::syncing`).
hook!(cuStreamSynchronize(s: CUstream) { crate::compute::sync::synchronized(crate::compute::sync::syncing(crate::compute::sync::Synced::Stream(s)), interposer().after_sync(forward!("cuStreamSynchronize", fn(CUstream), s))) });
hook!(cuStreamSynchronize_ptsz(s: CUstream) { crate::compute::sync::synchronized(crate::compute::sync::syncing(crate::compute::sync::Synced::Stream(crate::streams::named(s, true))), interposer().after_sync(forward!("cuStreamSynchronize_ptsz", fn(CUstream), s))) });
hook!(cuCtxSynchronize() { crate::compute::sync::synchronized(crate::compute::sync::syncing(crate::compute::sync::Synced::Context(std::ptr::null_mut())), interposer().after_sync(forward!("cuCtxSynchronize", fn()))) });
// CUDA 13's cudaDeviceSynchronize: a context named (NULL: the current one).
hook!(cuCtxSynchronize_v2(ctx: CUcontext) { crate::compute::sync::synchronized(crate::compute::sync::syncing(crate::compute::sync::Synced::Context(ctx)), interposer().after_sync(forward!("cuCtxSynchronize_v2", fn(CUcontext), ctx))) });
hook!(cuEventSynchronize(ev: CUevent) { crate::compute::sync::synchronized(crate::compute::sync::syncing(crate::compute::sync::Synced::Other), interposer().after_sync(forward!("cuEventSynchronize", fn(CUevent), ev))) });

mod shared;

#[cfg(test)]
mod placed_tests;
#[cfg(test)]
mod tests;
