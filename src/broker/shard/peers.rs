//! Worker handlers, on the worker's home shard: INFORM, READY, job-result
//! REPLY, HEARTBEAT, KBYE, expiry, failed sends, redelivery. (Schedulers:
//! `scheduling.rs`.)
//!
//! A message from a worker the router does not know (expired, forgotten
//! after its KBYE, never registered, or registered with a router that has
//! since restarted), other than INFORM and KBYE, is answered with
//! `DISCONNECT`: that is what makes a real EventMQ 0.3.13 jobmanager
//! register again at once (its DISCONNECT handler raises on an `unbind` of
//! its connected socket, docs/emqp.md "Differences from EventMQ", and its loop reconnects under a new
//! identity, INFORMs and sends its READYs: measured 16 ms), and emq's
//! worker library re-INFORMs on it. EventMQ dropped such messages, so a
//! jobmanager paused past the heartbeat timeout sat idle until its own
//! 15 s liveness check gave up on the router. One DISCONNECT per message
//! received: no state, no amplification.
//!
//! KBYE (emq's rule, docs/emqp.md "KBYE"): the worker gets no new jobs at
//! once, and no more HEARTBEATs; jobs it still holds stay in flight,
//! because a Python jobmanager finishes them and sends their REPLYs after
//! its KBYE, without heartbeating any more (see
//! [`super::workers::WorkerTable::expiry`]).
//! Whatever it still holds when it goes returns to the front of its queues
//! (at-least-once).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::workers::{Expiry, InFlight, Kbye};
use super::{Cx, Shard, Timer};
use crate::broker::egress::{Dest, OnFail};
use crate::broker::inbox::ShardMsg;
use crate::broker::types::{WorkerShared, WorkerState};
use crate::ids::{MsgId, PeerId, QueueName, WorkerKey};
use crate::job::Job;
use crate::job::Setback;
use crate::metrics::counters::Counters;
use crate::metrics::latency::Kind;
use crate::protocol::emqp::Command;

impl Shard {
    pub(super) fn handle_inform(&mut self, id: PeerId, msgid: MsgId, queues: Vec<(i64, QueueName)>, cx: &mut Cx) {
        if let Some(old) = self.workers.key_of(&id) {
            tracing::info!(worker = %id, "re-INFORM: replacing the earlier registration");
            self.remove_worker(old, "re-INFORM", cx);
        }
        let max = self.ctx.config.max_workers;
        if self.workers.full(max) {
            Counters::bump(&self.ctx.counters.rejected_worker_limit);
            crate::log_limited!(warn, worker = %id, max, "INFORM refused: max_workers reached");
            let text = format!("the router holds max_workers ({max}) workers");
            return self.send_error_to(Dest::Backend, &id, msgid, "BAD_INFORM", text, cx);
        }
        let key = WorkerKey(self.ctx.next_key.fetch_add(1, Ordering::Relaxed));
        let shared = Arc::new(WorkerShared::new(key, id.clone(), self.index, queues.clone()));
        self.workers.register(shared.clone(), cx.now);
        tracing::info!(worker = %id, queues = ?queues, "worker registered");
        self.send(Dest::Backend, &id, Command::Ack { acked: msgid.0.to_vec() }, OnFail::Count, cx);
        // A Python jobmanager starts its pool, and so sends its READYs, only
        // after the first HEARTBEAT: send it at once.
        self.send_heartbeat(Dest::Backend, &id, cx);
        for (weight, queue) in queues {
            let index = self.shard_of(&queue.0);
            let inform = msgid.clone();
            self.send_to_shard(index, ShardMsg::AddCandidate { queue, weight, worker: shared.clone(), inform }, cx);
        }
        self.arm_worker_heartbeat(key, cx);
        self.arm_worker_expiry(key, cx.now + self.ctx.config.heartbeat_timeout);
    }

    /// Refreshes the worker's liveness; `None` when it is unknown, which
    /// is then counted and told `DISCONNECT` (see the module docs).
    fn touch_worker(&mut self, id: &PeerId, cx: &mut Cx) -> Option<Arc<WorkerShared>> {
        let found = self.workers.touch(id, cx.now);
        if found.is_none() {
            Counters::bump(&self.ctx.counters.unknown_worker_messages);
            Counters::bump(&self.ctx.counters.disconnects_to_unknown_workers);
            tracing::info!(worker = %id, "message from a worker the router does not know: DISCONNECT (register again)");
            self.send(Dest::Backend, id, Command::Disconnect, OnFail::Count, cx);
        }
        found
    }

    pub(super) fn handle_ready(&mut self, id: PeerId, cx: &mut Cx) {
        let Some(worker) = self.touch_worker(&id, cx) else { return };
        if worker.state() != WorkerState::Live {
            return;
        }
        worker.add_slot();
        // The wake walks the queues in INFORM order, shard to shard.
        if let Some((_, first)) = worker.queues.first() {
            let index = self.shard_of(&first.0);
            self.send_to_shard(index, ShardMsg::Wake { worker: worker.clone(), from: 0 }, cx);
        }
    }

    /// UNREADY (emq extension): takes back one free slot the worker
    /// announced and answers `ACK` naming the UNREADY; `ERROR
    /// NO_FREE_SLOT` when it has none free (every READY is already used by
    /// a job sent to it, which reaches it before this answer: the pipe
    /// keeps order). A worker moves its slots between routers this way
    /// without ever holding more jobs than it has slots (docs/scaleout.md
    /// "Slots").
    pub(super) fn handle_unready(&mut self, id: PeerId, msgid: MsgId, cx: &mut Cx) {
        let Some(worker) = self.touch_worker(&id, cx) else { return };
        if worker.try_claim() {
            Counters::bump(&self.ctx.counters.slots_taken_back);
            self.send(Dest::Backend, &id, Command::Ack { acked: msgid.0.to_vec() }, OnFail::Count, cx);
        } else {
            Counters::bump(&self.ctx.counters.unready_no_free_slot);
            let text = "no free slot to take back: every READY is used by a job sent to this worker".to_string();
            self.send_error_to(Dest::Backend, &id, msgid, "NO_FREE_SLOT", text, cx);
        }
    }

    pub(super) fn handle_job_reply(&mut self, id: PeerId, request_msgid: MsgId, failed: bool, cx: &mut Cx) {
        if self.touch_worker(&id, cx).is_none() || self.late_reply(&id, &request_msgid.0, cx) {
            return;
        }
        if let Some(f) = self.workers.complete(&id, &request_msgid.0) {
            Counters::bump(&self.ctx.counters.completed_jobs);
            let queue = f.job.queue_bytes();
            self.latency.record(queue, Kind::Service, cx.now.saturating_duration_since(f.since));
            if failed {
                Counters::bump(&self.ctx.counters.failed_results);
                // Tried again after a back-off, or buried (`dead.rs`).
                self.job_ended(&id, &f, true, cx);
                return self.set_back(f.job, Setback::Failed, cx);
            }
            self.job_done(&f.job, cx);
            let end_to_end = cx.now.saturating_duration_since(f.job.accepted_at(self.ctx.started));
            self.latency.record(queue, Kind::EndToEnd, end_to_end);
            self.job_ended(&id, &f, false, cx);
        } else {
            Counters::bump(&self.ctx.counters.unmatched_replies);
            let msgid = crate::ids::show(&request_msgid.0);
            tracing::debug!(worker = %id, %msgid, "REPLY matches no job this worker holds: ignored");
        }
    }

    pub(super) fn handle_worker_heartbeat(&mut self, id: PeerId, cx: &mut Cx) {
        self.touch_worker(&id, cx);
    }

    pub(super) fn handle_worker_kbye(&mut self, id: PeerId, cx: &mut Cx) {
        let worker = match self.workers.kbye(&id, cx.now) {
            Kbye::First(worker) => worker,
            Kbye::Repeated => return,
            Kbye::Unknown => return Counters::bump(&self.ctx.counters.unknown_worker_messages),
        };
        self.remove_candidates(&worker, cx);
        tracing::info!(worker = %id, "KBYE: no new jobs for this worker");
        self.arm_worker_expiry(worker.key, cx.now + self.ctx.config.heartbeat_timeout);
    }

    pub(super) fn handle_dispatched(&mut self, key: WorkerKey, job: Job, cx: &mut Cx) {
        // The worker was removed while the job was on its way: it goes back
        // behind the jobs the removal sent back (QueueTable::push_front).
        if let Some(mut job) = self.record_in_flight(key, job, cx) {
            job.set_back_from(Some(key));
            self.requeue(job.queue(), vec![job], cx);
        }
    }

    /// A job could not be sent to worker `key`: the peer is gone
    /// (EHOSTUNREACH), or its pipe is full (EAGAIN) although the HWM allows
    /// many messages, so it is not reading. Either way the worker is removed
    /// and everything it holds, this job included, is requeued; a live worker
    /// re-registers (EventMQ does the same).
    pub(super) fn handle_send_failed(&mut self, key: WorkerKey, msgid: MsgId, unreachable: bool, cx: &mut Cx) {
        let why = if unreachable { "unreachable" } else { "not reading (pipe full)" };
        tracing::warn!(%msgid, why, "sending a job failed");
        self.remove_worker(key, why, cx);
    }

    fn remove_candidates(&mut self, worker: &WorkerShared, cx: &mut Cx) {
        for (_, queue) in &worker.queues {
            let index = self.shard_of(&queue.0);
            self.send_to_shard(index, ShardMsg::RemoveCandidate { queue: queue.clone(), key: worker.key }, cx);
        }
    }

    /// Forgets worker `key`: marks it dead, takes it out of selection and
    /// puts its unfinished jobs back at the front of their queues, oldest
    /// first in line, each counting one setback; a job out of retries goes
    /// to the dead set instead (`dead.rs`).
    pub(super) fn remove_worker(&mut self, key: WorkerKey, why: &str, cx: &mut Cx) {
        let Some(removed) = self.workers.remove(key) else { return };
        self.remove_candidates(&removed.shared, cx);
        tracing::info!(worker = %removed.shared.id, why, requeued = removed.jobs.len(), "worker removed");
        let mut by_queue: Vec<(QueueName, Vec<Job>)> = Vec::new();
        for InFlight { mut job, .. } in removed.jobs {
            job.set_redeliveries(job.redeliveries() + 1);
            job.set_back_from(Some(key));
            let queue = job.queue();
            if self.out_of_retries(&job) {
                let index = self.shard_of(job.queue_bytes());
                self.send_to_shard(index, ShardMsg::SetBack { job, why: Setback::WorkerGone }, cx);
                continue;
            }
            match by_queue.iter_mut().find(|(q, _)| *q == queue) {
                Some((_, list)) => list.push(job),
                None => by_queue.push((queue, vec![job])),
            }
        }
        for (queue, list) in by_queue {
            self.requeue(queue, list, cx);
        }
    }

    /// Heartbeats worker `key` and arms its next HEARTBEAT, unless it is
    /// gone or has said KBYE: a worker that said goodbye is not
    /// heartbeated any more (EventMQ 0.3.13 removes it at its KBYE), and
    /// its timer lapses here. A jobmanager stops reading its socket after
    /// its KBYE; emq's worker keeps reading but checks no router silence
    /// while it drains.
    pub(super) fn worker_heartbeat_due(&mut self, key: WorkerKey, cx: &mut Cx) {
        let Some(id) = self.workers.heartbeat_target(key).cloned() else { return };
        self.send_heartbeat(Dest::Backend, &id, cx);
        self.arm_worker_heartbeat(key, cx);
    }

    /// The worker's next HEARTBEAT: `heartbeat_interval` after this one,
    /// rounded down to the shard's grid (never later, at most a grid step
    /// earlier), so that the heartbeats of workers registered within one
    /// step go out in one batch (docs/emqp.md "HEARTBEAT").
    fn arm_worker_heartbeat(&mut self, key: WorkerKey, cx: &Cx) {
        let due = self.grid.next_heartbeat(cx.now, self.ctx.config.heartbeat_interval);
        self.timers.arm(due, Timer::WorkerHeartbeat(key));
    }

    /// The worker's expiry check at `deadline` rounded up to the shard's
    /// grid: never early, at most a grid step late.
    fn arm_worker_expiry(&mut self, key: WorkerKey, deadline: std::time::Instant) {
        self.timers.arm(self.grid.ceil(deadline), Timer::WorkerExpiry(key));
    }

    pub(super) fn worker_expiry_due(&mut self, key: WorkerKey, cx: &mut Cx) {
        let (timeout, grace) = (self.ctx.config.heartbeat_timeout, self.ctx.config.kbye_grace);
        match self.workers.expiry(key, cx.now, timeout, grace) {
            Expiry::Gone => {}
            Expiry::NotBefore(deadline) => self.arm_worker_expiry(key, deadline),
            Expiry::KbyeOver => self.remove_worker(key, "KBYE drain over", cx),
            Expiry::Silent => {
                Counters::bump(&self.ctx.counters.expired_workers);
                self.remove_worker(key, "heartbeat timeout", cx);
            }
        }
    }

    /// KBYE to every worker of this shard (shutdown).
    pub(super) fn kbye_workers(&mut self, cx: &mut Cx) {
        for id in self.workers.ids() {
            self.send(Dest::Backend, &id, Command::Kbye, OnFail::Count, cx);
        }
    }
}
