//! Fresh TCP ports on 127.0.0.1 for the processes a test starts.
//!
//! A port is found by binding `127.0.0.1:0` and closing the socket; a
//! process-wide set makes sure no two callers in this test binary get the
//! same port. (Another program could still grab it in between; the router
//! helper then fails to start with a clear message.)

use std::collections::HashSet;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Mutex;
use std::time::Duration;

static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// A currently free port on 127.0.0.1 not handed out before in this process.
///
/// Panics if the OS gives no free port in 100 tries.
pub fn free_port() -> u16 {
    let mut handed = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    let handed = handed.get_or_insert_with(HashSet::new);
    for _ in 0..100 {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("local_addr").port();
        if handed.insert(port) {
            return port;
        }
    }
    panic!("no fresh loopback port in 100 tries");
}

/// A currently free port on 127.0.0.1 below the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`), not handed out before in this
/// process: for an address a test dials while nothing listens there yet.
/// A port in the ephemeral range can be picked as the source port of one
/// of those dials, and a TCP connect to a local port that is its own
/// source port connects the socket to itself (simultaneous open): a
/// ZeroMQ DEALER then completes the handshake with itself, is answered
/// by its own messages, and never reaches the router that binds the port
/// later. Panics if no such port is free.
pub fn free_port_outside_ephemeral() -> u16 {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|p| p.parse::<u16>().ok()))
        .unwrap_or(32768);
    let first = 10_000u16.min(low.saturating_sub(1000));
    let span = low.saturating_sub(first).max(1);
    let start = first + (std::process::id() % u32::from(span)) as u16;
    let mut handed = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    let handed = handed.get_or_insert_with(HashSet::new);
    for i in 0..span {
        let port = first + (start - first + i) % span;
        if handed.contains(&port) {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            handed.insert(port);
            return port;
        }
    }
    panic!("no free loopback port below the ephemeral range ({first}..{low})");
}

/// `tcp://127.0.0.1:<port>`, the ZeroMQ endpoint for `port`.
pub fn zmq_endpoint(port: u16) -> String {
    format!("tcp://127.0.0.1:{port}")
}

/// True when something accepts TCP connections on 127.0.0.1:`port`.
pub fn is_listening(port: u16) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok()
}
