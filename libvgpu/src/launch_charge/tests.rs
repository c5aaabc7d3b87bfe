//! Unit tests of what a launch, a group and a wait are charged (`launch_charge`).
use super::*;

const MS: u64 = 1_000_000;
const K: KernelRef = KernelRef {
    func: 0x100,
    kern: 0,
    grid: [1, 1, 1],
};
const GRAPH: Work = (0x900, [0; 3]);

#[test]
fn time_sliced_launches_are_charged_near_their_solo_cost() {
    // alone: charged what it took
    assert_eq!(charged(1000, 1000).0, 1000);
    // slowed to twice by a neighbour: charged 9/8 of the solo time
    assert_eq!(charged(2000, 1000).0, 1125);
    // faster than ever seen: charged that, and the floor drops
    assert_eq!(charged(800, 1000), (800, 800));
    // a floor left too low creeps up towards what the work takes now
    let mut floor = 100;
    for _ in 0..20_000 {
        floor = charged(1000, floor).1;
    }
    assert_eq!(floor, 1000);
}

// Regression (H100, two containers at 30/70 running CUDA graphs of 32 matmuls): the 30% tenant's graph
// never ran alone, its least time was learned under contention, and it was charged about twice its
// work (18.5% of the GPU instead of 30%).
#[test]
fn a_graph_never_seen_alone_is_charged_its_kernels_solo_time() {
    let mut b = SoloBook::default();
    // The kernel launched eagerly: some launches fit in a slice (2 ms), some straddle one (7 ms).
    for e in [7, 2, 2, 7, 2] {
        b.charge((K.func, K.grid), e * MS, None);
    }
    assert_eq!(b.floor((K.func, K.grid)), Some(2 * MS));
    let g = Composition::Kernels(vec![(K, 8)], Memsets::default());
    // Each replay of its 8 kernels (16 ms of work) takes ~31 ms beside a busy neighbour.
    let charges: Vec<u64> = (0..50)
        .map(|_| b.charge(GRAPH, 31 * MS, Some(&g)))
        .collect();
    let solo = 8 * b.floor((K.func, K.grid)).unwrap();
    // Charged by the recent stretch: the eager launches' part of it fades within a few replays.
    assert!(
        charges[10..]
            .iter()
            .all(|&c| c.abs_diff(solo + solo / 8) < MS / 10),
        "{charges:?}"
    );
    // The same graph without its kernels' solo time known: its own least time (the old charge).
    let mut fresh = SoloBook::default();
    assert_eq!(fresh.charge(GRAPH, 31 * MS, Some(&g)), 31 * MS);
}

// Regression (H100, 2026-11-24: the same 30/70 graph pair gave 19.4 / 71.0): cuBLAS puts a 4-byte
// memset node before each matmul kernel, so PyTorch's graph of 32 matmuls was opaque and charged by its
// own least time, learned under contention.
#[test]
fn a_graph_with_memset_nodes_is_charged_its_kernels_solo_time_and_the_memsets_estimate() {
    let nodes = |_g: usize| Some((0..16).collect());
    let work = |n: usize| {
        if n.is_multiple_of(2) {
            NodeWork::Memset(4)
        } else {
            NodeWork::Kernel(K)
        }
    };
    let g = compose(1, &nodes, &work);
    assert_eq!(
        g,
        Composition::Kernels(vec![(K, 8)], Memsets { count: 8, ns: 0 })
    );
    let mut b = SoloBook::default();
    for e in [7, 2, 2, 7, 2] {
        b.charge((K.func, K.grid), e * MS, None);
    }
    let solo = 16 * MS;
    let last = (0..20).map(|_| b.charge(GRAPH, 31 * MS, Some(&g))).last();
    assert!(
        last.unwrap().abs_diff(solo + solo / 8) < MS / 10,
        "{last:?}"
    );
    // A large memset counts its bytes at 200 GB/s: 400 MB is 2 ms.
    let big = compose(1, &|_g| Some(vec![1, 2]), &|n| {
        if n == 1 {
            NodeWork::Memset(400_000_000)
        } else {
            NodeWork::Kernel(K)
        }
    });
    assert_eq!(big.solo(&b.floors), Some(4 * MS));
}

#[test]
fn a_graph_seen_faster_than_its_kernels_sum_is_charged_by_that() {
    let mut b = SoloBook::default();
    b.charge((K.func, K.grid), 2 * MS, None);
    let g = Composition::Kernels(vec![(K, 8)], Memsets::default());
    // Its kernels overlap (branches): alone the graph takes 10 ms, less than 8 × 2.
    assert_eq!(b.charge(GRAPH, 10 * MS, Some(&g)), 10 * MS);
    // 30 ms beside one busy neighbour: its least time's 9/8 (11.25 ms) is below half of what it took.
    let last = (0..20).map(|_| b.charge(GRAPH, 30 * MS, Some(&g))).last();
    assert_eq!(last, Some(15 * MS));
}

#[test]
fn kernels_are_found_by_function_or_kernel_handle_and_opaque_graphs_are_not_summed() {
    let mut floors = WorkMap::default();
    floors.insert((0x200, [4, 1, 1]), 3 * MS);
    let by_kern = KernelRef {
        func: 0x777,
        kern: 0x200,
        grid: [4, 1, 1],
    };
    assert_eq!(
        Composition::Kernels(vec![(K, 2), (by_kern, 1)], Memsets::default()).solo(&floors),
        None,
        "K unknown"
    );
    floors.insert((K.func, K.grid), MS);
    assert_eq!(
        Composition::Kernels(vec![(K, 2), (by_kern, 1)], Memsets::default()).solo(&floors),
        Some(5 * MS)
    );
    // another grid is other work
    let other = KernelRef {
        grid: [8, 1, 1],
        ..K
    };
    assert_eq!(
        Composition::Kernels(vec![(other, 1)], Memsets::default()).solo(&floors),
        None
    );
    assert_eq!(Composition::Opaque("a memcpy node").solo(&floors), None);
    assert_eq!(
        Composition::Kernels(vec![], Memsets::default()).solo(&floors),
        None
    );
}

#[test]
fn a_graph_is_read_through_its_child_graphs_and_opaque_when_anything_else_runs() {
    let other = KernelRef { func: 0x300, ..K };
    // graph 1: K, an empty node, child graph 2 (K, other, K), K
    let nodes = |g: usize| match g {
        1 => Some(vec![10, 11, 12, 13]),
        2 => Some(vec![20, 21, 22]),
        3 => Some(vec![30, 31]),
        _ => None,
    };
    let work = |n: usize| match n {
        10 | 13 | 20 | 22 | 30 => NodeWork::Kernel(K),
        21 => NodeWork::Kernel(other),
        11 => NodeWork::Free,
        12 => NodeWork::Child(2),
        31 => NodeWork::Other("a memcpy node"),
        _ => NodeWork::Child(99),
    };
    assert_eq!(
        compose(1, &nodes, &work),
        Composition::Kernels(vec![(K, 4), (other, 1)], Memsets::default())
    );
    assert_eq!(
        compose(3, &nodes, &work),
        Composition::Opaque("a memcpy node")
    );
    assert_eq!(
        compose(4, &nodes, &work),
        Composition::Opaque("its nodes cannot be read")
    );
    // a graph that embeds itself (a malformed answer) ends
    let cyclic = |_n: usize| NodeWork::Child(5);
    let one = |_g: usize| Some(vec![50]);
    assert_eq!(
        compose(5, &one, &cyclic),
        Composition::Opaque("child graphs nested too deep")
    );
}

#[test]
fn stretch_reads_as_the_number_of_busy_contexts() {
    assert_eq!(sharers_of(0, 0), CONTEXT);
    // alone, and alone on a saturated GPU whose clock dropped (work ~15% slower than its best)
    assert_eq!(sharers_of(100, 100), CONTEXT);
    assert_eq!(sharers_of(115, 100), 1150);
    // two contexts, with what switching and the clock add; three
    assert_eq!(sharers_of(200, 100), 2 * CONTEXT);
    assert_eq!(sharers_of(250, 100), 2500);
    assert_eq!(sharers_of(310, 100), 3100);
    assert_eq!(sharers_of(u64::MAX, 1), MAX_SHARERS * CONTEXT);
}

// What `compute::busy` is told before a charge: the book's recent stretch, whatever the driver said.
#[test]
fn the_book_tells_its_recent_stretch_before_any_bound() {
    let mut b = SoloBook::default();
    assert_eq!(b.stretch(), CONTEXT, "nothing measured: alone");
    let w = (K.func, K.grid);
    b.charge_telling(w, MS, None, CONTEXT);
    for _ in 0..20 {
        // time-sliced beside one neighbour while the driver's reading still says alone
        b.charge_telling(w, 2 * MS, None, CONTEXT);
    }
    // twice the floor against 9/8 of it: 1.78 contexts, half a context above the reading
    assert!(b.stretch() >= 1700, "stretch {}", b.stretch());
    assert_eq!(
        b.read_as(),
        CONTEXT,
        "the reading bounds the charge, not the stretch"
    );
}

// Regression (H100, 2026-11-24, two processes at 30/70 time-sliced: 30.6 / 61.7): charged its solo
// time, the 30% tenant left the ~10% the GPU loses switching to its neighbour. Beside one busy
// neighbour it now pays half the time its work held the GPU's queue.
#[test]
fn beside_a_busy_neighbour_a_launch_pays_its_part_of_the_switching() {
    let mut b = SoloBook::default();
    let k = (K.func, K.grid);
    // 2 ms kernels on a GPU sliced in 5 ms slices with 1.25 ms lost per switch: two fit in a slice,
    // the third waits the neighbour's slice and two switches (2 + 5 + 2.5 ms).
    let mut charged_sum = 0;
    let mut took = 0;
    for i in 0..300u64 {
        let e = if i % 3 == 2 { 9_500_000 } else { 2 * MS };
        took += e;
        charged_sum += b.charge(k, e, None);
    }
    assert!((2 * MS..2 * MS + 10_000).contains(&b.floor(k).unwrap()));
    // Half of the 13.5 ms per 6 ms of work, less the first horizon's learning
    let per = charged_sum / 300;
    assert!(
        (2_100_000..=2_300_000).contains(&per),
        "{per} ns per 2 ms kernel (took {took})"
    );
    let rest: u64 = (0..300u64)
        .map(|i| b.charge(k, if i % 3 == 2 { 9_500_000 } else { 2 * MS }, None))
        .sum();
    assert_eq!(rest / 300, 2_250_000, "13.5 ms / 2 per 3 kernels");
    // Alone again: the stretch falls back under two within a horizon, and the solo charge returns.
    for _ in 0..200 {
        b.charge(k, 2 * MS, None);
    }
    assert!(b.charge(k, 2 * MS, None).abs_diff(2 * MS) < 2 * MS / 100);
}

// Regression (H100, 2026-11-27, a 30/70 pair of 4096² matmul loops: the 30% tenant got 21.9% against a
// target of 27.1): beside a busy neighbour whose slices its kernels straddle only now and then, the
// stretch stays under two, and each launch was charged the larger of its solo charge and half its
// elapsed time, launch by launch: 7.5 ms per cycle of 2 + 2 + 7 ms here, more than either the work's
// solo time (6.25 ms) or half the queue time (5.5 ms). The stretch is now read unrounded over the
// recent work, whose charges sum to the larger of the two.
#[test]
fn a_stretch_under_two_charges_the_recent_work_its_solo_time_not_launch_by_launch_maxima() {
    let k = (K.func, K.grid);
    let mut b = SoloBook::default();
    b.charge(k, 2 * MS, None);
    let cycle =
        |b: &mut SoloBook| -> u64 { [2, 2, 7].iter().map(|&e| b.charge(k, e * MS, None)).sum() };
    for _ in 0..100 {
        cycle(&mut b);
    }
    let per: u64 = (0..100).map(|_| cycle(&mut b)).sum::<u64>() / 100;
    assert!(per.abs_diff(6_250_000) < 100_000, "{per} ns per cycle");
    // Stretched past two (2 + 2 + 9.5 ms): half the queue time, as before.
    let long = |b: &mut SoloBook| -> u64 {
        [2_000_000, 2_000_000, 9_500_000]
            .iter()
            .map(|&e| b.charge(k, e, None))
            .sum()
    };
    for _ in 0..100 {
        long(&mut b);
    }
    assert_eq!(long(&mut b), 6_750_000);
}

#[test]
fn a_wait_before_the_gpu_took_the_work_up_is_charged_its_part_beside_busy_neighbours() {
    let k = (K.func, K.grid);
    let mut b = SoloBook::default();
    // Alone, a wait is a launch's latency: nothing.
    assert_eq!(b.charge_wait(5 * MS, CONTEXT), 0);
    // Batches of 4 ms of work that each waited out a neighbour's 5 ms slice: half of the 9 ms.
    let mut charged = 0;
    for _ in 0..200 {
        charged = b.charge(k, 2 * MS, None)
            + b.charge(k, 2 * MS, None)
            + b.charge_wait(5 * MS, 2 * CONTEXT);
    }
    assert!(charged.abs_diff(4_500_000) < 50_000, "{charged}");
    // Never more than the wait, never less than its part among the driver's count of sharers.
    assert!(b.charge_wait(MS, 4 * CONTEXT) >= MS / 4 && b.charge_wait(MS, 4 * CONTEXT) <= MS);
}

// Regression (issue 24, item 5): one short launch of a kernel, then launches of the same function
// and grid ten times as long: they were charged 9/8 of the short one's time, or read as contention
// (elapsed / 8): 80% of the GPU under a 10% share.
#[test]
fn one_cheap_launch_does_not_make_later_long_ones_cheap() {
    let k = (K.func, K.grid);
    let mut alone = SoloBook::default();
    alone.charge_telling(k, MS, None, CONTEXT);
    for _ in 0..100 {
        assert_eq!(alone.charge_telling(k, 20 * MS, None, CONTEXT).0, 20 * MS);
    }
    // Beside one busy neighbour the discount is at most half of what each launch took.
    let mut beside = SoloBook::default();
    beside.charge_telling(k, MS, None, 2 * CONTEXT);
    for _ in 0..100 {
        assert!(beside.charge_telling(k, 20 * MS, None, 2 * CONTEXT).0 >= 10 * MS);
    }
    // However many neighbours the driver reports, the bound is MAX_SHARERS.
    let mut crowd = SoloBook::default();
    crowd.charge_telling(k, MS, None, 99 * CONTEXT);
    assert!(crowd.charge_telling(k, 20 * MS, None, 99 * CONTEXT).0 >= 20 * MS / MAX_SHARERS);
    // Neighbours a tenth as busy as this process (1.3 contexts in all) take a tenth each at most.
    let mut idle = SoloBook::default();
    idle.charge_telling(k, MS, None, 1300);
    assert!(idle.charge_telling(k, 20 * MS, None, 1300).0 >= 20 * MS * 10 / 13);
}

#[test]
fn a_forgotten_graph_learns_afresh() {
    let mut b = SoloBook::default();
    b.charge(GRAPH, 2 * MS, None);
    // The exec is destroyed and its handle comes back for a graph eight times longer.
    b.forget(GRAPH);
    assert_eq!(b.charge(GRAPH, 16 * MS, None), 16 * MS);
}

#[test]
fn a_group_is_charged_as_its_members_would_be() {
    let w = (0x100, [1, 1, 1]);
    let v = (0x200, [1, 1, 1]);
    // Alone: what the group took, one work or mixed.
    let mut b = SoloBook::default();
    assert_eq!(b.charge_group(Some(w), 8, 8 * MS, 0, CONTEXT), 8 * MS);
    assert_eq!(b.charge_group(None, 8, 8 * MS, MS, CONTEXT), 8 * MS);
    // A group of one work teaches its floor from the members' mean.
    assert_eq!(b.floor(w), Some(MS));
    // Beside a neighbour that doubles it: its part of the stretched time (the recent solo / elapsed
    // ratio, 10/17 here), at least half, not the 16 ms it took.
    let mut s = SoloBook::default();
    s.charge_telling(w, MS, None, 2 * CONTEXT);
    let c = s.charge_group(Some(w), 8, 16 * MS, 0, 2 * CONTEXT);
    assert!((8 * MS..=10 * MS).contains(&c), "{c}");
    // Mixed: at most the members' floors x 9/8, never under elapsed / sharers.
    let mut m = SoloBook::default();
    m.charge_telling(w, MS, None, 2 * CONTEXT);
    m.charge_telling(v, MS, None, 2 * CONTEXT);
    let c = m.charge_group(None, 4, 8 * MS, 4 * MS, 2 * CONTEXT);
    assert!((4 * MS..=6 * MS).contains(&c), "{c}");
    // Cheap floors (one cheap launch first) buy nothing past the neighbour bound.
    let c = m.charge_group(None, 4, 80 * MS, 4 * MS, 2 * CONTEXT);
    assert!(c >= 40 * MS, "{c}");
    assert_eq!(m.floor(v), Some(MS), "a mixed group teaches no floor");
}

// The wake's stretch (`compute::lend`) reads the last few ms of work: a neighbour's slices show there
// within one interval where the charge's 64 ms horizon takes tens of ms, and one interval stretched by a
// gap (a synchronisation, the host's time) reads as at most two contexts of its own work.
#[test]
fn the_wake_stretch_reads_the_last_few_ms_of_work_and_the_charge_keeps_its_horizon() {
    let mut b = SoloBook::default();
    let w = (K.func, K.grid);
    for _ in 0..64 {
        b.charge_telling(w, MS, None, CONTEXT);
    }
    assert_eq!(
        (b.stretch(), b.wake_stretch()),
        (CONTEXT, CONTEXT),
        "alone: one context"
    );
    // A neighbour slices the GPU: 5 ms of work now takes twice as long (each launch charged its solo
    // time x 9/8, so a stretch of 1.78 at most): past the lending's bar (1.3) within those 5 ms.
    for _ in 0..5 {
        b.charge_telling(w, 2 * MS, None, CONTEXT);
    }
    assert!(b.wake_stretch() >= 1400, "the wake's: {}", b.wake_stretch());
    assert!(b.stretch() < 1300, "the charge's, 64 ms: {}", b.stretch());
    // Back alone: the wake's stretch follows within a few ms of work.
    for _ in 0..12 {
        b.charge_telling(w, MS, None, CONTEXT);
    }
    assert!(b.wake_stretch() < 1100, "{}", b.wake_stretch());
    // One interval 50 ms long for 1 ms of work (a gap in it) reads as two contexts of its own work at
    // most: with the rest of the window (4 ms at least), under the lending's bar (1.3).
    b.charge_telling(w, 50 * MS, None, CONTEXT);
    assert!(b.wake_stretch() < 1300, "{}", b.wake_stretch());
    // Too little work measured yet: one context.
    let mut n = SoloBook::default();
    n.charge_telling(w, MS, None, CONTEXT);
    n.charge_telling(w, 4 * MS, None, CONTEXT);
    assert_eq!(n.wake_stretch(), CONTEXT, "under WAKE_HORIZON_NS of work");
}
