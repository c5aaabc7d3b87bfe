//! The hooks' side of blocking synchronisations and context teardown: what a synchronisation waits for
//! (`syncing`, before it), what it found finished (`synchronized`, after it: retired, charged at the
//! next one before it waits), and a context about to go (`context_ending`: its launches waited for and
//! charged while their events exist).

use std::sync::atomic::Ordering;

use super::events::{event_query, Relaxed};
use super::flight::{End, InFlight};
use super::quiet::quiet;
use super::{lock, mono_ns, off, shares, CUDA_ERROR_NOT_READY};
use crate::ffi::*;

/// What a blocking synchronisation waits for (`syncing`).
#[derive(Clone, Copy)]
pub enum Synced {
    /// A stream, as its entry point names it (`streams::named`).
    Stream(CUstream),
    /// Every stream of a context (null: the current one).
    Context(CUcontext),
    /// Something the share does not follow (an event).
    Other,
}

/// A blocking synchronisation about to wait (`syncing`), for `synchronized` after it returns.
pub struct Watch {
    what: Synced,
    /// It waits for the newest launch in flight, which was still running.
    running: bool,
}

/// After the application synchronised (`w`; `r`: the driver's answer, passed through): what finished
/// is retired now, and charged at the next synchronisation before it waits, or by a later launch
/// (`Share::retire`, `Share::admit`). A process that never launches again is charged at exit.
pub fn synchronized(w: Watch, r: CUresult) -> CUresult {
    if !off() {
        let ended_at = w.running.then(mono_ns);
        // What the synchronisation waited for is finished (when it succeeded). A default stream's
        // handle names a different stream per thread or context: those are asked, never assumed.
        let waited = match (r, w.what) {
            (CUDA_SUCCESS, Synced::Stream(s)) if s as usize > crate::streams::STREAM_PER_THREAD => {
                Some((Some(s as usize), None))
            }
            (CUDA_SUCCESS, Synced::Context(c)) if c.is_null() => {
                crate::streams::context(std::ptr::null_mut())
                    .ok()
                    .map(|c| (None, Some(c)))
            }
            (CUDA_SUCCESS, Synced::Context(c)) => Some((None, Some(c as usize))),
            _ => None,
        };
        let covered = |f: &InFlight| match waited {
            Some((Some(s), _)) => f.stream == s,
            Some((None, Some(c))) => f.ctx == c,
            _ => false,
        };
        for s in shares() {
            s.retire(&covered, ended_at);
            s.synced.store(true, Ordering::Relaxed);
        }
    }
    r
}

/// Before a blocking synchronisation of `what`: whether it waits for the newest launch in flight (its
/// stream, or its context) and that launch is still running. If so, the synchronisation returns when
/// that launch ends, which dates the end of its span (`synchronized`). A synchronisation of another
/// stream or context, or of an event, dates nothing: it may return long after the span ended.
pub fn syncing(what: Synced) -> Watch {
    if off() {
        return Watch {
            what,
            running: false,
        };
    }
    // The thread is about to wait for the GPU: open groups end now, while their work runs, and what
    // the last synchronisation retired is charged.
    for s in shares() {
        s.timer.close_open(None);
        if s.retired_at.load(Ordering::Relaxed) != 0 {
            let _relaxed = Relaxed::enter();
            s.settle_retired();
        }
    }
    let running = shares().any(|s| {
        let Some((end, stream, ctx)) = lock(&s.timer.flights).newest() else {
            return false;
        };
        let waits_for_it = match what {
            Synced::Stream(st) => st as usize == stream,
            Synced::Context(c) if c.is_null() => {
                crate::streams::context(std::ptr::null_mut()) == Ok(ctx)
            }
            Synced::Context(c) => c as usize == ctx,
            Synced::Other => false,
        };
        if !waits_for_it {
            return false;
        }
        // Its context may be torn down by another thread meanwhile: asked in a Quiet section, and only
        // while the launch is still in flight with its end recorded (`teardown`).
        let _quiet = quiet();
        let q = lock(&s.timer.flights);
        if !q
            .queue
            .back()
            .is_some_and(|f| f.end == end && f.state == End::Recorded)
        {
            return false;
        }
        drop(q);
        let _relaxed = Relaxed::enter();
        event_query(end) == CUDA_ERROR_NOT_READY
    });
    Watch { what, running }
}

/// The application asks whether a stream's or an event's work finished (`cuStreamQuery`,
/// `cuEventQuery`): it may be polling for the end of what it queued, and its next launch may come long
/// after, so open groups end now, while their work runs (`flight`). One atomic load per share when none
/// is open.
pub fn polling() {
    if off() {
        return;
    }
    for s in shares() {
        s.timer.close_open(None);
    }
}

/// Context `ctx` is about to be destroyed (or a primary context reset): its launches in flight are
/// waited for and charged while their events still exist.
pub fn context_ending(ctx: usize) {
    if off() {
        return;
    }
    for s in shares() {
        s.drain(Some(ctx));
    }
}

/// A stream is about to be destroyed (`cuStreamDestroy`): open groups end now, while it lives. A group's
/// end is recorded on its stream when the group closes; recorded after the application destroyed the
/// stream, it handed the driver freed memory (SIGSEGV inside libcuda in 3 of 20 share runs of the soak
/// on an H200). Closing every open group, not only the stream's, costs a little grouping and no lookup.
pub fn stream_ending() {
    polling();
}

/// A capture is about to begin on a stream (`cuStreamBeginCapture*`), or a stream to wait for an event
/// (`cuStreamWaitEvent`: a stream that waits for an event recorded in a capture joins that capture): open
/// groups end now. A group's end is recorded on its stream when the group closes; recorded into a capture,
/// it becomes a node of the application's graph and is never timed: the group was charged from an end
/// that never happened (on the fake driver, 50x its time; a GPU probe got 23.6% of the GPU under 10%).
pub fn capture_beginning() {
    polling();
}
