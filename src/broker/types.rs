//! The job record and the worker state shared by the shards.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicI64, AtomicU8, Ordering};
use std::time::Instant;

use crate::ids::{JobId, MsgId, PeerId, QueueName, WorkerKey};
use crate::protocol::emqp::Frame;

/// The shard that owns `queue`: `hash(queue) % shards` (README, "How it works":
/// a queue lives on one shard). Deterministic across runs.
pub fn shard_of(bytes: &[u8], shards: usize) -> usize {
    let mut h = std::hash::DefaultHasher::new();
    bytes.hash(&mut h);
    (h.finish() % shards.max(1) as u64) as usize
}

/// Where a job came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// An eMQP REQUEST from this frontend peer.
    Emqp(PeerId),
    /// A text-protocol SCHED.
    Text,
}

/// A job as a front end hands it to its queue's shard, before acceptance.
#[derive(Clone, Debug)]
pub struct NewJob {
    /// The REQUEST msgid (a fresh uuid4 for text SCHEDs).
    pub msgid: MsgId,
    /// REQUEST frame 4 as the client sent it (kept even after the `default`
    /// fallback: EventMQ 0.3.13; docs/emqp.md, REQUEST).
    pub queue_frame: Frame,
    /// REQUEST frame 5, the headers CSV as the client sent it.
    pub headers: Frame,
    /// REQUEST frame 6 (the text protocol's data).
    pub body: Frame,
    /// Frames after frame 6, forwarded unchanged.
    pub extra: Vec<Frame>,
    /// Who sent it.
    pub origin: Origin,
}

impl NewJob {
    /// A text-protocol SCHED of `data` on `queue`, with a fresh msgid.
    pub fn text(queue: &QueueName, data: Vec<u8>) -> NewJob {
        NewJob {
            msgid: MsgId(crate::protocol::emqp::new_msgid()),
            queue_frame: queue.0.clone(),
            headers: Vec::new(),
            body: data,
            extra: Vec::new(),
            origin: Origin::Text,
        }
    }

    /// The job once its shard has accepted it as `id` at `now`.
    pub fn accept(self, id: JobId, now: Instant) -> Job {
        Job {
            id,
            msgid: self.msgid,
            queue_frame: self.queue_frame,
            headers: self.headers,
            body: self.body,
            extra: self.extra,
            accepted_at: now,
            origin: self.origin,
            redeliveries: 0,
        }
    }
}

/// One accepted job as the broker holds it. The frames are kept as they
/// arrived so a worker receives the client's REQUEST unchanged.
#[derive(Clone, Debug)]
pub struct Job {
    /// The broker's id: unique, unlike the msgid.
    pub id: JobId,
    /// The REQUEST msgid (a fresh uuid4 for text SCHEDs).
    pub msgid: MsgId,
    /// REQUEST frame 4 as the client sent it.
    pub queue_frame: Frame,
    /// REQUEST frame 5, the headers CSV as the client sent it.
    pub headers: Frame,
    /// REQUEST frame 6 (the text protocol's data).
    pub body: Frame,
    /// Frames after frame 6, forwarded unchanged.
    pub extra: Vec<Frame>,
    /// When the broker took responsibility for the job.
    pub accepted_at: Instant,
    /// Who sent it.
    pub origin: Origin,
    /// How many times it went back to its queue because the worker holding
    /// it died (see [`crate::limits::MAX_DELIVERIES`]).
    pub redeliveries: u32,
}

/// A worker's life stage, shared between its home shard and the shards of
/// its queues.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum WorkerState {
    /// Takes jobs.
    Live = 0,
    /// Said KBYE: gets no new jobs; its in-flight jobs may still complete.
    Draining = 1,
    /// Expired, replaced or unreachable: skipped and removed everywhere.
    Dead = 2,
}

/// The part of a worker that every shard of its queues can see: its free
/// slots (READY credits) and state. One pool of slots per worker, claimed by
/// compare-and-swap, so credit stays exact across shards (README,
/// "How it works").
#[derive(Debug)]
pub struct WorkerShared {
    /// Registration key.
    pub key: WorkerKey,
    /// The worker's identity on the backend socket.
    pub id: PeerId,
    /// The shard that owns the worker's liveness and in-flight table.
    pub home: usize,
    /// `(weight, queue)` in INFORM order.
    pub queues: Vec<(i64, QueueName)>,
    slots: AtomicI64,
    state: AtomicU8,
}

impl WorkerShared {
    /// A live worker with no free slots.
    pub fn new(key: WorkerKey, id: PeerId, home: usize, queues: Vec<(i64, QueueName)>) -> WorkerShared {
        WorkerShared { key, id, home, queues, slots: AtomicI64::new(0), state: AtomicU8::new(WorkerState::Live as u8) }
    }

    /// Free slots now.
    pub fn slots(&self) -> i64 {
        self.slots.load(Ordering::Acquire)
    }

    /// Adds one free slot (a READY).
    pub fn add_slot(&self) {
        self.slots.fetch_add(1, Ordering::AcqRel);
    }

    /// Takes one free slot if the worker is live and has one.
    pub fn try_claim(&self) -> bool {
        if self.state() != WorkerState::Live {
            return false;
        }
        self.slots.fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| (s > 0).then_some(s - 1)).is_ok()
    }

    /// The worker's state.
    pub fn state(&self) -> WorkerState {
        match self.state.load(Ordering::Acquire) {
            0 => WorkerState::Live,
            1 => WorkerState::Draining,
            _ => WorkerState::Dead,
        }
    }

    /// Moves the worker to `state` (never back to Live).
    pub fn set_state(&self, state: WorkerState) {
        self.state.fetch_max(state as u8, Ordering::AcqRel);
    }
}
