//! The baselines: zero-logic eMQP forwarders on one thread (ROUTER in,
//! ROUTER out), measured with the same load as the target. No queues by
//! name, no durability, no shards, no heartbeats of their own, no threads
//! beyond the one (and libzmq's I/O thread, which emq-router has too). Two
//! wires ([`Wire`]):
//!
//! * [`Wire::One`], one message per job: it ACKs INFORM, keeps a FIFO of
//!   READY credits, and forwards each client REQUEST unchanged to the
//!   worker owning the oldest credit; no acceptance REPLY, no headers
//!   touched. Like the classic ZeroMQ load-balancing broker, it reads the
//!   frontend only while it holds a credit, so waiting jobs stay in
//!   ZeroMQ's pipes. Kept as it was for comparison with earlier figures:
//!   it receives every frame into a newly allocated copy
//!   (`recv_multipart`), so it takes more instructions per job than
//!   [`Wire::Emqp`] although it sends one message fewer.
//! * [`Wire::Emqp`], the five messages an eMQP job costs emq-router: the
//!   client's REQUEST in, the acceptance REPLY out to that client (a fresh
//!   msgid, frame 4 the REQUEST's msgid), the job out to a worker with a
//!   free slot (frames as the client sent them, `reply-requested` added to
//!   the headers as emq-router adds it), the worker's job-result REPLY in
//!   and its READY in. It reads the frontend at all times and keeps a FIFO
//!   of waiting REQUESTs while no worker has a slot, as emq-router queues
//!   them. A fair ceiling for emq-router: what the same messages cost with
//!   nothing done between them.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::emqp::Target;
use super::BenchError;
use crate::limits::MAX_FRAMES;
use crate::protocol::emqp::{new_msgid, VERSION};
use crate::protocol::headers::{self, REPLY_REQUESTED};
use crate::zmq_error::ZmqError;

/// Which messages a forwarder exchanges per job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Wire {
    /// One message per job: each REQUEST forwarded unchanged to the worker
    /// of the oldest READY credit; no acceptance REPLY; the frontend read
    /// only while a credit is held.
    #[default]
    One,
    /// The five messages of an eMQP job, as emq-router exchanges them:
    /// REQUEST in, acceptance REPLY out, the job out to a worker with a free
    /// slot (FIFO of waiting REQUESTs while none has), job-result REPLY in,
    /// READY in.
    Emqp,
}

impl Wire {
    /// The name an in-process forwarder's runs are reported under:
    /// `baseline` for [`Wire::One`], `baseline-emqp` for [`Wire::Emqp`].
    pub fn baseline_name(self) -> &'static str {
        match self {
            Wire::One => "baseline",
            Wire::Emqp => "baseline-emqp",
        }
    }
}

/// What a forwarder has done: counted on its thread, published after every
/// batch of messages, final once it has stopped ([`Forwarder::stop`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counted {
    /// Client REQUESTs received.
    pub requests: u64,
    /// Acceptance REPLYs sent to clients ([`Wire::Emqp`] only).
    pub accepted: u64,
    /// Jobs (REQUESTs) sent to workers.
    pub forwarded: u64,
    /// Job-result REPLYs received from workers.
    pub results: u64,
    /// READYs received from workers.
    pub readies: u64,
    /// Messages dropped: too short, of too many frames, or a command the
    /// socket does not take.
    pub dropped: u64,
}

impl std::fmt::Display for Counted {
    /// `requests=N accepted=N forwarded=N results=N readies=N dropped=N`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "requests={} accepted={} forwarded={} results={} readies={} dropped={}",
            self.requests, self.accepted, self.forwarded, self.results, self.readies, self.dropped
        )
    }
}

/// The forwarder's thread and whoever reads its counts.
#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    counts: [AtomicU64; 6],
}

impl Shared {
    fn publish(&self, c: &Counted) {
        let values = [c.requests, c.accepted, c.forwarded, c.results, c.readies, c.dropped];
        for (slot, v) in self.counts.iter().zip(values) {
            slot.store(v, Ordering::Release);
        }
    }

    fn read(&self) -> Counted {
        let [requests, accepted, forwarded, results, readies, dropped] =
            self.counts.each_ref().map(|c| c.load(Ordering::Acquire));
        Counted { requests, accepted, forwarded, results, readies, dropped }
    }
}

/// A running forwarder; dropping it stops the thread.
pub struct Forwarder {
    /// Where to point clients and workers.
    pub target: Target,
    /// The messages it exchanges per job.
    pub wire: Wire,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

fn bound(ctx: &zmq::Context, what: &str, addr: &str) -> Result<(zmq::Socket, String), BenchError> {
    let s = ctx.socket(zmq::ROUTER).map_err(ZmqError::at(format!("{what} socket")))?;
    s.set_linger(crate::limits::BENCH_LINGER_MS).map_err(ZmqError::at("LINGER"))?;
    s.set_sndhwm(crate::limits::ZMQ_HWM).map_err(ZmqError::at("SNDHWM"))?;
    s.set_rcvhwm(crate::limits::ZMQ_HWM).map_err(ZmqError::at("RCVHWM"))?;
    s.bind(addr).map_err(ZmqError::at(format!("bind {what} {addr}")))?;
    let ep =
        s.get_last_endpoint().ok().and_then(Result::ok).ok_or_else(|| BenchError::Invalid("no endpoint".into()))?;
    Ok((s, ep))
}

impl Forwarder {
    /// Binds both sockets on fresh loopback ports and starts the thread.
    ///
    /// # Errors
    /// [`BenchError::Zmq`] when a socket cannot be made or bound.
    pub fn start(wire: Wire) -> Result<Forwarder, BenchError> {
        Forwarder::start_on("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", wire)
    }

    /// Binds the frontend and backend to the given ZeroMQ endpoints (`*` as
    /// the port picks a free one) and starts the thread.
    ///
    /// # Errors
    /// [`BenchError::Zmq`] when a socket cannot be made or bound.
    pub fn start_on(frontend_addr: &str, backend_addr: &str, wire: Wire) -> Result<Forwarder, BenchError> {
        let ctx = zmq::Context::new();
        let (frontend, fe) = bound(&ctx, "frontend", frontend_addr)?;
        let (backend, be) = bound(&ctx, "backend", backend_addr)?;
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("bench-baseline".into())
            .spawn(move || {
                let _ctx = ctx;
                let result = match wire {
                    Wire::One => drive(&mut OneWire::new(&frontend, &backend), &s),
                    Wire::Emqp => drive(&mut EmqpWire::new(&frontend, &backend), &s),
                };
                if let Err(e) = result {
                    tracing::warn!("baseline forwarder stopped: {e}");
                }
            })
            .map_err(|e| BenchError::Io { what: "spawn forwarder".into(), source: e })?;
        Ok(Forwarder { target: Target { frontend: fe, backend: be, curve: None }, wire, shared, thread: Some(thread) })
    }

    /// Its counts so far, published after every batch of messages: they
    /// may trail a job a worker already has; [`Forwarder::stop`] returns
    /// the final ones.
    pub fn counts(&self) -> Counted {
        self.shared.read()
    }

    /// Stops the thread, once it has taken in what was already on its way
    /// (it reads until its sockets stay quiet for [`QUIET`], at most
    /// [`FINAL_READ`]), and returns its final counts.
    pub fn stop(mut self) -> Counted {
        self.halt();
        self.shared.read()
    }

    fn halt(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.halt();
    }
}

/// At stop, a forwarder reads on until its sockets stay quiet this long…
pub const QUIET: Duration = Duration::from_millis(100);
/// …or at most this long.
pub const FINAL_READ: Duration = Duration::from_secs(2);

/// One wire's forwarding: `step` waits up to `timeout_ms` for messages,
/// handles every one waiting, and says how many it handled.
trait Step {
    fn step(&mut self, timeout_ms: i64) -> Result<usize, zmq::Error>;
    fn counted(&self) -> &Counted;
}

fn drive(w: &mut impl Step, shared: &Shared) -> Result<(), zmq::Error> {
    while !shared.stop.load(Ordering::Acquire) {
        if w.step(100)? > 0 {
            shared.publish(w.counted());
        }
    }
    let end = Instant::now() + FINAL_READ;
    while Instant::now() < end && w.step(QUIET.as_millis() as i64)? > 0 {}
    shared.publish(w.counted());
    Ok(())
}

/// `zmq::poll`, with a signal's interruption (the process forwarder stops
/// at SIGTERM, which any thread may take) as a poll that found nothing.
fn poll(items: &mut [zmq::PollItem<'_>], timeout_ms: i64) -> Result<i32, zmq::Error> {
    match zmq::poll(items, timeout_ms) {
        Err(zmq::Error::EINTR) => Ok(0),
        r => r,
    }
}

/// [`Wire::One`]: today's baseline, unchanged but for the counts.
struct OneWire<'a> {
    fe: &'a zmq::Socket,
    be: &'a zmq::Socket,
    credits: VecDeque<Vec<u8>>,
    n: Counted,
}

impl<'a> OneWire<'a> {
    fn new(fe: &'a zmq::Socket, be: &'a zmq::Socket) -> Self {
        OneWire { fe, be, credits: VecDeque::new(), n: Counted::default() }
    }
}

impl Step for OneWire<'_> {
    fn step(&mut self, timeout_ms: i64) -> Result<usize, zmq::Error> {
        let (fe, be) = (self.fe, self.be);
        let mut items = [be.as_poll_item(zmq::POLLIN), fe.as_poll_item(zmq::POLLIN)];
        let polled = if self.credits.is_empty() { &mut items[..1] } else { &mut items[..] };
        if poll(polled, timeout_ms)? == 0 {
            return Ok(0);
        }
        let mut handled = 0;
        while let Ok(f) = be.recv_multipart(zmq::DONTWAIT) {
            handled += 1;
            match f.get(3).map(Vec::as_slice) {
                Some(b"READY") => {
                    self.n.readies += 1;
                    self.credits.push_back(f[0].clone())
                }
                Some(b"INFORM") if f.len() > 4 => {
                    be.send_multipart([&f[0][..], b"", VERSION, b"ACK", &new_msgid(), &f[4]].iter(), 0)?
                }
                Some(b"REPLY") => self.n.results += 1,
                _ => {}
            }
        }
        while !self.credits.is_empty() {
            let Ok(mut f) = fe.recv_multipart(zmq::DONTWAIT) else { break };
            handled += 1;
            if f.get(3).map(Vec::as_slice) != Some(b"REQUEST") {
                self.n.dropped += 1;
                continue;
            }
            self.n.requests += 1;
            if let Some(w) = self.credits.pop_front() {
                f[0] = w;
                be.send_multipart(f.iter(), 0)?;
                self.n.forwarded += 1;
            }
        }
        Ok(handled)
    }

    fn counted(&self) -> &Counted {
        &self.n
    }
}

/// Reusable frames for one multipart message at a time (as emq-router's
/// I/O thread receives: no allocation per frame for small frames, `more`
/// read from each frame rather than with a `getsockopt`).
#[derive(Default)]
struct Inbox {
    frames: Vec<zmq::Message>,
}

/// What [`Inbox::recv`] got.
enum Got {
    Nothing,
    /// A message of this many frames, identity first, in `Inbox::frames`.
    Frames(usize),
    /// A message of more than [`MAX_FRAMES`] frames, read whole and dropped.
    TooMany,
}

impl Inbox {
    fn recv(&mut self, socket: &zmq::Socket) -> Result<Got, zmq::Error> {
        let mut total = 0usize;
        loop {
            let at = total.min(MAX_FRAMES);
            if at == self.frames.len() {
                self.frames.push(zmq::Message::new());
            }
            let flags = if total == 0 { zmq::DONTWAIT } else { 0 };
            match socket.recv(&mut self.frames[at], flags) {
                Ok(()) => {}
                Err(zmq::Error::EAGAIN | zmq::Error::EINTR) if total == 0 => return Ok(Got::Nothing),
                Err(e) => return Err(e),
            }
            total += 1;
            if !self.frames[at].get_more() {
                break;
            }
        }
        Ok(if total > MAX_FRAMES { Got::TooMany } else { Got::Frames(total) })
    }
}

/// Takes a received frame, leaving an empty one in its slot (no copy, no
/// allocation: ZeroMQ hands the frame's buffer on when it is sent).
fn take(m: &mut zmq::Message) -> zmq::Message {
    std::mem::replace(m, zmq::Message::new())
}

/// [`Wire::Emqp`]: the five messages of an eMQP job, nothing between them.
struct EmqpWire<'a> {
    fe: &'a zmq::Socket,
    be: &'a zmq::Socket,
    inbox: Inbox,
    /// Workers' identities, one per free slot, oldest first.
    credits: VecDeque<zmq::Message>,
    /// REQUESTs accepted while no worker had a slot: frames from the msgid
    /// on (msgid, queue, headers, body, any more).
    waiting: VecDeque<Vec<zmq::Message>>,
    n: Counted,
}

/// Frames of a REQUEST as a ROUTER receives it: identity, empty, version,
/// `REQUEST`, msgid, queue, headers, body.
const REQUEST_FRAMES: usize = 8;
/// A job-result REPLY: identity, empty, version, `REPLY`, msgid, result,
/// the REQUEST's msgid.
const RESULT_FRAMES: usize = 7;

impl<'a> EmqpWire<'a> {
    fn new(fe: &'a zmq::Socket, be: &'a zmq::Socket) -> Self {
        EmqpWire {
            fe,
            be,
            inbox: Inbox::default(),
            credits: VecDeque::new(),
            waiting: VecDeque::new(),
            n: Counted::default(),
        }
    }

    /// A message from a worker: READY, a job-result REPLY, INFORM,
    /// HEARTBEAT or KBYE.
    fn backend(&mut self, len: usize) -> Result<(), zmq::Error> {
        let f = &mut self.inbox.frames[..len];
        match f.get(3).map(|m| &m[..]) {
            Some(b"READY") => {
                self.n.readies += 1;
                let worker = take(&mut f[0]);
                match self.waiting.pop_front() {
                    Some(mut job) => {
                        send_job(self.be, worker, &mut job, false)?;
                        self.n.forwarded += 1;
                    }
                    None => self.credits.push_back(worker),
                }
            }
            Some(b"REPLY") if len >= RESULT_FRAMES => self.n.results += 1,
            Some(b"HEARTBEAT") => {}
            Some(b"INFORM") if len > 4 => {
                self.be.send(take(&mut f[0]), zmq::SNDMORE)?;
                let fresh = new_msgid();
                self.be.send_multipart([&b""[..], VERSION, b"ACK", &fresh, &f[4]], 0)?;
            }
            Some(b"KBYE") => {
                let gone = &f[0][..];
                self.credits.retain(|w| &w[..] != gone);
            }
            _ => self.n.dropped += 1,
        }
        Ok(())
    }

    /// A message from a client: a REQUEST is accepted and sent to the
    /// worker of the oldest free slot, or kept until a READY comes.
    fn frontend(&mut self, len: usize) -> Result<(), zmq::Error> {
        let f = &mut self.inbox.frames[..len];
        if len < REQUEST_FRAMES || &f[3][..] != b"REQUEST" {
            self.n.dropped += 1;
            return Ok(());
        }
        self.n.requests += 1;
        let client = take(&mut f[0]);
        match self.credits.pop_front() {
            Some(worker) => {
                // The job first (its msgid copied), then the acceptance:
                // the job's latency is what the load measures.
                send_job(self.be, worker, &mut f[4..], true)?;
                self.n.forwarded += 1;
                accept(self.fe, client, take(&mut f[4]))?;
            }
            None => {
                accept(self.fe, client, &f[4][..])?;
                self.waiting.push_back(f[4..].iter_mut().map(take).collect());
            }
        }
        self.n.accepted += 1;
        Ok(())
    }
}

impl Step for EmqpWire<'_> {
    fn step(&mut self, timeout_ms: i64) -> Result<usize, zmq::Error> {
        let mut items = [self.be.as_poll_item(zmq::POLLIN), self.fe.as_poll_item(zmq::POLLIN)];
        if poll(&mut items, timeout_ms)? == 0 {
            return Ok(0);
        }
        let mut handled = 0;
        for from_backend in [true, false] {
            loop {
                let socket = if from_backend { self.be } else { self.fe };
                match self.inbox.recv(socket)? {
                    Got::Nothing => break,
                    Got::TooMany => self.n.dropped += 1,
                    Got::Frames(len) if from_backend => self.backend(len)?,
                    Got::Frames(len) => self.frontend(len)?,
                }
                handled += 1;
            }
        }
        Ok(handled)
    }

    fn counted(&self) -> &Counted {
        &self.n
    }
}

/// The acceptance REPLY: `["", version, REPLY, fresh msgid, the REQUEST's
/// msgid]` to `client`, the msgid formatted on the stack as emq-router does.
fn accept(fe: &zmq::Socket, client: zmq::Message, msgid: impl zmq::Sendable) -> Result<(), zmq::Error> {
    let mut buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
    let fresh = uuid::Uuid::new_v4().hyphenated().encode_lower(&mut buf);
    fe.send(client, zmq::SNDMORE)?;
    fe.send(&b""[..], zmq::SNDMORE)?;
    fe.send(VERSION, zmq::SNDMORE)?;
    fe.send(&b"REPLY"[..], zmq::SNDMORE)?;
    fe.send(fresh.as_bytes(), zmq::SNDMORE)?;
    fe.send(msgid, 0)
}

/// The job to `worker`: `["", version, REQUEST, msgid, queue, headers with
/// reply-requested, body, any more]`, from `job` = `[msgid, queue, headers,
/// body, …]`, whose frames are handed over, the msgid copied when
/// `copy_msgid` (the acceptance still needs it). A job of fewer frames is
/// never made ([`REQUEST_FRAMES`]); it would be sent nothing.
fn send_job(
    be: &zmq::Socket,
    worker: zmq::Message,
    job: &mut [zmq::Message],
    copy_msgid: bool,
) -> Result<(), zmq::Error> {
    let [msgid, queue, hdrs, body, extra @ ..] = job else { return Ok(()) };
    be.send(worker, zmq::SNDMORE)?;
    be.send(&b""[..], zmq::SNDMORE)?;
    be.send(VERSION, zmq::SNDMORE)?;
    be.send(&b"REQUEST"[..], zmq::SNDMORE)?;
    if copy_msgid {
        be.send(&msgid[..], zmq::SNDMORE)?;
    } else {
        be.send(take(msgid), zmq::SNDMORE)?;
    }
    be.send(take(queue), zmq::SNDMORE)?;
    if hdrs.is_empty() {
        be.send(REPLY_REQUESTED, zmq::SNDMORE)?;
    } else if headers::has(hdrs, REPLY_REQUESTED) {
        be.send(take(hdrs), zmq::SNDMORE)?;
    } else {
        be.send(headers::with_reply_requested(hdrs), zmq::SNDMORE)?;
    }
    be.send(take(body), if extra.is_empty() { 0 } else { zmq::SNDMORE })?;
    let last = extra.len().saturating_sub(1);
    for (i, frame) in extra.iter_mut().enumerate() {
        be.send(take(frame), if i < last { zmq::SNDMORE } else { 0 })?;
    }
    Ok(())
}
