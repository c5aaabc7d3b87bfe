//! The names Docker gave its containers, asked of dockerd over its API socket, for `vgpuctl status` and
//! the monitor's `container` label ([`Cache`]: each id asked about once). Docker's OCI spec carries no name (its hostname and annotations hold none in the
//! versions tested: 20.10), so the only source is dockerd itself. The question is one read-only
//! `GET /containers/json?all=1` (the list dockerd serves from its in-memory view, no container lock
//! taken), under a deadline on the whole exchange (connect, request, answer) and a cap on the answer's
//! size: a dockerd that hangs or floods costs a status at most [`DEADLINE`] and falls back to the ids.
//! Names are chosen by whoever ran `docker run`: callers show them through `vgpu_host::printable`.
//! Not here: which containers are Docker's (a name is shown only for an id dockerd lists).
use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio::net::UnixStream;

/// The most a question to dockerd may take, all of it.
pub const DEADLINE: Duration = Duration::from_secs(2);
/// The largest list read (a few KiB per container).
pub const MAX_ANSWER: usize = 16 << 20;
/// dockerd's socket when `DOCKER_HOST` does not name one.
pub const DEFAULT_SOCKET: &str = "/var/run/docker.sock";

#[derive(Debug, thiserror::Error)]
pub enum DockerError {
    #[error("cannot start the client: {0}")]
    Runtime(std::io::Error),
    #[error("cannot reach dockerd at {path}: {source}")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("dockerd did not answer within {0:?}")]
    Deadline(Duration),
    #[error("dockerd's answer: {0}")]
    Http(#[from] hyper::Error),
    #[error("dockerd answered HTTP {0}")]
    Status(u16),
    #[error("dockerd's answer is larger than {MAX_ANSWER} bytes or broken")]
    Body,
    #[error("dockerd's answer is not a container list: {0}")]
    Json(#[from] serde_json::Error),
}

/// The socket to ask: `DOCKER_HOST`'s when it is `unix://PATH`, none when it names another transport
/// (vgpu asks no remote daemon), else [`DEFAULT_SOCKET`].
pub fn socket(docker_host: Option<&str>) -> Option<PathBuf> {
    match docker_host.filter(|h| !h.is_empty()) {
        Some(h) => h.strip_prefix("unix://").map(PathBuf::from),
        None => Some(PathBuf::from(DEFAULT_SOCKET)),
    }
}

/// Every container dockerd knows, running or not: its full id to its name (without Docker's leading `/`).
pub fn names(socket: &Path, deadline: Duration) -> Result<HashMap<String, String>, DockerError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(DockerError::Runtime)?;
    rt.block_on(async {
        tokio::time::timeout(deadline, list(socket))
            .await
            .map_err(|_| DockerError::Deadline(deadline))?
    })
}

async fn list(socket: &Path) -> Result<HashMap<String, String>, DockerError> {
    let stream = UnixStream::connect(socket)
        .await
        .map_err(|source| DockerError::Connect {
            path: socket.to_path_buf(),
            source,
        })?;
    let (mut sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
    // The connection is driven beside the request; it ends with the runtime (at most at the deadline).
    tokio::spawn(conn);
    let req = hyper::Request::get("/containers/json?all=1")
        .header(hyper::header::HOST, "docker")
        .body(Empty::<Bytes>::new())
        .expect("a constant request is well-formed");
    let res = sender.send_request(req).await?;
    if !res.status().is_success() {
        return Err(DockerError::Status(res.status().as_u16()));
    }
    let body = Limited::new(res.into_body(), MAX_ANSWER)
        .collect()
        .await
        .map_err(|_| DockerError::Body)?
        .to_bytes();
    parse(&body)
}

/// One entry of dockerd's list (other fields ignored).
#[derive(Deserialize)]
struct Listed {
    #[serde(rename = "Id")]
    id: String,
    #[serde(rename = "Names", default)]
    names: Vec<String>,
}

/// The list's ids to names. A container linked to others also carries `/<other>/<alias>` names: its own
/// is the one with no `/` past the first.
fn parse(body: &[u8]) -> Result<HashMap<String, String>, DockerError> {
    let listed: Vec<Listed> = serde_json::from_slice(body)?;
    Ok(listed
        .into_iter()
        .filter_map(|l| {
            let own = l
                .names
                .iter()
                .map(|n| n.strip_prefix('/').unwrap_or(n))
                .find(|n| !n.contains('/'))?
                .to_string();
            Some((l.id, own))
        })
        .collect())
}

/// How long the monitor leaves dockerd alone after a question that failed (a stopped or mute dockerd
/// costs a collection the deadline at most once a minute).
pub const RETRY_AFTER: Duration = Duration::from_secs(60);

/// The monitor's names of Docker's containers: dockerd is asked only when a container without a name
/// appears, and what it says is kept while the container's state is there (a container dockerd does
/// not list, one of another engine, is kept as nameless). A name a container got later (`docker rename`)
/// is not seen.
#[derive(Debug)]
pub struct Cache {
    socket: Option<PathBuf>,
    deadline: Duration,
    known: HashMap<String, Option<String>>,
    failed_at: Option<Instant>,
}

impl Cache {
    /// Asking dockerd at `socket` (None: never asking) within `deadline`.
    pub fn new(socket: Option<PathBuf>, deadline: Duration) -> Cache {
        Cache {
            socket,
            deadline,
            known: HashMap::new(),
            failed_at: None,
        }
    }

    /// The Docker name of each of `ids` (None: not Docker's, or dockerd not reachable). Forgets ids not
    /// among them.
    pub fn names(&mut self, ids: &[String]) -> Vec<Option<String>> {
        let wanted: std::collections::HashSet<&String> = ids.iter().collect();
        self.known.retain(|id, _| wanted.contains(id));
        let resting = self.failed_at.is_some_and(|t| t.elapsed() < RETRY_AFTER);
        if ids.iter().any(|id| !self.known.contains_key(id)) && !resting {
            if let Some(sock) = self.socket.as_deref().filter(|s| s.exists()) {
                match names(sock, self.deadline) {
                    Ok(all) => {
                        self.failed_at = None;
                        for id in ids {
                            self.known
                                .entry(id.clone())
                                .or_insert_with(|| all.get(id).cloned());
                        }
                    }
                    Err(_) => self.failed_at = Some(Instant::now()),
                }
            }
        }
        ids.iter()
            .map(|id| self.known.get(id).cloned().flatten())
            .collect()
    }
}

#[cfg(test)]
mod tests;
