//! The `Driver` trait: every driver and NVML query the accounting policies make beyond the call being
//! hooked, and which quota the configuration gives a device. `real` implements it over the real driver,
//! `fake` in process for unit tests.

use crate::error::Error;
use crate::ffi::{CUdevice, CUresult};
use crate::launch_charge::NodeWork;
use crate::quota::DeviceQuota;
use crate::settings::Applies;

use super::located::Place;

/// What the policies ask the CUDA driver and NVML (beyond the call being hooked, which each hook passes
/// in as a closure), and which quota the configuration gives a device. Handles are plain integers.
pub trait Driver {
    /// Whether any limit applies in this process.
    fn applies(&self) -> Applies;
    /// True when no limit applies anywhere (the fast path of every hook).
    #[inline]
    fn unlimited(&self) -> bool {
        self.applies() == Applies::Nowhere
    }
    /// The quota of device `dev`: None without a limit, Err when a limit applies but cannot be enforced.
    fn quota(&self, dev: CUdevice) -> Result<Option<&'static DeviceQuota>, Error>;

    // ---- contexts
    /// The calling thread's current context (0: none).
    fn ctx_current(&self) -> usize;
    /// The device of the calling thread's current context.
    fn ctx_device(&self) -> Option<CUdevice>;
    fn ctx_destroy(&self, ctx: usize);
    /// Whether the primary context of `dev` is active.
    fn primary_active(&self, dev: CUdevice) -> bool;
    /// The handle of the primary context of `dev` (retained and released again to learn it).
    fn primary_handle(&self, dev: CUdevice) -> Option<usize>;
    fn primary_release(&self, dev: CUdevice);

    // ---- memory
    /// (free, total) of the current context's device.
    fn mem_info(&self) -> Option<(u64, u64)>;
    /// The whole device's used memory as NVML reports it (all processes).
    fn device_used(&self, uuid: &str) -> Option<u64>;
    fn mem_free(&self, ptr: u64);
    /// `cuMemAllocManaged(CU_MEM_ATTACH_GLOBAL)` of `bytes`; with `prefer_host` then advised to live on
    /// the host and be mapped by `dev` (`cuMemAdvise`: preferred location the CPU, accessed by `dev`), so
    /// the device reaches it over the bus instead of migrating it in. The driver's error when it refuses.
    fn alloc_managed(&self, bytes: u64, dev: CUdevice, prefer_host: bool) -> Result<u64, CUresult>;

    // ---- arrays
    /// What cu[Mipmapped]ArrayGetMemoryRequirements says an array takes on `dev`.
    fn array_requirements(&self, handle: usize, dev: CUdevice, mipmapped: bool) -> Option<u64>;
    fn array_destroy(&self, handle: usize, mipmapped: bool);

    // ---- stream-ordered pools
    /// RESERVED_MEM_CURRENT of a pool.
    fn pool_reserved(&self, pool: u64) -> Option<u64>;
    fn pool_trim(&self, pool: u64, keep: u64);
    /// cuCtxSynchronize of the current context: stream-ordered frees not yet reached become free.
    fn ctx_synchronize(&self);
    /// Waits for the work queued in context `ctx` (cuCtxSynchronize with `ctx` pushed current, the thread
    /// in relaxed capture mode); true when the driver says it is done (the turn gate's drain).
    fn ctx_sync(&self, ctx: usize) -> bool;
    /// The current default pool of `dev`.
    fn device_pool(&self, dev: CUdevice) -> Option<u64>;
    /// Where a pool the library did not see created lives: a device's default or current pool, or the
    /// host's (`located`).
    fn pool_place(&self, pool: u64) -> Place;
    /// Whether `stream` is being captured into a graph (`ptsz`: per-thread default stream entry points).
    fn capturing(&self, stream: usize, ptsz: bool) -> bool;
    /// The device of `stream`; None for the default streams (they belong to the current context).
    fn stream_device(&self, stream: usize, ptsz: bool) -> Option<CUdevice>;
    /// Frees a stream-ordered allocation and waits for the stream (undoing an allocation).
    fn free_async_and_sync(&self, ptr: u64, stream: usize, ptsz: bool);

    // ---- graphs
    /// A graph memory attribute of `dev` (CU_GRAPH_MEM_ATTR_*).
    fn graph_mem_attr(&self, dev: CUdevice, attr: i32) -> Option<u64>;
    /// The nodes of a graph.
    fn graph_nodes(&self, graph: usize) -> Option<Vec<usize>>;
    /// (size, address, where its pool lives) of a memory-allocation node; None for any other node.
    fn alloc_node(&self, node: usize) -> Option<(u64, u64, Place)>;
    /// The address a memory-free node frees; None for any other node.
    fn free_node(&self, node: usize) -> Option<u64>;
    /// The nodes `node` depends on (None: cannot be asked).
    fn node_dependencies(&self, node: usize) -> Option<Vec<usize>>;
    /// The graph embedded in a child-graph node; None for any other node.
    fn child_graph(&self, node: usize) -> Option<usize>;
    /// What a node runs, for the compute share's solo time of a graph (`launch_charge::compose`).
    fn node_work(&self, node: usize) -> NodeWork;

    // ---- VMM
    /// Where the physical memory of a VMM handle lives (cuMemGetAllocationPropertiesFromHandle).
    fn handle_place(&self, handle: u64) -> Place;
    /// cuMemRelease (undoing an import that cannot be charged).
    fn mem_release(&self, handle: u64);

    // ---- legacy IPC (hooks/ipc)
    /// The allocation holding `ptr`: (base, size, device), from cuMemGetAddressRange and the pointer's
    /// CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL; None when the driver does not say.
    fn ptr_range(&self, ptr: u64) -> Option<(u64, u64, CUdevice)>;
    /// cuIpcCloseMemHandle (undoing an open that cannot be charged).
    fn ipc_close(&self, ptr: u64);

    // ---- modules
    fn module_unload(&self, module: usize);

    // ---- measurement and limits (hooks/measure, hooks/limits, hooks/modules)
    /// NVML's compute processes on the device as (PID as NVML reports it, used bytes); None without NVML
    /// or when the driver does not report per-process usage.
    fn device_processes(&self, uuid: &str) -> Option<Vec<(u32, u64)>>;
    /// This process's PID as NVML reports it, when knowable without discovery: in the initial PID
    /// namespace NVML's PIDs are ours. None in a container (NVML reports host PIDs).
    fn nvml_pid_hint(&self) -> Option<u32>;
    /// (free, total) of the device of `ctx`, asked with `ctx` pushed current on this thread and popped
    /// again (the previous current context is restored).
    fn ctx_mem_info(&self, ctx: usize) -> Option<(u64, u64)>;
    /// cuCtxGetLimit of the current context.
    fn ctx_get_limit(&self, limit: i32) -> Option<u64>;
    /// cuCtxSetLimit(CU_LIMIT_STACK_SIZE) of the current context (`hooks/stack`).
    fn ctx_set_stack(&self, bytes: u64) -> CUresult;
    /// CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, a function's local memory per thread: `cuFuncGetAttribute` of
    /// a `CUfunction`, else `cuKernelGetAttribute` of a `CUkernel` on device `dev` (None: the current
    /// context's device).
    fn func_local_size(&self, func: usize, dev: Option<CUdevice>) -> Option<u64>;
    /// cuDeviceGetAttribute.
    fn device_attribute(&self, dev: CUdevice, attr: i32) -> Option<i64>;
    fn library_unload(&self, library: usize);
}
