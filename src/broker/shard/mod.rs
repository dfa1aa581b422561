//! A dispatcher shard: one thread owning the queues that hash to it, the
//! workers whose identity hashes to it (their liveness and in-flight jobs),
//! the text offers of its queues and, on shard 0, the schedulers.
//!
//! A shard is a deterministic state machine (README,
//! "How it works"): [`Shard::handle`] takes a message and `now` and writes what it
//! produces to an [`Outbox`]; [`Shard::fire_timers`] does the same for its
//! timers. Nothing in here reads a clock, a socket or a channel, so a test
//! drives a shard with a `Vec` outbox and a hand-made clock
//! ([`crate::broker::outbox::VecOutbox`]).
//!
//! Messages a shard sends itself go to a local queue that is drained after
//! the current message, exactly as a message to another shard is handled
//! after the sender's current message: one shard and many shards run the
//! same steps in the same order. The one exception is the next step of a
//! long admin operation ([`ShardMsg::DeadStep`]), which goes to the back
//! of the shard's own inbox so that what arrived meanwhile is served
//! first.
//!
//! State, each owned by one table with methods, not fields:
//! [`queues::QueueTable`], [`workers::WorkerTable`], [`offers::OfferTable`],
//! [`waits::WaitTable`] (long-poll ASKs), [`asked::AskedQueues`] (queues
//! kept known by ASKs), [`schedulers::Schedulers`], the timers and the
//! latency histograms.
//! Handlers, by concern: `flow.rs` (REQUEST, admission, FIFO, selection,
//! dispatch, requeue), `peers.rs` (workers), `scheduling.rs` (schedulers,
//! SCHEDULE routing), `text.rs` (text commands and offers), `dead.rs`
//! (dead-lettering), `deadline.rs` (per-job deadlines). `Shard::dispatch` is a short `match` calling them.

mod admin;
pub mod answers;
pub mod asked;
mod dead;
pub mod dead_set;
mod deadline;
pub mod dedup;
mod durable;
mod flow;
pub mod offers;
pub mod owners;
mod peers;
pub mod queues;
pub mod retries;
pub mod schedulers;
mod scheduling;
mod text;
pub mod tombstones;
mod trim;
pub mod waits;
pub mod workers;

/// The unit tests' harness (shards driven by hand, with a hand-made clock),
/// for the fuzz targets in `fuzz/`: only with the `fuzzing` feature.
#[cfg(feature = "fuzzing")]
#[path = "tests/harness.rs"]
pub mod harness;
/// The unit tests' read-only observers of a [`harness::Harness`], for the
/// fuzz targets: only with the `fuzzing` feature.
#[cfg(feature = "fuzzing")]
#[path = "tests/observe.rs"]
pub mod observe;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Receiver, RecvTimeoutError};

use super::counts::QueueCounter;
use super::egress::{Dest, OnFail, OutMsg, Outgoing};
use super::inbox::ShardMsg;
use super::outbox::Outbox;
use super::snapshot::ShardSnapshot;
use super::timers::{Grid, Timers};
use crate::config::queues::QueuePolicies;
use crate::config::RouterConfig;
use crate::ids::{ConnId, MsgId, PeerId, QueueName, WorkerKey};
use crate::limits;
use crate::metrics::counters::Counters;
use crate::metrics::latency::{Kind, ShardLatency};
use crate::protocol::emqp::{Command, Message};

use answers::PendingAnswers;
use asked::AskedQueues;
use dead_set::DeadSet;
use offers::OfferTable;
use owners::Owners;
use queues::QueueTable;
use retries::RetryTable;
use schedulers::Schedulers;
use tombstones::Tombstones;
use waits::WaitTable;
use workers::WorkerTable;

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
    /// Forget idle queues (every half `queue_idle_grace`).
    QueueSweep,
    /// Check the long-poll ASK of the connection against its deadline (at
    /// most one such timer per connection is armed).
    AskTimeout(ConnId),
    /// Take back the worker's jobs past their deadline (armed for its
    /// earliest one).
    JobDeadline(WorkerKey),
    /// Put the jobs whose retry wait is over back in their queues (armed
    /// for each retry; one that finds nothing due does nothing).
    RetryDue,
}

/// What every shard shares with the rest of the broker.
#[derive(Clone)]
pub struct ShardContext {
    /// Validated configuration.
    pub config: Arc<RouterConfig>,
    /// Number of shards.
    pub shards: usize,
    /// Broker-wide counters.
    pub counters: Arc<Counters>,
    /// Source of [`WorkerKey`]s, shared by all shards.
    pub next_key: Arc<AtomicU64>,
    /// Set while the broker drains: new work is refused.
    pub draining: Arc<AtomicBool>,
    /// Broker start, the zero of the `hb` figures.
    pub started: Instant,
    /// When the shards began serving (the router's start, or its take-over
    /// of the name after waiting as a standby): `queue_learn_grace` counts
    /// from here (`Shard::queue_known`).
    pub serving_since: Instant,
    /// `started` on the wall clock, in milliseconds since the Unix epoch
    /// (the dead set's burial times).
    pub started_unix_ms: u64,
    /// Queues of every shard together (checked against `max_queues`).
    pub queue_count: Arc<AtomicUsize>,
    /// Bytes of every waiting and in-flight job (checked against the
    /// memory limit).
    pub job_bytes: Arc<AtomicUsize>,
    /// Bytes of new eMQP jobs the I/O thread has handed to the shards that
    /// no shard has admitted or refused yet ([`ShardMsg::in_transit_bytes`];
    /// a job forwarded to `default` stays counted until `default`'s shard
    /// decides): the I/O thread counts them with [`ShardContext::job_bytes`]
    /// against the memory limit, and refuses a REQUEST past it at once, so
    /// that a producer pushing large jobs at a full broker costs no more
    /// memory than the limit (docs/configuration.md, `max_memory_bytes`).
    pub in_transit_bytes: Arc<AtomicUsize>,
    /// Registered workers of every shard together (checked against `max_workers`).
    pub worker_count: Arc<AtomicUsize>,
    /// Jobs in the dead sets of every shard together (kept within
    /// `dead_max_jobs`).
    pub dead_jobs: Arc<AtomicUsize>,
    /// Bytes of those jobs (kept within `dead_max_bytes`).
    pub dead_bytes: Arc<AtomicUsize>,
    /// The broker-wide byte limit ([`RouterConfig::memory_limit_bytes`]).
    pub memory_limit: usize,
    /// Per shard: front-end messages handed over and not taken yet
    /// ([`ShardMsg::inbox_weight`]); the front ends stop reading their
    /// sockets while a shard's count is at `shard_inbox_messages`.
    pub inbox_load: Arc<[AtomicUsize]>,
    /// Every queue's policy (time limit, retries, limits): the router-wide
    /// settings with the per-queue ones (`queues`, `job_timeouts`) in place.
    pub policies: Arc<QueuePolicies>,
}

/// Takes `bytes` of new jobs out of [`ShardContext::in_transit_bytes`]
/// (a job admitted or refused by a shard, or a hand-over that failed);
/// saturating: a request handed over by a test was never counted.
pub fn release_in_transit(in_transit: &AtomicUsize, bytes: usize) {
    let take = |v: usize| Some(v.saturating_sub(bytes));
    let _ = in_transit.fetch_update(Ordering::Relaxed, Ordering::Relaxed, take);
}

impl ShardContext {
    /// A context for `shards` shards on `config`, started at `started`.
    pub fn new(config: Arc<RouterConfig>, shards: usize, started: Instant) -> ShardContext {
        // `RouterConfig::validate` refused a table that does not resolve;
        // a config changed after it (tests) falls back to the router-wide
        // settings for every queue.
        let policies = QueuePolicies::new(&config).unwrap_or_else(|_| QueuePolicies::router_wide(&config));
        ShardContext {
            policies: Arc::new(policies),
            memory_limit: config.memory_limit_bytes(),
            config,
            shards,
            counters: Arc::new(Counters::default()),
            next_key: Arc::new(AtomicU64::new(1)),
            draining: Arc::new(AtomicBool::new(false)),
            started,
            serving_since: started,
            started_unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            queue_count: Arc::default(),
            job_bytes: Arc::default(),
            in_transit_bytes: Arc::default(),
            worker_count: Arc::default(),
            dead_jobs: Arc::default(),
            dead_bytes: Arc::default(),
            inbox_load: (0..shards).map(|_| AtomicUsize::new(0)).collect(),
        }
    }
}

/// What a handler needs besides the shard: the time of the message and
/// where its output goes.
pub struct Cx<'a> {
    /// The time the message is handled at.
    pub now: Instant,
    /// Where frames, messages and answers go.
    pub out: &'a mut dyn Outbox,
}

/// One dispatcher shard.
pub struct Shard {
    index: usize,
    ctx: ShardContext,
    timers: Timers<Timer>,
    /// What worker heartbeat and expiry deadlines are rounded to, so that
    /// those of many workers fall due together.
    grid: Grid,
    queues: QueueTable,
    workers: WorkerTable,
    offers: OfferTable,
    waits: WaitTable,
    asked: AskedQueues,
    schedulers: Schedulers,
    /// Who waits for which scheduler's answer (shard 0).
    answers: PendingAnswers,
    /// Which scheduler owns which schedule key (shard 0).
    owners: Owners,
    /// UNSCHEDULEs and moves not yet heard of by every scheduler (shard 0).
    tombstones: Tombstones,
    latency: ShardLatency,
    /// Jobs waiting out their back-off before a retry.
    retries: RetryTable,
    /// Jobs out of retries, kept for an operator.
    dead: DeadSet,
    /// Messages this shard sent itself, handled after the current message.
    local: VecDeque<ShardMsg>,
    /// Jobs accepted so far (the sequence part of their [`crate::ids::JobId`]).
    accepted: u64,
    /// The keys of the REQUESTs for this shard's queues accepted lately
    /// (docs/failover.md "Duplicates").
    dedup: dedup::DedupWindow,
    /// When to give the heap back after sweeps.
    trim: trim::HeapTrim,
    /// The shard's job log ([`crate::joblog::NoLog`] with `durability =
    /// "memory"`).
    log: Box<dyn crate::joblog::JobLog>,
    /// How far the log has made the shard's tickets durable.
    watch: durable::LogWatch,
}

impl Shard {
    /// Shard `index` of `ctx.shards`, created at `now` (shard 0 arms the
    /// scheduler timers from then).
    pub fn new(index: usize, ctx: ShardContext, now: Instant) -> Shard {
        let queues = QueueTable::new(ctx.queue_count.clone());
        let workers = WorkerTable::new(ctx.worker_count.clone());
        let asked_cap = ctx.config.text.max_asked_queues / ctx.shards.max(1);
        let grid = Grid::for_heartbeats(ctx.started, ctx.config.heartbeat_interval);
        let (log, watch) = durable::no_log(now);
        let mut shard = Shard {
            index,
            ctx,
            timers: Timers::default(),
            grid,
            queues,
            workers,
            offers: OfferTable::new(index),
            waits: WaitTable::default(),
            asked: AskedQueues::new(asked_cap),
            schedulers: Schedulers::default(),
            answers: PendingAnswers::default(),
            owners: Owners::default(),
            tombstones: Tombstones::default(),
            latency: ShardLatency::default(),
            retries: RetryTable::default(),
            dead: DeadSet::default(),
            local: VecDeque::new(),
            accepted: 0,
            dedup: dedup::DedupWindow::default(),
            trim: trim::HeapTrim::default(),
            log,
            watch,
        };
        if index == 0 {
            shard.timers.arm(now + shard.ctx.config.heartbeat_interval, Timer::SchedulerHeartbeats);
            shard.timers.arm(now + shard.ctx.config.heartbeat_timeout, Timer::SchedulerExpiry);
        }
        shard.timers.arm(now + shard.sweep_period(), Timer::QueueSweep);
        shard
    }

    /// Runs until [`ShardMsg::Shutdown`] or until every sender is gone:
    /// blocks for one message or the next timer, then drains a bounded
    /// batch (block for one event, then drain a bounded batch).
    pub fn run(mut self, rx: Receiver<ShardMsg>, out: &mut dyn Outbox) {
        loop {
            let first = match self.next_deadline() {
                Some(deadline) => rx.recv_deadline(deadline),
                None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            };
            let msg = match first {
                Ok(msg) => Some(msg),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return,
            };
            for msg in msg.into_iter().chain(rx.try_iter().take(limits::BATCH)) {
                let weight = msg.inbox_weight();
                if weight > 0 {
                    self.ctx.inbox_load[self.index].fetch_sub(weight, Ordering::Relaxed);
                }
                if matches!(msg, ShardMsg::Shutdown) {
                    // Jobs still travelling between shards land here first,
                    // so the shutdown log lists them too.
                    let rest: Vec<ShardMsg> = rx.try_iter().collect();
                    for m in rest {
                        self.handle(m, Instant::now(), out);
                    }
                    self.handle(ShardMsg::Shutdown, Instant::now(), out);
                    self.end_batch(Instant::now(), out);
                    return;
                }
                self.handle(msg, Instant::now(), out);
            }
            self.fire_timers(Instant::now(), out);
            self.end_batch(Instant::now(), out);
        }
    }

    /// Handles one message at `now`, then what it sent this shard itself.
    pub fn handle(&mut self, msg: ShardMsg, now: Instant, out: &mut dyn Outbox) {
        let mut cx = Cx { now, out };
        self.dispatch(msg, &mut cx);
        self.drain_local(&mut cx);
    }

    /// Runs every timer due at `now`.
    pub fn fire_timers(&mut self, now: Instant, out: &mut dyn Outbox) {
        let mut cx = Cx { now, out };
        while let Some(timer) = self.timers.pop_due(now) {
            match timer {
                Timer::WorkerHeartbeat(key) => self.worker_heartbeat_due(key, &mut cx),
                Timer::WorkerExpiry(key) => self.worker_expiry_due(key, &mut cx),
                Timer::SchedulerHeartbeats => self.scheduler_heartbeats_due(&mut cx),
                Timer::SchedulerExpiry => self.scheduler_expiry_due(&mut cx),
                Timer::OfferTimeout(conn) => self.offer_timeout_due(conn, &mut cx),
                Timer::QueueSweep => self.queue_sweep_due(&mut cx),
                Timer::AskTimeout(conn) => self.ask_timeout_due(conn, &mut cx),
                Timer::JobDeadline(key) => self.job_deadline_due(key, &mut cx),
                Timer::RetryDue => self.retry_due(&mut cx),
            }
            self.drain_local(&mut cx);
        }
    }

    /// The earliest timer deadline (or write-ahead log deadline), if any.
    pub fn next_deadline(&self) -> Option<Instant> {
        match (self.timers.next_deadline(), self.log_deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// This shard's state at `now`, for the admin queries.
    pub fn snapshot(&self, now: Instant) -> ShardSnapshot {
        ShardSnapshot {
            queues: self.queues.snaps(|q| self.offers.held(q)),
            workers: self.workers.snaps(now, self.ctx.started),
            schedulers: self.schedulers.snaps(self.ctx.started),
            asks_waiting: self.waits.len(),
            asked: self.asked_queues(now),
            retrying: self.retries.per_queue().map(|(q, n)| (q.to_string(), n)).collect(),
            dead: self.dead.per_queue().map(|(q, n)| (q.to_string(), n)).collect(),
            dead_bytes: self.dead.bytes(),
        }
    }

    /// The dispatcher: a `match` whose arms call the handlers.
    fn dispatch(&mut self, msg: ShardMsg, cx: &mut Cx) {
        match msg {
            ShardMsg::Request { client, frames, fallback_done } => {
                self.handle_request(client, frames, fallback_done, cx)
            }
            ShardMsg::WorkerInform { id, msgid, queues } => self.handle_inform(id, msgid, queues, cx),
            ShardMsg::WorkerReady { id } => self.handle_ready(id, cx),
            ShardMsg::WorkerUnready { id, msgid } => self.handle_unready(id, msgid, cx),
            ShardMsg::WorkerReply { id, request_msgid, failed } => self.handle_job_reply(id, request_msgid, failed, cx),
            ShardMsg::WorkerHeartbeat { id } => self.handle_worker_heartbeat(id, cx),
            ShardMsg::WorkerKbye { id } => self.handle_worker_kbye(id, cx),
            ShardMsg::SchedulerInform { id, msgid, name } => self.handle_scheduler_inform(id, msgid, name, cx),
            ShardMsg::SchedulerHeartbeat { id, msgid } => self.handle_scheduler_heartbeat(id, msgid, cx),
            ShardMsg::SchedulerKbye { id } => self.schedulers.remove(&id),
            ShardMsg::Schedule(sched) => self.handle_schedule(sched, cx),
            ShardMsg::SchedulerAnswer { id, refers_to, frames } => {
                self.handle_scheduler_answer(id, refers_to, frames, cx)
            }
            ShardMsg::SchedulerSendFailed { id, retry } => self.handle_scheduler_send_failed(id, retry, cx),
            ShardMsg::AddCandidate { queue, weight, worker, inform } => {
                self.handle_add_candidate(queue, weight, worker, inform, cx)
            }
            ShardMsg::RemoveCandidate { queue, key } => self.queues.remove_candidate(&queue, key),
            ShardMsg::PauseCandidate { queue, key, paused } => self.handle_pause_candidate(queue, key, paused, cx),
            ShardMsg::Wake { worker, from } => self.handle_wake(&worker, from, cx),
            ShardMsg::Dispatched { key, job } => self.handle_dispatched(key, job, cx),
            ShardMsg::Requeue { queue, jobs } => self.handle_requeue(queue, jobs, cx),
            ShardMsg::SetBack { job, why } => self.handle_set_back(job, why, cx),
            ShardMsg::Admin { op, reply } => self.handle_admin(op, reply, cx),
            ShardMsg::DeadStep(step) => self.dead_step(step, cx),
            ShardMsg::DeadTrim => {
                self.trim_dead(0, cx);
            }
            ShardMsg::Count { queue, counter } => self.queues.count(&queue, counter),
            ShardMsg::SendFailed { key, msgid, unreachable } => self.handle_send_failed(key, msgid, unreachable, cx),
            ShardMsg::Text { port, cmds } => self.handle_text(&port, cmds, cx),
            ShardMsg::LogDone { id } => self.handle_log_done(id),
            ShardMsg::DedupKey { client, msgid, job, at_unix_ms } => {
                self.remember_key(&client, &msgid, dedup::Seen { job, at_unix_ms })
            }
            ShardMsg::Batch(msgs) => {
                for msg in msgs {
                    self.dispatch(msg, cx);
                    self.drain_local(cx);
                }
            }
            ShardMsg::Shutdown => self.shutdown(cx),
        }
    }

    /// The latency histograms recorded since the last take, with this
    /// shard's log sync times (as `shard-<n>`, [`Kind::WalSync`]).
    fn take_latency(&mut self) -> crate::metrics::latency::Taken {
        let mut taken = self.latency.take();
        taken.shard = (self.index, self.ctx.shards);
        if let Some(h) = self.log.status().take_sync_histogram() {
            taken.hists.push(((format!("shard-{}", self.index), Kind::WalSync), h));
        }
        taken
    }

    fn drain_local(&mut self, cx: &mut Cx) {
        while let Some(msg) = self.local.pop_front() {
            self.dispatch(msg, cx);
        }
    }

    /// Sends `msg` to shard `index`: this shard's own messages wait in the
    /// local queue until the current message is done.
    fn send_to_shard(&mut self, index: usize, msg: ShardMsg, cx: &mut Cx) {
        if index == self.index {
            self.local.push_back(msg);
        } else {
            cx.out.shard(index, msg);
        }
    }

    fn shard_of(&self, key: &[u8]) -> usize {
        super::types::shard_of(key, self.ctx.shards)
    }

    /// Adds one to `queue`'s `counter`, on the shard that owns the queue.
    fn count(&mut self, queue: QueueName, counter: QueueCounter, cx: &mut Cx) {
        match self.shard_of(&queue.0) {
            index if index == self.index => self.queues.count(&queue, counter),
            index => cx.out.shard(index, ShardMsg::Count { queue, counter }),
        }
    }

    /// Sends `command` with a fresh msgid to `peer` on `dest`.
    fn send(&self, dest: Dest, peer: &PeerId, command: Command, on_fail: OnFail, cx: &mut Cx) {
        let msg = OutMsg::Frames(Message::new(command).encode());
        cx.out.emqp(Outgoing { dest, peer: peer.clone(), msg, on_fail });
    }

    /// Sends a HEARTBEAT (stamped by the I/O thread when it goes out).
    fn send_heartbeat(&self, dest: Dest, peer: &PeerId, cx: &mut Cx) {
        cx.out.emqp(Outgoing { dest, peer: peer.clone(), msg: OutMsg::Heartbeat, on_fail: OnFail::Count });
    }

    /// Sends an ERROR (emq extension) about `refers_to` to a frontend peer.
    fn send_error(&self, peer: &PeerId, refers_to: MsgId, code: &str, text: String, cx: &mut Cx) {
        self.send_error_to(Dest::Frontend, peer, refers_to, code, text, cx);
    }

    /// Sends an ERROR (emq extension) about `refers_to` to `peer` on `dest`.
    fn send_error_to(&self, dest: Dest, peer: &PeerId, refers_to: MsgId, code: &str, text: String, cx: &mut Cx) {
        let command =
            Command::Error { refers_to: refers_to.0.to_vec(), code: code.as_bytes().to_vec(), text: text.into_bytes() };
        self.send(dest, peer, command, OnFail::Count, cx);
    }

    fn is_draining(&self) -> bool {
        self.ctx.draining.load(Ordering::Acquire)
    }

    fn shutdown(&mut self, cx: &mut Cx) {
        self.kbye_workers(cx);
        if self.index == 0 {
            self.kbye_schedulers(cx);
        }
        let kept = self.log.keeps_jobs() && self.log.sync_all();
        self.log_remaining(kept);
    }

    /// Logs what is left at shutdown: one summary line with the counts of
    /// queued, in-flight, offered, retry-waiting and dead jobs (info when
    /// the job log holds them for the next start, `kept`; warn with
    /// durability "memory"; error when the log is faulty and could not
    /// be repaired), and each job at debug by id, msgid and body length
    /// (bodies are never logged).
    fn log_remaining(&self, kept: bool) {
        use crate::ids::show;
        let (mut queued, mut inflight, mut offered) = (0usize, 0usize, 0usize);
        for (queue, job) in self.queues.waiting_jobs() {
            queued += 1;
            let (msgid, bytes) = (show(job.frames.msgid()), job.frames.body().len());
            tracing::debug!(shard = self.index, job = %job.id, %queue, %msgid, bytes, "queued job not run");
        }
        for (worker, f) in self.workers.inflight() {
            inflight += 1;
            let (msgid, bytes) = (show(f.job.frames.msgid()), f.job.frames.body().len());
            tracing::debug!(%worker, job = %f.job.id, queue = %f.job.queue(), %msgid, bytes, "job still in flight at shutdown");
        }
        for (conn, o) in self.offers.iter() {
            offered += 1;
            tracing::debug!(%conn, queue = %o.queue, bytes = o.job.frames.body().len(), "text offer unanswered at shutdown");
        }
        for (_, job) in self.retries.iter() {
            let (msgid, bytes) = (show(job.frames.msgid()), job.frames.body().len());
            tracing::debug!(shard = self.index, job = %job.id, queue = %job.queue(), %msgid, bytes, "job waiting for a retry at shutdown");
        }
        let (retrying, dead) = (self.retries.len(), self.dead.len());
        if queued + inflight + offered + retrying + dead == 0 {
            return;
        }
        if kept {
            let what = "jobs kept in the write-ahead log for the next start (listed at debug)";
            tracing::info!(shard = self.index, queued, inflight, offered, retrying, dead, "{what}");
        } else if self.log.keeps_jobs() {
            let what = "jobs NOT kept: the write-ahead log is faulty and was not repaired (jobs the log held before the fault come back at the next start; see docs/durability.md)";
            tracing::error!(shard = self.index, queued, inflight, offered, retrying, dead, "{what}");
        } else {
            let what = "jobs left at shutdown (listed at debug)";
            tracing::warn!(shard = self.index, queued, inflight, offered, retrying, dead, "{what}");
        }
    }
}
