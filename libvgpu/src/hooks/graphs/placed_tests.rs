//! Graph memory charged per device from each allocation node's pool location, whichever context
//! instantiated or launches the graph (issue 23 item 2).

use super::super::testing::World;
use super::*;
use crate::driver::Place;

const MIB: u64 = 1 << 20;
const GRAPH: usize = 0x1600;
const EXEC: usize = 0x1700;

/// A graph of `nodes` allocation nodes of `bytes` each on `place` (node handles from 0x10).
fn graph(w: &World, nodes: usize, bytes: u64, place: Place) {
    let ids: Vec<usize> = (0x10..0x10 + nodes).collect();
    w.fake.graphs.borrow_mut().insert(GRAPH, ids.clone());
    for n in ids {
        w.fake.alloc_nodes.borrow_mut().insert(n, bytes);
        w.fake.node_places.borrow_mut().insert(n, place);
    }
    w.fake.graph_mem.borrow_mut().insert(0, (0, 0));
    w.fake.graph_mem.borrow_mut().insert(1, (0, 0));
}

// Regression (issue 23 item 2): four 600 MiB allocation nodes placed on device 1, instantiated from
// device 0's context: device 1 held 2,656 MiB while its quota view said 256 MiB.
#[test]
fn nodes_on_another_device_are_held_to_that_devices_quota() {
    let w = World::new(4096 * MIB);
    let (q1, _) = w.add_device(1, 1024 * MIB);
    graph(&w, 4, 600 * MIB, Place::Device(1));
    let e = w.interposer();
    assert_eq!(
        e.graph_instantiated(CUDA_SUCCESS, EXEC, GRAPH),
        CUDA_SUCCESS
    );
    assert_eq!(
        e.graph_run(EXEC, || panic!("launched past device 1's quota")),
        CUDA_ERROR_OUT_OF_MEMORY
    );
    assert_eq!((w.used(), q1.used()), (0, 0));
}

#[test]
fn each_device_is_charged_its_own_nodes_and_settled_to_its_own_reservation() {
    let w = World::new(1024 * MIB);
    let (q1, _) = w.add_device(1, 1024 * MIB);
    graph(&w, 2, 300 * MIB, Place::Device(1));
    w.fake
        .graphs
        .borrow_mut()
        .get_mut(&GRAPH)
        .unwrap()
        .push(0x30);
    w.fake.alloc_nodes.borrow_mut().insert(0x30, 100 * MIB);
    w.fake
        .node_places
        .borrow_mut()
        .insert(0x30, Place::Device(0));
    // no context current at all: the nodes say where
    w.fake.set_current(0);
    let e = w.interposer();
    e.graph_instantiated(CUDA_SUCCESS, EXEC, GRAPH);
    let r = e.graph_run(EXEC, || {
        assert_eq!((w.used(), q1.used()), (100 * MIB, 600 * MIB));
        w.fake
            .graph_mem
            .borrow_mut()
            .insert(1, (608 * MIB, 600 * MIB));
        w.fake
            .graph_mem
            .borrow_mut()
            .insert(0, (128 * MIB, 100 * MIB));
        CUDA_SUCCESS
    });
    assert_eq!(r, CUDA_SUCCESS);
    assert_eq!((w.used(), q1.used()), (128 * MIB, 608 * MIB));
    // device 1's trim refunds device 1
    w.fake.graph_mem.borrow_mut().insert(1, (0, 0));
    e.reconcile_graph(1, q1);
    assert_eq!((w.used(), q1.used()), (128 * MIB, 0));
}

#[test]
fn a_refusal_on_one_device_gives_back_what_another_was_precharged() {
    let w = World::new(1024 * MIB);
    let (q1, _) = w.add_device(1, 512 * MIB);
    graph(&w, 1, 600 * MIB, Place::Device(1));
    w.fake
        .graphs
        .borrow_mut()
        .get_mut(&GRAPH)
        .unwrap()
        .push(0x30);
    w.fake.alloc_nodes.borrow_mut().insert(0x30, 100 * MIB);
    let e = w.interposer();
    e.graph_instantiated(CUDA_SUCCESS, EXEC, GRAPH);
    assert_eq!(
        e.graph_run(EXEC, || panic!("launched")),
        CUDA_ERROR_OUT_OF_MEMORY
    );
    assert_eq!((w.used(), q1.used()), (0, 0));
}

#[test]
fn what_was_added_is_kept_per_device_when_the_nodes_cannot_be_walked() {
    let w = World::new(1024 * MIB);
    let (q1, _) = w.add_device(1, 512 * MIB);
    w.rec.graph_needs.insert(GRAPH as u64, vec![(1, 600 * MIB)]);
    w.fake.graph_mem.borrow_mut().insert(1, (0, 0));
    let e = w.interposer();
    e.graph_instantiated(CUDA_SUCCESS, EXEC, GRAPH);
    assert_eq!(
        e.graph_run(EXEC, || panic!("launched")),
        CUDA_ERROR_OUT_OF_MEMORY
    );
    assert_eq!((w.used(), q1.used()), (0, 0));
}

// Issue 23 item 11: a node whose pool location the driver does not give is refused under a limit.
#[test]
fn a_node_whose_device_cannot_be_told_is_refused() {
    let w = World::new(1024 * MIB);
    graph(&w, 1, MIB, Place::Unknown);
    let e = w.interposer();
    e.graph_instantiated(CUDA_SUCCESS, EXEC, GRAPH);
    assert_eq!(
        e.graph_run(EXEC, || panic!("launched")),
        CUDA_ERROR_OUT_OF_MEMORY
    );
}
