//! Contexts that go while the share's events live in them. A context's teardown (`cuCtxDestroy`, a
//! primary context's reset or last release, a green context's destroy) frees its events: an event of
//! it handed to the driver afterwards is freed memory, and the driver crashes on it at random (a reset
//! under a share crashed 8 of 21 runs of a benchmark on an H200), or fails, so that every later launch
//! went unmeasured at 1 ms. And a primary context made again after a reset has the same `CUcontext`
//! handle, so nothing keyed by the handle can tell the old context's events from the new one's.
//!
//! So a teardown (`Teardown`) first waits for the context's launches and charges them
//! (`sync::context_ending`), then, with no other thread touching an event of the share (`quiet`), lets
//! the driver destroy the context and forgets what was of it (`ended`): its launches still in flight are
//! charged as lost, never queried; its spare events and its span are dropped, never reused.

use std::sync::RwLockWriteGuard;

use super::flight::End;
use super::quiet::exclusive;
use super::{lock, off, shares, Share};

/// A context teardown in progress (`begin`, then the driver's call, then `end`).
pub struct Teardown {
    ctx: usize,
    guard: Option<RwLockWriteGuard<'static, ()>>,
}

/// Before the driver's call that may destroy context `ctx`: its launches in flight are waited for
/// and charged while their events exist, then no other thread touches an event of the share until
/// `end`. Costs nothing in a process without a share.
pub fn begin(ctx: usize) -> Teardown {
    if off() || ctx == 0 {
        return Teardown {
            ctx: 0,
            guard: None,
        };
    }
    super::sync::context_ending(ctx);
    Teardown {
        ctx,
        guard: exclusive(),
    }
}

impl Teardown {
    /// After the driver's call: `gone` when it destroyed the context. Its events are forgotten.
    pub fn end(mut self, gone: bool) {
        if gone && self.ctx != 0 {
            for s in shares() {
                s.ended(self.ctx);
            }
        }
        drop(self.guard.take());
    }
}

impl Share {
    /// Context `ctx` is gone with its events: what of it is still in flight (launched by another
    /// thread meanwhile) is charged as lost when the harvest reaches it, never queried; what a
    /// synchronisation retired is charged its estimate; its spare events and span are dropped.
    fn ended(&self, ctx: usize) {
        let retired: std::collections::VecDeque<_> = {
            let mut q = lock(&self.timer.flights);
            let mut closed = 0;
            for f in q.queue.iter_mut().filter(|f| f.ctx == ctx) {
                if f.state == End::Open {
                    closed += 1;
                }
                f.state = End::Failed;
                f.lent_end = false;
                f.probe = std::ptr::null_mut();
            }
            q.open = q.open.saturating_sub(closed);
            q.pending = None;
            let (gone, kept) = std::mem::take(&mut q.retired)
                .into_iter()
                .partition(|f| f.ctx == ctx);
            q.retired = kept;
            gone
        };
        for f in &retired {
            self.area().settle(f.estimate, f.estimate);
            self.busy.truth.booked(f.estimate);
        }
        self.timer.forget_context(ctx);
    }
}
