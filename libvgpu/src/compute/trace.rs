//! The compute share's debug trace (`LIBCUDA_LOG_LEVEL=3`): one line per process and device every
//! `EVERY_NS` saying what was measured, charged and held back in that interval, how many contexts the
//! charges read the GPU as shared among, and the bucket. It is how a pair that misses its shares on a
//! real GPU is taken apart (`tests/gpu/compute_trace.py` lines up two tenants' traces); below debug
//! level nothing is summed (one atomic load per launch and per event call).
//!
//! It also says where a launch's time goes on the CPU: `lib_us`, the time the library spent around the
//! interval's launches (its share of the hook, naps and the driver's launch itself left out), `nvml_us` the
//! part of it NVML's utilisation refresh took, and `untimed` how many launches went without events
//! (`sample`); `records`, `queries` (`not_ready` of them) and `reads`: the event calls the process's
//! shares made (all devices, counted since the last line of any device).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::clock::mono_ns;
use crate::ffi::CUresult;
use crate::log;

/// The driver calls of this process's shares since the last line (counted only with the trace on, by
/// `events`): event records, queries and how many of them said not ready, elapsed-time reads. On an H100
/// a record costs its caller ~1.3 µs, a query ~0.3, a read ~0.1 (`tests/gpu/launch_cost.cu`): with
/// `lib_us` they say where a launch's time goes.
pub(super) static RECORDS: AtomicU64 = AtomicU64::new(0);
pub(super) static QUERIES: AtomicU64 = AtomicU64::new(0);
pub(super) static NOT_READY: AtomicU64 = AtomicU64::new(0);
pub(super) static READS: AtomicU64 = AtomicU64::new(0);

/// Counts one driver call in `c` (one of the above) when the trace is on.
pub(super) fn count(c: &AtomicU64) {
    if on() {
        c.fetch_add(1, Relaxed);
    }
}

/// How often a line is written.
const EVERY_NS: u64 = 50_000_000;

/// One interval's sums, reset when written.
#[derive(Default)]
pub(super) struct Trace {
    since: AtomicU64,
    launches: AtomicU64,
    elapsed: AtomicU64,
    charged: AtomicU64,
    held: AtomicU64,
    /// Launches charged while the driver reported another busy process.
    beside: AtomicU64,
    /// The last charge's reading: sharers the driver reported, contexts the stretch was read as.
    sharers: AtomicU64,
    read_as: AtomicU64,
    /// The library's CPU time around launches, NVML's part of it, and launches charged untimed.
    lib: AtomicU64,
    nvml: AtomicU64,
    untimed: AtomicU64,
}

/// Runs the driver's `launch`; with the trace on (`entered`: when the library took the launch up), also
/// how long the driver took.
pub(super) fn timed(entered: Option<u64>, launch: impl FnOnce() -> CUresult) -> (CUresult, u64) {
    if entered.is_none() {
        return (launch(), 0);
    }
    let t0 = mono_ns();
    let r = launch();
    (r, mono_ns().saturating_sub(t0))
}

/// Whether the trace is on (debug level).
pub(super) fn on() -> bool {
    log::enabled(log::DEBUG)
}

impl Trace {
    /// `launches` launches (a group's members, or one) measured `elapsed`, charged `charged`, with the
    /// driver's `sharers` and the stretch read as `read_as` contexts (both in thousandths).
    pub(super) fn charged(
        &self,
        elapsed: u64,
        charged: u64,
        sharers: u64,
        read_as: u64,
        launches: u64,
    ) {
        self.launches.fetch_add(launches, Relaxed);
        self.elapsed.fetch_add(elapsed, Relaxed);
        self.charged.fetch_add(charged, Relaxed);
        if sharers > crate::launch_charge::CONTEXT {
            self.beside.fetch_add(1, Relaxed);
        }
        self.sharers.store(sharers, Relaxed);
        self.read_as.store(read_as, Relaxed);
    }

    /// A launch taken up at `entered` (None: the trace is off) is done; the driver's launch took
    /// `driver` ns of it, naps `held`; NVML's refreshes took `nvml` ns.
    pub(super) fn spent(&self, entered: Option<u64>, driver: u64, held: u64, nvml: u64) {
        let Some(t0) = entered else { return };
        let ns = mono_ns().saturating_sub(t0);
        self.lib
            .fetch_add(ns.saturating_sub(driver + held), Relaxed);
        self.nvml.fetch_add(nvml, Relaxed);
    }

    /// A launch was charged `ns` untimed (`sample`).
    pub(super) fn untimed(&self, ns: u64) {
        self.untimed.fetch_add(1, Relaxed);
        self.launches.fetch_add(1, Relaxed);
        self.charged.fetch_add(ns, Relaxed);
    }

    /// A thread was held back `ns`.
    pub(super) fn held(&self, ns: u64) {
        self.held.fetch_add(ns, Relaxed);
    }

    /// Writes the interval's line when it is over (`tokens`: the bucket now; `gate`: closed or not).
    pub(super) fn tick(&self, now: u64, dev: i32, tokens: i64, gate: bool) {
        let since = self.since.load(Relaxed);
        if since == 0 {
            self.since.store(now, Relaxed);
            return;
        }
        if now < since + EVERY_NS
            || self
                .since
                .compare_exchange(since, now, Relaxed, Relaxed)
                .is_err()
        {
            return;
        }
        log::debug(format_args!(
            "compute trace dev {dev} t_ms {} span_us {} launches {} elapsed_us {} charged_us {} held_us {} beside {} sharers {} read_as {} tokens_us {} gate {} lib_us {} nvml_us {} untimed {} records {} queries {} not_ready {} reads {}",
            now / 1_000_000,
            (now - since) / 1000,
            self.launches.swap(0, Relaxed),
            self.elapsed.swap(0, Relaxed) / 1000,
            self.charged.swap(0, Relaxed) / 1000,
            self.held.swap(0, Relaxed) / 1000,
            self.beside.swap(0, Relaxed),
            Contexts(self.sharers.load(Relaxed)),
            Contexts(self.read_as.load(Relaxed)),
            tokens / 1000,
            if gate { "closed" } else { "open" },
            self.lib.swap(0, Relaxed) / 1000,
            self.nvml.swap(0, Relaxed) / 1000,
            self.untimed.swap(0, Relaxed),
            RECORDS.swap(0, Relaxed),
            QUERIES.swap(0, Relaxed),
            NOT_READY.swap(0, Relaxed),
            READS.swap(0, Relaxed),
        ));
    }
}

/// A count of contexts in thousandths, written as a decimal (`1.50`).
struct Contexts(u64);

impl std::fmt::Display for Contexts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{:02}", self.0 / 1000, self.0 % 1000 / 10)
    }
}
