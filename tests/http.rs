//! The metrics HTTP server's bounds (README "Metrics and the status page",
//! "Limits"), spoken as raw HTTP over 127.0.0.1 to an `emq-router`
//! process: a request with a body is refused with 413 without its body
//! being read (a `Content-Length` of 99,999,999,999 once aborted the
//! router), a connection past `metrics_max_connections` takes the slot of
//! the slowest (a slowloris holding every slot does not keep a scraper
//! out), slow clients get 408 after `metrics_head_timeout` or
//! `metrics_request_timeout`, and the router's threads and descriptors do
//! not grow with HTTP connections.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::common::proc::TestDir;
use crate::common::router::{rust_router_bin, Router, RouterKind};
use crate::common::wait;
use crate::common::watchdog::Watchdog;

const T: Duration = Duration::from_secs(5);

fn start(name: &str, extra: &[&str]) -> (TestDir, Router, String) {
    let dir = TestDir::new(name);
    let router = Router::start_with(&dir, RouterKind::Rust(rust_router_bin()), extra);
    let addr = router.metrics.clone().expect("a Rust router serves metrics");
    let port: u16 = addr.rsplit(':').next().and_then(|p| p.parse().ok()).expect("a port");
    let up = wait::until(T, || crate::common::ports::is_listening(port));
    assert!(up, "metrics port {addr} not listening");
    (dir, router, addr)
}

fn connect(addr: &str) -> TcpStream {
    let s = TcpStream::connect(addr).expect("the HTTP server accepts");
    s.set_read_timeout(Some(T)).expect("read timeout");
    s
}

/// Reads until the server closes (or [`T`] passes): everything it sent.
fn read_all(s: &mut TcpStream) -> String {
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) => panic!("answer not read to its end ({e}); got so far: {:?}", String::from_utf8_lossy(&raw)),
        }
    }
    String::from_utf8_lossy(&raw).into_owned()
}

/// Sends `request` on a fresh connection and reads the answer to the close.
fn exchange(addr: &str, request: &[u8]) -> String {
    let mut s = connect(addr);
    s.write_all(request).expect("request sent");
    read_all(&mut s)
}

fn status_line(answer: &str) -> &str {
    answer.lines().next().unwrap_or("")
}

/// `GET /metrics`: the exposition text.
fn scrape(addr: &str) -> String {
    let answer = exchange(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(status_line(&answer), "HTTP/1.1 200 OK", "{answer}");
    answer
}

/// The value of `emq_events_total{event="<event>"}` in a scrape.
fn event(text: &str, event: &str) -> u64 {
    let prefix = format!("emq_events_total{{router=\"emq\",event=\"{event}\"}} ");
    let line = text.lines().find_map(|l| l.strip_prefix(prefix.as_str()));
    line.and_then(|v| v.trim().parse().ok()).unwrap_or_else(|| panic!("{prefix} missing\n{text}"))
}

fn threads(router: &Router) -> usize {
    std::fs::read_dir(format!("/proc/{}/task", router.child.pid())).expect("/proc/<pid>/task").count()
}

fn descriptors(router: &Router) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", router.child.pid())).expect("/proc/<pid>/fd").count()
}

#[test]
fn http_requests_with_a_body_get_413_unread_and_the_router_stays_up() {
    let _w = Watchdog::new("http_body_refused", 60);
    let (_dir, mut router, addr) = start("http-body", &[]);
    let huge = "Content-Length: 99999999999\r\n";
    let refused: Vec<(String, Vec<u8>)> = vec![
        ("GET /metrics, huge length".into(), format!("GET /metrics HTTP/1.1\r\nHost: x\r\n{huge}\r\n").into()),
        ("POST /, huge length".into(), format!("POST / HTTP/1.1\r\nHost: x\r\n{huge}\r\n").into()),
        ("GET /nope, huge length".into(), format!("GET /nope HTTP/1.1\r\nHost: x\r\n{huge}\r\n").into()),
        (
            "a length past u64".into(),
            b"GET / HTTP/1.1\r\nContent-Length: 999999999999999999999999999999\r\n\r\n".to_vec(),
        ),
        (
            "a chunked body, sent".into(),
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n".to_vec(),
        ),
        ("a chunked body never sent".into(), b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec()),
        ("10 bytes announced, none sent".into(), b"GET / HTTP/1.0\r\nContent-Length: 10\r\n\r\n".to_vec()),
    ];
    for (what, request) in &refused {
        let t0 = Instant::now();
        let answer = exchange(&addr, request);
        assert_eq!(status_line(&answer), "HTTP/1.1 413 Content Too Large", "{what}: {answer}");
        assert!(answer.contains("\r\nConnection: close\r\n"), "{what}: {answer}");
        assert!(t0.elapsed() < Duration::from_secs(2), "{what}: answered at once, not after a timeout");
        assert!(router.child.is_alive(), "{what}: the router died\n{}", router.child.log_tail(30));
    }
    // A body being sent while the answer comes: discarded, the answer read.
    let mut s = connect(&addr);
    s.write_all(b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 262144\r\n\r\n").expect("head sent");
    s.write_all(&vec![b'x'; 262_144]).expect("body sent (discarded by the server)");
    let answer = read_all(&mut s);
    assert_eq!(status_line(&answer), "HTTP/1.1 413 Content Too Large", "{answer}");
    // A head past 8 KiB: 431, the rest never buffered.
    let mut s = connect(&addr);
    let long = format!("GET /metrics HTTP/1.1\r\nX-Long: {}\r\n\r\n", "a".repeat(20_000));
    let _ = s.write_all(long.as_bytes()); // the server may close before it all arrives
    let answer = read_all(&mut s);
    assert_eq!(status_line(&answer), "HTTP/1.1 431 Request Header Fields Too Large", "{answer}");
    // The kind again, from empty lines before the request line (skipped,
    // RFC 9112 §2.2, but counted): a stream of them is a head past 8 KiB,
    // not a connection that holds the server's thread for its whole time.
    let mut s = connect(&addr);
    let _ = s.write_all(&b"\r\n".repeat(10_000));
    let answer = read_all(&mut s);
    assert_eq!(status_line(&answer), "HTTP/1.1 431 Request Header Fields Too Large", "{answer}");
    // Still served, every refusal counted.
    let text = scrape(&addr);
    assert_eq!(event(&text, "http_refused"), refused.len() as u64 + 3, "{text}");
    assert_eq!(event(&text, "http_requests"), refused.len() as u64 + 4, "{text}");
    let head = exchange(&addr, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(status_line(&head), "HTTP/1.1 200 OK", "{head}");
    assert!(head.ends_with("\r\n\r\n"), "HEAD has no body: {head}");
    let post = exchange(&addr, b"POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(status_line(&post), "HTTP/1.1 405 Method Not Allowed", "{post}");
    // A refused HEAD gets no body either (its Content-Length tells the
    // body's length, as for a HEAD answered 200).
    for refused_head in
        [&b"HEAD /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n"[..], b"HEAD /nope HTTP/1.0\r\n\r\n"]
    {
        let answer = exchange(&addr, refused_head);
        assert!(answer.starts_with("HTTP/1.1 4") && answer.ends_with("\r\n\r\n"), "no body: {answer}");
        assert!(answer.contains("\r\nContent-Length: "), "{answer}");
    }
    // HTTP/1.1 needs one Host field (RFC 9112 §3.2).
    for no_host in [&b"GET /metrics HTTP/1.1\r\n\r\n"[..], b"GET /metrics HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"] {
        let answer = exchange(&addr, no_host);
        assert_eq!(status_line(&answer), "HTTP/1.1 400 Bad Request", "{answer}");
        assert!(answer.contains("Host field"), "{answer}");
    }
    assert!(router.child.is_alive(), "{}", router.child.log_tail(30));
}

/// Whether `s` is still open with nothing to read (the server neither
/// answered nor closed it).
fn open_and_unanswered(s: &TcpStream) -> bool {
    s.set_nonblocking(true).expect("nonblocking");
    let mut byte = [0u8; 1];
    let open = matches!((&*s).read(&mut byte), Err(e) if e.kind() == ErrorKind::WouldBlock);
    s.set_nonblocking(false).expect("blocking");
    open
}

#[test]
fn http_connections_past_the_limit_take_the_slowest_ones_slot_and_threads_stay_bounded() {
    let _w = Watchdog::new("http_connection_limit", 90);
    // Long timeouts: here only the limit closes connections.
    let (_dir, mut router, addr) =
        start("http-limit", &["--metrics-head-timeout", "60s", "--metrics-request-timeout", "60s"]);
    scrape(&addr);
    std::thread::sleep(Duration::from_millis(300));
    let (threads_before, fds_before) = (threads(&router), descriptors(&router));
    // 64 (the default limit) idle connections take every slot; each of the
    // next 36 takes the slot of the one that has waited longest for its
    // request head, which is told 503 and closed.
    let limit = 64;
    let mut held: Vec<TcpStream> = (0..limit).map(|_| connect(&addr)).collect();
    let newer: Vec<TcpStream> = (0..36).map(|_| connect(&addr)).collect();
    for (i, s) in held.iter_mut().take(36).enumerate() {
        let answer = read_all(s);
        assert_eq!(status_line(&answer), "HTTP/1.1 503 Service Unavailable", "held connection {i}: {answer}");
        assert!(answer.contains("closed to make room for a newer connection"), "{answer}");
    }
    for (i, s) in held[36..].iter().chain(&newer).enumerate() {
        assert!(open_and_unanswered(s), "connection {} is still open and unanswered", i + 36);
    }
    let (threads_open, fds_open) = (threads(&router), descriptors(&router));
    assert!(threads_open <= threads_before, "{threads_open} threads with {limit} connections, {threads_before} before");
    assert!(fds_open <= fds_before + limit, "{fds_open} descriptors with {limit} connections, {fds_before} before");
    // A scrape gets through: it takes the slot of the oldest idle one left.
    let text = scrape(&addr);
    assert_eq!(status_line(&read_all(&mut held[36])), "HTTP/1.1 503 Service Unavailable");
    assert!(open_and_unanswered(&held[37]), "only one more made room");
    assert_eq!(event(&text, "http_connections_evicted"), 37, "{text}");
    assert_eq!(event(&text, "http_connections_refused"), 0, "{text}");
    drop(held);
    drop(newer);
    std::thread::sleep(Duration::from_millis(300));
    // 300 more connections come and go, in waves.
    for _ in 0..3 {
        let wave: Vec<TcpStream> = (0..50).map(|_| connect(&addr)).collect();
        for mut s in wave {
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").expect("request sent");
            assert_eq!(status_line(&read_all(&mut s)), "HTTP/1.1 200 OK");
        }
        let idle: Vec<TcpStream> = (0..50).map(|_| connect(&addr)).collect();
        assert!(threads(&router) <= threads_before, "threads grew with 50 idle connections");
        drop(idle);
        std::thread::sleep(Duration::from_millis(300));
    }
    std::thread::sleep(Duration::from_millis(500));
    let text = scrape(&addr);
    assert_eq!(event(&text, "http_connections_refused"), 0, "{text}");
    let (threads_after, fds_after) = (threads(&router), descriptors(&router));
    assert!(threads_after <= threads_before, "{threads_after} threads after, {threads_before} before");
    assert!(fds_after <= fds_before + 2, "{fds_after} descriptors after, {fds_before} before");
    assert!(router.child.is_alive(), "{}", router.child.log_tail(30));
}

#[test]
fn metrics_are_served_while_70_slow_clients_that_reconnect_hold_every_slot() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let _w = Watchdog::new("http_slowloris", 90);
    // The defaults: 64 connections, 5 s for a request head, 10 s in all.
    let (_dir, mut router, addr) = start("http-slowloris", &[]);
    // The slowloris: 70 connections, each sending a request head a byte
    // every 100 ms, never finishing it, and connecting again when closed.
    let stop = Arc::new(AtomicBool::new(false));
    let attack = {
        let (stop, addr) = (stop.clone(), addr.clone());
        std::thread::spawn(move || {
            let mut conns: Vec<Option<TcpStream>> = (0..70).map(|_| None).collect();
            let mut connected = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for c in conns.iter_mut() {
                    if c.as_mut().is_some_and(|s| s.write_all(b"a").is_ok()) {
                        continue;
                    }
                    *c = TcpStream::connect(&addr).ok();
                    if let Some(s) = c.as_mut() {
                        connected += 1;
                        let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ");
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            connected
        })
    };
    std::thread::sleep(Duration::from_secs(1));
    // 40 scrapes over 8 s, as a monitor polls: every one is answered.
    let mut evicted = 0;
    for probe in 0..40 {
        let answer = exchange(&addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(status_line(&answer), "HTTP/1.1 200 OK", "probe {probe} under the slowloris: {answer}");
        evicted = event(&answer, "http_connections_evicted");
        std::thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, Ordering::Relaxed);
    let connected = attack.join().expect("the slow clients' thread");
    assert!(connected > 70, "the slow clients were closed and came back ({connected} connections)");
    assert!(evicted >= 40, "each scrape took a slow client's slot ({evicted} evicted)");
    assert!(router.child.is_alive(), "{}", router.child.log_tail(30));
}

#[test]
fn http_slow_and_idle_clients_get_408_at_the_request_timeout() {
    let _w = Watchdog::new("http_request_timeout", 60);
    let (_dir, router, addr) =
        start("http-timeout", &["--metrics-request-timeout", "1s", "--metrics-max-connections", "4"]);
    let t0 = Instant::now();
    let mut slow = connect(&addr);
    slow.write_all(b"GET /metr").expect("a part of a request line");
    let mut idle = connect(&addr);
    for s in [&mut slow, &mut idle] {
        let answer = read_all(s);
        assert_eq!(status_line(&answer), "HTTP/1.1 408 Request Timeout", "{answer}");
    }
    let waited = t0.elapsed();
    assert!(waited >= Duration::from_millis(900) && waited < Duration::from_secs(3), "closed after {waited:?}");
    // A trickle that keeps sending does not keep the connection either:
    // writes fail once the server closed it.
    let mut trickle = connect(&addr);
    let t0 = Instant::now();
    let bytes = b"GET /metrics HTTP/1.1\r\nX-Slow: ".iter().chain([b'a'; 100].iter());
    let closed = bytes.into_iter().any(|b| {
        std::thread::sleep(Duration::from_millis(50));
        trickle.write_all(&[*b]).is_err()
    });
    assert!(closed, "a trickling client is cut off");
    assert!(t0.elapsed() < Duration::from_secs(3), "the trickle was cut at about 1 s: {:?}", t0.elapsed());
    let text = scrape(&addr);
    assert_eq!(event(&text, "http_timed_out"), 3, "{text}");
    assert_eq!(event(&text, "http_connections_refused"), 0, "{text}");
    drop(router);
    // The head has its own, shorter deadline (metrics_head_timeout) within
    // the whole exchange's.
    let (_dir, _router, addr) = start("http-head-timeout", &["--metrics-head-timeout", "1s"]);
    let t0 = Instant::now();
    let mut idle = connect(&addr);
    let answer = read_all(&mut idle);
    assert_eq!(status_line(&answer), "HTTP/1.1 408 Request Timeout", "{answer}");
    assert!(answer.ends_with("request head not complete within 1 s\n"), "{answer}");
    let waited = t0.elapsed();
    assert!(waited >= Duration::from_millis(900) && waited < Duration::from_secs(3), "closed after {waited:?}");
}
