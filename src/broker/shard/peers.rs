//! Peer handlers: workers on their home shard (INFORM, READY, job-result
//! REPLY, HEARTBEAT, KBYE, expiry, failed sends, redelivery) and schedulers
//! on shard 0 (INFORM, SCHEDULE/UNSCHEDULE routing, heartbeats, expiry).
//!
//! KBYE (emq's rule, docs/emqp.md "KBYE"): the worker gets no new jobs at
//! once; jobs it still holds stay in flight, because a Python jobmanager
//! finishes them and sends their REPLYs after its KBYE, without
//! heartbeating any more (see [`super::workers::WorkerTable::expiry`]).
//! Whatever it still holds when it goes returns to the front of its queues
//! (at-least-once).
//!
//! Schedulers (fixes of EventMQ 0.3.13's router; docs/emqp.md
//! "Schedulers"): SCHEDULE goes round-robin over live schedulers; a failed
//! forward is retried on the next one; forwarding does not count as the
//! scheduler's heartbeat; a repeated INFORM does not duplicate the entry;
//! SCHEDULE with no scheduler gets an `ERROR NO_SCHEDULER` reply.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::workers::{Expiry, InFlight, Kbye};
use super::{Cx, Shard, Timer};
use crate::broker::job::Job;
use crate::broker::msg::{Dest, OnFail, OutMsg, Outgoing, ShardMsg};
use crate::broker::types::{WorkerShared, WorkerState};
use crate::ids::{cut, show, MsgId, PeerId, QueueName, WorkerKey};
use crate::limits;
use crate::metrics::counters::Counters;
use crate::metrics::latency::Kind;
use crate::protocol::emqp::{Command, Frame};

impl Shard {
    pub(super) fn handle_inform(&mut self, id: PeerId, msgid: MsgId, queues: Vec<(i64, QueueName)>, cx: &mut Cx) {
        if let Some(old) = self.workers.key_of(&id) {
            tracing::info!(worker = %id, "re-INFORM: replacing the earlier registration");
            self.remove_worker(old, "re-INFORM", cx);
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
            self.send_to_shard(index, ShardMsg::AddCandidate { queue, weight, worker: shared.clone() }, cx);
        }
        self.timers.arm(cx.now + self.ctx.config.heartbeat_interval, Timer::WorkerHeartbeat(key));
        self.timers.arm(cx.now + self.ctx.config.heartbeat_timeout, Timer::WorkerExpiry(key));
    }

    /// Refreshes the worker's liveness; `None` (and counted) when unknown.
    fn touch_worker(&mut self, id: &PeerId, cx: &Cx) -> Option<Arc<WorkerShared>> {
        let found = self.workers.touch(id, cx.now);
        if found.is_none() {
            Counters::bump(&self.ctx.counters.unknown_worker_messages);
            tracing::debug!(worker = %id, "message from an unregistered worker dropped");
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

    pub(super) fn handle_job_reply(&mut self, id: PeerId, request_msgid: MsgId, cx: &mut Cx) {
        if self.touch_worker(&id, cx).is_none() {
            return;
        }
        if let Some(f) = self.workers.complete(&id, &request_msgid.0) {
            Counters::bump(&self.ctx.counters.completed_jobs);
            let queue = f.job.queue_bytes();
            self.latency.record(queue, Kind::Service, cx.now.saturating_duration_since(f.since));
            let end_to_end = cx.now.saturating_duration_since(f.job.accepted_at(self.ctx.started));
            self.latency.record(queue, Kind::EndToEnd, end_to_end);
            self.log_done(&f.job, cx);
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
        self.timers.arm(cx.now + self.ctx.config.heartbeat_timeout, Timer::WorkerExpiry(worker.key));
    }

    pub(super) fn handle_dispatched(&mut self, key: WorkerKey, job: Job, cx: &mut Cx) {
        // The worker was removed while the job was on its way: it goes back
        // behind the jobs the removal sent back (QueueTable::push_front).
        if let Some(mut job) = self.workers.record_dispatch(key, job, cx.now) {
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
    /// first in line. A job whose workers died [`limits::MAX_DELIVERIES`]
    /// times is dropped (logged, counted as dead-lettered).
    pub(super) fn remove_worker(&mut self, key: WorkerKey, why: &str, cx: &mut Cx) {
        let Some(removed) = self.workers.remove(key) else { return };
        self.remove_candidates(&removed.shared, cx);
        tracing::info!(worker = %removed.shared.id, why, requeued = removed.jobs.len(), "worker removed");
        let mut by_queue: Vec<(QueueName, Vec<Job>)> = Vec::new();
        for InFlight { mut job, .. } in removed.jobs {
            job.set_redeliveries(job.redeliveries() + 1);
            job.set_back_from(Some(key));
            let queue = job.queue();
            if job.redeliveries() > limits::MAX_DELIVERIES {
                Counters::bump(&self.ctx.counters.dead_lettered);
                let (msgid, body) = (show(job.frames.msgid()), cut(job.frames.body()));
                tracing::error!(%queue, %msgid, %body, "job dropped: every worker that took it died");
                self.log_done(&job, cx);
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

    pub(super) fn worker_heartbeat_due(&mut self, key: WorkerKey, cx: &mut Cx) {
        let Some(id) = self.workers.id_of(key).cloned() else { return };
        self.send_heartbeat(Dest::Backend, &id, cx);
        self.timers.arm(cx.now + self.ctx.config.heartbeat_interval, Timer::WorkerHeartbeat(key));
    }

    pub(super) fn worker_expiry_due(&mut self, key: WorkerKey, cx: &mut Cx) {
        let (timeout, grace) = (self.ctx.config.heartbeat_timeout, self.ctx.config.kbye_grace);
        match self.workers.expiry(key, cx.now, timeout, grace) {
            Expiry::Gone => {}
            Expiry::NotBefore(deadline) => self.timers.arm(deadline, Timer::WorkerExpiry(key)),
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

    pub(super) fn handle_scheduler_inform(&mut self, id: PeerId, msgid: MsgId, cx: &mut Cx) {
        tracing::info!(scheduler = %id, "scheduler registered");
        self.schedulers.add(id.clone(), cx.now);
        self.send(Dest::Frontend, &id, Command::Ack { acked: msgid.0.to_vec() }, OnFail::Count, cx);
        self.send_heartbeat(Dest::Frontend, &id, cx);
    }

    pub(super) fn handle_schedule(
        &mut self,
        client: PeerId,
        msgid: MsgId,
        frames: Vec<Frame>,
        unschedule: bool,
        cx: &mut Cx,
    ) {
        if unschedule {
            let ids = self.schedulers.ids();
            if ids.is_empty() {
                return self.no_scheduler(&client, msgid, cx);
            }
            for id in ids {
                let msg = OutMsg::Frames(frames.clone());
                cx.out.emqp(Outgoing { dest: Dest::Frontend, peer: id, msg, on_fail: OnFail::Unschedule });
            }
            return;
        }
        match self.schedulers.pick() {
            Some(id) => {
                let on_fail = OnFail::Schedule { client };
                cx.out.emqp(Outgoing { dest: Dest::Frontend, peer: id, msg: OutMsg::Frames(frames), on_fail });
            }
            None => self.no_scheduler(&client, msgid, cx),
        }
    }

    fn no_scheduler(&mut self, client: &PeerId, msgid: MsgId, cx: &mut Cx) {
        Counters::bump(&self.ctx.counters.rejected_no_scheduler);
        self.send_error(client, msgid, "NO_SCHEDULER", "no scheduler is connected".into(), cx);
    }

    pub(super) fn handle_scheduler_send_failed(
        &mut self,
        id: PeerId,
        retry: Option<(PeerId, Vec<Frame>)>,
        cx: &mut Cx,
    ) {
        tracing::warn!(scheduler = %id, "scheduler unreachable; removed");
        self.schedulers.remove(&id);
        if let Some((client, frames)) = retry {
            let msgid = MsgId::from(frames.get(3).map_or(&[][..], Vec::as_slice));
            self.handle_schedule(client, msgid, frames, false, cx);
        }
    }

    pub(super) fn scheduler_heartbeats_due(&mut self, cx: &mut Cx) {
        for id in self.schedulers.ids() {
            self.send_heartbeat(Dest::Frontend, &id, cx);
        }
        self.timers.arm(cx.now + self.ctx.config.heartbeat_interval, Timer::SchedulerHeartbeats);
    }

    pub(super) fn scheduler_expiry_due(&mut self, cx: &mut Cx) {
        let timeout = self.ctx.config.heartbeat_timeout;
        for id in self.schedulers.expire(cx.now, timeout) {
            tracing::info!(scheduler = %id, "scheduler expired (heartbeat timeout)");
            Counters::bump(&self.ctx.counters.expired_schedulers);
        }
        // Checked every half timeout: a dead scheduler goes within 1.5 × timeout.
        self.timers.arm(cx.now + timeout / 2, Timer::SchedulerExpiry);
    }

    /// KBYE to every scheduler (shutdown).
    pub(super) fn kbye_schedulers(&mut self, cx: &mut Cx) {
        for id in self.schedulers.ids() {
            self.send(Dest::Frontend, &id, Command::Kbye, OnFail::Count, cx);
        }
    }
}
