//! The real driver behind the seam: each method is one or two calls of the driver's own functions.
//! Zero-sized, so `Interposer<RealDriver>` compiles to direct calls.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::ptr;

use super::graph_nodes::{kernel_node, memset_node_bytes, node_type};
use super::located::{self, Place};
use super::seam::Driver;
use crate::devices;
use crate::error::Error;
use crate::ffi::*;
use crate::launch_charge::NodeWork;
use crate::quota::DeviceQuota;
use crate::real_symbols::{forward, real, Lib};
use crate::settings::{self, Applies};

#[derive(Clone, Copy, Debug, Default)]
pub struct RealDriver;

impl Driver for RealDriver {
    #[inline]
    fn applies(&self) -> Applies {
        settings::applies()
    }

    #[inline]
    fn unlimited(&self) -> bool {
        settings::unlimited()
    }

    #[inline]
    fn quota(&self, dev: CUdevice) -> Result<Option<&'static DeviceQuota>, Error> {
        devices::for_device(dev, settings::config)
    }

    #[inline]
    fn ctx_current(&self) -> usize {
        let mut c: CUcontext = std::ptr::null_mut();
        forward!("cuCtxGetCurrent", fn(*mut CUcontext), &mut c);
        c as usize
    }

    fn ctx_device(&self) -> Option<CUdevice> {
        let mut d: CUdevice = 0;
        (forward!("cuCtxGetDevice", fn(*mut CUdevice), &mut d) == CUDA_SUCCESS).then_some(d)
    }

    fn ctx_destroy(&self, ctx: usize) {
        forward!("cuCtxDestroy_v2", fn(CUcontext), ctx as CUcontext);
    }

    fn primary_active(&self, dev: CUdevice) -> bool {
        let (mut flags, mut active) = (0 as c_uint, 0i32);
        forward!(
            "cuDevicePrimaryCtxGetState",
            fn(CUdevice, *mut c_uint, *mut i32),
            dev,
            &mut flags,
            &mut active
        );
        active != 0
    }

    fn primary_handle(&self, dev: CUdevice) -> Option<usize> {
        let mut ctx: CUcontext = std::ptr::null_mut();
        if forward!(
            "cuDevicePrimaryCtxRetain",
            fn(*mut CUcontext, CUdevice),
            &mut ctx,
            dev
        ) != CUDA_SUCCESS
        {
            return None;
        }
        forward!("cuDevicePrimaryCtxRelease_v2", fn(CUdevice), dev);
        Some(ctx as usize)
    }

    fn primary_release(&self, dev: CUdevice) {
        forward!("cuDevicePrimaryCtxRelease_v2", fn(CUdevice), dev);
    }

    fn mem_info(&self) -> Option<(u64, u64)> {
        let (mut f, mut t) = (0usize, 0usize);
        (forward!(
            "cuMemGetInfo_v2",
            fn(*mut usize, *mut usize),
            &mut f,
            &mut t
        ) == CUDA_SUCCESS)
            .then_some((f as u64, t as u64))
    }

    fn device_used(&self, uuid: &str) -> Option<u64> {
        let dev = nvml_device(uuid)?;
        let info = real!(
            Lib::Nvml,
            "nvmlDeviceGetMemoryInfo",
            unsafe extern "C" fn(nvmlDevice_t, *mut nvmlMemory_t) -> nvmlReturn_t
        )?;
        let mut m = nvmlMemory_t::default();
        // SAFETY: a device handle from NVML and a valid out-pointer.
        (unsafe { info(dev, &mut m) } == NVML_SUCCESS).then_some(m.used)
    }

    fn mem_free(&self, ptr: u64) {
        forward!("cuMemFree_v2", fn(CUdeviceptr), ptr);
    }

    fn alloc_managed(&self, bytes: u64, dev: CUdevice, prefer_host: bool) -> Result<u64, CUresult> {
        let mut p: CUdeviceptr = 0;
        let r = forward!(
            "cuMemAllocManaged",
            fn(*mut CUdeviceptr, usize, c_uint),
            &mut p,
            bytes as usize,
            CU_MEM_ATTACH_GLOBAL
        );
        if r != CUDA_SUCCESS {
            return Err(r);
        }
        if prefer_host {
            // The advice is a hint: a device that cannot take it still has the memory, only placed by
            // the driver's own policy. The legacy entry point (device ordinal, -1 = the CPU) is the one
            // every driver since CUDA 8 exports.
            let advise = |advice: i32, d: CUdevice| {
                forward!(
                    "cuMemAdvise",
                    fn(CUdeviceptr, usize, i32, CUdevice),
                    p,
                    bytes as usize,
                    advice,
                    d
                )
            };
            let a = advise(CU_MEM_ADVISE_SET_PREFERRED_LOCATION, CU_DEVICE_CPU);
            let b = advise(CU_MEM_ADVISE_SET_ACCESSED_BY, dev);
            // Populated on the host now, in the stream's order: the device's first touch of pages
            // nobody populated yet costs ~15x a touch of host pages (H100: 315 against 20 ms per GiB,
            // tests/gpu/spill_probe.cu).
            let c = forward!(
                "cuMemPrefetchAsync",
                fn(CUdeviceptr, usize, CUdevice, CUstream),
                p,
                bytes as usize,
                CU_DEVICE_CPU,
                ptr::null_mut()
            );
            if a != CUDA_SUCCESS || b != CUDA_SUCCESS || c != CUDA_SUCCESS {
                crate::log::debug(format_args!(
                    "cuMemAdvise/cuMemPrefetchAsync of spilled memory on device {dev}: {a}, {b}, {c} (kept as it is)"
                ));
            }
        }
        Ok(p)
    }

    fn array_requirements(&self, handle: usize, dev: CUdevice, mipmapped: bool) -> Option<u64> {
        let mut req = CUDA_ARRAY_MEMORY_REQUIREMENTS::default();
        let r = if mipmapped {
            forward!(
                "cuMipmappedArrayGetMemoryRequirements",
                fn(*mut CUDA_ARRAY_MEMORY_REQUIREMENTS, CUmipmappedArray, CUdevice),
                &mut req,
                handle as CUmipmappedArray,
                dev
            )
        } else {
            forward!(
                "cuArrayGetMemoryRequirements",
                fn(*mut CUDA_ARRAY_MEMORY_REQUIREMENTS, CUarray, CUdevice),
                &mut req,
                handle as CUarray,
                dev
            )
        };
        (r == CUDA_SUCCESS).then_some(req.size as u64)
    }

    fn array_destroy(&self, handle: usize, mipmapped: bool) {
        if mipmapped {
            forward!(
                "cuMipmappedArrayDestroy",
                fn(CUmipmappedArray),
                handle as CUmipmappedArray
            );
        } else {
            forward!("cuArrayDestroy", fn(CUarray), handle as CUarray);
        }
    }

    fn pool_reserved(&self, pool: u64) -> Option<u64> {
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

    fn pool_trim(&self, pool: u64, keep: u64) {
        forward!(
            "cuMemPoolTrimTo",
            fn(CUmemoryPool, usize),
            pool as CUmemoryPool,
            keep as usize
        );
    }

    fn ctx_synchronize(&self) {
        forward!("cuCtxSynchronize", fn());
    }

    fn ctx_sync(&self, ctx: usize) -> bool {
        let _relaxed = crate::streams::Relaxed::enter();
        crate::streams::in_context(ctx, || forward!("cuCtxSynchronize", fn())) == Ok(CUDA_SUCCESS)
    }

    fn device_pool(&self, dev: CUdevice) -> Option<u64> {
        let mut p: CUmemoryPool = std::ptr::null_mut();
        (forward!(
            "cuDeviceGetMemPool",
            fn(*mut CUmemoryPool, CUdevice),
            &mut p,
            dev
        ) == CUDA_SUCCESS)
            .then_some(p as u64)
    }

    fn pool_place(&self, pool: u64) -> Place {
        located::pool_place(pool)
    }

    fn capturing(&self, stream: usize, ptsz: bool) -> bool {
        let mut status: i32 = 0;
        let s = stream as CUstream;
        let r = if ptsz {
            forward!(
                "cuStreamIsCapturing_ptsz",
                fn(CUstream, *mut i32),
                s,
                &mut status
            )
        } else {
            forward!(
                "cuStreamIsCapturing",
                fn(CUstream, *mut i32),
                s,
                &mut status
            )
        };
        r == CUDA_SUCCESS && status != 0
    }

    fn stream_device(&self, stream: usize, ptsz: bool) -> Option<CUdevice> {
        // 0, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD: the current context's default streams.
        if stream <= 2 {
            return None;
        }
        let s = stream as CUstream;
        let mut d: CUdevice = 0;
        let r = if ptsz {
            forward!(
                "cuStreamGetDevice_ptsz",
                fn(CUstream, *mut CUdevice),
                s,
                &mut d
            )
        } else {
            forward!("cuStreamGetDevice", fn(CUstream, *mut CUdevice), s, &mut d)
        };
        if r == CUDA_SUCCESS {
            return Some(d);
        }
        // Drivers before CUDA 12.8 have no cuStreamGetDevice: ask the stream's context for its device.
        let mut ctx: CUcontext = std::ptr::null_mut();
        if forward!("cuStreamGetCtx", fn(CUstream, *mut CUcontext), s, &mut ctx) != CUDA_SUCCESS
            || ctx.is_null()
        {
            return None;
        }
        if forward!("cuCtxPushCurrent_v2", fn(CUcontext), ctx) != CUDA_SUCCESS {
            return None;
        }
        let ok = forward!("cuCtxGetDevice", fn(*mut CUdevice), &mut d) == CUDA_SUCCESS;
        let mut popped: CUcontext = std::ptr::null_mut();
        forward!("cuCtxPopCurrent_v2", fn(*mut CUcontext), &mut popped);
        ok.then_some(d)
    }

    fn free_async_and_sync(&self, ptr: u64, stream: usize, ptsz: bool) {
        let s = stream as CUstream;
        if ptsz {
            forward!("cuMemFreeAsync_ptsz", fn(CUdeviceptr, CUstream), ptr, s);
            forward!("cuStreamSynchronize_ptsz", fn(CUstream), s);
        } else {
            forward!("cuMemFreeAsync", fn(CUdeviceptr, CUstream), ptr, s);
            forward!("cuStreamSynchronize", fn(CUstream), s);
        }
    }

    fn graph_mem_attr(&self, dev: CUdevice, attr: i32) -> Option<u64> {
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

    fn graph_nodes(&self, graph: usize) -> Option<Vec<usize>> {
        let g = graph as CUgraph;
        let mut n: usize = 0;
        if forward!(
            "cuGraphGetNodes",
            fn(CUgraph, *mut CUgraphNode, *mut usize),
            g,
            std::ptr::null_mut(),
            &mut n
        ) != CUDA_SUCCESS
        {
            return None;
        }
        if n == 0 {
            return Some(Vec::new());
        }
        let mut nodes = vec![std::ptr::null_mut::<c_void>(); n];
        if forward!(
            "cuGraphGetNodes",
            fn(CUgraph, *mut CUgraphNode, *mut usize),
            g,
            nodes.as_mut_ptr(),
            &mut n
        ) != CUDA_SUCCESS
        {
            return None;
        }
        Some(nodes.into_iter().take(n).map(|p| p as usize).collect())
    }

    fn alloc_node(&self, node: usize) -> Option<(u64, u64, Place)> {
        if node_type(node) != Some(CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
            return None;
        }
        // SAFETY: an all-zero CUDA_MEM_ALLOC_NODE_PARAMS is a valid out-buffer (plain data and pointers).
        let mut p: CUDA_MEM_ALLOC_NODE_PARAMS = unsafe { std::mem::zeroed() };
        (forward!(
            "cuGraphMemAllocNodeGetParams",
            fn(CUgraphNode, *mut CUDA_MEM_ALLOC_NODE_PARAMS),
            node as CUgraphNode,
            &mut p
        ) == CUDA_SUCCESS)
            .then(|| (p.bytesize as u64, p.dptr, located::alloc_node_place(&p)))
    }

    fn free_node(&self, node: usize) -> Option<u64> {
        if node_type(node) != Some(CU_GRAPH_NODE_TYPE_MEM_FREE) {
            return None;
        }
        let mut p: CUdeviceptr = 0;
        (forward!(
            "cuGraphMemFreeNodeGetParams",
            fn(CUgraphNode, *mut CUdeviceptr),
            node as CUgraphNode,
            &mut p
        ) == CUDA_SUCCESS)
            .then_some(p)
    }

    fn node_dependencies(&self, node: usize) -> Option<Vec<usize>> {
        let node = node as CUgraphNode;
        let mut n: usize = 0;
        let ask = |deps: *mut CUgraphNode, n: &mut usize| {
            forward!(
                "cuGraphNodeGetDependencies",
                fn(CUgraphNode, *mut CUgraphNode, *mut usize),
                node,
                deps,
                n
            )
        };
        if ask(std::ptr::null_mut(), &mut n) != CUDA_SUCCESS {
            return None;
        }
        let mut deps = vec![std::ptr::null_mut::<c_void>(); n];
        if n > 0 && ask(deps.as_mut_ptr(), &mut n) != CUDA_SUCCESS {
            return None;
        }
        Some(deps.into_iter().take(n).map(|d| d as usize).collect())
    }

    fn child_graph(&self, node: usize) -> Option<usize> {
        if node_type(node) != Some(CU_GRAPH_NODE_TYPE_GRAPH) {
            return None;
        }
        let mut g: CUgraph = std::ptr::null_mut();
        (forward!(
            "cuGraphChildGraphNodeGetGraph",
            fn(CUgraphNode, *mut CUgraph),
            node as CUgraphNode,
            &mut g
        ) == CUDA_SUCCESS
            && !g.is_null())
        .then_some(g as usize)
    }

    fn node_work(&self, node: usize) -> NodeWork {
        match node_type(node) {
            Some(CU_GRAPH_NODE_TYPE_KERNEL) => kernel_node(node).map_or(
                NodeWork::Other("a kernel node whose parameters cannot be read"),
                NodeWork::Kernel,
            ),
            Some(CU_GRAPH_NODE_TYPE_GRAPH) => self.child_graph(node).map_or(
                NodeWork::Other("a child graph that cannot be read"),
                NodeWork::Child,
            ),
            // empty, event wait, event record, memory allocation and free
            Some(5 | 6 | 7 | 10 | 11) => NodeWork::Free,
            Some(1) => NodeWork::Other("a memcpy node"),
            Some(2) => memset_node_bytes(node).map_or(
                NodeWork::Other("a memset node whose parameters cannot be read"),
                NodeWork::Memset,
            ),
            Some(3) => NodeWork::Other("a host node"),
            Some(13) => NodeWork::Other("a conditional node"),
            Some(_) => NodeWork::Other("a node that is neither a kernel nor empty"),
            None => NodeWork::Other("a node whose type cannot be read"),
        }
    }

    fn handle_place(&self, handle: u64) -> Place {
        located::handle_place(handle)
    }

    fn mem_release(&self, handle: u64) {
        forward!("cuMemRelease", fn(CUmemGenericAllocationHandle), handle);
    }

    fn ptr_range(&self, ptr: u64) -> Option<(u64, u64, CUdevice)> {
        let (mut base, mut size): (CUdeviceptr, usize) = (0, 0);
        let r = forward!(
            "cuMemGetAddressRange_v2",
            fn(*mut CUdeviceptr, *mut usize, CUdeviceptr),
            &mut base,
            &mut size,
            ptr
        );
        let mut dev: c_int = -1;
        let d = forward!(
            "cuPointerGetAttribute",
            fn(*mut c_void, c_int, CUdeviceptr),
            (&mut dev as *mut c_int).cast(),
            CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            ptr
        );
        (r == CUDA_SUCCESS && d == CUDA_SUCCESS && dev >= 0).then_some((base, size as u64, dev))
    }

    fn ipc_close(&self, ptr: u64) {
        forward!("cuIpcCloseMemHandle", fn(CUdeviceptr), ptr);
    }

    fn module_unload(&self, module: usize) {
        forward!("cuModuleUnload", fn(CUmodule), module as CUmodule);
    }

    fn device_processes(&self, uuid: &str) -> Option<Vec<(u32, u64)>> {
        let dev = nvml_device(uuid)?;
        let list = real!(
            Lib::Nvml,
            "nvmlDeviceGetComputeRunningProcesses_v3",
            unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut NvmlProcess) -> nvmlReturn_t
        )?;
        let mut buf = vec![NvmlProcess::default(); 64];
        for _ in 0..4 {
            let mut n = buf.len() as c_uint;
            // SAFETY: `buf` holds `n` entries of the v2 process struct the _v3 entry point fills.
            let r = unsafe { list(dev, &mut n, buf.as_mut_ptr()) };
            if r == NVML_SUCCESS {
                buf.truncate(n as usize);
                // NVML_VALUE_NOT_AVAILABLE: per-process usage is not reported (e.g. WDDM).
                if buf.iter().any(|p| p.used == u64::MAX) {
                    return None;
                }
                return Some(buf.iter().map(|p| (p.pid, p.used)).collect());
            }
            if r != NVML_ERROR_INSUFFICIENT_SIZE {
                return None;
            }
            buf = vec![NvmlProcess::default(); n as usize + 16];
        }
        None
    }

    fn nvml_pid_hint(&self) -> Option<u32> {
        // The initial PID namespace's inode is PROC_PID_INIT_INO (0xEFFFFFFC).
        let ns = std::fs::read_link("/proc/self/ns/pid").ok()?;
        (ns.as_os_str() == "pid:[4026531836]").then(std::process::id)
    }

    fn ctx_mem_info(&self, ctx: usize) -> Option<(u64, u64)> {
        if forward!("cuCtxPushCurrent_v2", fn(CUcontext), ctx as CUcontext) != CUDA_SUCCESS {
            return None;
        }
        let info = self.mem_info();
        let mut popped: CUcontext = std::ptr::null_mut();
        forward!("cuCtxPopCurrent_v2", fn(*mut CUcontext), &mut popped);
        info
    }

    fn ctx_get_limit(&self, limit: i32) -> Option<u64> {
        let mut v: usize = 0;
        (forward!("cuCtxGetLimit", fn(*mut usize, i32), &mut v, limit) == CUDA_SUCCESS)
            .then_some(v as u64)
    }

    fn ctx_set_stack(&self, bytes: u64) -> CUresult {
        forward!("cuCtxSetLimit", fn(i32, usize), 0, bytes as usize)
    }

    fn func_local_size(&self, func: usize, dev: Option<CUdevice>) -> Option<u64> {
        let mut v: i32 = 0;
        // CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES of a CUfunction; the CUDA runtime (12+) launches CUkernel
        // handles, whose attributes are asked per device (the launch's stream's, or the current context's).
        if forward!(
            "cuFuncGetAttribute",
            fn(*mut i32, i32, *mut c_void),
            &mut v,
            3,
            func as *mut c_void
        ) == CUDA_SUCCESS
        {
            return Some(v.max(0) as u64);
        }
        let dev = dev.or_else(|| self.ctx_device())?;
        (forward!(
            "cuKernelGetAttribute",
            fn(*mut i32, i32, *mut c_void, CUdevice),
            &mut v,
            3,
            func as *mut c_void,
            dev
        ) == CUDA_SUCCESS)
            .then_some(v.max(0) as u64)
    }

    fn device_attribute(&self, dev: CUdevice, attr: i32) -> Option<i64> {
        let mut v: i32 = 0;
        (forward!(
            "cuDeviceGetAttribute",
            fn(*mut i32, i32, CUdevice),
            &mut v,
            attr,
            dev
        ) == CUDA_SUCCESS)
            .then_some(v as i64)
    }

    fn library_unload(&self, library: usize) {
        forward!("cuLibraryUnload", fn(*mut c_void), library as *mut c_void);
    }
}

/// nvmlProcessInfo_v2_t (`nvmlDeviceGetComputeRunningProcesses_v3`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct NvmlProcess {
    pid: c_uint,
    used: u64,
    gpu_instance: c_uint,
    compute_instance: c_uint,
}

const NVML_ERROR_INSUFFICIENT_SIZE: nvmlReturn_t = 7;

/// The NVML handle of the device with `uuid`.
fn nvml_device(uuid: &str) -> Option<nvmlDevice_t> {
    // Initialised without a one-time lock (no lock of ours is held across nvmlInit).
    if !crate::identity::nvml_ready() {
        return None;
    }
    let by_uuid = real!(
        Lib::Nvml,
        "nvmlDeviceGetHandleByUUID",
        unsafe extern "C" fn(*const c_char, *mut nvmlDevice_t) -> nvmlReturn_t
    )?;
    let c = std::ffi::CString::new(uuid).ok()?;
    let mut dev: nvmlDevice_t = std::ptr::null_mut();
    // SAFETY: valid C string and out-pointer.
    (unsafe { by_uuid(c.as_ptr(), &mut dev) } == NVML_SUCCESS).then_some(dev)
}
