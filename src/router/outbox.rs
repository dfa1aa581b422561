//! [`ShardOutbox`]: where a shard thread's output goes in the running
//! router. Messages for peers are gathered and handed to the I/O thread as
//! one batch at [`Outbox::flush`] (one channel operation and at most one
//! wake-up per shard batch); messages for other shards go straight into
//! their channels, so they always arrive before frames handed over later;
//! text answers are gathered per port and sent as one message per port per
//! batch.
//!
//! What a batch promised waits for its job log ([`Outbox::flush_after`],
//! [`super::release`]): the acceptance REPLYs ([`OutMsg::Accepted`]) and the
//! answers to SCHEDs that stored a job ([`TextReply::stored`]). Every later
//! answer to such a text connection waits too while one of its answers is
//! held ([`Held`]), so each connection's answers keep their order (the text
//! front end matches them to commands by order). Everything else leaves
//! at once: frames for workers (a job may run before its record is
//! durable: at least once, never lost), ERRORs (a producer refused while
//! the log is faulty hears so at once), heartbeats, admin answers, and a
//! consumer's `WANT?`, `NOPE` and answers to its ACK/DCL/DEL (a task
//! offered before its record is durable can be lost in a power cut only if
//! no producer was told it was stored).

use std::collections::VecDeque;
use std::sync::Arc;

use crossbeam_channel::Sender;

use parking_lot::Mutex;

use super::release::{Release, Releaser};
use crate::broker::egress::{Dest, OutMsg, Outgoing};
use crate::broker::inbox::ShardMsg;
use crate::broker::outbox::Outbox;
use crate::broker::text_port::{TextOutcome, TextPort, TextReply};
use crate::ids::{ConnId, FastMap, PeerId};
use crate::joblog::{Durable, StoreFault, Ticket};
use crate::protocol::emqp::{Command, Message};
use crate::protocol::text::ErrorCode;
use crate::zmq_io::egress::EgressTx;

/// The router's [`Outbox`] for one shard thread.
pub struct ShardOutbox {
    index: usize,
    egress: EgressTx,
    shards: Arc<[Sender<ShardMsg>]>,
    /// Frames gathered since the last flush.
    emqp: Vec<Outgoing>,
    text: Vec<(TextPort, Vec<TextReply>)>,
    /// Where promised output waits for the log.
    releaser: Releaser,
    /// What was handed to the releaser and not yet released.
    held: Arc<Mutex<Waiting>>,
    /// The highest ticket handed to the releaser.
    last: Option<Ticket>,
    /// The log's durable point and state.
    durable: Arc<dyn Durable>,
}

/// Per text connection, how many of its answers wait for the log; a
/// connection is in the map only while that is above zero, so the map
/// holds at most one entry per open connection.
#[derive(Debug, Default)]
pub struct Held(FastMap<ConnId, usize>);

impl Held {
    /// Splits one port's answers, in order, into those that may leave now
    /// and those that wait for the log: a stored SCHED's answer waits when
    /// the batch `promised` something, and so does every later answer to a
    /// connection with one waiting (counted here until [`Held::released`]).
    pub fn split(&mut self, replies: Vec<TextReply>, promised: bool) -> (Vec<TextReply>, Vec<TextReply>) {
        let (mut now, mut later) = (Vec::new(), Vec::new());
        for reply in replies {
            if (promised && reply.stored) || self.0.contains_key(&reply.conn) {
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

/// What waits for the log: text answers by connection, frontend frames by
/// client.
#[derive(Debug, Default)]
pub struct Waiting {
    /// Text connections.
    pub conns: Held,
    /// eMQP frontend peers with frames waiting, per release handed over
    /// (its number, its peers). A list rather than a map: every acceptance
    /// waits and is recorded here (a copy of its peer, no hashing), while
    /// a frame that is not an acceptance, the only one that must look,
    /// is rare on the frontend.
    peers: VecDeque<(u64, Vec<PeerId>)>,
    /// The number of the next release.
    next: u64,
}

impl Waiting {
    /// Whether no frontend frame waits.
    pub fn no_peers(&self) -> bool {
        self.peers.is_empty()
    }

    /// Whether a frame for `peer` waits in a release handed over.
    fn peer_waits(&self, peer: &PeerId) -> bool {
        self.peers.iter().any(|(_, ps)| ps.contains(peer))
    }

    /// Splits a batch's frames, in order, into those that may leave now
    /// and those that wait: an acceptance REPLY when the batch `promised`,
    /// and every later frontend frame to a client with a frame waiting,
    /// unless the log is `faulty`: then only acceptances wait (refusals and
    /// heartbeats leave at once rather than behind acknowledgements that
    /// wait for a repair; each names its msgid). Frames for workers and
    /// admin peers never wait.
    fn split(
        &mut self,
        frames: Vec<Outgoing>,
        promised: bool,
        faulty: bool,
    ) -> (Vec<Outgoing>, Vec<Outgoing>, Vec<PeerId>) {
        let (mut now, mut later, mut peers) = (Vec::new(), Vec::new(), Vec::<PeerId>::new());
        for o in frames {
            let wait = o.dest == Dest::Frontend
                && if promised && matches!(o.msg, OutMsg::Accepted(_)) {
                    true
                } else {
                    !faulty && (peers.contains(&o.peer) || (!self.peers.is_empty() && self.peer_waits(&o.peer)))
                };
            if wait {
                peers.push(o.peer.clone());
                later.push(o);
            } else {
                now.push(o);
            }
        }
        (now, later, peers)
    }
}

impl ShardOutbox {
    /// The outbox of shard `index`, releasing promised output through
    /// `releaser` as its log's `durable` says.
    pub fn new(
        index: usize,
        egress: EgressTx,
        shards: Arc<[Sender<ShardMsg>]>,
        releaser: Releaser,
        durable: Arc<dyn Durable>,
    ) -> ShardOutbox {
        let held = Arc::default();
        ShardOutbox { index, egress, shards, emqp: Vec::new(), text: Vec::new(), releaser, held, last: None, durable }
    }

    /// Hands over now what need not wait, and returns the rest as one
    /// release (`None` when nothing waits): what the batch `promised`
    /// (acceptances, stored SCHEDs' answers), and every later message to a
    /// client or connection with a message waiting ([`Waiting`]).
    fn split(&mut self, promised: bool) -> Option<Release> {
        let (emqp_now, emqp_later, text_now, text_later, number) = {
            let mut held = self.held.lock();
            if !promised && held.no_peers() && held.conns.is_empty() {
                (std::mem::take(&mut self.emqp), Vec::new(), std::mem::take(&mut self.text), Vec::new(), None)
            } else {
                let faulty = self.durable.faulty();
                let (now, later, peers) = held.split(std::mem::take(&mut self.emqp), promised, faulty);
                let number = (!peers.is_empty()).then(|| {
                    let n = held.next;
                    held.next += 1;
                    held.peers.push_back((n, peers));
                    n
                });
                let (mut text_now, mut text_later) = (Vec::new(), Vec::new());
                for (port, replies) in std::mem::take(&mut self.text) {
                    let (go, wait) = held.conns.split(replies, promised);
                    if !go.is_empty() {
                        text_now.push((port.clone(), go));
                    }
                    if !wait.is_empty() {
                        text_later.push((port, wait));
                    }
                }
                (now, later, text_now, text_later, number)
            }
        };
        release(self.index, &self.egress, emqp_now, text_now);
        if emqp_later.is_empty() && text_later.is_empty() {
            return None;
        }
        let (index, egress, held) = (self.index, self.egress.clone(), self.held.clone());
        let durable = self.durable.clone();
        Some(Box::new(move |refusal: Option<StoreFault>| {
            let conns: Vec<ConnId> = text_later.iter().flat_map(|(_, r)| r.iter().map(|r| r.conn)).collect();
            let (emqp_later, text_later) = match refusal {
                None => (emqp_later, text_later),
                Some(fault) => {
                    let (emqp, text, refused) = refuse(fault, emqp_later, text_later);
                    durable.note_refused(refused);
                    (emqp, text)
                }
            };
            release(index, &egress, emqp_later, text_later);
            // After the hand-over, so a later message to one of these
            // cannot overtake them.
            let mut held = held.lock();
            if !conns.is_empty() {
                held.conns.released(conns);
            }
            if let Some(n) = number {
                // Releases run in order: it is the first still held.
                match held.peers.front() {
                    Some((i, _)) if *i == n => {
                        held.peers.pop_front();
                    }
                    _ => held.peers.retain(|(i, _)| *i != n),
                }
            }
        }))
    }
}

/// Text answers by port.
type PortReplies = Vec<(TextPort, Vec<TextReply>)>;

/// What a release promised, refused with `fault`'s code (the log gave up
/// on its batch): each acceptance REPLY becomes an ERROR naming the
/// REQUEST's msgid, each stored SCHED's answer `ERR <code>`; everything
/// else goes as it was. Returns the refused output and how many jobs it
/// refused.
fn refuse(fault: StoreFault, emqp: Vec<Outgoing>, text: PortReplies) -> (Vec<Outgoing>, PortReplies, u64) {
    let mut refused = 0;
    let emqp = emqp
        .into_iter()
        .map(|o| match o.msg {
            OutMsg::Accepted(frames) => {
                refused += 1;
                let command = Command::Error {
                    refers_to: frames.msgid().to_vec(),
                    code: fault.code().as_bytes().to_vec(),
                    text: crate::joblog::NOT_CONFIRMED.as_bytes().to_vec(),
                };
                Outgoing { msg: OutMsg::Frames(Message::new(command).encode()), ..o }
            }
            _ => o,
        })
        .collect();
    let code = match fault {
        StoreFault::Full => ErrorCode::StoreFull,
        StoreFault::Failed => ErrorCode::StoreFailed,
    };
    let text = text
        .into_iter()
        .map(|(port, replies)| {
            let replies = replies
                .into_iter()
                .map(|mut r| {
                    if r.stored {
                        refused += 1;
                        r.outcome = TextOutcome::NotConfirmed(code);
                        r.stored = false;
                    }
                    r
                })
                .collect();
            (port, replies)
        })
        .collect();
    (emqp, text, refused)
}

/// Hands frames to the I/O thread and answers to text ports.
fn release(index: usize, egress: &EgressTx, emqp: Vec<Outgoing>, text: Vec<(TextPort, Vec<TextReply>)>) {
    if !emqp.is_empty() {
        egress.send_batch(emqp);
    }
    for (port, replies) in text {
        // Only a stopped text front end no longer reads its port.
        let _ = port.send(index, replies);
    }
}

impl Outbox for ShardOutbox {
    fn emqp(&mut self, out: Outgoing) {
        self.emqp.push(out);
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

    /// Nothing the batch promised waits for the log; messages to clients
    /// and connections with messages held still wait behind them.
    fn flush(&mut self) {
        self.releaser.poll();
        if let Some(rel) = self.split(false) {
            self.releaser.submit(None, rel);
        }
    }

    /// Hands the ticket over also with nothing promised, once per new
    /// ticket while the log is healthy: the log is then synced for the
    /// batch's other records too (a job's end, synced promptly, does not
    /// come back after a power cut). Not while it is faulty: nothing is
    /// synced until the repair, which makes every ticket durable.
    fn flush_after(&mut self, ticket: Ticket) {
        self.releaser.poll();
        let rel = match self.split(true) {
            Some(rel) => rel,
            None if self.last.is_some_and(|t| t >= ticket) || self.durable.faulty() => return,
            None => Box::new(|_| {}),
        };
        self.last = self.last.max(Some(ticket));
        self.releaser.submit(Some(ticket), rel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(conn: u64, outcome: TextOutcome, stored: bool) -> TextReply {
        TextReply { conn: ConnId(conn), outcome, stored }
    }

    fn split_text(held: &mut Held, replies: Vec<TextReply>) -> (Vec<TextReply>, Vec<TextReply>) {
        held.split(replies, true)
    }

    fn conns(replies: &[TextReply]) -> Vec<u64> {
        replies.iter().map(|r| r.conn.0).collect()
    }

    /// A stored SCHED whose batch was given up is answered "not
    /// confirmed" (it may run), not as a refusal that changed nothing;
    /// other answers go as they were.
    #[test]
    fn a_given_up_sched_is_answered_not_confirmed() {
        let (tx, _rx) = crossbeam_channel::unbounded();
        let port = TextPort { id: 1, tx, wake: None };
        let replies = vec![reply(1, TextOutcome::Done, true), reply(2, TextOutcome::Nope, false)];
        let (_, text, refused) = refuse(StoreFault::Failed, Vec::new(), vec![(port, replies)]);
        assert_eq!(refused, 1);
        let outcomes: Vec<(TextOutcome, bool)> = text[0].1.iter().map(|r| (r.outcome.clone(), r.stored)).collect();
        assert_eq!(outcomes, [(TextOutcome::NotConfirmed(ErrorCode::StoreFailed), false), (TextOutcome::Nope, false)]);
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
        let (now, later) = split_text(&mut held, batch);
        assert_eq!(conns(&now), [1, 1, 3], "consumers' answers leave at once");
        assert_eq!(conns(&later), [2, 2], "the producer's SCHED and what follows it wait");
        // A later batch: connection 2 still has answers waiting.
        let (now, later) =
            split_text(&mut held, vec![reply(2, TextOutcome::Nope, false), reply(1, TextOutcome::Nope, false)]);
        assert_eq!((conns(&now), conns(&later)), (vec![1], vec![2]));
        assert_eq!(held.len(), 1);
        // Released: the first two, then the third.
        held.released([ConnId(2), ConnId(2)]);
        assert_eq!(held.len(), 1, "one answer of connection 2 still waits");
        let (_, later) = split_text(&mut held, vec![reply(2, TextOutcome::Nope, false)]);
        assert_eq!(conns(&later), [2]);
        held.released([ConnId(2), ConnId(2)]);
        assert!(held.is_empty(), "forgotten once nothing waits");
        let (now, later) = split_text(&mut held, vec![reply(2, TextOutcome::Nope, false)]);
        assert_eq!((conns(&now), conns(&later)), (vec![2], vec![]));
    }

    /// A log whose durable point the test moves by hand.
    #[derive(Default)]
    struct Hand(std::sync::atomic::AtomicU64, std::sync::atomic::AtomicBool);

    impl crate::joblog::Durable for Hand {
        fn faulty(&self) -> bool {
            self.1.load(std::sync::atomic::Ordering::Acquire)
        }
        fn make_durable(&self, upto: Ticket) -> bool {
            self.0.load(std::sync::atomic::Ordering::Acquire) >= upto.0
        }
        fn wait(&self, upto: Ticket, timeout: std::time::Duration) -> bool {
            std::thread::sleep(timeout.min(std::time::Duration::from_millis(2)));
            self.make_durable(upto)
        }
        fn durable_upto(&self) -> Ticket {
            Ticket(self.0.load(std::sync::atomic::Ordering::Acquire))
        }
    }

    fn frames_of(egress: &crate::zmq_io::egress::EgressRx) -> Vec<Vec<u8>> {
        let mut words = Vec::new();
        while let Some(e) = egress.try_recv() {
            if let crate::zmq_io::egress::Egress::Send(batch) = e {
                words.extend(batch.iter().map(|o| o.frames()[2].clone()));
            }
        }
        words
    }

    #[test]
    fn acceptances_and_stored_scheds_wait_for_the_log_and_nothing_else_does() {
        for threaded in [false, true] {
            let hand = Arc::new(Hand::default());
            let releaser =
                if threaded { Releaser::thread(0, hand.clone()).unwrap() } else { Releaser::inline(hand.clone()) };
            let (egress, egress_rx) = crate::zmq_io::egress::channel().expect("eventfd");
            let mut out = ShardOutbox::new(0, egress, Arc::from(Vec::new()), releaser, hand.clone());
            let (tx, port_rx) = crossbeam_channel::unbounded();
            let port = TextPort { id: 1, tx, wake: None };
            let next = || port_rx.recv_timeout(std::time::Duration::from_secs(5)).expect("an answer batch");
            let frames = crate::job::JobFrames::new(b"m", b"q", b"", b"x", &[] as &[&[u8]]).unwrap();
            let to = |peer: &[u8], msg| Outgoing {
                dest: crate::broker::egress::Dest::Frontend,
                peer: crate::ids::PeerId::from(peer),
                msg,
                on_fail: crate::broker::egress::OnFail::Count,
            };
            let error = || {
                use crate::protocol::emqp::{Command, Message};
                let refused =
                    Command::Error { refers_to: b"m2".to_vec(), code: b"STORE_FULL".to_vec(), text: Vec::new() };
                OutMsg::Frames(Message::new(refused).encode())
            };
            // A batch that promised: an acceptance and a stored SCHED; an
            // ERROR to another producer and a consumer's NOPE with them.
            out.emqp(to(b"client", OutMsg::Accepted(frames.clone())));
            out.emqp(to(b"other", error()));
            out.text(&port, reply(1, TextOutcome::Done, true));
            out.text(&port, reply(2, TextOutcome::Nope, false));
            out.flush_after(Ticket(10));
            assert_eq!(frames_of(&egress_rx), [b"ERROR".to_vec()], "the ERROR leaves at once (threaded {threaded})");
            assert_eq!(conns(&next().replies), [2], "the consumer's NOPE leaves at once");
            // A batch that promised nothing: the producer's next answer waits behind its held one.
            out.text(&port, reply(1, TextOutcome::Nope, false));
            out.text(&port, reply(2, TextOutcome::Nope, false));
            // An ERROR to the client whose acceptance waits keeps its order.
            out.emqp(to(b"client", error()));
            out.flush();
            assert_eq!(conns(&next().replies), [2]);
            std::thread::sleep(std::time::Duration::from_millis(20));
            out.flush();
            assert!(port_rx.try_recv().is_err(), "the producer's answers wait");
            assert!(frames_of(&egress_rx).is_empty(), "the acceptance waits");
            assert_eq!(out.held.lock().conns.len(), 1);
            hand.0.store(10, std::sync::atomic::Ordering::Release);
            out.flush();
            assert_eq!(conns(&next().replies), [1], "its stored SCHED first");
            assert_eq!(conns(&next().replies), [1], "then its later answer");
            let t0 = std::time::Instant::now();
            let mut words = Vec::new();
            while words.is_empty() && t0.elapsed() < std::time::Duration::from_secs(5) {
                words = frames_of(&egress_rx);
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            while words.len() < 2 && t0.elapsed() < std::time::Duration::from_secs(5) {
                words.extend(frames_of(&egress_rx));
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            assert_eq!(
                words,
                [b"REPLY".to_vec(), b"ERROR".to_vec()],
                "the acceptance once the log holds it, then its client's ERROR"
            );
            while !(out.held.lock().conns.is_empty() && out.held.lock().no_peers())
                && t0.elapsed() < std::time::Duration::from_secs(5)
            {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            assert!(out.held.lock().conns.is_empty() && out.held.lock().no_peers(), "nothing waits once released");
        }
    }

    #[test]
    fn while_the_log_is_faulty_refusals_do_not_wait_behind_acceptances() {
        let hand = Arc::new(Hand::default());
        let releaser = Releaser::inline(hand.clone());
        let (egress, egress_rx) = crate::zmq_io::egress::channel().expect("eventfd");
        let mut out = ShardOutbox::new(0, egress, Arc::from(Vec::new()), releaser, hand.clone());
        let frames = crate::job::JobFrames::new(b"m", b"q", b"", b"x", &[] as &[&[u8]]).unwrap();
        let to = |msg| Outgoing {
            dest: crate::broker::egress::Dest::Frontend,
            peer: crate::ids::PeerId::from(&b"client"[..]),
            msg,
            on_fail: crate::broker::egress::OnFail::Count,
        };
        let error = || {
            use crate::protocol::emqp::{Command, Message};
            let refused = Command::Error { refers_to: b"m2".to_vec(), code: b"STORE_FULL".to_vec(), text: Vec::new() };
            OutMsg::Frames(Message::new(refused).encode())
        };
        out.emqp(to(OutMsg::Accepted(frames)));
        out.flush_after(Ticket(10));
        // Healthy: the client's next ERROR keeps its order.
        out.emqp(to(error()));
        out.flush();
        assert!(frames_of(&egress_rx).is_empty());
        // Faulty: its refusals leave at once; nothing more is handed over
        // for a ticket that cannot become durable before the repair.
        hand.1.store(true, std::sync::atomic::Ordering::Release);
        out.emqp(to(error()));
        out.flush_after(Ticket(11));
        assert_eq!(frames_of(&egress_rx), [b"ERROR".to_vec()]);
        hand.1.store(false, std::sync::atomic::Ordering::Release);
        hand.0.store(11, std::sync::atomic::Ordering::Release);
        out.flush();
        assert_eq!(
            frames_of(&egress_rx),
            [b"REPLY".to_vec(), b"ERROR".to_vec()],
            "the held ones once durable, in order"
        );
    }

    #[test]
    fn a_refused_sched_waits_only_behind_held_answers() {
        let mut held = Held::default();
        let refused = TextOutcome::Refused(crate::protocol::text::ErrorCode::ShuttingDown);
        let (now, _) = split_text(&mut held, vec![reply(7, refused.clone(), false)]);
        assert_eq!(conns(&now), [7], "nothing stored, nothing promised");
        let (now, later) = split_text(&mut held, vec![reply(7, TextOutcome::Done, true), reply(7, refused, false)]);
        assert_eq!((conns(&now), conns(&later)), (vec![], vec![7, 7]), "its ERR follows its stored SCHED");
        held.released([ConnId(1)]);
        assert_eq!(held.len(), 1, "releasing another connection changes nothing");
    }
}
