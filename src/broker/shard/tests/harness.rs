//! [`Harness`]: shards driven by hand. Messages go where the router's I/O
//! thread and text front end would send them; messages between shards are
//! delivered in a deterministic order (or a seeded random one, to explore
//! interleavings); time only moves with [`Harness::advance`].

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::broker::counts::QueueCounts;
use crate::broker::msg::{
    Dest, Outgoing, ShardMsg, TextAnswer, TextCmd, TextOutcome, TextPort, TextReply, TextRequest, VecOutbox,
};
use crate::broker::shard::{Shard, ShardContext};
use crate::broker::types::{shard_of, NewJob, Origin};
use crate::config::RouterConfig;
use crate::ids::{ConnId, MsgId, OfferId, PeerId, QueueName};
use crate::protocol::emqp::{decode, Command, Frame, Message, Socket};
use crate::protocol::text::ErrorCode;

/// Shards under test with their inboxes, outputs and clock.
pub struct Harness {
    /// The shards, by index.
    pub shards: Vec<Shard>,
    /// Messages waiting for each shard.
    pub inbox: Vec<VecDeque<ShardMsg>>,
    /// Frames sent to peers, in order, not yet taken.
    pub emqp: Vec<Outgoing>,
    /// Text answers not yet taken.
    pub text: Vec<TextReply>,
    /// The clock.
    pub now: Instant,
    /// What the shards share (counters, draining flag).
    pub ctx: ShardContext,
    /// Picks the next shard to run when several have messages: `None` runs
    /// the lowest index first; `Some(seed)` a reproducible random one.
    pub seed: Option<u64>,
    port: TextPort,
    port_rx: crossbeam_channel::Receiver<Vec<TextReply>>,
}

impl Harness {
    /// `shards` shards on the default configuration.
    pub fn new(shards: usize) -> Harness {
        Harness::with_config(shards, |_| {})
    }

    /// `shards` shards on the default configuration changed by `edit`.
    pub fn with_config(shards: usize, edit: impl FnOnce(&mut RouterConfig)) -> Harness {
        let mut config = RouterConfig { shards, ..RouterConfig::default() };
        edit(&mut config);
        let now = Instant::now();
        let ctx = ShardContext::new(Arc::new(config), shards, now);
        let (tx, port_rx) = crossbeam_channel::unbounded();
        Harness {
            shards: (0..shards).map(|i| Shard::new(i, ctx.clone(), now)).collect(),
            inbox: (0..shards).map(|_| VecDeque::new()).collect(),
            emqp: Vec::new(),
            text: Vec::new(),
            now,
            ctx,
            seed: None,
            port: TextPort { id: 1, tx },
            port_rx,
        }
    }

    /// The shard that owns `key` (a queue name or a worker identity).
    pub fn shard_of(&self, key: &str) -> usize {
        shard_of(key.as_bytes(), self.shards.len())
    }

    /// Delivers `msg` to shard `index`, then runs every shard until idle.
    pub fn send(&mut self, index: usize, msg: ShardMsg) {
        self.inbox[index].push_back(msg);
        self.run();
    }

    /// Handles queued messages until every inbox is empty.
    pub fn run(&mut self) {
        while let Some(i) = self.pick() {
            let Some(msg) = self.inbox[i].pop_front() else { continue };
            let mut out = VecOutbox::default();
            self.shards[i].handle(msg, self.now, &mut out);
            self.collect(out);
        }
    }

    /// Moves the clock by `d`, fires due timers on every shard, then runs.
    pub fn advance(&mut self, d: Duration) {
        self.now += d;
        for i in 0..self.shards.len() {
            let mut out = VecOutbox::default();
            self.shards[i].fire_timers(self.now, &mut out);
            self.collect(out);
        }
        self.run();
    }

    fn pick(&mut self) -> Option<usize> {
        let busy: Vec<usize> = (0..self.inbox.len()).filter(|&i| !self.inbox[i].is_empty()).collect();
        match (busy.len(), self.seed.as_mut()) {
            (0, _) => None,
            (_, None) => Some(busy[0]),
            (n, Some(seed)) => {
                // xorshift64: reproducible, no dependency.
                *seed ^= *seed << 13;
                *seed ^= *seed >> 7;
                *seed ^= *seed << 17;
                Some(busy[(*seed % n as u64) as usize])
            }
        }
    }

    fn collect(&mut self, out: VecOutbox) {
        self.emqp.extend(out.emqp);
        for (index, msg) in out.shards {
            self.inbox[index].push_back(msg);
        }
        self.text.extend(out.text.into_iter().map(|(_, reply)| reply));
        while let Ok(replies) = self.port_rx.try_recv() {
            self.text.extend(replies);
        }
    }

    /// INFORM from worker `id` serving `queues` (`(weight, name)`).
    pub fn inform(&mut self, id: &str, queues: &[(i64, &str)]) {
        let queues = queues.iter().map(|(w, q)| (*w, QueueName::named(q))).collect();
        let msg = ShardMsg::WorkerInform { id: peer(id), msgid: MsgId(format!("inform-{id}").into_bytes()), queues };
        self.send(self.shard_of(id), msg);
    }

    /// `n` READYs from worker `id`.
    pub fn ready(&mut self, id: &str, n: usize) {
        for _ in 0..n {
            self.send(self.shard_of(id), ShardMsg::WorkerReady { id: peer(id) });
        }
    }

    /// A job-result REPLY from worker `id` for `msgid`.
    pub fn reply(&mut self, id: &str, msgid: &str) {
        self.reply_failed(id, msgid, false);
    }

    /// A job-result REPLY from worker `id` for `msgid`, `failed` or not.
    pub fn reply_failed(&mut self, id: &str, msgid: &str, failed: bool) {
        let msg = ShardMsg::WorkerReply { id: peer(id), request_msgid: MsgId(msgid.as_bytes().to_vec()), failed };
        self.send(self.shard_of(id), msg);
    }

    /// A HEARTBEAT from worker `id`.
    pub fn heartbeat(&mut self, id: &str) {
        self.send(self.shard_of(id), ShardMsg::WorkerHeartbeat { id: peer(id) });
    }

    /// A KBYE from worker `id`.
    pub fn kbye(&mut self, id: &str) {
        self.send(self.shard_of(id), ShardMsg::WorkerKbye { id: peer(id) });
    }

    /// A REQUEST from client `client` with `msgid` for `queue`.
    pub fn request(&mut self, client: &str, msgid: &str, queue: &str, body: &str) {
        let job = NewJob {
            msgid: MsgId(msgid.as_bytes().to_vec()),
            queue_frame: queue.as_bytes().to_vec(),
            headers: b"guarantee".to_vec(),
            body: body.as_bytes().to_vec(),
            extra: Vec::new(),
            origin: Origin::Emqp(peer(client)),
        };
        let msg = ShardMsg::Request { queue: QueueName::named(queue), job, fallback_done: false };
        self.send(self.shard_of(queue), msg);
    }

    /// A text command from connection `conn` to shard `index`; its answer.
    pub fn text_cmd(&mut self, index: usize, conn: u64, cmd: TextCmd) -> Option<TextOutcome> {
        let before = self.text.len();
        let msg = ShardMsg::Text { port: self.port.clone(), cmds: vec![TextRequest { conn: ConnId(conn), cmd }] };
        self.send(index, msg);
        let reply = self.text.drain(before..).find(|r| r.conn == ConnId(conn));
        reply.map(|r| r.outcome)
    }

    /// `SCHED data@queue` from `conn`.
    pub fn text_sched(&mut self, conn: u64, queue: &str, data: &str) -> TextOutcome {
        let cmd = TextCmd::Sched { queue: QueueName::named(queue), data: data.as_bytes().to_vec() };
        self.text_cmd(self.shard_of(queue), conn, cmd).expect("SCHED is answered")
    }

    /// `ASK queue` from `conn`.
    pub fn text_ask(&mut self, conn: u64, queue: &str) -> TextOutcome {
        let cmd = TextCmd::Ask { queue: QueueName::named(queue) };
        self.text_cmd(self.shard_of(queue), conn, cmd).expect("ASK is answered")
    }

    /// `ACK`, `DCL` or `DEL` of `offer` from `conn`.
    pub fn text_answer(&mut self, conn: u64, offer: OfferId, answer: TextAnswer) -> TextOutcome {
        self.text_cmd(offer.shard, conn, TextCmd::Answer { offer, answer }).expect("an answer is answered")
    }

    /// The connection `conn` ended holding `offer`.
    pub fn text_release(&mut self, conn: u64, offer: OfferId) {
        assert_eq!(self.text_cmd(offer.shard, conn, TextCmd::Release { offer }), None, "release is not answered");
    }

    /// Bodies of the jobs waiting in `queue`, front first.
    pub fn waiting(&self, queue: &str) -> Vec<String> {
        let shard = &self.shards[self.shard_of(queue)];
        shard.queues.jobs(&QueueName::named(queue)).map(|j| String::from_utf8_lossy(&j.body).into_owned()).collect()
    }

    /// Msgids of the jobs in flight on worker `id`, in dispatch order.
    pub fn inflight(&self, id: &str) -> Vec<String> {
        let shard = &self.shards[self.shard_of(id)];
        let mut jobs: Vec<_> = shard.workers.inflight().filter(|(w, _)| w.0 == id.as_bytes()).map(|(_, f)| f).collect();
        jobs.sort_by_key(|f| f.seq);
        jobs.iter().map(|f| String::from_utf8_lossy(&f.job.msgid.0).into_owned()).collect()
    }

    /// The counts of `queue` on the shard that owns it.
    pub fn counts(&self, queue: &str) -> QueueCounts {
        let snap = self.shards[self.shard_of(queue)].snapshot(self.now);
        snap.queues.iter().find(|q| q.name == queue).map(|q| q.counts).unwrap_or_default()
    }

    /// Free slots of worker `id` (0 when unknown).
    pub fn slots(&self, id: &str) -> i64 {
        let shard = &self.shards[self.shard_of(id)];
        let snap = shard.workers.snaps(self.now, self.now);
        snap.iter().find(|w| w.id == id).map_or(0, |w| w.slots)
    }

    /// Takes the frames sent to `peer` so far (any socket).
    pub fn take_to(&mut self, peer_id: &str) -> Vec<Outgoing> {
        let (mine, rest) = std::mem::take(&mut self.emqp).into_iter().partition(|o| o.peer.0 == peer_id.as_bytes());
        self.emqp = rest;
        mine
    }

    /// The command words sent to `peer` so far, taken.
    pub fn take_commands(&mut self, peer_id: &str) -> Vec<String> {
        self.take_to(peer_id).iter().map(|o| String::from_utf8_lossy(&o.frames[2]).into_owned()).collect()
    }

    /// The REQUESTs sent to worker `id` so far, taken (other frames dropped).
    pub fn take_requests(&mut self, id: &str) -> Vec<Message> {
        self.take_to(id)
            .into_iter()
            .filter(|o| o.dest == Dest::Backend && o.frames[2] == b"REQUEST")
            .map(|o| decode(&o.frames, Socket::WorkerSide).expect("a REQUEST decodes"))
            .collect()
    }
}

/// A peer identity from text.
pub fn peer(id: &str) -> PeerId {
    PeerId(id.as_bytes().to_vec())
}

/// The body of a REQUEST message.
pub fn body(m: &Message) -> String {
    match &m.command {
        Command::Request { body, .. } => String::from_utf8_lossy(body).into_owned(),
        other => panic!("not a REQUEST: {other:?}"),
    }
}

/// The REQUEST's headers.
pub fn headers(m: &Message) -> Frame {
    match &m.command {
        Command::Request { headers, .. } => headers.clone(),
        other => panic!("not a REQUEST: {other:?}"),
    }
}

/// `TextOutcome::Done`.
pub fn done() -> TextOutcome {
    TextOutcome::Done
}

/// `TextOutcome::Refused(code)`.
pub fn refused(code: ErrorCode) -> TextOutcome {
    TextOutcome::Refused(code)
}

/// The id of an offer outcome.
pub fn offer_id(o: &TextOutcome) -> Option<OfferId> {
    match o {
        TextOutcome::Offer { id, .. } => Some(*id),
        _ => None,
    }
}
