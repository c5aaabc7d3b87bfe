//! Per-process records of what was charged, and their fork handling: which allocation, array, handle,
//! module, context, pool and graph holds how many bytes of which device. Policies live in `hooks`.

mod holds;
mod table;

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use parking_lot::Mutex;

use vgpu_ledger::Kind;

use crate::ffi::CUdevice;
pub use holds::{McBind, Spans, TileKey, VmmMap};
pub use table::Table;

/// A managed allocation charged to its own device (in `allocs`, when that device has a quota) and,
/// because its pages reach every device where the process has a context, to those devices too
/// (`hooks/managed`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mirror {
    pub home: CUdevice,
    /// The context it was allocated in (freed with it).
    pub ctx: usize,
    pub bytes: u64,
    /// The devices besides `home` it is charged on (each `bytes` of `Kind::Managed`).
    pub devs: Vec<CUdevice>,
}

/// What one tracked allocation charged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rec {
    pub dev: CUdevice,
    pub kind: Kind,
    pub bytes: u64,
    /// The context it lives in (0 when not bound to one): freed with it.
    pub ctx: usize,
    /// The stream-ordered pool it came from (0 otherwise).
    pub pool: u64,
    /// Served past the quota as host-preferred managed memory (spill mode): `bytes` are charged to the
    /// spill budget, not to `kind` in the quota.
    pub spilled: bool,
    /// Served as managed memory by a memory mode (spilled, or every plain allocation in oversubscribe
    /// mode) where the application asked for device memory: CUDA IPC of it is refused (`hooks/memory`).
    pub served_managed: bool,
    /// Shared through legacy CUDA IPC (`cuIpcGetMemHandle`) or a dma-buf descriptor
    /// (`cuMemGetHandleForAddressRange`): another process or the descriptor may keep its memory past the
    /// free (an H200 keeps it), so the free does not refund it; it stays charged until this process ends.
    pub exported: bool,
}

impl Rec {
    pub fn new(dev: CUdevice, kind: Kind, bytes: u64, ctx: usize) -> Rec {
        Rec {
            dev,
            kind,
            bytes,
            ctx,
            pool: 0,
            spilled: false,
            served_managed: false,
            exported: false,
        }
    }
}

/// A VMM physical allocation as charged, with the references the driver counts on it: its handle, each
/// `cuMemRetainAllocationHandle`, each mapping, each sparse-array tile mapped onto it and each multicast
/// binding. The driver frees it when the last one goes, unless it was exported (`exported`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VmmRec {
    pub rec: Rec,
    pub refs: u32,
    /// An import of this process's own export: the handle whose record holds the charge (it holds one
    /// reference on that record while any of its own lives). 0 otherwise.
    pub of: u64,
    /// Imported from another process: charged by the union of what is mapped or bound of it (`Spans`).
    pub imported: bool,
    /// Exported (`cuMemExportToShareableHandle` succeeded): a descriptor or another process's import may
    /// keep the memory past every reference of this process, which the library cannot see; the charge
    /// stays when the last reference here goes, until the process ends.
    pub exported: bool,
    /// Exports of it in flight (an export racing its last release keeps the charge too).
    pub exporting: u32,
    /// A multicast object (`cuMulticastCreate`): no memory of its own; while it lives, the memory bound to
    /// it (`Records::mc_binds`) is held.
    pub multicast: bool,
}

impl VmmRec {
    pub fn new(rec: Rec) -> VmmRec {
        VmmRec {
            rec,
            refs: 1,
            of: 0,
            imported: false,
            exported: false,
            exporting: 0,
            multicast: false,
        }
    }

    /// Whether the memory may live on when this process holds no reference to it.
    pub fn kept(&self) -> bool {
        self.exported || self.exporting > 0
    }
}

/// Another process's allocation opened here through legacy CUDA IPC (`cuIpcOpenMemHandle`, `hooks/ipc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpcOpen {
    pub dev: CUdevice,
    pub bytes: u64,
    /// The context it was opened in (its mapping dies with it).
    pub ctx: usize,
    /// Where the exporter's mark lies in the device's ledger file.
    pub mark: u64,
    /// Charged to this process: the exporter is in another container, or ended.
    pub charged: bool,
}

/// A stream-ordered memory pool as charged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolState {
    pub dev: CUdevice,
    /// Bytes charged to the ledger for this pool: never below its reservation or its live allocations.
    pub charged: u64,
    /// Live allocations from this pool.
    pub outstanding: u64,
    /// A pool of host memory is nobody's device quota.
    pub device_memory: bool,
    /// Exported (`cuMemPoolExportToShareableHandle`): any of its allocations may be imported by another
    /// process, which keeps it past its free: its frees give nothing back (`hooks/pools/shared`).
    pub exported: bool,
}

impl PoolState {
    pub fn new(dev: CUdevice, device_memory: bool) -> PoolState {
        PoolState {
            dev,
            charged: 0,
            outstanding: 0,
            device_memory,
            exported: false,
        }
    }
}

/// What graph memory needs per device: (device, bytes), one entry per device, by device. The device
/// `UNPLACED` holds what no device could be told for.
pub type Needs = Vec<(CUdevice, u64)>;
pub const UNPLACED: CUdevice = -1;

/// A device's graph memory as charged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GraphDev {
    /// Bytes charged to the ledger: the device's graph reservation, plus what launches in progress
    /// pre-charged beyond it.
    pub charged: u64,
    /// What the launches in progress need (so two launches never count the same unused reservation).
    pub inflight: u64,
    /// What those launches pre-charged beyond the reservation they found.
    pub inflight_extra: u64,
}

/// A context size learned from a measurement (`hooks/measure`), and whether it came from this process's
/// own usage (trusted over a device-wide reading).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KnownContext {
    pub bytes: u64,
    pub trusted: bool,
}

/// Every record table of the process. The library has one (`RECORDS`); unit tests make their own.
/// Everything the library remembers per process lives here, never in a static of its own: the fork
/// handlers hold every lock of it while the process forks (so a child never inherits a lock another
/// thread held) and the child starts with it empty.
pub struct Records {
    /// Device pointers: plain, pitch, managed, async.
    pub allocs: Table<Rec>,
    /// Managed allocations (`cuMemAllocManaged` under a quota) by base: the other devices charged for them.
    pub managed: Table<Mirror>,
    /// CUarray and CUmipmappedArray.
    pub arrays: Table<Rec>,
    /// cuMemCreate handles.
    pub vmm: Table<VmmRec>,
    /// VMM mappings by address.
    pub vmm_maps: Table<VmmMap>,
    /// Imported handle -> the ranges of it charged (mapped, bound, or being mapped).
    pub vmm_spans: Table<Spans>,
    /// Sparse array or mipmapped array -> its tiles mapped onto VMM handles (`cuMemMapArrayAsync`), each
    /// holding a reference on its handle's record until unmapped or the array is destroyed.
    pub array_maps: Table<Vec<(TileKey, u64)>>,
    /// Multicast object -> the memory bound to it, each binding holding a reference on its handle's
    /// record until unbound or the object is gone.
    pub mc_binds: Table<Vec<McBind>>,
    /// Handles this process exported as file descriptors, by the descriptor's identity: (identity, handle).
    pub vmm_exports: Table<(u64, u64)>,
    /// Pointers opened through legacy CUDA IPC (`cuIpcOpenMemHandle`).
    pub ipc_opens: Table<IpcOpen>,
    /// Export marks this process holds (`hooks/ipc`): mark -> the address of the mapping that keeps it. A
    /// fork child has none (the mappings are not copied into it).
    pub ipc_marks: Table<usize>,
    /// How many of `ipc_opens` are charged to nobody here (their exporter's mark was held at the open).
    pub ipc_uncharged: AtomicU32,
    pub modules: Table<Rec>,
    /// cuCtxCreate contexts and primary contexts (key: the context).
    pub contexts: Table<Rec>,
    /// Primary context retain count per device.
    pub primary: Table<u32>,
    pub pools: Table<PoolState>,
    /// A stream-ordered free happened: pool reservations may shrink at the next synchronisation.
    pub pools_dirty: AtomicBool,
    /// The stack size each context was last accounted at (`hooks/limits`: growth the driver makes on its
    /// own is charged from there).
    pub stack_seen: Table<u64>,
    /// Graph memory per device.
    pub graph_dev: Table<GraphDev>,
    /// Graph exec -> what its alloc nodes need on each device.
    pub graph_execs: Table<Needs>,
    /// Graph -> bytes of the alloc nodes added to it, per device.
    pub graph_needs: Table<Needs>,
    /// Graph exec -> what it runs, for the compute share's solo time (`compute::solo`); only under a share.
    pub graph_work: Table<std::sync::Arc<crate::launch_charge::Composition>>,
    /// Context -> what `cuCtxSetLimit` and the driver's own stack growth were charged for each of the
    /// three limits that are device memory (`hooks/limits`).
    pub limit_extras: Table<[u64; 3]>,
    /// Serialises `cuCtxSetLimit`: reading the old value, setting and charging are one step. Held across
    /// the driver's call (it must be); taken before any table shard, also by the fork handlers.
    pub limit_setter: Mutex<()>,
    /// Device -> what the truth-up charged beyond the slot's records (`hooks/truth`).
    pub truth_charged: Table<u64>,
    /// This process's PID in NVML's process lists, once learned (0: not known).
    pub nvml_pid: AtomicU32,
    /// Device -> the context size this process learned there (`hooks/measure`).
    pub known_ctx: Table<KnownContext>,
    /// Library -> the keys in `modules` of its copies loaded at first use in contexts other than the one
    /// current at its load (`hooks/libraries`).
    pub library_uses: Table<Vec<u64>>,
    /// Kernel handle (`cuLibraryGetKernel`) -> its library.
    pub kernels: Table<u64>,
    /// Function (or kernel) -> its local memory per thread (`hooks/stack`).
    pub func_local: Table<u64>,
    /// Whether `kernels` ever held a kernel: until then a launch looks nothing up there.
    pub kernels_seen: AtomicBool,
    /// Functions known to need no stack growth, direct-mapped by handle: a launch of one costs two atomic
    /// loads instead of a table lookup (`hooks/stack`). Cleared with `func_local`.
    pub plain_funcs: [AtomicU64; PLAIN_FUNCS],
}

/// Entries of `Records::plain_funcs`.
pub const PLAIN_FUNCS: usize = 256;

pub static RECORDS: Records = Records::new();

impl Records {
    pub const fn new() -> Records {
        Records {
            allocs: Table::new(),
            managed: Table::new(),
            arrays: Table::new(),
            vmm: Table::new(),
            vmm_maps: Table::new(),
            vmm_spans: Table::new(),
            array_maps: Table::new(),
            mc_binds: Table::new(),
            vmm_exports: Table::new(),
            ipc_opens: Table::new(),
            ipc_marks: Table::new(),
            ipc_uncharged: AtomicU32::new(0),
            modules: Table::new(),
            contexts: Table::new(),
            primary: Table::new(),
            pools: Table::new(),
            pools_dirty: AtomicBool::new(false),
            stack_seen: Table::new(),
            graph_dev: Table::new(),
            graph_execs: Table::new(),
            graph_needs: Table::new(),
            graph_work: Table::new(),
            limit_extras: Table::new(),
            limit_setter: Mutex::new(()),
            truth_charged: Table::new(),
            nvml_pid: AtomicU32::new(0),
            known_ctx: Table::new(),
            library_uses: Table::new(),
            kernels: Table::new(),
            func_local: Table::new(),
            kernels_seen: AtomicBool::new(false),
            plain_funcs: [const { AtomicU64::new(0) }; PLAIN_FUNCS],
        }
    }

    fn recs(&self) -> [&Table<Rec>; 4] {
        [&self.allocs, &self.arrays, &self.modules, &self.contexts]
    }

    /// A pool allocation of `bytes` went away (stream-ordered free, cuMemFree, or its context): the
    /// pool's reservation may shrink, which the next reconciliation reads.
    pub fn pool_released(&self, pool: u64, bytes: u64) {
        self.pools.with(pool, |p| {
            if let Some(p) = p {
                p.outstanding = p.outstanding.saturating_sub(bytes);
            }
        });
        self.pools_dirty.store(true, Ordering::Release);
    }

    /// fork prepare: hold every shard so the child never inherits one locked by another thread.
    pub fn lock_all(&self) {
        // the setter first: a thread holding it may be waiting for a shard (never the other way round)
        std::mem::forget(self.limit_setter.lock());
        self.recs().iter().for_each(|t| t.lock_all());
        self.managed.lock_all();
        self.vmm.lock_all();
        self.vmm_maps.lock_all();
        self.vmm_spans.lock_all();
        self.array_maps.lock_all();
        self.mc_binds.lock_all();
        self.vmm_exports.lock_all();
        self.ipc_opens.lock_all();
        self.ipc_marks.lock_all();
        self.primary.lock_all();
        self.pools.lock_all();
        self.stack_seen.lock_all();
        self.graph_dev.lock_all();
        self.graph_execs.lock_all();
        self.graph_needs.lock_all();
        self.graph_work.lock_all();
        self.limit_extras.lock_all();
        self.truth_charged.lock_all();
        self.known_ctx.lock_all();
        self.library_uses.lock_all();
        self.kernels.lock_all();
        self.func_local.lock_all();
    }

    /// fork parent and child: release what `lock_all` took.
    pub fn unlock_all(&self) {
        self.recs().iter().for_each(|t| t.unlock_all());
        self.managed.unlock_all();
        self.vmm.unlock_all();
        self.vmm_maps.unlock_all();
        self.vmm_spans.unlock_all();
        self.array_maps.unlock_all();
        self.mc_binds.unlock_all();
        self.vmm_exports.unlock_all();
        self.ipc_opens.unlock_all();
        self.ipc_marks.unlock_all();
        self.primary.unlock_all();
        self.pools.unlock_all();
        self.stack_seen.unlock_all();
        self.graph_dev.unlock_all();
        self.graph_execs.unlock_all();
        self.graph_needs.unlock_all();
        self.graph_work.unlock_all();
        self.limit_extras.unlock_all();
        self.truth_charged.unlock_all();
        self.known_ctx.unlock_all();
        self.library_uses.unlock_all();
        self.kernels.unlock_all();
        self.func_local.unlock_all();
        // SAFETY: lock_all took it in this thread (fork prepare) and forgot the guard.
        unsafe { self.limit_setter.force_unlock() };
    }

    /// fork child: records of the parent's memory are not the child's.
    pub fn clear_after_fork(&self) {
        context_gone(); // the parent's contexts mean nothing in the child
        self.recs().iter().for_each(|t| t.clear());
        self.managed.clear();
        self.vmm.clear();
        self.vmm_maps.clear();
        self.vmm_spans.clear();
        self.array_maps.clear();
        self.mc_binds.clear();
        self.vmm_exports.clear();
        self.ipc_opens.clear();
        self.ipc_marks.clear();
        self.ipc_uncharged.store(0, Ordering::Release);
        self.primary.clear();
        self.pools.clear();
        self.stack_seen.clear();
        self.graph_dev.clear();
        self.graph_execs.clear();
        self.graph_needs.clear();
        self.graph_work.clear();
        self.limit_extras.clear();
        self.truth_charged.clear();
        self.nvml_pid.store(0, Ordering::Relaxed);
        self.known_ctx.clear();
        self.library_uses.clear();
        self.kernels.clear();
        self.func_local.clear();
        self.kernels_seen.store(false, Ordering::Relaxed);
        self.forget_plain_funcs();
    }

    /// Forgets which functions need no stack growth (their handles may be reused).
    pub fn forget_plain_funcs(&self) {
        for f in &self.plain_funcs {
            f.store(0, Ordering::Relaxed);
        }
    }
}

/// Keys of destroyed pools whose allocations still live: the top bit (never set in a user-space
/// handle) and a sequence number, so a new pool reusing the handle never mixes with the old one.
const DEAD_POOL: u64 = 1 << 63;
static DEAD_POOL_SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

pub fn dead_pool_key() -> u64 {
    DEAD_POOL | DEAD_POOL_SEQ.fetch_add(1, Ordering::Relaxed)
}

pub fn is_dead_pool(key: u64) -> bool {
    key & DEAD_POOL != 0
}

/// Bumped whenever a context goes away: a handle may then be reused for another device.
static CTX_GENERATION: AtomicU32 = AtomicU32::new(0);

thread_local! {
    /// (context, its device, generation): the device of this thread's current context, remembered so an
    /// allocation costs one driver query (cuCtxGetCurrent), not two.
    static CTX_DEVICE: Cell<(usize, CUdevice, u32)> = const { Cell::new((0, 0, u32::MAX)) };
}

/// A context went away: forget every thread's remembered context -> device pairs.
pub fn context_gone() {
    CTX_GENERATION.fetch_add(1, Ordering::AcqRel);
}

/// The remembered device of context `ctx` in this thread, if still valid.
#[inline]
pub fn cached_device(ctx: usize) -> Option<CUdevice> {
    let generation = CTX_GENERATION.load(Ordering::Acquire);
    let (c, d, g) = CTX_DEVICE.with(|v| v.get());
    (c == ctx && g == generation).then_some(d)
}

/// Remembers that context `ctx` belongs to `dev` (valid until the next `context_gone`). The generation
/// is read before the driver was asked, so a context destroyed meanwhile is never remembered as valid.
#[inline]
pub fn remember_device(ctx: usize, dev: CUdevice, generation: u32) {
    CTX_DEVICE.with(|v| v.set((ctx, dev, generation)));
}

/// The current context generation, read before asking the driver for a context's device.
#[inline]
pub fn generation() -> u32 {
    CTX_GENERATION.load(Ordering::Acquire)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fork_child_forgets_everything_and_tables_unlock() {
        let r = Records::new();
        r.allocs.insert(1, Rec::new(0, Kind::Data, 10, 5));
        r.pools.insert(2, PoolState::new(0, true));
        r.graph_needs.insert(3, vec![(0, 7)]);
        r.lock_all();
        r.unlock_all();
        r.clear_after_fork();
        assert!(r.allocs.keys().is_empty());
        assert!(r.pools.keys().is_empty());
        assert!(r.graph_needs.keys().is_empty());
    }

    #[test]
    fn a_gone_context_invalidates_the_cached_device() {
        let g = generation();
        remember_device(0x1000, 3, g);
        assert_eq!(cached_device(0x1000), Some(3));
        assert_eq!(cached_device(0x2000), None);
        context_gone();
        assert_eq!(cached_device(0x1000), None);
    }
}
