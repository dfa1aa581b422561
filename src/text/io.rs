//! A text I/O thread (`emq-text-N`): one readiness loop (mio) over many
//! non-blocking connections.
//!
//! One turn of the loop: wait for readiness, a wake-up or the next timer;
//! take new connections and the shards' answers; serve every connection
//! that can go on (resume what waited, read once, decode and run its
//! commands); send what the turn produced to the shards, one
//! [`ShardMsg::Text`] per shard; fire timers; write each connection's
//! replies with one write. Shards answer through this thread's [`TextPort`],
//! whose wake-up is an eventfd in the same poll ([`Wake`]: producers write
//! it only while this thread sleeps).
//!
//! Reads follow the input budget ([`Shared`]'s `budget_spent` and `charge`):
//! a connection that may not be read now is put on the thread's list of
//! paused connections (readiness is edge-triggered: no new event may come).
//! A turn that finds the total below the spent mark serves the oldest
//! paused connections first, as many as one read each can fill (or, the
//! lead being free, the oldest, to take it); the thread sleeps while the
//! budget is spent and the lead taken, and the thread whose release brings
//! the total below the mark or frees the lead wakes the threads with paused
//! connections.

use std::collections::VecDeque;
use std::io::{self, Read};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};

use super::accept::Acceptor;
use super::auth::Tokens;
use super::conn::{Close, Conn};
use super::stats::TextStats;
use super::tls_link::TlsLink;
use super::Shared;
use crate::broker::inbox::ShardMsg;
use crate::broker::text_port::{TextBatch, TextCmd, TextOutcome, TextPort, TextReply, TextRequest};
use crate::broker::timers::Timers;
use crate::broker::types::shard_of;
use crate::config::TextConfig;
use crate::ids::{ConnId, QueueName};
use crate::limits;
use crate::protocol::text::ErrorCode;
use crate::wake::Wake;

/// The poll token of the wake-up eventfd.
pub(super) const WAKE: Token = Token(0);
/// The poll token of the plain listener (acceptor threads only).
pub(super) const LISTENER: Token = Token(1);
/// The poll token of the TLS listener (`text_tls`; acceptor threads only).
pub(super) const LISTENER_TLS: Token = Token(2);
/// Connection tokens start here: token = slot + `FIRST_CONN`.
const FIRST_CONN: usize = 3;
/// A [`ConnId`] is `(sequence << SLOT_BITS) | slot`: the slot finds the
/// connection in its thread's table, the sequence (40 bits: 10^12
/// connections) tells it from earlier holders of the slot.
const SLOT_BITS: u32 = 24;

/// The slot of connection `id` in its I/O thread's table.
fn slot_of(id: ConnId) -> usize {
    (id.0 & ((1 << SLOT_BITS) - 1)) as usize
}

/// What the commands of one loop turn produce for the shards: one batch
/// per shard, and the count of answers the shards owe this thread.
pub(super) struct Round<'a> {
    /// The time of the turn.
    pub now: Instant,
    shared: &'a Shared,
    batches: &'a mut [Vec<TextRequest>],
    owed: &'a mut usize,
}

impl Round<'_> {
    /// Queues `cmd` of `conn` for shard `shard` (sent at the end of the turn).
    pub fn send(&mut self, shard: usize, conn: ConnId, cmd: TextCmd) {
        if !matches!(cmd, TextCmd::Release { .. } | TextCmd::Cancel) {
            *self.owed += 1;
        }
        if let Some(batch) = self.batches.get_mut(shard) {
            batch.push(TextRequest { conn, cmd });
        }
    }

    /// The shard that owns `queue`.
    pub fn shard_of(&self, queue: &QueueName) -> usize {
        shard_of(&queue.0, self.batches.len())
    }

    /// The text limits.
    pub fn config(&self) -> &TextConfig {
        &self.shared.config
    }

    /// The counters.
    pub fn stats(&self) -> &TextStats {
        &self.shared.stats
    }

    /// The accepted tokens, when connections must authenticate.
    pub fn tokens(&self) -> Option<&Tokens> {
        self.shared.tokens.as_deref()
    }
}

/// The parts of an I/O thread made before it starts (so that start-up
/// errors are reported by [`super::TextServer::start`]).
pub(super) struct IoParts {
    pub poll: Poll,
    pub wake: Arc<Wake>,
    pub conns_rx: Receiver<(TcpStream, bool)>,
    pub port: TextPort,
    pub replies_rx: Receiver<TextBatch>,
    /// The plain and TLS listeners' acceptors (acceptor threads only), by
    /// poll token less [`LISTENER`].
    pub acceptors: Vec<Acceptor>,
}

/// One text I/O thread.
pub(super) struct IoThread {
    shared: Arc<Shared>,
    poll: Poll,
    wake: Arc<Wake>,
    conns_rx: Receiver<(TcpStream, bool)>,
    port: TextPort,
    replies_rx: Receiver<TextBatch>,
    acceptors: Vec<Acceptor>,
    /// Connections by slot; `free` lists the empty slots.
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    timers: Timers<ConnId>,
    batches: Vec<Vec<TextRequest>>,
    /// Answers the shards still owe this thread.
    owed: usize,
    /// Slots to serve this turn.
    work: Vec<usize>,
    /// Slots to write (or close) at the end of this turn.
    dirty: Vec<usize>,
    /// The read buffer every connection of the thread shares.
    buf: Vec<u8>,
    /// This thread's index among the I/O threads.
    index: usize,
    /// Connections waiting for the input budget, oldest first: `(slot, id)`
    /// of connections whose `paused` is set (an entry whose connection has
    /// closed or was served meanwhile is skipped).
    paused: VecDeque<(usize, ConnId)>,
}

/// What one read of a connection gave.
pub(super) enum Got {
    /// `n` bytes (0: the end of input); whether more may be waiting.
    Bytes(usize, bool),
    /// Nothing read: the input budget is spent and the next line is not
    /// complete within one read.
    Pause,
    /// TLS bytes were read that gave no plaintext yet (the handshake);
    /// the socket may hold more.
    Again,
}

impl IoThread {
    /// A thread over `parts`.
    pub fn new(shared: Arc<Shared>, parts: IoParts) -> IoThread {
        let shards = shared.shards.len();
        let index = parts.port.id as usize;
        IoThread {
            poll: parts.poll,
            wake: parts.wake,
            conns_rx: parts.conns_rx,
            port: parts.port,
            replies_rx: parts.replies_rx,
            acceptors: parts.acceptors,
            conns: Vec::new(),
            free: Vec::new(),
            timers: Timers::default(),
            batches: (0..shards).map(|_| Vec::new()).collect(),
            owed: 0,
            work: Vec::new(),
            dirty: Vec::new(),
            buf: vec![0; limits::TEXT_READ_BUF_BYTES],
            index,
            paused: VecDeque::new(),
            shared,
        }
    }

    /// Runs until the server stops, then closes every connection (offers
    /// go back to the front of their queues) and waits for the shards'
    /// last answers (offers in them go back too).
    pub fn run(mut self) {
        let mut events = Events::with_capacity(limits::TEXT_EVENTS_PER_POLL);
        while !self.shared.stopping.load(Ordering::Acquire) {
            let (timeout, armed) = self.timeout();
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() != io::ErrorKind::Interrupted {
                    tracing::error!(error = %e, "text poll failed; the text I/O thread stops");
                    break;
                }
            }
            if armed {
                self.wake.unarm();
            }
            for event in events.iter() {
                self.on_event(event);
            }
            self.turn(Instant::now());
        }
        self.stop();
    }

    /// How long to block: not at all while work is left; else until the
    /// next timer, with the wake-up armed (second value).
    fn timeout(&self) -> (Option<Duration>, bool) {
        let accept_now = self.acceptors.iter().any(|a| a.ready());
        if !self.work.is_empty() || accept_now || self.can_unpause() {
            return (Some(Duration::ZERO), false);
        }
        self.wake.arm();
        // A thread with paused connections has said so (`budget_waiting`)
        // before arming: a release after this look wakes it.
        if !self.conns_rx.is_empty()
            || !self.replies_rx.is_empty()
            || self.shared.stopping.load(Ordering::Acquire)
            || self.can_unpause()
        {
            // A wake-up written meanwhile shows in the next poll as WAKE.
            self.wake.unarm();
            return (Some(Duration::ZERO), false);
        }
        let retry = self.acceptors.iter().filter_map(|a| a.retry_at()).min();
        let next = match (self.timers.next_deadline(), retry) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        (next.map(|d| d.saturating_duration_since(Instant::now())), true)
    }

    fn on_event(&mut self, event: &mio::event::Event) {
        match event.token() {
            WAKE => self.wake.clear(),
            LISTENER | LISTENER_TLS => {
                if let Some(a) = self.acceptors.get_mut(event.token().0 - LISTENER.0) {
                    a.set_ready();
                }
            }
            Token(t) => {
                let slot = t - FIRST_CONN;
                let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) else { return };
                if event.is_read_closed() {
                    conn.note_peer_closed();
                }
                if event.is_readable() || event.is_read_closed() || event.is_error() {
                    conn.readable = true;
                    queue(&mut self.work, conn, slot);
                }
                if event.is_writable() && conn.has_output() {
                    self.dirty.push(slot);
                }
            }
        }
    }

    fn turn(&mut self, now: Instant) {
        while let Ok((stream, tls)) = self.conns_rx.try_recv() {
            self.add(stream, tls, now);
        }
        while let Ok(batch) = self.replies_rx.try_recv() {
            self.on_answers(batch, now);
        }
        let mut acceptors = std::mem::take(&mut self.acceptors);
        let shared = self.shared.clone();
        for acceptor in &mut acceptors {
            let tls = acceptor.tls();
            acceptor.accept(now, &shared, |stream| self.add(stream, tls, now));
        }
        self.acceptors = acceptors;
        self.unpause();
        for slot in std::mem::take(&mut self.work) {
            self.serve(slot, now);
        }
        while let Some(id) = self.timers.pop_due(now) {
            self.on_timer(id, now);
        }
        self.send_batches();
        for slot in std::mem::take(&mut self.dirty) {
            self.flush(slot, now);
        }
        // What closing connections handed back.
        self.send_batches();
    }

    /// Registers a connection handed to this thread (accepted on the TLS
    /// listener when `tls`).
    fn add(&mut self, mut stream: TcpStream, tls: bool, now: Instant) {
        let slot = self.free.pop().unwrap_or_else(|| {
            self.conns.push(None);
            self.conns.len() - 1
        });
        if slot >> SLOT_BITS != 0 {
            tracing::error!(slot, "more text connections in one I/O thread than ids can tell apart; closed");
            self.free.push(slot);
            TextStats::dec(&self.shared.stats.connections_open);
            return;
        }
        let seq = self.shared.next_conn.fetch_add(1, Ordering::Relaxed);
        let id = ConnId((seq << SLOT_BITS) | slot as u64);
        let interest = Interest::READABLE | Interest::WRITABLE;
        if let Err(e) = self.poll.registry().register(&mut stream, Token(slot + FIRST_CONN), interest) {
            tracing::warn!(conn = %id, error = %e, "cannot watch text connection; closed");
            self.free.push(slot);
            TextStats::dec(&self.shared.stats.connections_open);
            return;
        }
        let config = &self.shared.config;
        let link = match (tls, &self.shared.tls) {
            (false, _) => None,
            (true, Some(tls)) => {
                TextStats::inc(&self.shared.stats.tls_connections_total);
                match TlsLink::new(tls.clone(), now + config.tls_handshake_timeout, config.max_unsent_bytes) {
                    Ok(link) => Some(Box::new(link)),
                    Err(e) => {
                        tracing::warn!(conn = %id, error = %e, "cannot start TLS on a text connection; closed");
                        let _ = self.poll.registry().deregister(&mut stream);
                        self.free.push(slot);
                        TextStats::dec(&self.shared.stats.connections_open);
                        return;
                    }
                }
            }
            (true, None) => {
                // Not reached: only a server with TLS has a TLS listener.
                self.free.push(slot);
                TextStats::dec(&self.shared.stats.connections_open);
                return;
            }
        };
        let needs_auth = self.shared.tokens.is_some();
        let mut conn = Conn::new(id, stream, link, config.max_line_bytes, needs_auth);
        conn.queued = true;
        self.conns[slot] = Some(conn);
        self.work.push(slot);
        tracing::debug!(conn = %id, at = ?now, "text connection open");
    }

    /// Takes one shard's answers.
    fn on_answers(&mut self, batch: TextBatch, now: Instant) {
        let TextBatch { shard, replies } = batch;
        let mut round = Round { now, shared: &self.shared, batches: &mut self.batches, owed: &mut self.owed };
        for TextReply { conn: id, outcome, .. } in replies {
            *round.owed = round.owed.saturating_sub(1);
            let slot = slot_of(id);
            let back = match self.conns.get_mut(slot).and_then(Option::as_mut).filter(|c| c.id == id) {
                Some(conn) => {
                    let back = conn.apply(shard, outcome, &self.shared.stats);
                    queue(&mut self.work, conn, slot);
                    back
                }
                // The connection closed before its answer came: an offer in
                // it goes back (a delivery, like any offer of a connection
                // that ended).
                None => match outcome {
                    TextOutcome::Offer { id: offer, .. } => Some(offer),
                    _ => None,
                },
            };
            if let Some(offer) = back {
                round.send(offer.shard, id, TextCmd::Release { offer });
            }
        }
    }

    /// Lets a connection go on: what waited, then one read if it wants input.
    fn serve(&mut self, slot: usize, now: Instant) {
        let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) else { return };
        conn.queued = false;
        let mut round = Round { now, shared: &self.shared, batches: &mut self.batches, owed: &mut self.owed };
        conn.resume(&mut round);
        let mut broken = false;
        // The lead is read through the end of its line, whatever the total.
        // While the budget is spent, a connection whose ASK is unanswered is
        // not read: the line would be held back behind it, not run (its
        // answer serves it again).
        let by_line = conn.wants_input() && conn.readable && (conn.lead || self.shared.budget_spent());
        if conn.wants_input() && conn.readable && !(by_line && !conn.lead && conn.awaits_answer()) {
            let mut pause = false;
            let take_all = conn.lead || conn.discarding();
            let stats = &self.shared.stats;
            let mut got = read_conn(conn, &mut self.buf, by_line, take_all, stats);
            if matches!(got, Ok(Got::Pause)) && self.shared.take_lead(conn.id) {
                conn.lead = true;
                got = read_conn(conn, &mut self.buf, true, true, stats);
            }
            match got {
                Ok(Got::Bytes(0, _)) => {
                    conn.readable = false;
                    conn.input_ended(&mut round);
                    if std::mem::take(&mut conn.lead) {
                        self.shared.end_lead();
                    }
                }
                Ok(Got::Bytes(n, more)) => {
                    // A short read emptied the socket: the next byte to
                    // arrive raises a new readiness event. Not so for the
                    // end of input once its event is taken: the peer's
                    // close may have come in the same event as these
                    // bytes, so read on until 0.
                    conn.readable = more || conn.peer_closed();
                    conn.input(&self.buf[..n], &mut round);
                    // The lead's line ended, or is dropped as too long.
                    if conn.lead && (self.buf[n - 1] == b'\n' || conn.input_bytes() == 0) {
                        conn.lead = false;
                        self.shared.end_lead();
                    }
                }
                Ok(Got::Pause) => pause = true,
                // The handshake goes on: the connection is served again.
                Ok(Got::Again) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => conn.readable = false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::debug!(conn = %conn.id, error = %e, "text read failed");
                    broken = true;
                }
            }
            if pause {
                conn.line_seen(now, self.shared.config.line_timeout);
                if !conn.paused {
                    conn.paused = true;
                    self.paused.push_back((slot, conn.id));
                    self.shared.budget_waiting[self.index].store(true, Ordering::SeqCst);
                    TextStats::inc(&self.shared.stats.reads_paused);
                }
            } else if conn.readable && !broken {
                queue(&mut self.work, conn, slot);
            }
        }
        let held = conn.input_bytes();
        let was = std::mem::replace(&mut conn.charged, held);
        self.shared.charge(was, conn.charged);
        arm_timer(&mut self.timers, conn);
        if broken {
            return self.close(slot, Close::Broken, now);
        }
        if conn.has_output() || conn.finished() {
            self.dirty.push(slot);
        }
    }

    fn on_timer(&mut self, id: ConnId, now: Instant) {
        let slot = slot_of(id);
        let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut).filter(|c| c.id == id) else { return };
        if conn.timer_at.is_some_and(|at| at <= now) {
            conn.timer_at = None;
        }
        if let Some(tls) = conn.tls.as_mut().filter(|t| t.handshake_late(now)) {
            tls.handshake_timed_out(&conn.stream, &self.shared.stats);
            return self.close(slot, Close::HandshakeTimeout, now);
        }
        if conn.line_timed_out(now, &self.shared.stats) {
            tracing::debug!(conn = %id, "text line not complete within the line timeout; closing");
            return self.close(slot, Close::LineTimeout, now);
        }
        arm_timer(&mut self.timers, conn);
    }

    /// Writes a connection's replies (one write), then closes it if it is
    /// over or holds too much it does not read.
    fn flush(&mut self, slot: usize, now: Instant) {
        let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) else { return };
        let paused = conn.unsent() >= limits::TEXT_OUT_PAUSE_BYTES;
        let written = match conn.write() {
            Ok(_) => conn.unsent() < limits::TEXT_OUT_PAUSE_BYTES,
            Err(e) => {
                tracing::debug!(conn = %conn.id, error = %e, "text write failed");
                return self.close(slot, Close::Broken, now);
            }
        };
        if conn.finished() {
            return self.close(slot, Close::Done, now);
        }
        if conn.unsent() > self.shared.config.max_unsent_bytes {
            tracing::info!(conn = %conn.id, unsent = conn.unsent(), "text client does not read its replies; closing");
            return self.close(slot, Close::SlowReader, now);
        }
        if paused && written {
            // Replies taken: what waited for them may go on.
            queue(&mut self.work, conn, slot);
        }
    }

    fn close(&mut self, slot: usize, why: Close, now: Instant) {
        let Some(mut conn) = self.conns.get_mut(slot).and_then(Option::take) else { return };
        let mut round = Round { now, shared: &self.shared, batches: &mut self.batches, owed: &mut self.owed };
        conn.close(&mut round);
        self.shared.charge(conn.charged, 0);
        if conn.lead {
            self.shared.end_lead();
        }
        let stats = &self.shared.stats;
        match why {
            Close::LineTimeout => TextStats::inc(&stats.line_timeout_closed),
            Close::SlowReader => TextStats::inc(&stats.slow_reader_closed),
            Close::Done | Close::Broken | Close::HandshakeTimeout => {}
        }
        if let Some(tls) = conn.tls.as_mut() {
            tls.close(&mut conn.stream);
        }
        let _ = self.poll.registry().deregister(&mut conn.stream);
        let _ = conn.stream.shutdown(std::net::Shutdown::Both);
        TextStats::dec(&stats.connections_open);
        self.free.push(slot);
        tracing::debug!(conn = %conn.id, ?why, "text connection closed");
    }

    /// Whether paused connections may be served now: some wait, and the
    /// input budget is not spent or the lead is free.
    fn can_unpause(&self) -> bool {
        !self.paused.is_empty() && (!self.shared.budget_spent() || self.shared.lead_free())
    }

    /// While the input budget is not spent, puts the oldest paused
    /// connections first on this turn's work: as many as one read each
    /// could fill the room left (at least one: while the budget is spent
    /// and the lead free, the oldest, to take the lead), so a freed budget
    /// goes to those that waited longest and the rest are not retried in
    /// vain. Entries of connections closed meanwhile are dropped; the list
    /// is compacted when it holds more than twice the thread's connections.
    fn unpause(&mut self) {
        if !self.can_unpause() {
            return self.compact_paused();
        }
        let held = self.shared.stats.buffered_bytes.load(Ordering::Relaxed);
        let room = self.shared.budget_soft_limit().saturating_sub(held);
        let most = room.div_ceil(limits::TEXT_READ_BUF_BYTES as u64).max(1);
        let mut first = Vec::new();
        while (first.len() as u64) < most {
            let Some((slot, id)) = self.paused.pop_front() else { break };
            let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut).filter(|c| c.id == id) else {
                continue;
            };
            if !conn.paused {
                continue;
            }
            conn.paused = false;
            if !conn.queued {
                conn.queued = true;
                first.push(slot);
            }
        }
        if self.paused.is_empty() {
            self.shared.budget_waiting[self.index].store(false, Ordering::SeqCst);
        }
        if !first.is_empty() {
            first.append(&mut self.work);
            self.work = first;
        }
    }

    /// Drops the entries of closed connections from the paused list once it
    /// holds more than twice the thread's open connections (each live one
    /// is on it at most once), so a long-spent budget does not grow it.
    fn compact_paused(&mut self) {
        let open = self.conns.len() - self.free.len();
        if self.paused.len() <= 2 * open + 16 {
            return;
        }
        let conns = &self.conns;
        self.paused
            .retain(|&(slot, id)| conns.get(slot).and_then(Option::as_ref).is_some_and(|c| c.id == id && c.paused));
        if self.paused.is_empty() {
            self.shared.budget_waiting[self.index].store(false, Ordering::SeqCst);
        }
    }

    /// Sends this turn's commands, one message per shard. A shard that is
    /// gone (only while the router stops) cannot have run them: each
    /// answered command is refused with `SHUTTING_DOWN`, which is true.
    fn send_batches(&mut self) {
        for shard in 0..self.batches.len() {
            if self.batches[shard].is_empty() {
                continue;
            }
            let cmds = std::mem::take(&mut self.batches[shard]);
            let Some(tx) = self.shared.shards.get(shard) else { continue };
            // Counted before the send: the shard subtracts as it takes it.
            let load = &self.shared.inbox_load[shard];
            load.fetch_add(cmds.len(), Ordering::Relaxed);
            let cmds = match tx.send(ShardMsg::Text { port: self.port.clone(), cmds }) {
                Ok(()) => continue,
                Err(crossbeam_channel::SendError(ShardMsg::Text { cmds, .. })) => cmds,
                Err(_) => continue,
            };
            load.fetch_sub(cmds.len(), Ordering::Relaxed);
            let replies = cmds
                .into_iter()
                .filter(|c| !matches!(c.cmd, TextCmd::Release { .. } | TextCmd::Cancel))
                .map(|c| TextReply::new(c.conn, TextOutcome::Refused(ErrorCode::ShuttingDown)))
                .collect();
            self.on_answers(TextBatch { shard, replies }, Instant::now());
        }
    }

    /// Closes every connection, then waits (up to
    /// [`limits::TEXT_SHUTDOWN_WAIT`]) for the answers the shards still owe,
    /// handing back the offers in them.
    fn stop(&mut self) {
        let now = Instant::now();
        for slot in 0..self.conns.len() {
            self.close(slot, Close::Done, now);
        }
        self.send_batches();
        let until = now + limits::TEXT_SHUTDOWN_WAIT;
        while self.owed > 0 {
            match self.replies_rx.recv_deadline(until) {
                Ok(batch) => self.on_answers(batch, Instant::now()),
                Err(_) => break,
            }
            self.send_batches();
        }
        // Connections handed over but never registered.
        while self.conns_rx.try_recv().is_ok() {
            TextStats::dec(&self.shared.stats.connections_open);
        }
    }
}

/// Reads a connection's next bytes into `buf`: from its socket
/// ([`read_input`]), or through TLS ([`TlsLink::read_input`]).
fn read_conn(conn: &mut Conn, buf: &mut [u8], by_line: bool, take_all: bool, stats: &TextStats) -> io::Result<Got> {
    match conn.tls.as_mut() {
        Some(tls) => tls.read_input(&mut conn.stream, buf, by_line, take_all, stats),
        None => read_input(&mut conn.stream, buf, by_line, take_all),
    }
}

/// Reads a connection's next bytes into `buf`. Not `by_line` (the input
/// budget is not spent and the connection does not lead): one read, up to
/// `buf.len()`. `by_line`: only through the first LF found by peeking at
/// most [`limits::TEXT_PEEK_BYTES`], then `buf.len()` bytes (so that the
/// connection holds nothing once they are decoded); with no LF, the peeked
/// bytes if `take_all` (an over-long line being dropped adds nothing; the
/// lead may hold its line), else [`Got::Pause`]. Linear: a line of `n`
/// bytes (LF included) read this way costs copies of at most
/// `TEXT_PEEK_BYTES + n` bytes when it fits in the first peek, else at
/// most `18 n`; the lead's line, at most `4 KiB + 2 × 64 KiB` per 64 KiB.
///
/// # Errors
/// The socket's read error (`WouldBlock`: nothing to read now).
fn read_input(stream: &mut TcpStream, buf: &mut [u8], by_line: bool, take_all: bool) -> io::Result<Got> {
    if !by_line {
        let n = stream.read(buf)?;
        return Ok(Got::Bytes(n, n == buf.len()));
    }
    let windows = [limits::TEXT_PEEK_BYTES.min(buf.len()), buf.len()];
    for (i, &window) in windows.iter().enumerate() {
        let seen = stream.peek(&mut buf[..window])?;
        if seen == 0 {
            // The end of input: a read says so too.
            let n = stream.read(buf)?;
            return Ok(Got::Bytes(n, n == buf.len()));
        }
        let take = match memchr::memchr(b'\n', &buf[..seen]) {
            Some(lf) => lf + 1,
            None if seen == window && i + 1 < windows.len() => continue,
            None if take_all => seen,
            None => return Ok(Got::Pause),
        };
        let n = stream.read(&mut buf[..take])?;
        return Ok(Got::Bytes(n, n < seen || seen == window));
    }
    Ok(Got::Pause)
}

/// Puts `conn` (at `slot`) on the list of connections to serve, once.
fn queue(work: &mut Vec<usize>, conn: &mut Conn, slot: usize) {
    if !conn.queued {
        conn.queued = true;
        work.push(slot);
    }
}

/// Arms the connection's timer for its next deadline unless one at least
/// as early is armed (one entry per connection; a later one is re-armed
/// when the earlier fires).
fn arm_timer(timers: &mut Timers<ConnId>, conn: &mut Conn) {
    let Some(deadline) = conn.next_deadline() else { return };
    if conn.timer_at.is_none_or(|at| deadline < at) {
        conn.timer_at = Some(deadline);
        timers.arm(deadline, conn.id);
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::time::Duration;

    use super::*;

    /// A connected pair over loopback: the client's end, and the server's as
    /// a non-blocking mio stream.
    fn pair() -> (std::net::TcpStream, TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let client = std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (server, _) = listener.accept().expect("accept");
        server.set_nonblocking(true).expect("non-blocking");
        (client, TcpStream::from_std(server))
    }

    /// Reads until something other than `WouldBlock` (the bytes written
    /// may take a moment to arrive over loopback).
    fn read(stream: &mut TcpStream, buf: &mut [u8], spent: bool, discarding: bool) -> Got {
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            match read_input(stream, buf, spent, discarding) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < until => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                other => return other.expect("read"),
            }
        }
    }

    /// Waits until `n` bytes are in the socket, unread.
    fn arrived(stream: &TcpStream, buf: &mut [u8], n: usize) {
        let until = Instant::now() + Duration::from_secs(5);
        while stream.peek(buf).unwrap_or(0) < n {
            assert!(Instant::now() < until, "bytes never arrived");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn bytes(got: Got) -> (usize, bool) {
        match got {
            Got::Bytes(n, more) => (n, more),
            Got::Pause | Got::Again => panic!("paused"),
        }
    }

    #[test]
    fn with_the_budget_spent_a_read_takes_one_complete_line_or_nothing() {
        let (mut client, mut server) = pair();
        let mut buf = vec![0; limits::TEXT_READ_BUF_BYTES];
        client.write_all(b"SCHED x\nASK\nSCHED unfini").expect("write");
        arrived(&server, &mut buf, 24);
        assert_eq!(bytes(read(&mut server, &mut buf, true, false)), (8, true));
        assert_eq!(&buf[..8], b"SCHED x\n");
        assert_eq!(bytes(read(&mut server, &mut buf, true, false)), (4, true));
        assert_eq!(&buf[..4], b"ASK\n");
        assert!(matches!(read(&mut server, &mut buf, true, false), Got::Pause), "no LF: nothing read");
        // The budget not spent: one plain read takes what is there.
        assert_eq!(bytes(read(&mut server, &mut buf, false, false)), (12, false));
        assert_eq!(&buf[..12], b"SCHED unfini");

        // A line past the first peek, within one read, still gets through.
        let long = [vec![b'a'; 10_000], b"\nnext".to_vec()].concat();
        client.write_all(&long).expect("write");
        arrived(&server, &mut buf, long.len());
        assert_eq!(bytes(read(&mut server, &mut buf, true, false)), (10_001, true));
        // Over-long lines being dropped take what is there, LF or not.
        assert_eq!(bytes(read(&mut server, &mut buf, true, true)), (4, false));
        assert_eq!(&buf[..4], b"next");

        // A line longer than one read waits for the budget.
        let huge = vec![b'b'; limits::TEXT_READ_BUF_BYTES + 10];
        let mut writer = client.try_clone().expect("clone");
        let sender = std::thread::spawn(move || writer.write_all(&huge).and_then(|()| writer.write_all(b"\n")));
        let whole = buf.len();
        arrived(&server, &mut buf, whole);
        assert!(matches!(read(&mut server, &mut buf, true, false), Got::Pause));
        assert_eq!(bytes(read(&mut server, &mut buf, false, false)), (buf.len(), true));

        // The end of input is read as such.
        sender.join().expect("sender").expect("written");
        drop(client);
        let mut total = 0;
        loop {
            match read(&mut server, &mut buf, true, true) {
                Got::Bytes(0, _) => break,
                Got::Bytes(n, _) => total += n,
                Got::Pause | Got::Again => panic!("paused"),
            }
        }
        assert_eq!(total, 11, "the rest of the long line and its LF");
    }
}
