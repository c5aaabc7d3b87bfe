//! The per-process driver state: configuration, the shared state file, the object tables
//! (contexts, streams, pools, modules, ...), and the current-context stack of each thread.

use crate::mem::Mem;
use crate::types::*;
use fake_gpu::config::{env_size, visible_devices};
use fake_gpu::{Config, Shared};
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::ffi::c_int;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Mutex, MutexGuard, Once};

/// Granularity of pool and graph-memory reservations.
pub const POOL_CHUNK: u64 = 32 << 20;
/// VMM allocation granularity (`cuMemGetAllocationGranularity`).
pub const VMM_GRANULARITY: u64 = 2 << 20;

pub struct Ctx {
    pub ordinal: usize,
    pub phys: usize,
    pub primary: bool,
    pub flags: u32,
    /// Stack size, printf FIFO and malloc heap (`cuCtxSetLimit`), and the device memory they take above
    /// the defaults (which are part of the context's own bytes).
    pub limits: [u64; 3],
    pub limit_bytes: u64,
    /// The context's own memory (`FAKE_CUDA_CONTEXT_BYTES`; a green context's, `FAKE_CUDA_GREEN_CONTEXT_BYTES`).
    pub own_bytes: u64,
}

/// The default stack size, printf FIFO and malloc heap of a new context.
pub const DEFAULT_LIMITS: [u64; 3] = [1024, 1 << 20, 8 << 20];
/// Resident threads of a device (132 multiprocessors × 2048): what a byte of stack size costs.
pub const RESIDENT_THREADS: u64 = 132 * 2048;

#[derive(Default)]
pub struct Primary {
    pub handle: Handle,
    /// The handle the device's primary context had last: a new one (after a reset or the last
    /// release) gets it again, as the real driver's primary context keeps its `CUcontext` (a stale handle
    /// kept across a reset names the new context, so what was made in the old one must be known dead).
    pub last: Handle,
    pub refs: u32,
    pub flags: u32,
}

pub struct Stream {
    pub phys: usize,
    /// The context the stream was made in (`cuStreamGetCtx`; events recorded on it must be of it).
    pub ctx: Handle,
}

/// A stream-ordered memory pool: memory is charged by reservation (in [`POOL_CHUNK`]s), not by
/// allocation; freed memory stays reserved until a synchronisation releases it down to the
/// release threshold, or a trim.
pub struct Pool {
    pub phys: usize,
    pub reserved: u64,
    pub used: u64,
    pub reserved_high: u64,
    pub used_high: u64,
    pub threshold: u64,
    /// Made with POSIX descriptors among its handle types: it can be exported.
    pub shareable: bool,
}

/// VMM physical memory (`cuMemCreate`), freed when released and unmapped everywhere, and kept while a
/// descriptor it was exported to is open anywhere (`exports`, `api_vmm::sweep_kept`). A multicast object
/// (`mc`) and another process's memory imported here (`foreign`) are handles of the same kind that take
/// no device memory of this process's own.
#[derive(Default)]
pub struct Phys {
    pub phys: usize,
    pub size: u64,
    pub refs: u32,
    /// Probes of the descriptors it was exported to (`api_share`): open while any copy of one is.
    pub exports: Vec<c_int>,
    pub foreign: bool,
    /// A multicast object: what is bound to it, (offset in the object, CUDA ordinal of the memory's
    /// device, physical handle), each holding a reference.
    pub mc: Option<Vec<(u64, usize, u64)>>,
}

#[derive(Clone)]
pub enum Node {
    Alloc {
        dptr: u64,
        size: u64,
        phys: usize,
    },
    Free {
        dptr: u64,
    },
    /// A kernel node: its function, grid and block (one kernel's time on the timeline).
    Kernel {
        func: Handle,
        grid: [u32; 3],
        block: [u32; 3],
    },
    /// A memset node (cuBLAS puts a 4-byte one before each matmul): done at launch, costs no kernel time.
    Memset {
        dst: u64,
        pitch: usize,
        value: u32,
        element_size: u32,
        width: usize,
        height: usize,
    },
    Other,
}

#[derive(Default)]
pub struct GraphMem {
    pub reserved: u64,
    pub used: u64,
    pub reserved_high: u64,
    pub used_high: u64,
}

pub struct Module {
    pub phys: usize,
    pub ctx: Handle,
    /// PTX text, or None for a binary image (any function name resolves).
    pub ptx: Option<String>,
    pub charged: u64,
}

pub struct Array {
    pub phys: usize,
    pub bytes: u64,
    pub desc: [u64; 3],
    pub format: u32,
    pub channels: u32,
    pub flags: u32,
    pub mipmap: bool,
    /// Sparse tiles mapped onto VMM memory (`cuMemMapArrayAsync`): (subresource type and words, handle),
    /// each holding a reference.
    pub tiles: Vec<((i32, [u64; 4]), u64)>,
}

/// Memory of another process opened here (`api_ipc`): its physical device, bytes, the exporter's PID, and
/// whether it is counted in this process now (its exporter ended).
pub struct Opened {
    pub phys: usize,
    pub size: u64,
    pub exporter: u32,
    pub moved: bool,
}

#[derive(Default)]
pub struct Objs {
    pub ctxs: HashMap<Handle, Ctx>,
    pub primary: Vec<Primary>,
    pub streams: HashMap<Handle, Stream>,
    /// Each event's stamp (`timeline`); 0 until recorded.
    pub events: HashMap<Handle, u64>,
    /// The context each event was made in.
    pub event_ctx: HashMap<Handle, Handle>,
    /// Events that died with their context (`destroy_ctx`): using one is what crashes the real driver
    /// (`dead_event`).
    pub dead_events: std::collections::HashSet<Handle>,
    /// Streams destroyed (`cuStreamDestroy`, or with their context): likewise (`stream_phys`).
    pub dead_streams: std::collections::HashSet<Handle>,
    pub pools: HashMap<Handle, Pool>,
    /// Pools destroyed while allocations from them were live: the driver keeps their memory until the
    /// last of those allocations is freed (cuMemPoolDestroy's documented behaviour).
    pub dead_pools: HashMap<Handle, Pool>,
    /// Per physical device: its default pool and its current pool (0 = not made yet).
    pub default_pool: Vec<Handle>,
    pub current_pool: Vec<Handle>,
    pub vmm: HashMap<u64, Phys>,
    /// VA reservations: start -> size.
    pub reservations: BTreeMap<u64, u64>,
    /// VMM mappings: start -> (size, physical handle).
    pub mappings: BTreeMap<u64, (u64, u64)>,
    pub graphs: HashMap<Handle, Vec<(Handle, Node)>>,
    /// Each graph node's dependencies (the nodes it comes after).
    pub node_deps: HashMap<Handle, Vec<Handle>>,
    pub execs: HashMap<Handle, Vec<Node>>,
    pub graph_mem: Vec<GraphMem>,
    pub modules: HashMap<Handle, Module>,
    pub functions: HashMap<Handle, Handle>,
    pub arrays: HashMap<Handle, Array>,
    /// Exported VMM memory no handle or mapping holds any more, kept while a descriptor it was exported
    /// to is open: (physical device, bytes, probes).
    pub kept: Vec<(usize, u64, Vec<c_int>)>,
    /// Allocations shared through legacy IPC (`cuIpcGetMemHandle`) or a dma-buf descriptor
    /// (`cuMemGetHandleForAddressRange`), by base pointer: freed, their memory is kept until the process
    /// ends, as an H200 keeps it.
    pub ipc: std::collections::HashSet<u64>,
    /// Other processes' allocations opened here through legacy IPC, by the address they got (`api_ipc`).
    pub ipc_opened: HashMap<u64, Opened>,
    /// Pools imported from another process (`cuMemPoolImportFromShareableHandle`): their device.
    pub imported_pools: HashMap<Handle, usize>,
}

pub struct Driver {
    pub shared: Shared,
    /// CUDA ordinal -> physical index (CUDA_VISIBLE_DEVICES applied).
    pub visible: Vec<usize>,
    pub ctx_bytes: u64,
    pub module_bytes: u64,
    /// Stack bytes per thread every launched kernel needs (FAKE_CUDA_KERNEL_STACK; 0: within the default):
    /// a launch needing more than the context's stack size grows it, as the real driver does on its own.
    pub kernel_stack: u64,
    /// FAKE_CUDA_MANAGED_FAULTS=1: a launch brings the process's managed memory to its device (`api_managed`).
    pub managed_faults: bool,
    pub objs: Mutex<Objs>,
    pub mem: Mutex<Mem>,
}

static DRIVER: AtomicPtr<Driver> = AtomicPtr::new(std::ptr::null_mut());
static INIT: Mutex<()> = Mutex::new(());
static ATFORK: Once = Once::new();
/// Handles are unique for the life of the process (forks included), so a stale one never matches.
static NEXT_HANDLE: AtomicUsize = AtomicUsize::new(0x5eed_0000);
/// Bumped when a context dies, so threads revalidate their cached current context.
static CTX_EPOCH: AtomicU64 = AtomicU64::new(1);

/// A call names event `e` that died with its context: INVALID_HANDLE here, where the real driver reads
/// freed memory (a SIGSEGV inside libcuda, at random). `FAKE_CUDA_DEAD_HANDLES=abort` makes the fake
/// die as the driver may, at once and always, so a test sees every such use.
pub fn dead_event(objs: &Objs, e: Handle) -> R {
    if !objs.dead_events.contains(&e) {
        return Ok(());
    }
    dead_handle("event", e, "its context was destroyed")
}

/// A call named a handle the driver freed: INVALID_HANDLE, or with `FAKE_CUDA_DEAD_HANDLES=abort` one line
/// and an abort, as the real driver may crash reading freed memory.
fn dead_handle(what: &str, h: Handle, since: &str) -> R {
    if std::env::var_os("FAKE_CUDA_DEAD_HANDLES").is_some_and(|v| v == "abort") {
        eprintln!("fake-cuda: {what} {h:#x} used after {since} (the real driver may crash here)");
        std::process::abort();
    }
    Err(INVALID_HANDLE)
}

pub fn new_handle() -> Handle {
    NEXT_HANDLE.fetch_add(0x40, Relaxed)
}

pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The initialised driver, or CUDA_ERROR_NOT_INITIALIZED before `cuInit`.
pub fn drv() -> Result<&'static Driver, CUresult> {
    let p = DRIVER.load(Acquire);
    if p.is_null() {
        return Err(NOT_INITIALIZED);
    }
    // SAFETY: a published driver is never freed (after fork it is abandoned, not dropped).
    Ok(unsafe { &*p })
}

/// In the child after fork: the parent's driver state is not ours. Drop our copy of the state
/// file's descriptor (so the parent's slot lock dies with the parent) and require a new cuInit.
extern "C" fn atfork_child() {
    let p = DRIVER.swap(std::ptr::null_mut(), AcqRel);
    if !p.is_null() {
        // SAFETY: in the child only this thread exists; the abandoned driver is never read again.
        unsafe { (*p).shared.forget_after_fork() };
    }
    CTX_EPOCH.fetch_add(1, AcqRel);
}

pub fn init(flags: u32) -> R {
    if flags != 0 {
        return Err(INVALID_VALUE);
    }
    let _g = lock(&INIT);
    if !DRIVER.load(Acquire).is_null() {
        return Ok(());
    }
    let cfg = Config::from_env().map_err(|e| {
        eprintln!("fake-cuda: {e}");
        INVALID_VALUE
    })?;
    let visible = visible_devices(
        std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref(),
        cfg.totals.len(),
    );
    if visible.is_empty() {
        return Err(NO_DEVICE);
    }
    let mut shared = Shared::open(&cfg).map_err(|e| {
        eprintln!("fake-cuda: {e}");
        UNKNOWN
    })?;
    shared.claim().map_err(|e| {
        eprintln!("fake-cuda: {e}");
        OUT_OF_MEMORY
    })?;
    let n = cfg.totals.len();
    let objs = Objs {
        primary: (0..visible.len()).map(|_| Primary::default()).collect(),
        default_pool: vec![0; n],
        current_pool: vec![0; n],
        graph_mem: (0..n).map(|_| GraphMem::default()).collect(),
        ..Default::default()
    };
    let d = Box::new(Driver {
        mem: Mutex::new(Mem::new(n)),

        shared,
        visible,
        ctx_bytes: env_size("FAKE_CUDA_CONTEXT_BYTES", 256 << 20),
        module_bytes: env_size("FAKE_CUDA_MODULE_BYTES", 2 << 20),
        kernel_stack: env_size("FAKE_CUDA_KERNEL_STACK", 0),
        managed_faults: std::env::var_os("FAKE_CUDA_MANAGED_FAULTS").is_some_and(|v| v == "1"),
        objs: Mutex::new(objs),
    });
    ATFORK.call_once(|| {
        // SAFETY: registering a plain extern "C" handler.
        unsafe { libc::pthread_atfork(None, None, Some(atfork_child)) };
    });
    DRIVER.store(Box::into_raw(d), Release);
    Ok(())
}

impl Driver {
    /// Physical index of CUDA ordinal `dev`.
    pub fn phys(&self, dev: CUdevice) -> Result<usize, CUresult> {
        usize::try_from(dev)
            .ok()
            .and_then(|i| self.visible.get(i).copied())
            .ok_or(INVALID_DEVICE)
    }

    /// CUDA ordinal of physical device `phys` (it is visible when we have a handle on it).
    pub fn ordinal(&self, phys: usize) -> usize {
        self.visible.iter().position(|&p| p == phys).unwrap_or(0)
    }

    /// Charges device memory, reclaiming dead processes' memory once when the device is full.
    pub fn charge(&self, phys: usize, bytes: u64) -> R {
        if bytes == 0 || self.shared.charge_or_reclaim(phys, bytes) {
            Ok(())
        } else {
            Err(OUT_OF_MEMORY)
        }
    }

    pub fn refund(&self, phys: usize, bytes: u64) {
        if bytes != 0 {
            self.shared.refund(phys, bytes);
        }
    }

    /// Gives back what managed allocation `a` holds on devices other than its own (`api_managed::fault_in`).
    pub fn refund_away(&self, a: &crate::mem::Alloc) {
        for phys in (0..64).filter(|i| a.away & (1u64 << i) != 0) {
            self.refund(phys, a.size);
        }
    }

    /// Creates a context on ordinal `dev` (charging context memory) and returns its handle.
    pub fn create_ctx(
        &self,
        objs: &mut Objs,
        dev: CUdevice,
        flags: u32,
        primary: bool,
    ) -> Result<Handle, CUresult> {
        self.create_ctx_of(objs, dev, flags, primary, self.ctx_bytes)
    }

    /// A context taking `own_bytes` of the device (a green context's differ from an ordinary one's).
    pub fn create_ctx_of(
        &self,
        objs: &mut Objs,
        dev: CUdevice,
        flags: u32,
        primary: bool,
        own_bytes: u64,
    ) -> Result<Handle, CUresult> {
        self.create_ctx_as(objs, dev, flags, primary, own_bytes, 0)
    }

    /// The same under handle `reuse` (a primary context made again), or a new one when 0.
    pub fn create_ctx_as(
        &self,
        objs: &mut Objs,
        dev: CUdevice,
        flags: u32,
        primary: bool,
        own_bytes: u64,
        reuse: Handle,
    ) -> Result<Handle, CUresult> {
        let phys = self.phys(dev)?;
        self.charge(phys, own_bytes)?;
        let h = if reuse != 0 { reuse } else { new_handle() };
        objs.ctxs.insert(
            h,
            Ctx {
                ordinal: dev as usize,
                phys,
                primary,
                flags,
                limits: DEFAULT_LIMITS,
                limit_bytes: 0,
                own_bytes,
            },
        );
        Ok(h)
    }

    /// Destroys a context: its memory, allocations and modules return to the device, as on a GPU.
    pub fn destroy_ctx(&self, objs: &mut Objs, h: Handle) -> R {
        let ctx = objs.ctxs.remove(&h).ok_or(INVALID_CONTEXT)?;
        CTX_EPOCH.fetch_add(1, AcqRel);
        // As the real driver: the context's events and streams go with it.
        let dead: Vec<Handle> = objs
            .event_ctx
            .extract_if(|_, c| *c == h)
            .map(|(e, _)| e)
            .collect();
        for e in dead {
            objs.events.remove(&e);
            objs.dead_events.insert(e);
        }
        let streams: Vec<Handle> = objs
            .streams
            .extract_if(|_, s| s.ctx == h)
            .map(|(k, _)| k)
            .collect();
        objs.dead_streams.extend(streams);
        self.refund(ctx.phys, ctx.own_bytes + ctx.limit_bytes);
        let mods: Vec<Handle> = objs
            .modules
            .iter()
            .filter(|(_, m)| m.ctx == h)
            .map(|(&k, _)| k)
            .collect();
        for m in mods {
            let m = objs.modules.remove(&m).unwrap();
            self.refund(m.phys, m.charged);
        }
        objs.functions.retain(|_, m| objs.modules.contains_key(m));
        let freed = lock(&self.mem).free_ctx(h);
        for a in freed {
            if a.kind == crate::mem::Kind::Managed {
                crate::paging::note(&self.shared, a.phys, a.size, a.charged, false);
                self.refund_away(&a);
            }
            self.refund(a.phys, a.charged);
        }
        with_stack(|s| s.retain(|&c| c != h));
        Ok(())
    }
}

/// Per thread: the context stack (the last entry is current) and the current context as last
/// validated: (handle, epoch, ordinal, phys).
struct ThreadCtx {
    stack: RefCell<Vec<Handle>>,
    cache: Cell<(Handle, u64, usize, usize)>,
}

thread_local! {
    static THREAD: ThreadCtx = const { ThreadCtx { stack: RefCell::new(Vec::new()), cache: Cell::new((0, 0, 0, 0)) } };
}

/// Runs `f` on this thread's context stack.
fn with_stack<T>(f: impl FnOnce(&mut Vec<Handle>) -> T) -> T {
    THREAD.with(|t| f(&mut t.stack.borrow_mut()))
}

pub fn stack_top() -> Handle {
    with_stack(|s| s.last().copied().unwrap_or(0))
}

pub fn stack_push(h: Handle) {
    with_stack(|s| s.push(h));
}

pub fn stack_pop() -> Handle {
    with_stack(|s| s.pop().unwrap_or(0))
}

/// Replaces the current context (cuCtxSetCurrent); 0 unbinds it.
pub fn stack_set(h: Handle) {
    with_stack(|s| {
        s.pop();
        if h != 0 {
            s.push(h);
        }
    });
}

/// Current context as (handle, CUDA ordinal, physical index); CUDA_ERROR_INVALID_CONTEXT when
/// none is current or it was destroyed. Cached per thread, so the hot path takes no lock.
pub fn current(d: &Driver) -> Result<(Handle, usize, usize), CUresult> {
    let epoch = CTX_EPOCH.load(Acquire);
    let (top, cached) =
        THREAD.with(|t| (t.stack.borrow().last().copied().unwrap_or(0), t.cache.get()));
    if top == 0 {
        return Err(INVALID_CONTEXT);
    }
    let (h, e, ord, phys) = cached;
    if h == top && e == epoch {
        return Ok((h, ord, phys));
    }
    let objs = lock(&d.objs);
    let ctx = objs.ctxs.get(&top).ok_or(INVALID_CONTEXT)?;
    THREAD.with(|t| t.cache.set((top, epoch, ctx.ordinal, ctx.phys)));
    Ok((top, ctx.ordinal, ctx.phys))
}

/// Physical device of a stream (0, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD mean the current
/// context's device).
pub fn stream_phys(d: &Driver, objs: &Objs, stream: Handle) -> Result<usize, CUresult> {
    if stream <= 2 {
        drop_guard_current(d, objs)
    } else if objs.dead_streams.contains(&stream) {
        dead_handle("stream", stream, "it was destroyed").map(|_| 0)
    } else {
        objs.streams
            .get(&stream)
            .map(|s| s.phys)
            .ok_or(INVALID_HANDLE)
    }
}

/// The context of a stream: its own, or for 0, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD the current one.
pub fn stream_ctx(objs: &Objs, stream: Handle) -> Result<Handle, CUresult> {
    if stream <= 2 {
        let top = stack_top();
        objs.ctxs.get(&top).map(|_| top).ok_or(INVALID_CONTEXT)
    } else {
        objs.streams
            .get(&stream)
            .map(|s| s.ctx)
            .ok_or(INVALID_HANDLE)
    }
}

/// [`current`] for callers already holding the objects lock.
pub fn drop_guard_current(_d: &Driver, objs: &Objs) -> Result<usize, CUresult> {
    let top = stack_top();
    objs.ctxs.get(&top).map(|c| c.phys).ok_or(INVALID_CONTEXT)
}

/// Checks that `[p, p+n)` is device memory we handed out (an allocation or a VMM mapping) and
/// marks it written when `write`.
pub fn check_dev(d: &Driver, p: u64, n: usize, write: bool) -> R {
    if let Some((_, a)) = lock(&d.mem).find(p, n as u64) {
        a.touched |= write;
        return Ok(());
    }
    let objs = lock(&d.objs);
    match objs.mappings.range(..=p).next_back() {
        Some((&s, &(len, _))) if p + n as u64 <= s + len => Ok(()),
        _ => Err(INVALID_VALUE),
    }
}
