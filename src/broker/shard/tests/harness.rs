//! [`Harness`]: shards driven by hand. Messages go where the router's I/O
//! thread and text front end would send them; messages between shards are
//! delivered in a deterministic order (or a seeded random one, to explore
//! interleavings); time only moves with [`Harness::advance`].

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::broker::counts::QueueCounts;
use crate::broker::egress::{Dest, OutMsg, Outgoing};
use crate::broker::inbox::{Schedule, ShardMsg};
use crate::broker::outbox::VecOutbox;
use crate::broker::shard::{Shard, ShardContext};
use crate::broker::text_port::{TextAnswer, TextBatch, TextCmd, TextOutcome, TextPort, TextReply, TextRequest};
use crate::broker::types::shard_of;
use crate::config::RouterConfig;
use crate::ids::{ConnId, MsgId, OfferId, PeerId, QueueName};
use crate::job::JobFrames;
use crate::protocol::emqp::{decode, Command, Frame, Message, ScheduleBody, Socket};
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
    port_rx: crossbeam_channel::Receiver<TextBatch>,
    /// The write-ahead logs' shared parts, shard by shard, once
    /// `attach_logs` gave the shards real logs (figures for the tests).
    pub wals: Vec<Arc<crate::wal::shared::WalShared>>,
}

impl Harness {
    /// `shards` shards on the default configuration.
    pub fn new(shards: usize) -> Harness {
        Harness::with_config(shards, |_| {})
    }

    /// `shards` shards on the default configuration changed by `edit`.
    pub fn with_config(shards: usize, edit: impl FnOnce(&mut RouterConfig)) -> Harness {
        // The unknown-queue rule from the first instant; tests of the grace set it.
        let mut config = RouterConfig { shards, queue_learn_grace: Duration::ZERO, ..RouterConfig::default() };
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
            port: TextPort { id: 1, tx, wake: None },
            port_rx,
            wals: Vec::new(),
        }
    }

    /// Every setup a test runs on: 1 shard, 3 shards, 3 shards with a
    /// seeded interleaving; each on the default configuration changed by
    /// `edit`.
    pub fn setups(edit: impl Fn(&mut RouterConfig)) -> Vec<Harness> {
        let setups = [(1, None), (3, None), (3, Some(0x5eed))];
        setups
            .into_iter()
            .map(|(shards, seed)| {
                let mut h = Harness::with_config(shards, &edit);
                h.seed = seed;
                h
            })
            .collect()
    }

    /// What [`Harness::setups`] this is, for assertion messages.
    pub fn setup(&self) -> String {
        format!("{} shards, seed {:?}", self.shards.len(), self.seed)
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

    /// Puts `msg` in shard `index`'s inbox without handling anything.
    pub fn post(&mut self, index: usize, msg: ShardMsg) {
        self.inbox[index].push_back(msg);
    }

    /// Handles the next message in shard `index`'s inbox only (what it
    /// sends other shards waits in their inboxes); false when it was empty.
    pub fn step(&mut self, index: usize) -> bool {
        let Some(msg) = self.inbox[index].pop_front() else { return false };
        let mut out = VecOutbox::default();
        self.shards[index].handle(msg, self.now, &mut out);
        self.collect(out);
        true
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
        while let Ok(batch) = self.port_rx.try_recv() {
            self.text.extend(batch.replies);
        }
    }

    /// INFORM from worker `id` serving `queues` (`(weight, name)`).
    pub fn inform(&mut self, id: &str, queues: &[(i64, &str)]) {
        let queues = queues.iter().map(|(w, q)| (*w, QueueName::named(q))).collect();
        let msg =
            ShardMsg::WorkerInform { id: peer(id), msgid: MsgId::from(format!("inform-{id}").into_bytes()), queues };
        self.send(self.shard_of(id), msg);
    }

    /// `n` READYs from worker `id`.
    pub fn ready(&mut self, id: &str, n: usize) {
        for _ in 0..n {
            self.send(self.shard_of(id), ShardMsg::WorkerReady { id: peer(id) });
        }
    }

    /// An UNREADY from worker `id` (msgid `msgid`).
    pub fn unready(&mut self, id: &str, msgid: &str) {
        let msg = ShardMsg::WorkerUnready { id: peer(id), msgid: MsgId::from(msgid.as_bytes()) };
        self.send(self.shard_of(id), msg);
    }

    /// A job-result REPLY from worker `id` for `msgid`.
    pub fn reply(&mut self, id: &str, msgid: &str) {
        self.reply_failed(id, msgid, false);
    }

    /// A job-result REPLY from worker `id` for `msgid`, `failed` or not.
    pub fn reply_failed(&mut self, id: &str, msgid: &str, failed: bool) {
        let msg = ShardMsg::WorkerReply { id: peer(id), request_msgid: MsgId::from(msgid.as_bytes()), failed };
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

    /// A REQUEST from client `client` with `msgid` for `queue`, headers
    /// `guarantee` and no extra frames.
    pub fn request(&mut self, client: &str, msgid: &str, queue: &str, body: &str) {
        self.request_with(client, msgid, queue, body, b"guarantee", &[]);
    }

    /// A REQUEST with the given headers (frame 5) and frames after the body.
    pub fn request_with(
        &mut self,
        client: &str,
        msgid: &str,
        queue: &str,
        body: &str,
        headers: &[u8],
        extra: &[&[u8]],
    ) {
        let frames = JobFrames::new(msgid.as_bytes(), queue.as_bytes(), headers, body.as_bytes(), extra)
            .expect("frames within limits");
        let msg = ShardMsg::Request { client: peer(client), frames, fallback_done: false };
        self.send(self.shard_of(queue), msg);
    }

    /// Sending a job with `msgid` to worker `id` failed (its current
    /// registration; nothing when it has none).
    pub fn send_failed(&mut self, id: &str, msgid: &str, unreachable: bool) {
        let Some(key) = self.key_of(id) else { return };
        let msg = ShardMsg::SendFailed { key, msgid: MsgId::from(msgid.as_bytes()), unreachable };
        self.send(self.shard_of(id), msg);
    }

    /// INFORM from scheduler `id` (shard 0).
    pub fn scheduler_inform(&mut self, id: &str) {
        self.send(
            0,
            ShardMsg::SchedulerInform {
                id: peer(id),
                msgid: MsgId::from(format!("inform-{id}").into_bytes()),
                name: None,
            },
        );
    }

    /// A HEARTBEAT from frontend peer `id` (shard 0).
    pub fn scheduler_heartbeat(&mut self, id: &str) {
        self.send(
            0,
            ShardMsg::SchedulerHeartbeat { id: peer(id), msgid: MsgId::from(format!("hb-{id}").into_bytes()) },
        );
    }

    /// A KBYE from frontend peer `id` (shard 0).
    pub fn scheduler_kbye(&mut self, id: &str) {
        self.send(0, ShardMsg::SchedulerKbye { id: peer(id) });
    }

    /// A SCHEDULE (or UNSCHEDULE) from `client` with `msgid` (shard 0);
    /// returns the frames it carries.
    pub fn schedule(&mut self, client: &str, msgid: &str, unschedule: bool) -> Vec<Frame> {
        let frames = schedule_frames(msgid, unschedule);
        let sched = Schedule::from_frames(peer(client), frames.clone()).expect("a SCHEDULE or UNSCHEDULE");
        self.send(0, ShardMsg::Schedule(sched));
        frames
    }

    /// A forward to scheduler `id` failed; `retry` is the SCHEDULE to route
    /// again: `(client, frames)`.
    pub fn scheduler_send_failed(&mut self, id: &str, retry: Option<(&str, Vec<Frame>)>) {
        let retry = retry.and_then(|(client, frames)| Schedule::from_frames(peer(client), frames));
        self.send(0, ShardMsg::SchedulerSendFailed { id: peer(id), retry });
    }

    /// Sets the broker-wide draining flag (shutdown: new work refused).
    pub fn set_draining(&mut self, on: bool) {
        self.ctx.draining.store(on, std::sync::atomic::Ordering::Release);
    }

    /// A text command from connection `conn` to shard `index`; its answer.
    pub fn text_cmd(&mut self, index: usize, conn: u64, cmd: TextCmd) -> Option<TextOutcome> {
        self.text_reply(index, conn, cmd).map(|r| r.outcome)
    }

    /// Puts a text command from connection `conn` in shard `index`'s inbox
    /// without handling anything (its answer, if any, comes when it is
    /// handled: [`Harness::text_answers`]).
    pub fn text_post(&mut self, index: usize, conn: u64, cmd: TextCmd) {
        let msg = ShardMsg::Text { port: self.port.clone(), cmds: vec![TextRequest { conn: ConnId(conn), cmd }] };
        self.post(index, msg);
    }

    /// A text command from connection `conn` to shard `index`; its whole
    /// reply (with [`TextReply::stored`]).
    pub fn text_reply(&mut self, index: usize, conn: u64, cmd: TextCmd) -> Option<TextReply> {
        let before = self.text.len();
        let msg = ShardMsg::Text { port: self.port.clone(), cmds: vec![TextRequest { conn: ConnId(conn), cmd }] };
        self.send(index, msg);
        // Only this command's answer: answers to others (long polls served
        // by it) stay for `text_answers`.
        let at = self.text[before..].iter().position(|r| r.conn == ConnId(conn))?;
        Some(self.text.remove(before + at))
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

    /// `ASK queue ms` (long poll) from `conn`: its answer now, or `None`
    /// while it waits (its answer then shows in [`Harness::text_answers`]).
    pub fn text_ask_wait(&mut self, conn: u64, queue: &str, wait: Duration) -> Option<TextOutcome> {
        let cmd = TextCmd::AskWait { queue: QueueName::named(queue), wait };
        self.text_cmd(self.shard_of(queue), conn, cmd)
    }

    /// The connection `conn` stopped waiting on shard `index` (it closed).
    pub fn text_cancel(&mut self, index: usize, conn: u64) {
        let msg = ShardMsg::Text {
            port: self.port.clone(),
            cmds: vec![TextRequest { conn: ConnId(conn), cmd: TextCmd::Cancel }],
        };
        self.send(index, msg);
    }

    /// Takes the text answers given so far to `conn` (for long polls
    /// answered later), in order.
    pub fn text_answers(&mut self, conn: u64) -> Vec<TextOutcome> {
        let (mine, rest) = std::mem::take(&mut self.text).into_iter().partition(|r| r.conn == ConnId(conn));
        self.text = rest;
        mine.into_iter().map(|r: TextReply| r.outcome).collect()
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
        shard.queues.jobs(queue.as_bytes()).map(|j| String::from_utf8_lossy(j.frames.body()).into_owned()).collect()
    }

    /// Msgids of the jobs in flight on worker `id`, in dispatch order.
    pub fn inflight(&self, id: &str) -> Vec<String> {
        let shard = &self.shards[self.shard_of(id)];
        let mut jobs: Vec<_> =
            shard.workers.inflight().filter(|(w, _)| w.as_bytes() == id.as_bytes()).map(|(_, f)| f).collect();
        jobs.sort_by_key(|f| f.seq);
        jobs.iter().map(|f| String::from_utf8_lossy(f.job.frames.msgid()).into_owned()).collect()
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
        let (mine, rest) =
            std::mem::take(&mut self.emqp).into_iter().partition(|o| o.peer.as_bytes() == peer_id.as_bytes());
        self.emqp = rest;
        mine
    }

    /// The command words sent to `peer` so far, taken.
    pub fn take_commands(&mut self, peer_id: &str) -> Vec<String> {
        self.take_to(peer_id).iter().map(|o| String::from_utf8_lossy(&o.frames()[2]).into_owned()).collect()
    }

    /// The bodies of the REQUESTs sent to worker `id` so far, taken (other
    /// frames dropped).
    pub fn take_bodies(&mut self, id: &str) -> Vec<String> {
        self.take_requests(id).iter().map(body).collect()
    }

    /// The REQUESTs sent to worker `id` so far, taken (other frames dropped).
    pub fn take_requests(&mut self, id: &str) -> Vec<Message> {
        self.take_to(id)
            .into_iter()
            .filter(|o| o.dest == Dest::Backend && matches!(o.msg, OutMsg::Job(_)))
            .map(|o| decode(&o.msg.to_frames(), Socket::WorkerSide).expect("a REQUEST decodes"))
            .collect()
    }
}

/// The frames of a SCHEDULE (or UNSCHEDULE) with `msgid`.
pub fn schedule_frames(msgid: &str, unschedule: bool) -> Vec<Frame> {
    let body = ScheduleBody {
        queue: b"default".to_vec(),
        headers: b"guarantee".to_vec(),
        interval: b"60".to_vec(),
        body: SCHEDULE_BODY.to_vec(),
        cron: Some(Vec::new()),
    };
    let command = if unschedule { Command::Unschedule(body) } else { Command::Schedule(body) };
    Message { msgid: msgid.as_bytes().to_vec(), command }.encode()
}

/// The job body of [`schedule_frames`]: a Python call, as schedules need
/// (the scheduler keys a schedule by it).
pub const SCHEDULE_BODY: &[u8] =
    br#"["run", {"callable": "f", "path": "m", "args": [], "kwargs": {}, "class_args": [], "class_kwargs": {}}]"#;

/// A peer identity from text.
pub fn peer(id: &str) -> PeerId {
    PeerId::from(id.as_bytes())
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
