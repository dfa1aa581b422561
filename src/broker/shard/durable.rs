//! The shard's hooks into its write-ahead log ([`crate::wal`]): one call
//! per event a job goes through (accepted, dispatched or offered, back to
//! the front, declined to the back, done), and the end of a batch, where
//! the log is committed before the batch's output is released. Every hook
//! does nothing when the router keeps no log (`durability = "memory"`,
//! and the unit tests' shards).

use std::time::Instant;

use super::{Cx, Shard};
use crate::broker::job::Job;
use crate::broker::msg::{Outbox, ShardMsg};
use crate::broker::retry::DeadJob;
use crate::ids::JobId;
use crate::metrics::counters::Counters;
use crate::wal::log::Commit;
use crate::wal::record::accepted_len;
use crate::wal::ShardStart;

impl Shard {
    /// Gives the shard its log and what recovery found: its queues (each
    /// in order), its dead set and its acceptance count. Call before the
    /// first message.
    pub fn attach_log(&mut self, start: ShardStart) {
        let ShardStart { log, queues, dead, buried_now, accepted } = start;
        for (queue, jobs) in queues {
            for job in jobs {
                // Recovered jobs count towards the memory limit like new
                // ones (and leave it through `job_done`).
                self.ctx.job_bytes.fetch_add(job.frames.len(), std::sync::atomic::Ordering::Relaxed);
                self.queues.push_back(&queue, job);
            }
        }
        self.accepted = self.accepted.max(accepted);
        self.wal = Some(log);
        // Dead jobs count against the dead set's limits (perhaps lowered
        // since), not the memory limit; jobs buried by this recovery are
        // counted as dead-lettered.
        for queue in buried_now {
            Counters::bump(&self.ctx.counters.dead_lettered);
            self.queues.count(&queue, crate::broker::counts::QueueCounter::DeadLettered);
        }
        let mut out = crate::broker::msg::VecOutbox::default();
        let mut cx = super::Cx { now: self.ctx.started, out: &mut out };
        for dead in dead {
            self.ctx.dead_jobs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.ctx.dead_bytes.fetch_add(dead.job.frames.len(), std::sync::atomic::Ordering::Relaxed);
            self.dead.insert(dead);
        }
        // Over a lowered limit: each shard drops its own oldest (all of
        // them if need be) as it starts; done records go to its own log.
        self.trim_dead(0, &mut cx);
    }

    /// The shard's log, if it keeps one.
    pub fn log(&self) -> Option<&crate::wal::log::ShardLog> {
        self.wal.as_ref()
    }

    /// A new job: its `Accepted` record (its segment noted in the job).
    pub(super) fn log_accepted(&mut self, job: &mut Job) {
        if let Some(log) = &mut self.wal {
            log.accepted(job);
        }
    }

    /// The job went to a worker or was offered to a text connection.
    pub(super) fn log_dispatched(&mut self, job: &Job) {
        if let Some(log) = &mut self.wal {
            log.dispatched(job.id);
        }
    }

    /// The job went to the dead set (its log records move together; see
    /// [`crate::wal::log::ShardLog::buried`]).
    pub(super) fn log_buried(&mut self, dead: &mut DeadJob) {
        debug_assert_eq!(dead.job.id.shard(), self.index, "a dead job lies on the shard that accepted it");
        if let Some(log) = &mut self.wal {
            log.buried(dead);
        }
    }

    /// A dead job goes back to its queue (a fresh `Accepted` record).
    pub(super) fn log_unburied(&mut self, job: &mut Job) {
        if let Some(log) = &mut self.wal {
            log.unburied(job);
        }
    }

    /// The job waits at the front of its queue again.
    pub(super) fn log_requeued(&mut self, job: &mut Job) {
        if let Some(log) = &mut self.wal {
            log.requeued(job);
        }
    }

    /// `DCL`: the job goes to the back of its queue, so it is logged as a
    /// new job with a fresh id (ids order each queue at recovery).
    pub(super) fn log_declined(&mut self, job: &mut Job) {
        if self.wal.is_none() {
            return;
        }
        let (old, segment, bytes) = (job.id, job.wal_segment(), accepted_len(job));
        job.id = self.next_job_id();
        if let Some(log) = &mut self.wal {
            log.done(old, segment, bytes);
            log.accepted(job);
        }
    }

    /// The job is finished (completed, acknowledged, deleted,
    /// dead-lettered): its `Done` record goes to the log of the shard that
    /// accepted it, here or by a message.
    pub(super) fn log_done(&mut self, job: &Job, cx: &mut Cx) {
        if self.wal.is_none() {
            return;
        }
        let (id, segment, bytes) = (job.id, job.wal_segment(), accepted_len(job));
        if id.shard() == self.index {
            self.handle_log_done(id, segment, bytes);
        } else {
            cx.out.shard(id.shard(), ShardMsg::LogDone { id, segment, record_bytes: bytes });
        }
    }

    /// A job this shard accepted is done (see [`ShardMsg::LogDone`]).
    pub(super) fn handle_log_done(&mut self, id: JobId, segment: u32, record_bytes: usize) {
        if let Some(log) = &mut self.wal {
            log.done(id, segment, record_bytes);
        }
    }

    /// When the log needs the shard's loop next (an `async` sync, or
    /// compaction work left), if ever.
    pub(super) fn log_deadline(&self) -> Option<Instant> {
        self.wal.as_ref().and_then(|log| log.next_deadline())
    }

    /// The end of a batch: commits the log, then releases what the batch
    /// produced: frames for workers at once (a worker running a job whose
    /// record is written but not yet synced is at-least-once, not loss),
    /// acceptances and text answers to stored SCHEDs (with what follows
    /// them on their connections) only once the batch's records are
    /// durable (through the sync thread, or after syncing here); then takes
    /// one bounded compaction step.
    pub(super) fn end_batch(&mut self, now: Instant, out: &mut dyn Outbox) {
        let Some(log) = &mut self.wal else { return out.flush() };
        match log.commit(now) {
            Commit::Release => out.flush(),
            Commit::AfterSync(wait) => out.flush_after_sync(wait),
            Commit::SyncHere => {
                out.flush_early();
                log.sync_here();
                out.flush();
            }
        }
        if let Some(log) = &mut self.wal {
            log.compact_step(&mut self.queues, &mut self.dead);
        }
    }
}
