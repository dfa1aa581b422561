//! The PUBLISH device (EventMQ 0.3.13 `emq-pubsub`, docs/emqp.md "PUBLISH"): a
//! ROUTER takes `PUBLISH` messages, a PUB emits `[topic, message]`.
//!
//! Unlike EventMQ's: malformed input is logged and counted, never a crash;
//! the loop blocks in `zmq::poll` until input or the stop descriptor is
//! readable (no 1 ms polling), waking once a minute besides to give the
//! heap pages freed by departed subscribers back to the OS
//! ([`crate::heap`]).

use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Instant;

use crate::curve::bind_curve;
use crate::curve::handshakes::{HandshakeMonitor, SocketHandshakes};
use crate::curve::zap::ZapHandler;
use crate::protocol::emqp::{decode, Command, ShowFrames, Socket};
use crate::zmq_error::ZmqError;

/// The ZAP domain of `pubsub_in_curve` (allow-list `curve_publishers_dir`).
pub const PUBLISHERS_DOMAIN: &str = "publishers";
/// The ZAP domain of `pubsub_out_curve` (allow-list `curve_subscribers_dir`).
pub const SUBSCRIBERS_DOMAIN: &str = "subscribers";

pub use crate::config::PubSubCurve;

/// Counters since start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PubSubStats {
    /// PUBLISH messages emitted on the PUB socket.
    pub published: u64,
    /// Messages dropped as malformed (wrong command, missing frames).
    pub malformed: u64,
    /// PUBLISH messages dropped for being over `max_message_bytes`.
    pub too_big: u64,
}

/// A bound device: ROUTER in, PUB out.
pub struct PubSub {
    incoming: zmq::Socket,
    outgoing: zmq::Socket,
    stats: PubSubStats,
    max_message_bytes: usize,
    endpoints: (String, String),
    curve_endpoints: (Option<String>, Option<String>),
    /// Handshake counts of the CURVE endpoints (`in`, `out`).
    handshakes: Vec<Arc<SocketHandshakes>>,
    /// Stops before the context ends (fields drop in order).
    _monitor: Option<HandshakeMonitor>,
    /// Stops after the sockets above are closed.
    zap: Option<ZapHandler>,
    _ctx: zmq::Context,
}

impl PubSub {
    /// Binds the ROUTER to `in_addr` and the PUB to `out_addr`
    /// (`tcp://127.0.0.1:*` picks a free port; see [`PubSub::endpoints`]).
    ///
    /// # Errors
    /// [`ZmqError`] naming the address when a bind fails (address in use,
    /// bad endpoint).
    ///
    /// `hwm` is the messages queued per subscriber (ZeroMQ's send
    /// high-water mark: past it a slow subscriber misses messages), and
    /// `max_message_bytes` the largest PUBLISH taken: a larger one is
    /// dropped and counted in [`PubSubStats::too_big`], and one over about
    /// twice it ([`crate::limits::zmq_max_msg_size`]: every frame counted,
    /// 64 bytes a frame more) is dropped by ZeroMQ with its connection
    /// before it is buffered, on both sockets (a subscriber sends its
    /// subscriptions to the PUB socket). So a subscriber that stops reading
    /// holds at most `hwm` × `max_message_bytes` of the device's memory, and
    /// a peer that never ends a message at most about twice
    /// `max_message_bytes` per connection.
    pub fn bind(in_addr: &str, out_addr: &str, hwm: usize, max_message_bytes: usize) -> Result<PubSub, ZmqError> {
        PubSub::bind_with(in_addr, out_addr, hwm, max_message_bytes, None)
    }

    /// [`PubSub::bind`], plus the CURVE endpoints of `curve` (bound after
    /// the plain ones, on the same sockets; the ZAP handler starts first).
    ///
    /// # Errors
    /// As [`PubSub::bind`]; also when the ZAP handler cannot start.
    pub fn bind_with(
        in_addr: &str,
        out_addr: &str,
        hwm: usize,
        max_message_bytes: usize,
        curve: Option<&PubSubCurve>,
    ) -> Result<PubSub, ZmqError> {
        let ctx = zmq::Context::new();
        let zap = match curve {
            Some(c) => {
                let mut domains = Vec::new();
                if let Some((_, keys)) = &c.publishers {
                    domains.push((PUBLISHERS_DOMAIN.to_string(), keys.clone()));
                }
                if let Some((_, keys)) = &c.subscribers {
                    domains.push((SUBSCRIBERS_DOMAIN.to_string(), keys.clone()));
                }
                Some(ZapHandler::start(&ctx, domains)?)
            }
            None => None,
        };
        let zerr = |what, addr| ZmqError::at(format!("pubsub {what} for {addr}"));
        let hwm = i32::try_from(hwm).unwrap_or(i32::MAX);
        let msg_limit = crate::limits::zmq_max_msg_size(max_message_bytes);
        let mut incoming = ctx.socket(zmq::ROUTER).map_err(zerr("socket", in_addr))?;
        incoming.set_linger(crate::limits::PUBSUB_LINGER_MS).map_err(zerr("linger", in_addr))?;
        incoming.set_rcvhwm(crate::limits::ZMQ_HWM).map_err(zerr("rcvhwm", in_addr))?;
        incoming.set_maxmsgsize(msg_limit).map_err(zerr("maxmsgsize", in_addr))?;
        incoming.bind(in_addr).map_err(zerr("bind", in_addr))?;
        let mut outgoing = ctx.socket(zmq::PUB).map_err(zerr("socket", out_addr))?;
        outgoing.set_linger(crate::limits::PUBSUB_LINGER_MS).map_err(zerr("linger", out_addr))?;
        outgoing.set_sndhwm(hwm).map_err(zerr("sndhwm", out_addr))?;
        outgoing.set_maxmsgsize(msg_limit).map_err(zerr("maxmsgsize", out_addr))?;
        outgoing.bind(out_addr).map_err(zerr("bind", out_addr))?;
        let ep = |s: &zmq::Socket| s.get_last_endpoint().ok().and_then(Result::ok).unwrap_or_default();
        let endpoints = (ep(&incoming), ep(&outgoing));
        let mut curve_endpoints = (None, None);
        let mut watched = Vec::new();
        if let Some(c) = curve {
            if let Some((addr, _)) = &c.publishers {
                let ep = bind_curve(&mut incoming, addr, &c.secret, PUBLISHERS_DOMAIN)?;
                watched.push((&incoming, Arc::new(SocketHandshakes::new("in", ep.clone()))));
                curve_endpoints.0 = Some(ep);
            }
            if let Some((addr, _)) = &c.subscribers {
                let ep = bind_curve(&mut outgoing, addr, &c.secret, SUBSCRIBERS_DOMAIN)?;
                watched.push((&outgoing, Arc::new(SocketHandshakes::new("out", ep.clone()))));
                curve_endpoints.1 = Some(ep);
            }
        }
        let handshakes: Vec<Arc<SocketHandshakes>> = watched.iter().map(|(_, h)| h.clone()).collect();
        let monitor = if watched.is_empty() { None } else { Some(HandshakeMonitor::start(&ctx, watched)?) };
        Ok(PubSub {
            incoming,
            outgoing,
            stats: PubSubStats::default(),
            max_message_bytes,
            endpoints,
            curve_endpoints,
            handshakes,
            _monitor: monitor,
            zap,
            _ctx: ctx,
        })
    }

    /// The bound plain endpoints `(incoming, outgoing)`, ports resolved.
    pub fn endpoints(&self) -> (String, String) {
        self.endpoints.clone()
    }

    /// The bound CURVE endpoints `(publishers, subscribers)`, ports resolved.
    pub fn curve_endpoints(&self) -> (Option<String>, Option<String>) {
        self.curve_endpoints.clone()
    }

    /// The counters so far.
    pub fn stats(&self) -> PubSubStats {
        self.stats
    }

    /// The CURVE counters so far as one line
    /// ([`crate::curve::report::counts_line`]: handshakes of the sockets
    /// `in` and `out`, ZAP requests of the domains `publishers` and
    /// `subscribers`); `None` without a CURVE endpoint.
    pub fn curve_counts(&self) -> Option<String> {
        if self.handshakes.is_empty() {
            return None;
        }
        let zap = self.zap.as_ref().map(ZapHandler::state);
        Some(crate::curve::report::counts_line(&self.handshakes, zap.as_deref()))
    }

    /// Runs until `stop_fd` (e.g. a signal pipe) becomes readable; `None`
    /// runs forever. Blocks in `zmq::poll` between messages, at most
    /// [`crate::limits::HEAP_TRIM_EVERY`] at a time: every that often it
    /// returns freed heap pages to the OS ([`crate::heap::release_free_memory`]).
    ///
    /// # Errors
    /// [`ZmqError`] when polling or receiving fails.
    pub fn run(&mut self, stop_fd: Option<RawFd>) -> Result<PubSubStats, ZmqError> {
        let mut trim_at = Instant::now() + crate::limits::HEAP_TRIM_EVERY;
        loop {
            let now = Instant::now();
            if now >= trim_at {
                crate::heap::release_free_memory();
                trim_at = now + crate::limits::HEAP_TRIM_EVERY;
            }
            let mut items = vec![self.incoming.as_poll_item(zmq::POLLIN)];
            if let Some(fd) = stop_fd {
                items.push(zmq::PollItem::from_fd(fd, zmq::POLLIN));
            }
            // Rounded up: never wakes just before the trim is due.
            let timeout = trim_at.saturating_duration_since(now).as_millis() as i64 + 1;
            match zmq::poll(&mut items, timeout) {
                Ok(_) | Err(zmq::Error::EINTR) => {}
                Err(e) => return Err(ZmqError::new("pubsub poll", e)),
            }
            if items.get(1).is_some_and(|i| i.is_readable()) {
                tracing::info!(published = self.stats.published, malformed = self.stats.malformed, "stopping");
                return Ok(self.stats);
            }
            for _ in 0..crate::limits::BATCH {
                match self.incoming.recv_multipart(zmq::DONTWAIT) {
                    Ok(frames) => self.handle(&frames),
                    Err(zmq::Error::EAGAIN) | Err(zmq::Error::EINTR) => break,
                    Err(e) => return Err(ZmqError::new("pubsub recv", e)),
                }
            }
        }
    }

    /// Handles one R-frame message (identity first).
    fn handle(&mut self, frames: &[Vec<u8>]) {
        let (peer, sent) = frames.split_first().map_or((&[][..], frames), |(id, sent)| (id.as_slice(), sent));
        match decode(sent, Socket::PubIn).map(|m| m.command) {
            Ok(Command::Publish { topic, message }) if topic.len() + message.len() > self.max_message_bytes => {
                self.stats.too_big += 1;
                let (bytes, max) = (topic.len() + message.len(), self.max_message_bytes);
                crate::log_limited!(
                    warn,
                    bytes,
                    max,
                    total = self.stats.too_big,
                    "PUBLISH over pubsub_max_message_bytes dropped"
                );
            }
            Ok(Command::Publish { topic, message }) => {
                if let Err(e) = self.outgoing.send_multipart([topic, message], zmq::DONTWAIT) {
                    crate::log_limited!(warn, error = %e, "PUB send failed");
                } else {
                    self.stats.published += 1;
                }
            }
            Ok(_) => self.malformed(peer, sent, "not PUBLISH"),
            Err(e) => self.malformed(peer, sent, &e.to_string()),
        }
    }

    /// Counts and logs a dropped message. Its frames are logged as the
    /// publisher sent them (docs/emqp.md "Frames"), without the identity
    /// the ROUTER socket puts in front, which is logged apart (`peer`): the
    /// `frames` count, the frames shown (`content`) and the frame numbers
    /// and count in `why` (the decoder's "frame 2: …", "message has 3
    /// frame(s)") all count the same frames.
    ///
    /// As the router's: at most [`crate::limits::LOG_BURST`] lines a second
    /// (the next line let through says how many were `suppressed`), and
    /// [`ShowFrames`] shows at most 16 frames of 64 bytes, so a flood of
    /// malformed or huge messages cannot flood the log.
    fn malformed(&mut self, peer: &[u8], sent: &[Vec<u8>], why: &str) {
        self.stats.malformed += 1;
        // A ZeroMQ identity is at most 255 bytes: shown whole.
        let (peer, count, total) = (peer.escape_ascii(), sent.len(), self.stats.malformed);
        crate::log_limited!(warn, %peer, why, frames = count, content = %ShowFrames(sent), total, "malformed input dropped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(parts: &[&[u8]]) -> Vec<Vec<u8>> {
        parts.iter().map(|p| p.to_vec()).collect()
    }

    /// Seconds since the Unix epoch: the rate limit's windows.
    fn now_secs() -> u64 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_secs()
    }

    /// Sleeps into the next second (5 ms past its start); returns it.
    fn next_second() -> u64 {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970");
        let left = std::time::Duration::from_secs(1) - std::time::Duration::from_nanos(u64::from(now.subsec_nanos()));
        std::thread::sleep(left + std::time::Duration::from_millis(5));
        now.as_secs() + 1
    }

    /// The fields of each captured line, after the message.
    fn fields(log: &str) -> Vec<&str> {
        log.lines().map(|l| l.split_once("malformed input dropped ").map_or(l, |(_, f)| f)).collect()
    }

    #[test]
    fn malformed_input_is_logged_with_the_frames_the_publisher_sent_at_most_ten_lines_a_second() {
        let mut device = PubSub::bind("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", 10, 1024).expect("binds");
        // The black-box tester's flood: messages of 100,000 one-byte frames
        // (10 MB of log for 20 of them before), then many small ones.
        let huge: Vec<Vec<u8>> = std::iter::once(b"big".to_vec()).chain((0..100_000).map(|_| b"x".to_vec())).collect();
        let small = frames(&[b"small", b"", b"x"]);
        // The limit is one per call site, counted in wall-clock seconds:
        // everything below must happen within one second, tried again on a
        // machine so slow it did not.
        let (log, base) = loop {
            next_second();
            device.handle(&small); // reports what an earlier try left suppressed
            let base = device.stats().malformed;
            let ((start, end), log) = crate::logging::capture("warn", || {
                let start = next_second();
                // A PUBLISH without its message: 5 frames sent, 6 received.
                device.handle(&frames(&[b"pub-1", b"", b"eMQP/1.0", b"PUBLISH", b"m1", b"topic"]));
                // Another command: 4 frames sent.
                device.handle(&frames(&[b"pub-2", b"", b"eMQP/1.0", b"READY", b"m2"]));
                // Too short for eMQP: 2 frames sent.
                device.handle(&frames(&[b"pub-3", b"", b"x"]));
                for _ in 0..20 {
                    device.handle(&huge);
                }
                for _ in 0..1_000 {
                    device.handle(&small);
                }
                (start, now_secs())
            });
            if start == end {
                break (log, base);
            }
        };
        let xs = vec![r#""x""#; 16].join(", ");
        let mut want = vec![
            format!(
                r#"suppressed=0 peer=pub-1 why="frame 5: PUBLISH needs the message (message has 5 frames)" frames=5 content=["", "eMQP/1.0", "PUBLISH", "m1", "topic"] total={}"#,
                base + 1
            ),
            format!(
                r#"suppressed=0 peer=pub-2 why="frame 2: command READY is not accepted on the pubsub socket" frames=4 content=["", "eMQP/1.0", "READY", "m2"] total={}"#,
                base + 2
            ),
            format!(
                r#"suppressed=0 peer=pub-3 why="message has 2 frame(s); eMQP needs at least 4 (empty, version, command, msgid)" frames=2 content=["", "x"] total={}"#,
                base + 3
            ),
        ];
        // Ten lines a second (limits::LOG_BURST), 16 frames each at most.
        want.extend((4..=10).map(|n| {
            format!(
                r#"suppressed=0 peer=big why="frame 2: unknown command \"x\"" frames=100000 content=[{xs}, …(+99984 frames)] total={}"#,
                base + n
            )
        }));
        assert_eq!(fields(&log), want, "{log}");
        assert!(log.len() < 4096, "{} bytes of log for 1,023 malformed messages", log.len());
        // The next second's first line counts the 1,013 left out.
        let ((), log) = crate::logging::capture("warn", || {
            next_second();
            device.handle(&small);
        });
        assert_eq!(
            fields(&log),
            [format!(
                r#"suppressed=1013 peer=small why="message has 2 frame(s); eMQP needs at least 4 (empty, version, command, msgid)" frames=2 content=["", "x"] total={}"#,
                base + 1_024
            )]
        );
        assert_eq!(device.stats(), PubSubStats { published: 0, malformed: base + 1_024, too_big: 0 });
    }
}
