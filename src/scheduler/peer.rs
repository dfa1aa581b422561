//! The scheduler's eMQP peer: a DEALER to the router frontend (docs/emqp.md "The scheduler"),
//! plus the scheduler's own admin ROUTER (`SCHEDULES`, `STATUS`: its CURVE
//! counters). The only module that touches zmq.
//!
//! Lifecycle:
//! 1. connect a DEALER under a fresh uuid4 identity and send INFORM
//!    (frame 4 `""`, frame 5 `scheduler`, docs/emqp.md "INFORM"); re-send it every
//!    [`PeerConfig::inform_retry`] until the ACK arrives (EventMQ waited forever);
//! 2. once ACKed: HEARTBEAT every [`PeerConfig::heartbeat_interval`]
//!    regardless of traffic (docs/emqp.md "HEARTBEAT"), fire due schedules as REQUESTs
//!    (docs/emqp.md "The scheduler");
//! 3. after [`PeerConfig::router_timeout`] without a HEARTBEAT from the
//!    router, reconnect under a new identity and re-INFORM; on the router's
//!    KBYE or DISCONNECT ("I do not know you"), re-INFORM at once.
//!    Schedules live in the [`Service`] and survive;
//! 4. on SIGTERM, SIGINT or SIGHUP (the stop fd's signals,
//!    [`crate::program::stop_signals`]) send KBYE, sync the store and return (EventMQ sent no KBYE).
//!
//! **Liveness is symmetric** (emq's rule): only the router's HEARTBEATs
//! (and the ACK of an INFORM) count as the router being alive, as only the
//! scheduler's own HEARTBEATs count on the router's side. The acceptance
//! REPLYs and ERRORs of the scheduler's REQUESTs do not: any client gets
//! those, so they do not show that the router still knows this scheduler.
//! (Counting them kept a scheduler the router had expired after a 7 s stall
//! from ever registering again.) An emq router re-admits a scheduler on its
//! next HEARTBEAT anyway (see the router's `scheduling.rs`).
//!
//! The loop blocks in `zmq::poll` until the earliest of: the next schedule
//! deadline, the next heartbeat/INFORM retry, the router timeout, a message,
//! or a signal. There is no fixed-rate polling.
//!
//! Every SCHEDULE/UNSCHEDULE is answered (emq extension; an emq router
//! forwards the answer to the client that sent the message): `REPLY` with
//! frame 4 the message's msgid and frame 5 the outcome as JSON, or, for a
//! malformed one, `ERROR` (frame 4 the msgid, frame 5 a code such as
//! `BAD_CRON`, frame 6 the reason). A malformed message never stops the
//! scheduler (it killed EventMQ's).
//! `DROP` (emq extension) makes it forget a schedule another scheduler now
//! owns. Acceptance REPLYs and ERRORs from the router are logged at debug
//! level.

use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::service::{Answer, Service};
use super::timetable::{Fire, Now};
use crate::curve::handshakes::{HandshakeMonitor, SocketHandshakes};
use crate::curve::zap::{AllowList, ZapHandler};
use crate::curve::{self, ClientCurve, Key};
use crate::limits;
use crate::logging::ShowText;
use crate::protocol::emqp::{self, Command, DecodeError, Frame, Message, PeerType, ShowFrame, ShowFrames, Socket};
use crate::protocol::headers;
use crate::zmq_error::ZmqError;

/// The peer's settings (validated by the binary's config).
#[derive(Debug, Clone)]
pub struct PeerConfig {
    /// The router frontend, e.g. `tcp://127.0.0.1:47291`, or several
    /// separated by commas: the scheduler connects to all (docs/failover.md).
    pub router_addr: String,
    /// The admin socket to bind, or `None` for no admin socket.
    pub admin_addr: Option<String>,
    /// A CURVE endpoint on the same admin socket (setting
    /// `scheduler_admin_curve`), or `None`.
    pub admin_curve: Option<AdminCurve>,
    /// The keys to connect to the router's `frontend_curve` with (settings
    /// `curve_key_file`, `curve_server_key`), or `None` for plain.
    pub router_curve: Option<ClientCurve>,
    /// HEARTBEAT period (EventMQ: 3 s).
    pub heartbeat_interval: Duration,
    /// Router silence before reconnecting (EventMQ: ~15 s).
    pub router_timeout: Duration,
    /// INFORM re-send period while waiting for the ACK.
    pub inform_retry: Duration,
    /// This scheduler's stable name, sent as INFORM frame 6 (emq extension):
    /// the router routes SCHEDULEs by it, so a restarted scheduler owns the
    /// same schedules. `None`: no name (the router uses the identity).
    pub name: Option<String>,
}

/// The CURVE admin endpoint: the address, the scheduler's secret key and
/// the operators allowed (ZAP domain [`ADMIN_DOMAIN`], served by the
/// scheduler's own ZAP handler in its context; docs/security.md "CURVE").
#[derive(Clone)]
pub struct AdminCurve {
    /// The CURVE address to bind, e.g. `tcp://0.0.0.0:47395`.
    pub addr: String,
    /// The scheduler's secret key.
    pub secret: Key,
    /// The admins' public keys (file names as user ids).
    pub admins: AllowList,
}

impl std::fmt::Debug for AdminCurve {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminCurve").field("addr", &self.addr).field("admins", &self.admins.len()).finish()
    }
}

/// The ZAP domain of the CURVE admin endpoint.
pub const ADMIN_DOMAIN: &str = "admin";

/// One DEALER connection with its registration state.
struct Link {
    socket: zmq::Socket,
    identity: String,
    name: Option<String>,
    /// The msgid of the last INFORM sent: its ACK completes registration.
    inform_msgid: Frame,
    registered: bool,
    last_heard: Instant,
    next_heartbeat: Instant,
    next_inform: Instant,
}

/// Runs the scheduler until `shutdown_fd` becomes readable (a signal-hook
/// pipe).
///
/// # Errors
/// [`ZmqError`] when a socket cannot be created, bound or connected.
pub fn run(cfg: &PeerConfig, service: &mut Service, shutdown_fd: RawFd) -> Result<(), ZmqError> {
    let ctx = zmq::Context::new();
    // The ZAP handler first: a CURVE bind without one refuses every peer.
    let zap = match &cfg.admin_curve {
        Some(c) => Some(ZapHandler::start(&ctx, vec![(ADMIN_DOMAIN.to_string(), c.admins.clone())])?),
        None => None,
    };
    let (admin, curve_endpoint) = match (&cfg.admin_addr, &cfg.admin_curve) {
        (None, None) => (None, None),
        (plain, curved) => {
            let (socket, endpoint) = bind_admin(&ctx, plain.as_deref(), curved.as_ref())?;
            (Some(socket), endpoint)
        }
    };
    // The CURVE admin endpoint's handshakes, for the admin `STATUS`.
    let mut handshakes = Vec::new();
    let monitor = match (&admin, curve_endpoint) {
        (Some(socket), Some(endpoint)) => {
            let h = Arc::new(SocketHandshakes::new(ADMIN_DOMAIN, endpoint));
            handshakes.push(h.clone());
            Some(HandshakeMonitor::start(&ctx, vec![(socket, h)])?)
        }
        _ => None,
    };
    let zap_state = zap.as_ref().map(ZapHandler::state);
    let status = || serde_json::json!({"curve": curve::report::counts_json(&handshakes, zap_state.as_deref())});
    let mut link = Link::connect(&ctx, cfg)?;
    loop {
        if let Some(why) = service.lease_lost() {
            tracing::error!(why = %why, "this scheduler is no longer the active one: stopping");
            break;
        }
        if link.registered {
            for fire in service.fire_due(Now::read()) {
                link.send_request(&fire);
            }
        }
        service.maintain(Now::read());
        service.sync();
        link.tick(&ctx, cfg)?;
        let timeout_ms = poll_timeout(&link, service, cfg);
        let (ready_link, ready_admin, ready_signal) = wait(&link.socket, admin.as_ref(), shutdown_fd, timeout_ms)?;
        if ready_signal {
            tracing::info!("signal received: shutting down");
            break;
        }
        if ready_link {
            link.drain(service);
        }
        if let (true, Some(admin)) = (ready_admin, admin.as_ref()) {
            drain_admin(admin, service, &status);
        }
    }
    link.close();
    service.sync();
    if let Some(m) = monitor {
        m.stop();
    }
    // The CURVE server socket closes before its ZAP handler stops.
    drop(admin);
    if let Some(z) = zap {
        z.stop();
    }
    Ok(())
}

/// The admin ROUTER socket: the plain `addr` bound first, then the CURVE
/// endpoint (see [`curve::bind_curve`] for why in this order); with the
/// CURVE endpoint as bound.
fn bind_admin(
    ctx: &zmq::Context,
    addr: Option<&str>,
    curved: Option<&AdminCurve>,
) -> Result<(zmq::Socket, Option<String>), ZmqError> {
    let mut s = ctx.socket(zmq::ROUTER).map_err(ZmqError::at("admin socket"))?;
    s.set_linger(limits::ADMIN_LINGER_MS).map_err(ZmqError::at("admin linger"))?;
    // Without it one frame, or one message that never ends, could take any
    // amount of memory: ZeroMQ drops such a peer's connection.
    let max = limits::zmq_max_msg_size(limits::SCHEDULER_ADMIN_MAX_MESSAGE_BYTES);
    s.set_maxmsgsize(max).map_err(ZmqError::at("admin maxmsgsize"))?;
    if let Some(addr) = addr {
        s.bind(addr).map_err(ZmqError::at(format!("bind admin socket {addr}")))?;
        if let Ok(Ok(ep)) = s.get_last_endpoint() {
            tracing::info!(endpoint = %ep, "admin socket bound");
        }
    }
    let mut curve_endpoint = None;
    if let Some(c) = curved {
        let ep = curve::bind_curve(&mut s, &c.addr, &c.secret, ADMIN_DOMAIN)?;
        tracing::info!(endpoint = %ep, admins = c.admins.len(), "CURVE admin socket bound");
        curve_endpoint = Some(ep);
    }
    Ok((s, curve_endpoint))
}

/// Milliseconds until the next thing the loop must do (rounded up, so the
/// loop never wakes just before a deadline and spins).
fn poll_timeout(link: &Link, service: &mut Service, cfg: &PeerConfig) -> i64 {
    let now = Instant::now();
    let mut wake = link.last_heard + cfg.router_timeout;
    wake = wake.min(if link.registered { link.next_heartbeat } else { link.next_inform });
    wake = wake.min(service.next_maintenance());
    let mut ms = ceil_ms(wake.saturating_duration_since(now));
    if let (true, Some(deadline)) = (link.registered, service.next_deadline()) {
        ms = ms.min(ceil_ms(deadline.saturating_duration_since(now)));
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

impl Link {
    fn connect(ctx: &zmq::Context, cfg: &PeerConfig) -> Result<Link, ZmqError> {
        let identity = uuid::Uuid::new_v4().hyphenated().to_string();
        let socket = ctx.socket(zmq::DEALER).map_err(ZmqError::at("dealer socket"))?;
        socket.set_identity(identity.as_bytes()).map_err(ZmqError::at("set identity"))?;
        socket.set_sndhwm(limits::ZMQ_HWM).map_err(ZmqError::at("set sndhwm"))?;
        socket.set_rcvhwm(limits::ZMQ_HWM).map_err(ZmqError::at("set rcvhwm"))?;
        socket.set_linger(limits::RECONNECT_LINGER_MS).map_err(ZmqError::at("set linger"))?;
        // Every address of the list (docs/failover.md): INFORM goes to the
        // router that is up.
        crate::client::set_router_options(&socket).map_err(ZmqError::at("set immediate and heartbeats"))?;
        let list: Vec<String> =
            cfg.router_addr.split(',').map(str::trim).filter(|a| !a.is_empty()).map(String::from).collect();
        curve::connect_each(&socket, &list, cfg.router_curve.as_ref())?;
        tracing::info!(router = %cfg.router_addr, identity = %identity, "connecting; sending INFORM");
        let now = Instant::now();
        let mut link = Link {
            socket,
            identity,
            name: cfg.name.clone(),
            inform_msgid: Vec::new(),
            registered: false,
            last_heard: now,
            next_heartbeat: now,
            next_inform: now + cfg.inform_retry,
        };
        if !link.send_inform() {
            link.next_inform = now + limits::WORKER_INFORM_WAIT_POLL;
        }
        Ok(link)
    }

    /// INFORM (frame 4 `""`, frame 5 `scheduler`, frame 6 the name if any).
    /// False when no router of the list is connected yet (`ZMQ_IMMEDIATE`
    /// refused it, quietly): it is tried again soon (docs/failover.md).
    fn send_inform(&mut self) -> bool {
        let name = self.name.as_ref().map(|n| n.clone().into_bytes());
        let msg = Message::new(Command::Inform { queues: Vec::new(), peer: PeerType::Scheduler, name });
        self.inform_msgid = msg.msgid.clone();
        match self.socket.send_multipart(msg.encode(), zmq::DONTWAIT) {
            Ok(()) => true,
            Err(zmq::Error::EAGAIN) => false,
            Err(e) => {
                crate::log_limited!(warn, identity = %self.identity, error = %e, "INFORM to router failed");
                false
            }
        }
    }

    fn send(&self, command: Command) {
        self.send_message(&Message::new(command));
    }

    fn send_message(&self, msg: &Message) {
        if let Err(e) = self.socket.send_multipart(msg.encode(), zmq::DONTWAIT) {
            let word = String::from_utf8_lossy(msg.command.word()).into_owned();
            crate::log_limited!(warn, command = %word, identity = %self.identity, error = %e, "send to router failed");
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
            let sent = self.send_inform();
            self.next_inform = now + if sent { cfg.inform_retry } else { limits::WORKER_INFORM_WAIT_POLL };
        }
        Ok(())
    }

    /// Reads up to [`limits::BATCH`] messages without blocking.
    fn drain(&mut self, service: &mut Service) {
        for _ in 0..limits::BATCH {
            let frames = match self.socket.recv_multipart(zmq::DONTWAIT) {
                Ok(f) => f,
                Err(zmq::Error::EAGAIN) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "receive from router failed");
                    break;
                }
            };
            self.handle(&frames, service);
        }
    }

    fn handle(&mut self, frames: &[Frame], service: &mut Service) {
        let msg = match emqp::decode(frames, Socket::SchedulerSide) {
            Ok(m) => m,
            Err(e) => return self.reject_undecodable(frames, &e),
        };
        match msg.command {
            Command::Ack { acked } => self.handle_ack(&acked),
            Command::Schedule(body) => match service.handle_schedule(&body, Now::read()) {
                Ok((answer, haste)) => {
                    self.send_answer(&msg.msgid, &answer);
                    if let Some(fire) = haste {
                        self.send_request(&fire);
                    }
                }
                Err(e) => self.send_error(&msg.msgid, e.code(), &e.to_string()),
            },
            Command::Unschedule(body) => match service.handle_unschedule(&body) {
                Ok(answer) => self.send_answer(&msg.msgid, &answer),
                Err(e) => self.send_error(&msg.msgid, "BAD_BODY", &format!("frame 7: {e}")),
            },
            Command::Drop(body) => service.handle_drop(&body),
            Command::Kbye | Command::Disconnect => {
                let word = String::from_utf8_lossy(msg.command.word()).into_owned();
                tracing::info!(command = %word, "router does not know this scheduler (any more); re-registering");
                self.registered = false;
                self.next_inform = Instant::now();
            }
            Command::Heartbeat { .. } => self.last_heard = Instant::now(),
            other => tracing::debug!(command = ?other, "ignored message from router"),
        }
    }

    /// An ACK: of our INFORM, registration is complete; of something else
    /// while registered, an emq router has re-admitted us on a HEARTBEAT
    /// after forgetting us, and a fresh INFORM gives it our name back.
    fn handle_ack(&mut self, acked: &[u8]) {
        self.last_heard = Instant::now();
        let ours = acked == self.inform_msgid.as_slice();
        if self.registered && !ours {
            tracing::info!(identity = %self.identity, "re-admitted by the router; INFORMing again with our name");
            if self.name.is_some() {
                self.send_inform();
            }
        } else if !self.registered {
            tracing::info!(identity = %self.identity, "registered with the router (ACK)");
        }
        self.registered = true;
        self.next_heartbeat = Instant::now();
    }

    /// The acceptance of a SCHEDULE/UNSCHEDULE (emq extension): `REPLY`,
    /// frame 4 its msgid, frame 5 the outcome as JSON ([`Answer::to_json`]). The
    /// router forwards it to the client that sent the message; an EventMQ
    /// router ignores it.
    fn send_answer(&self, refers_to: &[u8], answer: &Answer) {
        let mut frames = Message::new(Command::Reply { body: refers_to.to_vec() }).encode();
        frames.push(answer.to_json().into_bytes());
        if let Err(e) = self.socket.send_multipart(frames, zmq::DONTWAIT) {
            tracing::warn!(identity = %self.identity, error = %e, "answer to router failed");
        }
    }

    /// Logs an undecodable message; a SCHEDULE/UNSCHEDULE with missing
    /// frames also gets an ERROR back.
    fn reject_undecodable(&self, frames: &[Frame], e: &DecodeError) {
        crate::log_limited!(warn, error = %e, frames = %ShowFrames(frames), "bad message from router");
        if let (DecodeError::MissingFrame { command: "SCHEDULE" | "UNSCHEDULE", .. }, Some(msgid)) = (e, frames.get(3))
        {
            self.send_error(msgid, "BAD_FRAMES", &e.to_string());
        }
    }

    fn send_error(&self, refers_to: &[u8], code: &str, text: &str) {
        crate::log_limited!(warn, msgid = %ShowFrame(refers_to), code, error = %ShowText(text), "rejected message");
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
/// [`Service::schedules_json`]; `STATUS` → REPLY with `status()`
/// (`{"curve": …}`, [`curve::report::counts_json`]: the CURVE admin
/// endpoint's handshakes and the ZAP requests; both `{}` without one);
/// `HELLO` is ignored (emq-cli sends it on connect); anything else →
/// ERROR `UNKNOWN_COMMAND`.
fn drain_admin(admin: &zmq::Socket, service: &Service, status: &dyn Fn() -> serde_json::Value) {
    for _ in 0..limits::BATCH {
        let frames = match admin.recv_multipart(zmq::DONTWAIT) {
            Ok(f) => f,
            Err(_) => break,
        };
        // R-frames: identity, then frames ["", version, command, msgid].
        let (Some(identity), Some(word), Some(msgid)) = (frames.first(), frames.get(3), frames.get(4)) else {
            // As sent: the frames after the identity, which goes apart.
            let (peer, sent) = frames.split_first().map_or((&[][..], &frames[..]), |(id, sent)| (&id[..], sent));
            let peer = peer.escape_ascii();
            crate::log_limited!(warn, %peer, frames = sent.len(), content = %ShowFrames(sent), "short admin request");
            continue;
        };
        let command = match word.as_slice() {
            b"SCHEDULES" => Command::Reply { body: service.schedules_json(Now::read()).into_bytes() },
            b"STATUS" => Command::Reply { body: status().to_string().into_bytes() },
            b"HELLO" => continue,
            _ => Command::Error {
                refers_to: msgid.clone(),
                code: b"UNKNOWN_COMMAND".to_vec(),
                text: b"the scheduler's admin socket answers SCHEDULES and STATUS only".to_vec(),
            },
        };
        let mut out = vec![identity.clone()];
        out.extend(Message::new(command).encode());
        if let Err(e) = admin.send_multipart(out, zmq::DONTWAIT) {
            crate::log_limited!(warn, error = %e, "admin reply failed");
        }
    }
}
