//! eMQP client: REQUEST, SCHEDULE, UNSCHEDULE to the router frontend, and
//! PUBLISH to the pub/sub device (EventMQ 0.3.13, docs/emqp.md "REQUEST").
//!
//! Unlike the Python client (one fire-and-forget socket per call), a
//! [`Client`] keeps one DEALER and can wait for the broker's answer:
//! * emq's router answers every REQUEST: an acceptance REPLY (frame 4 = the
//!   REQUEST msgid) whether the job was dispatched or queued, or an `ERROR`
//!   (`QUEUE_FULL`, `NO_SCHEDULER`, `SHUTTING_DOWN`, …).
//! * An EventMQ Python router sends the acceptance REPLY **only** when it
//!   dispatches the job at once; a buffered job gets nothing. So
//!   [`Outcome::Unknown`] (a timeout) means "unknown", not "lost".
//!
//! ```no_run
//! use emq::client::body::PythonCall;
//! use emq::client::emqp::{Client, Outcome};
//! let mut client = Client::connect("tcp://127.0.0.1:47291").unwrap();
//! let body = PythonCall::new("jobs_mod", "add").args(vec![2.into(), 3.into()]).body();
//! match client.request("default", "", &body).unwrap() {
//!     Outcome::Accepted { msgid } => println!("accepted {}", String::from_utf8_lossy(&msgid)),
//!     Outcome::Rejected { code, text, .. } => eprintln!("rejected: {code} {text}"),
//!     Outcome::Unknown { .. } => eprintln!("no answer (a Python router answers only immediate dispatches)"),
//! }
//! ```

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

pub use super::socket::ClientError;
use super::socket::{Dealer, Heard};
use crate::limits;
use crate::protocol::emqp::{decode, Command, Frame, Message, ScheduleBody, Socket};

/// What the broker said about a REQUEST.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// An acceptance REPLY whose frame 4 is this REQUEST's msgid.
    Accepted {
        /// The REQUEST msgid (the job id).
        msgid: Frame,
    },
    /// An `ERROR` (emq extension) for this REQUEST.
    Rejected {
        /// The REQUEST msgid.
        msgid: Frame,
        /// The error code token, e.g. `QUEUE_FULL`.
        code: String,
        /// Human-readable text.
        text: String,
    },
    /// No answer within the timeout: with an EventMQ Python router this is
    /// normal for a buffered job. The job may or may not be queued.
    Unknown {
        /// The REQUEST msgid.
        msgid: Frame,
    },
}

/// What came back for a SCHEDULE or UNSCHEDULE ([`Client::schedule_confirmed`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScheduleAnswer {
    /// The scheduler took it (emq-scheduler's `REPLY`, forwarded by an emq
    /// router): frame 5, the outcome as JSON text, e.g.
    /// `{"outcome":"added","key":"9e1e…","next_fire":"2026-01-01T00:05:00Z"}`.
    Accepted {
        /// The message's msgid.
        msgid: Frame,
        /// The scheduler's outcome JSON (empty if it sent none).
        detail: String,
    },
    /// Refused with `ERROR <CODE> <text>`, by the router (no scheduler,
    /// malformed) or the scheduler.
    Refused {
        /// The message's msgid.
        msgid: Frame,
        /// The error code token, e.g. `BAD_CRON`.
        code: String,
        /// The reason.
        text: String,
    },
    /// No answer in time: an EventMQ router or scheduler never answers, so
    /// this is not a refusal.
    Unconfirmed {
        /// The message's msgid.
        msgid: Frame,
    },
}

/// When a scheduled job runs (docs/emqp.md "SCHEDULE and UNSCHEDULE" frames 6 and 8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Schedule {
    /// Every N seconds (N > 0; EventMQ fires `interval 0` every loop).
    Interval(u64),
    /// A 5-field cron expression, evaluated in UTC.
    Cron(String),
}

/// One owner's connection: a DEALER connected to the router frontend
/// (one address or the owner's list of addresses, docs/failover.md).
/// [`Client`] keeps one per owner.
///
/// **Re-sent REQUESTs.** The client keeps every REQUEST it sent and has no
/// answer for yet (at most [`limits::CLIENT_MAX_PENDING_REQUESTS`], the
/// oldest dropped first). When a connection to a router goes down (closed
/// by the peer, or its ZMTP heartbeats unanswered for
/// [`limits::ZMTP_HEARTBEAT_TIMEOUT`]) every such REQUEST sent before is
/// sent again, the same frames with the same msgid, to the router that is
/// up (the send waits for one, up to the current wait's deadline), during
/// the next [`Client::wait`] or [`Client::request`]. A REQUEST leaves the set when its
/// acceptance or ERROR arrives, or when a wait for it ends without one
/// ([`Outcome::Unknown`]). SCHEDULE and UNSCHEDULE are not re-sent.
/// The router that receives a re-sent REQUEST must not make a second job
/// of a msgid it already accepted from this client (docs/failover.md
/// "Duplicates"); the routing id of the client's socket is made once and
/// is the same on every router of the list.
pub(crate) struct Conn {
    dealer: Dealer,
    timeout: Duration,
    stash: HashMap<Frame, Outcome>,
    /// REQUESTs sent and not answered: their frames and the disconnect
    /// count when last sent.
    /// Also whether it was sent again already.
    pending: HashMap<Frame, (Vec<Frame>, u64, bool)>,
    /// `pending`'s msgids, oldest first (may hold answered ones).
    order: VecDeque<Frame>,
    /// Connections lost so far.
    disconnects: u64,
    /// `disconnects` when every pending REQUEST was last sent again.
    resent_at: u64,
    /// REQUESTs sent again so far.
    resent: u64,
    /// When the REQUESTs re-sent after a lost connection and still
    /// unanswered are sent again ([`limits::CLIENT_RESEND_INTERVAL`]): a
    /// re-send can itself meet a connection that is going down.
    retry_at: Option<Instant>,
    _ctx: zmq::Context,
}

impl Conn {
    /// [`Client::connect`], as a CURVE client when `curve` is set (to a
    /// router's `frontend_curve`; one server key for all addresses or one
    /// per address).
    ///
    /// # Errors
    /// As [`Client::connect`].
    pub fn connect_with(addr: &str, curve: Option<&crate::curve::ClientCurve>) -> Result<Conn, ClientError> {
        let ctx = zmq::Context::new();
        let mut dealer =
            Dealer::connect_with(&ctx, addr, limits::CLIENT_LINGER_MS, limits::CLIENT_MAX_ANSWER_BYTES, curve)?;
        dealer.watch_disconnects(&ctx)?;
        Ok(Conn {
            dealer,
            timeout: limits::CLIENT_TIMEOUT,
            stash: HashMap::new(),
            pending: HashMap::new(),
            order: VecDeque::new(),
            disconnects: 0,
            resent_at: 0,
            resent: 0,
            retry_at: None,
            _ctx: ctx,
        })
    }

    /// REQUESTs sent again so far, after a connection went down.
    pub fn resent(&self) -> u64 {
        self.resent
    }

    /// REQUESTs sent and not answered yet (the re-send set).
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Sends every pending REQUEST last sent before the latest lost
    /// connection again; false when no router took them before `deadline`
    /// (they are tried again at the next wait).
    fn resend_lost(&mut self, deadline: Instant) -> Result<bool, ClientError> {
        let now_at = self.disconnects;
        let ids: Vec<Frame> = self.order.iter().filter(|id| self.pending.contains_key(*id)).cloned().collect();
        for id in ids {
            let Some((frames, at, _)) = self.pending.get(&id) else { continue };
            if *at >= now_at {
                continue;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.dealer.send_timeout(frames, left) {
                Ok(()) => {
                    self.resent += 1;
                    if let Some(entry) = self.pending.get_mut(&id) {
                        entry.1 = now_at;
                        entry.2 = true;
                    }
                    self.retry_at = Some(Instant::now() + limits::CLIENT_RESEND_INTERVAL);
                    tracing::debug!(msgid = %String::from_utf8_lossy(&id), "REQUEST sent again after a lost connection");
                }
                Err(ClientError::Unreachable { .. }) => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Forgets a REQUEST of the re-send set.
    fn settle(&mut self, msgid: &[u8]) {
        self.pending.remove(msgid);
        if self.pending.is_empty() {
            self.order.clear();
        }
    }

    /// Sets how long sends wait for a connection and requests wait for an answer.
    pub fn with_timeout(mut self, timeout: Duration) -> Conn {
        self.timeout = timeout;
        self
    }

    /// Sends a REQUEST without waiting; returns its msgid. Answers that
    /// arrive later can be collected with [`Client::wait`].
    ///
    /// # Errors
    /// [`ClientError::Unreachable`] when no connection came up in time.
    pub fn send_request(&mut self, queue: &str, headers: &str, body: &[u8]) -> Result<Frame, ClientError> {
        self.send_request_within(queue, headers, body, self.timeout)
    }

    /// The owner's addresses, joined by commas.
    pub fn addr(&self) -> &str {
        &self.dealer.addr
    }

    /// [`Conn::send_request`], waiting at most `wait` for a connection
    /// (zero: only a live one takes it).
    ///
    /// # Errors
    /// [`ClientError::Unreachable`] when none took it in time.
    pub fn send_request_within(
        &mut self,
        queue: &str,
        headers: &str,
        body: &[u8],
        wait: Duration,
    ) -> Result<Frame, ClientError> {
        let msg = Message::new(Command::Request {
            queue: queue.as_bytes().to_vec(),
            headers: headers.as_bytes().to_vec(),
            body: body.to_vec(),
            extra: Vec::new(),
        });
        let frames = msg.encode();
        self.dealer.send_timeout(&frames, wait)?;
        while self.pending.len() >= limits::CLIENT_MAX_PENDING_REQUESTS {
            let Some(old) = self.order.pop_front() else { break };
            self.pending.remove(&old);
        }
        if self.order.len() >= 2 * limits::CLIENT_MAX_PENDING_REQUESTS {
            let pending = &self.pending;
            self.order.retain(|id| pending.contains_key(id));
        }
        self.pending.insert(msg.msgid.clone(), (frames, self.disconnects, false));
        self.order.push_back(msg.msgid.clone());
        Ok(msg.msgid)
    }

    /// Waits until `deadline` for the answer to REQUEST `msgid`. Answers for
    /// other msgids are kept for later calls.
    ///
    /// # Errors
    /// [`ClientError::Zmq`] when the socket fails.
    pub fn wait(&mut self, msgid: &[u8], deadline: Instant) -> Result<Outcome, ClientError> {
        loop {
            if let Some(outcome) = self.stash.remove(msgid) {
                self.settle(msgid);
                return Ok(outcome);
            }
            if self.resent_at < self.disconnects && self.resend_lost(deadline)? {
                self.resent_at = self.disconnects;
            }
            if self.retry_at.is_some_and(|t| Instant::now() >= t) {
                // Mark every re-sent REQUEST as last sent before now.
                self.disconnects += 1;
                let moved = self.disconnects;
                let mut any = false;
                for entry in self.pending.values_mut() {
                    if entry.2 {
                        entry.1 = moved - 1;
                        any = true;
                    }
                }
                self.retry_at = None;
                if any && self.resend_lost(deadline)? {
                    self.resent_at = self.disconnects;
                }
            }
            let until = self.retry_at.map_or(deadline, |t| t.min(deadline));
            let frames = match self.dealer.recv_or_disconnect(until)? {
                Heard::Message(frames) => frames,
                Heard::Disconnected => {
                    self.disconnects += 1;
                    tracing::info!(addr = %self.dealer.addr, pending = self.pending.len(),
                        "a router connection went down: unanswered REQUESTs will be sent again");
                    continue;
                }
                Heard::Nothing if Instant::now() < deadline => continue,
                Heard::Nothing => {
                    self.settle(msgid);
                    return Ok(Outcome::Unknown { msgid: msgid.to_vec() });
                }
            };
            if let Some(outcome) = outcome_of(&frames) {
                if self.stash.len() >= limits::CLIENT_MAX_STASHED_ANSWERS {
                    self.stash.clear();
                }
                let key = outcome_msgid(&outcome).to_vec();
                self.settle(&key);
                self.stash.insert(key, outcome);
            }
        }
    }

    /// Sends SCHEDULE (9 frames, docs/emqp.md "SCHEDULE and UNSCHEDULE")
    /// without waiting; returns the msgid. EventMQ sends no acknowledgement;
    /// an emq router forwards the scheduler's (see [`Client::schedule_confirmed`]).
    ///
    /// # Errors
    /// [`ClientError::Invalid`] for `Interval(0)` or an empty cron;
    /// [`ClientError::Unreachable`].
    pub fn schedule(&mut self, queue: &str, when: &Schedule, body: &[u8], headers: &str) -> Result<Frame, ClientError> {
        let (interval, cron) = match when {
            Schedule::Interval(0) => return Err(ClientError::Invalid("schedule interval must be > 0 s".into())),
            Schedule::Interval(secs) => (secs.to_string(), String::new()),
            Schedule::Cron(c) if c.trim().is_empty() => {
                return Err(ClientError::Invalid("cron expression is empty".into()))
            }
            Schedule::Cron(c) => ("-1".to_string(), c.clone()),
        };
        self.send_schedule(false, queue, headers, &interval, body, &cron)
    }

    /// Sends UNSCHEDULE for the job with this body (9 frames, interval
    /// `-1`, cron empty; the scheduler matches on the body only).
    ///
    /// # Errors
    /// [`ClientError::Unreachable`].
    pub fn unschedule(&mut self, queue: &str, body: &[u8], headers: &str) -> Result<Frame, ClientError> {
        self.send_schedule(true, queue, headers, "-1", body, "")
    }

    /// Waits until `deadline` for the REPLY or ERROR naming SCHEDULE or
    /// UNSCHEDULE `msgid`. Answers to REQUESTs that arrive meanwhile are
    /// kept for [`Client::wait`].
    ///
    /// # Errors
    /// [`ClientError::Zmq`] when the socket fails.
    pub fn wait_schedule(&mut self, msgid: &[u8], deadline: Instant) -> Result<ScheduleAnswer, ClientError> {
        loop {
            let Some(frames) = self.dealer.recv_deadline(deadline)? else {
                return Ok(ScheduleAnswer::Unconfirmed { msgid: msgid.to_vec() });
            };
            let Some(outcome) = outcome_of(&frames) else { continue };
            match outcome {
                Outcome::Accepted { msgid: m } if m == msgid => {
                    let detail = frames.get(5).map(|d| String::from_utf8_lossy(d).into_owned()).unwrap_or_default();
                    return Ok(ScheduleAnswer::Accepted { msgid: m, detail });
                }
                Outcome::Rejected { msgid: m, code, text } if m == msgid => {
                    return Ok(ScheduleAnswer::Refused { msgid: m, code, text })
                }
                other => {
                    if self.stash.len() >= limits::CLIENT_MAX_STASHED_ANSWERS {
                        self.stash.clear();
                    }
                    self.stash.insert(outcome_msgid(&other).to_vec(), other);
                }
            }
        }
    }

    fn send_schedule(
        &mut self,
        un: bool,
        queue: &str,
        headers: &str,
        interval: &str,
        body: &[u8],
        cron: &str,
    ) -> Result<Frame, ClientError> {
        let sb = ScheduleBody {
            queue: queue.as_bytes().to_vec(),
            headers: headers.as_bytes().to_vec(),
            interval: interval.as_bytes().to_vec(),
            body: body.to_vec(),
            cron: Some(cron.as_bytes().to_vec()),
        };
        let msg = Message::new(if un { Command::Unschedule(sb) } else { Command::Schedule(sb) });
        self.dealer.send_timeout(&msg.encode(), self.timeout)?;
        Ok(msg.msgid)
    }
}

/// An eMQP client of one router name or of several (owners,
/// docs/scaleout.md): one [`Conn`] (DEALER) per owner.
///
/// **Spreading.** Given several owners (`;` in the address list,
/// [`crate::config::addr::emqp_owners`]), each REQUEST goes to the next
/// owner in turn (starting at a random one, so that one-shot producers
/// such as `emq-cli request` spread too) that has a live connection (a send that would wait is
/// passed to the next owner; only when none takes it does the send wait,
/// up to the timeout, for any of them). Round-robin per REQUEST, not by
/// queue: a queue's jobs spread over every owner, so FIFO holds per owner
/// only (docs/scaleout.md "Order").
///
/// **Re-sends stay with their owner.** An unanswered REQUEST is sent again
/// (same msgid, same routing id) only to the addresses of the owner it
/// was first sent to (its owner or that name's standby, which share the
/// name's duplicate window: docs/failover.md "Duplicates"), never to
/// another owner, which could not know the msgid and would make a second
/// job. While a whole owner is down its unanswered REQUESTs wait for it
/// and end [`Outcome::Unknown`] at the wait's deadline; new REQUESTs go to
/// the owners that are up.
///
/// SCHEDULE and UNSCHEDULE go to the first owner of the list, so that an
/// UNSCHEDULE reaches the scheduler that holds the schedule.
pub struct Client {
    conns: Vec<Conn>,
    /// The owner the next REQUEST tries first.
    next: usize,
    /// The owner each REQUEST of the re-send sets went to (bounded like
    /// them: entries beyond [`limits::CLIENT_MAX_PENDING_REQUESTS`] per
    /// owner are dropped oldest first; a msgid not found waits on the
    /// first owner).
    owner_of: HashMap<Frame, usize>,
    order: VecDeque<Frame>,
    timeout: Duration,
}

impl Client {
    /// Connects to a frontend address such as `tcp://127.0.0.1:47291`, or a
    /// list (`,` between one name's addresses, `;` between owners), with
    /// [`limits::CLIENT_TIMEOUT`]. Connecting never blocks; an unreachable
    /// broker shows up as [`ClientError::Unreachable`] on the first send.
    ///
    /// # Errors
    /// [`ClientError::Address`] for a malformed address.
    pub fn connect(addr: &str) -> Result<Client, ClientError> {
        Client::connect_with(addr, None)
    }

    /// [`Client::connect`], as a CURVE client when `curve` is set (to a
    /// router's `frontend_curve`; one server key for all addresses or one
    /// per address, in the order of the whole list).
    ///
    /// # Errors
    /// As [`Client::connect`].
    pub fn connect_with(addr: &str, curve: Option<&crate::curve::ClientCurve>) -> Result<Client, ClientError> {
        let owners = crate::config::addr::emqp_owners(addr)?;
        let curves = crate::curve::ClientCurve::per_owner(curve, &owners);
        let conns = owners
            .iter()
            .zip(&curves)
            .map(|(group, mine)| Conn::connect_with(&group.join(","), mine.as_ref()))
            .collect::<Result<Vec<Conn>, ClientError>>()?;
        let next = super::text_spread::random_index(conns.len());
        Ok(Client { conns, next, owner_of: HashMap::new(), order: VecDeque::new(), timeout: limits::CLIENT_TIMEOUT })
    }

    /// How many owners the client spreads over.
    pub fn owners(&self) -> usize {
        self.conns.len()
    }

    /// REQUESTs sent again so far, after a connection went down.
    pub fn resent(&self) -> u64 {
        self.conns.iter().map(Conn::resent).sum()
    }

    /// REQUESTs sent and not answered yet (the re-send sets).
    pub fn pending(&self) -> usize {
        self.conns.iter().map(Conn::pending).sum()
    }

    /// Sets how long sends wait for a connection and requests wait for an answer.
    pub fn with_timeout(mut self, timeout: Duration) -> Client {
        self.timeout = timeout;
        self.conns = self.conns.into_iter().map(|c| c.with_timeout(timeout)).collect();
        self
    }

    /// Sends a REQUEST (7 frames, docs/emqp.md "REQUEST") and waits up to the
    /// timeout for the acceptance REPLY or ERROR naming its msgid.
    ///
    /// # Errors
    /// [`ClientError::Unreachable`] when no connection came up in time.
    pub fn request(&mut self, queue: &str, headers: &str, body: &[u8]) -> Result<Outcome, ClientError> {
        let msgid = self.send_request(queue, headers, body)?;
        self.wait(&msgid, Instant::now() + self.timeout)
    }

    /// Sends a REQUEST without waiting, to the next owner in turn that
    /// takes it at once (see the type's docs); returns its msgid. Answers
    /// that arrive later can be collected with [`Client::wait`].
    ///
    /// # Errors
    /// [`ClientError::Unreachable`] when no owner's connection came up in
    /// time.
    pub fn send_request(&mut self, queue: &str, headers: &str, body: &[u8]) -> Result<Frame, ClientError> {
        let n = self.conns.len();
        if n == 1 {
            return self.conns[0].send_request(queue, headers, body);
        }
        let deadline = Instant::now() + self.timeout;
        loop {
            for k in 0..n {
                let i = (self.next + k) % n;
                let Some(conn) = self.conns.get_mut(i) else { continue };
                match conn.send_request_within(queue, headers, body, Duration::ZERO) {
                    Ok(msgid) => {
                        self.next = (i + 1) % n;
                        self.note_owner(&msgid, i);
                        return Ok(msgid);
                    }
                    Err(ClientError::Unreachable { .. }) => continue,
                    Err(e) => return Err(e),
                }
            }
            if Instant::now() >= deadline {
                let addr = self.conns.iter().map(|c| c.addr().to_string()).collect::<Vec<_>>().join(";");
                return Err(ClientError::Unreachable { addr, timeout: self.timeout });
            }
            std::thread::sleep(limits::CLIENT_SPREAD_RETRY);
        }
    }

    /// Remembers which owner REQUEST `msgid` went to (bounded).
    fn note_owner(&mut self, msgid: &[u8], owner: usize) {
        let limit = limits::CLIENT_MAX_PENDING_REQUESTS * self.conns.len();
        while self.owner_of.len() >= limit {
            let Some(old) = self.order.pop_front() else { break };
            self.owner_of.remove(&old);
        }
        if self.order.len() >= 2 * limit {
            let known = &self.owner_of;
            self.order.retain(|id| known.contains_key(id));
        }
        self.owner_of.insert(msgid.to_vec(), owner);
        self.order.push_back(msgid.to_vec());
    }

    /// Waits until `deadline` for the answer to REQUEST `msgid`, on the
    /// owner it went to. Answers for other msgids are kept for later calls.
    ///
    /// # Errors
    /// [`ClientError::Zmq`] when the socket fails.
    pub fn wait(&mut self, msgid: &[u8], deadline: Instant) -> Result<Outcome, ClientError> {
        let owner = self.owner_of.remove(msgid).unwrap_or(0);
        match self.conns.get_mut(owner) {
            Some(conn) => conn.wait(msgid, deadline),
            None => Ok(Outcome::Unknown { msgid: msgid.to_vec() }),
        }
    }

    /// The first owner's connection: schedules live there.
    fn scheduling(&mut self) -> &mut Conn {
        &mut self.conns[0]
    }

    /// Sends SCHEDULE (9 frames, docs/emqp.md "SCHEDULE and UNSCHEDULE")
    /// to the first owner without waiting; returns the msgid. EventMQ sends
    /// no acknowledgement; an emq router forwards the scheduler's (see
    /// [`Client::schedule_confirmed`]).
    ///
    /// # Errors
    /// [`ClientError::Invalid`] for `Interval(0)` or an empty cron;
    /// [`ClientError::Unreachable`].
    pub fn schedule(&mut self, queue: &str, when: &Schedule, body: &[u8], headers: &str) -> Result<Frame, ClientError> {
        self.scheduling().schedule(queue, when, body, headers)
    }

    /// Sends UNSCHEDULE for the job with this body (9 frames, interval
    /// `-1`, cron empty; the scheduler matches on the body only), to the
    /// first owner.
    ///
    /// # Errors
    /// [`ClientError::Unreachable`].
    pub fn unschedule(&mut self, queue: &str, body: &[u8], headers: &str) -> Result<Frame, ClientError> {
        self.scheduling().unschedule(queue, body, headers)
    }

    /// Sends SCHEDULE like [`Client::schedule`] and waits up to the timeout
    /// for the answer the scheduler sends back through an emq router.
    ///
    /// # Errors
    /// As [`Client::schedule`].
    pub fn schedule_confirmed(
        &mut self,
        queue: &str,
        when: &Schedule,
        body: &[u8],
        headers: &str,
    ) -> Result<ScheduleAnswer, ClientError> {
        let msgid = self.schedule(queue, when, body, headers)?;
        self.wait_schedule(&msgid, Instant::now() + self.timeout)
    }

    /// Sends UNSCHEDULE like [`Client::unschedule`] and waits up to the
    /// timeout for the scheduler's answer (outcome `unscheduled` or
    /// `not_found`).
    ///
    /// # Errors
    /// As [`Client::unschedule`].
    pub fn unschedule_confirmed(
        &mut self,
        queue: &str,
        body: &[u8],
        headers: &str,
    ) -> Result<ScheduleAnswer, ClientError> {
        let msgid = self.unschedule(queue, body, headers)?;
        self.wait_schedule(&msgid, Instant::now() + self.timeout)
    }

    /// Waits until `deadline` for the REPLY or ERROR naming SCHEDULE or
    /// UNSCHEDULE `msgid` (sent to the first owner).
    ///
    /// # Errors
    /// [`ClientError::Zmq`] when the socket fails.
    pub fn wait_schedule(&mut self, msgid: &[u8], deadline: Instant) -> Result<ScheduleAnswer, ClientError> {
        self.scheduling().wait_schedule(msgid, deadline)
    }
}

fn outcome_of(frames: &[Frame]) -> Option<Outcome> {
    match decode(frames, Socket::ClientSide).ok()?.command {
        Command::Reply { body } => Some(Outcome::Accepted { msgid: body }),
        Command::Error { refers_to, code, text } => Some(Outcome::Rejected {
            msgid: refers_to,
            code: String::from_utf8_lossy(&code).into_owned(),
            text: String::from_utf8_lossy(&text).into_owned(),
        }),
        _ => None,
    }
}

fn outcome_msgid(o: &Outcome) -> &[u8] {
    match o {
        Outcome::Accepted { msgid } | Outcome::Rejected { msgid, .. } | Outcome::Unknown { msgid } => msgid,
    }
}

/// A DEALER connected to the pub/sub device's incoming ROUTER (default
/// `tcp://127.0.0.1:47298`).
pub struct Publisher {
    dealer: Dealer,
    timeout: Duration,
    _ctx: zmq::Context,
}

impl Publisher {
    /// Connects (never blocks; see [`Client::connect`]).
    ///
    /// # Errors
    /// [`ClientError::Address`] for a malformed address.
    pub fn connect(addr: &str) -> Result<Publisher, ClientError> {
        Publisher::connect_with(addr, None)
    }

    /// [`Publisher::connect`], as a CURVE client of emq-pubsub's
    /// `pubsub_in_curve` when `curve` is set.
    ///
    /// # Errors
    /// [`ClientError::Address`] for a malformed address.
    pub fn connect_with(addr: &str, curve: Option<&crate::curve::ClientCurve>) -> Result<Publisher, ClientError> {
        let ctx = zmq::Context::new();
        let dealer =
            Dealer::connect_with(&ctx, addr, limits::CLIENT_LINGER_MS, limits::CLIENT_MAX_ANSWER_BYTES, curve)?;
        Ok(Publisher { dealer, timeout: limits::CLIENT_TIMEOUT, _ctx: ctx })
    }

    /// Sets how long a publish waits for a connection.
    pub fn with_timeout(mut self, timeout: Duration) -> Publisher {
        self.timeout = timeout;
        self
    }

    /// Sends PUBLISH (6 frames, docs/emqp.md "PUBLISH"). The message goes as
    /// given; Python's `send_publish_request` JSON-encodes its argument, so
    /// pass JSON text to talk to Python subscribers. Returns the msgid.
    ///
    /// # Errors
    /// [`ClientError::Unreachable`].
    pub fn publish(&mut self, topic: &[u8], message: &[u8]) -> Result<Frame, ClientError> {
        let msg = Message::new(Command::Publish { topic: topic.to_vec(), message: message.to_vec() });
        self.dealer.send_timeout(&msg.encode(), self.timeout)?;
        Ok(msg.msgid)
    }
}
