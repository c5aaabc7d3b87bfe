//! The real driver behind the seam: each method is one or two calls of the driver's own functions.
//! Zero-sized, so `Engine<RealDriver>` compiles to direct calls.

use std::ffi::{c_char, c_uint, c_void};

use super::Driver;
use crate::devices;
use crate::error::Error;
use crate::ffi::*;
use crate::quota::DeviceQuota;
use crate::real::{forward, real, Lib};
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
        // Initialised without a one-time lock (no lock of ours is held across nvmlInit).
        if !crate::identity::nvml_ready() {
            return None;
        }
        let by_uuid = real!(
            Lib::Nvml,
            "nvmlDeviceGetHandleByUUID",
            unsafe extern "C" fn(*const c_char, *mut nvmlDevice_t) -> nvmlReturn_t
        )?;
        let info = real!(
            Lib::Nvml,
            "nvmlDeviceGetMemoryInfo",
            unsafe extern "C" fn(nvmlDevice_t, *mut nvmlMemory_t) -> nvmlReturn_t
        )?;
        let c = std::ffi::CString::new(uuid).ok()?;
        let mut dev: nvmlDevice_t = std::ptr::null_mut();
        let mut m = nvmlMemory_t::default();
        // SAFETY: valid C string and out-pointers.
        unsafe {
            if by_uuid(c.as_ptr(), &mut dev) != NVML_SUCCESS || info(dev, &mut m) != NVML_SUCCESS {
                return None;
            }
        }
        Some(m.used)
    }

    fn mem_free(&self, ptr: u64) {
        forward!("cuMemFree_v2", fn(CUdeviceptr), ptr);
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

    fn alloc_node_bytes(&self, node: usize) -> Option<u64> {
        let node = node as CUgraphNode;
        let mut t: i32 = 0;
        if forward!(
            "cuGraphNodeGetType",
            fn(CUgraphNode, *mut i32),
            node,
            &mut t
        ) != CUDA_SUCCESS
            || t != CU_GRAPH_NODE_TYPE_MEM_ALLOC
        {
            return None;
        }
        // SAFETY: an all-zero CUDA_MEM_ALLOC_NODE_PARAMS is a valid out-buffer (plain data and pointers).
        let mut p: CUDA_MEM_ALLOC_NODE_PARAMS = unsafe { std::mem::zeroed() };
        (forward!(
            "cuGraphMemAllocNodeGetParams",
            fn(CUgraphNode, *mut CUDA_MEM_ALLOC_NODE_PARAMS),
            node,
            &mut p
        ) == CUDA_SUCCESS)
            .then_some(p.bytesize as u64)
    }

    fn module_unload(&self, module: usize) {
        forward!("cuModuleUnload", fn(CUmodule), module as CUmodule);
    }
}
