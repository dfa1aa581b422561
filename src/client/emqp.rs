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

use std::collections::HashMap;
use std::time::{Duration, Instant};

pub use super::socket::ClientError;
use super::socket::Dealer;
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

/// A DEALER connected to the router frontend.
pub struct Client {
    dealer: Dealer,
    timeout: Duration,
    stash: HashMap<Frame, Outcome>,
    _ctx: zmq::Context,
}

impl Client {
    /// Connects to a frontend address such as `tcp://127.0.0.1:47291`, with
    /// [`limits::CLIENT_TIMEOUT`]. Connecting never blocks; an unreachable broker
    /// shows up as [`ClientError::Unreachable`] on the first send.
    ///
    /// # Errors
    /// [`ClientError::Address`] for a malformed address.
    pub fn connect(addr: &str) -> Result<Client, ClientError> {
        let ctx = zmq::Context::new();
        let dealer = Dealer::connect(&ctx, addr, limits::CLIENT_LINGER_MS, limits::CLIENT_MAX_ANSWER_BYTES)?;
        Ok(Client { dealer, timeout: limits::CLIENT_TIMEOUT, stash: HashMap::new(), _ctx: ctx })
    }

    /// Sets how long sends wait for a connection and requests wait for an answer.
    pub fn with_timeout(mut self, timeout: Duration) -> Client {
        self.timeout = timeout;
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

    /// Sends a REQUEST without waiting; returns its msgid. Answers that
    /// arrive later can be collected with [`Client::wait`].
    ///
    /// # Errors
    /// [`ClientError::Unreachable`] when no connection came up in time.
    pub fn send_request(&mut self, queue: &str, headers: &str, body: &[u8]) -> Result<Frame, ClientError> {
        let msg = Message::new(Command::Request {
            queue: queue.as_bytes().to_vec(),
            headers: headers.as_bytes().to_vec(),
            body: body.to_vec(),
            extra: Vec::new(),
        });
        self.dealer.send_timeout(&msg.encode(), self.timeout)?;
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
                return Ok(outcome);
            }
            let Some(frames) = self.dealer.recv_deadline(deadline)? else {
                return Ok(Outcome::Unknown { msgid: msgid.to_vec() });
            };
            if let Some(outcome) = outcome_of(&frames) {
                if self.stash.len() >= limits::CLIENT_MAX_STASHED_ANSWERS {
                    self.stash.clear();
                }
                let key = outcome_msgid(&outcome).to_vec();
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
        let ctx = zmq::Context::new();
        let dealer = Dealer::connect(&ctx, addr, limits::CLIENT_LINGER_MS, limits::CLIENT_MAX_ANSWER_BYTES)?;
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
