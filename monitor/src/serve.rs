//! The monitor's loop: the stop signals' thread (what the share wall froze is thawed before it exits), the
//! collector's and the time-quanta arbiter's threads, and the HTTP server (`http`) on the caller's
//! listener. Not here: what a collection does (`collector`).

use crate::collector::Monitor;
use crate::http;
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

/// Why the monitor stopped (it runs until one of these).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// SIGTERM and SIGINT could not be blocked for the thread that waits for them.
    #[error(transparent)]
    Signals(#[from] nix::errno::Errno),
    /// A thread (the collector, or the one that waits for the stop signals) could not be started, or the
    /// HTTP server stopped.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Collects (and runs the watchdog) every `interval` and serves `GET /metrics` and `GET /healthz` on
/// `listener` (`http`); returns only on error.
pub fn run(
    monitor: Arc<Monitor>,
    listener: TcpListener,
    interval: Duration,
) -> Result<(), RunError> {
    // SIGTERM and SIGINT are taken by a thread of their own (blocked here, before any thread starts, so
    // every thread inherits the mask): what the share wall froze is thawed before the monitor exits.
    use nix::sys::signal::{SigSet, Signal};
    let mut stop = SigSet::empty();
    stop.add(Signal::SIGTERM);
    stop.add(Signal::SIGINT);
    stop.thread_block()?;
    let m = monitor.clone();
    std::thread::Builder::new()
        .name("stop".into())
        .spawn(move || {
            if let Ok(sig) = stop.wait() {
                m.share.thaw_all();
                if let Some(a) = &m.turns {
                    a.stop();
                }
                std::process::exit(128 + sig as i32);
            }
        })?;
    // What the share wall of a run killed outright (SIGKILL, the OOM killer) left frozen is thawed first.
    monitor.share.thaw_left_frozen();
    // The first reading is made before the first request is accepted: a scrape never waits for one.
    monitor.collect();
    if let Some(a) = monitor.turns.clone() {
        // Its own thread, beating every tick: a collection that takes long never stalls a turn.
        a.thaw_left_frozen();
        let m = monitor.clone();
        let tick = a.turns().tick;
        std::thread::Builder::new()
            .name("turns".into())
            .spawn(move || loop {
                m.turns_tick();
                std::thread::sleep(tick);
            })?;
    }
    let m = monitor.clone();
    std::thread::Builder::new()
        .name("collector".into())
        .spawn(move || loop {
            // Wakes to thaw what the share wall froze when its time is up.
            m.share.sleep(interval);
            m.collect();
        })?;
    Ok(http::serve(
        monitor,
        listener,
        http::LIMITS,
        interval * 3 + Duration::from_secs(30),
    )?)
}
