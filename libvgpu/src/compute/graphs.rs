//! What the compute share notes of CUDA graphs outside the share's book: a graph exec whose node
//! parameters were set after instantiation (its composition, kept in `RECORDS.graph_work`, no longer
//! holds), and the log line that tells, once per exec, what its first charge was based on.

use crate::launch_charge::Composition;
use crate::log;
use crate::records::RECORDS;

/// Logs, once per graph exec, what its first charge was based on.
pub(super) fn tell_graph(
    exec: usize,
    elapsed: u64,
    graph: Option<&Composition>,
    solo: Option<u64>,
) {
    match (graph, solo) {
        (Some(Composition::Kernels(k, m)), Some(ns)) => log::info(format_args!(
            "compute share: graph exec {exec:#x}: {} kernel nodes and {} memset nodes ({} us estimated), solo time {} us from the kernels' own launches (first replay took {} us)",
            k.iter().map(|(_, n)| *n as u64).sum::<u64>(),
            m.count,
            m.ns / 1000,
            ns / 1000,
            elapsed / 1000
        )),
        (Some(Composition::Kernels(k, m)), None) => log::info(format_args!(
            "compute share: graph exec {exec:#x}: {} kernel nodes and {} memset nodes, not every kernel seen launched on its own (or none): charged by the graph's least time",
            k.iter().map(|(_, n)| *n as u64).sum::<u64>(),
            m.count
        )),
        (Some(Composition::Opaque(why)), _) => log::info(format_args!(
            "compute share: graph exec {exec:#x}: {why}: charged by the graph's least time"
        )),
        (None, _) => {}
    }
}

/// A graph exec's node parameters were set after instantiation (`cuGraphExec*SetParams`): its kernels
/// are no longer known; its least time stays (work changed this way is charged its new time as the
/// least time creeps up, as before kernel compositions were read).
pub fn graph_reparametrised(exec: usize) {
    RECORDS.graph_work.insert(
        exec as u64,
        std::sync::Arc::new(Composition::Opaque(
            "node parameters set after instantiation",
        )),
    );
}
