//! Job flow handlers: REQUEST, the unknown-queue fallback, admission (one
//! rule for both protocols), the waiting FIFO, worker selection, dispatch
//! and requeue.

use std::sync::Arc;

use std::sync::atomic::Ordering;

use super::workers::InFlight;
use super::{Cx, Shard, Timer};
use crate::broker::counts::QueueCounter;
use crate::broker::egress::{Dest, OnFail, OutMsg, Outgoing};
use crate::broker::inbox::ShardMsg;
use crate::broker::types::{WorkerShared, WorkerState};
use crate::ids::{JobId, MsgId, PeerId, QueueName};
use crate::job::{Job, JobFrames, Origin};
use crate::joblog::StoreFault;
use crate::limits;
use crate::metrics::counters::Counters;
use crate::metrics::latency::Kind;
use crate::protocol::text::ErrorCode;

impl Shard {
    pub(super) fn handle_request(&mut self, client: PeerId, frames: JobFrames, fallback_done: bool, cx: &mut Cx) {
        let now_ms = self.unix_ms(cx.now);
        let keyed = has_chosen_identity(&client);
        // The window lives on the named queue's shard: the one the I/O
        // thread hands every REQUEST to, before any fallback.
        if keyed && !fallback_done {
            if let Some(seen) = self.dedup.find(client.as_bytes(), frames.msgid(), now_ms) {
                Counters::bump(&self.ctx.counters.dedup_hits);
                let (msgid, queue) = (crate::ids::show(frames.msgid()), crate::ids::show(frames.queue()));
                tracing::debug!(%queue, %msgid, client = %client, job = %seen.job, "duplicate REQUEST: answered with its first acceptance, no new job");
                let len = frames.len();
                let accepted = OutMsg::Accepted(frames);
                cx.out.emqp(Outgoing { dest: Dest::Frontend, peer: client, msg: accepted, on_fail: OnFail::Count });
                return super::release_in_transit(&self.ctx.in_transit_bytes, len);
            }
        }
        if !fallback_done && !self.queue_known(frames.queue(), cx) {
            let (queue, msgid) = (crate::ids::show(frames.queue()), crate::ids::show(frames.msgid()));
            tracing::debug!(%queue, %msgid, "no worker serves the queue: the job goes to default");
            let index = self.shard_of(limits::DEFAULT_QUEUE.as_bytes());
            return self.send_to_shard(index, ShardMsg::Request { client, frames, fallback_done: true }, cx);
        }
        let queue =
            if fallback_done { QueueName::named(limits::DEFAULT_QUEUE) } else { QueueName::from(frames.queue()) };
        let len = frames.len();
        if let Err(code) = self.admit(&queue, len, cx.now) {
            let text = self.refusal_text(code, &queue, len);
            self.send_error(&client, MsgId::from(frames.msgid()), code.as_str(), text, cx);
            return super::release_in_transit(&self.ctx.in_transit_bytes, len);
        }
        let accepted = OutMsg::Accepted(frames.clone());
        let seen = super::dedup::Seen { job: self.next_job_id(), at_unix_ms: now_ms };
        let mut job = Job::new(seen.job, frames, Origin::Emqp, fallback_done, self.ctx.started, cx.now);
        self.log_accepted(&mut job);
        let msgid = MsgId::from(job.frames.msgid());
        match self.shard_of(job.frames.queue()) {
            _ if !keyed => {}
            home if home == self.index => self.remember_key(&client, &msgid, seen),
            home => {
                let (client, job, at_unix_ms) = (client.clone(), seen.job, seen.at_unix_ms);
                cx.out.shard(home, ShardMsg::DedupKey { client, msgid, job, at_unix_ms });
            }
        }
        cx.out.emqp(Outgoing { dest: Dest::Frontend, peer: client, msg: accepted, on_fail: OnFail::Count });
        self.enqueue_new(&queue, job, cx);
        // Now counted in job_bytes: no longer in transit.
        super::release_in_transit(&self.ctx.in_transit_bytes, len);
    }

    /// Remembers the key of a REQUEST accepted as `seen.job` in this
    /// shard's duplicate window and logs it (a `ClientKey` record, so a
    /// restart or a take-over rebuilds the window); counts a key forgotten
    /// early for room.
    pub(super) fn remember_key(&mut self, client: &PeerId, msgid: &MsgId, seen: super::dedup::Seen) {
        let evicted = self.dedup.insert(client.as_bytes(), msgid.as_bytes(), seen);
        if evicted > 0 {
            self.ctx.counters.dedup_evicted.fetch_add(evicted as u64, Ordering::Relaxed);
        }
        self.log.client_key(seen.job, seen.at_unix_ms, client.as_bytes(), msgid.as_bytes());
    }

    /// Whether a new job of `bytes` bytes may join `queue` now; the refusal
    /// (counted) says why. The one admission rule of both protocols: eMQP
    /// answers a refusal with `ERROR <CODE>`, text with `ERR <CODE>`, the
    /// same tokens. Limits: the queue's jobs (`max_queue_len`) and bytes
    /// (`max_queue_bytes`), the bytes of every job in the broker (the memory
    /// limit), and the number of queues (`max_queues`, for a new name;
    /// `default` is always allowed), and before them the job log: it must
    /// be able to keep the job ([`Shard::store_refusal`]).
    pub(super) fn admit(&self, queue: &QueueName, bytes: usize, now: std::time::Instant) -> Result<(), ErrorCode> {
        let config = &self.ctx.config;
        let counters = &self.ctx.counters;
        if self.is_draining() {
            Counters::bump(&counters.rejected_shutting_down);
            return Err(ErrorCode::ShuttingDown);
        }
        match self.store_refusal(now) {
            Some(StoreFault::Full) => {
                Counters::bump(&counters.rejected_store_full);
                return Err(ErrorCode::StoreFull);
            }
            Some(StoreFault::Failed) => {
                Counters::bump(&counters.rejected_store_failed);
                return Err(ErrorCode::StoreFailed);
            }
            None => {}
        }
        let policy = self.ctx.policies.of(queue.as_bytes());
        let full = self.queues.waiting(&queue.0) >= policy.max_queue_len.get()
            || self.queues.bytes(&queue.0) + bytes > policy.max_queue_bytes.get()
            || self.ctx.job_bytes.load(Ordering::Relaxed) + bytes > self.ctx.memory_limit;
        if full {
            Counters::bump(&counters.rejected_queue_full);
            return Err(ErrorCode::QueueFull);
        }
        let new_name = !self.queues.exists(&queue.0) && queue.as_bytes() != limits::DEFAULT_QUEUE.as_bytes();
        if new_name && self.queues.total() >= config.max_queues {
            Counters::bump(&counters.rejected_queue_limit);
            return Err(ErrorCode::QueueLimit);
        }
        Ok(())
    }

    /// The human text of an eMQP refusal: which limit was hit.
    pub(super) fn refusal_text(&self, code: ErrorCode, queue: &QueueName, len: usize) -> String {
        let config = &self.ctx.config;
        let (jobs, bytes) = (self.queues.waiting(&queue.0), self.queues.bytes(&queue.0));
        let policy = self.ctx.policies.of(queue.as_bytes());
        match code {
            ErrorCode::QueueFull if jobs >= policy.max_queue_len.get() => {
                format!("queue {queue} holds {jobs} jobs, its limit")
            }
            ErrorCode::QueueFull if bytes + len > policy.max_queue_bytes.get() => {
                format!("queue {queue} holds {bytes} bytes; its limit is {}", policy.max_queue_bytes)
            }
            ErrorCode::QueueFull => format!(
                "the broker holds {} bytes of jobs; its limit is {}",
                self.ctx.job_bytes.load(Ordering::Relaxed),
                self.ctx.memory_limit
            ),
            ErrorCode::QueueLimit => format!("the broker holds {} queues, its limit", config.max_queues),
            ErrorCode::StoreFull => {
                "the job log is out of space (or below disk_free_limit); the job is not stored".to_string()
            }
            ErrorCode::StoreFailed => "the job log cannot be written now; the job is not stored".to_string(),
            _ => code.default_text().to_string(),
        }
    }

    /// A job leaves the broker (completed, deleted, dead-lettered): its
    /// bytes no longer count, and its `Done` record goes to the write-ahead
    /// log of the shard that accepted it.
    pub(super) fn job_done(&mut self, job: &Job, cx: &mut Cx) {
        self.ctx.job_bytes.fetch_sub(job.frames.len(), Ordering::Relaxed);
        self.log_done(job, cx);
    }

    /// How often idle queues are looked for: every half grace.
    pub(super) fn sweep_period(&self) -> std::time::Duration {
        (self.ctx.config.queue_idle_grace / 2).max(std::time::Duration::from_millis(50))
    }

    pub(super) fn queue_sweep_due(&mut self, cx: &mut Cx) {
        let grace = self.ctx.config.queue_idle_grace;
        // A queue holding jobs that wait for a retry or lie in the dead
        // set is not idle: its counts stay.
        let (offers, retries, dead) = (&self.offers, &self.retries, &self.dead);
        let gone = self.queues.sweep(cx.now, grace, |q| offers.held(q) + retries.count(q) + dead.count(q));
        let asked_gone = self.asked.sweep(cx.now);
        for name in &gone {
            self.latency.forget(&name.0);
        }
        // Counted over sweeps: names arriving slowly (with `durability =
        // "sync"` under load) are forgotten a few hundred per sweep.
        if self.trim.after_sweep(gone.len() + asked_gone) {
            crate::metrics::trim_heap();
        }
        if !gone.is_empty() {
            self.ctx.counters.queues_reclaimed.fetch_add(gone.len() as u64, Ordering::Relaxed);
            tracing::debug!(shard = self.index, queues = gone.len(), "idle queues forgotten");
        }
        self.timers.arm(cx.now + self.sweep_period(), Timer::QueueSweep);
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
        self.queues.count(queue, QueueCounter::Accepted);
        self.ctx.job_bytes.fetch_add(job.frames.len(), Ordering::Relaxed);
        let (id, msgid, from) = (job.id, crate::ids::show(job.frames.msgid()), job.origin());
        self.queues.push_back(queue, job);
        let waiting = self.queues.waiting(&queue.0);
        tracing::debug!(%queue, job = %id, %msgid, ?from, waiting, "job accepted and queued");
        self.pump(queue, cx);
    }

    /// Puts a job that was already accepted back at the back (`DCL`) or the
    /// front of its queue, then dispatches. Never refused: a job coming back
    /// is always taken back, above the queue limit too.
    pub(super) fn enqueue_again(&mut self, mut job: Job, front: bool, cx: &mut Cx) {
        let queue = job.queue();
        let to = if front { "front" } else { "back" };
        tracing::debug!(%queue, job = %job.id, msgid = %crate::ids::show(job.frames.msgid()), %to, "job requeued");
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
        for job in &jobs {
            let msgid = crate::ids::show(job.frames.msgid());
            tracing::debug!(%queue, job = %job.id, %msgid, to = %"front", "job requeued");
        }
        self.ctx.counters.requeued_jobs.fetch_add(jobs.len() as u64, Ordering::Relaxed);
        let index = self.shard_of(&queue.0);
        self.send_to_shard(index, ShardMsg::Requeue { queue, jobs }, cx);
    }

    /// Dispatches waiting jobs of `queue` while a candidate has a free slot,
    /// then offers what is left to long-poll ASKs waiting on it.
    pub(super) fn pump(&mut self, queue: &QueueName, cx: &mut Cx) {
        // A fenced shard's jobs are the new owner's (JobLog::fenced).
        if self.log.fenced() {
            return;
        }
        while let Some((worker, job)) = self.queues.next_dispatch(&queue.0) {
            let waited = cx.now.saturating_duration_since(job.accepted_at(self.ctx.started));
            self.latency.record(&queue.0, Kind::QueueWait, waited);
            self.dispatch_job(&worker, job, cx);
        }
        if !self.waits.is_empty() {
            self.serve_waits(queue, cx);
        }
    }

    /// Sends `job` to `worker` (a slot already claimed). The worker's home
    /// shard hears of it before the frames can reach the worker, so its
    /// REPLY always finds the in-flight record.
    fn dispatch_job(&mut self, worker: &Arc<WorkerShared>, job: Job, cx: &mut Cx) {
        Counters::bump(&self.ctx.counters.dispatched_jobs);
        self.log_dispatched(&job);
        let msg = OutMsg::Job(job.frames.clone());
        let msgid = crate::ids::show(job.frames.msgid());
        tracing::debug!(queue = %job.queue(), job = %job.id, %msgid, worker = %worker.id, "job dispatched");
        self.send_to_shard(worker.home, ShardMsg::Dispatched { key: worker.key, job }, cx);
        let on_fail = OnFail::Job { home: worker.home, key: worker.key };
        cx.out.emqp(Outgoing { dest: Dest::Backend, peer: worker.id.clone(), msg, on_fail });
    }

    /// Worker `worker` answered in-flight job `f`: counted as completed or
    /// failed on the queue's shard.
    pub(super) fn job_ended(&mut self, worker: &PeerId, f: &InFlight, failed: bool, cx: &mut Cx) {
        let (counter, what) =
            if failed { (QueueCounter::Failed, "failed") } else { (QueueCounter::Completed, "completed") };
        let (queue, msgid) = (f.job.queue(), crate::ids::show(f.job.frames.msgid()));
        tracing::debug!(%queue, job = %f.job.id, %msgid, %worker, "job {what}");
        self.count(queue, counter, cx);
    }

    pub(super) fn handle_add_candidate(
        &mut self,
        queue: QueueName,
        weight: i64,
        worker: Arc<WorkerShared>,
        inform: MsgId,
        cx: &mut Cx,
    ) {
        // A declared name is a queue like any other: past `max_queues` the
        // worker is told (ERROR QUEUE_LIMIT about its INFORM) and does not
        // serve it; its other queues are unaffected.
        let max = self.ctx.config.max_queues;
        let new_name = !self.queues.exists(&queue.0) && queue.as_bytes() != limits::DEFAULT_QUEUE.as_bytes();
        if new_name && self.queues.total() >= max {
            Counters::bump(&self.ctx.counters.rejected_queue_limit);
            crate::log_limited!(warn, worker = %worker.id, %queue, max, "declared queue refused: max_queues reached");
            let text = format!("queue {queue} not served: the broker holds {max} queues, its limit");
            return self.send_error_to(Dest::Backend, &worker.id, inform, ErrorCode::QueueLimit.as_str(), text, cx);
        }
        self.queues.add_candidate(&queue, weight, worker);
        self.pump(&queue, cx);
    }

    /// `worker` got a free slot: try its queues in INFORM order from
    /// position `from` (EventMQ 0.3.13: the first queue with waiting jobs
    /// takes the slot; docs/emqp.md "Selection"). Queues owned here are pumped; at the
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

/// Whether `client` chose its routing identity: ZeroMQ reserves identities
/// starting with a zero byte for the ones a ROUTER makes up for a peer that
/// sets none (5 bytes, a per-socket counter). Such an identity is new on
/// every connection, so a REQUEST sent again after a lost connection never
/// carries it again, and a restarted router hands the same values out
/// again to other peers: it is no key of the duplicate window.
fn has_chosen_identity(client: &PeerId) -> bool {
    client.as_bytes().first().is_some_and(|&b| b != 0)
}
