//! [`QueueTable`]: the queues a shard owns. Each queue is a FIFO of waiting
//! jobs, its candidate workers in selection order, and its figures. Data
//! and its rules only: the handlers in `flow.rs` decide what to do.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::broker::counts::{QueueCounter, QueueCounts};
use crate::broker::selection::Candidates;
use crate::broker::snapshot::QueueSnap;
use crate::broker::types::{Job, WorkerShared};
use crate::ids::{QueueName, WorkerKey};
use crate::limits;

/// One queue.
#[derive(Debug, Default)]
struct QueueState {
    /// Jobs not yet dispatched or offered, oldest first.
    waiting: VecDeque<Job>,
    /// Workers serving the queue, in selection order.
    candidates: Candidates,
    /// Whether a worker has ever declared this queue (see [`QueueTable::is_known`]).
    declared: bool,
    /// Jobs dispatched to eMQP workers since start.
    dispatched: u64,
    /// Both protocols' job counts since start.
    counts: QueueCounts,
}

/// The queues of one shard, by name.
#[derive(Debug, Default)]
pub struct QueueTable {
    map: HashMap<QueueName, QueueState>,
}

impl QueueTable {
    /// Whether a REQUEST for `queue` stays on it rather than falling back to
    /// `default` (EventMQ 0.3.13 falls back for every queue no connected
    /// worker declared; emq's rule, docs/emqp.md "Unknown queues"): a queue
    /// is known once any worker has declared it in an INFORM (for the life of
    /// the broker, so a restarting worker's jobs wait for it instead of
    /// running elsewhere), or while it holds jobs. `default` is always known.
    pub fn is_known(&self, queue: &QueueName) -> bool {
        queue.0 == limits::DEFAULT_QUEUE.as_bytes()
            || self.map.get(queue).is_some_and(|q| q.declared || !q.waiting.is_empty())
    }

    /// Jobs waiting in `queue`.
    pub fn waiting(&self, queue: &QueueName) -> usize {
        self.map.get(queue).map_or(0, |q| q.waiting.len())
    }

    /// Puts `job` at the back of `queue`.
    pub fn push_back(&mut self, queue: &QueueName, job: Job) {
        self.entry(queue).waiting.push_back(job);
    }

    /// Puts `jobs` at the front of `queue`, in their order (the first of
    /// `jobs` ends up first in line).
    pub fn push_front(&mut self, queue: &QueueName, jobs: impl DoubleEndedIterator<Item = Job>) {
        let q = self.entry(queue);
        for job in jobs.rev() {
            q.waiting.push_front(job);
        }
    }

    /// Takes the oldest waiting job of `queue`.
    pub fn pop(&mut self, queue: &QueueName) -> Option<Job> {
        self.map.get_mut(queue)?.waiting.pop_front()
    }

    /// The next dispatch of `queue`: its oldest job and a worker whose free
    /// slot has been claimed for it (EventMQ's selection rule, see
    /// [`Candidates::select`]). `None` when nothing waits or no candidate
    /// has a slot; then nothing changes.
    pub fn next_dispatch(&mut self, queue: &QueueName) -> Option<(Arc<WorkerShared>, Job)> {
        let q = self.map.get_mut(queue)?;
        if q.waiting.is_empty() {
            return None;
        }
        let worker = q.candidates.select()?;
        let job = q.waiting.pop_front()?;
        q.dispatched += 1;
        q.counts.bump(QueueCounter::Dispatched);
        Some((worker, job))
    }

    /// Adds one to `queue`'s `counter`.
    pub fn count(&mut self, queue: &QueueName, counter: QueueCounter) {
        self.entry(queue).counts.bump(counter);
    }

    /// Adds (or re-weights) a candidate of `queue` and marks the queue
    /// declared.
    pub fn add_candidate(&mut self, queue: &QueueName, weight: i64, worker: Arc<WorkerShared>) {
        let q = self.entry(queue);
        q.declared = true;
        q.candidates.add(weight, worker);
    }

    /// Removes a candidate of `queue`, if present.
    pub fn remove_candidate(&mut self, queue: &QueueName, key: WorkerKey) {
        if let Some(q) = self.map.get_mut(queue) {
            q.candidates.remove(key);
        }
    }

    /// Every queue's figures, sorted by name, with `offered(queue)` jobs
    /// held by text offers. Linear in queues.
    pub fn snaps(&self, offered: impl Fn(&QueueName) -> usize) -> Vec<QueueSnap> {
        let mut out: Vec<QueueSnap> = self
            .map
            .iter()
            .map(|(name, q)| QueueSnap {
                name: name.to_string(),
                waiting: q.waiting.len(),
                offered: offered(name),
                processed: q.dispatched,
                counts: q.counts,
                served: q.declared,
                candidates: q.candidates.iter().map(|(w, x)| (*w, x.id.to_string())).collect(),
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// The waiting jobs of `queue`, front first.
    pub fn jobs(&self, queue: &QueueName) -> impl Iterator<Item = &Job> {
        self.map.get(queue).into_iter().flat_map(|q| q.waiting.iter())
    }

    /// Every waiting job, by queue (shutdown log, tests).
    pub fn waiting_jobs(&self) -> impl Iterator<Item = (&QueueName, &Job)> {
        self.map.iter().flat_map(|(name, q)| q.waiting.iter().map(move |j| (name, j)))
    }

    fn entry(&mut self, queue: &QueueName) -> &mut QueueState {
        // Look up first: no key clone on the hot path.
        if !self.map.contains_key(queue) {
            self.map.insert(queue.clone(), QueueState::default());
        }
        match self.map.get_mut(queue) {
            Some(q) => q,
            None => unreachable!("inserted above"),
        }
    }
}
