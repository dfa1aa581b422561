//! The text port: the contract between the text front end (`crate::text`)
//! and the shards. The front end sends [`TextRequest`]s in a
//! [`super::inbox::ShardMsg::Text`]; the shard answers each through the
//! [`TextPort`] it came with ([`TextReply`], [`TextOutcome`]), and wakes the
//! front end's I/O thread with a [`Notify`] the front end handed over.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;

use crate::ids::{ConnId, OfferId, QueueName};
use crate::protocol::text::ErrorCode;
use crate::wake::Notify;

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
    /// A SCHED whose job was taken but whose batch the log gave up on:
    /// refused with this code and [`crate::joblog::NOT_CONFIRMED`]; the
    /// job may or may not run.
    NotConfirmed(ErrorCode),
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
    pub wake: Option<Arc<dyn Notify>>,
}

impl TextPort {
    /// Hands shard `shard`'s `replies` over and wakes the receiver. Returns
    /// `false` when the receiver is gone (the text front end has stopped).
    pub fn send(&self, shard: usize, replies: Vec<TextReply>) -> bool {
        let sent = self.tx.send(TextBatch { shard, replies }).is_ok();
        if let Some(wake) = &self.wake {
            wake.notify();
        }
        sent
    }
}
