//! [`QueueTable`]: the queues a shard owns. Each queue is a FIFO of waiting
//! jobs, its candidate workers in selection order, and its figures. Data
//! and its rules only: the handlers in `flow.rs` decide what to do.
//!
//! Queues are reclaimed: one that holds no job, has no live worker and no
//! text offer is forgotten after [`crate::config::RouterConfig::queue_idle_grace`]
//! ([`QueueTable::sweep`]), with everything keyed by its name. The number
//! of queues of all shards together is kept in one shared counter, which
//! admission compares with `max_queues`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::broker::counts::{QueueCounter, QueueCounts};
use crate::broker::selection::Candidates;
use crate::broker::snapshot::QueueSnap;
use crate::broker::types::WorkerShared;
use crate::ids::{FastMap, QueueName, WorkerKey};
use crate::job::Job;
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
    /// Bytes of the waiting jobs' buffers.
    bytes: usize,
    /// Since when a sweep has found the queue idle (cleared by any use).
    idle_since: Option<Instant>,
    /// Both protocols' job counts since start.
    counts: QueueCounts,
}

/// The queues of one shard, by name.
#[derive(Debug)]
pub struct QueueTable {
    map: FastMap<QueueName, QueueState>,
    /// Queues of every shard together (shared with the other shards).
    count: Arc<AtomicUsize>,
}

impl QueueState {
    /// The position right behind the last job sent back by registration
    /// `key` among the sent-back jobs that lead the queue; 0 when none is.
    fn behind_sent_back_by(&self, key: u32) -> usize {
        let leading = self.waiting.iter().take_while(|j| j.back_from().is_some());
        leading.enumerate().filter(|(_, j)| j.back_from() == Some(key)).last().map_or(0, |(i, _)| i + 1)
    }
}

impl QueueTable {
    /// An empty table counting its queues in `count` (shared by all shards).
    pub fn new(count: Arc<AtomicUsize>) -> QueueTable {
        QueueTable { map: FastMap::default(), count }
    }

    /// Whether `queue` exists here.
    pub fn exists(&self, queue: &[u8]) -> bool {
        self.map.contains_key(queue)
    }

    /// Queues of every shard together.
    pub fn total(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// Bytes of the waiting jobs of `queue`.
    pub fn bytes(&self, queue: &[u8]) -> usize {
        self.map.get(queue).map_or(0, |q| q.bytes)
    }

    /// Whether a REQUEST for `queue` stays on it rather than falling back to
    /// `default` (EventMQ 0.3.13 falls back for every queue no connected
    /// worker declared; emq's rule, docs/emqp.md "Unknown queues"): a queue
    /// is known while a worker declares it and until it is reclaimed, one
    /// idle grace after the last one left (so a restarting worker's jobs wait
    /// for it instead of running elsewhere), or while it holds jobs.
    /// `default` is always known.
    pub fn is_known(&self, queue: &[u8]) -> bool {
        queue == limits::DEFAULT_QUEUE.as_bytes()
            || self.map.get(queue).is_some_and(|q| q.declared || !q.waiting.is_empty())
    }

    /// Jobs waiting in `queue`.
    pub fn waiting(&self, queue: &[u8]) -> usize {
        self.map.get(queue).map_or(0, |q| q.waiting.len())
    }

    /// Puts `job` at the back of `queue`.
    pub fn push_back(&mut self, queue: &QueueName, mut job: Job) {
        job.set_back_from(None);
        let q = self.entry(queue);
        q.bytes += job.frames.len();
        q.waiting.push_back(job);
    }

    /// Puts `jobs` at the front of `queue`, in their order (the first of
    /// `jobs` ends up first in line).
    ///
    /// Jobs sent back by the removal of worker registration `k` (all of
    /// `jobs` then carry [`Job::back_from`] `== Some(k)`) go right behind the
    /// jobs `k` sent back before, if some still wait among the sent-back
    /// jobs that lead the queue. A worker removed while jobs were on their
    /// way to it sends its recorded jobs back in one batch, then each job
    /// still on its way on its own as its home shard hears of it: without
    /// this, each of those would jump ahead of the one before and their
    /// order would be reversed.
    pub fn push_front(&mut self, queue: &QueueName, jobs: Vec<Job>) {
        let q = self.entry(queue);
        q.bytes += jobs.iter().map(|j| j.frames.len()).sum::<usize>();
        let at = jobs.first().and_then(Job::back_from).map_or(0, |key| q.behind_sent_back_by(key));
        if at == 0 {
            for job in jobs.into_iter().rev() {
                q.waiting.push_front(job);
            }
        } else {
            for (i, job) in jobs.into_iter().enumerate() {
                q.waiting.insert(at + i, job);
            }
        }
    }

    /// Takes the oldest waiting job of `queue`.
    pub fn pop(&mut self, queue: &[u8]) -> Option<Job> {
        let q = self.map.get_mut(queue)?;
        q.idle_since = None;
        let mut job = q.waiting.pop_front()?;
        q.bytes -= job.frames.len();
        job.set_back_from(None);
        Some(job)
    }

    /// The next dispatch of `queue`: its oldest job and a worker whose free
    /// slot has been claimed for it (EventMQ's selection rule, see
    /// [`Candidates::select`]). `None` when nothing waits or no candidate
    /// has a slot; then nothing changes.
    pub fn next_dispatch(&mut self, queue: &[u8]) -> Option<(Arc<WorkerShared>, Job)> {
        let q = self.map.get_mut(queue)?;
        if q.waiting.is_empty() {
            return None;
        }
        let worker = q.candidates.select()?;
        let mut job = q.waiting.pop_front()?;
        q.bytes -= job.frames.len();
        job.set_back_from(None);
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

    /// Pauses candidate `key` of `queue` (no jobs of it for now), or
    /// resumes it.
    pub fn pause_candidate(&mut self, queue: &QueueName, key: WorkerKey, paused: bool) {
        if let Some(q) = self.map.get_mut(queue) {
            q.candidates.pause(key, paused);
        }
    }

    /// Removes a candidate of `queue`, if present.
    pub fn remove_candidate(&mut self, queue: &QueueName, key: WorkerKey) {
        if let Some(q) = self.map.get_mut(queue) {
            q.candidates.remove(key);
        }
    }

    /// Forgets every queue that a sweep found idle at least `grace` ago and
    /// that is still idle: no waiting job, no live worker, no text offer
    /// (`offered(queue)` is 0). Marks newly idle ones. Returns the names
    /// forgotten. Linear in the queues of this shard; run every half grace.
    pub fn sweep(&mut self, now: Instant, grace: Duration, offered: impl Fn(&QueueName) -> usize) -> Vec<QueueName> {
        let mut gone = Vec::new();
        for (name, q) in self.map.iter_mut() {
            let idle = q.waiting.is_empty() && q.candidates.is_empty() && offered(name) == 0;
            match (idle, q.idle_since) {
                (false, _) => q.idle_since = None,
                (true, None) => q.idle_since = Some(now),
                (true, Some(since)) if now.saturating_duration_since(since) >= grace => gone.push(name.clone()),
                (true, Some(_)) => {}
            }
        }
        for name in &gone {
            self.map.remove(name);
        }
        self.count.fetch_sub(gone.len(), Ordering::Relaxed);
        if !gone.is_empty() && self.map.capacity() > 4 * self.map.len().max(64) {
            self.map.shrink_to_fit();
        }
        gone
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
    pub fn jobs(&self, queue: &[u8]) -> impl Iterator<Item = &Job> {
        self.map.get(queue).into_iter().flat_map(|q| q.waiting.iter())
    }

    /// Every waiting job, by queue (shutdown log, tests).
    pub fn waiting_jobs(&self) -> impl Iterator<Item = (&QueueName, &Job)> {
        self.map.iter().flat_map(|(name, q)| q.waiting.iter().map(move |j| (name, j)))
    }

    /// Every queue's name (the write-ahead log's compaction walks them).
    pub fn names(&self) -> Vec<QueueName> {
        self.map.keys().cloned().collect()
    }

    /// Calls `f` on up to `max` waiting jobs of `queue` from position
    /// `from`; returns how many it saw and the position to go on from
    /// (`None` at the end of the queue). Positions shift as the queue
    /// moves: a caller going on later may see a job twice or miss one.
    pub fn visit_waiting_mut(
        &mut self,
        queue: &[u8],
        from: usize,
        max: usize,
        mut f: impl FnMut(&mut Job),
    ) -> (usize, Option<usize>) {
        let Some(q) = self.map.get_mut(queue) else { return (0, None) };
        let end = q.waiting.len().min(from.saturating_add(max));
        if from >= end {
            return (0, None);
        }
        for job in q.waiting.range_mut(from..end) {
            f(job);
        }
        (end - from, (end < q.waiting.len()).then_some(end))
    }

    fn entry(&mut self, queue: &QueueName) -> &mut QueueState {
        // A queue name is inline bytes: the clone costs no allocation.
        let count = &self.count;
        let q = self.map.entry(queue.clone()).or_insert_with(|| {
            count.fetch_add(1, Ordering::Relaxed);
            QueueState::default()
        });
        q.idle_since = None;
        q
    }
}
