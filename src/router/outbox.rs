//! [`ShardOutbox`]: where a shard thread's output goes in the running
//! router. Messages for peers are gathered and handed to the I/O thread as
//! one batch at [`Outbox::flush`] (one channel operation and at most one
//! wake-up per shard batch); messages for other shards go straight into
//! their channels, so they always arrive before frames handed over later;
//! text answers are gathered per port and sent as one message per port per
//! batch.
//!
//! With `durability = "sync"`, a batch's frames for workers leave at once,
//! but its frontend frames (acceptance REPLYs, ERRORs) are handed to the
//! shard's sync thread ([`Outbox::flush_after_sync`]), which releases them
//! once the batch's log records are durable; while any such release is
//! outstanding, later batches' frontend frames go the same way, so they
//! keep their order. Text answers wait only where a producer was promised
//! something: the answer to a SCHED that stored a job
//! ([`TextReply::stored`]) waits for the sync, and so does every later
//! answer to that connection while one of its answers is held ([`Held`]),
//! so each connection's answers keep their order (the text front end
//! matches them to commands by order). The others, a consumer's `WANT?`,
//! `NOPE` and answers to its ACK/DCL/DEL, leave at once: like a job sent to
//! an eMQP worker before the sync, a task offered before its record is
//! durable can be lost in a power cut only if no producer was told it was
//! stored. (With the sync on the shard's thread, [`Outbox::flush_early`]
//! hands over the workers' frames before the sync, and everything else
//! waits for it.)

use std::sync::Arc;

use crossbeam_channel::Sender;

use parking_lot::Mutex;

use crate::broker::msg::{Dest, Outbox, Outgoing, ShardMsg, TextPort, TextReply};
use crate::ids::{ConnId, FastMap};
use crate::wal::sync::{SyncThread, SyncWait};
use crate::zmq_io::egress::EgressTx;

/// The router's [`Outbox`] for one shard thread.
pub struct ShardOutbox {
    index: usize,
    egress: EgressTx,
    shards: Arc<[Sender<ShardMsg>]>,
    /// Messages for frontend peers, handed to the I/O thread as one batch
    /// at flush (after the sync, when the log has one to wait for).
    emqp: Vec<Outgoing>,
    /// Messages for workers (backend), which never wait for a sync.
    backend: Vec<Outgoing>,
    text: Vec<(TextPort, Vec<TextReply>)>,
    /// The shard's sync thread, when its log syncs on one.
    sync: Option<SyncThread>,
    /// Text answers handed to the sync thread and not yet released.
    held: Arc<Mutex<Held>>,
}

/// Per text connection, how many of its answers wait in the sync thread;
/// a connection is in the map only while that is above zero, so the map
/// holds at most one entry per open connection.
#[derive(Debug, Default)]
pub struct Held(FastMap<ConnId, usize>);

impl Held {
    /// Splits one port's answers, in order, into those that may leave now
    /// and those that wait for the sync: a stored SCHED's answer waits,
    /// and so does every later answer to a connection with one waiting
    /// (counted here until [`Held::released`]).
    pub fn split(&mut self, replies: Vec<TextReply>) -> (Vec<TextReply>, Vec<TextReply>) {
        let (mut now, mut later) = (Vec::new(), Vec::new());
        for reply in replies {
            if reply.stored || self.0.contains_key(&reply.conn) {
                *self.0.entry(reply.conn).or_default() += 1;
                later.push(reply);
            } else {
                now.push(reply);
            }
        }
        (now, later)
    }

    /// `conns` had one held answer each released (handed to their port).
    pub fn released(&mut self, conns: impl IntoIterator<Item = ConnId>) {
        for conn in conns {
            if let Some(n) = self.0.get_mut(&conn) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.0.remove(&conn);
                }
            }
        }
    }

    /// Connections with answers waiting.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no answer waits.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl ShardOutbox {
    /// The outbox of shard `index`, releasing through `sync` when given.
    pub fn new(
        index: usize,
        egress: EgressTx,
        shards: Arc<[Sender<ShardMsg>]>,
        sync: Option<SyncThread>,
    ) -> ShardOutbox {
        let held = Arc::default();
        ShardOutbox { index, egress, shards, emqp: Vec::new(), backend: Vec::new(), text: Vec::new(), sync, held }
    }

    /// What was gathered since the last flush, as one release through the
    /// sync thread (its text answers counted in [`Held`] until then).
    fn take_release(&mut self) -> impl FnOnce() + Send + 'static {
        let (egress, emqp) = (self.egress.clone(), std::mem::take(&mut self.emqp));
        let (index, text) = (self.index, std::mem::take(&mut self.text));
        let held = self.held.clone();
        move || {
            let conns: Vec<ConnId> = text.iter().flat_map(|(_, r)| r.iter().map(|r| r.conn)).collect();
            release(index, &egress, emqp, text);
            // After the hand-over, so a later answer to one of these
            // connections cannot overtake them (no lock for a release of
            // eMQP frames only).
            if !conns.is_empty() {
                held.lock().released(conns);
            }
        }
    }

    /// Hands over now the text answers that need not wait for a sync
    /// (see the module docs); the rest stay for [`Self::take_release`].
    fn release_unheld_text(&mut self) {
        let mut now = Vec::new();
        {
            let mut held = self.held.lock();
            for (port, replies) in &mut self.text {
                let (go, wait) = held.split(std::mem::take(replies));
                if !go.is_empty() {
                    now.push((port.clone(), go));
                }
                *replies = wait;
            }
        }
        self.text.retain(|(_, replies)| !replies.is_empty());
        for (port, replies) in now {
            let _ = port.send(self.index, replies);
        }
    }
}

/// Hands frames to the I/O thread and answers to text ports.
fn release(index: usize, egress: &EgressTx, emqp: Vec<Outgoing>, text: Vec<(TextPort, Vec<TextReply>)>) {
    egress.send_batch(emqp);
    for (port, replies) in text {
        // Only a stopped text front end no longer reads its port.
        let _ = port.send(index, replies);
    }
}

impl Outbox for ShardOutbox {
    fn emqp(&mut self, out: Outgoing) {
        match out.dest {
            Dest::Backend => self.backend.push(out),
            _ => self.emqp.push(out),
        }
    }

    fn shard(&mut self, index: usize, msg: ShardMsg) {
        let sent = self.shards.get(index).map(|tx| tx.send(msg).is_ok());
        if sent != Some(true) {
            tracing::error!(shard = self.index, to = index, "shard channel closed; message lost at shutdown");
        }
    }

    fn text(&mut self, port: &TextPort, reply: TextReply) {
        match self.text.iter_mut().find(|(p, _)| p.id == port.id) {
            Some((_, replies)) => replies.push(reply),
            None => self.text.push((port.clone(), vec![reply])),
        }
    }

    fn flush(&mut self) {
        if self.sync.as_ref().is_some_and(SyncThread::busy) {
            self.flush_early();
            self.release_unheld_text();
            if self.emqp.is_empty() && self.text.is_empty() {
                return;
            }
            let rel = self.take_release();
            if let Some(sync) = &self.sync {
                sync.release_after(None, Box::new(rel));
            }
            return;
        }
        let mut all = std::mem::take(&mut self.backend);
        all.append(&mut self.emqp);
        release(self.index, &self.egress, all, std::mem::take(&mut self.text));
    }

    fn flush_after_sync(&mut self, wait: SyncWait) {
        self.flush_early();
        if self.sync.is_some() {
            self.release_unheld_text();
        }
        let rel = self.take_release();
        match &self.sync {
            Some(sync) => sync.release_after(Some(wait), Box::new(rel)),
            None => rel(),
        }
    }

    fn flush_early(&mut self) {
        if !self.backend.is_empty() {
            self.egress.send_batch(std::mem::take(&mut self.backend));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::msg::TextOutcome;

    fn reply(conn: u64, outcome: TextOutcome, stored: bool) -> TextReply {
        TextReply { conn: ConnId(conn), outcome, stored }
    }

    fn conns(replies: &[TextReply]) -> Vec<u64> {
        replies.iter().map(|r| r.conn.0).collect()
    }

    #[test]
    fn a_stored_sched_and_every_later_answer_of_its_connection_wait() {
        let mut held = Held::default();
        let batch = vec![
            reply(1, TextOutcome::Nope, false),
            reply(2, TextOutcome::Done, true),
            reply(1, TextOutcome::Done, false),
            reply(2, TextOutcome::Nope, false),
            reply(3, TextOutcome::Done, false),
        ];
        let (now, later) = held.split(batch);
        assert_eq!(conns(&now), [1, 1, 3], "consumers' answers leave at once");
        assert_eq!(conns(&later), [2, 2], "the producer's SCHED and what follows it wait");
        // A later batch: connection 2 still has answers waiting.
        let (now, later) = held.split(vec![reply(2, TextOutcome::Nope, false), reply(1, TextOutcome::Nope, false)]);
        assert_eq!((conns(&now), conns(&later)), (vec![1], vec![2]));
        assert_eq!(held.len(), 1);
        // Released: the first two, then the third.
        held.released([ConnId(2), ConnId(2)]);
        assert_eq!(held.len(), 1, "one answer of connection 2 still waits");
        let (_, later) = held.split(vec![reply(2, TextOutcome::Nope, false)]);
        assert_eq!(conns(&later), [2]);
        held.released([ConnId(2), ConnId(2)]);
        assert!(held.is_empty(), "forgotten once nothing waits");
        let (now, later) = held.split(vec![reply(2, TextOutcome::Nope, false)]);
        assert_eq!((conns(&now), conns(&later)), (vec![2], vec![]));
    }

    #[test]
    fn a_consumers_answers_do_not_wait_for_a_sync_that_a_producers_do() {
        let shared = Arc::new(crate::wal::log::SyncShared::new(std::env::temp_dir()));
        let sync = SyncThread::start(0, shared).expect("sync thread");
        // A release that blocks the sync thread until `go`: a sync under way.
        let (go, gate) = crossbeam_channel::bounded::<()>(0);
        sync.release_after(
            None,
            Box::new(move || {
                let _ = gate.recv();
            }),
        );
        let (egress, _egress_rx) = crate::zmq_io::egress::channel().expect("eventfd");
        let mut out = ShardOutbox::new(0, egress, Arc::from(Vec::new()), Some(sync));
        let (tx, port_rx) = crossbeam_channel::unbounded();
        let port = TextPort { id: 1, tx, wake: None };
        let next = || port_rx.recv_timeout(std::time::Duration::from_secs(5)).expect("an answer batch");
        // A batch that wrote records (flush_after_sync, a real sync to wait
        // for), then one that wrote none while the sync thread is busy (flush).
        let path = std::env::temp_dir().join(format!("emq-outbox-test-{}", std::process::id()));
        let file = Arc::new(std::fs::File::create(&path).expect("temp file"));
        out.text(&port, reply(1, TextOutcome::Done, true));
        out.text(&port, reply(2, TextOutcome::Nope, false));
        out.flush_after_sync(SyncWait { file, upto: 1 });
        assert_eq!(conns(&next().replies), [2], "the consumer's NOPE leaves during the sync");
        out.text(&port, reply(1, TextOutcome::Nope, false));
        out.text(&port, reply(2, TextOutcome::Nope, false));
        out.flush();
        assert_eq!(conns(&next().replies), [2]);
        assert!(port_rx.try_recv().is_err(), "the producer's answers wait");
        assert_eq!(out.held.lock().len(), 1);
        go.send(()).expect("sync thread");
        assert_eq!(conns(&next().replies), [1], "its stored SCHED first");
        assert_eq!(conns(&next().replies), [1], "then its later answer");
        // Counted down just after the hand-over, on the sync thread.
        let t0 = std::time::Instant::now();
        while !out.held.lock().is_empty() && t0.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(out.held.lock().is_empty(), "nothing waits once released");
        drop(out);
        // The sync thread is joined: every release ran.
        assert!(port_rx.try_recv().is_err());
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn a_refused_sched_waits_only_behind_held_answers() {
        let mut held = Held::default();
        let refused = TextOutcome::Refused(crate::protocol::text::ErrorCode::ShuttingDown);
        let (now, _) = held.split(vec![reply(7, refused.clone(), false)]);
        assert_eq!(conns(&now), [7], "nothing stored, nothing promised");
        let (now, later) = held.split(vec![reply(7, TextOutcome::Done, true), reply(7, refused, false)]);
        assert_eq!((conns(&now), conns(&later)), (vec![], vec![7, 7]), "its ERR follows its stored SCHED");
        held.released([ConnId(1)]);
        assert_eq!(held.len(), 1, "releasing another connection changes nothing");
    }
}
