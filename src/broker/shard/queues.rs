//! Queue handlers: REQUEST, the unknown-queue fallback, the waiting FIFO,
//! worker selection and dispatch.

use std::collections::VecDeque;
use std::sync::Arc;

use super::Shard;
use crate::broker::msg::{Dest, OnFail, Outgoing, ShardMsg};
use crate::broker::selection::Candidates;
use crate::broker::snapshot::QueueSnap;
use crate::broker::types::{cut, show, Job, Origin, QueueName, WorkerKey, WorkerShared};
use crate::limits;
use crate::metrics::counters::Counters;
use crate::metrics::latency::Kind;
use crate::protocol::emqp::{Command, Message};
use crate::protocol::headers;

/// One queue: its waiting jobs and the workers that serve it.
#[derive(Debug, Default)]
pub struct QueueState {
    /// Jobs not yet dispatched or offered, oldest first.
    pub waiting: VecDeque<Job>,
    /// Workers serving the queue, in selection order.
    pub candidates: Candidates,
    /// Whether a worker has ever declared this queue (see [`Shard::is_known`]).
    pub declared: bool,
    /// Jobs dispatched to eMQP workers.
    pub processed: u64,
}

impl Shard {
    /// Whether a REQUEST for `queue` stays on it rather than falling back to
    /// `default` (EventMQ spec §5.5, D10 decided): a queue is known once any
    /// worker has declared it in an INFORM (for the life of the broker, so a
    /// restarting worker's jobs wait for it instead of running elsewhere), or
    /// while it holds jobs. `default` is always known.
    pub(super) fn is_known(&self, queue: &QueueName) -> bool {
        queue.0 == limits::DEFAULT_QUEUE.as_bytes()
            || self.queues.get(queue).is_some_and(|q| q.declared || !q.waiting.is_empty())
    }

    pub(super) fn handle_request(&mut self, queue: QueueName, job: Job, fallback_done: bool) {
        if !fallback_done && !self.is_known(&queue) {
            let default = QueueName::named(limits::DEFAULT_QUEUE);
            let index = self.shard_of(&default);
            self.send_to_shard(index, ShardMsg::Request { queue: default, job, fallback_done: true });
            return;
        }
        let Origin::Emqp(client) = job.origin.clone() else {
            self.enqueue(queue, job, false);
            return;
        };
        if self.is_draining() {
            Counters::bump(&self.ctx.counters.rejected_shutting_down);
            return self.send_error(&client, job.msgid, "SHUTTING_DOWN", "the broker is shutting down".into());
        }
        let waiting = self.queues.get(&queue).map_or(0, |q| q.waiting.len());
        if waiting >= self.ctx.config.max_queue_len {
            Counters::bump(&self.ctx.counters.rejected_queue_full);
            let text = format!("queue {queue} holds {waiting} jobs, its limit");
            return self.send_error(&client, job.msgid, "QUEUE_FULL", text);
        }
        Counters::bump(&self.ctx.counters.accepted_jobs);
        self.send(Dest::Frontend, &client, Command::Reply { body: job.msgid.clone() }, OnFail::Count);
        self.enqueue(queue, job, false);
    }

    /// Puts `job` on `queue` (front or back), then dispatches what it can.
    /// Always succeeds: the limit is checked before a job is accepted, and a
    /// job coming back is always taken back.
    pub(super) fn enqueue(&mut self, queue: QueueName, job: Job, front: bool) {
        let q = self.queues.entry(queue.clone()).or_default();
        if front {
            q.waiting.push_front(job);
        } else {
            q.waiting.push_back(job);
        }
        self.pump(&queue);
    }

    /// Puts `jobs` at the front of `queue` in their order, then dispatches.
    pub(super) fn enqueue_front(&mut self, queue: QueueName, jobs: Vec<Job>) {
        let q = self.queues.entry(queue.clone()).or_default();
        for job in jobs.into_iter().rev() {
            q.waiting.push_front(job);
        }
        self.pump(&queue);
    }

    /// Dispatches waiting jobs of `queue` while a candidate has a free slot.
    pub(super) fn pump(&mut self, queue: &QueueName) {
        loop {
            let Some(q) = self.queues.get_mut(queue) else { return };
            if q.waiting.is_empty() {
                return;
            }
            let Some(worker) = q.candidates.select() else { return };
            let Some(job) = q.waiting.pop_front() else { return };
            q.processed += 1;
            self.latency.record(queue, Kind::QueueWait, job.accepted_at.elapsed());
            self.dispatch(&worker, queue.clone(), job);
        }
    }

    /// Sends `job` to `worker` (a slot already claimed) and records it in the
    /// worker's in-flight table before the frames leave, so the REPLY can
    /// never overtake the record.
    fn dispatch(&mut self, worker: &Arc<WorkerShared>, queue: QueueName, job: Job) {
        let command = Command::Request {
            queue: job.queue_frame.clone(),
            headers: headers::with_reply_requested(&job.headers),
            body: job.body.clone(),
            extra: job.extra.clone(),
        };
        let frames = Message { msgid: job.msgid.clone(), command }.encode();
        Counters::bump(&self.ctx.counters.dispatched_jobs);
        self.send_to_shard(worker.home, ShardMsg::Dispatched { key: worker.key, queue, job });
        let on_fail = OnFail::Job { home: worker.home, key: worker.key };
        self.out.send(Outgoing { dest: Dest::Backend, peer: worker.id.clone(), frames, on_fail });
    }

    pub(super) fn handle_add_candidate(&mut self, queue: QueueName, weight: i64, worker: Arc<WorkerShared>) {
        let q = self.queues.entry(queue.clone()).or_default();
        q.declared = true;
        q.candidates.add(weight, worker);
        self.pump(&queue);
    }

    pub(super) fn handle_remove_candidate(&mut self, queue: QueueName, key: WorkerKey) {
        if let Some(q) = self.queues.get_mut(&queue) {
            q.candidates.remove(key);
        }
    }

    /// `worker` got a free slot: try its queues owned here, in INFORM order
    /// (EventMQ spec §5.4: the first queue with waiting jobs takes the slot).
    pub(super) fn wake(&mut self, worker: &Arc<WorkerShared>) {
        for (_, queue) in &worker.queues {
            if worker.slots() <= 0 {
                return;
            }
            if self.shard_of(queue) == self.index {
                self.pump(queue);
            }
        }
    }

    pub(super) fn queue_snaps(&self) -> Vec<QueueSnap> {
        let mut out: Vec<QueueSnap> = self
            .queues
            .iter()
            .map(|(name, q)| QueueSnap {
                name: name.to_string(),
                waiting: q.waiting.len(),
                offered: self.offers.values().filter(|o| &o.queue == name).count(),
                processed: q.processed,
                candidates: q.candidates.iter().map(|(w, x)| (*w, x.id.to_string())).collect(),
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// Logs every job still queued on this shard (at shutdown).
    pub(super) fn log_remaining_queued(&self) {
        for (queue, q) in &self.queues {
            if q.waiting.is_empty() {
                continue;
            }
            tracing::warn!(shard = self.index, %queue, jobs = q.waiting.len(), "jobs still queued at shutdown");
            for job in &q.waiting {
                tracing::warn!(%queue, msgid = %show(&job.msgid), body = %cut(&job.body), "queued job not run");
            }
        }
    }
}
