//! The graph policy on the fake driver: needs from the walk (peaks, child graphs), launches in progress,
//! uploads at instantiation, trims. The policy itself is in `hooks/graphs.rs`.

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
fn the_need_is_the_walk_else_what_was_added() {
    let w = World::new(1000);
    graph(&w);
    w.rec.graph_needs.insert(GRAPH as u64, vec![(0, 800)]);
    let e = w.interposer();
    assert_eq!(
        e.graph_need(GRAPH),
        500,
        "no edges to be had: the sum of the walked nodes"
    );
    w.rec.graph_needs.insert(0x999, vec![(0, 700)]);
    assert_eq!(
        e.graph_need(0x999),
        700,
        "nodes cannot be asked: what was added"
    );
    assert_eq!(e.graph_need(0x998), 0, "an unknown graph needs nothing");
}

fn life(node: usize, bytes: u64, freed_by: Option<usize>) -> Lifetime {
    Lifetime {
        node,
        bytes,
        freed_by,
    }
}

fn edges(e: &[(usize, usize)]) -> HashMap<usize, Vec<usize>> {
    let mut m: HashMap<usize, Vec<usize>> = HashMap::new();
    e.iter().for_each(|&(a, b)| m.entry(a).or_default().push(b));
    m
}

#[test]
fn sequential_alloc_free_pairs_need_one_not_their_sum() {
    // a1 -> f1 -> a2 -> f2 -> a3 -> f3 -> a4 -> f4, 400 MiB each
    let m = 400 << 20;
    let lives = [
        life(1, m, Some(2)),
        life(3, m, Some(4)),
        life(5, m, Some(6)),
        life(7, m, Some(8)),
    ];
    let chain = edges(&[(1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (6, 7), (7, 8)]);
    assert_eq!(peak(&lives, &chain), m);
    // without the edges every allocation may be live at once
    assert_eq!(peak(&lives, &HashMap::new()), 4 * m);
}

#[test]
fn branches_and_allocations_freed_outside_count_together() {
    // root 0 -> (a1 -> f1) and (a3 -> f3) in parallel, then a5 after both frees, a6 never freed
    let lives = [
        life(1, 100, Some(2)),
        life(3, 200, Some(4)),
        life(5, 50, Some(9)),
        life(6, 10, None),
    ];
    let g = edges(&[
        (0, 1),
        (1, 2),
        (0, 3),
        (3, 4),
        (2, 5),
        (4, 5),
        (5, 9),
        (0, 6),
    ]);
    // a6 may be live with each of the others, which are not all live at once: the bound says 360
    // where the real peak is 310 (both branches and a6) — above it, never below
    assert_eq!(peak(&lives, &g), 360);
    let lives = [
        life(1, 100, Some(2)),
        life(3, 200, Some(4)),
        life(5, 500, Some(9)),
    ];
    assert_eq!(peak(&lives, &g), 500, "a5 comes after both frees");
}

#[test]
fn a_walked_chain_needs_its_peak() {
    let w = World::new(1000);
    w.fake.graphs.borrow_mut().insert(0x800, vec![1, 2, 3, 4]);
    w.fake.alloc_nodes.borrow_mut().extend([(1, 400), (3, 400)]);
    w.fake.free_nodes.borrow_mut().extend([(2, 1), (4, 3)]);
    w.fake
        .deps
        .borrow_mut()
        .extend([(2, vec![1]), (3, vec![2]), (4, vec![3])]);
    assert_eq!(w.interposer().graph_need(0x800), 400);
}

#[test]
fn a_launch_charges_the_need_then_settles_to_the_reservation() {
    let w = World::new(1000);
    graph(&w);
    let e = w.interposer();
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
    let e = w.interposer();
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
    let e = w.interposer();
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
    let e = w.interposer();
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
    assert_eq!(w.interposer().graph_need(0x900), 600);
}

#[test]
fn a_child_graph_that_cannot_be_walked_falls_back_to_what_was_added() {
    let w = World::new(1000);
    w.fake.graphs.borrow_mut().insert(0x900, vec![10]);
    w.fake.child_graphs.borrow_mut().insert(10, 0x901);
    w.rec.graph_needs.insert(0x900, vec![(0, 300)]);
    assert_eq!(w.interposer().graph_need(0x900), 300);
}

#[test]
fn an_upload_at_instantiation_is_charged_before_the_driver_reserves() {
    let w = World::new(400);
    graph(&w);
    let e = w.interposer();
    let r = e.graph_instantiate_upload(GRAPH, || panic!("instantiated"), || EXEC);
    assert_eq!(r, CUDA_ERROR_OUT_OF_MEMORY, "500 needed under a 400 quota");
    let w = World::new(1000);
    graph(&w);
    let e = w.interposer();
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
    let e = w.interposer();
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
    let e = w.interposer();
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
    let e = w.interposer();
    assert_eq!(e.graph_run(0x1234, || CUDA_SUCCESS), CUDA_SUCCESS);
    assert_eq!(
        e.graph_instantiated(CUDA_ERROR_INVALID_VALUE, EXEC, GRAPH),
        CUDA_ERROR_INVALID_VALUE
    );
    assert!(w.rec.graph_execs.keys().is_empty());
}

#[test]
fn a_graphs_composition_is_its_kernels_through_child_graphs_with_memory_nodes_free() {
    use crate::launch_charge::{KernelRef, Memsets};
    let w = World::new(1000);
    graph(&w); // nodes 1 (alloc), 2 (other: free here), 3 (alloc)
    let k = KernelRef {
        func: 0x51,
        kern: 0,
        grid: [8, 1, 1],
    };
    w.fake
        .graphs
        .borrow_mut()
        .get_mut(&GRAPH)
        .unwrap()
        .extend([4, 5, 6]);
    w.fake.graphs.borrow_mut().insert(0x610, vec![7, 8]);
    w.fake
        .kernel_nodes
        .borrow_mut()
        .extend([(4, k), (5, k), (7, k), (8, k)]);
    w.fake.child_graphs.borrow_mut().insert(6, 0x610);
    let e = w.interposer();
    assert_eq!(
        e.graph_composition(GRAPH),
        Composition::Kernels(vec![(k, 4)], Memsets::default())
    );
    // A 4-byte memset before a kernel (cuBLAS's): counted, estimated at nothing.
    w.fake.memset_nodes.borrow_mut().insert(2, 4);
    assert_eq!(
        e.graph_composition(GRAPH),
        Composition::Kernels(vec![(k, 4)], Memsets { count: 1, ns: 0 })
    );
    // A copy in the child graph: the graph is not only kernels.
    w.fake.other_nodes.borrow_mut().insert(8, "a memcpy node");
    w.fake.kernel_nodes.borrow_mut().remove(&8);
    assert_eq!(
        e.graph_composition(GRAPH),
        Composition::Opaque("a memcpy node")
    );
    assert_eq!(
        e.graph_composition(0x999),
        Composition::Opaque("its nodes cannot be read")
    );
}
