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

/// `tcp://127.0.0.1:<port>`, the ZeroMQ endpoint for `port`.
pub fn zmq_endpoint(port: u16) -> String {
    format!("tcp://127.0.0.1:{port}")
}

/// True when something accepts TCP connections on 127.0.0.1:`port`.
pub fn is_listening(port: u16) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok()
}
