//! What flows into a shard (from the I/O thread, other shards, the text
//! front end and the admin thread) and out of it (frames for a socket).

use std::sync::Arc;

use crossbeam_channel::Sender;

use super::snapshot::ShardSnapshot;
use super::types::{ConnId, Job, PeerId, QueueName, WorkerKey, WorkerShared};
use crate::protocol::emqp::Frame;

/// A message to a dispatcher shard. Fields are described on each variant.
#[allow(missing_docs)]
#[derive(Debug)]
pub enum ShardMsg {
    /// A client REQUEST for `queue`. `fallback_done` is set once the
    /// unknown-queue fallback to `default` has been applied.
    Request { queue: QueueName, job: Job, fallback_done: bool },
    /// INFORM from a worker (to its home shard).
    WorkerInform { id: PeerId, msgid: Frame, queues: Vec<(i64, QueueName)> },
    /// READY from a worker (home shard).
    WorkerReady { id: PeerId },
    /// Job-result REPLY from a worker (home shard).
    WorkerReply { id: PeerId, request_msgid: Frame },
    /// HEARTBEAT from a worker (home shard).
    WorkerHeartbeat { id: PeerId },
    /// KBYE from a worker (home shard).
    WorkerKbye { id: PeerId },
    /// INFORM from a scheduler (shard 0).
    SchedulerInform { id: PeerId, msgid: Frame },
    /// HEARTBEAT from a frontend peer (shard 0; ignored unless a scheduler).
    SchedulerHeartbeat { id: PeerId },
    /// KBYE from a frontend peer (shard 0).
    SchedulerKbye { id: PeerId },
    /// SCHEDULE (`unschedule == false`) or UNSCHEDULE from `client`, with
    /// the D-frames as received, forwarded verbatim (shard 0).
    Schedule { client: PeerId, msgid: Frame, frames: Vec<Frame>, unschedule: bool },
    /// A forward to scheduler `id` failed; `retry` holds a SCHEDULE to
    /// route to another scheduler.
    SchedulerSendFailed { id: PeerId, retry: Option<(PeerId, Vec<Frame>)> },
    /// A worker serving `queue` (to the queue's shard).
    AddCandidate { queue: QueueName, weight: i64, worker: Arc<WorkerShared> },
    /// A worker no longer serving `queue` (to the queue's shard).
    RemoveCandidate { queue: QueueName, key: WorkerKey },
    /// The worker got a free slot: try its queues on this shard.
    Wake { worker: Arc<WorkerShared> },
    /// A queue shard dispatched `job` to worker `key` (to the home shard).
    Dispatched { key: WorkerKey, queue: QueueName, job: Job },
    /// Jobs back to the front of their queue, keeping their order (the
    /// first of `jobs` ends up first in line).
    Requeue { queue: QueueName, jobs: Vec<Job> },
    /// Sending a job to worker `key` failed; `unreachable` when the peer is
    /// gone (EHOSTUNREACH), else its pipe was full (EAGAIN).
    SendFailed { key: WorkerKey, msgid: Frame, unreachable: bool },
    /// A text SCHED.
    TextSched { queue: QueueName, data: Vec<u8>, reply: Sender<Result<(), TextRefusal>> },
    /// A text ASK from connection `conn`; the reply is the offer's sequence
    /// number and data, or `None` when the queue has nothing to offer.
    TextAsk { conn: ConnId, queue: QueueName, reply: Sender<Option<(u64, Vec<u8>)>> },
    /// ACK, DCL or DEL of offer `seq` held by `conn` on this shard.
    TextAnswer { conn: ConnId, seq: u64, answer: TextAnswer, reply: Sender<Result<(), TextRefusal>> },
    /// Connection `conn` ended holding offer `seq`: it goes back to the
    /// front; the reply says whether it was still held.
    TextRelease { conn: ConnId, seq: u64, reply: Option<Sender<bool>> },
    /// Hand over the latency histograms recorded since the last take.
    LatencyTake { reply: Sender<crate::metrics::latency::Taken> },
    /// Send a snapshot of this shard's state.
    Snapshot { reply: Sender<ShardSnapshot> },
    /// Stop: KBYE to peers, log what remains, exit.
    Shutdown,
}

/// A text client's answer to an offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextAnswer {
    /// Accept: the task is done as far as the broker is concerned.
    Ack,
    /// Decline: back of its queue.
    Dcl,
    /// Delete: removed and counted as deleted.
    Del,
}

/// Why a shard refused a text operation (text-protocol.md error codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextRefusal {
    /// `QUEUE_FULL`
    QueueFull,
    /// `SHUTTING_DOWN`
    ShuttingDown,
    /// `NO_TASK`
    NoTask,
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
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnFail {
    /// Count it and move on (acceptance REPLY, heartbeat, ERROR…).
    Count,
    /// A job to a worker: tell its home shard.
    Job { home: usize, key: WorkerKey },
    /// A SCHEDULE to a scheduler: route it to another one.
    Schedule { client: PeerId },
    /// An UNSCHEDULE to a scheduler: drop that scheduler.
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

/// Where shards put outgoing frames. The router implementation is an inproc
/// PUSH socket read by the I/O thread (src/zmq_io); tests use a `Vec`.
pub trait Outbox: Send {
    /// Queues one message for sending. Never blocks for long.
    fn send(&mut self, out: Outgoing);
}

impl Outbox for Vec<Outgoing> {
    fn send(&mut self, out: Outgoing) {
        self.push(out);
    }
}
