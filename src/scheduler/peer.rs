//! The scheduler's eMQP peer: a DEALER to the router frontend (docs/emqp.md "The scheduler"),
//! plus the scheduler's own admin ROUTER. The only module that touches zmq.
//!
//! Lifecycle:
//! 1. connect a DEALER under a fresh uuid4 identity and send INFORM
//!    (frame 4 `""`, frame 5 `scheduler`, docs/emqp.md "INFORM"); re-send it every
//!    [`PeerConfig::inform_retry`] until the ACK arrives (EventMQ waited forever);
//! 2. once ACKed: HEARTBEAT every [`PeerConfig::heartbeat_interval`]
//!    regardless of traffic (docs/emqp.md "HEARTBEAT"), fire due schedules as REQUESTs
//!    (docs/emqp.md "The scheduler");
//! 3. after [`PeerConfig::router_timeout`] without any message from the
//!    router, or on the router's KBYE, reconnect under a new identity and
//!    re-INFORM. Schedules live in the [`Service`] and survive;
//! 4. on SIGTERM/SIGINT (or DISCONNECT from the router, which nobody sends)
//!    send KBYE, sync the store and return (EventMQ sent no KBYE).
//!
//! The loop blocks in `zmq::poll` until the earliest of: the next schedule
//! deadline, the next heartbeat/INFORM retry, the router timeout, a message,
//! or a signal. There is no fixed-rate polling.
//!
//! Malformed SCHEDULE/UNSCHEDULE messages are logged and answered with
//! `ERROR` (frame 4 the message's msgid, frame 5 a code such as `BAD_CRON`, frame 6 the
//! reason) to the router; they never stop the scheduler (they killed EventMQ's).
//! Acceptance REPLYs and ERRORs from the router are logged at debug level.

use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use chrono::Utc;

use super::service::Service;
use super::timetable::Fire;
use crate::limits;
use crate::protocol::emqp::{self, Command, DecodeError, Frame, Message, PeerType, ShowFrames, Socket};
use crate::protocol::headers;
use crate::zmq_error::ZmqError;

/// The peer's settings (validated by the binary's config).
#[derive(Debug, Clone)]
pub struct PeerConfig {
    /// The router frontend, e.g. `tcp://127.0.0.1:47291`.
    pub router_addr: String,
    /// The admin socket to bind, or `None` for no admin socket.
    pub admin_addr: Option<String>,
    /// HEARTBEAT period (EventMQ: 3 s).
    pub heartbeat_interval: Duration,
    /// Router silence before reconnecting (EventMQ: ~15 s).
    pub router_timeout: Duration,
    /// INFORM re-send period while waiting for the ACK.
    pub inform_retry: Duration,
}

/// One DEALER connection with its registration state.
struct Link {
    socket: zmq::Socket,
    identity: String,
    registered: bool,
    last_heard: Instant,
    next_heartbeat: Instant,
    next_inform: Instant,
}

/// Runs the scheduler until `shutdown_fd` becomes readable (a signal-hook
/// pipe) or the router sends DISCONNECT.
///
/// # Errors
/// [`ZmqError`] when a socket cannot be created, bound or connected.
pub fn run(cfg: &PeerConfig, service: &mut Service, shutdown_fd: RawFd) -> Result<(), ZmqError> {
    let ctx = zmq::Context::new();
    let admin = match &cfg.admin_addr {
        Some(addr) => Some(bind_admin(&ctx, addr)?),
        None => None,
    };
    let mut link = Link::connect(&ctx, cfg)?;
    loop {
        if link.registered {
            for fire in service.fire_due(Utc::now()) {
                link.send_request(&fire);
            }
        }
        service.sync();
        link.tick(&ctx, cfg)?;
        let timeout_ms = poll_timeout(&link, service, cfg);
        let (ready_link, ready_admin, ready_signal) = wait(&link.socket, admin.as_ref(), shutdown_fd, timeout_ms)?;
        if ready_signal {
            tracing::info!("signal received: shutting down");
            break;
        }
        if ready_link && link.drain(service) == Flow::Stop {
            break;
        }
        if let (true, Some(admin)) = (ready_admin, admin.as_ref()) {
            drain_admin(admin, service);
        }
    }
    link.close();
    service.sync();
    Ok(())
}

fn bind_admin(ctx: &zmq::Context, addr: &str) -> Result<zmq::Socket, ZmqError> {
    let s = ctx.socket(zmq::ROUTER).map_err(ZmqError::at("admin socket"))?;
    s.set_linger(limits::ADMIN_LINGER_MS).map_err(ZmqError::at("admin linger"))?;
    s.bind(addr).map_err(ZmqError::at(format!("bind admin socket {addr}")))?;
    if let Ok(Ok(ep)) = s.get_last_endpoint() {
        tracing::info!(endpoint = %ep, "admin socket bound");
    }
    Ok(s)
}

/// Milliseconds until the next thing the loop must do (rounded up, so the
/// loop never wakes just before a deadline and spins).
fn poll_timeout(link: &Link, service: &mut Service, cfg: &PeerConfig) -> i64 {
    let now = Instant::now();
    let mut wake = link.last_heard + cfg.router_timeout;
    wake = wake.min(if link.registered { link.next_heartbeat } else { link.next_inform });
    let mut ms = ceil_ms(wake.saturating_duration_since(now));
    if let (true, Some(deadline)) = (link.registered, service.next_deadline()) {
        let until = (deadline - Utc::now()).to_std().unwrap_or(Duration::ZERO);
        ms = ms.min(ceil_ms(until));
    }
    ms
}

fn ceil_ms(d: Duration) -> i64 {
    i64::try_from(d.as_micros().div_ceil(1000)).unwrap_or(i64::MAX)
}

/// Blocks until the DEALER, the admin socket or the signal pipe is readable
/// or `timeout_ms` passes. EINTR counts as a timeout.
fn wait(
    link: &zmq::Socket,
    admin: Option<&zmq::Socket>,
    shutdown_fd: RawFd,
    timeout_ms: i64,
) -> Result<(bool, bool, bool), ZmqError> {
    let mut items = vec![zmq::PollItem::from_fd(shutdown_fd, zmq::POLLIN), link.as_poll_item(zmq::POLLIN)];
    if let Some(a) = admin {
        items.push(a.as_poll_item(zmq::POLLIN));
    }
    match zmq::poll(&mut items, timeout_ms) {
        Ok(_) => {}
        Err(zmq::Error::EINTR) => return Ok((false, false, false)),
        Err(e) => return Err(ZmqError::new("poll", e)),
    }
    let admin_ready = items.get(2).is_some_and(|i| i.is_readable());
    Ok((items[1].is_readable(), admin_ready, items[0].is_readable()))
}

#[derive(Debug, PartialEq, Eq)]
enum Flow {
    Continue,
    Stop,
}

impl Link {
    fn connect(ctx: &zmq::Context, cfg: &PeerConfig) -> Result<Link, ZmqError> {
        let identity = uuid::Uuid::new_v4().hyphenated().to_string();
        let socket = ctx.socket(zmq::DEALER).map_err(ZmqError::at("dealer socket"))?;
        socket.set_identity(identity.as_bytes()).map_err(ZmqError::at("set identity"))?;
        socket.set_sndhwm(limits::ZMQ_HWM).map_err(ZmqError::at("set sndhwm"))?;
        socket.set_rcvhwm(limits::ZMQ_HWM).map_err(ZmqError::at("set rcvhwm"))?;
        socket.set_linger(limits::RECONNECT_LINGER_MS).map_err(ZmqError::at("set linger"))?;
        socket.connect(&cfg.router_addr).map_err(ZmqError::at(format!("connect to router {}", cfg.router_addr)))?;
        tracing::info!(router = %cfg.router_addr, identity = %identity, "connecting; sending INFORM");
        let now = Instant::now();
        let link = Link {
            socket,
            identity,
            registered: false,
            last_heard: now,
            next_heartbeat: now,
            next_inform: now + cfg.inform_retry,
        };
        link.send(Command::Inform { queues: Vec::new(), peer: PeerType::Scheduler });
        Ok(link)
    }

    fn send(&self, command: Command) {
        self.send_message(&Message::new(command));
    }

    fn send_message(&self, msg: &Message) {
        if let Err(e) = self.socket.send_multipart(msg.encode(), zmq::DONTWAIT) {
            let word = String::from_utf8_lossy(msg.command.word()).into_owned();
            tracing::warn!(command = %word, identity = %self.identity, error = %e, "send to router failed");
        }
    }

    fn send_request(&self, fire: &Fire) {
        let msg = Message::new(Command::Request {
            queue: fire.queue.clone().into_bytes(),
            headers: headers::REPLY_REQUESTED.to_vec(),
            body: fire.body.clone().into_bytes(),
            extra: Vec::new(),
        });
        tracing::debug!(key = %fire.key, queue = %fire.queue, msgid = %String::from_utf8_lossy(&msg.msgid), "REQUEST");
        self.send_message(&msg);
    }

    /// Heartbeats, INFORM retries and the router-silence reconnect.
    fn tick(&mut self, ctx: &zmq::Context, cfg: &PeerConfig) -> Result<(), ZmqError> {
        let now = Instant::now();
        if now.duration_since(self.last_heard) >= cfg.router_timeout {
            tracing::warn!(identity = %self.identity, "router silent; reconnecting under a new identity");
            *self = Link::connect(ctx, cfg)?;
            return Ok(());
        }
        if self.registered && now >= self.next_heartbeat {
            self.send(Command::Heartbeat { timestamp: emqp::heartbeat_timestamp() });
            self.next_heartbeat = now + cfg.heartbeat_interval;
        }
        if !self.registered && now >= self.next_inform {
            tracing::info!(identity = %self.identity, "no ACK yet; re-sending INFORM");
            self.send(Command::Inform { queues: Vec::new(), peer: PeerType::Scheduler });
            self.next_inform = now + cfg.inform_retry;
        }
        Ok(())
    }

    /// Reads up to [`limits::BATCH`] messages without blocking.
    fn drain(&mut self, service: &mut Service) -> Flow {
        for _ in 0..limits::BATCH {
            let frames = match self.socket.recv_multipart(zmq::DONTWAIT) {
                Ok(f) => f,
                Err(zmq::Error::EAGAIN) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "receive from router failed");
                    break;
                }
            };
            self.last_heard = Instant::now();
            if self.handle(&frames, service) == Flow::Stop {
                return Flow::Stop;
            }
        }
        Flow::Continue
    }

    fn handle(&mut self, frames: &[Frame], service: &mut Service) -> Flow {
        let msg = match emqp::decode(frames, Socket::SchedulerSide) {
            Ok(m) => m,
            Err(e) => {
                self.reject_undecodable(frames, &e);
                return Flow::Continue;
            }
        };
        match msg.command {
            Command::Ack { .. } => self.handle_ack(),
            Command::Schedule(body) => match service.handle_schedule(&body, Utc::now()) {
                Ok(Some(fire)) => self.send_request(&fire),
                Ok(None) => {}
                Err(e) => self.send_error(&msg.msgid, e.code(), &e.to_string()),
            },
            Command::Unschedule(body) => {
                if let Err(e) = service.handle_unschedule(&body) {
                    self.send_error(&msg.msgid, "BAD_BODY", &format!("frame 7: {e}"));
                }
            }
            Command::Kbye => {
                tracing::info!("router said KBYE; re-registering");
                self.registered = false;
                self.next_inform = Instant::now();
            }
            Command::Disconnect => return Flow::Stop,
            Command::Heartbeat { .. } => {}
            other => tracing::debug!(command = ?other, "ignored message from router"),
        }
        Flow::Continue
    }

    fn handle_ack(&mut self) {
        if !self.registered {
            tracing::info!(identity = %self.identity, "registered with the router (ACK)");
        }
        self.registered = true;
        self.next_heartbeat = Instant::now();
    }

    /// Logs an undecodable message; a SCHEDULE/UNSCHEDULE with missing
    /// frames also gets an ERROR back.
    fn reject_undecodable(&self, frames: &[Frame], e: &DecodeError) {
        tracing::warn!(error = %e, frames = %ShowFrames(frames), "bad message from router");
        if let (DecodeError::MissingFrame { command: "SCHEDULE" | "UNSCHEDULE", .. }, Some(msgid)) = (e, frames.get(3))
        {
            self.send_error(msgid, "BAD_FRAMES", &e.to_string());
        }
    }

    fn send_error(&self, refers_to: &[u8], code: &str, text: &str) {
        tracing::warn!(msgid = %String::from_utf8_lossy(refers_to), code, error = text, "rejected message");
        self.send(Command::Error {
            refers_to: refers_to.to_vec(),
            code: code.as_bytes().to_vec(),
            text: text.as_bytes().to_vec(),
        });
    }

    /// Sends KBYE (if registered) and lets the socket flush for at most
    /// [`limits::SCHEDULER_CLOSE_LINGER_MS`].
    fn close(self) {
        if self.registered {
            self.send(Command::Kbye);
        }
        let _ = self.socket.set_linger(limits::SCHEDULER_CLOSE_LINGER_MS);
        tracing::info!(identity = %self.identity, "disconnected");
    }
}

/// Answers admin requests: `SCHEDULES` → REPLY with
/// [`Service::schedules_json`]; `HELLO` is ignored (emq-cli sends it on
/// connect); anything else → ERROR `UNKNOWN_COMMAND`.
fn drain_admin(admin: &zmq::Socket, service: &Service) {
    for _ in 0..limits::BATCH {
        let frames = match admin.recv_multipart(zmq::DONTWAIT) {
            Ok(f) => f,
            Err(_) => break,
        };
        // R-frames: identity, then frames ["", version, command, msgid].
        let (Some(identity), Some(word), Some(msgid)) = (frames.first(), frames.get(3), frames.get(4)) else {
            tracing::warn!(frames = %ShowFrames(&frames), "short admin request");
            continue;
        };
        let command = match word.as_slice() {
            b"SCHEDULES" => Command::Reply { body: service.schedules_json().into_bytes() },
            b"HELLO" => continue,
            _ => Command::Error {
                refers_to: msgid.clone(),
                code: b"UNKNOWN_COMMAND".to_vec(),
                text: b"the scheduler's admin socket answers SCHEDULES only".to_vec(),
            },
        };
        let mut out = vec![identity.clone()];
        out.extend(Message::new(command).encode());
        if let Err(e) = admin.send_multipart(out, zmq::DONTWAIT) {
            tracing::warn!(error = %e, "admin reply failed");
        }
    }
}
