//! Where an object's memory lives, asked of the real driver: a pool the library did not see created (a
//! device's default or current pool, the host's), a graph allocation node's pool, a VMM handle (an
//! imported one included). The attribution rule (`docs/libvgpu.md`): a charge goes to the device of the
//! object it concerns, so these answers, never the current context, pick the quota.

use std::ffi::{c_int, c_void};

use crate::ffi::*;
use crate::real_symbols::forward;

/// Where memory lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// Device memory of this ordinal.
    Device(CUdevice),
    /// Host memory (any host or NUMA location): nobody's device quota.
    Host,
    /// The driver did not say.
    Unknown,
}

const CU_MEM_LOCATION_TYPE_HOST: c_int = 2;
const CU_MEM_LOCATION_TYPE_HOST_NUMA: c_int = 3;
const CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT: c_int = 4;
const CU_MEM_ALLOCATION_TYPE_PINNED: c_int = 1;

impl Place {
    /// A `CUmemLocation` (type, id).
    pub fn of(location_type: c_int, id: c_int) -> Place {
        match location_type {
            CU_MEM_LOCATION_TYPE_DEVICE => Place::Device(id),
            CU_MEM_LOCATION_TYPE_HOST
            | CU_MEM_LOCATION_TYPE_HOST_NUMA
            | CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT => Place::Host,
            _ => Place::Unknown,
        }
    }
}

/// `CUmemLocation`.
#[repr(C)]
struct Location {
    kind: c_int,
    id: c_int,
}

/// A pool's place: the default or current pool of some device, or (CUDA 13) of the host.
pub(super) fn pool_place(pool: u64) -> Place {
    let mut n: c_int = 0;
    if forward!("cuDeviceGetCount", fn(*mut c_int), &mut n) != CUDA_SUCCESS {
        return Place::Unknown;
    }
    let is = |p: CUmemoryPool, r: CUresult| r == CUDA_SUCCESS && p as u64 == pool;
    for dev in 0..n {
        let mut p: CUmemoryPool = std::ptr::null_mut();
        let r = forward!(
            "cuDeviceGetMemPool",
            fn(*mut CUmemoryPool, CUdevice),
            &mut p,
            dev
        );
        if is(p, r) {
            return Place::Device(dev);
        }
        let r = forward!(
            "cuDeviceGetDefaultMemPool",
            fn(*mut CUmemoryPool, CUdevice),
            &mut p,
            dev
        );
        if is(p, r) {
            return Place::Device(dev);
        }
    }
    // The host's default and current pools (drivers before CUDA 13 lack these: NOT_FOUND).
    for kind in [CU_MEM_LOCATION_TYPE_HOST, CU_MEM_LOCATION_TYPE_HOST_NUMA] {
        let mut loc = Location { kind, id: 0 };
        let mut p: CUmemoryPool = std::ptr::null_mut();
        let r = forward!(
            "cuMemGetMemPool",
            fn(*mut CUmemoryPool, *mut Location, c_int),
            &mut p,
            &mut loc,
            CU_MEM_ALLOCATION_TYPE_PINNED
        );
        if is(p, r) {
            return Place::Host;
        }
        let r = forward!(
            "cuMemGetDefaultMemPool",
            fn(*mut CUmemoryPool, *mut Location, c_int),
            &mut p,
            &mut loc,
            CU_MEM_ALLOCATION_TYPE_PINNED
        );
        if is(p, r) {
            return Place::Host;
        }
    }
    Place::Unknown
}

/// `CUmemAllocationProp` (32 bytes in CUDA 13), with room to spare for a later driver's.
#[repr(C)]
struct AllocationProp {
    head: CUmemAllocationPropHead,
    rest: [u64; 6],
}

/// The place of a VMM handle's physical memory.
pub(super) fn handle_place(handle: u64) -> Place {
    // SAFETY: all-zero is a valid out-buffer (plain integers and a pointer).
    let mut prop: AllocationProp = unsafe { std::mem::zeroed() };
    let r = forward!(
        "cuMemGetAllocationPropertiesFromHandle",
        fn(*mut AllocationProp, CUmemGenericAllocationHandle),
        &mut prop,
        handle
    );
    if r != CUDA_SUCCESS {
        return Place::Unknown;
    }
    Place::of(prop.head.location_type, prop.head.location_id)
}

/// The place of a graph allocation node's pool (`CUDA_MEM_ALLOC_NODE_PARAMS.poolProps.location`).
pub fn alloc_node_place(params: &CUDA_MEM_ALLOC_NODE_PARAMS) -> Place {
    // `CUmemPoolProps` opens like `CUmemAllocationProp`: type, handle types, location.
    let head = params.pool_props.as_ptr() as *const c_void as *const CUmemAllocationPropHead;
    // SAFETY: `pool_props` is 88 bytes, the head 16; read unaligned (a byte array's alignment is 1).
    let head = unsafe { std::ptr::read_unaligned(head) };
    Place::of(head.location_type, head.location_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_map_to_places() {
        assert_eq!(Place::of(1, 3), Place::Device(3));
        for host in 2..=4 {
            assert_eq!(Place::of(host, 0), Place::Host);
        }
        assert_eq!(Place::of(0, 0), Place::Unknown);
        assert_eq!(Place::of(9, 0), Place::Unknown);
    }

    #[test]
    fn an_alloc_nodes_place_is_read_from_its_pool_props() {
        // SAFETY: all-zero is valid for this plain struct.
        let mut p: CUDA_MEM_ALLOC_NODE_PARAMS = unsafe { std::mem::zeroed() };
        p.pool_props[8] = 1; // location.type = device
        p.pool_props[12] = 1; // location.id = 1
        assert_eq!(alloc_node_place(&p), Place::Device(1));
    }
}
