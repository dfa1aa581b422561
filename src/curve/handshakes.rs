//! CURVE handshake counters from ZeroMQ socket monitors
//! (`zmq_socket_monitor`), read on a thread of their own so that the I/O
//! thread does no work for them: one monitor PAIR per ROUTER socket that
//! has a CURVE endpoint, handshake events only.
//!
//! A socket's monitor sees every endpoint of the socket; events are
//! counted only for the CURVE endpoint (the event's endpoint frame is the
//! listener's address; with a wildcard host the port decides). Outcomes
//! (libzmq 4.3.4, research/security.md 1.2):
//!
//! | event | value | outcome |
//! |---|---|---|
//! | `HANDSHAKE_SUCCEEDED` | | `ok` |
//! | `HANDSHAKE_FAILED_AUTH` | the ZAP status (400) | `unknown_key` |
//! | `HANDSHAKE_FAILED_PROTOCOL` | `0x11000002` (mechanism mismatch) | `mechanism_mismatch` |
//! | `HANDSHAKE_FAILED_PROTOCOL` | other | `bad_server_key_or_protocol` |
//! | `HANDSHAKE_FAILED_NO_DETAIL` | | `no_detail` (e.g. no ZAP handler) |
//!
//! Refusals are logged at most once a second per socket, saying how many
//! were suppressed. The events carry no peer address (the ZAP handler's
//! line has it, for refusals that got as far as ZAP).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::zmq_error::ZmqError;

/// The outcomes counted, in [`SocketHandshakes::counts`] order.
pub const OUTCOMES: [&str; 5] = ["ok", "unknown_key", "bad_server_key_or_protocol", "mechanism_mismatch", "no_detail"];

/// `ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH`.
const MECHANISM_MISMATCH: u32 = 0x1100_0002;

/// How often the monitor thread looks at its stop flag.
const STOP_POLL: Duration = Duration::from_millis(100);

/// One socket's CURVE handshake counts.
#[derive(Debug)]
pub struct SocketHandshakes {
    /// The socket (`frontend`, `backend`, `admin`).
    pub socket: &'static str,
    /// The CURVE endpoint as bound.
    pub endpoint: String,
    /// Counts in [`OUTCOMES`] order.
    pub counts: [AtomicU64; 5],
    log: Mutex<(Option<Instant>, u64)>,
}

impl SocketHandshakes {
    /// A socket with nothing counted.
    pub fn new(socket: &'static str, endpoint: String) -> SocketHandshakes {
        SocketHandshakes { socket, endpoint, counts: Default::default(), log: Mutex::new((None, 0)) }
    }

    /// `(outcome, count)` pairs.
    pub fn to_pairs(&self) -> Vec<(&'static str, u64)> {
        OUTCOMES.iter().zip(&self.counts).map(|(o, n)| (*o, n.load(Ordering::Relaxed))).collect()
    }

    /// Whether an event's endpoint is this socket's CURVE endpoint.
    fn is_ours(&self, endpoint: &str) -> bool {
        if endpoint == self.endpoint {
            return true;
        }
        let port = |e: &str| e.rsplit_once(':').map(|(_, p)| p.to_string());
        self.endpoint.starts_with("tcp://") && endpoint.starts_with("tcp://") && port(endpoint) == port(&self.endpoint)
    }

    fn note(&self, event: u16, value: u32) {
        let outcome = match event as i32 {
            e if e == zmq_sys::ZMQ_EVENT_HANDSHAKE_SUCCEEDED as i32 => 0,
            e if e == zmq_sys::ZMQ_EVENT_HANDSHAKE_FAILED_AUTH as i32 => 1,
            e if e == zmq_sys::ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL as i32 && value == MECHANISM_MISMATCH => 3,
            e if e == zmq_sys::ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL as i32 => 2,
            e if e == zmq_sys::ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL as i32 => 4,
            _ => return,
        };
        self.counts[outcome].fetch_add(1, Ordering::Relaxed);
        if outcome == 0 {
            return;
        }
        let mut log = self.log.lock();
        let now = Instant::now();
        if log.0.is_some_and(|t| now.duration_since(t) < Duration::from_secs(1)) {
            log.1 += 1;
            return;
        }
        let suppressed = std::mem::take(&mut log.1);
        log.0 = Some(now);
        tracing::warn!(
            socket = self.socket,
            endpoint = %self.endpoint,
            outcome = OUTCOMES[outcome],
            value,
            suppressed,
            "CURVE handshake refused"
        );
    }
}

/// The monitor thread; [`HandshakeMonitor::stop`] ends it.
pub struct HandshakeMonitor {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// The events watched.
fn events() -> i32 {
    (zmq_sys::ZMQ_EVENT_HANDSHAKE_SUCCEEDED
        | zmq_sys::ZMQ_EVENT_HANDSHAKE_FAILED_AUTH
        | zmq_sys::ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL
        | zmq_sys::ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) as i32
}

impl HandshakeMonitor {
    /// Starts monitoring each `(socket, counts)` pair and a thread that
    /// reads the events into the counts.
    ///
    /// # Errors
    /// [`ZmqError`] of `zmq_socket_monitor` or of the PAIR sockets.
    pub fn start(
        ctx: &zmq::Context,
        watched: Vec<(&zmq::Socket, Arc<SocketHandshakes>)>,
    ) -> Result<HandshakeMonitor, ZmqError> {
        let mut pairs = Vec::new();
        for (socket, counts) in watched {
            let endpoint = format!("inproc://emq-curve-monitor-{}-{}", counts.socket, uuid::Uuid::new_v4());
            socket.monitor(&endpoint, events()).map_err(ZmqError::at(format!("monitor {}", counts.socket)))?;
            let pair = ctx.socket(zmq::PAIR).map_err(ZmqError::at("monitor PAIR"))?;
            pair.set_linger(0).map_err(ZmqError::at("monitor LINGER"))?;
            pair.connect(&endpoint).map_err(ZmqError::at(format!("connect {endpoint}")))?;
            pairs.push((pair, counts));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("emq-curve-mon".into())
            .spawn(move || run(&pairs, &flag))
            .map_err(|_| ZmqError::new("spawn the CURVE monitor thread", zmq::Error::EMFILE))?;
        Ok(HandshakeMonitor { stop, thread: Some(thread) })
    }

    /// Stops the thread and closes its sockets.
    pub fn stop(mut self) {
        self.stop_thread();
    }

    fn stop_thread(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for HandshakeMonitor {
    fn drop(&mut self) {
        self.stop_thread();
    }
}

fn run(pairs: &[(zmq::Socket, Arc<SocketHandshakes>)], stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        let mut items: Vec<_> = pairs.iter().map(|(p, _)| p.as_poll_item(zmq::POLLIN)).collect();
        match zmq::poll(&mut items, STOP_POLL.as_millis() as i64) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(_) => return,
        }
        for (pair, counts) in pairs {
            // Two frames per event: 2 bytes event and 4 bytes value
            // (little-endian), then the endpoint.
            while let Ok(frames) = pair.recv_multipart(zmq::DONTWAIT) {
                let (Some(head), Some(endpoint)) = (frames.first(), frames.get(1)) else { continue };
                if head.len() < 6 || !counts.is_ours(&String::from_utf8_lossy(endpoint)) {
                    continue;
                }
                let event = u16::from_le_bytes([head[0], head[1]]);
                let value = u32::from_le_bytes([head[2], head[3], head[4], head[5]]);
                counts.note(event, value);
            }
        }
    }
}
