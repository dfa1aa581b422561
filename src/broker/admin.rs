//! What the router's own threads ask a shard and what it answers: one
//! operation enum ([`AdminOp`]) carried in one message
//! ([`ShardMsg::Admin`](crate::broker::inbox::ShardMsg::Admin)), one answer
//! enum ([`AdminAnswer`]). The admin thread (every admin command,
//! docs/emqp.md "Admin"), the status page and `/metrics`, the latency
//! reporter, the drain and tests all ask through it; the router fans an
//! operation out to the shards it needs and merges the answers
//! (`router/ask.rs`). A new admin command that needs the shards adds a
//! variant here and its arm in `broker/shard/admin.rs` (docs/architecture.md
//! "Adding an admin command").

use crossbeam_channel::Sender;

use crate::broker::dead::{DeadEntry, DeadTarget};
use crate::broker::snapshot::ShardSnapshot;
use crate::ids::{JobId, QueueName};
use crate::metrics::latency::Taken;

/// A question or an order from the router's own threads to a shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminOp {
    /// The shard's state now ([`AdminAnswer::Snapshot`]).
    Snapshot,
    /// The latency histograms recorded since the last take, which starts
    /// them again ([`AdminAnswer::Latency`]).
    LatencyTake,
    /// The bodies of `queue`'s waiting jobs, front first (tests and tools;
    /// linear in the queue; [`AdminAnswer::Waiting`]).
    Waiting(QueueName),
    /// The oldest [`crate::limits::DEAD_LIST_MAX`] dead jobs (of one queue
    /// when given), without bodies, and how many there are in all
    /// ([`AdminAnswer::DeadList`]).
    DeadList(Option<QueueName>),
    /// One dead job with its body ([`AdminAnswer::DeadShow`]).
    DeadShow(JobId),
    /// Dead jobs back to the back of their queues with their setbacks
    /// reset ([`AdminAnswer::Done`]; every job is taken in bounded steps,
    /// [`DeadStep`]).
    DeadRetry(DeadTarget),
    /// Dead jobs gone for good ([`AdminAnswer::Done`], as
    /// [`AdminOp::DeadRetry`]).
    DeadDelete(DeadTarget),
}

/// A shard's answer to an [`AdminOp`] (the variant each op names).
#[derive(Debug)]
pub enum AdminAnswer {
    /// [`AdminOp::Snapshot`].
    Snapshot(Box<ShardSnapshot>),
    /// [`AdminOp::LatencyTake`].
    Latency(Box<Taken>),
    /// [`AdminOp::Waiting`]: the bodies, front first.
    Waiting(Vec<Vec<u8>>),
    /// [`AdminOp::DeadList`]: some jobs, oldest burial first, and the
    /// total.
    DeadList {
        /// The jobs listed.
        entries: Vec<DeadEntry>,
        /// Dead jobs matching, listed or not.
        total: usize,
    },
    /// [`AdminOp::DeadShow`]: the job, if the shard holds it.
    DeadShow(Option<DeadEntry>),
    /// [`AdminOp::DeadRetry`] or [`AdminOp::DeadDelete`]: how many jobs it
    /// took.
    Done(usize),
}

impl AdminAnswer {
    /// How many jobs a [`AdminAnswer::Done`] took; 0 for any other answer.
    pub fn done(&self) -> usize {
        match self {
            AdminAnswer::Done(n) => *n,
            _ => 0,
        }
    }
}

/// A retry or delete of every dead job (of one queue) under way on a shard.
/// The shard takes at most [`crate::limits::ADMIN_STEP_JOBS`] jobs at a
/// time, then sends itself the rest of the work as a
/// [`crate::broker::inbox::ShardMsg::DeadStep`] at the back of its inbox,
/// so what arrived meanwhile is served between two steps; the answer goes
/// out with the last step.
#[derive(Debug)]
pub struct DeadStep {
    /// Back to their queues (`true`), or gone for good.
    pub retry: bool,
    /// Only this queue's dead jobs, when given.
    pub queue: Option<QueueName>,
    /// The burial number to go on from.
    pub from: u64,
    /// The newest burial when the command came: jobs buried after it are
    /// left alone.
    pub upto: u64,
    /// Jobs taken so far.
    pub taken: usize,
    /// Where the answer goes once the last step is done.
    pub reply: Sender<AdminAnswer>,
}
