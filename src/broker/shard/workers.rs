//! Worker handlers on the worker's home shard: INFORM, READY, job-result
//! REPLY, HEARTBEAT, KBYE, expiry, and the in-flight table.
//!
//! KBYE (decided): the worker gets no new jobs at once; jobs it still holds
//! stay in flight, because a Python jobmanager finishes them and sends their
//! REPLYs after its KBYE (spec §6.7), without heartbeating any more. So a
//! draining worker is not expired by the heartbeat timeout: it is kept until
//! `kbye_grace` after its KBYE (or, with nothing in flight, one heartbeat
//! timeout, so a job already on its way to it is still recorded and its
//! REPLY accepted). Whatever it still holds then goes back to the front of
//! its queues (at-least-once).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::{Shard, Timer};
use crate::broker::msg::{Dest, OnFail, ShardMsg};
use crate::broker::snapshot::WorkerSnap;
use crate::broker::types::{Job, PeerId, QueueName, WorkerKey, WorkerShared, WorkerState};
use crate::limits;
use crate::metrics::counters::Counters;
use crate::metrics::latency::Kind;
use crate::protocol::emqp::{heartbeat_timestamp, Command, Frame};

/// A job sent to a worker and not yet answered.
#[derive(Debug)]
pub struct InFlight {
    /// The queue it was taken from (after the fallback).
    pub queue: QueueName,
    /// The job, kept to be requeued if the worker dies.
    pub job: Job,
    /// When it was dispatched.
    pub since: Instant,
    /// Dispatch order on this worker (ties of `since` are common).
    pub seq: u64,
}

/// A worker as its home shard holds it.
#[derive(Debug)]
pub struct HomeWorker {
    /// The state shared with the shards of its queues.
    pub shared: Arc<WorkerShared>,
    /// Last message received from it.
    pub last_seen: Instant,
    /// Jobs sent to it, by REQUEST msgid.
    pub inflight: HashMap<Frame, InFlight>,
    /// Jobs sent to it since it registered (also the next [`InFlight::seq`]).
    pub processed: u64,
    /// When it said KBYE.
    pub kbye_at: Option<Instant>,
}

impl Shard {
    pub(super) fn handle_inform(&mut self, id: PeerId, msgid: Frame, queues: Vec<(i64, QueueName)>, now: Instant) {
        if let Some(old) = self.workers.get(&id).map(|w| w.shared.key) {
            tracing::info!(worker = %id, "re-INFORM: replacing the earlier registration");
            self.remove_worker(old, "re-INFORM");
        }
        let key = WorkerKey(self.ctx.next_key.fetch_add(1, Ordering::Relaxed));
        let shared = Arc::new(WorkerShared::new(key, id.clone(), self.index, queues.clone()));
        self.workers.insert(
            id.clone(),
            HomeWorker {
                shared: shared.clone(),
                last_seen: now,
                inflight: HashMap::new(),
                processed: 0,
                kbye_at: None,
            },
        );
        self.keys.insert(key, id.clone());
        tracing::info!(worker = %id, queues = ?queues, "worker registered");
        self.send(Dest::Backend, &id, Command::Ack { acked: msgid }, OnFail::Count);
        self.send(Dest::Backend, &id, Command::Heartbeat { timestamp: heartbeat_timestamp() }, OnFail::Count);
        for (weight, queue) in queues {
            let index = self.shard_of(&queue);
            self.send_to_shard(index, ShardMsg::AddCandidate { queue, weight, worker: shared.clone() });
        }
        self.timers.arm(now + self.ctx.config.heartbeat_interval, Timer::WorkerHeartbeat(key));
        self.timers.arm(now + self.ctx.config.heartbeat_timeout, Timer::WorkerExpiry(key));
    }

    /// Refreshes the worker's liveness; `None` (and counted) when unknown.
    fn touch_worker(&mut self, id: &PeerId, now: Instant) -> Option<Arc<WorkerShared>> {
        match self.workers.get_mut(id) {
            Some(w) => {
                w.last_seen = now;
                Some(w.shared.clone())
            }
            None => {
                Counters::bump(&self.ctx.counters.unknown_worker_messages);
                tracing::debug!(worker = %id, "message from an unregistered worker dropped");
                None
            }
        }
    }

    pub(super) fn handle_ready(&mut self, id: PeerId, now: Instant) {
        let Some(worker) = self.touch_worker(&id, now) else { return };
        if worker.state() != WorkerState::Live {
            return;
        }
        worker.add_slot();
        let mut shards: Vec<usize> = Vec::new();
        for (_, q) in &worker.queues {
            let index = self.shard_of(q);
            if !shards.contains(&index) {
                shards.push(index);
            }
        }
        for index in shards {
            self.send_to_shard(index, ShardMsg::Wake { worker: worker.clone() });
        }
    }

    pub(super) fn handle_job_reply(&mut self, id: PeerId, request_msgid: Frame, now: Instant) {
        if self.touch_worker(&id, now).is_none() {
            return;
        }
        let Some(w) = self.workers.get_mut(&id) else { return };
        if let Some(f) = w.inflight.remove(&request_msgid) {
            Counters::bump(&self.ctx.counters.completed_jobs);
            self.latency.record(&f.queue, Kind::Service, now.saturating_duration_since(f.since));
            self.latency.record(&f.queue, Kind::EndToEnd, now.saturating_duration_since(f.job.accepted_at));
        }
    }

    pub(super) fn handle_worker_heartbeat(&mut self, id: PeerId, now: Instant) {
        self.touch_worker(&id, now);
    }

    pub(super) fn handle_worker_kbye(&mut self, id: PeerId, now: Instant) {
        let Some(worker) = self.touch_worker(&id, now) else { return };
        worker.set_state(WorkerState::Draining);
        self.remove_candidates(&worker);
        if let Some(w) = self.workers.get_mut(&id) {
            w.kbye_at.get_or_insert(now);
        }
        tracing::info!(worker = %id, "KBYE: no new jobs for this worker");
        self.timers.arm(now + self.ctx.config.heartbeat_timeout, Timer::WorkerExpiry(worker.key));
    }

    pub(super) fn handle_dispatched(&mut self, key: WorkerKey, queue: QueueName, job: Job, now: Instant) {
        let worker = self.keys.get(&key).and_then(|id| self.workers.get_mut(id));
        match worker {
            Some(w) if w.shared.state() != WorkerState::Dead => {
                w.processed += 1;
                let seq = w.processed;
                w.inflight.insert(job.msgid.clone(), InFlight { queue, job, since: now, seq });
            }
            _ => self.requeue(queue, vec![job]),
        }
    }

    /// A job could not be sent to worker `key`: the peer is gone
    /// (EHOSTUNREACH), or its pipe is full (EAGAIN) although the HWM allows
    /// 100,000 messages, so it is not reading. Either way the worker is
    /// removed and everything it holds, this job included, is requeued; a
    /// live worker re-registers (EventMQ does the same, D16).
    pub(super) fn handle_send_failed(&mut self, key: WorkerKey, msgid: Frame, unreachable: bool, _now: Instant) {
        let why = if unreachable { "unreachable" } else { "not reading (pipe full)" };
        tracing::warn!(msgid = %crate::broker::types::show(&msgid), why, "sending a job failed");
        self.remove_worker(key, why);
    }

    /// Puts jobs back at the front of their queue, on whichever shard owns it.
    fn requeue(&mut self, queue: QueueName, jobs: Vec<Job>) {
        self.ctx.counters.requeued_jobs.fetch_add(jobs.len() as u64, Ordering::Relaxed);
        let index = self.shard_of(&queue);
        self.send_to_shard(index, ShardMsg::Requeue { queue, jobs });
    }

    fn remove_candidates(&mut self, worker: &WorkerShared) {
        for (_, queue) in &worker.queues {
            let index = self.shard_of(queue);
            self.send_to_shard(index, ShardMsg::RemoveCandidate { queue: queue.clone(), key: worker.key });
        }
    }

    /// Forgets worker `key`: marks it dead, takes it out of selection and
    /// puts its unfinished jobs back at the front of their queues, oldest
    /// first in line.
    pub(super) fn remove_worker(&mut self, key: WorkerKey, why: &str) {
        let Some(id) = self.keys.remove(&key) else { return };
        let Some(w) = self.workers.remove(&id) else { return };
        w.shared.set_state(WorkerState::Dead);
        self.remove_candidates(&w.shared);
        let mut jobs: Vec<InFlight> = w.inflight.into_values().collect();
        tracing::info!(worker = %id, why, requeued = jobs.len(), "worker removed");
        jobs.sort_by_key(|f| f.seq);
        let mut by_queue: Vec<(QueueName, Vec<Job>)> = Vec::new();
        for mut f in jobs {
            f.job.redeliveries += 1;
            if f.job.redeliveries > limits::MAX_DELIVERIES {
                Counters::bump(&self.ctx.counters.dead_lettered);
                let (msgid, body) = (crate::broker::types::show(&f.job.msgid), crate::broker::types::cut(&f.job.body));
                tracing::error!(queue = %f.queue, %msgid, %body, "job dropped: every worker that took it died");
                continue;
            }
            match by_queue.iter_mut().find(|(q, _)| *q == f.queue) {
                Some((_, list)) => list.push(f.job),
                None => by_queue.push((f.queue, vec![f.job])),
            }
        }
        for (queue, list) in by_queue {
            self.requeue(queue, list);
        }
    }

    pub(super) fn worker_heartbeat_due(&mut self, key: WorkerKey, now: Instant) {
        let Some(id) = self.keys.get(&key).cloned() else { return };
        self.send(Dest::Backend, &id, Command::Heartbeat { timestamp: heartbeat_timestamp() }, OnFail::Count);
        self.timers.arm(now + self.ctx.config.heartbeat_interval, Timer::WorkerHeartbeat(key));
    }

    pub(super) fn worker_expiry_due(&mut self, key: WorkerKey, now: Instant) {
        let Some(w) = self.keys.get(&key).and_then(|id| self.workers.get(id)) else { return };
        let deadline = match w.kbye_at {
            None => w.last_seen + self.ctx.config.heartbeat_timeout,
            Some(at) if w.inflight.is_empty() => at + self.ctx.config.heartbeat_timeout,
            Some(at) => at + self.ctx.config.kbye_grace,
        };
        if deadline > now {
            self.timers.arm(deadline, Timer::WorkerExpiry(key));
            return;
        }
        if w.kbye_at.is_some() {
            self.remove_worker(key, "KBYE drain over");
            return;
        }
        Counters::bump(&self.ctx.counters.expired_workers);
        self.remove_worker(key, "heartbeat timeout");
    }

    pub(super) fn worker_snaps(&self, now: Instant) -> Vec<WorkerSnap> {
        let mut out: Vec<WorkerSnap> = self
            .workers
            .values()
            .map(|w| WorkerSnap {
                id: w.shared.id.to_string(),
                queues: w.shared.queues.iter().map(|(wt, q)| (*wt, q.to_string())).collect(),
                hb: self.hb_secs(w.last_seen),
                slots: w.shared.slots(),
                state: if w.shared.state() == WorkerState::Live { "live" } else { "draining" },
                processed: w.processed,
                inflight: w
                    .inflight
                    .values()
                    .map(|f| (f.queue.to_string(), now.saturating_duration_since(f.since)))
                    .collect(),
            })
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    /// KBYE to every worker of this shard (shutdown).
    pub(super) fn kbye_workers(&mut self) {
        let ids: Vec<PeerId> = self.workers.keys().cloned().collect();
        for id in ids {
            self.send(Dest::Backend, &id, Command::Kbye, OnFail::Count);
        }
    }

    /// Logs what is left at shutdown: queued jobs and in-flight jobs.
    pub(super) fn log_remaining(&self) {
        self.log_remaining_queued();
        for w in self.workers.values() {
            for f in w.inflight.values() {
                let msgid = crate::broker::types::show(&f.job.msgid);
                let body = crate::broker::types::cut(&f.job.body);
                tracing::warn!(worker = %w.shared.id, queue = %f.queue, %msgid, %body, "job still in flight at shutdown");
            }
        }
        for (conn, o) in &self.offers {
            let body = crate::broker::types::cut(&o.job.body);
            tracing::warn!(conn = conn.0, queue = %o.queue, %body, "text offer unanswered at shutdown");
        }
    }
}
