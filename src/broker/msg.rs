//! What flows into a shard (from the I/O thread, other shards, the text
//! front end and the router's admin side) and out of it ([`Outbox`]: frames
//! for a ZeroMQ peer, messages for other shards, answers for text
//! connections).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;

use super::counts::QueueCounter;
use super::snapshot::ShardSnapshot;
use super::types::WorkerShared;
use crate::ids::{ConnId, MsgId, OfferId, PeerId, QueueName, WorkerKey};
use crate::job::{Job, JobFrames};
use crate::metrics::latency::Taken;
use crate::protocol::emqp::{Command, Frame, Message, ScheduleBody};
use crate::protocol::text::ErrorCode;
use crate::zmq_io::wake::Wake;

/// A message to a dispatcher shard. The doc of each variant names who sends
/// it and to which shard.
#[derive(Debug)]
pub enum ShardMsg {
    /// A client REQUEST (I/O thread → the queue's shard).
    Request {
        /// The client, for the acceptance REPLY or the ERROR.
        client: PeerId,
        /// The job's frames as received.
        frames: JobFrames,
        /// Set once the unknown-queue fallback to `default` was applied:
        /// the job then waits in `default` (and is sent to that shard).
        fallback_done: bool,
    },
    /// INFORM from a worker (I/O thread → the worker's home shard).
    WorkerInform {
        /// The worker's identity.
        id: PeerId,
        /// The INFORM's msgid, acknowledged by the ACK.
        msgid: MsgId,
        /// `(weight, queue)` in INFORM order, validated.
        queues: Vec<(i64, QueueName)>,
    },
    /// READY from a worker: one more free slot (home shard).
    WorkerReady {
        /// The worker's identity.
        id: PeerId,
    },
    /// Job-result REPLY from a worker (home shard).
    WorkerReply {
        /// The worker's identity.
        id: PeerId,
        /// The msgid of the REQUEST it answers (frame 5).
        request_msgid: MsgId,
        /// Whether the worker said the job failed.
        failed: bool,
    },
    /// HEARTBEAT from a worker (home shard).
    WorkerHeartbeat {
        /// The worker's identity.
        id: PeerId,
    },
    /// KBYE from a worker (home shard).
    WorkerKbye {
        /// The worker's identity.
        id: PeerId,
    },
    /// INFORM from a scheduler (shard 0).
    SchedulerInform {
        /// The scheduler's identity.
        id: PeerId,
        /// The INFORM's msgid.
        msgid: MsgId,
        /// INFORM frame 6 (emq extension): the scheduler's stable name, if sent.
        name: Option<Vec<u8>>,
    },
    /// HEARTBEAT from a frontend peer (shard 0): a scheduler is alive; an
    /// unknown peer is re-admitted as a scheduler.
    SchedulerHeartbeat {
        /// The peer's identity.
        id: PeerId,
        /// The HEARTBEAT's msgid (a re-admission's ACK names it).
        msgid: MsgId,
    },
    /// KBYE from a frontend peer (shard 0).
    SchedulerKbye {
        /// The peer's identity.
        id: PeerId,
    },
    /// SCHEDULE or UNSCHEDULE from a client, routed to the owner of its
    /// key (shard 0).
    Schedule(Schedule),
    /// A REPLY or ERROR from a frontend peer: a scheduler's answer to a
    /// SCHEDULE/UNSCHEDULE, for the client that sent it (shard 0).
    SchedulerAnswer {
        /// The peer that answered.
        id: PeerId,
        /// frame 4: the msgid the answer is about.
        refers_to: MsgId,
        /// The frames as received, forwarded verbatim.
        frames: Vec<Frame>,
    },
    /// A forward to a scheduler failed (I/O thread → shard 0).
    SchedulerSendFailed {
        /// The scheduler that could not be reached.
        id: PeerId,
        /// A SCHEDULE/UNSCHEDULE it owned, to route again.
        retry: Option<Schedule>,
    },
    /// A worker serving `queue` (home shard → the queue's shard).
    AddCandidate {
        /// The queue.
        queue: QueueName,
        /// The worker's weight for it.
        weight: i64,
        /// The worker.
        worker: Arc<WorkerShared>,
        /// Its INFORM's msgid (a refusal refers to it).
        inform: MsgId,
    },
    /// Worker `key` gets no jobs of `queue` while `paused` (it owes the
    /// answer of a job taken back by its deadline), or gets them again
    /// (home shard → the queue's shard).
    PauseCandidate {
        /// The queue.
        queue: QueueName,
        /// The worker registration.
        key: WorkerKey,
        /// Paused, or no longer.
        paused: bool,
    },
    /// A worker no longer serving `queue` (home shard → the queue's shard).
    RemoveCandidate {
        /// The queue.
        queue: QueueName,
        /// The worker registration.
        key: WorkerKey,
    },
    /// The worker got a free slot: try its queues in INFORM order from
    /// position `from`, those owned by the receiving shard here, handing the
    /// rest on to the shard of the next one (home shard → the shard of its
    /// first queue → …, while the worker has a free slot).
    Wake {
        /// The worker.
        worker: Arc<WorkerShared>,
        /// The position in `worker.queues` to start at.
        from: usize,
    },
    /// A queue's shard dispatched `job` to a worker (→ the worker's home
    /// shard, which records it in flight).
    Dispatched {
        /// The worker registration.
        key: WorkerKey,
        /// The job (its queue is [`Job::queue`]).
        job: Job,
    },
    /// Jobs back to the front of their queue, keeping their order: the first
    /// of `jobs` ends up first in line (→ the queue's shard).
    Requeue {
        /// The queue.
        queue: QueueName,
        /// The jobs, oldest dispatch first.
        jobs: Vec<Job>,
    },
    /// A delivery of `job` came to nothing (its setback already counted in
    /// [`Job::redeliveries`]): the dead set, a retry after its back-off or
    /// the front of its queue (→ the queue's shard; README "Retries and
    /// the dead set").
    SetBack {
        /// The job.
        job: Job,
        /// Why.
        why: crate::job::Setback,
    },
    /// The router's dead set is over `dead_max_jobs` or `dead_max_bytes`
    /// and the shard that buried the last job could not drop enough of its
    /// own: drop your oldest while it is over (→ every other shard).
    DeadTrim,
    /// An admin question about the dead set (admin thread → every shard,
    /// or the shard in a job id).
    Dead {
        /// The question.
        op: crate::broker::dead::DeadOp,
        /// Where the answer goes.
        reply: Sender<crate::broker::dead::DeadAnswer>,
    },
    /// A job of `queue` ended on another shard (a worker's home): count it
    /// (→ the queue's shard).
    Count {
        /// The queue.
        queue: QueueName,
        /// What to count.
        counter: QueueCounter,
    },
    /// Sending a job to a worker failed (I/O thread → home shard).
    SendFailed {
        /// The worker registration.
        key: WorkerKey,
        /// The job's msgid (for the log).
        msgid: MsgId,
        /// The peer is gone (EHOSTUNREACH) rather than not reading (EAGAIN).
        unreachable: bool,
    },
    /// Text-protocol commands for queues of the receiving shard, answered in
    /// order through `port` (text front end → the queue's shard).
    Text {
        /// Where the answers go.
        port: TextPort,
        /// The commands, in the order their connections sent them.
        cmds: Vec<TextRequest>,
    },
    /// A job the receiving shard accepted, dispatched and lent to another
    /// shard's worker is done: its log records it (a worker's home shard →
    /// the shard in the low bits of the job id).
    LogDone {
        /// The job.
        id: crate::ids::JobId,
    },
    /// Hand over the latency histograms recorded since the last take.
    LatencyTake {
        /// Where the histograms go.
        reply: Sender<Taken>,
    },
    /// Send a snapshot of this shard's state.
    Snapshot {
        /// Where the snapshot goes.
        reply: Sender<ShardSnapshot>,
    },
    /// Several messages from the I/O thread, to be handled in order (one
    /// channel operation for a whole read batch).
    Batch(Vec<ShardMsg>),
    /// Send the bodies of `queue`'s waiting jobs, front first (tests and
    /// tools; linear in the queue).
    Waiting {
        /// The queue (owned by the receiving shard).
        queue: QueueName,
        /// Where the bodies go.
        reply: Sender<Vec<Vec<u8>>>,
    },
    /// Stop: KBYE to peers, log what remains, exit.
    Shutdown,
}

impl ShardMsg {
    /// How many front-end messages this stands for, as counted against the
    /// shard's inbox limit (`shard_inbox_messages`): the messages of a
    /// [`ShardMsg::Batch`], the commands of a [`ShardMsg::Text`], 0 for
    /// messages between shards and from the router's own threads (those are
    /// bounded by the work already admitted).
    pub fn inbox_weight(&self) -> usize {
        match self {
            ShardMsg::Batch(msgs) => msgs.len(),
            ShardMsg::Text { cmds, .. } => cmds.len(),
            _ => 0,
        }
    }

    /// Bytes of the new eMQP jobs in a [`ShardMsg::Batch`] (REQUESTs not
    /// yet forwarded to `default`): what the I/O thread counted into
    /// [`crate::broker::shard::ShardContext::in_transit_bytes`] when it
    /// handed the batch over (each job leaves that count when a shard
    /// admits or refuses it), and takes out again if the hand-over fails.
    pub fn in_transit_bytes(&self) -> usize {
        let ShardMsg::Batch(msgs) = self else { return 0 };
        msgs.iter()
            .map(|m| match m {
                ShardMsg::Request { frames, fallback_done: false, .. } => frames.len(),
                _ => 0,
            })
            .sum()
    }
}

/// A SCHEDULE or UNSCHEDULE as the router received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    /// The client that sent it.
    pub client: PeerId,
    /// Its msgid (answers refer to it).
    pub msgid: MsgId,
    /// The frames as received, forwarded verbatim to the owner.
    pub frames: Vec<Frame>,
    /// frames 4..8.
    pub body: ScheduleBody,
    /// UNSCHEDULE rather than SCHEDULE.
    pub unschedule: bool,
}

impl Schedule {
    /// The SCHEDULE or UNSCHEDULE in frames `frames` (as a router
    /// forwards it) from `client`; `None` for any other message.
    pub fn from_frames(client: PeerId, frames: Vec<Frame>) -> Option<Schedule> {
        let (body, unschedule) = match crate::protocol::emqp::decode(&frames, crate::protocol::emqp::Socket::Frontend) {
            Ok(Message { command: Command::Schedule(body), .. }) => (body, false),
            Ok(Message { command: Command::Unschedule(body), .. }) => (body, true),
            _ => return None,
        };
        let msgid = MsgId::from(frames.get(3).map_or(&[][..], Vec::as_slice));
        Some(Schedule { client, msgid, frames, body, unschedule })
    }
}

/// A text client's answer to an offer (docs/text-protocol.md "The offer").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextAnswer {
    /// `ACK`: the task is done as far as the broker is concerned.
    Ack,
    /// `DCL`: back of its queue.
    Dcl,
    /// `DEL`: removed and counted as deleted.
    Del,
}

/// One text command for a shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TextCmd {
    /// `SCHED data@queue`: answered [`TextOutcome::Done`] or refused.
    Sched {
        /// The queue (a valid name).
        queue: QueueName,
        /// The task's bytes.
        data: Vec<u8>,
    },
    /// `ASK queue`: answered with an offer, `Nope` or a refusal.
    Ask {
        /// The queue.
        queue: QueueName,
    },
    /// `ASK queue ms` (long poll): with a task waiting, answered like `Ask`;
    /// otherwise the connection waits in the queue's line of waiting ASKs
    /// (arrival order) and is answered with the first task that is not
    /// pushed to an eMQP worker, or `Nope` once `wait` has passed.
    AskWait {
        /// The queue.
        queue: QueueName,
        /// How long to wait at most.
        wait: Duration,
    },
    /// `ACK`, `DCL` or `DEL` of an offer: `Done`, or `NO_TASK` when the
    /// offer has lapsed.
    Answer {
        /// The offer.
        offer: OfferId,
        /// How it was answered.
        answer: TextAnswer,
    },
    /// The connection ended holding the offer: it goes back to the front
    /// of its queue (a delivery: past [`crate::limits::MAX_RETRIES`] it
    /// is dead-lettered). Not answered.
    Release {
        /// The offer.
        offer: OfferId,
    },
    /// The connection stops waiting (it closed) while its `AskWait` waits
    /// on this shard: that `AskWait` is answered `Nope` at once. Nothing
    /// happens when it is not waiting. Not answered itself.
    Cancel,
}

/// A text command with the connection that sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextRequest {
    /// The connection.
    pub conn: ConnId,
    /// The command.
    pub cmd: TextCmd,
}

/// What a shard answers to a [`TextCmd`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TextOutcome {
    /// Done: SCHED stored, or the offer answered.
    Done,
    /// A task offered to the connection until `deadline`.
    Offer {
        /// The offer, for the answer.
        id: OfferId,
        /// The task's bytes.
        data: Vec<u8>,
        /// When the offer lapses and the task goes back to the front of
        /// its queue (the shard's clock decides; the connection only uses
        /// it to forget the offer).
        deadline: Instant,
    },
    /// Nothing to offer now.
    Nope,
    /// Refused with a text-protocol error code; nothing changed.
    Refused(ErrorCode),
}

/// An answer for one connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextReply {
    /// The connection.
    pub conn: ConnId,
    /// The outcome of its command.
    pub outcome: TextOutcome,
    /// The outcome of a SCHED whose job was stored: with `durability =
    /// "sync"` it, and every later answer to the same connection until
    /// it is released, leaves only after the sync of its batch (the
    /// producer's next reply promises the job is durable). Other answers
    /// leave at once (see `router::outbox`).
    pub stored: bool,
}

impl TextReply {
    /// An answer that promises nothing about the log (`stored: false`).
    pub fn new(conn: ConnId, outcome: TextOutcome) -> TextReply {
        TextReply { conn, outcome, stored: false }
    }
}

/// The answers of one shard's batch for one [`TextPort`], in order.
#[derive(Debug)]
pub struct TextBatch {
    /// The shard that answers.
    pub shard: usize,
    /// The answers.
    pub replies: Vec<TextReply>,
}

/// Where a shard sends text answers: a channel of one text I/O thread and
/// the wake-up of that thread. A shard answers the commands of one
/// connection in the order they came (an `AskWait` that waits is answered
/// later, and the connection sends nothing else that is answered until
/// then), so the front end matches answers to commands by order.
#[derive(Debug, Clone)]
pub struct TextPort {
    /// The front end's number for this port (for logs and tests).
    pub id: u64,
    /// The channel.
    pub tx: Sender<TextBatch>,
    /// Wakes the receiving thread if it sleeps (`None`: it never sleeps on
    /// the port, as in tests).
    pub wake: Option<Arc<Wake>>,
}

impl TextPort {
    /// Hands shard `shard`'s `replies` over and wakes the receiver. Returns
    /// `false` when the receiver is gone (the text front end has stopped).
    pub fn send(&self, shard: usize, replies: Vec<TextReply>) -> bool {
        let sent = self.tx.send(TextBatch { shard, replies }).is_ok();
        if let Some(wake) = &self.wake {
            wake.wake();
        }
        sent
    }
}

/// Which router socket a frame list goes out on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dest {
    /// Frontend (clients, schedulers).
    Frontend,
    /// Backend (workers).
    Backend,
    /// Admin (emq-cli).
    Admin,
}

/// What the I/O thread does when a send fails.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnFail {
    /// Count it and move on (acceptance REPLY, heartbeat, ERROR…).
    Count,
    /// A job to a worker: tell its home shard ([`ShardMsg::SendFailed`]).
    Job {
        /// The worker's home shard.
        home: usize,
        /// The worker registration.
        key: WorkerKey,
    },
    /// A SCHEDULE or UNSCHEDULE to its owner: drop that scheduler and
    /// route the message again ([`Schedule::from_frames`] rebuilds it).
    Schedule {
        /// The client that sent it.
        client: PeerId,
    },
    /// A copy for a scheduler that does not own the key (UNSCHEDULE, DROP):
    /// drop that scheduler.
    Unschedule,
}

/// A message for one peer on one socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// The socket.
    pub dest: Dest,
    /// The peer's identity.
    pub peer: PeerId,
    /// What to send.
    pub msg: OutMsg,
    /// What to do if the send fails.
    pub on_fail: OnFail,
}

impl Outgoing {
    /// The frames of [`Outgoing::msg`] (see [`OutMsg::to_frames`]).
    pub fn frames(&self) -> Vec<Frame> {
        self.msg.to_frames()
    }
}

/// What to send, typed so the I/O thread builds the ZeroMQ frames straight
/// from the job's buffer (no intermediate frame lists on the hot path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutMsg {
    /// A job for a worker: `["", "eMQP/1.0", "REQUEST", msgid, queue,
    /// headers with "reply-requested" first, body, extra…]`.
    Job(JobFrames),
    /// The acceptance REPLY of a REQUEST: `["", "eMQP/1.0", "REPLY", <fresh
    /// msgid>, <the REQUEST's msgid>]`.
    Accepted(JobFrames),
    /// `["", "eMQP/1.0", "HEARTBEAT", <fresh msgid>, <wall clock>]`, stamped
    /// when sent.
    Heartbeat,
    /// Any other message, as frames.
    Frames(Vec<Frame>),
}

impl OutMsg {
    /// The frames this stands for (a fresh msgid where one is made at send
    /// time), for tests, logs and failed sends.
    pub fn to_frames(&self) -> Vec<Frame> {
        use crate::protocol::emqp::{heartbeat_timestamp, new_msgid, VERSION};
        let head = |word: &[u8]| vec![Vec::new(), VERSION.to_vec(), word.to_vec()];
        match self {
            OutMsg::Job(f) => {
                let mut out = head(b"REQUEST");
                out.push(f.msgid().to_vec());
                out.push(f.queue().to_vec());
                out.push(crate::protocol::headers::with_reply_requested(f.headers()));
                out.push(f.body().to_vec());
                out.extend(f.extra().map(<[u8]>::to_vec));
                out
            }
            OutMsg::Accepted(f) => {
                let mut out = head(b"REPLY");
                out.extend([new_msgid(), f.msgid().to_vec()]);
                out
            }
            OutMsg::Heartbeat => {
                let mut out = head(b"HEARTBEAT");
                out.extend([new_msgid(), heartbeat_timestamp()]);
                out
            }
            OutMsg::Frames(frames) => frames.clone(),
        }
    }
}

/// Where a shard's handlers put what they produce. The router's
/// implementation sends into channels (src/router); tests collect into
/// `Vec`s ([`VecOutbox`]).
///
/// Order: within one handler, messages to other shards are handed over
/// before later frames, so a shard can tell a worker's home shard about a
/// job before the job's frames can reach the worker.
pub trait Outbox {
    /// Frames for a ZeroMQ peer, sent by the I/O thread. Never blocks.
    fn emqp(&mut self, out: Outgoing);
    /// A message for shard `index` (never the sender itself: a shard keeps
    /// messages to itself in its own local queue).
    fn shard(&mut self, index: usize, msg: ShardMsg);
    /// An answer for a text connection.
    fn text(&mut self, port: &TextPort, reply: TextReply);
    /// The end of a batch of messages: wake whoever has to act on what was
    /// handed over (one wake-up per batch instead of one per message).
    fn flush(&mut self) {}
    /// The end of a batch whose promises wait for the job log to hold
    /// everything before `ticket` ([`crate::joblog::Commit::After`]):
    /// frames for workers ([`Dest::Backend`]), frontend frames other than
    /// acceptance REPLYs ([`OutMsg::Accepted`]) and text answers that
    /// promise nothing leave now; acceptance REPLYs, and text answers to
    /// stored SCHEDs with the later answers to their connections
    /// ([`TextReply::stored`]), once the log holds the ticket. Messages to
    /// other shards are never held. The default flushes at once.
    fn flush_after(&mut self, ticket: crate::joblog::Ticket) {
        let _ = ticket;
        self.flush();
    }
}

/// An [`Outbox`] that keeps everything, in order, for tests and tools.
#[derive(Debug, Default)]
pub struct VecOutbox {
    /// Frames for peers.
    pub emqp: Vec<Outgoing>,
    /// Messages for other shards: `(index, message)`.
    pub shards: Vec<(usize, ShardMsg)>,
    /// Text answers: `(port id, reply)`.
    pub text: Vec<(u64, TextReply)>,
}

impl Outbox for VecOutbox {
    fn emqp(&mut self, out: Outgoing) {
        self.emqp.push(out);
    }

    fn shard(&mut self, index: usize, msg: ShardMsg) {
        self.shards.push((index, msg));
    }

    fn text(&mut self, port: &TextPort, reply: TextReply) {
        self.text.push((port.id, reply));
    }
}
