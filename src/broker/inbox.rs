//! The shard's inbox: [`ShardMsg`], everything a dispatcher shard takes in
//! (from the eMQP I/O thread, the text front end, other shards and the
//! router's admin side), each variant naming who sends it to which shard.
//! The contracts of the front ends' own traffic are their files:
//! [`super::text_port`] (text commands and answers), [`super::egress`]
//! (frames for ZeroMQ peers); what a shard puts out goes through
//! [`super::outbox::Outbox`].

use std::sync::Arc;

use crossbeam_channel::Sender;

use super::counts::QueueCounter;
use super::text_port::{TextPort, TextRequest};
use super::types::WorkerShared;
use crate::ids::{MsgId, PeerId, QueueName, WorkerKey};
use crate::job::{Job, JobFrames};
use crate::protocol::emqp::{Command, Frame, Message, ScheduleBody};

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
    /// UNREADY from a worker: take back one free slot (home shard).
    WorkerUnready {
        /// The worker's identity.
        id: PeerId,
        /// The UNREADY's msgid, which the answer names.
        msgid: MsgId,
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
    /// A question or order from the router's own threads (admin,
    /// status page and metrics, latency reporter, drain, tests → the
    /// shards it concerns), answered through `reply`
    /// (docs/architecture.md "Adding an admin command").
    Admin {
        /// What is asked.
        op: crate::broker::admin::AdminOp,
        /// Where the answer goes.
        reply: Sender<crate::broker::admin::AdminAnswer>,
    },
    /// The next step of a retry or delete of every dead job (a shard → the
    /// same shard, at the back of its inbox: the shard serves what came
    /// meanwhile first).
    DeadStep(crate::broker::admin::DeadStep),
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
    /// A job accepted in `default` after the unknown-queue fallback came
    /// from a REQUEST whose duplicate key belongs to the shard of the
    /// queue it named: that shard remembers and logs it (docs/failover.md
    /// "Duplicates"; `default`'s shard → the named queue's shard).
    DedupKey {
        /// The client's routing identity.
        client: PeerId,
        /// The REQUEST's msgid.
        msgid: MsgId,
        /// The job it made.
        job: crate::ids::JobId,
        /// When, in ms since the Unix epoch.
        at_unix_ms: u64,
    },
    /// Several messages from the I/O thread, to be handled in order (one
    /// channel operation for a whole read batch).
    Batch(Vec<ShardMsg>),
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
