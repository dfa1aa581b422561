//! A dispatcher shard: one thread owning the queues that hash to it, the
//! workers whose identity hashes to it (their liveness and in-flight jobs),
//! and, on shard 0, the schedulers.
//!
//! The loop blocks until a message or its next timer deadline, then drains a
//! bounded batch (DESIGN "Block for one event, then drain a bounded batch").
//! [`Shard::handle`] is a short `match` whose arms call small handlers in the
//! submodules: `queues` (REQUEST, selection, dispatch), `workers` (INFORM,
//! READY, REPLY, expiry), `schedulers` (shard 0), `text` (ASK/ACK/DCL/DEL).

mod queues;
mod schedulers;
mod text;
mod workers;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use super::msg::{Dest, OnFail, Outbox, Outgoing, ShardMsg};
use super::timers::Timers;
use super::types::{ConnId, PeerId, QueueName, WorkerKey};
use crate::config::RouterConfig;
use crate::limits;
use crate::metrics::counters::Counters;
use crate::metrics::latency::ShardLatency;
use crate::protocol::emqp::{Command, Frame, Message};

pub use queues::QueueState;
use schedulers::Schedulers;
use text::Offer;
use workers::HomeWorker;

/// Timer events of a shard.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Timer {
    /// Send a HEARTBEAT to the worker, re-arm.
    WorkerHeartbeat(WorkerKey),
    /// Check whether the worker has been silent past the timeout.
    WorkerExpiry(WorkerKey),
    /// Send a HEARTBEAT to every scheduler, re-arm (shard 0).
    SchedulerHeartbeats,
    /// Expire silent schedulers (shard 0).
    SchedulerExpiry,
    /// Check the offer held by the connection against its deadline (at most
    /// one such timer per connection is armed).
    OfferTimeout(ConnId),
}

/// What every shard shares with the rest of the broker.
#[derive(Clone)]
pub struct ShardContext {
    /// Validated configuration.
    pub config: Arc<RouterConfig>,
    /// Senders to every shard, by index.
    pub shards: Arc<[Sender<ShardMsg>]>,
    /// Broker-wide counters.
    pub counters: Arc<Counters>,
    /// Source of [`WorkerKey`]s.
    pub next_key: Arc<AtomicU64>,
    /// Set while the broker drains: new work is refused.
    pub draining: Arc<AtomicBool>,
    /// Broker start, the zero of the `hb` figures.
    pub started: Instant,
}

/// One dispatcher shard.
pub struct Shard {
    index: usize,
    ctx: ShardContext,
    out: Box<dyn Outbox>,
    timers: Timers<Timer>,
    queues: HashMap<QueueName, QueueState>,
    workers: HashMap<PeerId, HomeWorker>,
    keys: HashMap<WorkerKey, PeerId>,
    schedulers: Schedulers,
    offers: HashMap<ConnId, Offer>,
    offer_seq: u64,
    offer_timers: HashSet<ConnId>,
    latency: ShardLatency,
}

impl Shard {
    /// A shard with index `index` (its position in `ctx.shards`).
    pub fn new(index: usize, ctx: ShardContext, out: Box<dyn Outbox>) -> Shard {
        let mut shard = Shard {
            index,
            ctx,
            out,
            timers: Timers::default(),
            queues: HashMap::new(),
            workers: HashMap::new(),
            keys: HashMap::new(),
            schedulers: Schedulers::default(),
            offers: HashMap::new(),
            offer_seq: 0,
            offer_timers: HashSet::new(),
            latency: ShardLatency::default(),
        };
        if index == 0 {
            let now = Instant::now();
            shard.timers.arm(now + shard.ctx.config.heartbeat_interval, Timer::SchedulerHeartbeats);
            shard.timers.arm(now + shard.ctx.config.heartbeat_timeout, Timer::SchedulerExpiry);
        }
        shard
    }

    /// Runs until [`ShardMsg::Shutdown`] or until every sender is gone.
    pub fn run(mut self, rx: Receiver<ShardMsg>) {
        loop {
            let first = match self.timers.next_deadline() {
                Some(deadline) => rx.recv_deadline(deadline),
                None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            };
            let msg = match first {
                Ok(msg) => Some(msg),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return,
            };
            let batch = msg.into_iter().chain(rx.try_iter().take(limits::BATCH));
            for msg in batch {
                if matches!(msg, ShardMsg::Shutdown) {
                    // Jobs still travelling between shards land here first,
                    // so the shutdown log lists them too.
                    let rest: Vec<ShardMsg> = rx.try_iter().collect();
                    for m in rest {
                        self.handle(m, Instant::now());
                    }
                    self.shutdown();
                    return;
                }
                self.handle(msg, Instant::now());
            }
            self.fire_timers(Instant::now());
        }
    }

    /// Handles one message: a `match` whose arms call the handlers.
    pub fn handle(&mut self, msg: ShardMsg, now: Instant) {
        match msg {
            ShardMsg::Request { queue, job, fallback_done } => self.handle_request(queue, job, fallback_done),
            ShardMsg::WorkerInform { id, msgid, queues } => self.handle_inform(id, msgid, queues, now),
            ShardMsg::WorkerReady { id } => self.handle_ready(id, now),
            ShardMsg::WorkerReply { id, request_msgid } => self.handle_job_reply(id, request_msgid, now),
            ShardMsg::WorkerHeartbeat { id } => self.handle_worker_heartbeat(id, now),
            ShardMsg::WorkerKbye { id } => self.handle_worker_kbye(id, now),
            ShardMsg::SchedulerInform { id, msgid } => self.handle_scheduler_inform(id, msgid, now),
            ShardMsg::SchedulerHeartbeat { id } => self.schedulers.touch(&id, now),
            ShardMsg::SchedulerKbye { id } => self.schedulers.remove(&id),
            ShardMsg::Schedule { client, msgid, frames, unschedule } => {
                self.handle_schedule(client, msgid, frames, unschedule)
            }
            ShardMsg::SchedulerSendFailed { id, retry } => self.handle_scheduler_send_failed(id, retry),
            ShardMsg::AddCandidate { queue, weight, worker } => self.handle_add_candidate(queue, weight, worker),
            ShardMsg::RemoveCandidate { queue, key } => self.handle_remove_candidate(queue, key),
            ShardMsg::Wake { worker } => self.wake(&worker),
            ShardMsg::Dispatched { key, queue, job } => self.handle_dispatched(key, queue, job, now),
            ShardMsg::Requeue { queue, jobs } => self.enqueue_front(queue, jobs),
            ShardMsg::SendFailed { key, msgid, unreachable } => self.handle_send_failed(key, msgid, unreachable, now),
            ShardMsg::TextSched { queue, data, reply } => self.handle_text_sched(queue, data, reply),
            ShardMsg::TextAsk { conn, queue, reply } => self.handle_text_ask(conn, queue, reply, now),
            ShardMsg::TextAnswer { conn, seq, answer, reply } => self.handle_text_answer(conn, seq, answer, reply),
            ShardMsg::TextRelease { conn, seq, reply } => {
                let released = self.handle_text_release(conn, seq);
                if let Some(reply) = reply {
                    let _ = reply.send(released);
                }
            }
            ShardMsg::LatencyTake { reply } => {
                let _ = reply.send(self.latency.take());
            }
            ShardMsg::Snapshot { reply } => {
                let _ = reply.send(self.snapshot(now));
            }
            ShardMsg::Shutdown => self.shutdown(),
        }
    }

    /// Runs every timer due at `now`.
    pub fn fire_timers(&mut self, now: Instant) {
        while let Some(timer) = self.timers.pop_due(now) {
            match timer {
                Timer::WorkerHeartbeat(key) => self.worker_heartbeat_due(key, now),
                Timer::WorkerExpiry(key) => self.worker_expiry_due(key, now),
                Timer::SchedulerHeartbeats => self.scheduler_heartbeats_due(now),
                Timer::SchedulerExpiry => self.scheduler_expiry_due(now),
                Timer::OfferTimeout(conn) => self.offer_timeout_due(conn, now),
            }
        }
    }

    /// The earliest timer deadline (for tests driving the shard by hand).
    pub fn next_deadline(&self) -> Option<Instant> {
        self.timers.next_deadline()
    }

    /// Sends `msg` to shard `index`, or handles it here when that is us.
    fn send_to_shard(&mut self, index: usize, msg: ShardMsg) {
        if index == self.index {
            self.handle(msg, Instant::now());
        } else if self.ctx.shards[index].send(msg).is_err() {
            tracing::error!(shard = self.index, to = index, "shard channel closed; message lost at shutdown");
        }
    }

    fn shard_of(&self, queue: &QueueName) -> usize {
        super::types::shard_of(&queue.0, self.ctx.shards.len())
    }

    /// Sends `command` with a fresh msgid to `peer` on `dest`.
    fn send(&mut self, dest: Dest, peer: &PeerId, command: Command, on_fail: OnFail) {
        let frames = Message::new(command).encode();
        self.out.send(Outgoing { dest, peer: peer.clone(), frames, on_fail });
    }

    /// Sends an ERROR (emq extension) about `refers_to` to a frontend peer.
    fn send_error(&mut self, peer: &PeerId, refers_to: Frame, code: &str, text: String) {
        let command = Command::Error { refers_to, code: code.as_bytes().to_vec(), text: text.into_bytes() };
        self.send(Dest::Frontend, peer, command, OnFail::Count);
    }

    fn is_draining(&self) -> bool {
        self.ctx.draining.load(Ordering::Acquire)
    }

    fn hb_secs(&self, at: Instant) -> f64 {
        at.saturating_duration_since(self.ctx.started).as_secs_f64()
    }

    fn snapshot(&self, now: Instant) -> super::snapshot::ShardSnapshot {
        super::snapshot::ShardSnapshot {
            queues: self.queue_snaps(),
            workers: self.worker_snaps(now),
            schedulers: self.schedulers.snaps(self.ctx.started),
        }
    }

    fn shutdown(&mut self) {
        self.kbye_workers();
        if self.index == 0 {
            self.kbye_schedulers();
        }
        self.log_remaining();
    }
}
