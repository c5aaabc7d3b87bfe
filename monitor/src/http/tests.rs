//! The server against slow, idle and greedy clients, on a loopback port.

use super::*;
use crate::watchdog::Policy;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Instant;
use vgpu_host::nvml::Fake;
use vgpu_host::state_root::StateRoot;

fn start(limits: Limits) -> (SocketAddr, tempfile::TempDir) {
    let d = tempfile::tempdir().unwrap();
    let m = Monitor::with_nvml(
        StateRoot::new(d.path().to_path_buf()),
        Some(Box::new(Fake::gpus(1, 16 << 30))),
        Policy {
            tolerance: 0,
            kill: false,
        },
    );
    m.collect();
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let m = Arc::new(m);
    std::thread::spawn(move || serve(m, l, limits, Duration::from_secs(3600)));
    (addr, d)
}

/// One request; the status line and the body.
fn get(addr: SocketAddr, path: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    (head.lines().next().unwrap_or("").into(), body.into())
}

/// Issue 25 item 5: one client sending a header byte every 3 s, and three idle connections, held the old
/// one-at-a-time server for 10 s and more per scrape.
#[test]
fn a_slow_client_and_idle_connections_do_not_delay_a_scrape() {
    let (addr, _d) = start(LIMITS);
    let mut slow = TcpStream::connect(addr).unwrap();
    std::thread::spawn(move || {
        for b in b"GET /metrics HTTP/1.1\r\nHost: slow\r\n" {
            if slow.write_all(&[*b]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_secs(3));
        }
    });
    let _idle: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    let (status, body) = get(addr, "/metrics");
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(body.ends_with("# EOF\n"), "{body}");
}

#[test]
fn healthz_build_info_and_unknown_paths() {
    let (addr, _d) = start(LIMITS);
    assert_eq!(
        get(addr, "/healthz"),
        ("HTTP/1.1 200 OK".into(), "ok\n".into())
    );
    assert_eq!(get(addr, "/nope").0, "HTTP/1.1 404 Not Found");
    let (_, body) = get(addr, "/metrics");
    assert!(
        body.lines()
            .any(|l| l.starts_with("vgpu_build_info{version=\"") && l.ends_with("} 1")),
        "{body}"
    );
}

/// A client past the header deadline is closed; headers past the byte cap are refused with 431; a peer
/// at its cap of idle connections makes room with its own oldest one, which is closed at once.
#[test]
fn deadlines_and_caps() {
    let limits = Limits {
        per_peer: 2,
        header_timeout: Duration::from_millis(300),
        ..LIMITS
    };
    let (addr, _d) = start(limits);
    let mut idle = TcpStream::connect(addr).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let t = Instant::now();
    let mut buf = [0u8; 256];
    let _ = idle.read(&mut buf);
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());

    let mut big = TcpStream::connect(addr).unwrap();
    let huge = "x".repeat(32 << 10);
    let _ = write!(
        big,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: {huge}\r\n\r\n"
    );
    let mut out = String::new();
    let _ = big.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.1 431"), "{out:.80}");

    let mut held: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    assert_eq!(get(addr, "/healthz").0, "HTTP/1.1 200 OK");
    held[0]
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    assert_eq!(
        held[0].read(&mut buf).unwrap_or(usize::MAX),
        0,
        "the oldest idle one is closed"
    );
    assert!(
        t.elapsed() < Duration::from_millis(250),
        "{:?}",
        t.elapsed()
    );
}

/// Issue 44: 16 loopback addresses × 16 idle connections filled the 256 slots (each address at its
/// per-peer cap), and every scrape was closed at once. Now a scrape from another address pushes out the
/// oldest idle connection of a peer that holds more than it, and is answered.
#[test]
fn many_peers_holding_idle_connections_do_not_starve_a_scrape() {
    let (addr, _d) = start(LIMITS);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .unwrap();
    let mut idle = vec![];
    for a in 2..18u8 {
        for _ in 0..16 {
            let s = rt.block_on(async {
                let sock = tokio::net::TcpSocket::new_v4().unwrap();
                sock.bind(SocketAddr::from(([127, 0, 0, a], 0))).unwrap();
                sock.connect(addr).await.unwrap().into_std().unwrap()
            });
            idle.push(s);
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..3 {
        let t = Instant::now();
        let (status, body) = get(addr, "/metrics");
        assert_eq!(status, "HTTP/1.1 200 OK", "after {:?}", t.elapsed());
        assert!(body.ends_with("# EOF\n"));
    }
    // A peer at its cap pushes out only its own: its 17th is answered, in place of its own oldest idle
    // connection (127.0.0.17's are the newest, none pushed out by the scrapes).
    let rt2 = rt.block_on(async {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind(SocketAddr::from(([127, 0, 0, 17], 0))).unwrap();
        sock.connect(addr).await.unwrap().into_std().unwrap()
    });
    let mut s = rt2;
    // Tokio's sockets come non-blocking: a read would return at once, whatever the server did.
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let _ = write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.1 200 OK"), "{out:.80}");
    let closed = |i: usize| {
        let mut c = &idle[i];
        c.set_nonblocking(false).unwrap();
        c.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        matches!(c.read(&mut [0u8; 16]), Ok(0))
    };
    // 127.0.0.17's are idle[240..256]: its oldest went, no other peer's newest did.
    assert!(closed(240), "its own oldest idle connection made room");
    assert!(!closed(241) && !closed(239), "no other was pushed out");
}

/// Issue 44: the chart's kube-rbac-proxy reaches the monitor from 127.0.0.1, as every local peer does.
/// 16 idle connections from 127.0.0.1 held that address's cap, and every scrape through the proxy was
/// closed at once. Now the scrape takes the slot of the oldest of them and is answered.
#[test]
fn idle_connections_from_the_scrapers_own_address_do_not_keep_it_out() {
    let (addr, _d) = start(LIMITS);
    let idle: Vec<TcpStream> = (0..16).map(|_| TcpStream::connect(addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(200));
    for _ in 0..3 {
        let (status, body) = get(addr, "/metrics");
        assert_eq!(status, "HTTP/1.1 200 OK");
        assert!(body.ends_with("# EOF\n"));
    }
    drop(idle);
}
