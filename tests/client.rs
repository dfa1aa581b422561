//! Client library, worker library and the emq-worker / emq-cli / emq-pubsub
//! binaries, against raw ZeroMQ peers that play the router (exact frames).

mod bins;
mod emqp_client;
mod worker;

use std::time::{Duration, Instant};

pub type Frames = Vec<Vec<u8>>;

pub use crate::common::watchdog::Watchdog;

/// Aborts the test binary if the test runs longer than `secs`.
pub fn watchdog(secs: u64) -> Watchdog {
    Watchdog::new("client test", secs)
}

/// A ROUTER socket on a fresh loopback port, playing the broker.
pub struct RawRouter {
    pub socket: zmq::Socket,
    pub endpoint: String,
    _ctx: zmq::Context,
}

impl RawRouter {
    pub fn bind() -> RawRouter {
        let ctx = zmq::Context::new();
        let socket = ctx.socket(zmq::ROUTER).unwrap();
        socket.set_linger(0).unwrap();
        socket.bind("tcp://127.0.0.1:*").unwrap();
        let endpoint = socket.get_last_endpoint().unwrap().unwrap();
        RawRouter { socket, endpoint, _ctx: ctx }
    }

    /// Next message (R-frames) within `timeout`, or `None`.
    pub fn recv(&self, timeout: Duration) -> Option<Frames> {
        let mut items = [self.socket.as_poll_item(zmq::POLLIN)];
        zmq::poll(&mut items, timeout.as_millis() as i64).unwrap();
        if items[0].is_readable() {
            Some(self.socket.recv_multipart(0).unwrap())
        } else {
            None
        }
    }

    /// Next message whose command (R3) is not HEARTBEAT.
    pub fn recv_skip_hb(&self, timeout: Duration) -> Option<Frames> {
        let end = Instant::now() + timeout;
        loop {
            let f = self.recv(end.saturating_duration_since(Instant::now()))?;
            if f.get(3).map(Vec::as_slice) != Some(b"HEARTBEAT") {
                return Some(f);
            }
        }
    }

    /// Sends `[identity] + dframes`.
    pub fn send(&self, identity: &[u8], dframes: &[&[u8]]) {
        let mut all: Vec<&[u8]> = vec![identity];
        all.extend_from_slice(dframes);
        self.socket.send_multipart(all, 0).unwrap();
    }

    /// Collects every message for `dur`, heartbeating `hb_to` every 100 ms.
    pub fn collect(&self, dur: Duration, hb_to: Option<&[u8]>) -> Vec<Frames> {
        let end = Instant::now() + dur;
        let mut out = Vec::new();
        let mut next_hb = Instant::now();
        while Instant::now() < end {
            if let Some(id) = hb_to.filter(|_| Instant::now() >= next_hb) {
                self.send(id, &[b"", b"eMQP/1.0", b"HEARTBEAT", b"hb-id", b"1700000000.0"]);
                next_hb = Instant::now() + Duration::from_millis(100);
            }
            let wait = end.saturating_duration_since(Instant::now()).min(Duration::from_millis(50));
            if let Some(f) = self.recv(wait) {
                out.push(f);
            }
        }
        out
    }
}

/// Messages with command `word` (R3) from `identity`.
pub fn count(msgs: &[Frames], identity: &[u8], word: &[u8]) -> usize {
    msgs.iter().filter(|m| m[0] == identity && m[3] == word).count()
}

/// Child process killed (by PID) on drop.
pub struct ChildGuard(pub std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A loopback port with nothing listening (bound, then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}
