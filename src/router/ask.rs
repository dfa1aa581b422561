//! Asking shards ([`AdminOp`]) and collecting their answers within a
//! deadline: the admin thread, the status page and `/metrics`, the latency
//! reporter, the drain and tests all use this one fan-out.

use std::time::{Duration, Instant};

use crossbeam_channel::Sender;

use super::Broker;
use crate::broker::admin::{AdminAnswer, AdminOp};
use crate::broker::inbox::ShardMsg;
use crate::broker::snapshot::ShardSnapshot;
use crate::ids::QueueName;
use crate::limits;

/// What the shards answered.
#[derive(Debug)]
pub struct Answers<T> {
    /// One answer per shard that answered in time (in arrival order).
    pub answers: Vec<T>,
    /// Shards that did not answer within the timeout (or are gone, or
    /// answered something else).
    pub missing: usize,
}

impl Answers<AdminAnswer> {
    /// The answers `pick` takes; the others count as missing.
    pub fn keep<T>(self, pick: impl Fn(AdminAnswer) -> Option<T>) -> Answers<T> {
        let given = self.answers.len();
        let answers: Vec<T> = self.answers.into_iter().filter_map(pick).collect();
        Answers { missing: self.missing + given - answers.len(), answers }
    }
}

/// Sends `op` to every shard in `shards` and waits up to `timeout` for all
/// the answers. Shards that do not answer in time are counted in
/// [`Answers::missing`] and logged.
pub fn ask_shards(shards: &[Sender<ShardMsg>], timeout: Duration, op: &AdminOp) -> Answers<AdminAnswer> {
    let (tx, rx) = crossbeam_channel::bounded(shards.len());
    let asked = shards.iter().filter(|s| s.send(ShardMsg::Admin { op: op.clone(), reply: tx.clone() }).is_ok()).count();
    let deadline = Instant::now() + timeout;
    let mut answers = Vec::with_capacity(asked);
    while answers.len() < asked {
        match rx.recv_deadline(deadline) {
            Ok(a) => answers.push(a),
            Err(_) => break,
        }
    }
    let missing = shards.len() - answers.len();
    if missing > 0 {
        tracing::warn!(answered = answers.len(), shards = shards.len(), ?op, "shards did not answer in time");
    }
    Answers { answers, missing }
}

impl Broker {
    /// Asks shards `indices` (out of range ones are skipped) within
    /// [`limits::SHARD_ANSWER_TIMEOUT`].
    pub fn ask(&self, indices: &[usize], op: &AdminOp) -> Answers<AdminAnswer> {
        let senders: Vec<_> = indices.iter().filter_map(|i| self.shards.get(*i).cloned()).collect();
        ask_shards(&senders, limits::SHARD_ANSWER_TIMEOUT, op)
    }

    /// Asks every shard within [`limits::SHARD_ANSWER_TIMEOUT`].
    pub fn ask_all(&self, op: &AdminOp) -> Answers<AdminAnswer> {
        ask_shards(&self.shards, limits::SHARD_ANSWER_TIMEOUT, op)
    }

    /// Every shard's snapshot, and how many shards did not answer within
    /// [`limits::SHARD_ANSWER_TIMEOUT`].
    pub fn snapshots_asked(&self) -> Answers<ShardSnapshot> {
        self.ask_all(&AdminOp::Snapshot).keep(|a| match a {
            AdminAnswer::Snapshot(s) => Some(*s),
            _ => None,
        })
    }

    /// A snapshot of every shard that answers within
    /// [`limits::SHARD_ANSWER_TIMEOUT`].
    pub fn snapshots(&self) -> Vec<ShardSnapshot> {
        self.snapshots_asked().answers
    }

    /// The bodies of the jobs waiting in `queue`, front first (for tests
    /// and tools; linear in the queue). Empty when its shard does not
    /// answer within [`limits::SHARD_ANSWER_TIMEOUT`].
    pub fn waiting(&self, queue: &str) -> Vec<Vec<u8>> {
        let queue = QueueName::named(queue);
        let shard = crate::broker::types::shard_of(&queue.0, self.shards.len());
        let answers = self.ask(&[shard], &AdminOp::Waiting(queue)).answers;
        answers
            .into_iter()
            .find_map(|a| match a {
                AdminAnswer::Waiting(bodies) => Some(bodies),
                _ => None,
            })
            .unwrap_or_default()
    }
}
