//! Job flow handlers: REQUEST, the unknown-queue fallback, admission (one
//! rule for both protocols), the waiting FIFO, worker selection, dispatch
//! and requeue.

use std::sync::Arc;

use super::{Cx, Shard};
use crate::broker::job::{Job, JobFrames, Origin};
use crate::broker::msg::{Dest, OnFail, OutMsg, Outgoing, ShardMsg};
use crate::broker::types::{WorkerShared, WorkerState};
use crate::ids::{JobId, MsgId, PeerId, QueueName};
use crate::limits;
use crate::metrics::counters::Counters;
use crate::metrics::latency::Kind;
use crate::protocol::text::ErrorCode;

impl Shard {
    pub(super) fn handle_request(&mut self, client: PeerId, frames: JobFrames, fallback_done: bool, cx: &mut Cx) {
        if !fallback_done && !self.queues.is_known(frames.queue()) {
            let index = self.shard_of(limits::DEFAULT_QUEUE.as_bytes());
            return self.send_to_shard(index, ShardMsg::Request { client, frames, fallback_done: true }, cx);
        }
        let queue =
            if fallback_done { QueueName::named(limits::DEFAULT_QUEUE) } else { QueueName::from(frames.queue()) };
        if let Err(code) = self.admit(&queue) {
            let text = match code {
                ErrorCode::QueueFull => {
                    format!("queue {queue} holds {} jobs, its limit", self.queues.waiting(&queue.0))
                }
                _ => code.default_text().to_string(),
            };
            return self.send_error(&client, MsgId::from(frames.msgid()), code.as_str(), text, cx);
        }
        let accepted = OutMsg::Accepted(frames.clone());
        cx.out.emqp(Outgoing { dest: Dest::Frontend, peer: client, msg: accepted, on_fail: OnFail::Count });
        let mut job = Job::new(self.next_job_id(), frames, Origin::Emqp, fallback_done, self.ctx.started, cx.now);
        self.log_accepted(&mut job);
        self.enqueue_new(&queue, job, cx);
    }

    /// Whether a new job may join `queue` now; the refusal (counted) says
    /// why. The one admission rule of both protocols: eMQP answers a
    /// refusal with `ERROR <CODE>`, text with `ERR <CODE>`, the same tokens.
    pub(super) fn admit(&self, queue: &QueueName) -> Result<(), ErrorCode> {
        if self.is_draining() {
            Counters::bump(&self.ctx.counters.rejected_shutting_down);
            return Err(ErrorCode::ShuttingDown);
        }
        if self.queues.waiting(&queue.0) >= self.ctx.config.max_queue_len {
            Counters::bump(&self.ctx.counters.rejected_queue_full);
            return Err(ErrorCode::QueueFull);
        }
        Ok(())
    }

    /// The next job id of this shard.
    pub(super) fn next_job_id(&mut self) -> JobId {
        self.accepted += 1;
        JobId::new(self.index, self.accepted)
    }

    /// Takes responsibility for an admitted job: puts it at the back of
    /// `queue` and dispatches what can be.
    pub(super) fn enqueue_new(&mut self, queue: &QueueName, job: Job, cx: &mut Cx) {
        Counters::bump(&self.ctx.counters.accepted_jobs);
        self.queues.push_back(queue, job);
        self.pump(queue, cx);
    }

    /// Puts a job that was already accepted back at the back (`DCL`) or the
    /// front of its queue, then dispatches. Never refused: a job coming back
    /// is always taken back, above the queue limit too.
    pub(super) fn enqueue_again(&mut self, mut job: Job, front: bool, cx: &mut Cx) {
        let queue = job.queue();
        if front {
            self.log_requeued(&mut job);
            self.queues.push_front(&queue, vec![job]);
        } else {
            self.queues.push_back(&queue, job);
        }
        self.pump(&queue, cx);
    }

    pub(super) fn handle_requeue(&mut self, queue: QueueName, mut jobs: Vec<Job>, cx: &mut Cx) {
        for job in &mut jobs {
            self.log_requeued(job);
        }
        self.queues.push_front(&queue, jobs);
        self.pump(&queue, cx);
    }

    /// Puts jobs of one queue back at its front, on whichever shard owns it.
    pub(super) fn requeue(&mut self, queue: QueueName, jobs: Vec<Job>, cx: &mut Cx) {
        self.ctx.counters.requeued_jobs.fetch_add(jobs.len() as u64, std::sync::atomic::Ordering::Relaxed);
        let index = self.shard_of(&queue.0);
        self.send_to_shard(index, ShardMsg::Requeue { queue, jobs }, cx);
    }

    /// Dispatches waiting jobs of `queue` while a candidate has a free slot.
    pub(super) fn pump(&mut self, queue: &QueueName, cx: &mut Cx) {
        while let Some((worker, job)) = self.queues.next_dispatch(&queue.0) {
            let waited = cx.now.saturating_duration_since(job.accepted_at(self.ctx.started));
            self.latency.record(&queue.0, Kind::QueueWait, waited);
            self.dispatch_job(&worker, job, cx);
        }
    }

    /// Sends `job` to `worker` (a slot already claimed). The worker's home
    /// shard hears of it before the frames can reach the worker, so its
    /// REPLY always finds the in-flight record.
    fn dispatch_job(&mut self, worker: &Arc<WorkerShared>, job: Job, cx: &mut Cx) {
        Counters::bump(&self.ctx.counters.dispatched_jobs);
        self.log_dispatched(&job);
        let msg = OutMsg::Job(job.frames.clone());
        self.send_to_shard(worker.home, ShardMsg::Dispatched { key: worker.key, job }, cx);
        let on_fail = OnFail::Job { home: worker.home, key: worker.key };
        cx.out.emqp(Outgoing { dest: Dest::Backend, peer: worker.id.clone(), msg, on_fail });
    }

    pub(super) fn handle_add_candidate(
        &mut self,
        queue: QueueName,
        weight: i64,
        worker: Arc<WorkerShared>,
        cx: &mut Cx,
    ) {
        self.queues.add_candidate(&queue, weight, worker);
        self.pump(&queue, cx);
    }

    /// `worker` got a free slot: try its queues in INFORM order from
    /// position `from` (EventMQ 0.3.13: the first queue with waiting jobs
    /// takes the slot; spec §5.4). Queues owned here are pumped; at the
    /// first one owned by another shard the wake is handed on to that shard,
    /// so a later queue never takes the slot before an earlier one had its
    /// turn, whatever shards they live on.
    pub(super) fn handle_wake(&mut self, worker: &Arc<WorkerShared>, from: usize, cx: &mut Cx) {
        for (at, (_, queue)) in worker.queues.iter().enumerate().skip(from) {
            if worker.slots() <= 0 || worker.state() != WorkerState::Live {
                return;
            }
            let index = self.shard_of(&queue.0);
            if index != self.index {
                return self.send_to_shard(index, ShardMsg::Wake { worker: worker.clone(), from: at }, cx);
            }
            self.pump(queue, cx);
        }
    }
}
