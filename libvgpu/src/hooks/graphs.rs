//! Graph memory: the allocation nodes of CUDA graphs, charged when an instantiated graph is launched or
//! uploaded, reconciled with the device's graph reservation, refunded by `cuDeviceGraphMemTrim`.
//! Allocations captured from streams become such nodes (`pools` leaves them to this module).
//!
//! Graph allocations come from a per-device reservation the driver grows at launch/upload. At instantiate
//! we sum the graph's memory-alloc nodes; a launch first charges what of that does not fit in the
//! reservation's unused part (refusing the launch with out-of-memory when over quota), then the charge is
//! set to the real RESERVED_MEM_CURRENT. cuDeviceGraphMemTrim refunds what the reservation shrinks by.
#![allow(clippy::missing_safety_doc)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{c_char, c_int, c_void};

use vgpu_ledger::Kind;

use super::common::{hook, interposer, Interposer, Target};
use crate::compute;
use crate::driver::{Driver, Place};
use crate::error::Error;
use crate::ffi::*;
use crate::launch_charge::Composition;
use crate::quota::DeviceQuota;
use crate::real_symbols::forward;
use crate::records::{GraphDev, Needs, UNPLACED};

impl<D: Driver> Interposer<'_, D> {
    /// What a graph's memory-allocation nodes can hold at once on each device (child graphs included),
    /// each node on its pool's location: from the driver's node queries when they answer, else the sums
    /// recorded as the nodes were added.
    pub(crate) fn graph_needs(&self, graph: usize) -> Needs {
        let needs = self.graph_walk(graph, 0).unwrap_or_else(|| {
            self.rec
                .graph_needs
                .with(graph as u64, |n| n.cloned())
                .unwrap_or_default()
        });
        needs.into_iter().filter(|&(_, b)| b > 0).collect()
    }

    /// What a graph needs on all devices together.
    #[cfg(test)]
    pub(crate) fn graph_need(&self, graph: usize) -> u64 {
        self.graph_needs(graph).iter().map(|n| n.1).sum()
    }

    fn graph_walk(&self, graph: usize, depth: u32) -> Option<Needs> {
        // Child graphs nest; a bound keeps a malformed (cyclic) answer from recursing forever.
        if depth > 16 {
            return None;
        }
        let nodes = self.drv.graph_nodes(graph)?;
        let mut allocs: BTreeMap<CUdevice, Vec<(usize, u64, u64)>> = BTreeMap::new();
        let mut frees = HashMap::new();
        let mut needs: BTreeMap<CUdevice, u64> = BTreeMap::new();
        for &n in &nodes {
            if let Some((bytes, ptr, place)) = self.drv.alloc_node(n) {
                let dev = match place {
                    Place::Device(d) => d,
                    Place::Host => continue,
                    Place::Unknown => UNPLACED,
                };
                allocs.entry(dev).or_default().push((n, bytes, ptr));
            } else if let Some(ptr) = self.drv.free_node(n) {
                frees.insert(ptr, n);
            } else if let Some(g) = self.drv.child_graph(n) {
                // a child graph's memory is counted as live for the whole graph
                for (dev, b) in self.graph_walk(g, depth + 1)? {
                    let e = needs.entry(dev).or_default();
                    *e = e.saturating_add(b);
                }
            }
        }
        let mut succ: HashMap<usize, Vec<usize>> = HashMap::new();
        let mut ordered = true;
        for &n in &nodes {
            match self.drv.node_dependencies(n) {
                Some(deps) => deps
                    .into_iter()
                    .for_each(|d| succ.entry(d).or_default().push(n)),
                None => ordered = false,
            }
        }
        // Each device's allocations hold its memory only: their peaks are per device.
        for (dev, list) in allocs {
            let lives: Vec<Lifetime> = list
                .into_iter()
                .map(|(node, bytes, ptr)| Lifetime {
                    node,
                    bytes,
                    freed_by: frees.get(&ptr).copied(),
                })
                .collect();
            let need = if ordered {
                peak(&lives, &succ)
            } else {
                lives.iter().fold(0u64, |a, l| a.saturating_add(l.bytes))
            };
            let e = needs.entry(dev).or_default();
            *e = e.saturating_add(need);
        }
        Some(needs.into_iter().collect())
    }

    /// Sets the device's graph charge to its real reservation, plus what launches still in progress
    /// pre-charged beyond it.
    pub(crate) fn reconcile_graph(&self, dev: CUdevice, q: &DeviceQuota) {
        let Some(reserved) = self
            .drv
            .graph_mem_attr(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT)
        else {
            return;
        };
        self.rec
            .graph_dev
            .update(dev as u64, GraphDev::default, |g| {
                let want = reserved.saturating_add(g.inflight_extra);
                if want > g.charged {
                    q.charge_forced(Kind::Graph, want - g.charged);
                } else {
                    q.refund(Kind::Graph, g.charged - want);
                }
                g.charged = want;
            });
    }

    /// The quotas a graph's needs are charged to, or how the call must end: the refusal of a device that
    /// cannot be told or whose quota cannot be used.
    fn graph_targets(
        &self,
        needs: &Needs,
    ) -> Result<Vec<(CUdevice, &'static DeviceQuota, u64)>, CUresult> {
        let mut out = Vec::new();
        for &(dev, need) in needs {
            if dev == UNPLACED {
                return Err(self.unresolved("a graph allocation node", need));
            }
            match self.target(Some(dev)) {
                Target::Charge(q) => out.push((dev, q, need)),
                Target::Forward => {}
                Target::Fail(e) => return Err(e.cuda()),
            }
        }
        Ok(out)
    }

    /// After cuGraphInstantiate* without upload: remember what the exec's allocation nodes need.
    pub(crate) fn graph_instantiated(&self, r: CUresult, exec: usize, graph: usize) -> CUresult {
        if r != CUDA_SUCCESS || self.drv.unlimited() {
            return r;
        }
        let needs = self.graph_needs(graph);
        for &(dev, _) in &needs {
            if let Some(q) = self.quota_of(dev) {
                self.reconcile_graph(dev, q);
            }
        }
        // A graph without memory nodes costs its launches nothing here (no record to look up).
        if !needs.is_empty() {
            self.rec.graph_execs.insert(exec as u64, needs);
        }
        r
    }

    /// cuGraphInstantiateWithParams with CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD: the driver reserves the
    /// graph's memory at instantiation, so it is charged like a launch, before the call. `exec` reads
    /// the exec the driver wrote.
    pub(crate) fn graph_instantiate_upload(
        &self,
        graph: usize,
        call: impl FnOnce() -> CUresult,
        exec: impl FnOnce() -> usize,
    ) -> CUresult {
        if self.drv.unlimited() {
            return call();
        }
        let needs = self.graph_needs(graph);
        let r = self.graph_charged(&needs, call);
        if r == CUDA_SUCCESS && !needs.is_empty() {
            self.rec.graph_execs.insert(exec() as u64, needs);
        }
        r
    }

    /// A launch or upload of `exec`: pre-charge what its allocations may add, run, then settle to the truth.
    pub(crate) fn graph_run(&self, exec: usize, call: impl FnOnce() -> CUresult) -> CUresult {
        let Some(needs) = self.rec.graph_execs.with(exec as u64, |e| e.cloned()) else {
            return call();
        };
        self.graph_charged(&needs, call)
    }

    /// Runs `call`, which may make the driver reserve up to each device's need of graph memory: charges
    /// beforehand, on each device, what its unused reservation cannot cover (less what other launches in
    /// progress need), refusing with out-of-memory when any device's quota would be passed (what the
    /// others were pre-charged goes back), then settles each device to its real reservation.
    fn graph_charged(&self, needs: &Needs, call: impl FnOnce() -> CUresult) -> CUresult {
        let targets = match self.graph_targets(needs) {
            Ok(t) => t,
            Err(r) => return r,
        };
        let mut held = Vec::with_capacity(targets.len());
        for &(dev, q, need) in &targets {
            let mut extra = self.graph_precharge(dev, q, need, false);
            if extra.is_none() {
                self.reclaim_pools(q, 0);
                extra = self.graph_precharge(dev, q, need, true);
            }
            match extra {
                Some(extra) => held.push((dev, q, need, extra)),
                None => {
                    held.into_iter().for_each(|h| self.graph_settle(h));
                    return Error::OutOfMemory.cuda();
                }
            }
        }
        let r = call();
        held.into_iter().for_each(|h| self.graph_settle(h));
        r
    }

    /// Charges what `need` of graph memory adds on `dev` beyond its unused reservation; None past the
    /// quota (`last`: the refusal is logged).
    fn graph_precharge(
        &self,
        dev: CUdevice,
        q: &DeviceQuota,
        need: u64,
        last: bool,
    ) -> Option<u64> {
        let attr = |a| self.drv.graph_mem_attr(dev, a).unwrap_or(0);
        let reserved = attr(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT);
        let used = attr(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT);
        self.rec
            .graph_dev
            .update(dev as u64, GraphDev::default, |g| {
                let unused = reserved.saturating_sub(used).saturating_sub(g.inflight);
                let extra = need.saturating_sub(unused);
                let ok = if last {
                    q.charge(Kind::Graph, extra)
                } else {
                    q.try_charge(Kind::Graph, extra) == Some(true)
                };
                if !ok {
                    return None;
                }
                g.charged += extra;
                g.inflight += need;
                g.inflight_extra += extra;
                Some(extra)
            })
    }

    /// A launch on `dev` is over (run or refused): its pre-charge gives way to the real reservation.
    fn graph_settle(&self, (dev, q, need, extra): (CUdevice, &DeviceQuota, u64, u64)) {
        self.rec
            .graph_dev
            .update(dev as u64, GraphDev::default, |g| {
                g.inflight = g.inflight.saturating_sub(need);
                g.inflight_extra = g.inflight_extra.saturating_sub(extra);
            });
        self.reconcile_graph(dev, q);
    }
}

/// A graph allocation: its node, its size and the node that frees it in the graph (None: freed after the
/// graph, or never by it).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Lifetime {
    pub node: usize,
    pub bytes: u64,
    pub freed_by: Option<usize>,
}

/// The most a graph's allocations can hold at once, from their lifetimes and the graph's edges (`succ`:
/// node -> the nodes depending on it): the largest of, for each allocation, its size plus every
/// allocation that may be live with it. Two cannot be live together when one is freed on every path
/// before the other is allocated. Never below the real peak; equal to it for chains (four sequential
/// 400 MiB alloc/free pairs need 400 MiB, not 1600) and for independent branches (their sum).
pub(crate) fn peak(lives: &[Lifetime], succ: &HashMap<usize, Vec<usize>>) -> u64 {
    let index: HashMap<usize, usize> = lives.iter().enumerate().map(|(i, l)| (l.node, i)).collect();
    // after[i][j]: allocation j is made after allocation i is freed (one row per allocation: the graph's
    // other nodes are not kept, so a large captured graph costs allocations², not nodes²).
    let after: Vec<Vec<bool>> = lives
        .iter()
        .map(|l| {
            let mut row = vec![false; lives.len()];
            if let Some(f) = l.freed_by {
                descendants(f, succ)
                    .into_iter()
                    .filter_map(|n| index.get(&n))
                    .for_each(|&j| row[j] = true);
            }
            row
        })
        .collect();
    (0..lives.len())
        .map(|i| {
            (0..lives.len())
                .filter(|&j| j == i || !(after[i][j] || after[j][i]))
                .fold(0u64, |a, j| a.saturating_add(lives[j].bytes))
        })
        .max()
        .unwrap_or(0)
}

fn descendants(from: usize, succ: &HashMap<usize, Vec<usize>>) -> HashSet<usize> {
    let mut seen = HashSet::new();
    let mut todo = vec![from];
    while let Some(n) = todo.pop() {
        for &m in succ.get(&n).into_iter().flatten() {
            if seen.insert(m) {
                todo.push(m);
            }
        }
    }
    seen
}

fn instantiated(r: CUresult, exec: *mut CUgraphExec, graph: CUgraph) -> CUresult {
    if r != CUDA_SUCCESS || exec.is_null() {
        return r;
    }
    // SAFETY: non-null, written by the driver, which succeeded.
    let exec = unsafe { *exec } as usize;
    composed(exec, graph as usize);
    interposer().graph_instantiated(r, exec, graph as usize)
}

impl<D: Driver> Interposer<'_, D> {
    /// What `graph` runs, for the compute share's solo time of its execs (`solo`).
    pub(crate) fn graph_composition(&self, graph: usize) -> Composition {
        crate::launch_charge::compose(graph, &|g| self.drv.graph_nodes(g), &|n| {
            self.drv.node_work(n)
        })
    }
}

/// Under a compute share: records what the exec instantiated (or updated) from `graph` runs. Driver
/// calls only, no lock held; nothing at all without a share.
fn composed(exec: usize, graph: usize) {
    if !compute::off() {
        compute::graph_composed(exec, interposer().graph_composition(graph));
    }
}

/// Under a compute share: the exec's nodes changed after instantiation (their parameters, or a child
/// graph's): what it runs is no longer known.
fn reparametrised(r: CUresult, exec: CUgraphExec) -> CUresult {
    if r == CUDA_SUCCESS && !compute::off() {
        compute::graph_reparametrised(exec as usize);
    }
    r
}

hook!(cuGraphAddMemAllocNode(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, n: usize, params: *mut CUDA_MEM_ALLOC_NODE_PARAMS) {
    let r = forward!("cuGraphAddMemAllocNode", fn(*mut CUgraphNode, CUgraph, *const CUgraphNode, usize, *mut CUDA_MEM_ALLOC_NODE_PARAMS), node, graph, deps, n, params);
    let e = interposer();
    if r == CUDA_SUCCESS && !params.is_null() && !e.drv.unlimited() {
        // SAFETY: non-null, accepted by the driver.
        let (bytes, place) = unsafe { ((*params).bytesize as u64, crate::driver::alloc_node_place(&*params)) };
        let dev = match place { Place::Device(d) => d, Place::Host => return r, Place::Unknown => UNPLACED };
        e.rec.graph_needs.update(graph as u64, Vec::new, |n| match n.iter_mut().find(|x| x.0 == dev) {
            Some(x) => x.1 = x.1.saturating_add(bytes),
            None => n.push((dev, bytes)),
        });
    }
    r
});
hook!(cuGraphDestroy(graph: CUgraph) {
    let r = forward!("cuGraphDestroy", fn(CUgraph), graph);
    if r == CUDA_SUCCESS { interposer().rec.graph_needs.remove(graph as u64); }
    r
});

hook!(cuGraphInstantiateWithFlags(exec: *mut CUgraphExec, graph: CUgraph, flags: u64) {
    instantiated(forward!("cuGraphInstantiateWithFlags", fn(*mut CUgraphExec, CUgraph, u64), exec, graph, flags), exec, graph)
});
hook!(cuGraphInstantiate_v2(exec: *mut CUgraphExec, graph: CUgraph, err: *mut CUgraphNode, log_buf: *mut c_char, size: usize) {
    instantiated(forward!("cuGraphInstantiate_v2", fn(*mut CUgraphExec, CUgraph, *mut CUgraphNode, *mut c_char, usize), exec, graph, err, log_buf, size), exec, graph)
});
hook!(cuGraphInstantiate(exec: *mut CUgraphExec, graph: CUgraph, err: *mut CUgraphNode, log_buf: *mut c_char, size: usize) {
    instantiated(forward!("cuGraphInstantiate", fn(*mut CUgraphExec, CUgraph, *mut CUgraphNode, *mut c_char, usize), exec, graph, err, log_buf, size), exec, graph)
});
/// cuGraphInstantiateWithParams[_ptsz]: with the upload flag the reservation happens inside the call.
fn instantiate_with_params(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    params: *mut c_void,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    // SAFETY: when non-null, `params` is the caller's CUDA_GRAPH_INSTANTIATE_PARAMS, whose first field is
    // the u64 flags.
    let upload = !params.is_null()
        && unsafe { *(params as *const u64) } & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD != 0;
    if !upload || exec.is_null() {
        return instantiated(call(), exec, graph);
    }
    // SAFETY: non-null, read only after the driver succeeded and wrote it.
    let r =
        interposer().graph_instantiate_upload(graph as usize, call, || unsafe { *exec } as usize);
    if r == CUDA_SUCCESS {
        // SAFETY: as above.
        composed(unsafe { *exec } as usize, graph as usize);
    }
    r
}

hook!(cuGraphInstantiateWithParams(exec: *mut CUgraphExec, graph: CUgraph, params: *mut c_void) {
    instantiate_with_params(exec, graph, params, || forward!("cuGraphInstantiateWithParams", fn(*mut CUgraphExec, CUgraph, *mut c_void), exec, graph, params))
});
hook!(cuGraphInstantiateWithParams_ptsz(exec: *mut CUgraphExec, graph: CUgraph, params: *mut c_void) {
    instantiate_with_params(exec, graph, params, || forward!("cuGraphInstantiateWithParams_ptsz", fn(*mut CUgraphExec, CUgraph, *mut c_void), exec, graph, params))
});

// A graph launch is work like a kernel's: under the compute share it costs its measured replay time.
hook!(cuGraphLaunch(exec: CUgraphExec, s: CUstream) {
    super::launch::launch(s, false, (exec as usize, [0; 3]), || interposer().graph_run(exec as usize, || forward!("cuGraphLaunch", fn(CUgraphExec, CUstream), exec, s)))
});
hook!(cuGraphLaunch_ptsz(exec: CUgraphExec, s: CUstream) {
    super::launch::launch(s, true, (exec as usize, [0; 3]), || interposer().graph_run(exec as usize, || forward!("cuGraphLaunch_ptsz", fn(CUgraphExec, CUstream), exec, s)))
});
hook!(cuGraphUpload(exec: CUgraphExec, s: CUstream) {
    interposer().graph_run(exec as usize, || forward!("cuGraphUpload", fn(CUgraphExec, CUstream), exec, s))
});
hook!(cuGraphUpload_ptsz(exec: CUgraphExec, s: CUstream) {
    interposer().graph_run(exec as usize, || forward!("cuGraphUpload_ptsz", fn(CUgraphExec, CUstream), exec, s))
});
hook!(cuGraphExecDestroy(exec: CUgraphExec) {
    let r = forward!("cuGraphExecDestroy", fn(CUgraphExec), exec);
    if r == CUDA_SUCCESS {
        interposer().rec.graph_execs.remove(exec as u64);
        if !compute::off() { compute::forget_graph(exec as usize); }
    }
    r
});
// The compute share's view of what an exec runs follows its updates (`solo`); these only serve it.
hook!(cuGraphExecUpdate(exec: CUgraphExec, graph: CUgraph, err_node: *mut CUgraphNode, result: *mut c_int) {
    let r = forward!("cuGraphExecUpdate", fn(CUgraphExec, CUgraph, *mut CUgraphNode, *mut c_int), exec, graph, err_node, result);
    if r == CUDA_SUCCESS { composed(exec as usize, graph as usize); }
    r
});
hook!(cuGraphExecUpdate_v2(exec: CUgraphExec, graph: CUgraph, info: *mut c_void) {
    let r = forward!("cuGraphExecUpdate_v2", fn(CUgraphExec, CUgraph, *mut c_void), exec, graph, info);
    if r == CUDA_SUCCESS { composed(exec as usize, graph as usize); }
    r
});
hook!(cuGraphExecKernelNodeSetParams(exec: CUgraphExec, node: CUgraphNode, params: *const c_void) {
    reparametrised(forward!("cuGraphExecKernelNodeSetParams", fn(CUgraphExec, CUgraphNode, *const c_void), exec, node, params), exec)
});
hook!(cuGraphExecKernelNodeSetParams_v2(exec: CUgraphExec, node: CUgraphNode, params: *const c_void) {
    reparametrised(forward!("cuGraphExecKernelNodeSetParams_v2", fn(CUgraphExec, CUgraphNode, *const c_void), exec, node, params), exec)
});
hook!(cuGraphExecNodeSetParams(exec: CUgraphExec, node: CUgraphNode, params: *mut c_void) {
    reparametrised(forward!("cuGraphExecNodeSetParams", fn(CUgraphExec, CUgraphNode, *mut c_void), exec, node, params), exec)
});
hook!(cuGraphExecChildGraphNodeSetParams(exec: CUgraphExec, node: CUgraphNode, child: CUgraph) {
    reparametrised(forward!("cuGraphExecChildGraphNodeSetParams", fn(CUgraphExec, CUgraphNode, CUgraph), exec, node, child), exec)
});
hook!(cuDeviceGraphMemTrim(dev: CUdevice) {
    let r = forward!("cuDeviceGraphMemTrim", fn(CUdevice), dev);
    let e = interposer();
    if r == CUDA_SUCCESS && !e.drv.unlimited() {
        if let Some(q) = e.quota_of(dev) { e.reconcile_graph(dev, q); }
    }
    r
});

#[cfg(test)]
mod placed_tests;
#[cfg(test)]
mod tests;
