//! One text connection as a small struct an I/O thread owns among
//! thousands: its buffers, its held offer and the commands it sent to the
//! shards that are not answered yet (text-protocol.md).
//!
//! # Order of replies
//!
//! Every command gets a place in `pending`, in the order it was read.
//! Commands the connection decides itself (a parse error, `PENDING`,
//! `NO_TASK`) are ready at once; the others wait for their shard's answer.
//! A shard answers one connection's commands in the order they reached it,
//! so an answer from shard S belongs to the oldest unanswered command sent
//! to S. Replies are written from the front of `pending` as soon as
//! everything before them is known: the order of the replies is the order
//! of the commands, whichever shards answered first.
//!
//! # What waits
//!
//! SCHED goes out without waiting, except behind a long-poll ASK still
//! waiting on its shard: the shard would answer the SCHED first, and the
//! order-based matching above would hand the SCHED's outcome to the ASK and
//! the ASK's (perhaps an offer) to the SCHED. ASK, ACK, DCL, DEL and END
//! depend on whether the connection holds an offer, so while an ASK is
//! unanswered the next one of them is held back. A command held back waits
//! with everything after it unread (so nothing overtakes it). At most one
//! ASK per connection is thus ever unanswered.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::time::{Duration, Instant};

use mio::net::TcpStream;

use super::stats::TextStats;
use super::tls_link::TlsLink;
use super::Round;
use crate::broker::text_port::{TextAnswer, TextCmd, TextOutcome};
use crate::ids::{ConnId, OfferId, QueueName};
use crate::limits::{TEXT_KEEP_BUFFER_BYTES, TEXT_MAX_PENDING_COMMANDS, TEXT_OUT_PAUSE_BYTES};
use crate::protocol::text::{encode_err, encode_nope, encode_want, ErrorCode, LineDecoder, TextCommand, TextError};

/// What a command sent to a shard is, to read its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Sched,
    Ask,
    Answer,
}

/// A command's place in the order of replies.
#[derive(Debug)]
enum Slot {
    /// Sent to `shard`, not answered yet.
    Sent { shard: usize, kind: Kind },
    /// Answered: the bytes to write (maybe none) once every earlier slot is.
    Ready(Vec<u8>),
}

/// Why a connection is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Close {
    /// END or the end of input, every reply written.
    Done,
    /// A line was not complete within `text_line_timeout` of its first byte.
    LineTimeout,
    /// More than `text_max_unsent_bytes` of replies it did not read.
    SlowReader,
    /// A read or write failed (or the TLS stream was not valid TLS).
    Broken,
    /// The TLS handshake did not finish within `text_tls_handshake_timeout`.
    HandshakeTimeout,
}

/// One text connection.
#[derive(Debug)]
pub(super) struct Conn {
    /// Its id (unique for the router's life; the low bits are its slot in
    /// the I/O thread's table).
    pub id: ConnId,
    /// The socket (its only descriptor).
    pub stream: TcpStream,
    /// Its TLS state, on the `text_tls` listener.
    pub tls: Option<Box<TlsLink>>,
    decoder: LineDecoder,
    /// Bytes read and not decoded yet: kept only while the connection
    /// waits (for an ASK's answer, or for its replies to be taken).
    unread: Vec<u8>,
    /// A command that waits for the answer to an earlier ASK.
    held: Option<TextCommand>,
    /// Replies not written yet.
    out: Vec<u8>,
    /// The offer held, with its deadline.
    offer: Option<(OfferId, Instant)>,
    /// Every command whose reply is not written yet, in order.
    pending: VecDeque<Slot>,
    /// The shard of the unanswered ASK, and whether it is a long poll.
    asking: Option<(usize, bool)>,
    /// When the line being received must be complete.
    line_deadline: Option<Instant>,
    /// The deadline this connection's timer is armed for.
    pub timer_at: Option<Instant>,
    /// The socket may have more to read (readiness is edge-triggered).
    pub readable: bool,
    /// The peer sent all it will send (read returned 0).
    eof: bool,
    /// The peer closed its sending side (the readiness event said so),
    /// perhaps before what it sent is all read.
    peer_closed: bool,
    /// END was read: close once every reply is written.
    ending: bool,
    /// On the I/O thread's list of connections to serve this turn.
    pub queued: bool,
    /// On the I/O thread's list of connections waiting for the input
    /// budget (see [`super::Shared::charge`]).
    pub paused: bool,
    /// Bytes of input counted for it in the input budget (what
    /// [`Conn::input_bytes`] was when last counted).
    pub charged: usize,
    /// It holds the lead of the input budget: it is read through the end
    /// of its line whatever the total.
    pub lead: bool,
    /// It must send `AUTH <token>` before anything else
    /// (`text_auth_tokens_file`), and has not yet.
    needs_auth: bool,
}

impl Conn {
    /// A new connection with lines of at most `max_line_bytes`, over TLS
    /// when `tls` is given, which must authenticate first when
    /// `needs_auth`.
    pub fn new(
        id: ConnId,
        stream: TcpStream,
        tls: Option<Box<TlsLink>>,
        max_line_bytes: usize,
        needs_auth: bool,
    ) -> Conn {
        Conn {
            id,
            stream,
            tls,
            needs_auth,
            decoder: LineDecoder::new(max_line_bytes),
            unread: Vec::new(),
            held: None,
            out: Vec::new(),
            offer: None,
            pending: VecDeque::new(),
            asking: None,
            line_deadline: None,
            timer_at: None,
            readable: true,
            eof: false,
            peer_closed: false,
            ending: false,
            queued: false,
            paused: false,
            charged: 0,
            lead: false,
        }
    }

    /// Bytes of input held that have not run yet: the partial line, the
    /// bytes read but not decoded and a command held back behind an ASK
    /// (its data and queue name). At most `max_line_bytes + 1` plus one
    /// read.
    pub fn input_bytes(&self) -> usize {
        let held = match &self.held {
            Some(TextCommand::Sched { data, queue }) => data.len() + queue.len(),
            Some(TextCommand::Ask { queue } | TextCommand::AskWait { queue, .. }) => queue.len(),
            _ => 0,
        };
        let tls = self.tls.as_ref().map_or(0, |t| t.held());
        self.decoder.buffered_bytes() + self.unread.len() + held + tls
    }

    /// Whether an ASK of it is unanswered: a line read now might be held
    /// back behind it (until the answer, which serves the connection again).
    pub fn awaits_answer(&self) -> bool {
        self.asking.is_some()
    }

    /// Whether the rest of an over-long line is being dropped: reading up
    /// to its LF adds nothing to what the connection holds.
    pub fn discarding(&self) -> bool {
        self.decoder.discarding()
    }

    /// The first bytes of a line are in the socket but wait unread for the
    /// input budget: the line's time runs from now unless it already runs
    /// (text-protocol.md "Limits"), so a waiting connection is closed by
    /// the line timeout if its line does not get through.
    pub fn line_seen(&mut self, now: Instant, line_timeout: Duration) {
        if self.line_deadline.is_none() && !self.eof {
            self.line_deadline = Some(now + line_timeout);
        }
    }

    /// Whether to read more from the socket now: nothing waits undecoded,
    /// and the connection is not held back by its own replies.
    pub fn wants_input(&self) -> bool {
        self.unread.is_empty() && self.can_take() && !self.eof
    }

    /// Whether the next command may be taken.
    fn can_take(&self) -> bool {
        self.held.is_none()
            && !self.ending
            && self.pending.len() < TEXT_MAX_PENDING_COMMANDS
            && self.out.len() < TEXT_OUT_PAUSE_BYTES
    }

    /// Whether there is anything to write (replies, or TLS records).
    pub fn has_output(&self) -> bool {
        !self.out.is_empty() || self.tls.as_ref().is_some_and(|t| t.wants_write())
    }

    /// Unsent reply bytes.
    pub fn unsent(&self) -> usize {
        self.out.len()
    }

    /// Whether the connection is over: END or end of input, every command
    /// answered and every reply written.
    pub fn finished(&self) -> bool {
        let input_done = self.ending || (self.eof && self.unread.is_empty() && self.held.is_none());
        input_done && self.pending.is_empty() && !self.has_output()
    }

    /// Decodes and runs `bytes` just read (only when [`Conn::wants_input`]).
    pub fn input(&mut self, bytes: &[u8], r: &mut Round) {
        let used = self.decode(bytes, r);
        if used < bytes.len() && !self.ending {
            self.unread.extend_from_slice(&bytes[used..]);
        }
    }

    /// The peer closed its sending side: what was read is still answered. A
    /// long poll stops waiting (it is answered `NOPE` at once).
    pub fn input_ended(&mut self, r: &mut Round) {
        self.eof = true;
        self.line_deadline = None;
        self.stop_waiting(r);
    }

    /// The readiness event says the peer closed its sending side, which
    /// may lie behind commands not read yet (they wait unread behind a
    /// long poll): at the next [`Conn::resume`] the long poll stops
    /// waiting, and later ones do not wait (README "The text protocol").
    pub fn note_peer_closed(&mut self) {
        self.peer_closed = true;
    }

    /// Whether the readiness event said the peer closed its sending side.
    pub fn peer_closed(&self) -> bool {
        self.peer_closed
    }

    /// Cancels a waiting long poll, once: its shard answers it `NOPE`
    /// before anything sent after the cancel.
    fn stop_waiting(&mut self, r: &mut Round) {
        if let Some((shard, true)) = self.asking {
            self.asking = Some((shard, false));
            r.send(shard, self.id, TextCmd::Cancel);
        }
    }

    /// Goes on with what was held back or left undecoded, once the reason
    /// to wait may be gone (an answer arrived, replies were written).
    pub fn resume(&mut self, r: &mut Round) {
        if self.peer_closed {
            self.stop_waiting(r);
        }
        if let Some(command) = self.held.take() {
            self.command(command, r);
        }
        if self.unread.is_empty() || !self.can_take() {
            return;
        }
        let bytes = std::mem::take(&mut self.unread);
        let used = self.decode(&bytes, r);
        if !self.ending && used < bytes.len() {
            self.unread = bytes;
            self.unread.drain(..used);
        }
    }

    /// Feeds the decoder one line at a time while commands may be taken;
    /// returns the bytes used. Only the current partial line is ever kept
    /// by the decoder, so a connection buffers at most one line plus one
    /// read.
    fn decode(&mut self, bytes: &[u8], r: &mut Round) -> usize {
        let mut used = 0;
        while used < bytes.len() && self.can_take() {
            let rest = &bytes[used..];
            let (n, complete) = match memchr::memchr(b'\n', rest) {
                Some(lf) => (lf + 1, true),
                None => (rest.len(), false),
            };
            self.decoder.feed(&rest[..n]);
            used += n;
            // A line's time runs from its first byte (text-protocol.md
            // "Limits on connections"), not from its last.
            self.line_deadline = match (complete, self.line_deadline) {
                (true, _) => None,
                (false, Some(deadline)) => Some(deadline),
                (false, None) => Some(r.now + r.config().line_timeout),
            };
            // One line (or one over-long part) yields at most one result.
            if let Some(item) = self.decoder.next() {
                self.handle(item, r);
            }
        }
        used
    }

    fn handle(&mut self, item: Result<TextCommand, TextError>, r: &mut Round) {
        if self.needs_auth {
            return self.authenticate(item, r);
        }
        match item {
            Ok(command) => self.command(command, r),
            Err(e @ TextError::Http) => {
                // As END: the lines after it (a forged request's body) never run.
                crate::log_limited!(warn, "HTTP request on the text port (cross-protocol request?): connection closed");
                self.err(e.code(), &e.to_string(), r.stats());
                self.ending = true;
                self.unread = Vec::new();
                // A long poll sent before it ends now (NOPE), not at its wait.
                self.stop_waiting(r);
            }
            Err(e @ TextError::Barrier) => {
                TextStats::inc(&r.stats().barriers);
                self.emit(|out| encode_err(out, e.code(), &e.to_string()));
            }
            Err(e) => self.err(e.code(), &e.to_string(), r.stats()),
        }
    }

    /// The first command of a connection that must authenticate: a valid
    /// `AUTH <token>` answers nothing and lets the next commands run; a
    /// wrong token (`AUTH_FAILED`) or anything else (`NOAUTH`) is answered
    /// and the connection closed, nothing after it run. The token is never
    /// logged; the refusal is, rate-limited, with the peer's address.
    fn authenticate(&mut self, item: Result<TextCommand, TextError>, r: &mut Round) {
        let stats = r.stats();
        let (code, counter, why) = match item {
            Ok(TextCommand::Auth { token }) => match r.tokens().and_then(|t| t.check(&token.0)) {
                Some(name) => {
                    self.needs_auth = false;
                    TextStats::inc(&stats.auth_ok);
                    tracing::debug!(conn = %self.id, token = %name, "text connection authenticated");
                    return;
                }
                None => (ErrorCode::AuthFailed, &stats.auth_failed, "a token not in text_auth_tokens_file"),
            },
            _ => (ErrorCode::NoAuth, &stats.auth_noauth, "a command before AUTH"),
        };
        TextStats::inc(counter);
        let peer = self.stream.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
        crate::log_limited!(warn, peer = %peer, why, "text connection refused: {}; closed", code);
        self.err(code, code.default_text(), stats);
        self.ending = true;
        self.unread = Vec::new();
    }

    /// Runs one well-formed command, or holds it back behind an unanswered
    /// ASK (a SCHED only behind a long-poll one; see the module docs).
    fn command(&mut self, command: TextCommand, r: &mut Round) {
        let sched = matches!(command, TextCommand::Sched { .. });
        if self.asking.is_some_and(|(_, long)| long || !sched) {
            self.held = Some(command);
            return;
        }
        match command {
            TextCommand::Sched { data, queue } => {
                let queue = QueueName::from(queue.into_bytes());
                let shard = r.shard_of(&queue);
                self.send(shard, Kind::Sched, TextCmd::Sched { queue, data }, r);
            }
            TextCommand::Ask { queue } => self.ask(QueueName::from(queue.into_bytes()), Duration::ZERO, r),
            TextCommand::AskWait { queue, wait_ms } => {
                let wait = Duration::from_millis(wait_ms);
                let max = r.config().max_ask_wait;
                if wait > max {
                    let text = format!("the wait of ASK <queue> <ms> is at most {} ms", max.as_millis());
                    return self.err(ErrorCode::BadFormat, &text, r.stats());
                }
                self.ask(QueueName::from(queue.into_bytes()), wait, r);
            }
            TextCommand::Ack => self.answer(TextAnswer::Ack, r),
            TextCommand::Dcl => self.answer(TextAnswer::Dcl, r),
            TextCommand::Del => self.answer(TextAnswer::Del, r),
            TextCommand::End => {
                self.ending = true;
                self.unread = Vec::new();
            }
            // Authenticated already, or no tokens required: nothing to do,
            // nothing answered (text-protocol.md "Authentication").
            TextCommand::Auth { .. } => {}
        }
    }

    fn ask(&mut self, queue: QueueName, wait: Duration, r: &mut Round) {
        self.expire_offer(r.now, r.stats());
        if self.offer.is_some() {
            return self.err(ErrorCode::Pending, ErrorCode::Pending.default_text(), r.stats());
        }
        let shard = r.shard_of(&queue);
        // A client that closed its sending side does not wait.
        let long = !wait.is_zero() && !self.eof && !self.peer_closed;
        self.asking = Some((shard, long));
        let cmd = if long { TextCmd::AskWait { queue, wait } } else { TextCmd::Ask { queue } };
        self.send(shard, Kind::Ask, cmd, r);
    }

    fn answer(&mut self, answer: TextAnswer, r: &mut Round) {
        self.expire_offer(r.now, r.stats());
        let Some((offer, _)) = self.offer.take() else {
            return self.err(ErrorCode::NoTask, ErrorCode::NoTask.default_text(), r.stats());
        };
        TextStats::dec(&r.stats().offers_held);
        self.send(offer.shard, Kind::Answer, TextCmd::Answer { offer, answer }, r);
    }

    fn send(&mut self, shard: usize, kind: Kind, cmd: TextCmd, r: &mut Round) {
        r.send(shard, self.id, cmd);
        self.pending.push_back(Slot::Sent { shard, kind });
    }

    /// Writes an `ERR` line in its place.
    fn err(&mut self, code: ErrorCode, text: &str, stats: &TextStats) {
        stats.count_error(code);
        self.emit(|out| encode_err(out, code, text));
    }

    /// Writes a reply decided here, in its place among the pending ones.
    fn emit(&mut self, f: impl FnOnce(&mut Vec<u8>)) {
        if self.pending.is_empty() {
            f(&mut self.out);
        } else {
            let mut bytes = Vec::new();
            f(&mut bytes);
            self.pending.push_back(Slot::Ready(bytes));
        }
    }

    /// Takes shard `shard`'s answer to this connection's oldest command
    /// still waiting for that shard. Returns an offer that must go back
    /// (an answer out of the contract; logged).
    pub fn apply(&mut self, shard: usize, outcome: TextOutcome, stats: &TextStats) -> Option<OfferId> {
        let found = self.pending.iter().position(|s| matches!(s, Slot::Sent { shard: s, .. } if *s == shard));
        let Some(i) = found else {
            tracing::error!(conn = %self.id, shard, ?outcome, "text answer with no command waiting for it");
            return offer_of(&outcome);
        };
        let Slot::Sent { kind, .. } = self.pending[i] else { return offer_of(&outcome) };
        if i > 0 {
            let mut bytes = Vec::new();
            let back = self.render(kind, outcome, &mut bytes, stats);
            self.pending[i] = Slot::Ready(bytes);
            return back;
        }
        let mut out = std::mem::take(&mut self.out);
        let back = self.render(kind, outcome, &mut out, stats);
        self.out = out;
        self.pending.pop_front();
        while let Some(Slot::Ready(bytes)) = self.pending.front() {
            self.out.extend_from_slice(bytes);
            self.pending.pop_front();
        }
        back
    }

    /// Writes the reply to a command of `kind` answered with `outcome`.
    fn render(&mut self, kind: Kind, outcome: TextOutcome, out: &mut Vec<u8>, stats: &TextStats) -> Option<OfferId> {
        if kind == Kind::Ask {
            self.asking = None;
        }
        match (kind, outcome) {
            (_, TextOutcome::Refused(code)) => {
                stats.count_error(code);
                encode_err(out, code, code.default_text());
            }
            (_, TextOutcome::NotConfirmed(code)) => {
                stats.count_error(code);
                encode_err(out, code, crate::joblog::NOT_CONFIRMED);
            }
            (Kind::Ask, TextOutcome::Offer { id, data, deadline }) if self.offer.is_none() => {
                if encode_want(out, &data) {
                    TextStats::inc(&stats.offers_rewritten);
                }
                TextStats::inc(&stats.offers_held);
                self.offer = Some((id, deadline));
            }
            (Kind::Ask, TextOutcome::Nope) => encode_nope(out),
            (Kind::Sched | Kind::Answer, TextOutcome::Done) => {}
            (kind, outcome) => {
                tracing::error!(conn = %self.id, ?kind, ?outcome, "text answer out of contract");
                if kind == Kind::Ask {
                    encode_nope(out);
                }
                return offer_of(&outcome);
            }
        }
        None
    }

    /// Forgets the held offer once its deadline has passed (its shard has
    /// taken it back, or will).
    fn expire_offer(&mut self, now: Instant, stats: &TextStats) {
        if self.offer.is_some_and(|(_, deadline)| deadline <= now) {
            self.offer = None;
            TextStats::dec(&stats.offers_held);
        }
    }

    /// The next moment the connection's timer must look at it: the end of
    /// its line time or of its offer.
    pub fn next_deadline(&self) -> Option<Instant> {
        let handshake = self.tls.as_ref().and_then(|t| t.handshake_deadline());
        [self.line_deadline, self.offer.map(|(_, deadline)| deadline), handshake].into_iter().flatten().min()
    }

    /// The timer fired at `now`: whether the line time ran out (then the
    /// connection is closed); a lapsed offer is forgotten.
    pub fn line_timed_out(&mut self, now: Instant, stats: &TextStats) -> bool {
        self.expire_offer(now, stats);
        self.line_deadline.is_some_and(|deadline| deadline <= now)
    }

    /// Writes what the socket takes. `Ok(true)`: everything is written.
    ///
    /// # Errors
    /// The socket's write error (the connection is broken).
    pub fn write(&mut self) -> io::Result<bool> {
        if let Some(tls) = self.tls.as_mut() {
            let done = tls.write(&mut self.stream, &mut self.out)?;
            if done && self.out.capacity() > TEXT_KEEP_BUFFER_BYTES {
                self.out = Vec::new();
            }
            return Ok(done);
        }
        while !self.out.is_empty() {
            match self.stream.write(&self.out) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => drop(self.out.drain(..n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if self.out.capacity() > TEXT_KEEP_BUFFER_BYTES {
            self.out = Vec::new();
        }
        Ok(true)
    }

    /// The connection is being closed: its offer goes back to the front of
    /// its queue and a long poll stops waiting. Answers still on their way
    /// find no connection; the I/O thread hands back any offer in them.
    pub fn close(&mut self, r: &mut Round) {
        if let Some((offer, _)) = self.offer.take() {
            TextStats::dec(&r.stats().offers_held);
            r.send(offer.shard, self.id, TextCmd::Release { offer });
        }
        if let Some((shard, true)) = self.asking.take() {
            if !self.eof {
                r.send(shard, self.id, TextCmd::Cancel);
            }
        }
    }
}

fn offer_of(outcome: &TextOutcome) -> Option<OfferId> {
    match outcome {
        TextOutcome::Offer { id, .. } => Some(*id),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection is a small struct, not a thread (README "How it works").
    #[test]
    fn a_connection_is_small() {
        let size = std::mem::size_of::<Conn>();
        println!("size_of::<Conn>() = {size} bytes");
        assert!(size <= 320, "{size}");
    }
}
