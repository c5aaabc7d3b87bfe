//! `FAKE_CUDA_STREAM_QUEUES=1`: each stream of a process has a queue of its own, so kernels on different
//! streams run at once, each taking its own time (a GPU with room for all of them), where the default
//! runs every stream of a process on one queue (`timeline`). An event is stamped with the end of its own
//! stream's queue; a stream's synchronisation and query wait for its queue; a context's wait for all
//! the process's queues. The legacy default stream (handle 0 or `CU_STREAM_LEGACY`) keeps CUDA's implicit
//! synchronisation: its work starts after the work queued before on every blocking stream (made without
//! `CU_STREAM_NON_BLOCKING`), and a blocking stream's work after the work queued before on it. The
//! per-thread default stream (handle 2) is one blocking stream for every thread. What the process
//! publishes as its work (`Shared::set_busy_until`, read by the fake NVML) is the union of its queues'
//! busy time, not their sum. Time slicing between processes is not modelled in this mode.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// The legacy default stream's key (handles 0 and 1, `CU_STREAM_LEGACY`).
const LEGACY: u64 = 0;
/// `CU_STREAM_NON_BLOCKING`.
pub const NON_BLOCKING: u32 = 1;

/// Whether each stream has its own queue (FAKE_CUDA_STREAM_QUEUES=1).
pub fn on() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("FAKE_CUDA_STREAM_QUEUES").is_ok_and(|v| v.trim() == "1"))
}

/// Every stream's queue end (CLOCK_MONOTONIC ns), and the streams that do not synchronise with the
/// legacy default stream.
#[derive(Default)]
pub struct Queues {
    ends: HashMap<u64, u64>,
    non_blocking: HashSet<u64>,
    /// When the last of the process's queues drains.
    until: u64,
}

fn key(stream: u64) -> u64 {
    if stream <= 1 {
        LEGACY
    } else {
        stream
    }
}

impl Queues {
    fn end(&self, k: u64) -> u64 {
        self.ends.get(&k).copied().unwrap_or(0)
    }

    fn blocking(&self, k: u64) -> bool {
        !self.non_blocking.contains(&k)
    }

    /// When work queued now on `stream` may start, as far as other streams go: on the legacy stream,
    /// after every blocking stream's work; on a blocking stream, after the legacy stream's.
    fn after(&self, stream: u64) -> u64 {
        let k = key(stream);
        let own = self.end(k);
        if k == LEGACY {
            let others = self
                .ends
                .iter()
                .filter(|(s, _)| self.blocking(**s))
                .map(|(_, e)| *e);
            others.fold(own, u64::max)
        } else if self.blocking(k) {
            own.max(self.end(LEGACY))
        } else {
            own
        }
    }

    /// Queues `cost` ns of work on `stream`, submitted at `now`: when it ends, and how much it adds to
    /// the union of the process's busy time (the part after every queue's end so far: what is still
    /// ahead of `now` in the queues is one interval, from `now` to `until`).
    pub fn queue(&mut self, stream: u64, cost: u64, now: u64) -> (u64, u64) {
        let start = self.after(stream).max(now);
        let end = start + cost;
        self.ends.insert(key(stream), end);
        let added = end.saturating_sub(start.max(self.until));
        self.until = self.until.max(end);
        (end, added)
    }

    /// The stamp of an event recorded now on `stream`: when the work queued before it there is done.
    /// `gpu_ns`: what the event costs the GPU when it is behind queued work.
    pub fn stamp(&mut self, stream: u64, now: u64, gpu_ns: u64) -> u64 {
        let at = self.after(stream);
        if gpu_ns > 0 && at > now {
            let k = key(stream);
            self.ends.insert(k, at + gpu_ns);
            self.until = self.until.max(at + gpu_ns);
            return at + gpu_ns;
        }
        at.max(now)
    }

    /// `cuStreamWaitEvent`: the stream's next work starts after `stamp`.
    pub fn wait(&mut self, stream: u64, stamp: u64) {
        let k = key(stream);
        let e = self.end(k).max(stamp);
        self.ends.insert(k, e);
    }

    /// A host function queued on `stream` at `now` (`cuLaunchHostFunc`): when it runs (the stream's work
    /// before it done); the stream's next work starts `ns` later (its round trip through the host).
    pub fn host_func(&mut self, stream: u64, now: u64, ns: u64) -> u64 {
        let at = self.stream_end(stream).max(now);
        self.wait(stream, at + ns);
        at
    }

    /// When what is queued on `stream` (with what it waits for) is done.
    pub fn stream_end(&self, stream: u64) -> u64 {
        self.after(stream)
    }

    /// When every queue of the process is done.
    pub fn all_end(&self) -> u64 {
        self.until
    }

    pub fn created(&mut self, stream: u64, flags: u32) {
        if flags & NON_BLOCKING != 0 {
            self.non_blocking.insert(stream);
        }
    }

    pub fn destroyed(&mut self, stream: u64) {
        self.ends.remove(&stream);
        self.non_blocking.remove(&stream);
    }
}

static QUEUES: Mutex<Option<Queues>> = Mutex::new(None);

/// The process's stream queues.
pub fn queues() -> MutexGuard<'static, Option<Queues>> {
    let mut q = QUEUES.lock().unwrap_or_else(|e| e.into_inner());
    q.get_or_insert_with(Queues::default);
    q
}

#[cfg(test)]
mod tests {
    use super::{Queues, NON_BLOCKING};

    #[test]
    fn streams_overlap_and_the_union_is_published_once() {
        let mut q = Queues::default();
        q.created(10, NON_BLOCKING);
        q.created(11, NON_BLOCKING);
        // two kernels of 100 on two streams at 1000: both end at 1100, the union grows by 100 once
        assert_eq!(q.queue(10, 100, 1000), (1100, 100));
        assert_eq!(q.queue(11, 100, 1000), (1100, 0));
        // a third behind the first on its stream
        assert_eq!(q.queue(10, 100, 1010), (1200, 100));
        assert_eq!(q.stamp(11, 1020, 0), 1100);
        assert_eq!(q.stamp(10, 1020, 0), 1200);
        assert_eq!(q.all_end(), 1200);
        // after an idle gap the union grows by the whole kernel
        assert_eq!(q.queue(11, 100, 5000), (5100, 100));
    }

    // The share's gate (libvgpu compute/gate.rs): an event recorded behind a host function completes
    // when the function's round trip does, and a kernel queued meanwhile starts then, not when queued.
    #[test]
    fn work_after_a_host_function_waits_for_its_round_trip() {
        let mut q = Queues::default();
        q.created(10, NON_BLOCKING);
        assert_eq!(q.queue(10, 100, 1000), (1100, 100));
        // queued while the kernel runs: it runs when the kernel is done, the stream goes on 500 later
        assert_eq!(q.host_func(10, 1050, 500), 1100);
        assert_eq!(q.stamp(10, 1060, 0), 1600);
        assert_eq!(q.queue(10, 100, 1200), (1700, 100));
        // on an idle stream: from now
        assert_eq!(q.host_func(10, 5000, 500), 5000);
        assert_eq!(q.queue(10, 100, 5100), (5600, 100));
        // nothing is added to the process's busy time by the round trip itself
        assert_eq!(q.all_end(), 5600);
    }

    #[test]
    fn the_legacy_stream_waits_for_blocking_streams_not_for_non_blocking_ones() {
        let mut q = Queues::default();
        q.created(10, 0);
        q.created(11, NON_BLOCKING);
        q.queue(10, 100, 1000);
        q.queue(11, 500, 1000);
        // the legacy stream after stream 10 (blocking), not 11
        assert_eq!(q.queue(0, 100, 1000), (1200, 0));
        // and stream 10 after the legacy stream's work
        assert_eq!(q.queue(10, 100, 1000), (1300, 0));
        assert_eq!(q.stream_end(11), 1500);
        // a wait on an event: the stream starts after its stamp
        q.wait(11, 2000);
        assert_eq!(q.queue(11, 100, 1000), (2100, 100));
    }
}
