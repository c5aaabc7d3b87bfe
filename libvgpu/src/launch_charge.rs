//! The compute share's charge: the GPU time a launch's work takes alone, not the time it took on a GPU another
//! process time-slices with. Pure bookkeeping, no driver call; measuring is `compute`'s, and what a graph
//! holds is read at instantiation (`hooks::graphs`).
//!
//! An event pair around a launch measures its elapsed time, and on a shared GPU that includes the slices
//! other contexts ran in between. A kernel shorter than a slice often runs within one, so the least time
//! seen of each kind of work (function and grid) is near its solo time: a launch is charged
//! `min(elapsed, 9/8 × that least time)`. A CUDA graph of many kernels is longer than a slice and never
//! runs within one while another context is busy, so its own least time is learned under contention. Its
//! solo time is instead the sum of its kernels' solo times, each learned from the same kernels launched
//! on their own (PyTorch warms up eagerly before capturing a graph): a graph is charged
//! `min(elapsed, 9/8 × its least time, 9/8 × the sum)` when every node is a kernel whose solo time is
//! known, a memset (its bytes at [`MEMSET_BYTES_PER_NS`]: cuBLAS puts a 4-byte one before each matmul) or
//! a node that costs nothing; else as any other work, by its own least time. Least times are learned at
//! the GPU's best clock; the 9/8 covers a saturated GPU's lower one (the H100's matmuls take 1.13× as
//! long) and the kernels' jitter. (The sum's headroom was 17/16 while a graph beside a busy neighbour was
//! charged it at every replay; it now pays its part of the GPU's time there, below.)
//!
//! Sharing the GPU's time: the solo charge above leaves out what the GPU loses switching between busy
//! contexts (~10% of an H100 with two), and that loss then falls on a neighbour whose share is not
//! held back by its bucket (the 70% tenant beside a 30% one got 59–62%). So the book also keeps how
//! stretched its recent work is, `Σ elapsed / Σ solo charge` over about `STRETCH_HORIZON_NS` of work
//! (elapsed: the time the work was queued on the GPU, `compute::flight`), and reads it as the number of
//! busy contexts the GPU shares its time among, unrounded and at most what the driver counts
//! (`compute::busy`): a launch is charged `elapsed / s`, so the recent work's charges sum to the larger
//! of its solo time and its part of the queue time (`Σ elapsed / sharers`). (Rounded down, a stretch
//! of 1.9 read as one context charged each launch the larger of its solo charge and half its elapsed
//! time, launch by launch: more than either sum, and a 30% tenant of 4096² matmuls got 21.9% against a
//! 27.1% target on an H100.) Alone (the driver counts no other busy process) a launch is charged what it
//! took. Nothing here reads another tenant's state: each process learns from its own launches.

use std::collections::{HashMap, HashSet};

/// What a launch ran, for its solo cost: (function, grid) of a kernel, (graph exec, 0) of a graph.
pub type Work = (usize, [u32; 3]);

/// A map keyed by work, looked up on every launch under a share: Fx hashing, not SipHash (SipHash of a
/// work cost ~60 Ir of the ~1,500 the share's own path spends on a launch, twice a launch). A program
/// that makes its works collide slows only its own launches.
pub type WorkMap<V> = HashMap<Work, V, rustc_hash::FxBuildHasher>;

/// How the driver names a kernel node's function: its `CUfunction` and, from CUDA 12, its `CUkernel`
/// (a launch may pass either as the function); the eager launches' key is whichever they passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KernelRef {
    pub func: usize,
    pub kern: usize,
    pub grid: [u32; 3],
}

/// What one graph node runs, as far as a graph's solo time goes (`Driver::node_work`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeWork {
    Kernel(KernelRef),
    /// A child graph node: the graph it embeds.
    Child(usize),
    /// Costs nothing worth counting: empty, event record/wait, memory allocation and free nodes.
    Free,
    /// A memset node of this many bytes: its solo time is estimated from its size ([`memset_ns`]).
    Memset(u64),
    /// Anything else, or a node that cannot be read: what, for the log.
    Other(&'static str),
}

/// The memory bandwidth a memset node's solo time is estimated at: 200 GB/s, below any data-center GPU's
/// (a T4 has 320 GB/s, an H100 3,350), so a large memset is over- rather than under-charged. Eager memsets
/// are not charged at all (only launches are); in a graph, cuBLAS's 4-byte memsets cost nothing here.
pub const MEMSET_BYTES_PER_NS: u64 = 200;

/// The solo time estimated for a memset of `bytes`.
pub fn memset_ns(bytes: u64) -> u64 {
    bytes / MEMSET_BYTES_PER_NS
}

/// Nodes read in one graph, child graphs included, at most: a bigger graph is opaque (reading it would
/// cost more than its launches are worth here).
const MAX_NODES: usize = 100_000;

/// What `graph` runs: its nodes (`nodes`), each node's work (`work`), child graphs followed (at most 16
/// deep). Opaque when a node is neither a kernel nor free, or anything cannot be read.
pub fn compose(
    graph: usize,
    nodes: &dyn Fn(usize) -> Option<Vec<usize>>,
    work: &dyn Fn(usize) -> NodeWork,
) -> Composition {
    let mut kernels: HashMap<KernelRef, u32> = HashMap::new();
    let mut memsets = Memsets::default();
    let mut seen = 0usize;
    let mut stack = vec![(graph, 0u32)];
    while let Some((g, depth)) = stack.pop() {
        if depth > 16 {
            return Composition::Opaque("child graphs nested too deep");
        }
        let Some(ns) = nodes(g) else {
            return Composition::Opaque("its nodes cannot be read");
        };
        seen += ns.len();
        if seen > MAX_NODES {
            return Composition::Opaque("more nodes than are read");
        }
        for n in ns {
            match work(n) {
                NodeWork::Kernel(k) => *kernels.entry(k).or_insert(0) += 1,
                NodeWork::Child(c) => stack.push((c, depth + 1)),
                NodeWork::Free => {}
                NodeWork::Memset(bytes) => {
                    memsets.count += 1;
                    memsets.ns = memsets.ns.saturating_add(memset_ns(bytes));
                }
                NodeWork::Other(what) => return Composition::Opaque(what),
            }
        }
    }
    let mut ks: Vec<(KernelRef, u32)> = kernels.into_iter().collect();
    ks.sort_by_key(|(k, _)| (k.func, k.kern, k.grid));
    Composition::Kernels(ks, memsets)
}

/// The memset nodes of a graph: how many, and their estimated solo time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Memsets {
    pub count: u32,
    pub ns: u64,
}

/// What a graph exec runs, as far as its solo time goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Composition {
    /// Only kernels (with how many times each), memsets, and nodes that cost nothing (empty, event,
    /// memory allocation nodes).
    Kernels(Vec<(KernelRef, u32)>, Memsets),
    /// Something else runs in it (a copy, a memset whose size cannot be read, a host function, a
    /// conditional, ...), or it could not be read: its solo time is not the sum of its kernels'. Why, for
    /// the log.
    Opaque(&'static str),
}

impl Composition {
    /// The solo time of the graph from its kernels' floors and its memsets' estimate; None when a kernel's
    /// is unknown, it has no kernel, or it is opaque.
    pub fn solo(&self, floors: &WorkMap<u64>) -> Option<u64> {
        let Composition::Kernels(ks, memsets) = self else {
            return None;
        };
        if ks.is_empty() {
            return None;
        }
        ks.iter().try_fold(memsets.ns, |sum, (k, n)| {
            let f = floors
                .get(&(k.func, k.grid))
                .or_else(|| floors.get(&(k.kern, k.grid)).filter(|_| k.kern != 0))?;
            Some(sum.saturating_add(f.saturating_mul(*n as u64)))
        })
    }
}

/// Sharers are counted in thousandths of a context: a neighbour that keeps the GPU busy only a tenth as
/// much as this process counts a tenth (`compute::busy`).
pub const CONTEXT: u64 = 1000;

/// How many busy contexts the GPU's time is shared among, read from how stretched recent work was:
/// `Σ elapsed / Σ solo`, in thousandths, one to `MAX_SHARERS` contexts (one when nothing was measured).
pub fn sharers_of(stretched: u64, solo: u64) -> u64 {
    if solo == 0 {
        return CONTEXT;
    }
    (stretched as u128 * CONTEXT as u128 / solo as u128)
        .clamp(CONTEXT as u128, (MAX_SHARERS * CONTEXT) as u128) as u64
}

/// What a launch that took `elapsed` is charged, given the least time that work was seen to take
/// (`floor`), and the floor after it: `min(elapsed, floor × 9/8)`. The floor creeps up by 1/1024 per
/// launch, so work that really got slower is charged its new time within a few thousand launches.
pub fn charged(elapsed: u64, floor: u64) -> (u64, u64) {
    let charge = elapsed.min(floor.saturating_add(floor / 8));
    let next = elapsed.min(floor.saturating_add(floor / 1024 + 1));
    (charge, next)
}

/// How much of this process's own solo work the stretch is read over: both sums are halved each time
/// the solo one passes this (a moving window of some 30–60 ms of work).
pub const STRETCH_HORIZON_NS: u64 = 64_000_000;
/// The most contexts a stretch is read as: the bound of the discount.
pub const MAX_SHARERS: u64 = 4;
/// How much of this process's own solo work the wake's stretch (`wake_stretch`) is read over: its sums
/// are halved while the solo one passes twice this (the last 4-8 ms of work, at least the last
/// interval's), so that a neighbour slicing the GPU shows within a few ms of work where the charge's
/// 64 ms horizon took tens of ms.
pub const WAKE_HORIZON_NS: u64 = 4_000_000;

/// The solo time of each kind of work this process launched on one device.
#[derive(Debug, Default)]
pub struct SoloBook {
    floors: WorkMap<u64>,
    /// Graphs whose first charge was logged.
    told: HashSet<Work>,
    /// Recent launches' elapsed times and solo times, summed (decayed together).
    stretched: u64,
    solo: u64,
    /// How many contexts the last charge read the stretch as (for the trace).
    read_as: u64,
    /// The same sums over `WAKE_HORIZON_NS` of work (`wake_stretch`): the lending's, never the charge's.
    recent_stretched: u64,
    recent_solo: u64,
}

impl SoloBook {
    /// Charges a launch of `work` that took `elapsed` beside one busy neighbour (`sharers` two
    /// contexts); `graph`: what it runs, when it is a graph exec whose nodes were read. Returns what to
    /// charge, and learns.
    #[cfg(test)]
    pub fn charge(&mut self, work: Work, elapsed: u64, graph: Option<&Composition>) -> u64 {
        self.charge_telling(work, elapsed, graph, 2 * CONTEXT).0
    }

    /// As `charge`; `sharers`: how many busy contexts the driver says share the GPU, in thousandths
    /// (`compute::busy`, this process included). Also, at a graph's first charge only, the solo time its kernels sum to
    /// (the inner None: not known), for the log.
    ///
    /// Alone (`sharers` 1) a launch is charged what it took: nothing else held the GPU meanwhile. Beside
    /// others, its solo time or its part of the stretched time as above, with the stretch read as at
    /// most `sharers` contexts, and never less than `elapsed / sharers`: the least times are the
    /// tenant's own (one cheap launch of a kernel must not make its long launches cheap), the number of
    /// busy neighbours is the driver's, each weighted by how busy it is next to this process.
    pub fn charge_telling(
        &mut self,
        work: Work,
        elapsed: u64,
        graph: Option<&Composition>,
        sharers: u64,
    ) -> (u64, Option<Option<u64>>) {
        let composed = graph.and_then(|c| c.solo(&self.floors));
        let tell = (graph.is_some() && self.told.insert(work)).then_some(composed);
        let floor = self.floors.entry(work).or_insert(elapsed);
        let own = charged(elapsed, *floor).0;
        let solo_charge = composed.map_or(own, |c| own.min(c.saturating_add(c / 8)));
        // The work's own floor learns from its own launches only.
        *floor = charged(elapsed, *floor).1;
        (self.shared(elapsed, solo_charge, sharers), tell)
    }

    /// Charges a group of `members` launches timed together (`compute::flight`: launches queued behind
    /// unfinished work on their stream, one end event for the group) that took `elapsed` in all, beside
    /// `sharers` busy contexts. `work`: what every member ran, or None when they ran different work,
    /// whose floors summed to `floors` when they joined. Alone, what they took. Beside others, as
    /// `charge_telling` for the whole: a group of one work is `members` launches of `elapsed / members`
    /// each (and teaches that work's floor); a mixed one is charged at most its members' floors × 9/8,
    /// and teaches nothing (its members' own times are not known). Never less than `elapsed / sharers`.
    pub fn charge_group(
        &mut self,
        work: Option<Work>,
        members: u64,
        elapsed: u64,
        floors: u64,
        sharers: u64,
    ) -> u64 {
        let members = members.max(1);
        let solo_charge = match work {
            Some(w) => {
                let each = elapsed / members;
                let floor = self.floors.entry(w).or_insert(each);
                let (own, next) = charged(each, *floor);
                *floor = next;
                own.saturating_mul(members)
            }
            None => elapsed.min(floors.saturating_add(floors / 8)),
        };
        self.shared(elapsed, solo_charge, sharers)
    }

    /// What the time a span's first launch waited before the GPU took it up is charged (`compute`:
    /// measured at a blocking synchronisation): time its work was queued with none of it running, its
    /// part of which is the tenant's beside busy neighbours and nothing alone (a launch's latency).
    pub fn charge_wait(&mut self, waited: u64, sharers: u64) -> u64 {
        if sharers <= CONTEXT || waited == 0 {
            return 0;
        }
        self.shared(waited, 0, sharers)
    }

    /// The charge of `elapsed` of queued time whose own work was `solo` beside `sharers` busy contexts
    /// (the driver's count in thousandths, this process included): what it took when alone; else its
    /// part of the time, `elapsed / s` with `s` the recent stretch `Σ elapsed / Σ solo` read as a number
    /// of contexts (not rounded: a stretch of 1.9 is not one context) and bounded by `sharers`. So over
    /// the recent work the charges sum to `max(Σ solo, Σ elapsed / sharers)`.
    fn shared(&mut self, elapsed: u64, solo: u64, sharers: u64) -> u64 {
        self.stretched = self.stretched.saturating_add(elapsed);
        self.solo = self.solo.saturating_add(solo);
        // One interval reads as at most two contexts (the wake asks whether a second one is there): a
        // gap in one short interval cannot outweigh the rest of the window.
        let capped = elapsed.min(solo.saturating_mul(2));
        self.recent_stretched = self.recent_stretched.saturating_add(capped);
        self.recent_solo = self.recent_solo.saturating_add(solo);
        while self.recent_solo > 2 * WAKE_HORIZON_NS {
            self.recent_stretched /= 2;
            self.recent_solo /= 2;
        }
        if self.solo > STRETCH_HORIZON_NS || self.stretched > STRETCH_HORIZON_NS * MAX_SHARERS {
            self.stretched /= 2;
            self.solo /= 2;
        }
        let sharers = sharers.clamp(CONTEXT, MAX_SHARERS * CONTEXT);
        self.read_as = sharers.min(sharers_of(self.stretched, self.solo));
        if sharers == CONTEXT {
            return elapsed;
        }
        let part = (elapsed as u128 * self.solo as u128 / self.stretched.max(1) as u128) as u64;
        let bound = (elapsed as u128 * CONTEXT as u128 / sharers as u128) as u64;
        part.min(elapsed).max(bound)
    }

    /// How stretched this process's recent work is, read as a number of contexts in thousandths
    /// (`sharers_of` of the decayed sums; one when nothing was measured): what the next charge reads it as
    /// before the driver's bound.
    pub fn stretch(&self) -> u64 {
        sharers_of(self.stretched, self.solo)
    }

    /// How stretched this process's last few ms of work are (`WAKE_HORIZON_NS` to twice that of solo
    /// work), in thousandths of a context as `stretch`, each interval read as at most two; one until
    /// that much work was measured. One short interval stretched by a gap (the host's time, a
    /// synchronisation) moves it by at most its own work's part of the window.
    /// What the elastic share's wake reads (`compute::lend`); the charge keeps `stretch`.
    pub fn wake_stretch(&self) -> u64 {
        if self.recent_solo < WAKE_HORIZON_NS {
            return CONTEXT;
        }
        sharers_of(self.recent_stretched, self.recent_solo)
    }

    /// How many busy contexts the last charge read its stretch as, in thousandths (one to `MAX_SHARERS`
    /// contexts).
    pub fn read_as(&self) -> u64 {
        self.read_as
    }

    /// Forgets what was learned of `work` (a graph exec destroyed or updated: its handle may come back as
    /// other work).
    pub fn forget(&mut self, work: Work) {
        self.floors.remove(&work);
        self.told.remove(&work);
    }

    /// The least time `work` was seen to take, if it was ever measured.
    pub fn floor(&self, work: Work) -> Option<u64> {
        self.floors.get(&work).copied()
    }
}

#[cfg(test)]
mod tests;
