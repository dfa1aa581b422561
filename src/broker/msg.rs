//! What flows into a shard (from the I/O thread, other shards, the text
//! front end and the router's admin side) and out of it ([`Outbox`]: frames
//! for a ZeroMQ peer, messages for other shards, answers for text
//! connections).

use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::Sender;

use super::snapshot::ShardSnapshot;
use super::types::{Job, NewJob, WorkerShared};
use crate::ids::{ConnId, MsgId, OfferId, PeerId, QueueName, WorkerKey};
use crate::metrics::latency::Taken;
use crate::protocol::emqp::{Command, Frame, Message, ScheduleBody};
use crate::protocol::text::ErrorCode;

/// A message to a dispatcher shard. The doc of each variant names who sends
/// it and to which shard.
#[derive(Debug)]
pub enum ShardMsg {
    /// A client REQUEST (I/O thread → the queue's shard).
    Request {
        /// The queue named in D4, or `default` after the fallback.
        queue: QueueName,
        /// The job as received.
        job: NewJob,
        /// Set once the unknown-queue fallback to `default` was applied.
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
        /// The msgid of the REQUEST it answers (D5).
        request_msgid: MsgId,
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
        /// INFORM D6 (emq extension): the scheduler's stable name, if sent.
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
        /// D4: the msgid the answer is about.
        refers_to: MsgId,
        /// The D-frames as received, forwarded verbatim.
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
    },
    /// A worker no longer serving `queue` (home shard → the queue's shard).
    RemoveCandidate {
        /// The queue.
        queue: QueueName,
        /// The worker registration.
        key: WorkerKey,
    },
    /// The worker got a free slot: try its queues owned by the receiving
    /// shard (home shard → shards of its queues).
    Wake {
        /// The worker.
        worker: Arc<WorkerShared>,
    },
    /// A queue's shard dispatched `job` to a worker (→ the worker's home
    /// shard, which records it in flight).
    Dispatched {
        /// The worker registration.
        key: WorkerKey,
        /// The queue it was taken from.
        queue: QueueName,
        /// The job.
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
    /// Stop: KBYE to peers, log what remains, exit.
    Shutdown,
}

/// A SCHEDULE or UNSCHEDULE as the router received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    /// The client that sent it.
    pub client: PeerId,
    /// Its msgid (answers refer to it).
    pub msgid: MsgId,
    /// The D-frames as received, forwarded verbatim to the owner.
    pub frames: Vec<Frame>,
    /// D4..D8.
    pub body: ScheduleBody,
    /// UNSCHEDULE rather than SCHEDULE.
    pub unschedule: bool,
}

impl Schedule {
    /// The SCHEDULE or UNSCHEDULE in D-frames `frames` (as a router
    /// forwards it) from `client`; `None` for any other message.
    pub fn from_frames(client: PeerId, frames: Vec<Frame>) -> Option<Schedule> {
        let (body, unschedule) = match crate::protocol::emqp::decode(&frames, crate::protocol::emqp::Socket::Frontend) {
            Ok(Message { command: Command::Schedule(body), .. }) => (body, false),
            Ok(Message { command: Command::Unschedule(body), .. }) => (body, true),
            _ => return None,
        };
        let msgid = MsgId(frames.get(3).cloned().unwrap_or_default());
        Some(Schedule { client, msgid, frames, body, unschedule })
    }
}

/// A text client's answer to an offer (text-protocol.md "The offer").
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
    /// `ACK`, `DCL` or `DEL` of an offer: `Done`, or `NO_TASK` when the
    /// offer has lapsed.
    Answer {
        /// The offer.
        offer: OfferId,
        /// How it was answered.
        answer: TextAnswer,
    },
    /// The connection ended holding the offer: it goes back to the front
    /// of its queue. Not answered.
    Release {
        /// The offer.
        offer: OfferId,
    },
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
}

/// Where a shard sends text answers: a channel of the text front end.
/// Answers to one port arrive in the order of the commands.
#[derive(Debug, Clone)]
pub struct TextPort {
    /// The front end's number for this port (for logs and tests).
    pub id: u64,
    /// The channel.
    pub tx: Sender<Vec<TextReply>>,
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

/// Frames for one peer on one socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// The socket.
    pub dest: Dest,
    /// The peer's identity.
    pub peer: PeerId,
    /// D-frames.
    pub frames: Vec<Frame>,
    /// What to do if the send fails.
    pub on_fail: OnFail,
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
