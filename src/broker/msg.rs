//! What flows into a shard (from the I/O thread, other shards, the text
//! front end and the router's admin side) and out of it ([`Outbox`]: frames
//! for a ZeroMQ peer, messages for other shards, answers for text
//! connections).

use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::Sender;

use super::job::{Job, JobFrames};
use super::snapshot::ShardSnapshot;
use super::types::WorkerShared;
use crate::ids::{ConnId, MsgId, OfferId, PeerId, QueueName, WorkerKey};
use crate::metrics::latency::Taken;
use crate::protocol::emqp::Frame;
use crate::protocol::text::ErrorCode;

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
    },
    /// HEARTBEAT from a frontend peer (shard 0; ignored unless a scheduler).
    SchedulerHeartbeat {
        /// The peer's identity.
        id: PeerId,
    },
    /// KBYE from a frontend peer (shard 0).
    SchedulerKbye {
        /// The peer's identity.
        id: PeerId,
    },
    /// SCHEDULE or UNSCHEDULE from a client, forwarded verbatim (shard 0).
    Schedule {
        /// The client that sent it.
        client: PeerId,
        /// Its msgid (the ERROR reply refers to it).
        msgid: MsgId,
        /// The D-frames as received.
        frames: Vec<Frame>,
        /// UNSCHEDULE (to every scheduler) rather than SCHEDULE (to one).
        unschedule: bool,
    },
    /// A forward to a scheduler failed (I/O thread → shard 0).
    SchedulerSendFailed {
        /// The scheduler that could not be reached.
        id: PeerId,
        /// A SCHEDULE to route to another scheduler: `(client, D-frames)`.
        retry: Option<(PeerId, Vec<Frame>)>,
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
    /// A job the receiving shard accepted is done: its `Done` record goes
    /// to that shard's write-ahead log (a worker's home shard → the shard
    /// in the low bits of the job id).
    LogDone {
        /// The job.
        id: crate::ids::JobId,
        /// The log segment holding its `Accepted` record ([`Job::wal_segment`]).
        segment: u32,
        /// That record's size in bytes.
        record_bytes: usize,
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
    /// Stop: KBYE to peers, log what remains, exit.
    Shutdown,
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
    /// A SCHEDULE to a scheduler: route it to another one.
    Schedule {
        /// The client that sent the SCHEDULE.
        client: PeerId,
    },
    /// An UNSCHEDULE to a scheduler: drop that scheduler.
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
    /// The D-frames of [`Outgoing::msg`] (see [`OutMsg::to_frames`]).
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
    /// Any other message, as D-frames.
    Frames(Vec<Frame>),
}

impl OutMsg {
    /// The D-frames this stands for (a fresh msgid where one is made at send
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
    /// The end of a batch whose write-ahead log records must be durable
    /// (up to `wait`) before what it promises leaves (`durability = "sync"`
    /// with a sync thread): frames for workers ([`Dest::Backend`]) leave
    /// now, frontend frames (acceptance REPLYs) and text answers once the
    /// log is durable. Messages to other shards are never held. The default
    /// flushes at once.
    fn flush_after_sync(&mut self, wait: crate::wal::sync::SyncWait) {
        let _ = wait;
        self.flush();
    }
    /// Before the shard syncs its log itself: hands over the frames for
    /// workers ([`Dest::Backend`]) now; the rest waits for the next
    /// [`Outbox::flush`]. The default keeps everything for that flush.
    fn flush_early(&mut self) {}
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
