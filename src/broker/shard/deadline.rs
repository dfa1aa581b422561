//! Per-job deadlines (README "Deadlines"), on the worker's home shard.
//!
//! A job sent to an eMQP worker must be answered within its time limit: its
//! `timeout:N` header (seconds, read as EventMQ's workers read it) or else
//! the router's `job_timeout`, plus [`limits::JOB_DEADLINE_GRACE`] so that a
//! worker enforcing the same limit itself (`emq-worker` kills the command
//! and reports the job failed) is heard first. When the deadline passes
//! while the worker still heartbeats (a hung call, a deadlock) the job is
//! taken back: one setback, so it is tried again on another worker after
//! its back-off, or goes to the dead set when out of retries (`dead.rs`).
//! The worker gets no more jobs of that queue until it answers the job;
//! that late REPLY is ignored and counted. An answer can be lost (a REPLY
//! over ZeroMQ's message size limit, a send error a worker swallows), so
//! the router waits for it as long as the job's time limit again, then
//! serves the worker that queue's jobs again (counted).
//!
//! One timer per worker, armed for its earliest deadline: a job answered in
//! time costs no timer work, and a timer that finds a later deadline armed
//! since does nothing.

use super::workers::{Forgiven, InFlight, Lapsed};
use super::{Cx, Shard, Timer};
use crate::broker::inbox::ShardMsg;
use crate::ids::{PeerId, QueueName, WorkerKey};
use crate::job::Job;
use crate::job::Setback;
use crate::limits;
use crate::metrics::counters::Counters;
use crate::protocol::headers::{header_timeout, HeaderTimeout};
use std::time::Instant;

impl Shard {
    /// When a job dispatched at `now` must have been answered, if ever: its
    /// `timeout:N` header (`timeout:0`: never), else its queue's
    /// `job_timeout` ([`crate::config::queues`]), plus the grace.
    fn deadline_of(&self, job: &Job, now: std::time::Instant) -> Option<Instant> {
        let limit = match header_timeout(job.frames.headers()) {
            HeaderTimeout::Limit(limit) => limit,
            HeaderTimeout::NoLimit => return None,
            HeaderTimeout::Absent => self.ctx.policies.of(job.queue_bytes()).job_timeout?,
        };
        Some(now + limit + limits::JOB_DEADLINE_GRACE)
    }

    /// Records `job` as in flight on worker `key` with its deadline, arming
    /// the worker's deadline timer when this one comes first. Gives the job
    /// back when the worker is gone (the caller requeues it).
    pub(super) fn record_in_flight(&mut self, key: WorkerKey, job: Job, cx: &mut Cx) -> Option<Job> {
        let deadline = self.deadline_of(&job, cx.now);
        let back = self.workers.record_dispatch(key, job, cx.now, deadline);
        if let (None, Some(at)) = (&back, deadline) {
            if self.workers.arm_deadline(key, at) {
                self.timers.arm(at, Timer::JobDeadline(key));
            }
        }
        back
    }

    /// The deadline timer of worker `key`: takes back every job past its
    /// deadline, pauses the worker on their queues, lifts the pauses whose
    /// answers were waited for as long again, re-arms for the next.
    pub(super) fn job_deadline_due(&mut self, key: WorkerKey, cx: &mut Cx) {
        let Some(Lapsed { jobs: lapsed, forgiven, next }) = self.workers.take_lapsed(key, cx.now) else { return };
        if let Some(at) = next {
            self.timers.arm(at, Timer::JobDeadline(key));
        }
        let worker = self.workers.id_of(key).map(ToString::to_string).unwrap_or_default();
        for Forgiven { msgid, queue, still_owed } in forgiven {
            Counters::bump(&self.ctx.counters.late_replies_given_up);
            let msgid = crate::ids::show(&msgid);
            crate::log_limited!(warn, %worker, %queue, %msgid, "no answer for a job taken back by its deadline after as long again: the worker gets that queue's jobs again");
            if !still_owed {
                let index = self.shard_of(&queue.0);
                self.send_to_shard(index, ShardMsg::PauseCandidate { queue, key, paused: false }, cx);
            }
        }
        let mut paused: Vec<QueueName> = Vec::new();
        for InFlight { job, since, .. } in lapsed {
            Counters::bump(&self.ctx.counters.jobs_timed_out);
            let queue = job.queue();
            let (msgid, held_ms) =
                (crate::ids::show(job.frames.msgid()), cx.now.saturating_duration_since(since).as_millis());
            crate::log_limited!(warn, %worker, %queue, job = %job.id, %msgid, held_ms, "job past its deadline: taken back from its worker");
            if !paused.contains(&queue) {
                let index = self.shard_of(&queue.0);
                self.send_to_shard(index, ShardMsg::PauseCandidate { queue: queue.clone(), key, paused: true }, cx);
                paused.push(queue.clone());
            }
            self.set_back(job, Setback::Deadline, cx);
        }
        if self.workers.owed(key) > limits::MAX_UNANSWERED_DEADLINES {
            self.remove_worker(key, "too many jobs past their deadline unanswered", cx);
        }
    }

    /// A job-result REPLY from `id` for `msgid` that answers a job already
    /// taken back by its deadline: ignored (counted); once the worker owes
    /// no other such answer on the job's queue it gets that queue's jobs
    /// again. `false` when the REPLY is not such an answer.
    pub(super) fn late_reply(&mut self, id: &PeerId, msgid: &[u8], cx: &mut Cx) -> bool {
        let Some((key, queue, still_owed)) = self.workers.late_reply(id, msgid) else { return false };
        Counters::bump(&self.ctx.counters.late_replies);
        let msgid = crate::ids::show(msgid);
        tracing::debug!(worker = %id, %queue, %msgid, "REPLY for a job taken back by its deadline: ignored");
        if !still_owed {
            let index = self.shard_of(&queue.0);
            self.send_to_shard(index, ShardMsg::PauseCandidate { queue, key, paused: false }, cx);
        }
        true
    }

    /// On the queue's shard: worker `key` is paused on `queue` (it owes the
    /// answer of a job taken back by its deadline), or no longer is.
    pub(super) fn handle_pause_candidate(&mut self, queue: QueueName, key: WorkerKey, paused: bool, cx: &mut Cx) {
        self.queues.pause_candidate(&queue, key, paused);
        if !paused {
            self.pump(&queue, cx);
        }
    }
}
