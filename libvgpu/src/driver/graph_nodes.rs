//! What the real driver says of a graph node, for the compute share's reading of a graph: its type, a
//! kernel node's function and grid, the bytes a memset node sets.

use crate::ffi::*;
use crate::launch_charge::KernelRef;
use crate::real_symbols::forward;

/// The type of a graph node (CU_GRAPH_NODE_TYPE_*).
pub(super) fn node_type(node: usize) -> Option<i32> {
    let mut t: i32 = 0;
    (forward!(
        "cuGraphNodeGetType",
        fn(CUgraphNode, *mut i32),
        node as CUgraphNode,
        &mut t
    ) == CUDA_SUCCESS)
        .then_some(t)
}

/// A kernel node's function (and CUDA 12's kernel handle) and grid.
pub(super) fn kernel_node(node: usize) -> Option<KernelRef> {
    // SAFETY: all-zero is a valid out-buffer (plain integers and pointers).
    let mut p: CUDA_KERNEL_NODE_PARAMS_v2 = unsafe { std::mem::zeroed() };
    let node = node as CUgraphNode;
    let mut r = forward!(
        "cuGraphKernelNodeGetParams_v2",
        fn(CUgraphNode, *mut CUDA_KERNEL_NODE_PARAMS_v2),
        node,
        &mut p
    );
    if r == CUDA_ERROR_NOT_FOUND {
        // A driver before CUDA 12: the v1 struct, the first 56 bytes of ours (`kern` stays 0).
        r = forward!(
            "cuGraphKernelNodeGetParams",
            fn(CUgraphNode, *mut CUDA_KERNEL_NODE_PARAMS_v2),
            node,
            &mut p
        );
    }
    (r == CUDA_SUCCESS).then_some(KernelRef {
        func: p.func as usize,
        kern: p.kern as usize,
        grid: p.grid,
    })
}

/// The bytes a memset node sets (`CUDA_MEMSET_NODE_PARAMS`: element size × width × height).
pub(super) fn memset_node_bytes(node: usize) -> Option<u64> {
    // SAFETY: all-zero is a valid out-buffer (plain integers and a device pointer).
    let mut p: CUDA_MEMSET_NODE_PARAMS = unsafe { std::mem::zeroed() };
    let r = forward!(
        "cuGraphMemsetNodeGetParams",
        fn(CUgraphNode, *mut CUDA_MEMSET_NODE_PARAMS),
        node as CUgraphNode,
        &mut p
    );
    (r == CUDA_SUCCESS).then(|| {
        (p.element_size as u64)
            .saturating_mul(p.width as u64)
            .saturating_mul((p.height as u64).max(1))
    })
}
