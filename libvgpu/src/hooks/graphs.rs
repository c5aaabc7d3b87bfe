//! Graph memory: the allocation nodes of CUDA graphs, charged when an instantiated graph is launched or
//! uploaded, reconciled with the device's graph reservation, refunded by `cuDeviceGraphMemTrim`.
//! Allocations captured from streams become such nodes (`pools` leaves them to this module).
//!
//! Graph allocations come from a per-device reservation the driver grows at launch/upload. At instantiate
//! we sum the graph's memory-alloc nodes; a launch first charges what of that does not fit in the
//! reservation's unused part (refusing the launch with out-of-memory when over quota), then the charge is
//! set to the real RESERVED_MEM_CURRENT. cuDeviceGraphMemTrim refunds what the reservation shrinks by.
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_void};

use vgpu_ledger::Kind;

use super::{engine, hook, Engine, Target};
use crate::driver::Driver;
use crate::error::Error;
use crate::ffi::*;
use crate::quota::DeviceQuota;
use crate::real::forward;
use crate::records::GraphDev;

impl<D: Driver> Engine<'_, D> {
    /// Sum of the sizes of a graph's memory-alloc nodes, child graphs included: walked with the driver's
    /// node queries, or as recorded when the nodes were added, whichever is larger.
    pub(crate) fn graph_need(&self, graph: usize) -> u64 {
        let walked = self.graph_walk(graph, 0);
        walked.max(
            self.rec
                .graph_needs
                .with(graph as u64, |n| n.copied())
                .unwrap_or(0),
        )
    }

    fn graph_walk(&self, graph: usize, depth: u32) -> u64 {
        // Child graphs nest; a bound keeps a malformed (cyclic) answer from recursing forever.
        if depth > 16 {
            return 0;
        }
        self.drv.graph_nodes(graph).map_or(0, |nodes| {
            nodes
                .into_iter()
                .map(|n| match self.drv.alloc_node_bytes(n) {
                    Some(b) => b,
                    None => self
                        .drv
                        .child_graph(n)
                        .map_or(0, |g| self.graph_walk(g, depth + 1)),
                })
                .fold(0u64, u64::saturating_add)
        })
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

    /// After cuGraphInstantiate* without upload: remember what the exec's allocation nodes need.
    pub(crate) fn graph_instantiated(&self, r: CUresult, exec: usize, graph: usize) -> CUresult {
        if r != CUDA_SUCCESS || self.drv.unlimited() {
            return r;
        }
        let Some(dev) = self.current_device() else {
            return r;
        };
        if let Target::Charge(q) = self.target(Some(dev)) {
            self.rec
                .graph_execs
                .insert(exec as u64, (dev, self.graph_need(graph)));
            self.reconcile_graph(dev, q);
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
        let Some(dev) = self.current_device() else {
            return call();
        };
        let q = match self.target(Some(dev)) {
            Target::Charge(q) => q,
            Target::Forward => return call(),
            Target::Fail(e) => return e.cuda(),
        };
        let need = self.graph_need(graph);
        let r = self.graph_charged(dev, q, need, call);
        if r == CUDA_SUCCESS {
            self.rec.graph_execs.insert(exec() as u64, (dev, need));
        }
        r
    }

    /// A launch or upload of `exec`: pre-charge what its allocations may add, run, then settle to the truth.
    pub(crate) fn graph_run(&self, exec: usize, call: impl FnOnce() -> CUresult) -> CUresult {
        let Some((dev, need)) = self.rec.graph_execs.with(exec as u64, |e| e.copied()) else {
            return call();
        };
        let Target::Charge(q) = self.target(Some(dev)) else {
            return call();
        };
        self.graph_charged(dev, q, need, call)
    }

    /// Runs `call`, which may make the driver reserve up to `need` bytes of graph memory on `dev`: charges
    /// beforehand what the unused reservation cannot cover (less what other launches in progress need),
    /// refusing with out-of-memory past the quota, then settles to the real reservation.
    fn graph_charged(
        &self,
        dev: CUdevice,
        q: &DeviceQuota,
        need: u64,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let attr = |a| self.drv.graph_mem_attr(dev, a).unwrap_or(0);
        let reserved = attr(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT);
        let used = attr(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT);
        let extra = self
            .rec
            .graph_dev
            .update(dev as u64, GraphDev::default, |g| {
                let unused = reserved.saturating_sub(used).saturating_sub(g.inflight);
                let extra = need.saturating_sub(unused);
                if !q.charge(Kind::Graph, extra) {
                    return None;
                }
                g.charged += extra;
                g.inflight += need;
                g.inflight_extra += extra;
                Some(extra)
            });
        let Some(extra) = extra else {
            return Error::OutOfMemory.cuda();
        };
        let r = call();
        self.rec
            .graph_dev
            .update(dev as u64, GraphDev::default, |g| {
                g.inflight = g.inflight.saturating_sub(need);
                g.inflight_extra = g.inflight_extra.saturating_sub(extra);
            });
        self.reconcile_graph(dev, q);
        r
    }
}

fn instantiated(r: CUresult, exec: *mut CUgraphExec, graph: CUgraph) -> CUresult {
    if r != CUDA_SUCCESS || exec.is_null() {
        return r;
    }
    // SAFETY: non-null, written by the driver, which succeeded.
    engine().graph_instantiated(r, unsafe { *exec } as usize, graph as usize)
}

hook!(cuGraphAddMemAllocNode(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, n: usize, params: *mut CUDA_MEM_ALLOC_NODE_PARAMS) {
    let r = forward!("cuGraphAddMemAllocNode", fn(*mut CUgraphNode, CUgraph, *const CUgraphNode, usize, *mut CUDA_MEM_ALLOC_NODE_PARAMS), node, graph, deps, n, params);
    let e = engine();
    if r == CUDA_SUCCESS && !params.is_null() && !e.drv.unlimited() {
        // SAFETY: non-null, accepted by the driver.
        let bytes = unsafe { (*params).bytesize } as u64;
        e.rec.graph_needs.update(graph as u64, || 0, |b| *b = b.saturating_add(bytes));
    }
    r
});
hook!(cuGraphDestroy(graph: CUgraph) {
    let r = forward!("cuGraphDestroy", fn(CUgraph), graph);
    if r == CUDA_SUCCESS { engine().rec.graph_needs.remove(graph as u64); }
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
    engine().graph_instantiate_upload(graph as usize, call, || unsafe { *exec } as usize)
}

hook!(cuGraphInstantiateWithParams(exec: *mut CUgraphExec, graph: CUgraph, params: *mut c_void) {
    instantiate_with_params(exec, graph, params, || forward!("cuGraphInstantiateWithParams", fn(*mut CUgraphExec, CUgraph, *mut c_void), exec, graph, params))
});
hook!(cuGraphInstantiateWithParams_ptsz(exec: *mut CUgraphExec, graph: CUgraph, params: *mut c_void) {
    instantiate_with_params(exec, graph, params, || forward!("cuGraphInstantiateWithParams_ptsz", fn(*mut CUgraphExec, CUgraph, *mut c_void), exec, graph, params))
});

hook!(cuGraphLaunch(exec: CUgraphExec, s: CUstream) {
    engine().graph_run(exec as usize, || forward!("cuGraphLaunch", fn(CUgraphExec, CUstream), exec, s))
});
hook!(cuGraphLaunch_ptsz(exec: CUgraphExec, s: CUstream) {
    engine().graph_run(exec as usize, || forward!("cuGraphLaunch_ptsz", fn(CUgraphExec, CUstream), exec, s))
});
hook!(cuGraphUpload(exec: CUgraphExec, s: CUstream) {
    engine().graph_run(exec as usize, || forward!("cuGraphUpload", fn(CUgraphExec, CUstream), exec, s))
});
hook!(cuGraphUpload_ptsz(exec: CUgraphExec, s: CUstream) {
    engine().graph_run(exec as usize, || forward!("cuGraphUpload_ptsz", fn(CUgraphExec, CUstream), exec, s))
});
hook!(cuGraphExecDestroy(exec: CUgraphExec) {
    let r = forward!("cuGraphExecDestroy", fn(CUgraphExec), exec);
    if r == CUDA_SUCCESS { engine().rec.graph_execs.remove(exec as u64); }
    r
});
hook!(cuDeviceGraphMemTrim(dev: CUdevice) {
    let r = forward!("cuDeviceGraphMemTrim", fn(CUdevice), dev);
    let e = engine();
    if r == CUDA_SUCCESS && !e.drv.unlimited() {
        if let Some(q) = e.quota_of(dev) { e.reconcile_graph(dev, q); }
    }
    r
});

#[cfg(test)]
mod tests {
    use super::super::testing::World;
    use super::*;

    const GRAPH: usize = 0x600;
    const EXEC: usize = 0x700;

    /// A graph with two allocation nodes (300 + 200) and one other node.
    fn graph(w: &World) {
        w.fake.graphs.borrow_mut().insert(GRAPH, vec![1, 2, 3]);
        w.fake.alloc_nodes.borrow_mut().extend([(1, 300), (3, 200)]);
        w.fake.graph_mem.borrow_mut().insert(0, (0, 0));
    }

    #[test]
    fn the_need_is_the_walk_or_what_was_added_whichever_is_larger() {
        let w = World::new(1000);
        graph(&w);
        let e = w.engine();
        assert_eq!(e.graph_need(GRAPH), 500);
        w.rec.graph_needs.insert(GRAPH as u64, 800);
        assert_eq!(e.graph_need(GRAPH), 800);
        assert_eq!(e.graph_need(0x999), 0, "an unknown graph needs nothing");
    }

    #[test]
    fn a_launch_charges_the_need_then_settles_to_the_reservation() {
        let w = World::new(1000);
        graph(&w);
        let e = w.engine();
        assert_eq!(
            e.graph_instantiated(CUDA_SUCCESS, EXEC, GRAPH),
            CUDA_SUCCESS
        );
        let r = e.graph_run(EXEC, || {
            // the driver reserves 512 for the 500 the graph allocates
            w.fake.graph_mem.borrow_mut().insert(0, (512, 500));
            assert_eq!(w.usage(Kind::Graph), 500, "charged before the launch");
            CUDA_SUCCESS
        });
        assert_eq!(r, CUDA_SUCCESS);
        assert_eq!(w.usage(Kind::Graph), 512);
        // a relaunch inside the reservation charges nothing more
        w.fake.graph_mem.borrow_mut().insert(0, (512, 0));
        e.graph_run(EXEC, || CUDA_SUCCESS);
        assert_eq!(w.usage(Kind::Graph), 512);
    }

    #[test]
    fn a_launch_while_another_is_pending_is_charged_on_top_never_under() {
        let w = World::new(800);
        graph(&w);
        let e = w.engine();
        e.graph_instantiated(CUDA_SUCCESS, EXEC, GRAPH);
        e.graph_instantiated(CUDA_SUCCESS, EXEC + 1, GRAPH);
        let r = e.graph_run(EXEC, || {
            // the driver has not grown its reservation yet: the second launch cannot count on it
            assert_eq!(
                e.graph_run(EXEC + 1, || panic!("launched")),
                CUDA_ERROR_OUT_OF_MEMORY
            );
            w.fake.graph_mem.borrow_mut().insert(0, (512, 500));
            CUDA_SUCCESS
        });
        assert_eq!(r, CUDA_SUCCESS);
        assert_eq!(
            w.usage(Kind::Graph),
            512,
            "settled to the reservation once the first ran"
        );
    }

    #[test]
    fn two_launches_in_progress_never_count_the_same_unused_reservation() {
        let w = World::new(800);
        graph(&w);
        let e = w.engine();
        e.graph_instantiated(CUDA_SUCCESS, EXEC, GRAPH);
        e.graph_instantiated(CUDA_SUCCESS, EXEC + 1, GRAPH);
        // a first launch reserved 512 and finished with it: the reservation is unused
        e.graph_run(EXEC, || {
            w.fake.graph_mem.borrow_mut().insert(0, (512, 500));
            CUDA_SUCCESS
        });
        w.fake.graph_mem.borrow_mut().insert(0, (512, 0));
        assert_eq!(w.usage(Kind::Graph), 512);
        let r = e.graph_run(EXEC, || {
            // the first relaunch counts on the unused 512; a second one at the same time cannot
            assert_eq!(
                e.graph_run(EXEC + 1, || panic!("launched")),
                CUDA_ERROR_OUT_OF_MEMORY
            );
            CUDA_SUCCESS
        });
        assert_eq!(r, CUDA_SUCCESS);
        assert_eq!(w.usage(Kind::Graph), 512);
    }

    #[test]
    fn a_pre_charge_survives_another_launch_settling_meanwhile() {
        let w = World::new(2000);
        graph(&w);
        let e = w.engine();
        e.graph_instantiated(CUDA_SUCCESS, EXEC, GRAPH);
        e.graph_instantiated(CUDA_SUCCESS, EXEC + 1, GRAPH);
        e.graph_run(EXEC, || {
            // another thread's launch starts, grows the reservation and settles while this one is pending
            e.graph_run(EXEC + 1, || {
                w.fake.graph_mem.borrow_mut().insert(0, (512, 500));
                CUDA_SUCCESS
            });
            assert_eq!(
                w.usage(Kind::Graph),
                1012,
                "this launch's 500 stays charged beside the 512 reserved"
            );
            w.fake.graph_mem.borrow_mut().insert(0, (1024, 1000));
            CUDA_SUCCESS
        });
        assert_eq!(w.usage(Kind::Graph), 1024);
    }

    #[test]
    fn child_graphs_are_walked() {
        let w = World::new(1000);
        graph(&w);
        w.fake.graphs.borrow_mut().insert(0x900, vec![9, 10]);
        w.fake.child_graphs.borrow_mut().insert(10, GRAPH);
        w.fake.alloc_nodes.borrow_mut().insert(9, 100);
        assert_eq!(w.engine().graph_need(0x900), 600);
    }

    #[test]
    fn an_upload_at_instantiation_is_charged_before_the_driver_reserves() {
        let w = World::new(400);
        graph(&w);
        let e = w.engine();
        let r = e.graph_instantiate_upload(GRAPH, || panic!("instantiated"), || EXEC);
        assert_eq!(r, CUDA_ERROR_OUT_OF_MEMORY, "500 needed under a 400 quota");
        let w = World::new(1000);
        graph(&w);
        let e = w.engine();
        let r = e.graph_instantiate_upload(
            GRAPH,
            || {
                assert_eq!(w.usage(Kind::Graph), 500);
                w.fake.graph_mem.borrow_mut().insert(0, (512, 0));
                CUDA_SUCCESS
            },
            || EXEC,
        );
        assert_eq!(r, CUDA_SUCCESS);
        assert_eq!(w.usage(Kind::Graph), 512);
        assert!(
            w.rec.graph_execs.with(EXEC as u64, |x| x.is_some()),
            "later launches are charged too"
        );
    }

    #[test]
    fn a_launch_over_the_quota_is_refused_before_the_driver() {
        let w = World::new(400);
        graph(&w);
        let e = w.engine();
        e.graph_instantiated(CUDA_SUCCESS, EXEC, GRAPH);
        assert_eq!(
            e.graph_run(EXEC, || panic!("launched")),
            CUDA_ERROR_OUT_OF_MEMORY
        );
        assert_eq!(w.used(), 0);
    }

    #[test]
    fn a_trim_refunds_what_the_reservation_shrinks_by() {
        let w = World::new(1000);
        graph(&w);
        let e = w.engine();
        e.graph_instantiated(CUDA_SUCCESS, EXEC, GRAPH);
        e.graph_run(EXEC, || {
            w.fake.graph_mem.borrow_mut().insert(0, (512, 0));
            CUDA_SUCCESS
        });
        w.fake.graph_mem.borrow_mut().insert(0, (0, 0));
        e.reconcile_graph(0, w.q);
        assert_eq!(w.used(), 0);
    }

    #[test]
    fn execs_not_instantiated_under_a_quota_pass_through() {
        let w = World::new(10);
        let e = w.engine();
        assert_eq!(e.graph_run(0x1234, || CUDA_SUCCESS), CUDA_SUCCESS);
        assert_eq!(
            e.graph_instantiated(CUDA_ERROR_INVALID_VALUE, EXEC, GRAPH),
            CUDA_ERROR_INVALID_VALUE
        );
        assert!(w.rec.graph_execs.keys().is_empty());
    }
}
