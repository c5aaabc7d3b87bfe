//! dockerd's list asked of a stand-in: a Unix socket served by a thread with a canned answer.
use super::*;
use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Serves one connection on a socket in `dir`: reads the request, then writes `answer` (None: says
/// nothing and holds the connection until the test ends). Returns the socket and the request read.
fn serve(dir: &Path, answer: Option<Vec<u8>>) -> (PathBuf, std::thread::JoinHandle<String>) {
    let path = dir.join("docker.sock");
    let l = UnixListener::bind(&path).unwrap();
    let t = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut req = Vec::new();
        let mut buf = [0u8; 4096];
        while !req.ends_with(b"\r\n\r\n") {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => req.extend_from_slice(&buf[..n]),
            }
        }
        match answer {
            Some(a) => {
                let _ = s.write_all(&a);
            }
            None => std::thread::sleep(Duration::from_secs(3)),
        }
        String::from_utf8_lossy(&req).into_owned()
    });
    (path, t)
}

fn http(status: &str, body: &[u8]) -> Vec<u8> {
    let mut a = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    a.extend_from_slice(body);
    a
}

#[test]
fn the_list_gives_each_id_its_own_name() {
    let d = tempfile::tempdir().unwrap();
    let body = br#"[{"Id":"aaa","Names":["/web"],"Image":"x"},
        {"Id":"bbb","Names":["/web/db","/db"]},{"Id":"ccc","Names":[]}]"#;
    let (sock, t) = serve(d.path(), Some(http("200 OK", body)));
    let names = names(&sock, DEADLINE).unwrap();
    assert_eq!(names.get("aaa").map(String::as_str), Some("web"));
    assert_eq!(names.get("bbb").map(String::as_str), Some("db"));
    assert_eq!(names.get("ccc"), None);
    let req = t.join().unwrap();
    assert!(
        req.starts_with("GET /containers/json?all=1 HTTP/1.1\r\n"),
        "{req}"
    );
}

#[test]
fn a_dockerd_that_says_nothing_costs_the_deadline_only() {
    let d = tempfile::tempdir().unwrap();
    let (sock, _t) = serve(d.path(), None);
    let start = Instant::now();
    let e = names(&sock, Duration::from_millis(300)).unwrap_err();
    assert!(matches!(e, DockerError::Deadline(_)), "{e:?}");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn an_answer_past_the_cap_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let body = vec![b' '; MAX_ANSWER + 1];
    let (sock, _t) = serve(d.path(), Some(http("200 OK", &body)));
    let e = names(&sock, Duration::from_secs(10)).unwrap_err();
    assert!(matches!(e, DockerError::Body), "{e:?}");
}

#[test]
fn an_error_status_or_a_foreign_body_is_an_error() {
    let d = tempfile::tempdir().unwrap();
    let (sock, _t) = serve(d.path(), Some(http("500 Internal Server Error", b"{}")));
    assert!(matches!(
        names(&sock, DEADLINE),
        Err(DockerError::Status(500))
    ));
    let d = tempfile::tempdir().unwrap();
    let (sock, _t) = serve(d.path(), Some(http("200 OK", br#"{"message":"x"}"#)));
    assert!(matches!(names(&sock, DEADLINE), Err(DockerError::Json(_))));
}

#[test]
fn no_socket_is_a_connect_error() {
    let d = tempfile::tempdir().unwrap();
    let e = names(&d.path().join("none.sock"), DEADLINE).unwrap_err();
    assert!(matches!(e, DockerError::Connect { .. }), "{e:?}");
}

#[test]
fn the_socket_comes_from_docker_host_when_it_is_a_unix_one() {
    assert_eq!(socket(None), Some(PathBuf::from(DEFAULT_SOCKET)));
    assert_eq!(socket(Some("")), Some(PathBuf::from(DEFAULT_SOCKET)));
    assert_eq!(
        socket(Some("unix:///tmp/d/docker.sock")),
        Some(PathBuf::from("/tmp/d/docker.sock"))
    );
    assert_eq!(socket(Some("tcp://10.0.0.1:2375")), None);
}

/// Serves `answer` to every connection on a socket in `dir`, counting them.
fn serve_all(dir: &Path, answer: Vec<u8>) -> (PathBuf, Arc<AtomicUsize>) {
    let path = dir.join("docker.sock");
    let l = UnixListener::bind(&path).unwrap();
    let n = Arc::new(AtomicUsize::new(0));
    let count = n.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            count.fetch_add(1, Ordering::SeqCst);
            let mut buf = [0u8; 4096];
            let mut req = Vec::new();
            while !req.ends_with(b"\r\n\r\n") {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => req.extend_from_slice(&buf[..n]),
                }
            }
            let _ = s.write_all(&answer);
        }
    });
    (path, n)
}

// The monitor asks dockerd once per container, not once per collection: ids it knows, named or not,
// ask nothing; a new id asks again; a gone id is forgotten.
#[test]
fn the_cache_asks_dockerd_only_for_ids_it_has_not_seen() {
    let d = tempfile::tempdir().unwrap();
    let body = br#"[{"Id":"aaa","Names":["/web"]},{"Id":"bbb","Names":["/db"]}]"#;
    let (sock, asked) = serve_all(d.path(), http("200 OK", body));
    let mut c = Cache::new(Some(sock), DEADLINE);
    let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        c.names(&ids(&["aaa", "podman1"])),
        vec![Some("web".to_string()), None]
    );
    assert_eq!(asked.load(Ordering::SeqCst), 1);
    assert_eq!(
        c.names(&ids(&["aaa", "podman1"])),
        vec![Some("web".to_string()), None]
    );
    assert_eq!(asked.load(Ordering::SeqCst), 1, "known ids ask nothing");
    assert_eq!(
        c.names(&ids(&["aaa", "bbb"])),
        vec![Some("web".to_string()), Some("db".to_string())]
    );
    assert_eq!(asked.load(Ordering::SeqCst), 2, "a new id asks again");
    assert_eq!(c.known.len(), 2, "podman1 forgotten: {:?}", c.known);
}

// A mute dockerd costs one collection the deadline, then none until RETRY_AFTER has passed.
#[test]
fn the_cache_rests_after_a_failed_question() {
    let d = tempfile::tempdir().unwrap();
    let (sock, _t) = serve(d.path(), None);
    let mut c = Cache::new(Some(sock), Duration::from_millis(200));
    let ids = vec!["aaa".to_string()];
    let start = Instant::now();
    assert_eq!(c.names(&ids), vec![None]);
    assert!(start.elapsed() >= Duration::from_millis(200));
    let again = Instant::now();
    assert_eq!(c.names(&ids), vec![None]);
    assert!(
        again.elapsed() < Duration::from_millis(100),
        "{:?}",
        again.elapsed()
    );
    assert!(c.failed_at.is_some());
}
