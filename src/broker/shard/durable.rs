//! The shard's side of its job log ([`crate::joblog`]): one hook per event
//! a job goes through (accepted, dispatched or offered, back to the front,
//! declined to the back, buried, done), recovery's policy, the end of a
//! batch (commit, then release through the outbox with the batch's
//! ticket), and the refusal of new jobs while the log cannot keep them.
//!
//! A router with `durability = "memory"` (and the unit tests' shards) has
//! [`NoLog`]: every hook does nothing.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::dead_set::DeadSet;
use super::queues::QueueTable;
use super::retries::RetryTable;
use super::{Cx, Shard};
use crate::broker::inbox::ShardMsg;
use crate::broker::outbox::{Outbox, VecOutbox};
use crate::ids::{JobId, QueueName};
use crate::job::{DeadJob, Job, Setback};
use crate::joblog::{Commit, Durable, Holdings, JobLog, JobState, NoLog, Recovered, RecoveredJob, StoreFault, Ticket};
use crate::limits;
use crate::metrics::counters::Counters;

/// The shard's view of its log's progress: the last ticket handed out and
/// how long the durable point has stood still behind it (see
/// [`Shard::store_refusal`]).
pub(super) struct LogWatch {
    /// The log's durable point.
    durable: Arc<dyn Durable>,
    /// The highest ticket the shard handed to its outbox.
    awaiting: Ticket,
    /// The durable point at the last batch end.
    seen: Ticket,
    /// Since when the durable point has not moved while `awaiting` was
    /// ahead of it.
    since: Instant,
    /// Whether the shard has said the log is stalled.
    stalled: bool,
    /// When the verdict must be looked at again with no message coming:
    /// when the oldest wait would pass the stall bound, and
    /// every [`limits::WAL_CHECK_INTERVAL`] while stalled (a stall that
    /// resolves, a file system thawed, clears it without new work).
    recheck: Option<Instant>,
}

impl LogWatch {
    /// A watch on `log`, from `now`.
    pub(super) fn new(log: &dyn JobLog, now: Instant) -> LogWatch {
        let durable = log.durable();
        let seen = durable.durable_upto();
        LogWatch { durable, awaiting: seen, seen, since: now, stalled: false, recheck: None }
    }

    /// Whether the log has kept the shard's acknowledgements waiting for
    /// its stall bound without its durable point moving.
    fn is_stalled(&self, now: Instant) -> bool {
        let durable = self.durable.durable_upto();
        durable < self.awaiting
            && durable == self.seen
            && now.saturating_duration_since(self.since) >= self.durable.stall_timeout()
    }
}

/// The shard's tables as its log sees them ([`Holdings`]).
struct ShardHoldings<'a> {
    queues: &'a mut QueueTable,
    retries: &'a mut RetryTable,
    dead: &'a mut DeadSet,
}

impl Holdings for ShardHoldings<'_> {
    fn queues(&self) -> Vec<QueueName> {
        self.queues.names()
    }

    fn visit_waiting(
        &mut self,
        queue: &QueueName,
        from: usize,
        max: usize,
        f: &mut dyn FnMut(&mut Job),
    ) -> (usize, Option<usize>) {
        self.queues.visit_waiting_mut(&queue.0, from, max, f)
    }

    fn visit_dead(&mut self, from: u64, max: usize, f: &mut dyn FnMut(&mut DeadJob)) -> (usize, Option<u64>) {
        self.dead.visit_mut(from, max, f)
    }

    fn visit_retrying(&mut self, f: &mut dyn FnMut(&mut Job)) {
        self.retries.visit_mut(f)
    }
}

impl Shard {
    /// Gives the shard its log and what the log recovered, applying the
    /// shard's policy to it: waiting jobs go back to their queues in order;
    /// a job in flight at the crash counts a setback ([`Setback::Crash`])
    /// and goes back to the front of its queue, or to the dead set when out
    /// of retries (the rule of `Shard::out_of_retries`, as at run time);
    /// dead jobs go back to the dead set, oldest burial first. What it
    /// decided is logged and synced before the shard serves. Call before
    /// the first message.
    pub fn attach_log(&mut self, mut log: Box<dyn JobLog>, recovered: Recovered) {
        let Recovered { jobs, accepted, keys } = recovered;
        let now_ms = crate::job::unix_ms_now();
        self.restore_keys(keys, log.as_mut());
        let mut dead = Vec::new();
        for RecoveredJob { mut job, state } in jobs {
            match state {
                JobState::Waiting => self.recovered_waiting(job),
                JobState::InFlight => {
                    job.set_redeliveries(job.redeliveries() + 1);
                    if self.out_of_retries(&job) {
                        let (msgid, bytes) = (crate::ids::show(job.frames.msgid()), job.frames.len());
                        tracing::error!(job = %job.id, queue = %job.queue(), %msgid, bytes, "job moved to the dead set at recovery: in flight at its last allowed try");
                        Counters::bump(&self.ctx.counters.dead_lettered);
                        self.queues.count(&job.queue(), crate::broker::counts::QueueCounter::DeadLettered);
                        let mut d = DeadJob { job, why: Setback::Crash, at_unix_ms: now_ms };
                        log.buried(&mut d);
                        dead.push(d);
                    } else {
                        log.requeued(&mut job);
                        self.recovered_waiting(job);
                    }
                }
                JobState::Dead { why, at_unix_ms } => dead.push(DeadJob { job, why, at_unix_ms }),
            }
        }
        self.accepted = self.accepted.max(accepted);
        if !log.sync_all() {
            tracing::error!(
                shard = self.index,
                "the log could not keep what recovery decided; it repairs itself while the shard serves"
            );
        }
        self.watch = LogWatch::new(log.as_ref(), self.ctx.started);
        self.log = log;
        // Dead jobs count against the dead set's limits (perhaps lowered
        // since), not the memory limit.
        dead.sort_by_key(|d| (d.at_unix_ms, d.job.id.seq()));
        for d in dead {
            self.ctx.dead_jobs.fetch_add(1, Ordering::Relaxed);
            self.ctx.dead_bytes.fetch_add(d.job.frames.len(), Ordering::Relaxed);
            self.dead.insert(d);
        }
        // Over a lowered limit: each shard drops its own oldest (all of
        // them if need be) as it starts; done records go to its own log.
        let mut out = VecOutbox::default();
        let mut cx = Cx { now: self.ctx.started, out: &mut out };
        self.trim_dead(0, &mut cx);
    }

    /// Rebuilds the duplicate window from the keys the log still holds
    /// (those accepted within [`limits::DEDUP_WINDOW`] of the start; the
    /// count bound applies, oldest first), and logs the kept ones again in
    /// `log`'s newest part, so that the next start finds them even after
    /// the records they came from are gone with their finished jobs.
    fn restore_keys(&mut self, keys: Vec<crate::joblog::RecoveredKey>, log: &mut dyn JobLog) {
        let now_ms = self.ctx.started_unix_ms;
        let window_ms = u64::try_from(limits::DEDUP_WINDOW.as_millis()).unwrap_or(u64::MAX);
        let found = keys.len();
        let mut evicted = 0;
        for k in keys.iter().filter(|k| k.at_unix_ms.saturating_add(window_ms) > now_ms) {
            let (client, msgid) = (k.client.as_bytes(), k.msgid.as_bytes());
            if self.dedup.find(client, msgid, now_ms).is_some() {
                // Logged twice (an earlier start logged it again).
                continue;
            }
            evicted += self.dedup.insert(client, msgid, super::dedup::Seen { job: k.id, at_unix_ms: k.at_unix_ms });
            log.client_key(k.id, k.at_unix_ms, client, msgid);
        }
        if evicted > 0 {
            self.ctx.counters.dedup_evicted.fetch_add(evicted as u64, Ordering::Relaxed);
        }
        if found > 0 {
            tracing::info!(
                shard = self.index,
                found,
                kept = self.dedup.len(),
                "duplicate window rebuilt from the job log"
            );
        }
    }

    /// A recovered job back at the back of its queue (counted towards the
    /// memory limit like a new one; it leaves it through `job_done`).
    fn recovered_waiting(&mut self, job: Job) {
        self.ctx.job_bytes.fetch_add(job.frames.len(), Ordering::Relaxed);
        let queue = job.queue();
        self.queues.push_back(&queue, job);
    }

    /// The shard's log (for tests and tools).
    pub fn log(&self) -> &dyn JobLog {
        self.log.as_ref()
    }

    /// Why a new job must be refused for the log's sake now, if it must:
    /// the log says it cannot keep it ([`JobLog::refusal`]: out of space,
    /// below `disk_free_limit`, failing), or it is stalled: the
    /// acknowledgements it was given have waited
    /// its stall bound ([`Durable::stall_timeout`]) without its durable point moving.
    pub(super) fn store_refusal(&self, now: Instant) -> Option<StoreFault> {
        self.log.refusal().or_else(|| self.watch.is_stalled(now).then_some(StoreFault::Failed))
    }

    /// A new job: its `Accepted` record.
    pub(super) fn log_accepted(&mut self, job: &mut Job) {
        self.log.accepted(job);
    }

    /// The job went to a worker or was offered to a text connection.
    pub(super) fn log_dispatched(&mut self, job: &Job) {
        self.log.dispatched(job);
    }

    /// The job went to the dead set.
    pub(super) fn log_buried(&mut self, dead: &mut DeadJob) {
        debug_assert_eq!(dead.job.id.shard(), self.index, "a dead job lies on the shard that accepted it");
        self.log.buried(dead);
    }

    /// A dead job goes back to its queue.
    pub(super) fn log_unburied(&mut self, job: &mut Job) {
        self.log.unburied(job);
    }

    /// The job waits at the front of its queue again, or for a retry.
    pub(super) fn log_requeued(&mut self, job: &mut Job) {
        self.log.requeued(job);
    }

    /// `DCL`: the job goes to the back of its queue, so a log logs it as a
    /// new job with a fresh id (ids order each queue at recovery).
    pub(super) fn log_declined(&mut self, job: &mut Job) {
        if !self.log.keeps_jobs() {
            return;
        }
        self.log.done(job);
        job.id = self.next_job_id();
        self.log.accepted(job);
    }

    /// The job is finished (completed, acknowledged, deleted,
    /// dead-lettered): its `Done` record goes to the log of the shard that
    /// accepted it, here or by a message.
    pub(super) fn log_done(&mut self, job: &Job, cx: &mut Cx) {
        if job.id.shard() == self.index {
            self.log.done(job);
        } else if self.log.keeps_jobs() {
            cx.out.shard(job.id.shard(), ShardMsg::LogDone { id: job.id });
        }
    }

    /// A job this shard accepted is done on another shard (see [`ShardMsg::LogDone`]).
    pub(super) fn handle_log_done(&mut self, id: JobId) {
        self.log.done_elsewhere(id);
    }

    /// When the log needs the shard's loop next, if ever.
    /// (the log's own, or the next look at the stall verdict).
    pub(super) fn log_deadline(&self) -> Option<Instant> {
        match (self.log.next_deadline(), self.watch.recheck) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether the shard says its log is stalled now (the verdict of the
    /// last batch end or re-check).
    pub fn log_stalled(&self) -> bool {
        self.watch.stalled
    }

    /// The end of a batch: commits the log, then releases what the batch
    /// produced: frames for workers at once (a worker running a job whose
    /// record is not yet durable is at-least-once, not loss), acceptances
    /// and text answers to stored SCHEDs (with what follows them on their
    /// connections) once the log holds the batch's ticket; then lets the
    /// log do its housekeeping (a compaction step, or a repair).
    pub(super) fn end_batch(&mut self, now: Instant, out: &mut dyn Outbox) {
        match self.log.commit(now) {
            Commit::Release => out.flush(),
            Commit::After(ticket) => {
                let w = &mut self.watch;
                // Nothing waited before this ticket: its wait starts now
                // (not at the last batch that found the log caught up, an
                // idle hour ago, which would call a healthy log stalled).
                if w.awaiting <= w.durable.durable_upto() {
                    w.seen = w.durable.durable_upto();
                    w.since = now;
                }
                w.awaiting = w.awaiting.max(ticket);
                out.flush_after(ticket);
            }
        }
        self.watch_durable(now);
        let mut holdings = ShardHoldings { queues: &mut self.queues, retries: &mut self.retries, dead: &mut self.dead };
        self.log.maintain(now, &mut holdings);
    }

    /// Notes how far the log's durable point has come (see [`LogWatch`]),
    /// and says so when it stalls or moves again.
    fn watch_durable(&mut self, now: Instant) {
        // The log's own refusal comes before the stall's (see
        // [`Shard::store_refusal`]): the lines below name what producers get.
        let own = self.log.refusal();
        let w = &mut self.watch;
        let durable = w.durable.durable_upto();
        if durable != w.seen || durable >= w.awaiting {
            w.seen = durable;
            w.since = now;
        }
        let stalled = w.is_stalled(now);
        w.recheck = if stalled {
            Some(now + limits::WAL_CHECK_INTERVAL)
        } else if durable < w.awaiting {
            Some(w.since + w.durable.stall_timeout())
        } else {
            None
        };
        if stalled != w.stalled {
            w.stalled = stalled;
            if stalled {
                Counters::bump(&self.ctx.counters.log_stalls);
                let secs = w.durable.stall_timeout().as_secs();
                match own {
                    None => tracing::error!(shard = self.index, secs, refused = "STORE_FAILED", "the job log has not made acknowledged work durable for {secs} s: new jobs are refused (STORE_FAILED) until it does"),
                    Some(own) => tracing::error!(shard = self.index, secs, refused = own.code(), "the job log has not made acknowledged work durable for {secs} s: new jobs are refused ({}, the log's own refusal; STORE_FAILED if that ends first) until it does", own.code()),
                }
            } else if let Some(own) = own {
                let code = own.code();
                tracing::warn!(
                    shard = self.index,
                    refused = code,
                    "the job log makes work durable again; new jobs stay refused ({code}) by the log's own state"
                );
            } else {
                tracing::warn!(shard = self.index, "the job log makes work durable again: new jobs are accepted");
            }
        }
    }
}

/// The log of a shard that keeps none (the unit tests' shards, and
/// `durability = "memory"`).
pub(super) fn no_log(now: Instant) -> (Box<dyn JobLog>, LogWatch) {
    let log: Box<dyn JobLog> = Box::new(NoLog);
    let watch = LogWatch::new(log.as_ref(), now);
    (log, watch)
}
