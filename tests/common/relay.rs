//! A recording TCP relay for wire-level tests: it listens on a fresh
//! loopback port, forwards every accepted connection to a target port, and
//! keeps a copy of the bytes of both directions, so a test can check what
//! an observer on the network would see (e.g. no job body in plaintext over
//! CURVE). Protocol-agnostic: eMQP/ZMTP here, reusable for the text and
//! HTTP tests.
//!
//! Each direction's recording is capped at [`RECORD_LIMIT`] bytes (later
//! bytes are still forwarded, not kept; [`Relay::dropped`] counts them).
//! Threads stop when the [`Relay`] is dropped (the acceptor polls a stop
//! flag every [`POLL`]; the copying threads end when drop shuts their
//! sockets down), so nothing outlives the test.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Bytes kept per direction; more are forwarded but not recorded.
pub const RECORD_LIMIT: usize = 16 << 20;
/// How often the idle acceptor looks at the stop flag.
pub const POLL: Duration = Duration::from_millis(50);

/// The recordings and the stop flag, shared with the relay's threads.
#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    /// Client to target.
    up: Mutex<Vec<u8>>,
    /// Target to client.
    down: Mutex<Vec<u8>>,
    dropped: AtomicU64,
    connections: AtomicU64,
    /// Every relayed socket, shut down on drop to end the blocking reads.
    streams: Mutex<Vec<TcpStream>>,
}

/// A running relay (see the module docs); stops its threads on drop.
pub struct Relay {
    /// `tcp://127.0.0.1:<port>`: point the peer here instead of the target.
    pub endpoint: String,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl Relay {
    /// Starts a relay on a fresh loopback port forwarding to
    /// `127.0.0.1:target_port`. Panics if it cannot listen (a test setup error).
    pub fn start(target_port: u16) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("relay: bind a loopback port");
        let port = listener.local_addr().expect("relay: local address").port();
        listener.set_nonblocking(true).expect("relay: non-blocking listener");
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        let acceptor = std::thread::spawn(move || {
            let mut pipes = Vec::new();
            while !s.stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        // Accepted sockets do not inherit the listener's
                        // non-blocking mode on Linux; make sure anyway.
                        let _ = client.set_nonblocking(false);
                        let Ok(server) = TcpStream::connect(("127.0.0.1", target_port)) else {
                            continue; // the peer sees a closed connection, as without the relay
                        };
                        s.connections.fetch_add(1, Ordering::Relaxed);
                        pipes.push(pipe(&s, &client, &server, true));
                        pipes.push(pipe(&s, &server, &client, false));
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(POLL),
                    Err(_) => std::thread::sleep(POLL),
                }
            }
            for p in pipes.into_iter().flatten() {
                let _ = p.join();
            }
        });
        Relay { endpoint: format!("tcp://127.0.0.1:{port}"), shared, acceptor: Some(acceptor) }
    }

    /// Starts a relay to the loopback address `target` (`127.0.0.1:<port>`).
    pub fn start_to(target: &str) -> Relay {
        let port = target.rsplit(':').next().and_then(|p| p.parse().ok());
        Relay::start(port.unwrap_or_else(|| panic!("relay: no port in {target:?}")))
    }

    /// `127.0.0.1:<port>`: the relay's address without the `tcp://`.
    pub fn addr(&self) -> &str {
        self.endpoint.trim_start_matches("tcp://")
    }

    /// Both directions' recordings, upstream first. A byte is recorded
    /// before it is forwarded, so whatever a peer has received is in it.
    pub fn recorded(&self) -> Vec<u8> {
        [self.upstream(), self.downstream()].concat()
    }

    /// The bytes the peer sent to the target so far.
    pub fn upstream(&self) -> Vec<u8> {
        self.shared.up.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The bytes the target sent to the peer so far.
    pub fn downstream(&self) -> Vec<u8> {
        self.shared.down.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Whether `needle` occurs in either direction's recording.
    pub fn saw(&self, needle: &[u8]) -> bool {
        [self.upstream(), self.downstream()].iter().any(|b| b.windows(needle.len()).any(|w| w == needle))
    }

    /// Connections relayed so far.
    pub fn connections(&self) -> u64 {
        self.shared.connections.load(Ordering::Relaxed)
    }

    /// Bytes forwarded but not recorded (over [`RECORD_LIMIT`]).
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        for st in self.shared.streams.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let _ = st.shutdown(Shutdown::Both);
        }
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
    }
}

/// Copies `from` to `to` in a thread (blocking reads; [`Relay`]'s drop
/// shuts the sockets down, which ends them), recording into `up` or
/// `down`; shuts down the write half of `to` when `from` ends. `None` if
/// the sockets cannot be cloned (the connection is then left to close).
fn pipe(s: &Arc<Shared>, from: &TcpStream, to: &TcpStream, up: bool) -> Option<JoinHandle<()>> {
    let (mut from, mut to) = (from.try_clone().ok()?, to.try_clone().ok()?);
    s.streams.lock().unwrap_or_else(|e| e.into_inner()).push(from.try_clone().ok()?);
    let s = s.clone();
    Some(std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            match from.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    {
                        let mut rec = if up { s.up.lock() } else { s.down.lock() }.unwrap_or_else(|e| e.into_inner());
                        let keep = n.min(RECORD_LIMIT.saturating_sub(rec.len()));
                        rec.extend_from_slice(&buf[..keep]);
                        s.dropped.fetch_add((n - keep) as u64, Ordering::Relaxed);
                    }
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    }))
}
