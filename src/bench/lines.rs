//! The load driver shared by the line-based job protocols ([`super::text`],
//! [`super::beanstalk`]): P producer connections submit jobs as the pacer
//! allows, C consumer connections loop ask → task → acknowledge, backing
//! off after an empty answer (200 µs doubling to 10 ms). Latency is the send
//! time carried in the job body → the consumer reading the body. A
//! [`Dialect`] supplies the protocol's words.
//!
//! # Several owners
//!
//! `addr` may name several brokers (router names, docs/scaleout.md): `;`
//! between owners, as [`crate::config::addr::text_owners`] splits them
//! (the first address of each owner is used; the bench follows no
//! standby). Producer i sends all its jobs to owner i mod N: per
//! connection, not per job, so each producer keeps one connection and its
//! pacing, and the owners get equal shares when `--clients` is a multiple
//! of N (at least N is required, or an owner would get no load). Each
//! consumer opens one connection per owner and asks there only: `--workers`
//! consumers per owner, so every owner is served whatever the producers'
//! split, no consumer parks a long poll on an empty owner while another
//! has jobs, and each owner sees the consumers it would see alone (the
//! scale-out figure measures the owners, not a consumer pool split N
//! ways). One owner is the single-broker run, unchanged.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};

use super::body::{self, Clock, Pacer, Tally};
use super::link::{self, LinkRead, LinkWrite};
use super::{ioerr, BenchError, LoadSettings};
use crate::client::text::TextClientOptions;
use crate::config::addr;
use crate::limits;

/// `(seq, receipt ns)`: a consumer telling a producer its job arrived.
type Receipt = (u64, u64);

const EMPTY_BACKOFF_MIN: Duration = Duration::from_micros(200);
const EMPTY_BACKOFF_MAX: Duration = Duration::from_millis(10);

/// What a consumer makes of one complete line it read (LF and a CR before
/// it removed).
#[derive(Debug, PartialEq, Eq)]
pub enum Reply<'a> {
    /// The answer to the ask is a job with this body; `ack` are the bytes
    /// that acknowledge it.
    Task {
        /// The job body.
        body: &'a [u8],
        /// The acknowledgement to send (with its line ending).
        ack: Vec<u8>,
    },
    /// The answer to the ask is a job whose body of `bytes` bytes is the
    /// next line; `ack` acknowledges it.
    TaskNext {
        /// Length of the body line (without its line ending).
        bytes: usize,
        /// The acknowledgement to send (with its line ending).
        ack: Vec<u8>,
    },
    /// The answer to the ask: nothing to take now.
    Empty,
    /// A reply to something other than the ask (`true`: it reports a failure).
    Other(bool),
    /// An error answering the ask.
    Error,
}

/// The words of one line-based job protocol, as the shared driver speaks
/// them. All byte strings include their line endings.
pub trait Dialect: Sync {
    /// Appends the command(s) submitting `body` to `queue`; `selected` is
    /// the queue this connection last selected (for protocols that select a
    /// queue per connection), updated by the call.
    fn put(&self, out: &mut Vec<u8>, body: &[u8], queue: &str, selected: &mut String);
    /// Whether a line a producer reads reports a failure.
    fn producer_error(&self, line: &[u8]) -> bool;
    /// Sent once by a consumer of `queue` after connecting.
    fn consumer_hello(&self, queue: &str) -> Vec<u8>;
    /// Asks for one job of `queue`, waiting up to `wait` for one to arrive
    /// (long poll) when given.
    fn ask(&self, queue: &str, wait: Option<Duration>) -> Vec<u8>;
    /// Classifies a complete line a consumer reads.
    fn reply<'a>(&self, line: &'a [u8]) -> Reply<'a>;
    /// Sent by producers and consumers before they close.
    fn bye(&self) -> &'static [u8];
    /// Pipelined submission ([`super::pipeline`]): a line sent after each
    /// batch whose reply comes after the replies of every put before it,
    /// for protocols whose puts have no success reply; `None` when every
    /// put is answered itself.
    fn barrier(&self) -> Option<&'static [u8]> {
        None
    }
    /// Whether a reply line is the [`Dialect::barrier`]'s.
    fn is_barrier_reply(&self, _line: &[u8]) -> bool {
        false
    }
}

/// What every connection thread of one run shares.
struct Ctx {
    settings: LoadSettings,
    queues: Vec<String>,
    clock: Clock,
    dialect: &'static dyn Dialect,
    stop: AtomicBool,
}

/// Runs one load of `dialect` against `addr` (`HOST:PORT`), every
/// connection opened with `link` (TLS, a token; [`link::open`]);
/// `progress` counts measured jobs received.
///
/// # Errors
/// [`BenchError::TargetDown`] when a connection fails or no job at all
/// reaches a consumer; [`BenchError::Io`] for socket failures.
pub fn run(
    addr: &str,
    settings: &LoadSettings,
    progress: Arc<AtomicU64>,
    dialect: &'static dyn Dialect,
    link: &TextClientOptions,
) -> Result<Tally, BenchError> {
    let owners = resolve_owners(addr, settings.clients.max(1))?;
    let queues = settings.queue_list().into_iter().map(|(_, q)| q).collect();
    let ctx = Arc::new(Ctx { settings: settings.clone(), queues, clock: Clock::start(), dialect, stop: false.into() });
    let (txs, rxs): (Vec<Sender<Receipt>>, Vec<Receiver<Receipt>>) =
        (0..settings.clients.max(1)).map(|_| crossbeam_channel::unbounded()).unzip();
    let mut consumers = Vec::new();
    for i in 0..settings.workers.max(1) {
        for &owner in &owners {
            let stream = link::open(owner, settings.probe_timeout, link)?;
            let (txs, ctx) = (txs.clone(), ctx.clone());
            consumers.push(std::thread::spawn(move || consume(stream, i, &ctx, &txs)));
        }
    }
    let mut producers = Vec::new();
    for (i, rx) in rxs.into_iter().enumerate() {
        let stream = link::open(owners[i % owners.len()], settings.probe_timeout, link)?;
        let (ctx, p) = (ctx.clone(), progress.clone());
        producers.push(std::thread::spawn(move || produce(stream, i, &ctx, &rx, &p)));
    }
    let mut total = Tally::new(settings.warmup.as_nanos() as u64);
    let mut first_err = None;
    for p in producers {
        match p.join() {
            Ok(Ok(t)) => total.merge(&t),
            Ok(Err(e)) => first_err = first_err.or(Some(e)),
            Err(_) => first_err = first_err.or(Some(BenchError::Invalid("producer thread panicked".into()))),
        }
    }
    ctx.stop.store(true, Ordering::Release);
    for c in consumers {
        total.errors += c.join().unwrap_or(1);
    }
    match first_err {
        Some(e) => Err(e),
        None if total.received_all == 0 => Err(BenchError::TargetDown(format!("no job reached a consumer via {addr}"))),
        None => Ok(total),
    }
}

/// The first address of each owner in `addr` (`HOST:PORT`, or owners
/// separated by `;`, one owner's addresses by `,`: the first is used);
/// `producers` must be at least the number of owners.
///
/// # Errors
/// [`BenchError::Invalid`] for a list that does not parse, more than
/// [`limits::TEXT_MAX_OWNERS`] owners, or fewer producers than owners; as
/// [`resolve`] for each owner.
pub(super) fn resolve_owners(addr: &str, producers: usize) -> Result<Vec<SocketAddr>, BenchError> {
    let owners = addr::text_owners(addr).map_err(|e| BenchError::Invalid(e.to_string()))?;
    if owners.len() > limits::TEXT_MAX_OWNERS {
        return Err(BenchError::Invalid(format!("{addr}: more than {} owners", limits::TEXT_MAX_OWNERS)));
    }
    if producers < owners.len() {
        let n = owners.len();
        return Err(BenchError::Invalid(format!(
            "{n} owners need --clients of at least {n} (producer i goes to owner i mod {n})"
        )));
    }
    owners.iter().map(|o| resolve(o.first().map_or("", String::as_str))).collect()
}

/// The first address of `addr` (`HOST:PORT`).
///
/// # Errors
/// [`BenchError::Io`] or [`BenchError::Invalid`] when it does not resolve.
pub(super) fn resolve(addr: &str) -> Result<SocketAddr, BenchError> {
    addr.to_socket_addrs()
        .map_err(ioerr(format!("resolve {addr}")))?
        .next()
        .ok_or_else(|| BenchError::Invalid(format!("{addr}: no address")))
}

/// One producer: jobs as the pacer allows; receipts come from the
/// consumers over `rx` as `(seq, receipt ns)`.
fn produce(
    (r, mut stream): (LinkRead, LinkWrite),
    index: usize,
    ctx: &Ctx,
    rx: &Receiver<Receipt>,
    progress: &AtomicU64,
) -> Result<Tally, BenchError> {
    let (s, clock) = (&ctx.settings, ctx.clock);
    let errors = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let (e, d, f) = (errors.clone(), ctx.dialect, done.clone());
        std::thread::spawn(move || read_error_lines(r, d, &e, &f))
    };
    // Why the server ended this connection, from what it said last.
    let closed = |reader: std::thread::JoinHandle<Option<String>>, done: &AtomicBool| {
        done.store(true, Ordering::Release);
        let said = reader.join().ok().flatten().map(|l| format!(" after `{l}`")).unwrap_or_default();
        BenchError::TargetDown(format!("the server closed a producer's connection{said}"))
    };
    let mut pacer = Pacer::new(s, index);
    let mut tally = Tally::new(s.warmup.as_nanos() as u64);
    let mut drain_end: Option<u64> = None;
    let (mut out, mut selected) = (Vec::new(), String::new());
    let started = clock.now_ns();
    loop {
        let now = clock.now_ns();
        while let Some(t) = pacer.next_send(clock.now_ns(), tally.outstanding()) {
            let seq = tally.on_send(t);
            let queue = &ctx.queues[seq as usize % ctx.queues.len()];
            ctx.dialect.put(&mut out, &body::encode(index, seq, t, s.size), queue, &mut selected);
        }
        if reader.is_finished() || (!out.is_empty() && stream.write_all(&out).is_err()) {
            return Err(closed(reader, &done));
        }
        out.clear();
        if pacer.finished(now) {
            let end = *drain_end.get_or_insert(now + s.drain_timeout.as_nanos() as u64);
            if tally.outstanding() == 0 || now >= end {
                break;
            }
        }
        // No sign of life: nothing of this producer's reached a consumer
        // within the probe timeout of its first send.
        if tally.received_all == 0 && tally.outstanding() > 0 && now - started > s.probe_timeout.as_nanos() as u64 {
            done.store(true, Ordering::Release);
            let t = humantime::format_duration(s.probe_timeout);
            return Err(BenchError::TargetDown(format!("no job reached a consumer within {t} (--probe-timeout)")));
        }
        if let Ok((seq, ns)) = rx.recv_timeout(pacer.wait(now, Duration::from_millis(10))) {
            tally.on_receipt(seq, ns);
        }
        let before = tally.received;
        rx.try_iter().for_each(|(seq, ns)| tally.on_receipt(seq, ns));
        progress.fetch_add(tally.received - before, Ordering::Relaxed);
    }
    let _ = stream.write_all(ctx.dialect.bye());
    stream.shutdown();
    done.store(true, Ordering::Release);
    let _ = reader.join();
    tally.errors += errors.load(Ordering::Relaxed);
    Ok(tally)
}

/// Longest error line kept to name in an error, in bytes.
const SAID_BYTES: usize = 200;

/// Counts the lines a producer reads that report a failure, until EOF
/// (or 30 s after `done`); returns the first such line (cut at
/// [`SAID_BYTES`]).
fn read_error_lines(stream: LinkRead, dialect: &dyn Dialect, errors: &AtomicU64, done: &AtomicBool) -> Option<String> {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    let (mut r, mut line, mut first, mut waited) = (BufReader::new(stream), Vec::new(), None, 0);
    loop {
        match r.read_until(b'\n', &mut line) {
            Ok(0) => return first,
            Ok(_) => {
                let l = strip_cr(line.strip_suffix(b"\n").unwrap_or(&line));
                if dialect.producer_error(l) {
                    errors.fetch_add(1, Ordering::Relaxed);
                    first.get_or_insert_with(|| String::from_utf8_lossy(&l[..l.len().min(SAID_BYTES)]).into_owned());
                }
                line.clear();
            }
            // A read timeout keeps the part of a line read so far.
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                waited += u32::from(done.load(Ordering::Acquire));
                if waited >= 30 {
                    return first;
                }
            }
            Err(_) => return first,
        }
    }
}

fn strip_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// One consumer connection's state.
struct Consumer<'a> {
    ctx: &'a Ctx,
    producers: &'a [Sender<Receipt>],
    w: LinkWrite,
    ask: Vec<u8>,
    /// An ask is sent and not yet answered.
    asked: bool,
    /// The answer announced a body line of this length, to be acknowledged so.
    pending: Option<(usize, Vec<u8>)>,
    backoff: Duration,
    errors: u64,
}

impl Consumer<'_> {
    /// Handles one complete line (line ending removed).
    fn on_line(&mut self, line: &[u8]) -> std::io::Result<()> {
        if let Some((bytes, ack)) = self.pending.take() {
            self.errors += u64::from(line.len() != bytes);
            return self.on_task(line, ack);
        }
        match self.ctx.dialect.reply(line) {
            Reply::Task { body, ack } => return self.on_task(body, ack),
            Reply::TaskNext { bytes, ack } => self.pending = Some((bytes, ack)),
            Reply::Empty => {
                self.asked = false;
                // A long poll already waited on the broker's side.
                if self.ctx.settings.ask_wait.is_none() {
                    std::thread::sleep(self.backoff);
                    self.backoff = (self.backoff * 2).min(EMPTY_BACKOFF_MAX);
                }
            }
            Reply::Other(failed) => self.errors += u64::from(failed),
            Reply::Error => {
                self.asked = false;
                self.errors += 1;
            }
        }
        Ok(())
    }

    /// A job arrived: tell its producer, acknowledge it and ask again (one write).
    fn on_task(&mut self, body: &[u8], mut ack: Vec<u8>) -> std::io::Result<()> {
        let now = self.ctx.clock.now_ns();
        self.asked = false;
        if let Some((c, seq, _)) = body::decode(body) {
            if let Some(tx) = self.producers.get(c) {
                let _ = tx.send((seq, now));
            }
        }
        self.backoff = EMPTY_BACKOFF_MIN;
        if !self.ctx.stop.load(Ordering::Acquire) {
            ack.extend_from_slice(&self.ask);
            self.asked = true;
        }
        self.w.write_all(&ack)
    }
}

/// One consumer: ask/acknowledge until the stop; returns the failures it saw.
fn consume((stream, w): (LinkRead, LinkWrite), index: usize, ctx: &Ctx, producers: &[Sender<Receipt>]) -> u64 {
    let queue = &ctx.queues[index % ctx.queues.len()];
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    let ask = ctx.dialect.ask(queue, ctx.settings.ask_wait);
    let mut c = Consumer { ctx, producers, w, ask, asked: false, pending: None, backoff: EMPTY_BACKOFF_MIN, errors: 0 };
    if c.w.write_all(&ctx.dialect.consumer_hello(queue)).is_err() {
        return 1;
    }
    let mut r = BufReader::new(stream);
    let mut line = Vec::new();
    let mut stalled = 0u32;
    while !ctx.stop.load(Ordering::Acquire) || c.asked {
        if !c.asked {
            if c.w.write_all(&c.ask).is_err() {
                return c.errors + 1;
            }
            c.asked = true;
        }
        match r.read_until(b'\n', &mut line) {
            Ok(0) => return c.errors + 1,
            Ok(_) if line.ends_with(b"\n") => {}
            Ok(_) => continue,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                // After the stop, an unanswered ask is given up after ~2 s.
                stalled += u32::from(ctx.stop.load(Ordering::Acquire));
                if stalled > 10 {
                    break;
                }
                continue;
            }
            Err(_) => return c.errors + 1,
        }
        if c.on_line(strip_cr(&line[..line.len() - 1])).is_err() {
            return c.errors + 1;
        }
        line.clear();
    }
    let _ = c.w.write_all(ctx.dialect.bye());
    c.errors
}
