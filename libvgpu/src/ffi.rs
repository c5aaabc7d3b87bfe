//! The slice of the CUDA driver API and NVML ABI the interposer touches (values from cuda.h / nvml.h).
//! Types and constants only: no calls (`real`, `driver`) and no policy (`hooks`).
#![allow(non_camel_case_types, dead_code)]

use std::os::raw::{c_char, c_int, c_uint, c_void};

pub type CUresult = c_uint;
pub type CUdevice = c_int;
pub type CUdeviceptr = u64;
pub type CUdeviceptr_v1 = c_uint;
pub type CUcontext = *mut c_void;
pub type CUstream = *mut c_void;
pub type CUmodule = *mut c_void;
pub type CUarray = *mut c_void;
pub type CUmipmappedArray = *mut c_void;
pub type CUmemoryPool = *mut c_void;
pub type CUgraph = *mut c_void;
pub type CUgraphExec = *mut c_void;
pub type CUgraphNode = *mut c_void;
pub type CUevent = *mut c_void;
pub type CUmemGenericAllocationHandle = u64;
/// `CUipcMemHandle` (64 opaque bytes): only ever passed through by pointer.
pub type CUipcMemHandle = [u8; 64];
/// `CUipcMemHandle` as `cuIpcOpenMemHandle` takes it, by value: a C struct of 64 bytes (passed as C passes
/// a struct, which an array is not).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUipcMemHandleValue {
    pub reserved: [u8; 64],
}

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub const CUDA_ERROR_NOT_SUPPORTED: CUresult = 801;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub const CUDA_ERROR_UNKNOWN: CUresult = 999;

pub const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: c_int = 5;
/// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`: the device a pointer's memory is on (`hooks/ipc`).
pub const CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: c_int = 9;
pub const CU_MEMPOOL_ATTR_USED_MEM_CURRENT: c_int = 7;
pub const CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT: c_int = 0;
pub const CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: c_int = 2;
pub const CU_GRAPH_NODE_TYPE_MEM_ALLOC: c_int = 10;
pub const CU_GRAPH_NODE_TYPE_GRAPH: c_int = 4;
pub const CU_GRAPH_NODE_TYPE_KERNEL: c_int = 0;
pub const CU_GRAPH_NODE_TYPE_MEM_FREE: c_int = 11;
pub const CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD: u64 = 2;
pub const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;
/// Managed memory reachable from every stream (`cuMemAllocManaged`).
pub const CU_MEM_ATTACH_GLOBAL: c_uint = 1;
pub const CU_MEM_ADVISE_SET_PREFERRED_LOCATION: c_int = 3;
pub const CU_MEM_ADVISE_SET_ACCESSED_BY: c_int = 5;
/// The host as a device ordinal in the legacy `cuMemAdvise`.
pub const CU_DEVICE_CPU: CUdevice = -1;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CUuuid {
    pub bytes: [u8; 16],
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_ARRAY_DESCRIPTOR {
    pub width: usize,
    pub height: usize,
    pub format: c_uint,
    pub num_channels: c_uint,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_ARRAY_DESCRIPTOR_v1 {
    pub width: c_uint,
    pub height: c_uint,
    pub format: c_uint,
    pub num_channels: c_uint,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_ARRAY3D_DESCRIPTOR {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: c_uint,
    pub num_channels: c_uint,
    pub flags: c_uint,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_ARRAY3D_DESCRIPTOR_v1 {
    pub width: c_uint,
    pub height: c_uint,
    pub depth: c_uint,
    pub format: c_uint,
    pub num_channels: c_uint,
    pub flags: c_uint,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CUDA_ARRAY_MEMORY_REQUIREMENTS {
    pub size: usize,
    pub alignment: usize,
    pub reserved: [c_uint; 4],
}

/// Only the leading fields of `CUmemAllocationProp` are read: the location says which device's memory.
#[repr(C)]
pub struct CUmemAllocationPropHead {
    pub alloc_type: c_uint,
    pub requested_handle_types: c_uint,
    pub location_type: c_int,
    pub location_id: c_int,
}

/// `CUDA_MEM_ALLOC_NODE_PARAMS` (120 bytes); `bytesize` is at offset 104.
#[repr(C)]
pub struct CUDA_MEM_ALLOC_NODE_PARAMS {
    pub pool_props: [u8; 88],
    pub access_descs: *const c_void,
    pub access_desc_count: usize,
    pub bytesize: usize,
    pub dptr: CUdeviceptr,
}

/// `CUDA_KERNEL_NODE_PARAMS_v2` (72 bytes; the v1 struct is its first 56).
#[repr(C)]
pub struct CUDA_KERNEL_NODE_PARAMS_v2 {
    pub func: *mut c_void,
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared_mem_bytes: c_uint,
    pub kernel_params: *mut *mut c_void,
    pub extra: *mut *mut c_void,
    pub kern: *mut c_void,
    pub ctx: *mut c_void,
}
const _: () = assert!(std::mem::size_of::<CUDA_KERNEL_NODE_PARAMS_v2>() == 72);

/// `CUDA_MEMSET_NODE_PARAMS` (40 bytes).
#[repr(C)]
pub struct CUDA_MEMSET_NODE_PARAMS {
    pub dst: CUdeviceptr,
    pub pitch: usize,
    pub value: c_uint,
    pub element_size: c_uint,
    pub width: usize,
    pub height: usize,
}
const _: () = assert!(std::mem::size_of::<CUDA_MEMSET_NODE_PARAMS>() == 40);

// NVML
pub type nvmlReturn_t = c_uint;
pub type nvmlDevice_t = *mut c_void;
pub const NVML_SUCCESS: nvmlReturn_t = 0;
pub const NVML_ERROR_UNINITIALIZED: nvmlReturn_t = 1;
pub const NVML_ERROR_INVALID_ARGUMENT: nvmlReturn_t = 2;
pub const NVML_ERROR_UNKNOWN: nvmlReturn_t = 999;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlMemory_t {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlMemory_v2_t {
    pub version: c_uint,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

pub type CStr = *const c_char;

/// `CUlaunchConfig` (cuLaunchKernelEx): grid, block, shared memory, stream, attributes.
#[repr(C)]
pub struct CUlaunchConfig {
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared_mem_bytes: c_uint,
    pub h_stream: CUstream,
    pub attrs: *mut c_void,
    pub num_attrs: c_uint,
}

const _: () = assert!(std::mem::offset_of!(CUlaunchConfig, h_stream) == 32);

/// `CUarrayMapInfo` (`cuMemMapArrayAsync`): one tile region of a sparse array mapped onto (or unmapped from)
/// a VMM handle's memory. The two unions are kept as raw words: `resource` is the array or mipmapped
/// array handle; `subresource` a sparse level's eight `unsigned int`s, or a mip tail's layer (the low half
/// of the first word; the high half is padding), offset and size.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUarrayMapInfo {
    pub resource_type: c_int,
    pub resource: u64,
    pub subresource_type: c_int,
    pub subresource: [u64; 4],
    pub mem_operation_type: c_int,
    pub mem_handle_type: c_int,
    pub mem_handle: u64,
    pub offset: u64,
    pub device_bit_mask: c_uint,
    pub flags: c_uint,
    pub reserved: [c_uint; 2],
}
const _: () = assert!(std::mem::size_of::<CUarrayMapInfo>() == 96);
const _: () = assert!(std::mem::offset_of!(CUarrayMapInfo, subresource) == 24);
const _: () = assert!(std::mem::offset_of!(CUarrayMapInfo, mem_operation_type) == 56);
const _: () = assert!(std::mem::offset_of!(CUarrayMapInfo, mem_handle) == 64);
const _: () = assert!(std::mem::offset_of!(CUarrayMapInfo, offset) == 72);
pub const CU_MEM_OPERATION_TYPE_MAP: c_int = 1;
pub const CU_MEM_OPERATION_TYPE_UNMAP: c_int = 2;
pub const CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_MIPTAIL: c_int = 1;
