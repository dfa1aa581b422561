//! Routing to shards and the worker state shared by the shards. The job
//! record is in [`crate::job`].

use std::sync::atomic::{AtomicI64, AtomicU8, Ordering};

use crate::ids::{PeerId, QueueName, WorkerKey};

pub use crate::ids::shard_of;

pub use crate::job::{Job, JobFrames, Origin};

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
/// compare-and-swap, so credit stays exact across shards (DESIGN "Worker
/// credit crosses shards").
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
