//! The monitor's HTTP server: `GET /metrics` (the last collection, encoded), `GET /healthz` (whether the
//! collector keeps reading) and `/` (a pointer). Served by hyper's HTTP/1 server on a one-thread tokio
//! runtime: every connection is its own task, so a slow or idle client holds a slot, never the scrapes.
//! Each connection has a whole-request deadline (headers and answer; one request per connection), hyper
//! caps the header bytes and count and closes a client that has not sent its headers in time, and
//! connections are capped in all and per peer address, so one tenant cannot take every slot from the node's
//! Prometheus. At its peer's cap a newcomer takes the slot of that peer's own oldest connection that has
//! not sent its request yet (closed at once when there is none): a scraper that shares its address with
//! others (the chart's kube-rbac-proxy, which reaches the monitor from 127.0.0.1 like every local peer) is
//! not kept out by their idle connections. With every slot taken, a newcomer takes the slot of the oldest
//! connection that has not sent its request yet, of a peer that holds at least as many connections as the
//! newcomer's peer then would (`Slots::take`): no set of peers can keep a scraper out by holding idle
//! connections (issue 44: 16 addresses × 16 idle connections filled the 256), and a peer can only ever push
//! out peers holding as many as it does. The accept loop yields after each connection, so a connection
//! whose request is already there is answered (never pushed out) before a flood of newcomers is accepted.
//!
//! Why hyper rather than tiny_http: tiny_http has no header-size cap and no deadline on a whole request
//! (its timeouts are per read, the hole a one-byte-every-3-s client used), and it spends a thread per
//! connection. hyper (with `hyper-util`'s tokio glue) is the maintained stack with both caps and the
//! header deadline built in; on a current-thread runtime it adds no thread to the monitor, and with only
//! its `http1` and `server` features it adds little to vgpuctl. axum's router is not needed for three paths.

use crate::collector::Monitor;
use crate::stderr::log;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::io::Result;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::AbortHandle;

/// What one client may take of the server.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections open at once, in all.
    pub connections: usize,
    /// Connections open at once from one peer address.
    pub per_peer: usize,
    /// Time from the accept to the end of the answer; the connection is closed when it runs out.
    pub deadline: Duration,
    /// Time to send the request line and headers.
    pub header_timeout: Duration,
    /// Bytes of request line and headers.
    pub header_bytes: usize,
    /// Number of headers.
    pub headers: usize,
}

/// The monitor's limits: a scrape needs one connection for well under a second and a few hundred header
/// bytes; Prometheus's own scrape timeout is 10 s by default.
pub const LIMITS: Limits = Limits {
    connections: 256,
    per_peer: 16,
    deadline: Duration::from_secs(10),
    header_timeout: Duration::from_secs(5),
    header_bytes: 16 << 10,
    headers: 64,
};

/// Serves `monitor` on `listener` under `limits` until an error stops the runtime. `stale_after`: the
/// age past which the last collection makes `/healthz` answer 503 (the collector is stuck).
pub fn serve(
    monitor: Arc<Monitor>,
    listener: std::net::TcpListener,
    limits: Limits,
    stale_after: Duration,
) -> Result<()> {
    listener.set_nonblocking(true)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()?;
    rt.block_on(accept_loop(monitor, listener, limits, stale_after))
}

async fn accept_loop(
    monitor: Arc<Monitor>,
    listener: std::net::TcpListener,
    limits: Limits,
    stale_after: Duration,
) -> Result<()> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let slots = Slots::new(limits);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors or the like: say so, and give the open connections time to end.
                log(&format!("accept: {e}"));
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some(slot) = slots.take(peer.ip()) else {
            drop(stream);
            continue;
        };
        let (m, id, busy) = (monitor.clone(), slot.id, slots.clone());
        let task = tokio::spawn(async move {
            let _slot = slot;
            let service = service_fn(move |req| {
                let m = m.clone();
                busy.busy(id);
                async move { Ok::<_, Infallible>(answer(&m, &req, stale_after)) }
            });
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .max_header_size(limits.header_bytes)
                .max_headers(limits.headers)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            // Past the deadline the connection is dropped, whatever it was doing.
            let _ = tokio::time::timeout(limits.deadline, conn).await;
        });
        slots.started(id, task.abort_handle());
        // Let the new connection read a request that is already there before the next accept: a flood of
        // newcomers from its address cannot push it out while it was about to be answered.
        tokio::task::yield_now().await;
    }
}

/// The open connections, in all and per peer; a taken slot is given back when dropped.
#[derive(Clone)]
struct Slots {
    limits: Limits,
    open: Arc<Mutex<Table>>,
}

#[derive(Default)]
struct Table {
    next: u64,
    conns: BTreeMap<u64, Conn>,
    by_peer: HashMap<IpAddr, usize>,
}

/// One open connection: its peer, whether its request came (then it is answered, never pushed out), and
/// its task (none until spawned).
struct Conn {
    peer: IpAddr,
    asked: bool,
    task: Option<AbortHandle>,
}

struct Slot {
    slots: Slots,
    id: u64,
}

impl Table {
    fn count(&self, peer: &IpAddr) -> usize {
        self.by_peer.get(peer).copied().unwrap_or(0)
    }

    /// Closes connection `id` (its task aborted) and gives its slot back.
    fn push_out(&mut self, id: u64) {
        if let Some(task) = self.remove(id).and_then(|c| c.task) {
            task.abort();
        }
    }

    fn remove(&mut self, id: u64) -> Option<Conn> {
        let c = self.conns.remove(&id)?;
        if let Some(n) = self.by_peer.get_mut(&c.peer) {
            *n -= 1;
            if *n == 0 {
                self.by_peer.remove(&c.peer);
            }
        }
        Some(c)
    }
}

impl Slots {
    fn new(limits: Limits) -> Slots {
        Slots {
            limits,
            open: Arc::default(),
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot for a connection from `peer`, or none when no connection may be pushed out for it: at the
    /// peer's cap, its own oldest that has not sent its request; with every slot taken, the oldest that has
    /// not sent its request, of a peer holding at least as many connections as `peer` will (ids grow with
    /// time: the smallest is the oldest).
    fn take(&self, peer: IpAddr) -> Option<Slot> {
        let mut t = self.table();
        let mine = t.count(&peer) + 1;
        if mine > self.limits.per_peer {
            // At its own cap: only its own oldest idle connection makes room.
            let own = t
                .conns
                .iter()
                .find(|(_, c)| !c.asked && c.peer == peer)
                .map(|(id, _)| *id)?;
            t.push_out(own);
        } else if t.conns.len() >= self.limits.connections {
            let victim = t
                .conns
                .iter()
                .find(|(_, c)| !c.asked && t.count(&c.peer) >= mine)
                .map(|(id, _)| *id)?;
            t.push_out(victim);
        }
        let id = t.next;
        t.next += 1;
        t.conns.insert(
            id,
            Conn {
                peer,
                asked: false,
                task: None,
            },
        );
        *t.by_peer.entry(peer).or_default() += 1;
        Some(Slot {
            slots: self.clone(),
            id,
        })
    }

    /// The connection's task runs (it can be pushed out).
    fn started(&self, id: u64, task: AbortHandle) {
        if let Some(c) = self.table().conns.get_mut(&id) {
            c.task = Some(task);
        }
    }

    /// The connection's request came: it is answered, never pushed out.
    fn busy(&self, id: u64) {
        if let Some(c) = self.table().conns.get_mut(&id) {
            c.asked = true;
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.table().remove(self.id);
    }
}

/// The answer to one request.
fn answer(m: &Monitor, req: &Request<Incoming>, stale_after: Duration) -> Response<Full<Bytes>> {
    let text = |status, body: String| reply(status, "text/plain; charset=utf-8", body);
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET\n".into());
    }
    match req.uri().path() {
        "/metrics" => reply(
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            m.scrape(),
        ),
        "/healthz" => {
            let age = m.latest().at.elapsed();
            if age <= stale_after {
                text(StatusCode::OK, "ok\n".into())
            } else {
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("stale: the last reading is {} s old\n", age.as_secs()),
                )
            }
        }
        "/" => text(StatusCode::OK, "vgpu monitor: see /metrics\n".into()),
        _ => text(StatusCode::NOT_FOUND, "not found\n".into()),
    }
}

fn reply(status: StatusCode, ctype: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(ctype));
    r
}

#[cfg(test)]
mod tests;
