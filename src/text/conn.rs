//! One text connection: a blocking thread that reads, decodes, runs the
//! commands in order and writes the answers (text-protocol.md).

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use super::backend::Pending;
use super::stats::TextStats;
use super::Shared;
use crate::broker::msg::{TextAnswer, TextCmd, TextOutcome};
use crate::ids::{ConnId, OfferId, QueueName};
use crate::limits::{self, TEXT_OUT_FLUSH_BYTES as OUT_FLUSH_BYTES};
use crate::protocol::text::{encode_err, encode_nope, encode_want, ErrorCode, LineDecoder, TextCommand};

/// Whether the connection goes on after a command.
enum Flow {
    Continue,
    Close,
}

struct Connection<'a> {
    id: ConnId,
    shared: &'a Shared,
    stream: TcpStream,
    decoder: LineDecoder,
    out: Vec<u8>,
    /// The offer held, with its deadline.
    offer: Option<(OfferId, Instant)>,
    /// When the last bytes arrived (the partial-line idle timer's start).
    last_read: Instant,
    /// The socket's read timeout as last set (saves a syscall per read).
    read_timeout: Option<Duration>,
    /// SCHEDs and answers (ACK, DCL, DEL) handed to the shards whose
    /// outcomes are not yet known, in order. They are settled before any
    /// other command runs and before the connection waits for input: these
    /// commands have no reply of their own, so pipelined ones share one wait
    /// (with durability "sync", one sync) instead of one each, and an `ERR`
    /// for a refused one still comes out in command order.
    pending: std::collections::VecDeque<Pending>,
}

/// Serves `stream` until END, EOF, an I/O error, the idle timeout or
/// shutdown; then returns a held offer to the front of its queue and
/// unregisters the connection.
pub(super) fn serve(shared: &Shared, id: ConnId, stream: TcpStream) {
    let mut conn = Connection {
        id,
        shared,
        stream,
        decoder: LineDecoder::new(shared.config.max_line_bytes),
        out: Vec::with_capacity(OUT_FLUSH_BYTES),
        offer: None,
        last_read: Instant::now(),
        read_timeout: None,
        pending: std::collections::VecDeque::new(),
    };
    if let Err(e) = conn.run() {
        tracing::debug!(conn = %id, error = %e, "text connection ended by error");
    }
    if let Some((offer, _)) = conn.offer.take() {
        TextStats::dec(&shared.stats.offers_held);
        shared.backend.release(id, offer);
    }
    let _ = conn.stream.shutdown(Shutdown::Both);
    shared.streams.lock().remove(&id);
    TextStats::dec(&shared.stats.connections_open);
    tracing::debug!(conn = %id, "text connection closed");
}

impl Connection<'_> {
    fn run(&mut self) -> io::Result<()> {
        self.stream.set_write_timeout(Some(self.shared.config.idle_timeout.max(Duration::from_millis(1))))?;
        let mut buf = vec![0u8; limits::TEXT_READ_BUF_BYTES];
        loop {
            let flow = self.process()?;
            self.flush()?;
            if let Flow::Close = flow {
                return Ok(());
            }
            match self.read_some(&mut buf)? {
                Some(n) => self.decoder.feed(&buf[..n]),
                None => return Ok(()),
            }
        }
    }

    /// Runs every decoded command, appending answers to `self.out`.
    fn process(&mut self) -> io::Result<Flow> {
        while let Some(item) = self.decoder.next() {
            let no_reply =
                matches!(item, Ok(TextCommand::Sched { .. } | TextCommand::Ack | TextCommand::Dcl | TextCommand::Del));
            if !no_reply || self.pending.len() >= limits::TEXT_PENDING_SCHEDS {
                self.settle();
            }
            let flow = match item {
                Ok(command) => self.handle(command),
                Err(e) => {
                    self.err(e.code(), &e.to_string());
                    Flow::Continue
                }
            };
            if let Flow::Close = flow {
                return Ok(Flow::Close);
            }
            if self.out.len() >= OUT_FLUSH_BYTES {
                self.flush()?;
            }
        }
        self.settle();
        Ok(Flow::Continue)
    }

    /// Waits for the outcomes of the commands handed over, in order,
    /// writing an `ERR` for each refused one.
    fn settle(&mut self) {
        while let Some(p) = self.pending.pop_front() {
            match p.wait() {
                TextOutcome::Done => {}
                other => self.unexpected(other),
            }
        }
    }

    fn handle(&mut self, command: TextCommand) -> Flow {
        match command {
            TextCommand::Sched { data, queue } => self.handle_sched(QueueName::from(queue.into_bytes()), data),
            TextCommand::Ask { queue } => self.handle_ask(QueueName::from(queue.into_bytes())),
            TextCommand::Ack => self.handle_answer(TextAnswer::Ack),
            TextCommand::Dcl => self.handle_answer(TextAnswer::Dcl),
            TextCommand::Del => self.handle_answer(TextAnswer::Del),
            TextCommand::End => return Flow::Close,
        }
        Flow::Continue
    }

    fn handle_sched(&mut self, queue: QueueName, data: Vec<u8>) {
        let pending = self.shared.backend.submit(self.id, TextCmd::Sched { queue, data });
        self.pending.push_back(pending);
    }

    fn handle_ask(&mut self, queue: QueueName) {
        self.expire_offer(Instant::now());
        if self.offer.is_some() {
            return self.err(ErrorCode::Pending, ErrorCode::Pending.default_text());
        }
        match self.shared.backend.call(self.id, TextCmd::Ask { queue }) {
            TextOutcome::Offer { id, data, deadline } => {
                if encode_want(&mut self.out, &data) {
                    TextStats::inc(&self.shared.stats.offers_rewritten);
                }
                TextStats::inc(&self.shared.stats.offers_held);
                self.offer = Some((id, deadline));
            }
            TextOutcome::Nope => encode_nope(&mut self.out),
            other => self.unexpected(other),
        }
    }

    fn handle_answer(&mut self, answer: TextAnswer) {
        self.expire_offer(Instant::now());
        let Some((offer, _)) = self.offer.take() else {
            return self.err(ErrorCode::NoTask, ErrorCode::NoTask.default_text());
        };
        TextStats::dec(&self.shared.stats.offers_held);
        // Like a SCHED, an answer has no reply of its own: its outcome is
        // settled with the pending SCHEDs.
        let pending = self.shared.backend.submit(self.id, TextCmd::Answer { offer, answer });
        self.pending.push_back(pending);
    }

    /// Writes a refusal; any other outcome where it does not belong breaks
    /// the contract and is reported as the broker shutting down.
    fn unexpected(&mut self, outcome: TextOutcome) {
        let code = match outcome {
            TextOutcome::Refused(code) => code,
            other => {
                tracing::error!(conn = %self.id, ?other, "text backend answered out of contract");
                ErrorCode::ShuttingDown
            }
        };
        self.err(code, code.default_text());
    }

    /// Forgets the held offer once its deadline has passed (the backend has
    /// taken it back, or will).
    fn expire_offer(&mut self, now: Instant) {
        if self.offer.is_some_and(|(_, deadline)| deadline <= now) {
            self.offer = None;
            TextStats::dec(&self.shared.stats.offers_held);
        }
    }

    fn err(&mut self, code: ErrorCode, text: &str) {
        self.shared.stats.count_error(code);
        encode_err(&mut self.out, code, text);
    }

    fn flush(&mut self) -> io::Result<()> {
        if !self.out.is_empty() {
            self.stream.write_all(&self.out)?;
            self.out.clear();
        }
        Ok(())
    }

    /// Reads the next bytes. `None`: close the connection (EOF, shutdown, or
    /// a partial line idle for the idle timeout).
    fn read_some(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        loop {
            if self.shared.stopping.load(Relaxed) {
                return Ok(None);
            }
            let now = Instant::now();
            self.set_read_timeout(now)?;
            match self.stream.read(buf) {
                Ok(0) => return Ok(None),
                Ok(n) => {
                    self.last_read = Instant::now();
                    return Ok(Some(n));
                }
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    let now = Instant::now();
                    self.expire_offer(now);
                    if self.idle_deadline().is_some_and(|d| d <= now) {
                        TextStats::inc(&self.shared.stats.idle_closed);
                        tracing::debug!(conn = %self.id, "partial line idle too long; closing");
                        return Ok(None);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn idle_deadline(&self) -> Option<Instant> {
        self.decoder.has_partial_line().then(|| self.last_read + self.shared.config.idle_timeout)
    }

    /// Blocks reads until the nearest of the idle deadline and the offer
    /// deadline, or indefinitely when neither applies.
    fn set_read_timeout(&mut self, now: Instant) -> io::Result<()> {
        let deadline = match (self.idle_deadline(), self.offer.map(|(_, deadline)| deadline)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let timeout = deadline.map(|d| d.saturating_duration_since(now).max(Duration::from_millis(1)));
        if timeout != self.read_timeout {
            self.stream.set_read_timeout(timeout)?;
            self.read_timeout = timeout;
        }
        Ok(())
    }
}
