//! The driver API hooks: charge before the driver call, refund when it fails or when the memory is freed;
//! virtualise the memory queries. Every exported function forwards untouched when no limit applies.
#![allow(clippy::missing_safety_doc)]

use std::cell::Cell;
use std::ffi::{c_char, c_uint, c_void};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use vgpu_ledger::Kind;

use crate::ffi::*;
use crate::lifecycle::{exiting, guard};
use crate::quota::{self, DeviceQuota};
use crate::real::{real, Lib};
use crate::track::Table;
use crate::{log, nvml, virt};

/// Calls the real driver function `$name` with the caller's arguments unchanged.
macro_rules! forward {
    ($name:literal, fn($($t:ty),*) $(, $a:expr)*) => {
        match real!(Lib::Cuda, $name, unsafe extern "C" fn($($t),*) -> CUresult) {
            // SAFETY: the caller's arguments go unchanged to the driver's own function of the same C type.
            Some(f) => unsafe { f($($a),*) },
            None => CUDA_ERROR_NOT_FOUND,
        }
    };
}

/// Exports a hook under `$name`, run under `guard` (a panic returns CUDA_ERROR_UNKNOWN).
macro_rules! hook {
    ($name:ident($($a:ident: $t:ty),*) $body:block) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> CUresult {
            guard(CUDA_ERROR_UNKNOWN, || $body)
        }
    };
}

/// What one tracked allocation charged.
#[derive(Clone, Copy, Debug)]
pub struct Rec {
    pub dev: CUdevice,
    pub kind: Kind,
    pub bytes: u64,
    /// The context it lives in (0 when not bound to one): freed with it.
    pub ctx: usize,
    /// The stream-ordered pool it came from (0 otherwise).
    pub pool: u64,
}

static ALLOCS: Table<Rec> = Table::new(); // device pointers: plain, pitch, managed, async
static ARRAYS: Table<Rec> = Table::new(); // CUarray and CUmipmappedArray
static VMM: Table<Rec> = Table::new(); // cuMemCreate handles
static MODULES: Table<Rec> = Table::new();
static CONTEXTS: Table<Rec> = Table::new(); // cuCtxCreate contexts and primary contexts (key: ctx)
static PRIMARY: Table<u32> = Table::new(); // primary context retain count per device
static POOLS: Table<PoolState> = Table::new();
static GRAPH_DEV: Table<u64> = Table::new(); // graph memory charged per device
static GRAPH_EXECS: Table<(CUdevice, u64)> = Table::new(); // exec -> (device, bytes its alloc nodes need)
static GRAPH_NEEDS: Table<u64> = Table::new(); // graph -> bytes of the alloc nodes added to it
/// A stream-ordered free happened: pool reservations may shrink at the next synchronisation.
static POOLS_DIRTY: AtomicBool = AtomicBool::new(false);

#[derive(Clone, Copy, Debug)]
pub struct PoolState {
    dev: CUdevice,
    /// Bytes charged to the ledger for this pool: never below its reservation or its live allocations.
    charged: u64,
    /// Live allocations from this pool.
    outstanding: u64,
    /// A pool of host memory is nobody's device quota.
    device_memory: bool,
}

const ALL_TABLES: [&Table<Rec>; 5] = [&ALLOCS, &ARRAYS, &VMM, &MODULES, &CONTEXTS];

pub(crate) fn lock_tables() {
    ALL_TABLES.iter().for_each(|t| t.lock_all());
    PRIMARY.lock_all();
    POOLS.lock_all();
    GRAPH_DEV.lock_all();
    GRAPH_EXECS.lock_all();
    GRAPH_NEEDS.lock_all();
}
pub(crate) fn unlock_tables() {
    ALL_TABLES.iter().for_each(|t| t.unlock_all());
    PRIMARY.unlock_all();
    POOLS.unlock_all();
    GRAPH_DEV.unlock_all();
    GRAPH_EXECS.unlock_all();
    GRAPH_NEEDS.unlock_all();
}
pub(crate) fn clear_tables() {
    CTX_GENERATION.fetch_add(1, Ordering::AcqRel); // the parent's contexts mean nothing in the child
    ALL_TABLES.iter().for_each(|t| t.clear());
    PRIMARY.clear();
    POOLS.clear();
    GRAPH_DEV.clear();
    GRAPH_EXECS.clear();
    GRAPH_NEEDS.clear();
}

// ---- helpers -------------------------------------------------------------------------------------------

fn current_ctx() -> usize {
    let mut c: CUcontext = std::ptr::null_mut();
    forward!("cuCtxGetCurrent", fn(*mut CUcontext), &mut c);
    c as usize
}

/// Bumped whenever a context goes away: a handle may then be reused for another device.
static CTX_GENERATION: AtomicU32 = AtomicU32::new(0);

thread_local! {
    /// (context, its device, generation): the device of this thread's current context, remembered so an
    /// allocation costs one driver query (cuCtxGetCurrent), not two.
    static CTX_DEVICE: Cell<(usize, CUdevice, u32)> = const { Cell::new((0, 0, u32::MAX)) };
}

/// The current context and its device.
fn current() -> Option<(CUdevice, usize)> {
    let ctx = current_ctx();
    if ctx == 0 {
        return None;
    }
    let generation = CTX_GENERATION.load(Ordering::Acquire);
    let (c, d, g) = CTX_DEVICE.with(|v| v.get());
    if c == ctx && g == generation {
        return Some((d, ctx));
    }
    let mut d: CUdevice = 0;
    if forward!("cuCtxGetDevice", fn(*mut CUdevice), &mut d) != CUDA_SUCCESS {
        return None;
    }
    CTX_DEVICE.with(|v| v.set((ctx, d, generation)));
    Some((d, ctx))
}

fn current_device() -> Option<CUdevice> {
    current().map(|(d, _)| d)
}

/// The quota to charge for `dev`, or how the call must end without one.
enum Target {
    Charge(&'static DeviceQuota),
    Forward,
    Fail(CUresult),
}

fn target(dev: Option<CUdevice>) -> Target {
    if exiting() {
        return Target::Forward;
    }
    let Some(dev) = dev else {
        return Target::Forward;
    };
    match quota::for_device(dev) {
        Ok(Some(q)) => Target::Charge(q),
        Ok(None) => Target::Forward,
        Err(e) => Target::Fail(e),
    }
}

/// Target for the device of the current context (allocations in it): (target, device, context).
fn target_current() -> (Target, CUdevice, usize) {
    match quota::config() {
        Err(()) => return (Target::Fail(CUDA_ERROR_NOT_INITIALIZED), 0, 0),
        Ok(c) if c.is_unlimited() => return (Target::Forward, 0, 0),
        Ok(_) => {}
    }
    match current() {
        Some((dev, ctx)) => (target(Some(dev)), dev, ctx),
        None => (Target::Forward, 0, 0),
    }
}

fn refund_rec(r: &Rec) {
    if let Target::Charge(q) = target(Some(r.dev)) {
        q.refund(r.kind, r.bytes);
    }
}

/// The common shape of an allocation: charge `bytes`, call the driver, refund if it fails, record `key()`.
fn charged_call(
    table: &Table<Rec>,
    kind: Kind,
    bytes: u64,
    tgt: (Target, CUdevice, usize),
    call: impl FnOnce() -> CUresult,
    key: impl FnOnce() -> u64,
) -> CUresult {
    let (q, dev, ctx) = match tgt {
        (Target::Forward, ..) => return call(),
        (Target::Fail(e), ..) => return e,
        (Target::Charge(q), dev, ctx) => (q, dev, ctx),
    };
    if !q.charge(kind, bytes) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    let r = call();
    if r != CUDA_SUCCESS {
        q.refund(kind, bytes);
        return r;
    }
    table.insert(
        key(),
        Rec {
            dev,
            kind,
            bytes,
            ctx,
            pool: 0,
        },
    );
    r
}

/// Frees `key` with `call`; refunds what was recorded for it. Untracked keys pass straight through.
fn tracked_free(table: &Table<Rec>, key: u64, call: impl FnOnce() -> CUresult) -> CUresult {
    if quota::unlimited() {
        return call(); // nothing is ever recorded without a limit
    }
    let Some(rec) = table.remove(key) else {
        return call();
    };
    let r = call();
    if r != CUDA_SUCCESS {
        table.insert(key, rec);
        return r;
    }
    if rec.pool != 0 {
        pool_released(rec.pool, rec.bytes);
    } else {
        refund_rec(&rec);
    }
    r
}

/// Corrects a charge made from an estimate to the size the driver reports. Returns false when the larger
/// true size does not fit: the caller then frees the object and reports out of memory.
fn true_up(table: &Table<Rec>, key: u64, actual: u64) -> bool {
    let Some(rec) = table.with(key, |r| r.copied()) else {
        return true;
    };
    let Target::Charge(q) = target(Some(rec.dev)) else {
        return true;
    };
    if actual > rec.bytes {
        if !q.charge(rec.kind, actual - rec.bytes) {
            return false;
        }
    } else {
        q.refund(rec.kind, rec.bytes - actual);
    }
    table.with(key, |r| {
        if let Some(r) = r {
            r.bytes = actual
        }
    });
    true
}

// ---- initialisation -----------------------------------------------------------------------------------

hook!(cuInit(flags: c_uint) {
    if quota::config().is_err() {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    let r = forward!("cuInit", fn(c_uint), flags);
    if r != CUDA_SUCCESS || quota::unlimited() {
        return r;
    }
    // A limit that cannot be enforced (unreadable ledger, unknown UUID) fails CUDA's start here.
    quota::resolve_all()
});

// ---- memory queries -----------------------------------------------------------------------------------

fn mem_get_info(
    free: *mut u64,
    total: *mut u64,
    real_call: impl FnOnce(*mut u64, *mut u64) -> CUresult,
) -> CUresult {
    if free.is_null() || total.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let (mut f, mut t) = (0u64, 0u64);
    let r = real_call(&mut f, &mut t);
    if r == CUDA_SUCCESS {
        let (tgt, ..) = target_current();
        if let Target::Charge(q) = &tgt {
            reconcile_dirty_pools();
            (f, t) = virt::mem_info(q.limit, q.used(), f, t);
        }
        if let Target::Fail(e) = tgt {
            return e;
        }
        // SAFETY: both checked non-null above; the caller owns them.
        unsafe {
            *free = f;
            *total = t;
        }
    }
    r
}

hook!(cuMemGetInfo_v2(free: *mut usize, total: *mut usize) {
    mem_get_info(free.cast(), total.cast(), |f, t| forward!("cuMemGetInfo_v2", fn(*mut usize, *mut usize), f.cast(), t.cast()))
});

hook!(cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) {
    if free.is_null() || total.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let (mut f, mut t) = (0u64, 0u64);
    let r = mem_get_info(&mut f, &mut t, |f, t| forward!("cuMemGetInfo_v2", fn(*mut usize, *mut usize), f.cast(), t.cast()));
    if r == CUDA_SUCCESS {
        // SAFETY: checked non-null; the 32-bit API saturates.
        unsafe {
            *free = f.min(u32::MAX as u64) as c_uint;
            *total = t.min(u32::MAX as u64) as c_uint;
        }
    }
    r
});

fn total_mem(bytes: *mut u64, dev: CUdevice) -> CUresult {
    if bytes.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let mut t: usize = 0;
    let r = forward!("cuDeviceTotalMem_v2", fn(*mut usize, CUdevice), &mut t, dev);
    if r != CUDA_SUCCESS {
        return r;
    }
    let mut t = t as u64;
    if !quota::unlimited() {
        match target(Some(dev)) {
            Target::Charge(q) => t = virt::total_mem(q.limit, t),
            Target::Fail(e) => return e,
            Target::Forward => {}
        }
    }
    // SAFETY: checked non-null.
    unsafe { *bytes = t };
    r
}

hook!(cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) { total_mem(bytes.cast(), dev) });

hook!(cuDeviceTotalMem(bytes: *mut c_uint, dev: CUdevice) {
    if bytes.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let mut t = 0u64;
    let r = total_mem(&mut t, dev);
    // SAFETY: checked non-null.
    if r == CUDA_SUCCESS { unsafe { *bytes = t.min(u32::MAX as u64) as c_uint } }
    r
});

// ---- plain, pitch and managed allocations -------------------------------------------------------------

hook!(cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize) {
    if dptr.is_null() {
        return forward!("cuMemAlloc_v2", fn(*mut CUdeviceptr, usize), dptr, bytes);
    }
    charged_call(&ALLOCS, Kind::Data, bytes as u64, target_current(),
        || forward!("cuMemAlloc_v2", fn(*mut CUdeviceptr, usize), dptr, bytes),
        // SAFETY: dptr is non-null and the driver just wrote it.
        || unsafe { *dptr })
});

hook!(cuMemAlloc(dptr: *mut CUdeviceptr_v1, bytes: c_uint) {
    if dptr.is_null() {
        return forward!("cuMemAlloc", fn(*mut CUdeviceptr_v1, c_uint), dptr, bytes);
    }
    charged_call(&ALLOCS, Kind::Data, bytes as u64, target_current(),
        || forward!("cuMemAlloc", fn(*mut CUdeviceptr_v1, c_uint), dptr, bytes),
        // SAFETY: as above.
        || unsafe { *dptr } as u64)
});

hook!(cuMemAllocManaged(dptr: *mut CUdeviceptr, bytes: usize, flags: c_uint) {
    if dptr.is_null() {
        return forward!("cuMemAllocManaged", fn(*mut CUdeviceptr, usize, c_uint), dptr, bytes, flags);
    }
    charged_call(&ALLOCS, Kind::Managed, bytes as u64, target_current(),
        || forward!("cuMemAllocManaged", fn(*mut CUdeviceptr, usize, c_uint), dptr, bytes, flags),
        // SAFETY: as above.
        || unsafe { *dptr })
});

/// `read` returns what the driver wrote to the caller's out-parameters: (pointer, pitch).
fn alloc_pitch(
    w: u64,
    h: u64,
    call: impl FnOnce() -> CUresult,
    read: impl Fn() -> (u64, u64),
    free: impl FnOnce(u64),
) -> CUresult {
    let r = charged_call(
        &ALLOCS,
        Kind::Data,
        virt::pitch_estimate(w, h),
        target_current(),
        call,
        || read().0,
    );
    if r != CUDA_SUCCESS {
        return r;
    }
    let (p, pitch) = read();
    if !true_up(&ALLOCS, p, pitch.saturating_mul(h.max(1))) {
        if let Some(rec) = ALLOCS.remove(p) {
            free(p);
            refund_rec(&rec);
        }
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    r
}

hook!(cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pitch: *mut usize, w: usize, h: usize, elem: c_uint) {
    let call = || forward!("cuMemAllocPitch_v2", fn(*mut CUdeviceptr, *mut usize, usize, usize, c_uint), dptr, pitch, w, h, elem);
    if dptr.is_null() || pitch.is_null() {
        return call();
    }
    alloc_pitch(w as u64, h as u64, call,
        // SAFETY: both non-null; read only after the driver succeeded and wrote them.
        || unsafe { (*dptr, *pitch as u64) },
        |p| { forward!("cuMemFree_v2", fn(CUdeviceptr), p); })
});

hook!(cuMemAllocPitch(dptr: *mut CUdeviceptr_v1, pitch: *mut c_uint, w: c_uint, h: c_uint, elem: c_uint) {
    let call = || forward!("cuMemAllocPitch", fn(*mut CUdeviceptr_v1, *mut c_uint, c_uint, c_uint, c_uint), dptr, pitch, w, h, elem);
    if dptr.is_null() || pitch.is_null() {
        return call();
    }
    alloc_pitch(w as u64, h as u64, call,
        // SAFETY: as above.
        || unsafe { (*dptr as u64, *pitch as u64) },
        |p| { forward!("cuMemFree", fn(CUdeviceptr_v1), p as CUdeviceptr_v1); })
});

hook!(cuMemFree_v2(p: CUdeviceptr) {
    tracked_free(&ALLOCS, p, || forward!("cuMemFree_v2", fn(CUdeviceptr), p))
});

hook!(cuMemFree(p: CUdeviceptr_v1) {
    tracked_free(&ALLOCS, p as u64, || forward!("cuMemFree", fn(CUdeviceptr_v1), p))
});

// ---- arrays ---------------------------------------------------------------------------------------------

/// Arrays are charged an estimate first, then trued up to what cu*GetMemoryRequirements reports.
fn array_create(
    handle: *mut *mut c_void,
    estimate: u64,
    call: impl FnOnce() -> CUresult,
    requirements: impl FnOnce(*mut c_void, CUdevice) -> Option<u64>,
    destroy: impl FnOnce(*mut c_void),
) -> CUresult {
    if handle.is_null() {
        return call();
    }
    let tgt = target_current();
    let dev = tgt.1;
    // For a measurement when the driver cannot state the size (see below).
    let before = match &tgt.0 {
        Target::Charge(q) => Some((device_free(), q.used())),
        _ => None,
    };
    let r = charged_call(
        &ARRAYS,
        Kind::Array,
        estimate,
        tgt,
        call,
        // SAFETY: non-null, written by the driver.
        || unsafe { *handle } as u64,
    );
    if r != CUDA_SUCCESS {
        return r;
    }
    // SAFETY: as above.
    let h = unsafe { *handle };
    // The real driver states an array's size only for deferred-mapping arrays; otherwise the device's
    // free memory before and after tells (net of the ledger's other activity, our estimate included), and
    // the larger of measurement and estimate stays charged.
    let actual = requirements(h, dev).or_else(|| match (before, target(Some(dev))) {
        (Some((Some(b), lb)), Target::Charge(q)) => {
            let a = device_free()?;
            let others = q.used() as i128 - lb as i128 - estimate as i128;
            Some(measured(b as i128 - a as i128, others, MODULE_CEILING).max(estimate))
        }
        _ => None,
    });
    if let Some(actual) = actual {
        if !true_up(&ARRAYS, h as u64, actual) {
            if let Some(rec) = ARRAYS.remove(h as u64) {
                destroy(h);
                refund_rec(&rec);
            }
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    r
}

fn array_requirements(a: *mut c_void, dev: CUdevice) -> Option<u64> {
    let mut req = CUDA_ARRAY_MEMORY_REQUIREMENTS::default();
    (forward!(
        "cuArrayGetMemoryRequirements",
        fn(*mut CUDA_ARRAY_MEMORY_REQUIREMENTS, CUarray, CUdevice),
        &mut req,
        a,
        dev
    ) == CUDA_SUCCESS)
        .then_some(req.size as u64)
}

fn mipmap_requirements(a: *mut c_void, dev: CUdevice) -> Option<u64> {
    let mut req = CUDA_ARRAY_MEMORY_REQUIREMENTS::default();
    (forward!(
        "cuMipmappedArrayGetMemoryRequirements",
        fn(*mut CUDA_ARRAY_MEMORY_REQUIREMENTS, CUmipmappedArray, CUdevice),
        &mut req,
        a,
        dev
    ) == CUDA_SUCCESS)
        .then_some(req.size as u64)
}

fn destroy_array(a: *mut c_void) {
    forward!("cuArrayDestroy", fn(CUarray), a);
}

/// Layers: layered arrays keep them in depth, cubemaps have 6 faces (times layers).
fn layers_depth(depth: u64, flags: c_uint) -> u64 {
    const LAYERED: c_uint = 0x01;
    const CUBEMAP: c_uint = 0x04;
    let d = depth.max(1);
    if flags & CUBEMAP != 0 && flags & LAYERED == 0 {
        6
    } else {
        d
    }
}

/// Sparse and deferred-mapping arrays have no memory of their own until mapped (VMM charges that).
fn unbacked(flags: c_uint) -> bool {
    const SPARSE: c_uint = 0x40;
    const DEFERRED: c_uint = 0x80;
    flags & (SPARSE | DEFERRED) != 0
}

hook!(cuArrayCreate_v2(handle: *mut CUarray, d: *const CUDA_ARRAY_DESCRIPTOR) {
    let call = || forward!("cuArrayCreate_v2", fn(*mut CUarray, *const CUDA_ARRAY_DESCRIPTOR), handle, d);
    if d.is_null() { return call(); }
    // SAFETY: non-null descriptor owned by the caller.
    let d = unsafe { *d };
    array_create(handle, virt::array_estimate(d.width as u64, d.height as u64, 1, d.format, d.num_channels, 1),
        call, array_requirements, destroy_array)
});

hook!(cuArrayCreate(handle: *mut CUarray, d: *const CUDA_ARRAY_DESCRIPTOR_v1) {
    let call = || forward!("cuArrayCreate", fn(*mut CUarray, *const CUDA_ARRAY_DESCRIPTOR_v1), handle, d);
    if d.is_null() { return call(); }
    // SAFETY: as above.
    let d = unsafe { *d };
    array_create(handle, virt::array_estimate(d.width as u64, d.height as u64, 1, d.format, d.num_channels, 1),
        call, array_requirements, destroy_array)
});

hook!(cuArray3DCreate_v2(handle: *mut CUarray, d: *const CUDA_ARRAY3D_DESCRIPTOR) {
    let call = || forward!("cuArray3DCreate_v2", fn(*mut CUarray, *const CUDA_ARRAY3D_DESCRIPTOR), handle, d);
    if d.is_null() { return call(); }
    // SAFETY: as above.
    let d = unsafe { *d };
    if unbacked(d.flags) { return call(); }
    array_create(handle, virt::array_estimate(d.width as u64, d.height as u64, layers_depth(d.depth as u64, d.flags), d.format, d.num_channels, 1),
        call, array_requirements, destroy_array)
});

hook!(cuArray3DCreate(handle: *mut CUarray, d: *const CUDA_ARRAY3D_DESCRIPTOR_v1) {
    let call = || forward!("cuArray3DCreate", fn(*mut CUarray, *const CUDA_ARRAY3D_DESCRIPTOR_v1), handle, d);
    if d.is_null() { return call(); }
    // SAFETY: as above.
    let d = unsafe { *d };
    if unbacked(d.flags) { return call(); }
    array_create(handle, virt::array_estimate(d.width as u64, d.height as u64, layers_depth(d.depth as u64, d.flags), d.format, d.num_channels, 1),
        call, array_requirements, destroy_array)
});

hook!(cuMipmappedArrayCreate(handle: *mut CUmipmappedArray, d: *const CUDA_ARRAY3D_DESCRIPTOR, levels: c_uint) {
    let call = || forward!("cuMipmappedArrayCreate", fn(*mut CUmipmappedArray, *const CUDA_ARRAY3D_DESCRIPTOR, c_uint), handle, d, levels);
    if d.is_null() { return call(); }
    // SAFETY: as above.
    let d = unsafe { *d };
    if unbacked(d.flags) { return call(); }
    array_create(handle, virt::array_estimate(d.width as u64, d.height as u64, layers_depth(d.depth as u64, d.flags), d.format, d.num_channels, levels),
        call, mipmap_requirements, |a| { forward!("cuMipmappedArrayDestroy", fn(CUmipmappedArray), a); })
});

hook!(cuArrayDestroy(a: CUarray) {
    tracked_free(&ARRAYS, a as u64, || forward!("cuArrayDestroy", fn(CUarray), a))
});

hook!(cuMipmappedArrayDestroy(a: CUmipmappedArray) {
    tracked_free(&ARRAYS, a as u64, || forward!("cuMipmappedArrayDestroy", fn(CUmipmappedArray), a))
});

// ---- stream-ordered allocations and pools ----------------------------------------------------------------
//
// Scheme: per pool we keep `charged` = max(reservation, live allocations), never below what the driver
// really holds. An allocation first charges whatever its size adds above `charged` (before the driver
// call, so the quota is exact), then the pool's RESERVED_MEM_CURRENT is read and any growth beyond it is
// charged too. A stream-ordered free does not refund at once (the memory stays reserved); at the next
// synchronisation, trim, cuMemFree or cuMemGetInfo the reservation is read again and the shrink refunded.
// If the driver's chunked growth does not fit in the quota, the allocation is undone (free, synchronise
// that stream, trim the pool back) and out-of-memory returned: the charge never exceeds the quota.
// All ledger operations of one pool happen under that pool's table lock, so they never reorder.

fn pool_reserved(pool: u64) -> Option<u64> {
    let mut v: u64 = 0;
    (forward!(
        "cuMemPoolGetAttribute",
        fn(CUmemoryPool, i32, *mut c_void),
        pool as CUmemoryPool,
        CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
        (&mut v as *mut u64).cast()
    ) == CUDA_SUCCESS)
        .then_some(v)
}

fn new_pool(dev: CUdevice) -> PoolState {
    PoolState {
        dev,
        charged: 0,
        outstanding: 0,
        device_memory: true,
    }
}

/// Brings a pool's charge to max(reservation, live allocations).
fn reconcile_pool(pool: u64) {
    let Some(reserved) = pool_reserved(pool) else {
        return;
    };
    POOLS.with(pool, |p| {
        let Some(p) = p else { return };
        if !p.device_memory {
            return;
        }
        let Target::Charge(q) = target(Some(p.dev)) else {
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

fn reconcile_dirty_pools() {
    // A plain load first: cuMemGetInfo and synchronisations call this often, a write would bounce the line.
    if POOLS_DIRTY.load(Ordering::Relaxed) && POOLS_DIRTY.swap(false, Ordering::AcqRel) {
        for pool in POOLS.keys() {
            reconcile_pool(pool);
        }
    }
}

/// A pool allocation of `bytes` went away (stream-ordered free or cuMemFree).
fn pool_released(pool: u64, bytes: u64) {
    POOLS.with(pool, |p| {
        if let Some(p) = p {
            p.outstanding = p.outstanding.saturating_sub(bytes);
        }
    });
    POOLS_DIRTY.store(true, Ordering::Release);
}

/// `ptsz`: the allocation came through a per-thread-default-stream entry point (undo it the same way).
#[allow(clippy::too_many_arguments)]
fn pool_alloc(
    dptr: *mut CUdeviceptr,
    bytes: u64,
    pool: u64,
    dev: CUdevice,
    stream: CUstream,
    ptsz: bool,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    if dptr.is_null() || exiting() {
        return call();
    }
    let q = match quota::for_device(dev) {
        Ok(Some(q)) => q,
        Ok(None) => return call(),
        Err(e) => return e,
    };
    // Charge what this allocation adds above the pool's current charge, before the driver call.
    let charged = POOLS.update(
        pool,
        || new_pool(dev),
        |p| {
            if !p.device_memory {
                return None;
            }
            let need = (p.outstanding + bytes).saturating_sub(p.charged);
            if !q.charge(Kind::AsyncPool, need) {
                return Some(false);
            }
            p.charged += need;
            p.outstanding += bytes;
            Some(true)
        },
    );
    match charged {
        None => return call(),
        Some(false) => return CUDA_ERROR_OUT_OF_MEMORY,
        Some(true) => {}
    }
    let r = call();
    if r != CUDA_SUCCESS {
        POOLS.with(pool, |p| {
            if let Some(p) = p {
                p.outstanding = p.outstanding.saturating_sub(bytes);
            }
        });
        reconcile_pool(pool);
        return r;
    }
    // SAFETY: non-null, written by the driver.
    let ptr = unsafe { *dptr };
    // The driver may have grown the reservation by more than the allocation (it reserves in chunks).
    // Charge the growth within the quota; if it does not fit, give the allocation back, trim the pool
    // and report out of memory, so the quota is never exceeded.
    let fits = match pool_reserved(pool) {
        Some(reserved) => POOLS.update(
            pool,
            || new_pool(dev),
            |p| {
                let want = reserved.max(p.outstanding);
                if want <= p.charged {
                    return true;
                }
                if !q.charge(Kind::AsyncPool, want - p.charged) {
                    return false;
                }
                p.charged = want;
                true
            },
        ),
        None => true,
    };
    if !fits {
        if ptsz {
            forward!(
                "cuMemFreeAsync_ptsz",
                fn(CUdeviceptr, CUstream),
                ptr,
                stream
            );
            forward!("cuStreamSynchronize_ptsz", fn(CUstream), stream);
        } else {
            forward!("cuMemFreeAsync", fn(CUdeviceptr, CUstream), ptr, stream);
            forward!("cuStreamSynchronize", fn(CUstream), stream);
        }
        let keep = POOLS.update(
            pool,
            || new_pool(dev),
            |p| {
                p.outstanding = p.outstanding.saturating_sub(bytes);
                p.outstanding
            },
        );
        forward!(
            "cuMemPoolTrimTo",
            fn(CUmemoryPool, usize),
            pool as CUmemoryPool,
            keep as usize
        );
        reconcile_pool(pool);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    ALLOCS.insert(
        ptr,
        Rec {
            dev,
            kind: Kind::AsyncPool,
            bytes,
            ctx: current_ctx(),
            pool,
        },
    );
    r
}

fn device_pool(dev: CUdevice) -> Option<u64> {
    let mut p: CUmemoryPool = std::ptr::null_mut();
    (forward!(
        "cuDeviceGetMemPool",
        fn(*mut CUmemoryPool, CUdevice),
        &mut p,
        dev
    ) == CUDA_SUCCESS)
        .then_some(p as u64)
}

/// A stream being captured into a graph: its stream-ordered allocations become graph memory nodes, charged
/// as graph memory when the graph runs, so they are not charged here.
fn capturing(stream: CUstream, ptsz: bool) -> bool {
    let mut status: i32 = 0;
    let r = if ptsz {
        forward!(
            "cuStreamIsCapturing_ptsz",
            fn(CUstream, *mut i32),
            stream,
            &mut status
        )
    } else {
        forward!(
            "cuStreamIsCapturing",
            fn(CUstream, *mut i32),
            stream,
            &mut status
        )
    };
    r == CUDA_SUCCESS && status != 0
}

fn alloc_async(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    stream: CUstream,
    ptsz: bool,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    if quota::unlimited() {
        return call();
    }
    if quota::config().is_err() {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if capturing(stream, ptsz) {
        return call();
    }
    let Some(dev) = current_device() else {
        return call();
    };
    let Some(pool) = device_pool(dev) else {
        return call();
    };
    pool_alloc(dptr, bytes as u64, pool, dev, stream, ptsz, call)
}

fn alloc_from_pool(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    pool: CUmemoryPool,
    stream: CUstream,
    ptsz: bool,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    if quota::unlimited() {
        return call();
    }
    if quota::config().is_err() {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if capturing(stream, ptsz) {
        return call();
    }
    let known = POOLS.with(pool as u64, |p| p.map(|p| p.dev));
    let Some(dev) = known.or_else(current_device) else {
        return call();
    };
    pool_alloc(dptr, bytes as u64, pool as u64, dev, stream, ptsz, call)
}

hook!(cuMemAllocAsync(dptr: *mut CUdeviceptr, bytes: usize, s: CUstream) {
    alloc_async(dptr, bytes, s, false, || forward!("cuMemAllocAsync", fn(*mut CUdeviceptr, usize, CUstream), dptr, bytes, s))
});
hook!(cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytes: usize, s: CUstream) {
    alloc_async(dptr, bytes, s, true, || forward!("cuMemAllocAsync_ptsz", fn(*mut CUdeviceptr, usize, CUstream), dptr, bytes, s))
});
hook!(cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytes: usize, pool: CUmemoryPool, s: CUstream) {
    alloc_from_pool(dptr, bytes, pool, s, false, || forward!("cuMemAllocFromPoolAsync", fn(*mut CUdeviceptr, usize, CUmemoryPool, CUstream), dptr, bytes, pool, s))
});
hook!(cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, bytes: usize, pool: CUmemoryPool, s: CUstream) {
    alloc_from_pool(dptr, bytes, pool, s, true, || forward!("cuMemAllocFromPoolAsync_ptsz", fn(*mut CUdeviceptr, usize, CUmemoryPool, CUstream), dptr, bytes, pool, s))
});
hook!(cuMemFreeAsync(p: CUdeviceptr, s: CUstream) {
    tracked_free(&ALLOCS, p, || forward!("cuMemFreeAsync", fn(CUdeviceptr, CUstream), p, s))
});
hook!(cuMemFreeAsync_ptsz(p: CUdeviceptr, s: CUstream) {
    tracked_free(&ALLOCS, p, || forward!("cuMemFreeAsync_ptsz", fn(CUdeviceptr, CUstream), p, s))
});

hook!(cuMemPoolCreate(pool: *mut CUmemoryPool, props: *const CUmemAllocationPropHead) {
    let r = forward!("cuMemPoolCreate", fn(*mut CUmemoryPool, *const CUmemAllocationPropHead), pool, props);
    if r == CUDA_SUCCESS && !pool.is_null() && !props.is_null() && !quota::unlimited() {
        // SAFETY: both non-null; the driver accepted the props and wrote the pool.
        let (p, props) = unsafe { (*pool as u64, &*props) };
        let device_memory = props.location_type == CU_MEM_LOCATION_TYPE_DEVICE;
        POOLS.insert(p, PoolState { dev: props.location_id, charged: 0, outstanding: 0, device_memory });
    }
    r
});

hook!(cuMemPoolDestroy(pool: CUmemoryPool) {
    let r = forward!("cuMemPoolDestroy", fn(CUmemoryPool), pool);
    if r == CUDA_SUCCESS {
        if let Some(p) = POOLS.remove(pool as u64) {
            if let (true, Target::Charge(q)) = (p.device_memory, target(Some(p.dev))) {
                q.refund(Kind::AsyncPool, p.charged);
            }
        }
    }
    r
});

hook!(cuMemPoolTrimTo(pool: CUmemoryPool, keep: usize) {
    let r = forward!("cuMemPoolTrimTo", fn(CUmemoryPool, usize), pool, keep);
    if r == CUDA_SUCCESS { reconcile_pool(pool as u64); }
    r
});

/// After a synchronisation: pools may have released memory, graphs may have finished with theirs.
fn after_sync(r: CUresult) -> CUresult {
    if r == CUDA_SUCCESS {
        reconcile_dirty_pools();
    }
    r
}

hook!(cuStreamSynchronize(s: CUstream) { after_sync(forward!("cuStreamSynchronize", fn(CUstream), s)) });
hook!(cuStreamSynchronize_ptsz(s: CUstream) { after_sync(forward!("cuStreamSynchronize_ptsz", fn(CUstream), s)) });
hook!(cuCtxSynchronize() { after_sync(forward!("cuCtxSynchronize", fn())) });
hook!(cuEventSynchronize(e: CUevent) { after_sync(forward!("cuEventSynchronize", fn(CUevent), e)) });

// ---- virtual memory management ------------------------------------------------------------------------

hook!(cuMemCreate(handle: *mut CUmemGenericAllocationHandle, bytes: usize, prop: *const CUmemAllocationPropHead, flags: u64) {
    let call = || forward!("cuMemCreate", fn(*mut CUmemGenericAllocationHandle, usize, *const CUmemAllocationPropHead, u64), handle, bytes, prop, flags);
    if handle.is_null() || prop.is_null() || quota::unlimited() {
        return call();
    }
    // SAFETY: non-null, owned by the caller; only the location is read.
    let (lt, dev) = unsafe { ((*prop).location_type, (*prop).location_id) };
    if lt != CU_MEM_LOCATION_TYPE_DEVICE {
        return call(); // host / NUMA memory: not a device quota
    }
    if quota::config().is_err() {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    // (VMM memory belongs to the device, not to a context: it outlives a context's destruction)
    charged_call(&VMM, Kind::Vmm, bytes as u64, (target(Some(dev)), dev, 0), call,
        // SAFETY: non-null, written by the driver.
        || unsafe { *handle })
});

hook!(cuMemRelease(handle: CUmemGenericAllocationHandle) {
    tracked_free(&VMM, handle, || forward!("cuMemRelease", fn(CUmemGenericAllocationHandle), handle))
});

// ---- graph memory ---------------------------------------------------------------------------------------
//
// Graph allocations come from a per-device reservation the driver grows at launch/upload. At instantiate we
// sum the graph's memory-alloc nodes; a launch first charges what of that does not fit in the reservation's
// unused part (refusing the launch with out-of-memory when over quota), then the charge is set to the real
// RESERVED_MEM_CURRENT. cuDeviceGraphMemTrim refunds what the reservation shrinks by.

fn graph_attr(dev: CUdevice, attr: i32) -> Option<u64> {
    let mut v: u64 = 0;
    (forward!(
        "cuDeviceGetGraphMemAttribute",
        fn(CUdevice, i32, *mut c_void),
        dev,
        attr,
        (&mut v as *mut u64).cast()
    ) == CUDA_SUCCESS)
        .then_some(v)
}

/// Sum of the sizes of a graph's memory-alloc nodes: walked with the driver's node queries, or as recorded
/// when the nodes were added, whichever is larger.
fn graph_need(graph: CUgraph) -> u64 {
    graph_walk(graph).max(GRAPH_NEEDS.with(graph as u64, |n| n.copied()).unwrap_or(0))
}

fn graph_walk(graph: CUgraph) -> u64 {
    let mut n: usize = 0;
    if forward!(
        "cuGraphGetNodes",
        fn(CUgraph, *mut CUgraphNode, *mut usize),
        graph,
        std::ptr::null_mut(),
        &mut n
    ) != CUDA_SUCCESS
        || n == 0
    {
        return 0;
    }
    let mut nodes = vec![std::ptr::null_mut::<c_void>(); n];
    if forward!(
        "cuGraphGetNodes",
        fn(CUgraph, *mut CUgraphNode, *mut usize),
        graph,
        nodes.as_mut_ptr(),
        &mut n
    ) != CUDA_SUCCESS
    {
        return 0;
    }
    let mut sum = 0u64;
    for node in nodes.into_iter().take(n) {
        let mut t: i32 = 0;
        if forward!(
            "cuGraphNodeGetType",
            fn(CUgraphNode, *mut i32),
            node,
            &mut t
        ) == CUDA_SUCCESS
            && t == CU_GRAPH_NODE_TYPE_MEM_ALLOC
        {
            // SAFETY: an all-zero CUDA_MEM_ALLOC_NODE_PARAMS is a valid out-buffer (plain data and pointers).
            let mut p: CUDA_MEM_ALLOC_NODE_PARAMS = unsafe { std::mem::zeroed() };
            if forward!(
                "cuGraphMemAllocNodeGetParams",
                fn(CUgraphNode, *mut CUDA_MEM_ALLOC_NODE_PARAMS),
                node,
                &mut p
            ) == CUDA_SUCCESS
            {
                sum = sum.saturating_add(p.bytesize as u64);
            }
        }
    }
    sum
}

/// Sets the device's graph charge to its real reservation (plus `pending`, charged but not yet used).
fn reconcile_graph(dev: CUdevice, q: &DeviceQuota) {
    let Some(reserved) = graph_attr(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT) else {
        return;
    };
    GRAPH_DEV.update(
        dev as u64,
        || 0,
        |charged| {
            if reserved > *charged {
                q.charge_forced(Kind::Graph, reserved - *charged);
            } else {
                q.refund(Kind::Graph, *charged - reserved);
            }
            *charged = reserved;
        },
    );
}

fn after_instantiate(r: CUresult, exec: *mut CUgraphExec, graph: CUgraph) -> CUresult {
    if r != CUDA_SUCCESS || exec.is_null() || quota::unlimited() {
        return r;
    }
    let Some(dev) = current_device() else {
        return r;
    };
    if let Target::Charge(q) = target(Some(dev)) {
        // SAFETY: non-null, written by the driver.
        GRAPH_EXECS.insert(unsafe { *exec } as u64, (dev, graph_need(graph)));
        reconcile_graph(dev, q);
    }
    r
}

hook!(cuGraphAddMemAllocNode(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, n: usize, params: *mut CUDA_MEM_ALLOC_NODE_PARAMS) {
    let r = forward!("cuGraphAddMemAllocNode", fn(*mut CUgraphNode, CUgraph, *const CUgraphNode, usize, *mut CUDA_MEM_ALLOC_NODE_PARAMS), node, graph, deps, n, params);
    if r == CUDA_SUCCESS && !params.is_null() && !quota::unlimited() {
        // SAFETY: non-null, accepted by the driver.
        let bytes = unsafe { (*params).bytesize } as u64;
        GRAPH_NEEDS.update(graph as u64, || 0, |b| *b = b.saturating_add(bytes));
    }
    r
});
hook!(cuGraphDestroy(graph: CUgraph) {
    let r = forward!("cuGraphDestroy", fn(CUgraph), graph);
    if r == CUDA_SUCCESS { GRAPH_NEEDS.remove(graph as u64); }
    r
});

hook!(cuGraphInstantiateWithFlags(exec: *mut CUgraphExec, graph: CUgraph, flags: u64) {
    after_instantiate(forward!("cuGraphInstantiateWithFlags", fn(*mut CUgraphExec, CUgraph, u64), exec, graph, flags), exec, graph)
});
hook!(cuGraphInstantiate_v2(exec: *mut CUgraphExec, graph: CUgraph, err: *mut CUgraphNode, log_buf: *mut c_char, size: usize) {
    after_instantiate(forward!("cuGraphInstantiate_v2", fn(*mut CUgraphExec, CUgraph, *mut CUgraphNode, *mut c_char, usize), exec, graph, err, log_buf, size), exec, graph)
});
hook!(cuGraphInstantiate(exec: *mut CUgraphExec, graph: CUgraph, err: *mut CUgraphNode, log_buf: *mut c_char, size: usize) {
    after_instantiate(forward!("cuGraphInstantiate", fn(*mut CUgraphExec, CUgraph, *mut CUgraphNode, *mut c_char, usize), exec, graph, err, log_buf, size), exec, graph)
});
hook!(cuGraphInstantiateWithParams(exec: *mut CUgraphExec, graph: CUgraph, params: *mut c_void) {
    after_instantiate(forward!("cuGraphInstantiateWithParams", fn(*mut CUgraphExec, CUgraph, *mut c_void), exec, graph, params), exec, graph)
});
hook!(cuGraphInstantiateWithParams_ptsz(exec: *mut CUgraphExec, graph: CUgraph, params: *mut c_void) {
    after_instantiate(forward!("cuGraphInstantiateWithParams_ptsz", fn(*mut CUgraphExec, CUgraph, *mut c_void), exec, graph, params), exec, graph)
});

/// A launch or upload of `exec`: pre-charge what its allocations may add, run, then settle to the truth.
fn graph_run(exec: CUgraphExec, call: impl FnOnce() -> CUresult) -> CUresult {
    let Some((dev, need)) = GRAPH_EXECS.with(exec as u64, |e| e.copied()) else {
        return call();
    };
    let Target::Charge(q) = target(Some(dev)) else {
        return call();
    };
    let reserved = graph_attr(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT).unwrap_or(0);
    let used = graph_attr(dev, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT).unwrap_or(0);
    let extra = need.saturating_sub(reserved.saturating_sub(used));
    let ok = GRAPH_DEV.update(
        dev as u64,
        || 0,
        |charged| {
            if !q.charge(Kind::Graph, extra) {
                return false;
            }
            *charged += extra;
            true
        },
    );
    if !ok {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    let r = call();
    reconcile_graph(dev, q);
    r
}

hook!(cuGraphLaunch(exec: CUgraphExec, s: CUstream) {
    graph_run(exec, || forward!("cuGraphLaunch", fn(CUgraphExec, CUstream), exec, s))
});
hook!(cuGraphLaunch_ptsz(exec: CUgraphExec, s: CUstream) {
    graph_run(exec, || forward!("cuGraphLaunch_ptsz", fn(CUgraphExec, CUstream), exec, s))
});
hook!(cuGraphUpload(exec: CUgraphExec, s: CUstream) {
    graph_run(exec, || forward!("cuGraphUpload", fn(CUgraphExec, CUstream), exec, s))
});
hook!(cuGraphUpload_ptsz(exec: CUgraphExec, s: CUstream) {
    graph_run(exec, || forward!("cuGraphUpload_ptsz", fn(CUgraphExec, CUstream), exec, s))
});
hook!(cuGraphExecDestroy(exec: CUgraphExec) {
    let r = forward!("cuGraphExecDestroy", fn(CUgraphExec), exec);
    if r == CUDA_SUCCESS { GRAPH_EXECS.remove(exec as u64); }
    r
});
hook!(cuDeviceGraphMemTrim(dev: CUdevice) {
    let r = forward!("cuDeviceGraphMemTrim", fn(CUdevice), dev);
    if r == CUDA_SUCCESS && !quota::unlimited() {
        if let Target::Charge(q) = target(Some(dev)) { reconcile_graph(dev, q); }
    }
    r
});

// ---- contexts and modules ---------------------------------------------------------------------------------
//
// Their device memory is not asked for by size: it is measured. Contexts: the device's used memory as NVML
// reports it, before and after creation (a context is not current yet, so cuMemGetInfo cannot be asked);
// modules: cuMemGetInfo's free memory before and after loading. Another process allocating at the same
// instant can skew a measurement: context creations of the processes sharing a quota are serialised by a
// record lock on a file next to the ledger, what the ledger recorded meanwhile is subtracted (allocations of the
// container's other processes), and the result is clamped to [0, ceiling]. If the measured memory does not fit, the
// context or module is destroyed again and the call fails with out-of-memory.

const CONTEXT_CEILING: u64 = 2 << 30;

/// A measured cost: the device's growth minus what the ledger recorded meanwhile (allocations of this
/// container's other processes and threads during the measurement), within [0, ceiling].
fn measured(device_delta: i128, ledger_delta: i128, ceiling: u64) -> u64 {
    (device_delta - ledger_delta).clamp(0, ceiling as i128) as u64
}
const MODULE_CEILING: u64 = 4 << 30;

fn measure_ctx(
    dev: CUdevice,
    q: Option<&DeviceQuota>,
    create: impl FnOnce() -> CUresult,
) -> (CUresult, u64) {
    let Some(q) = q else { return (create(), 0) };
    let _measuring = q.measure_lock();
    let (before, lb) = (nvml::device_used(&q.uuid), q.used());
    let r = create();
    let (after, la) = (nvml::device_used(&q.uuid), q.used());
    let cost = match (before, after) {
        (Some(b), Some(a)) => measured(
            a as i128 - b as i128,
            la as i128 - lb as i128,
            CONTEXT_CEILING,
        ),
        _ => 0,
    };
    log::debug(format_args!("context on device {dev}: {cost} bytes"));
    (r, cost)
}

fn ctx_create(pctx: *mut CUcontext, dev: CUdevice, create: impl FnOnce() -> CUresult) -> CUresult {
    if pctx.is_null() || quota::unlimited() || exiting() {
        return create();
    }
    let q = match target(Some(dev)) {
        Target::Charge(q) => q,
        Target::Forward => return create(),
        Target::Fail(e) => return e,
    };
    let (r, cost) = measure_ctx(dev, Some(q), create);
    if r != CUDA_SUCCESS {
        return r;
    }
    // SAFETY: non-null, written by the driver.
    let ctx = unsafe { *pctx };
    if !q.charge(Kind::Context, cost) {
        forward!("cuCtxDestroy_v2", fn(CUcontext), ctx);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CONTEXTS.insert(
        ctx as u64,
        Rec {
            dev,
            kind: Kind::Context,
            bytes: cost,
            ctx: ctx as usize,
            pool: 0,
        },
    );
    r
}

hook!(cuCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) {
    ctx_create(pctx, dev, || forward!("cuCtxCreate_v2", fn(*mut CUcontext, c_uint, CUdevice), pctx, flags, dev))
});
hook!(cuCtxCreate(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) {
    ctx_create(pctx, dev, || forward!("cuCtxCreate", fn(*mut CUcontext, c_uint, CUdevice), pctx, flags, dev))
});
hook!(cuCtxCreate_v3(pctx: *mut CUcontext, params: *mut c_void, n: i32, flags: c_uint, dev: CUdevice) {
    ctx_create(pctx, dev, || forward!("cuCtxCreate_v3", fn(*mut CUcontext, *mut c_void, i32, c_uint, CUdevice), pctx, params, n, flags, dev))
});
hook!(cuCtxCreate_v4(pctx: *mut CUcontext, params: *mut c_void, flags: c_uint, dev: CUdevice) {
    ctx_create(pctx, dev, || forward!("cuCtxCreate_v4", fn(*mut CUcontext, *mut c_void, c_uint, CUdevice), pctx, params, flags, dev))
});

/// The driver freed everything of context `ctx`: refund its records.
fn context_gone(ctx: usize) {
    CTX_GENERATION.fetch_add(1, Ordering::AcqRel);
    if let Some(rec) = CONTEXTS.remove(ctx as u64) {
        refund_rec(&rec);
    }
    for t in [&ALLOCS, &ARRAYS, &MODULES] {
        for (_, rec) in t.drain_where(|r| r.ctx == ctx) {
            if rec.pool != 0 {
                pool_released(rec.pool, rec.bytes);
            } else {
                refund_rec(&rec);
            }
        }
    }
}

hook!(cuCtxDestroy_v2(ctx: CUcontext) {
    let r = forward!("cuCtxDestroy_v2", fn(CUcontext), ctx);
    if r == CUDA_SUCCESS { context_gone(ctx as usize); }
    r
});
hook!(cuCtxDestroy(ctx: CUcontext) {
    let r = forward!("cuCtxDestroy", fn(CUcontext), ctx);
    if r == CUDA_SUCCESS { context_gone(ctx as usize); }
    r
});

hook!(cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) {
    let call = || forward!("cuDevicePrimaryCtxRetain", fn(*mut CUcontext, CUdevice), pctx, dev);
    if pctx.is_null() || quota::unlimited() || exiting() {
        return call();
    }
    let q = match target(Some(dev)) {
        Target::Charge(q) => q,
        Target::Forward => return call(),
        Target::Fail(e) => return e,
    };
    let (mut flags, mut active) = (0 as c_uint, 0i32);
    forward!("cuDevicePrimaryCtxGetState", fn(CUdevice, *mut c_uint, *mut i32), dev, &mut flags, &mut active);
    let fresh = active == 0;
    let (r, cost) = measure_ctx(dev, fresh.then_some(q), call);
    if r != CUDA_SUCCESS {
        return r;
    }
    // SAFETY: non-null, written by the driver.
    let ctx = unsafe { *pctx };
    if fresh && cost > 0 {
        if !q.charge(Kind::Context, cost) {
            forward!("cuDevicePrimaryCtxRelease_v2", fn(CUdevice), dev);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        CONTEXTS.insert(ctx as u64, Rec { dev, kind: Kind::Context, bytes: cost, ctx: ctx as usize, pool: 0 });
    }
    PRIMARY.update(dev as u64, || 0, |n| *n += 1);
    r
});

fn primary_release(dev: CUdevice, call: impl FnOnce() -> CUresult, reset: bool) -> CUresult {
    if quota::unlimited() {
        return call();
    }
    // Which context is the primary one: ask the driver before it may go away.
    let (mut flags, mut active) = (0 as c_uint, 0i32);
    forward!(
        "cuDevicePrimaryCtxGetState",
        fn(CUdevice, *mut c_uint, *mut i32),
        dev,
        &mut flags,
        &mut active
    );
    let mut ctx: CUcontext = std::ptr::null_mut();
    let mut found = false;
    if active != 0
        && forward!(
            "cuDevicePrimaryCtxRetain",
            fn(*mut CUcontext, CUdevice),
            &mut ctx,
            dev
        ) == CUDA_SUCCESS
    {
        forward!("cuDevicePrimaryCtxRelease_v2", fn(CUdevice), dev);
        found = true;
    }
    let r = call();
    if r != CUDA_SUCCESS {
        return r;
    }
    let last = PRIMARY.update(
        dev as u64,
        || 0,
        |n| {
            *n = if reset { 0 } else { n.saturating_sub(1) };
            *n == 0
        },
    );
    if last && found {
        context_gone(ctx as usize);
    }
    r
}

hook!(cuDevicePrimaryCtxRelease_v2(dev: CUdevice) {
    primary_release(dev, || forward!("cuDevicePrimaryCtxRelease_v2", fn(CUdevice), dev), false)
});
hook!(cuDevicePrimaryCtxRelease(dev: CUdevice) {
    primary_release(dev, || forward!("cuDevicePrimaryCtxRelease", fn(CUdevice), dev), false)
});
hook!(cuDevicePrimaryCtxReset_v2(dev: CUdevice) {
    primary_release(dev, || forward!("cuDevicePrimaryCtxReset_v2", fn(CUdevice), dev), true)
});
hook!(cuDevicePrimaryCtxReset(dev: CUdevice) {
    primary_release(dev, || forward!("cuDevicePrimaryCtxReset", fn(CUdevice), dev), true)
});

fn device_free() -> Option<u64> {
    let (mut f, mut t) = (0usize, 0usize);
    (forward!(
        "cuMemGetInfo_v2",
        fn(*mut usize, *mut usize),
        &mut f,
        &mut t
    ) == CUDA_SUCCESS)
        .then_some(f as u64)
}

fn module_load(m: *mut CUmodule, load: impl FnOnce() -> CUresult) -> CUresult {
    if m.is_null() {
        return load();
    }
    let (tgt, dev, ctx) = target_current();
    let q = match tgt {
        Target::Charge(q) => q,
        Target::Forward => return load(),
        Target::Fail(e) => return e,
    };
    let (before, lb) = (device_free(), q.used());
    let r = load();
    if r != CUDA_SUCCESS {
        return r;
    }
    let cost = match (before, device_free()) {
        (Some(b), Some(a)) => measured(
            b as i128 - a as i128,
            q.used() as i128 - lb as i128,
            MODULE_CEILING,
        ),
        _ => 0,
    };
    // SAFETY: non-null, written by the driver.
    let module = unsafe { *m };
    if !q.charge(Kind::Module, cost) {
        forward!("cuModuleUnload", fn(CUmodule), module);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    MODULES.insert(
        module as u64,
        Rec {
            dev,
            kind: Kind::Module,
            bytes: cost,
            ctx,
            pool: 0,
        },
    );
    r
}

hook!(cuModuleLoad(m: *mut CUmodule, fname: *const c_char) {
    module_load(m, || forward!("cuModuleLoad", fn(*mut CUmodule, *const c_char), m, fname))
});
hook!(cuModuleLoadData(m: *mut CUmodule, image: *const c_void) {
    module_load(m, || forward!("cuModuleLoadData", fn(*mut CUmodule, *const c_void), m, image))
});
hook!(cuModuleLoadDataEx(m: *mut CUmodule, image: *const c_void, n: c_uint, opts: *mut c_void, vals: *mut *mut c_void) {
    module_load(m, || forward!("cuModuleLoadDataEx", fn(*mut CUmodule, *const c_void, c_uint, *mut c_void, *mut *mut c_void), m, image, n, opts, vals))
});
hook!(cuModuleLoadFatBinary(m: *mut CUmodule, fatbin: *const c_void) {
    module_load(m, || forward!("cuModuleLoadFatBinary", fn(*mut CUmodule, *const c_void), m, fatbin))
});
hook!(cuModuleUnload(m: CUmodule) {
    tracked_free(&MODULES, m as u64, || forward!("cuModuleUnload", fn(CUmodule), m))
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measurements_net_of_ledger_activity_and_clamped() {
        assert_eq!(measured(600, 100, 1000), 500);
        assert_eq!(measured(100, 300, 1000), 0);
        assert_eq!(measured(-50, 0, 1000), 0);
        assert_eq!(measured(5000, 0, 1000), 1000);
    }

    #[test]
    fn cubemaps_have_six_faces_and_sparse_arrays_no_memory() {
        assert_eq!(layers_depth(0, 0), 1);
        assert_eq!(layers_depth(7, 0x01), 7);
        assert_eq!(layers_depth(0, 0x04), 6);
        assert!(unbacked(0x40) && unbacked(0x80) && !unbacked(0x01));
    }
}
