//! The device's time: with `FAKE_CUDA_KERNEL_US` set, every kernel takes that long, one after another
//! (one queue per process, as if every stream fed one engine; `FAKE_CUDA_STREAM_QUEUES=1`: one queue per
//! stream, `stream_queues`). Launches return at once and only move the
//! queue's end; events are stamped with the end of the queue when recorded, complete when the clock
//! passes that stamp, and their elapsed time is the difference; synchronising sleeps until the queue is
//! drained. Unset (the default), kernels take no time and events complete at once.
//! `FAKE_CUDA_EVENT_RECORD_US` makes each `cuEventRecord` cost its caller that much CPU time, as a real
//! driver's record does; `FAKE_CUDA_EVENT_READ_US` the same for each `cuEventQuery` and
//! `cuEventElapsedTime`. `FAKE_CUDA_LAUNCH_HOST_US` makes each kernel launch spend that much of its
//! caller's time before its kernel is queued (the host's time to submit it: an event recorded before the
//! launch on an idle stream completes that much before the kernel starts). `FAKE_CUDA_EVENT_GPU_US` makes
//! an event recorded behind queued work cost the GPU that much time before the work queued after it (an
//! H100 kept 87% of a loop of 2048² matmuls with a timing event after each). `FAKE_CUDA_HOSTFUNC_US`:
//! what a host function holds its stream (`host_func`).
//!
//! `FAKE_CUDA_BYTES_PER_US` gives memsets and copies a time too (their bytes at that rate), queued as
//! kernels are; a launch whose block is `y` threads high takes `y` kernels' time (see `api_module`).
//!
//! Time slicing (`FAKE_CUDA_TIMESLICE_US`): processes then share one GPU as a real one time-slices
//! contexts. Each process publishes when its queue drains (the state file, `Shared::set_busy_until`); work
//! queued while `m` other processes are busy (queued work ending within the last slice) runs in slices: it
//! uses what is left of its process's current slice, and every slice boundary it crosses costs it `m`
//! slices of the others' work. So a kernel that fits in what is left of the slice takes its own time, and
//! a long graph takes about `m + 1` times its own. Alone, a process keeps the GPU (no slicing).
//! `FAKE_CUDA_SWITCH_US` adds what a real GPU loses switching contexts: each boundary crossed also
//! waits `m + 1` switches (to each of the others and back), time no process's work runs in.
//!
//! `FAKE_CUDA_SLICE_BETWEEN=1` switches contexts between pieces of work instead, as an H100 does with
//! short kernels: a piece is never cut, and one that does not fit in what is left of the slice (or comes
//! to a queue that went idle) first waits the others' slices and the switches. An event recorded right
//! after work completes with it; one recorded after another event, or on an idle queue, completes when
//! the next piece queued after it starts (a real GPU processes it when it schedules the context again).
//! So a start event recorded before a launch does not see the wait before it, as on the H100, where
//! start/end pairs missed the neighbour's slices between a tenant's kernels.

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use crate::driver::{current, Driver};
use crate::stream_queues;
use fake_gpu::Shared;

/// CLOCK_MONOTONIC nanoseconds: one clock for every process of the machine (0 is "never").
fn now() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn env_us(name: &str) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(0, |us| us * 1000)
}

/// What recording an event costs the calling thread (FAKE_CUDA_EVENT_RECORD_US, microseconds): spent
/// spinning, as a driver's call spends CPU time.
pub fn record_cost() {
    static NS: OnceLock<u64> = OnceLock::new();
    spin(*NS.get_or_init(|| env_us("FAKE_CUDA_EVENT_RECORD_US")));
}

/// What reading an event (`cuEventQuery`, `cuEventElapsedTime`) costs the calling thread
/// (FAKE_CUDA_EVENT_READ_US, microseconds), spent spinning: so a test can see how many reads a call makes.
pub fn read_cost() {
    static NS: OnceLock<u64> = OnceLock::new();
    spin(*NS.get_or_init(|| env_us("FAKE_CUDA_EVENT_READ_US")));
}

/// What a kernel launch costs its caller before its kernel reaches the queue (FAKE_CUDA_LAUNCH_HOST_US,
/// microseconds), spent spinning: a driver builds the launch and hands it to the GPU late in the call (an
/// H200's idle-stream intervals held ~5 µs besides a ~2.9 µs kernel, about a launch call's own host time),
/// so an event recorded on an idle stream before the call completes that much before the kernel starts.
pub fn launch_cost() {
    static NS: OnceLock<u64> = OnceLock::new();
    spin(*NS.get_or_init(|| env_us("FAKE_CUDA_LAUNCH_HOST_US")));
}

/// Spends `ns` of the calling thread's CPU time.
fn spin(ns: u64) {
    let t0 = now();
    while ns > 0 && now() - t0 < ns {
        std::hint::spin_loop();
    }
}

/// A kernel's duration (FAKE_CUDA_KERNEL_US, microseconds; 0 when unset or malformed).
pub fn kernel_ns() -> u64 {
    static NS: OnceLock<u64> = OnceLock::new();
    *NS.get_or_init(|| env_us("FAKE_CUDA_KERNEL_US"))
}

/// The time slice between processes (FAKE_CUDA_TIMESLICE_US; 0: processes never contend).
pub fn slice_ns() -> u64 {
    static NS: OnceLock<u64> = OnceLock::new();
    *NS.get_or_init(|| env_us("FAKE_CUDA_TIMESLICE_US"))
}

/// What one context switch loses (FAKE_CUDA_SWITCH_US; 0 when unset).
pub fn switch_ns() -> u64 {
    static NS: OnceLock<u64> = OnceLock::new();
    *NS.get_or_init(|| env_us("FAKE_CUDA_SWITCH_US"))
}

/// Bytes a memset or copy moves per microsecond (FAKE_CUDA_BYTES_PER_US; 0 when unset: they take no time).
pub fn bytes_per_us() -> u64 {
    static N: OnceLock<u64> = OnceLock::new();
    *N.get_or_init(|| {
        std::env::var("FAKE_CUDA_BYTES_PER_US")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    })
}

/// When a call began: what `transfer` queues a memset's or copy's work from.
pub fn call_start() -> u64 {
    now()
}

/// Queues a memset or copy of `bytes` (FAKE_CUDA_BYTES_PER_US) on this process's queue, as a kernel: on
/// the current context's device (the first device with none current), which the paging cost looks at.
/// The work is queued as submitted at `since`, when the call began: the host-side copy that stands for
/// it is not the device's time, and counted in it would stretch the span of an event pair around the
/// call (4 MiB took the loaded CI machine up to a few milliseconds).
pub fn transfer(d: &Driver, bytes: u64, since: u64) {
    if let Some(ns) = bytes.saturating_mul(1000).checked_div(bytes_per_us()) {
        let phys = current(d).map_or(0, |(_, _, phys)| phys);
        // On the legacy default stream (with FAKE_CUDA_STREAM_QUEUES, its queue).
        run_ns_at(&d.shared, phys, 0, ns, since);
    }
}

/// This process's queue: when it drains, and what is left of its current slice.
struct Queue {
    busy_until: u64,
    slice_left: u64,
    /// `FAKE_CUDA_SLICE_BETWEEN`: the last thing recorded was work (an event now completes with it).
    after_work: bool,
    /// Events waiting for the next piece of work's start: their ticket, and when they complete if none
    /// comes.
    pending: Option<(u64, u64)>,
    /// Tickets resolved to the start of the work that followed them (the newest few).
    resolved: Vec<(u64, u64)>,
    tickets: u64,
}

static QUEUE: Mutex<Queue> = Mutex::new(Queue {
    busy_until: 0,
    slice_left: 0,
    after_work: false,
    pending: None,
    resolved: Vec::new(),
    tickets: 0,
});

/// An event stamp that is a ticket (`FAKE_CUDA_SLICE_BETWEEN`), not a time.
const TICKET: u64 = 1 << 63;

/// Whether contexts switch only between pieces of work (FAKE_CUDA_SLICE_BETWEEN=1).
pub fn between() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("FAKE_CUDA_SLICE_BETWEEN").is_ok_and(|v| v.trim() == "1"))
}

/// The time an event stamp stands for (a ticket: the start of the work queued after it, else when the
/// work before it drained).
pub fn resolve(stamp: u64) -> u64 {
    if stamp & TICKET == 0 {
        return stamp;
    }
    let t = stamp & !TICKET;
    let q = queue();
    if let Some(&(_, at)) = q.resolved.iter().find(|(k, _)| *k == t) {
        return at;
    }
    match q.pending {
        Some((k, at)) if k == t => at,
        _ => q.busy_until,
    }
}

fn queue() -> std::sync::MutexGuard<'static, Queue> {
    QUEUE.lock().unwrap_or_else(|e| e.into_inner())
}

/// How long `cost` of work takes when `others` processes share the GPU in slices of `slice`, starting
/// with `left` of this process's slice; and what is left of its slice after. A piece that fits in what
/// is left takes its own time; each slice boundary crossed waits `others` slices and `others + 1`
/// switches of `switch`.
pub fn sliced(cost: u64, left: u64, slice: u64, others: u64, switch: u64) -> (u64, u64) {
    if others == 0 || slice == 0 {
        return (cost, slice);
    }
    if cost <= left {
        return (cost, left - cost);
    }
    let rest = cost - left;
    let boundaries = rest.div_ceil(slice);
    (
        cost + boundaries * (others * slice + (others + 1) * switch),
        boundaries * slice - rest,
    )
}

/// Queues `kernels` kernels of this process on physical device `phys` (`shared`: the state file, for the
/// other processes' queues under time slicing and paging); returns when they will be done.
/// `stream`: the stream they are queued on (its own queue with `FAKE_CUDA_STREAM_QUEUES`).
pub fn run(shared: &Shared, phys: usize, stream: u64, kernels: u64) -> u64 {
    run_ns_at(shared, phys, stream, kernels * kernel_ns(), now())
}

/// Queues `cost` nanoseconds of work on `phys` (longer while it pages: `paging`), submitted at `now` (a
/// call's start, for a transfer); returns when it will be done.
fn run_ns_at(shared: &Shared, phys: usize, stream: u64, cost: u64, now: u64) -> u64 {
    let slice = slice_ns();
    let cost = crate::paging::cost(shared, phys, cost, now);
    if stream_queues::on() {
        let mut q = stream_queues::queues();
        let q = q.as_mut().expect("made by queues()");
        let (end, added) = q.queue(stream, cost, now);
        if cost > 0 {
            shared.set_busy_until(q.all_end(), added);
        }
        return end;
    }
    let mut q = queue();
    let idle = q.busy_until < now;
    if idle {
        // Idle until now: the next work starts a slice of its own.
        q.slice_left = slice;
    }
    let mut start = q.busy_until.max(now);
    let others = if slice > 0 && cost > 0 {
        shared.others_busy(now.saturating_sub(slice))
    } else {
        0
    };
    if between() {
        if others > 0 && (idle || cost > q.slice_left) {
            // The others' slices, and a switch to each and back, before this piece.
            start += others * slice + (others + 1) * switch_ns();
            q.slice_left = slice;
        }
        q.slice_left = q.slice_left.saturating_sub(cost);
        q.busy_until = start + cost;
        if let Some((t, _)) = q.pending.take() {
            if q.resolved.len() >= 64 {
                q.resolved.remove(0);
            }
            q.resolved.push((t, start));
        }
        q.after_work = true;
        shared.set_busy_until(q.busy_until, cost);
        return q.busy_until;
    }
    let (took, left) = sliced(cost, q.slice_left, slice, others, switch_ns());
    q.busy_until = start + took;
    q.slice_left = left;
    // Published whenever work is queued: the fake NVML's per-process utilisation reads it (and, under
    // time slicing, the other processes).
    if slice > 0 || cost > 0 {
        shared.set_busy_until(q.busy_until, cost);
    }
    q.busy_until
}

/// The stamp an event recorded now gets: when the work queued before it is done (with
/// `FAKE_CUDA_SLICE_BETWEEN`, after another event or on an idle queue: a ticket for the next work's start).
/// `stream`: the stream it is recorded on (its own queue's end with `FAKE_CUDA_STREAM_QUEUES`).
pub fn stamp(stream: u64) -> u64 {
    static GPU_NS: OnceLock<u64> = OnceLock::new();
    let gpu_ns = *GPU_NS.get_or_init(|| env_us("FAKE_CUDA_EVENT_GPU_US"));
    let now = now();
    if stream_queues::on() {
        let mut q = stream_queues::queues();
        return q.as_mut().map_or(now, |q| q.stamp(stream, now, gpu_ns));
    }
    let mut q = queue();
    if gpu_ns > 0 && q.busy_until > now {
        // Behind queued work: the event takes the GPU's time before what comes after it.
        q.busy_until += gpu_ns;
    }
    if !between() || (q.after_work && q.busy_until >= now) {
        q.after_work = false;
        return q.busy_until.max(now);
    }
    if q.pending.is_none() {
        q.tickets += 1;
        q.pending = Some((q.tickets, q.busy_until.max(now)));
    }
    TICKET | q.pending.map_or(0, |(t, _)| t)
}

/// `cuLaunchHostFunc` on `stream`: when its function runs (the work queued before it is done); the
/// stream's next work starts `FAKE_CUDA_HOSTFUNC_US` after that (the round trip through the host: the
/// GPU tells the driver's thread, which runs the function and lets the stream go on). Not the GPU's work.
pub fn host_func(stream: u64) -> u64 {
    static NS: OnceLock<u64> = OnceLock::new();
    let ns = *NS.get_or_init(|| env_us("FAKE_CUDA_HOSTFUNC_US"));
    let now = now();
    if stream_queues::on() {
        let mut q = stream_queues::queues();
        return q
            .as_mut()
            .expect("made by queues()")
            .host_func(stream, now, ns);
    }
    let mut q = queue();
    let at = q.busy_until.max(now);
    q.busy_until = at + ns;
    // An event recorded next completes when the round trip does (`FAKE_CUDA_SLICE_BETWEEN`).
    q.after_work = true;
    at
}

pub fn done(stamp: u64) -> bool {
    now() >= stamp
}

pub fn wait_for(stamp: u64) {
    let n = now();
    if stamp > n {
        std::thread::sleep(Duration::from_nanos(stamp - n));
    }
}

/// When what is queued on `stream` is done (None: the process's every stream); with one queue per
/// process, when the process's queue is.
fn end_of(stream: Option<u64>) -> u64 {
    if stream_queues::on() {
        let q = stream_queues::queues();
        let q = q.as_ref().expect("made by queues()");
        return stream.map_or(q.all_end(), |s| q.stream_end(s));
    }
    queue().busy_until
}

/// Whether everything queued on `stream` is done (`cuStreamQuery`).
pub fn drained(stream: u64) -> bool {
    now() >= end_of(Some(stream))
}

/// Sleeps until everything queued on `stream` (None: on every stream of the process) is done.
pub fn drain(stream: Option<u64>) {
    wait_for(end_of(stream));
}

/// `cuStreamWaitEvent`: with `FAKE_CUDA_STREAM_QUEUES`, `stream`'s next work starts after the event's
/// stamp (with one queue per process, it does anyway).
pub fn wait_event(stream: u64, stamp: u64) {
    if stream_queues::on() {
        if let Some(q) = stream_queues::queues().as_mut() {
            q.wait(stream, resolve(stamp));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::sliced;

    #[test]
    fn work_is_time_sliced_only_across_slice_boundaries_and_only_with_others() {
        const MS: u64 = 1_000_000;
        // alone: its own time, a whole slice ahead
        assert_eq!(sliced(16 * MS, 0, 5 * MS, 0, MS), (16 * MS, 5 * MS));
        // a kernel that fits in what is left of the slice
        assert_eq!(sliced(2 * MS, 5 * MS, 5 * MS, 1, 0), (2 * MS, 3 * MS));
        // one that crosses a boundary waits one slice of the other's
        assert_eq!(sliced(2 * MS, MS, 5 * MS, 1, 0), (7 * MS, 4 * MS));
        // a 16 ms graph from a fresh slice crosses three boundaries: a slice of the other's at each (31
        // ms), two others' (46 ms)
        assert_eq!(sliced(16 * MS, 5 * MS, 5 * MS, 1, 0), (31 * MS, 4 * MS));
        assert_eq!(sliced(16 * MS, 5 * MS, 5 * MS, 2, 0), (46 * MS, 4 * MS));
        // with 1 ms lost per switch, two at each boundary with one other (37 ms)
        assert_eq!(sliced(16 * MS, 5 * MS, 5 * MS, 1, MS), (37 * MS, 4 * MS));
        assert_eq!(sliced(2 * MS, 5 * MS, 5 * MS, 1, MS), (2 * MS, 3 * MS));
    }
}
