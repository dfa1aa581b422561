//! Job flow handlers: REQUEST, the unknown-queue fallback, admission (one
//! rule for both protocols), the waiting FIFO, worker selection, dispatch
//! and requeue.

use std::sync::Arc;

use super::workers::InFlight;
use super::{Cx, Shard};
use crate::broker::counts::QueueCounter;
use crate::broker::msg::{Dest, OnFail, Outgoing, ShardMsg};
use crate::broker::types::{Job, NewJob, Origin, WorkerShared};
use crate::ids::{JobId, PeerId, QueueName};
use crate::limits;
use crate::metrics::counters::Counters;
use crate::metrics::latency::Kind;
use crate::protocol::emqp::{Command, Message};
use crate::protocol::headers;
use crate::protocol::text::ErrorCode;

impl Shard {
    pub(super) fn handle_request(&mut self, queue: QueueName, job: NewJob, fallback_done: bool, cx: &mut Cx) {
        if !fallback_done && !self.queues.is_known(&queue) {
            tracing::debug!(%queue, msgid = %job.msgid, "no worker serves the queue: the job goes to default");
            let default = QueueName::named(limits::DEFAULT_QUEUE);
            let index = self.shard_of(&default);
            return self.send_to_shard(index, ShardMsg::Request { queue: default, job, fallback_done: true }, cx);
        }
        let Origin::Emqp(client) = job.origin.clone() else {
            // Text jobs come as ShardMsg::Text; accept one anyway rather than lose it.
            let _ = self.accept(queue, job, cx);
            return;
        };
        if let Err(code) = self.admit(&queue) {
            let text = match code {
                ErrorCode::QueueFull => format!("queue {queue} holds {} jobs, its limit", self.queues.waiting(&queue)),
                _ => code.default_text().to_string(),
            };
            return self.send_error(&client, job.msgid, code.as_str(), text, cx);
        }
        let reply = Command::Reply { body: job.msgid.0.clone() };
        self.send(Dest::Frontend, &client, reply, OnFail::Count, cx);
        self.enqueue_new(queue, job, cx);
    }

    /// Whether a new job may join `queue` now; the refusal (counted) says
    /// why. The one admission rule of both protocols: eMQP answers a
    /// refusal with `ERROR <CODE>`, text with `ERR <CODE>`, the same tokens.
    pub(super) fn admit(&self, queue: &QueueName) -> Result<(), ErrorCode> {
        if self.is_draining() {
            Counters::bump(&self.ctx.counters.rejected_shutting_down);
            return Err(ErrorCode::ShuttingDown);
        }
        if self.queues.waiting(queue) >= self.ctx.config.max_queue_len {
            Counters::bump(&self.ctx.counters.rejected_queue_full);
            return Err(ErrorCode::QueueFull);
        }
        Ok(())
    }

    /// [`Shard::admit`], then [`Shard::enqueue_new`].
    pub(super) fn accept(&mut self, queue: QueueName, job: NewJob, cx: &mut Cx) -> Result<JobId, ErrorCode> {
        self.admit(&queue)?;
        Ok(self.enqueue_new(queue, job, cx))
    }

    /// Takes responsibility for an admitted job: gives it its id, puts it at
    /// the back of `queue` and dispatches what can be.
    pub(super) fn enqueue_new(&mut self, queue: QueueName, job: NewJob, cx: &mut Cx) -> JobId {
        Counters::bump(&self.ctx.counters.accepted_jobs);
        self.accepted += 1;
        let id = JobId::new(self.index, self.accepted);
        let (msgid, text) = (job.msgid.clone(), job.origin == Origin::Text);
        self.queues.push_back(&queue, job.accept(id, cx.now));
        let waiting = self.queues.waiting(&queue);
        let from = if text { "text" } else { "emqp" };
        tracing::debug!(%queue, job = %id, %msgid, %from, waiting, "job accepted and queued");
        self.pump(&queue, cx);
        id
    }

    /// Puts a job that was already accepted back at the back (`DCL`) or the
    /// front of `queue`, then dispatches. Never refused: a job coming back is
    /// always taken back, above the queue limit too.
    pub(super) fn enqueue_again(&mut self, queue: QueueName, job: Job, front: bool, cx: &mut Cx) {
        let to = if front { "front" } else { "back" };
        tracing::debug!(%queue, job = %job.id, msgid = %job.msgid, %to, "job requeued");
        if front {
            self.queues.push_front(&queue, std::iter::once(job));
        } else {
            self.queues.push_back(&queue, job);
        }
        self.pump(&queue, cx);
    }

    pub(super) fn handle_requeue(&mut self, queue: QueueName, jobs: Vec<Job>, cx: &mut Cx) {
        self.queues.push_front(&queue, jobs.into_iter());
        self.pump(&queue, cx);
    }

    /// Puts jobs back at the front of their queue, on whichever shard owns it.
    pub(super) fn requeue(&mut self, queue: QueueName, jobs: Vec<Job>, cx: &mut Cx) {
        for job in &jobs {
            tracing::debug!(%queue, job = %job.id, msgid = %job.msgid, to = %"front", "job requeued");
        }
        self.ctx.counters.requeued_jobs.fetch_add(jobs.len() as u64, std::sync::atomic::Ordering::Relaxed);
        let index = self.shard_of(&queue);
        self.send_to_shard(index, ShardMsg::Requeue { queue, jobs }, cx);
    }

    /// Dispatches waiting jobs of `queue` while a candidate has a free slot.
    pub(super) fn pump(&mut self, queue: &QueueName, cx: &mut Cx) {
        while let Some((worker, job)) = self.queues.next_dispatch(queue) {
            self.latency.record(queue, Kind::QueueWait, cx.now.saturating_duration_since(job.accepted_at));
            self.dispatch_job(&worker, queue.clone(), job, cx);
        }
    }

    /// Sends `job` to `worker` (a slot already claimed). The worker's home
    /// shard hears of it before the frames can reach the worker, so its
    /// REPLY always finds the in-flight record.
    fn dispatch_job(&mut self, worker: &Arc<WorkerShared>, queue: QueueName, job: Job, cx: &mut Cx) {
        let command = Command::Request {
            queue: job.queue_frame.clone(),
            headers: headers::with_reply_requested(&job.headers),
            body: job.body.clone(),
            extra: job.extra.clone(),
        };
        let frames = Message { msgid: job.msgid.0.clone(), command }.encode();
        Counters::bump(&self.ctx.counters.dispatched_jobs);
        tracing::debug!(%queue, job = %job.id, msgid = %job.msgid, worker = %worker.id, "job dispatched");
        self.send_to_shard(worker.home, ShardMsg::Dispatched { key: worker.key, queue, job }, cx);
        let on_fail = OnFail::Job { home: worker.home, key: worker.key };
        cx.out.emqp(Outgoing { dest: Dest::Backend, peer: worker.id.clone(), frames, on_fail });
    }

    /// Worker `worker` answered in-flight job `f`: counted as completed or
    /// failed on the queue's shard.
    pub(super) fn job_ended(&mut self, worker: &PeerId, f: InFlight, failed: bool, cx: &mut Cx) {
        let (counter, what) =
            if failed { (QueueCounter::Failed, "failed") } else { (QueueCounter::Completed, "completed") };
        tracing::debug!(queue = %f.queue, job = %f.job.id, msgid = %f.job.msgid, %worker, "job {what}");
        self.count(f.queue, counter, cx);
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

    /// `worker` got a free slot: try its queues owned here, in INFORM order
    /// (EventMQ 0.3.13: the first queue with waiting jobs takes the slot;
    /// docs/emqp.md, "Selection").
    pub(super) fn handle_wake(&mut self, worker: &Arc<WorkerShared>, cx: &mut Cx) {
        for (_, queue) in &worker.queues {
            if worker.slots() <= 0 {
                return;
            }
            if self.shard_of(queue) == self.index {
                self.pump(queue, cx);
            }
        }
    }
}
