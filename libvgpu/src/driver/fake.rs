//! An in-process fake of the driver seam for unit tests: a device whose memory, contexts, pools, arrays
//! and graphs the test sets up, and a log of the calls the policies made. No real or fake libcuda.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::located::Place;
use super::seam::Driver;
use crate::error::Error;
use crate::ffi::{CUdevice, CUresult};
use crate::quota::DeviceQuota;
use crate::settings::Applies;

/// Handles unique across tests (the per-thread context cache is keyed by handle).
static NEXT_HANDLE: AtomicUsize = AtomicUsize::new(0x1000);

pub fn handle() -> usize {
    NEXT_HANDLE.fetch_add(0x100, Ordering::Relaxed)
}

/// PIDs unique across tests (what the policies learn about this process is kept per PID).
static NEXT_PID: AtomicUsize = AtomicUsize::new(10_000);

pub struct FakeDriver {
    /// The context current at creation, on device 0.
    pub home: usize,
    pub applies: Cell<Applies>,
    pub quotas: RefCell<HashMap<CUdevice, Result<&'static DeviceQuota, Error>>>,
    /// The calling thread's current context and the device of each context.
    pub current: Cell<usize>,
    pub ctx_devices: RefCell<HashMap<usize, CUdevice>>,
    /// Primary context per device, and whether it is active.
    pub primary: RefCell<HashMap<CUdevice, (usize, bool)>>,
    /// The device's memory: total, and used by everyone (what NVML and cuMemGetInfo report).
    pub total: Cell<u64>,
    pub device_used: Cell<u64>,
    /// cu*GetMemoryRequirements answers by array handle.
    pub array_sizes: RefCell<HashMap<usize, u64>>,
    /// Pool reservations, and each device's default pool.
    pub pool_reserved: RefCell<HashMap<u64, u64>>,
    pub device_pools: RefCell<HashMap<CUdevice, u64>>,
    /// Frees are still pending on their streams: a trim releases nothing until a synchronisation.
    pub frees_pending: Cell<bool>,
    /// Where pools the policies did not see created live (absent: the driver does not say).
    pub pool_places: RefCell<HashMap<u64, Place>>,
    /// Where each allocation node's pool lives (absent: device 0) and each VMM handle's memory.
    pub node_places: RefCell<HashMap<usize, Place>>,
    pub handle_places: RefCell<HashMap<u64, Place>>,
    /// The device of each stream that is not a default stream.
    pub stream_devices: RefCell<HashMap<usize, CUdevice>>,
    /// Streams under capture.
    pub capturing: RefCell<Vec<usize>>,
    /// Graph memory attributes per device: (reserved, used).
    pub graph_mem: RefCell<HashMap<CUdevice, (u64, u64)>>,
    /// Nodes of each graph, and the size of each memory-allocation node.
    pub graphs: RefCell<HashMap<usize, Vec<usize>>>,
    pub alloc_nodes: RefCell<HashMap<usize, u64>>,
    /// Memory-free nodes and the allocation node whose memory each frees (addresses are the alloc
    /// node's handle here).
    pub free_nodes: RefCell<HashMap<usize, usize>>,
    /// Dependencies of each node (absent: cannot be asked).
    pub deps: RefCell<HashMap<usize, Vec<usize>>>,
    /// Child-graph nodes and the graph each embeds.
    pub child_graphs: RefCell<HashMap<usize, usize>>,
    /// Kernel nodes, and nodes that are neither kernels nor free (with what they are); any other node is
    /// free (empty, memory).
    pub kernel_nodes: RefCell<HashMap<usize, crate::launch_charge::KernelRef>>,
    pub other_nodes: RefCell<HashMap<usize, &'static str>>,
    /// Memset nodes and their bytes.
    pub memset_nodes: RefCell<HashMap<usize, u64>>,
    /// Every side call the policies made, as text ("mem_free 0x10", "pool_trim 5 0", ...).
    pub calls: RefCell<Vec<String>>,
    /// NVML is present (device and per-process usage); per-process usage is reported.
    pub nvml: Cell<bool>,
    pub per_process: Cell<bool>,
    /// This process's PID in its namespace, and as NVML reports it; whether NVML's PIDs are ours.
    pub pid: Cell<u32>,
    pub nvml_pid: Cell<u32>,
    pub same_pid_ns: Cell<bool>,
    /// This process's device memory, and other processes' (other tenants) by NVML PID.
    pub own_used: Cell<u64>,
    pub others: RefCell<HashMap<u32, u64>>,
    /// The current context's limits (cuCtxGetLimit) and the device's attributes.
    pub limits: RefCell<HashMap<i32, u64>>,
    pub attributes: RefCell<HashMap<i32, i64>>,
    /// What `alloc_managed` fails with (0: it succeeds).
    pub managed_error: Cell<CUresult>,
    /// What `ctx_sync` fails with (0: it succeeds).
    pub sync_fails: Cell<CUresult>,
    /// Local memory per thread of each function (`func_local_size`).
    pub func_locals: RefCell<HashMap<usize, u64>>,
    /// Local memory per thread of each `CUkernel`: given only for a device named by the caller (as
    /// `cuKernelGetAttribute` asks), never from the current context.
    pub kernel_locals: RefCell<HashMap<usize, u64>>,
    /// What `ptr_range` answers for a pointer: (base, size, device); absent: the driver does not say.
    pub ptr_ranges: RefCell<HashMap<u64, (u64, u64, CUdevice)>>,
}

impl FakeDriver {
    /// A device 0 of `total` bytes with a current context.
    pub fn new(total: u64) -> FakeDriver {
        let ctx = handle();
        let pid = NEXT_PID.fetch_add(1, Ordering::Relaxed) as u32;
        FakeDriver {
            home: ctx,
            applies: Cell::new(Applies::Somewhere),
            quotas: RefCell::new(HashMap::new()),
            current: Cell::new(ctx),
            ctx_devices: RefCell::new(HashMap::from([(ctx, 0)])),
            primary: RefCell::new(HashMap::new()),
            total: Cell::new(total),
            device_used: Cell::new(0),
            array_sizes: RefCell::new(HashMap::new()),
            pool_reserved: RefCell::new(HashMap::new()),
            device_pools: RefCell::new(HashMap::new()),
            frees_pending: Cell::new(false),
            pool_places: RefCell::new(HashMap::new()),
            node_places: RefCell::new(HashMap::new()),
            handle_places: RefCell::new(HashMap::new()),
            stream_devices: RefCell::new(HashMap::new()),
            capturing: RefCell::new(Vec::new()),
            graph_mem: RefCell::new(HashMap::new()),
            graphs: RefCell::new(HashMap::new()),
            alloc_nodes: RefCell::new(HashMap::new()),
            free_nodes: RefCell::new(HashMap::new()),
            deps: RefCell::new(HashMap::new()),
            child_graphs: RefCell::new(HashMap::new()),
            kernel_nodes: RefCell::new(HashMap::new()),
            other_nodes: RefCell::new(HashMap::new()),
            memset_nodes: RefCell::new(HashMap::new()),
            calls: RefCell::new(Vec::new()),
            nvml: Cell::new(true),
            per_process: Cell::new(true),
            pid: Cell::new(pid),
            nvml_pid: Cell::new(pid),
            same_pid_ns: Cell::new(true),
            own_used: Cell::new(0),
            others: RefCell::new(HashMap::new()),
            limits: RefCell::new(HashMap::from([(0, 1024), (1, 1 << 20), (2, 8 << 20)])),
            // 132 multiprocessors of 2048 resident threads (an H100)
            attributes: RefCell::new(HashMap::from([(16, 132), (39, 2048)])),
            managed_error: Cell::new(0),
            sync_fails: Cell::new(0),
            func_locals: RefCell::new(HashMap::new()),
            kernel_locals: RefCell::new(HashMap::new()),
            ptr_ranges: RefCell::new(HashMap::new()),
        }
    }

    /// The context made current at creation.
    pub fn ctx(&self) -> usize {
        self.home
    }

    pub fn set_current(&self, ctx: usize) {
        self.current.set(ctx);
    }

    pub fn set_applies(&self, a: Applies) {
        self.applies.set(a);
    }

    /// Device memory in use grows (or shrinks) by `delta`, as a driver allocation of this process would.
    pub fn grow(&self, delta: i64) {
        self.device_used
            .set(self.device_used.get().saturating_add_signed(delta));
        self.own_used
            .set(self.own_used.get().saturating_add_signed(delta));
    }

    /// Another process (NVML PID `pid`, another tenant) allocates (or frees) `delta` on the device.
    pub fn neighbour(&self, pid: u32, delta: i64) {
        self.device_used
            .set(self.device_used.get().saturating_add_signed(delta));
        let mut o = self.others.borrow_mut();
        let u = o.entry(pid).or_insert(0);
        *u = u.saturating_add_signed(delta);
    }

    fn log(&self, s: String) {
        self.calls.borrow_mut().push(s);
    }

    /// Did the policies make a side call starting with `prefix`?
    pub fn called(&self, prefix: &str) -> bool {
        self.calls.borrow().iter().any(|c| c.starts_with(prefix))
    }
}

impl Driver for FakeDriver {
    fn applies(&self) -> Applies {
        self.applies.get()
    }

    fn quota(&self, dev: CUdevice) -> Result<Option<&'static DeviceQuota>, Error> {
        match self.quotas.borrow().get(&dev) {
            None => Ok(None),
            Some(Ok(q)) => Ok(Some(*q)),
            Some(Err(e)) => Err(e.clone()),
        }
    }

    fn ctx_current(&self) -> usize {
        self.current.get()
    }

    fn ctx_device(&self) -> Option<CUdevice> {
        self.ctx_devices.borrow().get(&self.current.get()).copied()
    }

    fn ctx_destroy(&self, ctx: usize) {
        self.log(format!("ctx_destroy {ctx:#x}"));
        self.ctx_devices.borrow_mut().remove(&ctx);
    }

    fn primary_active(&self, dev: CUdevice) -> bool {
        self.primary.borrow().get(&dev).is_some_and(|p| p.1)
    }

    fn primary_handle(&self, dev: CUdevice) -> Option<usize> {
        self.primary.borrow().get(&dev).map(|p| p.0)
    }

    fn primary_release(&self, dev: CUdevice) {
        self.log(format!("primary_release {dev}"));
    }

    fn mem_info(&self) -> Option<(u64, u64)> {
        let t = self.total.get();
        Some((t.saturating_sub(self.device_used.get()), t))
    }

    fn device_used(&self, _uuid: &str) -> Option<u64> {
        self.nvml.get().then(|| self.device_used.get())
    }

    fn mem_free(&self, ptr: u64) {
        self.log(format!("mem_free {ptr:#x}"));
    }

    fn alloc_managed(&self, bytes: u64, dev: CUdevice, prefer_host: bool) -> Result<u64, CUresult> {
        let place = if prefer_host { "host" } else { "any" };
        self.log(format!("alloc_managed {bytes} dev {dev} {place}"));
        match self.managed_error.get() {
            0 => Ok(handle() as u64),
            e => Err(e),
        }
    }

    fn array_requirements(&self, handle: usize, _dev: CUdevice, _mipmapped: bool) -> Option<u64> {
        self.array_sizes.borrow().get(&handle).copied()
    }

    fn array_destroy(&self, handle: usize, mipmapped: bool) {
        self.log(format!("array_destroy {handle:#x} {mipmapped}"));
    }

    fn pool_reserved(&self, pool: u64) -> Option<u64> {
        self.pool_reserved.borrow().get(&pool).copied()
    }

    fn pool_trim(&self, pool: u64, keep: u64) {
        self.log(format!("pool_trim {pool:#x} {keep}"));
        if self.frees_pending.get() {
            return;
        }
        if let Some(r) = self.pool_reserved.borrow_mut().get_mut(&pool) {
            *r = (*r).min(keep);
        }
    }

    fn ctx_synchronize(&self) {
        self.log("ctx_synchronize".into());
        self.frees_pending.set(false);
    }

    fn ctx_sync(&self, ctx: usize) -> bool {
        self.log(format!("ctx_sync {ctx:#x}"));
        self.sync_fails.get() == 0
    }

    fn device_pool(&self, dev: CUdevice) -> Option<u64> {
        self.device_pools.borrow().get(&dev).copied()
    }

    fn pool_place(&self, pool: u64) -> Place {
        let known = self.pool_places.borrow().get(&pool).copied();
        known.unwrap_or(Place::Unknown)
    }

    fn capturing(&self, stream: usize, _ptsz: bool) -> bool {
        self.capturing.borrow().contains(&stream)
    }

    fn stream_device(&self, stream: usize, _ptsz: bool) -> Option<CUdevice> {
        self.stream_devices.borrow().get(&stream).copied()
    }

    fn free_async_and_sync(&self, ptr: u64, stream: usize, ptsz: bool) {
        self.log(format!("free_async_and_sync {ptr:#x} {stream:#x} {ptsz}"));
    }

    fn graph_mem_attr(&self, dev: CUdevice, attr: i32) -> Option<u64> {
        let (reserved, used) = self.graph_mem.borrow().get(&dev).copied()?;
        match attr {
            crate::ffi::CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT => Some(reserved),
            crate::ffi::CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT => Some(used),
            _ => None,
        }
    }

    fn graph_nodes(&self, graph: usize) -> Option<Vec<usize>> {
        self.graphs.borrow().get(&graph).cloned()
    }

    fn alloc_node(&self, node: usize) -> Option<(u64, u64, Place)> {
        let place = self.node_places.borrow().get(&node).copied();
        self.alloc_nodes
            .borrow()
            .get(&node)
            .map(|&b| (b, node as u64, place.unwrap_or(Place::Device(0))))
    }

    fn free_node(&self, node: usize) -> Option<u64> {
        self.free_nodes.borrow().get(&node).map(|&a| a as u64)
    }

    fn node_dependencies(&self, node: usize) -> Option<Vec<usize>> {
        if self.deps.borrow().is_empty() {
            return None;
        }
        Some(self.deps.borrow().get(&node).cloned().unwrap_or_default())
    }

    fn child_graph(&self, node: usize) -> Option<usize> {
        self.child_graphs.borrow().get(&node).copied()
    }

    fn node_work(&self, node: usize) -> crate::launch_charge::NodeWork {
        use crate::launch_charge::NodeWork;
        if let Some(k) = self.kernel_nodes.borrow().get(&node) {
            return NodeWork::Kernel(*k);
        }
        if let Some(g) = self.child_graph(node) {
            return NodeWork::Child(g);
        }
        if let Some(bytes) = self.memset_nodes.borrow().get(&node) {
            return NodeWork::Memset(*bytes);
        }
        match self.other_nodes.borrow().get(&node) {
            Some(what) => NodeWork::Other(what),
            None => NodeWork::Free,
        }
    }

    fn handle_place(&self, handle: u64) -> Place {
        let known = self.handle_places.borrow().get(&handle).copied();
        known.unwrap_or(Place::Unknown)
    }

    fn mem_release(&self, handle: u64) {
        self.log(format!("mem_release {handle:#x}"));
    }

    fn ptr_range(&self, ptr: u64) -> Option<(u64, u64, CUdevice)> {
        self.ptr_ranges.borrow().get(&ptr).copied()
    }

    fn ipc_close(&self, ptr: u64) {
        self.log(format!("ipc_close {ptr:#x}"));
    }

    fn module_unload(&self, module: usize) {
        self.log(format!("module_unload {module:#x}"));
    }

    fn device_processes(&self, _uuid: &str) -> Option<Vec<(u32, u64)>> {
        if !self.nvml.get() || !self.per_process.get() {
            return None;
        }
        let mut v: Vec<(u32, u64)> = self
            .others
            .borrow()
            .iter()
            .filter(|p| *p.1 > 0)
            .map(|(&p, &u)| (p, u))
            .collect();
        if self.own_used.get() > 0 {
            v.push((self.nvml_pid.get(), self.own_used.get()));
        }
        v.sort_unstable();
        Some(v)
    }

    fn nvml_pid_hint(&self) -> Option<u32> {
        self.same_pid_ns.get().then(|| self.pid.get())
    }

    fn ctx_mem_info(&self, ctx: usize) -> Option<(u64, u64)> {
        self.log(format!("ctx_mem_info {ctx:#x}"));
        if !self.ctx_devices.borrow().contains_key(&ctx) {
            return None;
        }
        let t = self.total.get();
        Some((t.saturating_sub(self.device_used.get()), t))
    }

    fn ctx_get_limit(&self, limit: i32) -> Option<u64> {
        self.limits.borrow().get(&limit).copied()
    }

    fn ctx_set_stack(&self, bytes: u64) -> CUresult {
        self.log(format!("ctx_set_stack {bytes}"));
        self.limits.borrow_mut().insert(0, bytes);
        0
    }

    fn func_local_size(&self, func: usize, dev: Option<CUdevice>) -> Option<u64> {
        let known = self.func_locals.borrow().get(&func).copied();
        known.or_else(|| dev.and(self.kernel_locals.borrow().get(&func).copied()))
    }

    fn device_attribute(&self, _dev: CUdevice, attr: i32) -> Option<i64> {
        self.attributes.borrow().get(&attr).copied()
    }

    fn library_unload(&self, library: usize) {
        self.log(format!("library_unload {library:#x}"));
    }
}
