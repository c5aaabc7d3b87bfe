//! Charging what finished: the harvest of launches whose end events completed, the launches a
//! synchronisation retires and the next one charges (`retire`, `settle_retired`), a launch's charge by
//! its measured time (`charge`, `launch_charge::SoloBook`), and the waits before a span's first kernel.
//! Methods of `Share`; the queue's lock is never held across a driver call.

use std::sync::atomic::Ordering;

use super::events::{elapsed_ns, event_query, event_wait, Relaxed};
use super::flight::{End, InFlight};
use super::quiet::quiet;
use super::{
    averaged, graphs, lock, mono_ns, trace, Share, CUDA_ERROR_NOT_READY, FORKED, GRAPH_GRID,
};
use crate::ffi::*;
use crate::records::RECORDS;

impl Share {
    /// Charges what a synchronisation retired, then every launch whose end event completed, oldest
    /// first; stops at the first still running. The queue's lock is never held across a driver call.
    /// The queries run in relaxed capture mode: in the default (global) mode a query while another
    /// stream of the process captures a graph would invalidate the application's capture.
    pub(super) fn harvest(&self) {
        if FORKED.load(Ordering::Relaxed) {
            self.forget_parent();
            return;
        }
        {
            let q = lock(&self.timer.flights);
            if q.queue.is_empty() && q.retired.is_empty() {
                return;
            }
        }
        let _quiet = quiet();
        let _relaxed = Relaxed::enter();
        self.settle_retired();
        loop {
            let Some(mut f) = lock(&self.timer.flights).pop_front() else {
                return;
            };
            match f.state {
                End::Recorded => {}
                End::Failed => {
                    self.lost(&f);
                    continue;
                }
                // A group reached the front: what was queued before it finished, so its members run
                // now. Its end is recorded now, while they do.
                End::Open | End::Closing => {
                    lock(&self.timer.flights).push_front(f, false);
                    self.timer.close_front();
                    return;
                }
            }
            match event_query(f.end) {
                CUDA_ERROR_NOT_READY => {
                    lock(&self.timer.flights).push_front(f, true);
                    return;
                }
                CUDA_SUCCESS => {
                    f.closes_span = lock(&self.timer.flights).queue.is_empty();
                    self.measured(&f);
                }
                _ => self.lost(&f),
            }
        }
    }

    /// Charges a finished launch its measured time; when it ends a span dated by a synchronisation,
    /// also the span's wait.
    fn measured(&self, f: &InFlight) {
        // Events that completed yet give no interval (an end the driver took into a capture) were never
        // timed: charged as lost (the wall time since queued), never at the estimate, which the tenant's
        // earlier launches shaped.
        let Some(elapsed) = elapsed_ns(f.start, f.end) else {
            crate::log::debug(format_args!(
                "compute share: a launch's events completed but give no interval: charged as lost"
            ));
            self.lost(f);
            self.timer.settled(f);
            return;
        };
        if !f.probe.is_null() {
            if let Some(ns) = elapsed_ns(f.end, f.probe) {
                self.event_cost.observed(ns);
            }
        }
        // Overlap with the context's intervals charged before (other streams') is charged once.
        let uncovered = self.timer.uncovered(f, elapsed, mono_ns());
        self.charge(f, elapsed, uncovered);
        if let Some(ns) = self.timer.settled(f) {
            self.waited(ns);
        }
    }

    /// A launch whose end event failed: the context is gone or broken and the launch is never
    /// measured. It ran at most from when it was queued until now, less what earlier unmeasured
    /// launches were charged of that.
    fn lost(&self, f: &InFlight) {
        let now = mono_ns();
        let from = f
            .queued_at
            .max(self.unmeasured_until.fetch_max(now, Ordering::Relaxed));
        let ns = now.saturating_sub(from).max(f.estimate);
        self.area().settle(ns, f.estimate);
        self.busy.truth.booked(ns);
    }

    /// After a synchronisation: moves the launches it found finished to `retired`, oldest first, without
    /// charging them (`settle_retired` does, at the next synchronisation before it waits). `covered`: the launches the
    /// synchronisation waited for (finished, no query needed); others are asked with `cuEventQuery`,
    /// stopping at the first still running. `ended_at`: when the synchronisation returned, if it found
    /// the newest launch running (it dates the span's end, `flight::Span::waited`).
    ///
    /// Why not charge them here: the application waits for this return, and the GPU for its next
    /// launch. Charging a step's launches then (24 short kernels: ~20 µs) is time the GPU idles, each
    /// step: ~4% of a 2048² matmul step on an H100.
    pub(super) fn retire(&self, covered: &dyn Fn(&InFlight) -> bool, ended_at: Option<u64>) {
        if FORKED.load(Ordering::Relaxed) {
            self.forget_parent();
            return;
        }
        let _quiet = quiet();
        let mut queried = None;
        loop {
            let f = {
                let mut q = lock(&self.timer.flights);
                let Some(f) = q.pop_front() else {
                    return;
                };
                match f.state {
                    End::Recorded => {}
                    End::Failed => {
                        drop(q);
                        self.lost(&f);
                        continue;
                    }
                    // Not recorded yet: the next harvest closes it.
                    End::Open | End::Closing => {
                        q.push_front(f, false);
                        return;
                    }
                }
                if covered(&f) {
                    q.retire(f, ended_at);
                    self.mark_retired();
                    continue;
                }
                f
            };
            let _relaxed = queried.get_or_insert_with(Relaxed::enter);
            let r = event_query(f.end);
            let mut q = lock(&self.timer.flights);
            match r {
                CUDA_ERROR_NOT_READY => {
                    q.push_front(f, true);
                    return;
                }
                CUDA_SUCCESS => {
                    q.retire(f, ended_at);
                    self.mark_retired();
                }
                _ => {
                    drop(q);
                    self.lost(&f);
                }
            }
        }
    }

    /// Something waits in `retired`: since when, if nothing did before.
    fn mark_retired(&self) {
        let _ = self.retired_at.compare_exchange(
            0,
            mono_ns().max(1),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// Charges the launches a synchronisation retired, oldest first.
    pub(super) fn settle_retired(&self) {
        if FORKED.load(Ordering::Relaxed) {
            self.forget_parent();
            return;
        }
        let _quiet = quiet();
        loop {
            let Some(f) = lock(&self.timer.flights).retired.pop_front() else {
                self.retired_at.store(0, Ordering::Relaxed);
                return;
            };
            self.measured(&f);
        }
    }

    /// In a child after `fork`: the launches in flight and the spare events are the parent's (its
    /// driver state is not the child's), so they are dropped uncharged; the parent charges them. A lock
    /// another thread held at the fork stays held in the child: then nothing is dropped.
    pub(super) fn forget_parent(&self) {
        self.timer.forget_parent();
        self.busy.truth.forget_parent();
        self.retired_at.store(0, Ordering::Relaxed);
    }

    /// Charges a measured launch (`solo`) and settles its debit: what its `elapsed` interval is charged,
    /// times the part of it that is `uncovered` by intervals charged before (`overlap`).
    fn charge(&self, f: &InFlight, elapsed: u64, uncovered: u64) {
        let measured = elapsed;
        // A stale group's interval ran on past its work into the GPU's idle time: charged at most its
        // members' floors x 9/8 (as a group of mixed work is), teaching nothing. What that leaves short
        // of the GPU time it used, the floor from the driver's figure charges (`truth`).
        let stale = f.stale && f.floors > 0;
        let elapsed = match stale {
            true => elapsed.min(f.floors.saturating_add(f.floors / 8)),
            false => elapsed,
        };
        // A graph's nodes, as read at instantiation (`hooks::graphs`).
        let graph = (f.work.1 == GRAPH_GRID)
            .then(|| RECORDS.graph_work.with(f.work.0 as u64, |c| c.cloned()))
            .flatten();
        let members = u64::from(f.members.max(1));
        // NVML may be asked (~1.4 ms): not under the book's lock.
        let stretch = lock(&self.solo).stretch();
        let sharers = self.busy.sharers_beside(mono_ns(), stretch);
        let (ns, tell, read_as) = {
            let mut book = lock(&self.solo);
            let (ns, tell) = if members > 1 || stale {
                let work = (!f.mixed && !stale).then_some(f.work);
                let ns = book.charge_group(work, members, elapsed, f.floors, sharers);
                (ns, None)
            } else {
                book.charge_telling(f.work, elapsed, graph.as_deref(), sharers)
            };
            (ns, tell, book.read_as())
        };
        // The rules above see the whole interval (the least times learn from it); the charge is the part
        // of it no other stream's interval covered. What untimed launches are charged learns from the
        // whole (`whole`): they are never placed, so nothing of theirs is subtracted either.
        let whole = ns;
        let ns = match uncovered < measured {
            true => (u128::from(ns) * u128::from(uncovered) / u128::from(measured.max(1))) as u64,
            false => ns,
        };
        if let Some(solo) = tell {
            graphs::tell_graph(f.work.0, elapsed, graph.as_deref(), solo);
        }
        let tokens = self.area().settle_launches(ns, f.estimate, members);
        self.busy.truth.booked(ns);
        if let (Some(at), 1, false) = (f.drawn, members, stale) {
            self.costs.learned(f.work, at, whole);
        }
        if trace::on() {
            self.trace.charged(elapsed, ns, sharers, read_as, members);
            let gate = self.area().gate_closed();
            self.trace.tick(mono_ns(), self.quota.ordinal, tokens, gate);
        }
        let e = self.estimate.load(Ordering::Relaxed);
        self.estimate
            .store(averaged(e, ns / members), Ordering::Relaxed);
        self.meter.measured.fetch_add(members, Ordering::Relaxed);
    }

    /// Waits for the launches in flight (of context `ctx`, or all) to finish and charges them: the
    /// context is about to go, or the process to exit, and nothing would measure them later.
    pub(super) fn drain(&self, ctx: Option<usize>) {
        if FORKED.load(Ordering::Relaxed) {
            self.forget_parent();
            return;
        }
        let _quiet = quiet();
        self.timer.close_open(ctx);
        let ends: Vec<usize> = lock(&self.timer.flights)
            .queue
            .iter()
            .filter(|f| ctx.is_none_or(|c| f.ctx == c) && f.state == End::Recorded)
            .map(|f| f.end as usize)
            .collect();
        if !ends.is_empty() {
            let _relaxed = Relaxed::enter();
            for e in ends {
                event_wait(e as CUevent);
            }
        }
        self.harvest();
        if let Some(c) = ctx {
            self.timer.forget_context(c);
        }
    }

    /// A span's first launch waited `ns` before the GPU took it up: charged its part beside busy
    /// neighbours (`launch_charge::SoloBook::charge_wait`).
    fn waited(&self, ns: u64) {
        let stretch = lock(&self.solo).stretch();
        let sharers = self.busy.sharers_beside(mono_ns(), stretch);
        let charge = lock(&self.solo).charge_wait(ns, sharers);
        if charge > 0 {
            self.area().charge(charge);
            self.busy.truth.booked(charge);
            if trace::on() {
                self.trace.charged(ns, charge, sharers, 0, 1);
            }
        }
    }
}
