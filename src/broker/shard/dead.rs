//! Setbacks, retries and the dead set (README "Retries and the dead set").
//!
//! A delivery that comes to nothing is a setback ([`Setback`]), counted on
//! the job ([`Job::redeliveries`]). Whoever sees it (the worker's home
//! shard, or the queue's shard for text offers) calls [`Shard::set_back`];
//! the rest happens on the queue's shard, which owns the job's log:
//!
//! * past its allowed retries ([`retry::allowed_retries`]: `retry:N` or
//!   `max_retries`) the job is buried in the [`DeadSet`]: it leaves the
//!   memory limit, gets a `Buried` log record (so it survives a restart) and
//!   waits for `emq-cli dead retry` or `delete`;
//! * a failed result or a deadline: it waits out its [`retry::backoff`] in
//!   the [`RetryTable`], then joins the back of its queue;
//! * a lost worker or text consumer: straight back to the front of its
//!   queue (the job did not fail; whoever held it did).
//!
//! [`DeadSet`]: super::dead_set::DeadSet
//! [`RetryTable`]: super::retries::RetryTable

use std::sync::atomic::Ordering;

use crossbeam_channel::Sender;

use super::{Cx, Shard, Timer};
use crate::broker::admin::{AdminAnswer, DeadStep};
use crate::broker::counts::QueueCounter;
use crate::broker::dead::{DeadEntry, DeadTarget};
use crate::broker::inbox::ShardMsg;
use crate::broker::retry;
use crate::job::Job;
use crate::job::{DeadJob, Setback};
use crate::limits;
use crate::metrics::counters::Counters;

impl Shard {
    /// Counts one setback of `job` and sends it on to its queue's shard
    /// ([`Shard::handle_set_back`]): to the dead set, to wait for a retry,
    /// or back to the front of its queue.
    pub(super) fn set_back(&mut self, mut job: Job, why: Setback, cx: &mut Cx) {
        job.set_redeliveries(job.redeliveries() + 1);
        let index = self.shard_of(job.queue_bytes());
        self.send_to_shard(index, ShardMsg::SetBack { job, why }, cx);
    }

    /// Whether `job` (its setbacks counted) has run out of retries.
    pub(super) fn out_of_retries(&self, job: &Job) -> bool {
        job.redeliveries() > retry::allowed_retries(job, self.ctx.policies.of(job.queue_bytes()).max_retries)
    }

    /// On the queue's shard: `job` had a setback (already counted).
    pub(super) fn handle_set_back(&mut self, mut job: Job, why: Setback, cx: &mut Cx) {
        if self.out_of_retries(&job) {
            return self.bury(job, why, cx);
        }
        if !why.backs_off() {
            return self.enqueue_again(job, true, cx);
        }
        let config = &self.ctx.config;
        let wait = retry::backoff(job.redeliveries(), config.retry_backoff, config.retry_backoff_max, job.id.0);
        let (queue, msgid) = (job.queue(), crate::ids::show(job.frames.msgid()));
        tracing::debug!(%queue, job = %job.id, %msgid, why = why.as_str(), try_ = job.redeliveries() + 1, wait_ms = wait.as_millis() as u64, "job will be retried");
        Counters::bump(&self.ctx.counters.retried_jobs);
        self.queues.count(&queue, QueueCounter::Retried);
        job.set_back_from(None);
        self.log_requeued(&mut job);
        if wait.is_zero() {
            return self.enqueue_again(job, false, cx);
        }
        let at = cx.now + wait;
        self.retries.insert(at, job);
        self.timers.arm(at, Timer::RetryDue);
    }

    /// The retry timer: jobs whose wait is over join the back of their
    /// queues, earliest first.
    pub(super) fn retry_due(&mut self, cx: &mut Cx) {
        for job in self.retries.take_due(cx.now) {
            self.enqueue_again(job, false, cx);
        }
    }

    /// Puts `job` in the dead set of this shard (its queue's), saying `why`.
    fn bury(&mut self, job: Job, why: Setback, cx: &mut Cx) {
        Counters::bump(&self.ctx.counters.dead_lettered);
        self.ctx.job_bytes.fetch_sub(job.frames.len(), Ordering::Relaxed);
        let queue = job.queue();
        let (msgid, bytes, failures) = (crate::ids::show(job.frames.msgid()), job.frames.len(), job.redeliveries());
        crate::log_limited!(error, job = %job.id, %queue, %msgid, bytes, failures, why = why.as_str(), "job out of retries: moved to the dead set");
        self.queues.count(&queue, QueueCounter::DeadLettered);
        if bytes > self.ctx.config.dead_max_bytes {
            Counters::bump(&self.ctx.counters.dead_evicted);
            let max = self.ctx.config.dead_max_bytes;
            crate::log_limited!(warn, job = %job.id, %queue, %msgid, bytes, max, "dead job larger than dead_max_bytes: dropped");
            return self.log_done(&job, cx);
        }
        let mut dead = DeadJob { job, why, at_unix_ms: self.unix_ms(cx.now) };
        self.log_buried(&mut dead);
        self.keep_dead(dead, cx);
    }

    /// Adds `dead` to this shard's dead set and keeps the router-wide
    /// limits (`dead_max_jobs`, `dead_max_bytes`): this shard drops its own
    /// oldest dead jobs, never the one just added; when that is not enough
    /// it asks the other shards to drop theirs ([`ShardMsg::DeadTrim`]). So
    /// the set passes a limit by at most one job per shard, for as long as
    /// the other shards take to answer.
    pub(super) fn keep_dead(&mut self, dead: DeadJob, cx: &mut Cx) {
        self.ctx.dead_jobs.fetch_add(1, Ordering::Relaxed);
        self.ctx.dead_bytes.fetch_add(dead.job.frames.len(), Ordering::Relaxed);
        self.dead.insert(dead);
        if !self.trim_dead(1, cx) {
            for index in (0..self.ctx.shards).filter(|i| *i != self.index) {
                cx.out.shard(index, ShardMsg::DeadTrim);
            }
        }
    }

    /// Drops this shard's oldest dead jobs while the router's dead set is
    /// over a limit, keeping at least `keep`; whether it is within them.
    pub(super) fn trim_dead(&mut self, keep: usize, cx: &mut Cx) -> bool {
        let (max_jobs, max_bytes) = (self.ctx.config.dead_max_jobs, self.ctx.config.dead_max_bytes);
        let over = |ctx: &super::ShardContext| {
            ctx.dead_jobs.load(Ordering::Relaxed) > max_jobs || ctx.dead_bytes.load(Ordering::Relaxed) > max_bytes
        };
        while over(&self.ctx) && self.dead.len() > keep {
            let Some(gone) = self.dead.pop_oldest() else { break };
            self.forget_dead(&gone);
            Counters::bump(&self.ctx.counters.dead_evicted);
            let msgid = crate::ids::show(gone.job.frames.msgid());
            crate::log_limited!(warn, job = %gone.job.id, queue = %gone.job.queue(), %msgid, "dead set full: its oldest job dropped");
            self.log_done(&gone.job, cx);
        }
        !over(&self.ctx)
    }

    /// `dead` left this shard's dead set: the router-wide counts follow.
    fn forget_dead(&self, dead: &DeadJob) {
        self.ctx.dead_jobs.fetch_sub(1, Ordering::Relaxed);
        self.ctx.dead_bytes.fetch_sub(dead.job.frames.len(), Ordering::Relaxed);
    }

    /// `now` as milliseconds since the Unix epoch (the router's clock at
    /// start plus the time since): burial times and the duplicate window's
    /// clock.
    pub(super) fn unix_ms(&self, now: std::time::Instant) -> u64 {
        self.ctx.started_unix_ms + now.saturating_duration_since(self.ctx.started).as_millis() as u64
    }

    /// `DEAD_LIST`'s part held here: the oldest
    /// [`limits::DEAD_LIST_MAX`] dead jobs (of `queue` when given) and how
    /// many there are.
    pub(super) fn dead_list(&self, queue: Option<&crate::ids::QueueName>) -> AdminAnswer {
        let entries = self.dead.iter(queue.map(|q| &q.0[..])).take(limits::DEAD_LIST_MAX);
        let entries: Vec<DeadEntry> = entries.map(|d| DeadEntry::of(d, false)).collect();
        let total = queue.map_or_else(|| self.dead.len(), |q| self.dead.count(q));
        AdminAnswer::DeadList { entries, total }
    }

    /// `DEAD_RETRY` (`retry`) or `DEAD_DELETE` of `target`: one job at
    /// once, every job (of one queue) in bounded steps
    /// ([`Shard::dead_step`]); the count goes to `reply` when done.
    pub(super) fn dead_take(&mut self, target: DeadTarget, retry: bool, reply: Sender<AdminAnswer>, cx: &mut Cx) {
        match target {
            DeadTarget::One(id) => {
                let _ = reply.send(AdminAnswer::Done(self.dead_take_one(id, retry, cx)));
            }
            DeadTarget::All(queue) => {
                let upto = self.dead.last_seq();
                self.dead_step(DeadStep { retry, queue, from: 0, upto, taken: 0, reply }, cx);
            }
        }
    }

    /// Takes dead job `id` out (logged at info): back to its queue with its
    /// setbacks reset (`retry`), else gone for good. Returns how many (0 or
    /// 1).
    fn dead_take_one(&mut self, id: crate::ids::JobId, retry: bool, cx: &mut Cx) -> usize {
        let Some(dead) = self.dead.remove(id) else { return 0 };
        self.forget_dead(&dead);
        let (queue, msgid) = (dead.job.queue(), crate::ids::show(dead.job.frames.msgid()));
        match retry {
            true => tracing::info!(%queue, job = %dead.job.id, %msgid, "dead job retried by an operator"),
            false => tracing::info!(%queue, job = %dead.job.id, %msgid, "dead job deleted by an operator"),
        }
        self.release_dead(dead.job, retry, cx);
        1
    }

    /// One step of a retry or delete of every dead job (of one queue): at
    /// most [`limits::ADMIN_STEP_JOBS`] of those buried by `step.upto`,
    /// oldest first (each logged at debug); then the next step goes to the
    /// back of this shard's inbox ([`ShardMsg::DeadStep`]), so what came
    /// meanwhile is served first, or, after the last, the answer (one line
    /// at info with the count).
    pub(super) fn dead_step(&mut self, mut step: DeadStep, cx: &mut Cx) {
        let queue = step.queue.as_ref().map(|q| &q.0[..]);
        let (jobs, next) = self.dead.take_step(step.from, step.upto, queue, limits::ADMIN_STEP_JOBS);
        for dead in jobs {
            self.forget_dead(&dead);
            let (queue, msgid) = (dead.job.queue(), crate::ids::show(dead.job.frames.msgid()));
            tracing::debug!(%queue, job = %dead.job.id, %msgid, retried = step.retry, "dead job taken out by an operator");
            self.release_dead(dead.job, step.retry, cx);
            step.taken += 1;
        }
        if let Some(from) = next {
            step.from = from;
            return cx.out.shard(self.index, ShardMsg::DeadStep(step));
        }
        if step.taken > 0 {
            let queue = step.queue.as_ref().map_or_else(|| "*".to_string(), ToString::to_string);
            let (shard, jobs) = (self.index, step.taken);
            match step.retry {
                true => tracing::info!(shard, %queue, jobs, "dead jobs retried by an operator"),
                false => tracing::info!(shard, %queue, jobs, "dead jobs deleted by an operator"),
            }
        }
        let _ = step.reply.send(AdminAnswer::Done(step.taken));
    }

    /// A job taken out of the dead set: back of its queue with its
    /// setbacks reset (`retry`; counted in the memory limit again), else
    /// gone for good (its log record ended).
    fn release_dead(&mut self, mut job: Job, retry: bool, cx: &mut Cx) {
        if retry {
            self.ctx.job_bytes.fetch_add(job.frames.len(), Ordering::Relaxed);
            job.set_redeliveries(0);
            job.set_back_from(None);
            self.log_unburied(&mut job);
            self.enqueue_again(job, false, cx);
        } else {
            self.log_done(&job, cx);
        }
    }
}
