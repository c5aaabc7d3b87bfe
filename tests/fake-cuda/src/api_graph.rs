//! Graph memory: allocation and free nodes. A node's address is fixed when the node is added; its
//! memory comes from the device's graph reservation, which grows (charged, in [`POOL_CHUNK`]s) when
//! a launch needs more than is reserved and shrinks only on `cuDeviceGraphMemTrim`.

use crate::driver::*;
use crate::mem::Kind;
use crate::types::*;
use std::ffi::{c_char, c_int, c_uint, c_void};

#[repr(C)]
pub struct AllocNodeParams {
    alloc_type: c_int,
    handle_types: c_int,
    loc_type: c_int,
    loc_id: c_int,
    rest: [u8; 72],
    access: *const c_void,
    access_count: usize,
    bytesize: usize,
    dptr: u64,
}

/// `CUDA_KERNEL_NODE_PARAMS` (`_v2` adds `kern` and `ctx`, which the fake never reads nor writes).
#[repr(C)]
pub struct KernelNodeParams {
    func: Handle,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared_mem: c_uint,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
}

/// `CUDA_MEMSET_NODE_PARAMS`.
#[repr(C)]
pub struct MemsetNodeParams {
    dst: u64,
    pitch: usize,
    value: c_uint,
    element_size: c_uint,
    width: usize,
    height: usize,
}

/// The bytes a memset node spans from its address (the last row is `width` elements).
fn memset_span(pitch: usize, element_size: u32, width: usize, height: usize) -> usize {
    let row = element_size as usize * width;
    if height <= 1 {
        row
    } else {
        pitch * (height - 1) + row
    }
}

/// Does a memset node's work (after the launch's locks are dropped: `check_dev` takes them).
fn run_memset(d: &Driver, n: &Node) -> R {
    let Node::Memset {
        dst,
        pitch,
        value,
        element_size,
        width,
        height,
    } = *n
    else {
        return Ok(());
    };
    check_dev(
        d,
        dst,
        memset_span(pitch, element_size, width, height),
        true,
    )?;
    for row in 0..height.max(1) {
        let at = dst + (row * pitch) as u64;
        // SAFETY: check_dev found [dst, dst + span) inside a live allocation of this process.
        unsafe {
            match element_size {
                1 => std::ptr::write_bytes(at as *mut u8, value as u8, width),
                2 => std::slice::from_raw_parts_mut(at as *mut u16, width).fill(value as u16),
                _ => std::slice::from_raw_parts_mut(at as *mut u32, width).fill(value),
            }
        }
    }
    Ok(())
}

/// Frees graph memory outside the graph (cuMemFree/cuMemFreeAsync of a node's address).
pub fn graph_free(d: &Driver, objs: &mut Objs, p: u64) -> R {
    let mut mem = lock(&d.mem);
    let a = mem
        .allocs
        .get_mut(&p)
        .filter(|a| a.live)
        .ok_or(INVALID_VALUE)?;
    a.live = false;
    let gm = &mut objs.graph_mem[a.phys];
    gm.used -= a.size.min(gm.used);
    Ok(())
}

/// Adds a node after `deps` (the caller's array of `n` nodes, or null). Launches run the nodes in the
/// order they were added, which honours the dependencies when they are added in order.
fn add_node(
    d: &Driver,
    node: *mut Handle,
    graph: Handle,
    n: Node,
    deps: *const Handle,
    ndeps: usize,
) -> R {
    if node.is_null() || (deps.is_null() && ndeps > 0) {
        return Err(INVALID_VALUE);
    }
    // SAFETY: the caller passes `ndeps` valid node handles at `deps` (checked non-null when ndeps > 0).
    let deps: Vec<Handle> = if ndeps == 0 {
        Vec::new()
    } else {
        unsafe { std::slice::from_raw_parts(deps, ndeps) }.to_vec()
    };
    let mut objs = lock(&d.objs);
    let g = objs.graphs.get_mut(&graph).ok_or(INVALID_VALUE)?;
    if deps.iter().any(|dep| !g.iter().any(|(h, _)| h == dep)) {
        return Err(INVALID_VALUE);
    }
    let h = new_handle();
    g.push((h, n));
    objs.node_deps.insert(h, deps);
    // SAFETY: checked non-null above.
    unsafe { out(node, h) }
}

fn instantiate(d: &Driver, exec: *mut Handle, graph: Handle) -> R {
    if exec.is_null() {
        return Err(INVALID_VALUE);
    }
    let mut objs = lock(&d.objs);
    let nodes: Vec<Node> = objs
        .graphs
        .get(&graph)
        .ok_or(INVALID_VALUE)?
        .iter()
        .map(|(_, n)| n.clone())
        .collect();
    let h = new_handle();
    objs.execs.insert(h, nodes);
    // SAFETY: checked non-null above.
    unsafe { out(exec, h) }
}

/// A node of any graph.
fn find_node(objs: &Objs, node: Handle) -> Result<Node, CUresult> {
    objs.graphs
        .values()
        .flatten()
        .find(|(h, _)| *h == node)
        .map(|(_, n)| n.clone())
        .ok_or(INVALID_VALUE)
}

cu_fn! {
fn cuGraphCreate(graph: *mut Handle, _flags: c_uint) {
    let d = drv()?;
    if graph.is_null() { return Err(INVALID_VALUE); }
    let h = new_handle();
    lock(&d.objs).graphs.insert(h, Vec::new());
    out(graph, h)
}

fn cuGraphDestroy(graph: Handle) {
    let d = drv()?;
    let nodes = lock(&d.objs).graphs.remove(&graph).ok_or(INVALID_VALUE)?;
    let mut mem = lock(&d.mem);
    for (_, n) in nodes {
        if let Node::Alloc { dptr, .. } = n {
            if mem.allocs.get(&dptr).is_some_and(|a| !a.live) { mem.release(dptr); }
        }
    }
    Ok(())
}

fn cuGraphAddMemAllocNode(node: *mut Handle, graph: Handle, deps: *const Handle, n: usize, params: *mut AllocNodeParams) {
    let d = drv()?;
    if params.is_null() { return Err(INVALID_VALUE); }
    let p = &mut *params;
    if p.alloc_type != 1 || p.loc_type != 1 || p.bytesize == 0 { return Err(INVALID_VALUE); }
    let phys = d.phys(p.loc_id).map_err(|_| INVALID_VALUE)?;
    if !lock(&d.objs).graphs.contains_key(&graph) { return Err(INVALID_VALUE); }
    let size = p.bytesize as u64;
    let dptr = lock(&d.mem).alloc(phys, d.shared.total(phys), size, Kind::Graph, 0, 0, 0).ok_or(OUT_OF_MEMORY)?;
    p.dptr = dptr;
    add_node(d, node, graph, Node::Alloc { dptr, size, phys }, deps, n)
}

fn cuGraphAddMemFreeNode(node: *mut Handle, graph: Handle, deps: *const Handle, n: usize, dptr: u64) {
    let d = drv()?;
    if lock(&d.mem).allocs.get(&dptr).map(|a| a.kind) != Some(Kind::Graph) { return Err(INVALID_VALUE); }
    add_node(d, node, graph, Node::Free { dptr }, deps, n)
}

fn cuGraphAddEmptyNode(node: *mut Handle, graph: Handle, deps: *const Handle, n: usize) {
    add_node(drv()?, node, graph, Node::Other, deps, n)
}

fn cuGraphAddMemsetNode(node: *mut Handle, graph: Handle, deps: *const Handle, n: usize, params: *const MemsetNodeParams, _ctx: Handle) {
    let d = drv()?;
    if params.is_null() { return Err(INVALID_VALUE); }
    let p = &*params;
    if ![1, 2, 4].contains(&p.element_size) || p.width == 0 { return Err(INVALID_VALUE); }
    if p.height > 1 && p.pitch < p.element_size as usize * p.width { return Err(INVALID_VALUE); }
    check_dev(d, p.dst, memset_span(p.pitch, p.element_size, p.width, p.height), true)?;
    let m = Node::Memset { dst: p.dst, pitch: p.pitch, value: p.value, element_size: p.element_size, width: p.width, height: p.height };
    add_node(d, node, graph, m, deps, n)
}

fn cuGraphMemsetNodeGetParams(node: Handle, params: *mut MemsetNodeParams) {
    let d = drv()?;
    if params.is_null() { return Err(INVALID_VALUE); }
    let Node::Memset { dst, pitch, value, element_size, width, height } = find_node(&lock(&d.objs), node)? else { return Err(INVALID_VALUE) };
    *params = MemsetNodeParams { dst, pitch, value, element_size, width, height };
    Ok(())
}

fn cuGraphAddKernelNode_v2(node: *mut Handle, graph: Handle, deps: *const Handle, n: usize, params: *const KernelNodeParams) {
    let d = drv()?;
    if params.is_null() { return Err(INVALID_VALUE); }
    let p = &*params;
    if !lock(&d.objs).functions.contains_key(&p.func) { return Err(INVALID_VALUE); }
    if p.grid.contains(&0) || p.block.contains(&0) { return Err(INVALID_VALUE); }
    add_node(d, node, graph, Node::Kernel { func: p.func, grid: p.grid, block: p.block }, deps, n)
}

fn cuGraphKernelNodeGetParams_v2(node: Handle, params: *mut KernelNodeParams) {
    let d = drv()?;
    if params.is_null() { return Err(INVALID_VALUE); }
    let Node::Kernel { func, grid, block } = find_node(&lock(&d.objs), node)? else { return Err(INVALID_VALUE) };
    let p = &mut *params;
    p.func = func;
    p.grid = grid;
    p.block = block;
    p.shared_mem = 0;
    p.params = std::ptr::null_mut();
    p.extra = std::ptr::null_mut();
    Ok(())
}

fn cuGraphGetNodes(graph: Handle, nodes: *mut Handle, n: *mut usize) {
    let d = drv()?;
    if n.is_null() { return Err(INVALID_VALUE); }
    let objs = lock(&d.objs);
    let g = objs.graphs.get(&graph).ok_or(INVALID_VALUE)?;
    if !nodes.is_null() {
        for (i, (h, _)) in g.iter().take(*n).enumerate() { *nodes.add(i) = *h; }
    }
    out(n, g.len())
}

fn cuGraphNodeGetType(node: Handle, t: *mut c_int) {
    let d = drv()?;
    let kind = match find_node(&lock(&d.objs), node)? {
        Node::Alloc { .. } => 10,
        Node::Free { .. } => 11,
        Node::Kernel { .. } => 0, // CU_GRAPH_NODE_TYPE_KERNEL
        Node::Memset { .. } => 2, // CU_GRAPH_NODE_TYPE_MEMSET
        Node::Other => 5, // CU_GRAPH_NODE_TYPE_EMPTY
    };
    out(t, kind)
}

fn cuGraphMemAllocNodeGetParams(node: Handle, params: *mut AllocNodeParams) {
    let d = drv()?;
    if params.is_null() { return Err(INVALID_VALUE); }
    let Node::Alloc { dptr, size, phys } = find_node(&lock(&d.objs), node)? else { return Err(INVALID_VALUE) };
    let p = &mut *params;
    p.alloc_type = 1;
    p.loc_type = 1;
    p.loc_id = d.ordinal(phys) as c_int;
    p.bytesize = size as usize;
    p.dptr = dptr;
    Ok(())
}

fn cuGraphMemFreeNodeGetParams(node: Handle, dptr: *mut u64) {
    let d = drv()?;
    let Node::Free { dptr: p } = find_node(&lock(&d.objs), node)? else { return Err(INVALID_VALUE) };
    out(dptr, p)
}

fn cuGraphNodeGetDependencies(node: Handle, deps: *mut Handle, n: *mut usize) {
    let d = drv()?;
    if n.is_null() { return Err(INVALID_VALUE); }
    let objs = lock(&d.objs);
    let list = objs.node_deps.get(&node).ok_or(INVALID_VALUE)?;
    if !deps.is_null() {
        for (i, h) in list.iter().take(*n).enumerate() { *deps.add(i) = *h; }
    }
    out(n, list.len())
}

fn cuGraphInstantiateWithFlags(exec: *mut Handle, graph: Handle, _flags: u64) {
    instantiate(drv()?, exec, graph)
}

fn cuGraphInstantiate_v2(exec: *mut Handle, graph: Handle, _err: *mut Handle, _log: *mut c_char, _len: usize) {
    instantiate(drv()?, exec, graph)
}

fn cuGraphExecDestroy(exec: Handle) {
    let d = drv()?;
    lock(&d.objs).execs.remove(&exec).map(|_| ()).ok_or(INVALID_VALUE)
}

fn cuGraphLaunch(exec: Handle, stream: Handle) {
    let d = drv()?;
    let mut objs = lock(&d.objs);
    let on = stream_phys(d, &objs, stream)?;
    let nodes = objs.execs.get(&exec).ok_or(INVALID_VALUE)?.clone();
    let mut mem = lock(&d.mem);
    // Dry run: the peak graph memory per device during this launch.
    let mut used: Vec<u64> = objs.graph_mem.iter().map(|g| g.used).collect();
    let mut peak = used.clone();
    for n in &nodes {
        match *n {
            Node::Alloc { dptr, size, phys } => {
                if mem.allocs.get(&dptr).is_none_or(|a| a.live) { return Err(INVALID_VALUE); }
                used[phys] += size;
                peak[phys] = peak[phys].max(used[phys]);
            }
            Node::Free { dptr } => {
                let a = mem.allocs.get(&dptr).ok_or(INVALID_VALUE)?;
                used[a.phys] -= a.size.min(used[a.phys]);
            }
            Node::Kernel { .. } | Node::Memset { .. } | Node::Other => {}
        }
    }
    let mut charged = Vec::new();
    for (phys, &p) in peak.iter().enumerate() {
        let gm = &objs.graph_mem[phys];
        if p > gm.reserved {
            let grow = round_up(p - gm.reserved, POOL_CHUNK);
            if let Err(e) = d.charge(phys, grow) {
                for (ph, g) in charged { d.refund(ph, g); }
                return Err(e);
            }
            charged.push((phys, grow));
        }
    }
    for (phys, grow) in charged {
        let gm = &mut objs.graph_mem[phys];
        gm.reserved += grow;
        gm.reserved_high = gm.reserved_high.max(gm.reserved);
    }
    for n in &nodes {
        match *n {
            Node::Alloc { dptr, .. } | Node::Free { dptr } => {
                let a = mem.allocs.get_mut(&dptr).unwrap();
                a.live = matches!(n, Node::Alloc { .. });
            }
            Node::Kernel { .. } | Node::Memset { .. } | Node::Other => {}
        }
    }
    for (phys, u) in used.into_iter().enumerate() {
        let gm = &mut objs.graph_mem[phys];
        gm.used = u;
        gm.used_high = gm.used_high.max(peak[phys]);
    }
    // Each kernel node is one kernel of the timeline, and so is each empty node (graphs of empty nodes
    // stand for kernels); a graph of neither costs one.
    let kernels = nodes.iter().filter(|n| matches!(n, Node::Kernel { .. } | Node::Other)).count() as u64;
    drop(mem);
    drop(objs);
    for n in &nodes { run_memset(d, n)?; }
    crate::timeline::run(&d.shared, on, stream as u64, kernels.max(1));
    Ok(())
}

fn cuDeviceGetGraphMemAttribute(dev: CUdevice, attr: c_int, value: *mut u64) {
    let d = drv()?;
    let phys = d.phys(dev)?;
    let objs = lock(&d.objs);
    let gm = &objs.graph_mem[phys];
    out(value, match attr { 0 => gm.used, 1 => gm.used_high, 2 => gm.reserved, 3 => gm.reserved_high, _ => return Err(INVALID_VALUE) })
}

fn cuDeviceSetGraphMemAttribute(dev: CUdevice, attr: c_int, _value: *mut u64) {
    let d = drv()?;
    let phys = d.phys(dev)?;
    let mut objs = lock(&d.objs);
    let gm = &mut objs.graph_mem[phys];
    match attr { 1 => gm.used_high = gm.used, 3 => gm.reserved_high = gm.reserved, _ => return Err(INVALID_VALUE) }
    Ok(())
}

fn cuDeviceGraphMemTrim(dev: CUdevice) {
    let d = drv()?;
    let phys = d.phys(dev)?;
    let mut objs = lock(&d.objs);
    let gm = &mut objs.graph_mem[phys];
    let keep = round_up(gm.used, POOL_CHUNK);
    if gm.reserved > keep {
        d.refund(phys, gm.reserved - keep);
        gm.reserved = keep;
    }
    Ok(())
}
}

cu_alias! {
    cuGraphLaunch_ptsz => cuGraphLaunch(exec: Handle, stream: Handle);
}
