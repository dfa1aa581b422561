//! [`JsShared`]: one shard's replicated log as the other threads see it:
//! the NATS thread reports each PubAck and each give-up here, the shard's
//! release thread waits here for its tickets ([`Durable`]), and STATUS,
//! `/metrics` and the status page read the figures ([`LogStatus`]).
//!
//! # The durable mark
//!
//! Every batch the shard commits is a ticket, published as one or more
//! messages ("parts"). PubAcks come back in any order; a ticket is durable
//! once every ticket up to it has all its parts acknowledged (the unbroken
//! acknowledged prefix). A ticket the store did not confirm within
//! `nats_give_up` stops the prefix: it and every ticket handed out so far
//! are given up ([`Durable::gave_up`]) and the log is faulty until a
//! snapshot of every live job is acknowledged (the repair,
//! `jslog::log`), which makes every ticket up to the snapshot's durable.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use parking_lot::{Condvar, Mutex};
use serde_json::{json, Value};

use crate::joblog::{Durable, FaultKind, LogFigures, LogState, LogStatus, StoreFault, StoreFigures, Ticket};

/// What the shard learns from the NATS thread at its next batch end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acked {
    /// The ticket.
    pub ticket: u64,
    /// Its part.
    pub part: u16,
    /// The stream sequence the part was stored at.
    pub seq: u64,
}

#[derive(Debug, Default)]
struct Progress {
    /// The highest ticket handed to the NATS thread.
    handed: u64,
    /// Parts not yet acknowledged, by ticket.
    pending: BTreeMap<u64, u16>,
    /// Every ticket up to this one is durable.
    durable: u64,
    /// Tickets above `durable` and up to this one were given up.
    gave_up: u64,
    /// The fault, while there is one.
    fault: Option<FaultKind>,
    /// The repair's snapshot ticket, while it is not acknowledged.
    snapshot: Option<u64>,
    /// Acknowledged parts the shard has not taken yet.
    acked: Vec<Acked>,
    /// The highest stream sequence acknowledged.
    last_seq: u64,
}

impl Progress {
    fn advance(&mut self) {
        let next = match self.pending.keys().next() {
            Some(&t) => t - 1,
            None => self.handed,
        };
        self.durable = self.durable.max(next);
    }
}

/// The one error line of a router whose every shard is fenced (said by
/// whoever fenced the last one): what it does now and what the operator
/// should do (docs/replicated.md, "Failover").
pub fn say_router_fenced() {
    tracing::error!(
        ownership = "fenced",
        role = "fenced",
        "this router is fenced: another router took its router_name and its streams; it stays up, answers admin \
         (STATUS wal.nats.role = fenced) and refuses every producer (STORE_FAILED); it acknowledges and appends \
         nothing more. Stop it; restart it with --standby to make it the standby of the new owner"
    );
}

/// One shard's replicated-log state shared between threads (module docs).
#[derive(Debug)]
pub struct JsShared {
    shard: usize,
    stream: String,
    /// This start's subject on the stream (its epoch subject).
    subject: String,
    /// When a publish of this shard last asked the stream's subjects.
    fence_checked: Mutex<Option<Instant>>,
    progress: Mutex<Progress>,
    changed: Condvar,
    /// Figures.
    pub stats: JsStats,
    sync_hist: Mutex<Option<Histogram<u64>>>,
    /// PubAck latency since start (µs), for `/metrics`.
    ack_hist: Mutex<Option<Histogram<u64>>>,
}

/// Counters and gauges of one shard's replicated log.
#[derive(Debug, Default)]
pub struct JsStats {
    /// Messages published (parts), first tries.
    pub published: AtomicU64,
    /// Bytes of records published.
    pub published_bytes: AtomicU64,
    /// Publishes retried (a timeout, no responders, a lost connection).
    pub retries: AtomicU64,
    /// Publishes given up after `nats_give_up`.
    pub give_ups: AtomicU64,
    /// Jobs refused because their batch was given up.
    pub refused_jobs: AtomicU64,
    /// Stream bytes the log counts as held (records not purged).
    pub stream_bytes: AtomicU64,
    /// Of those, the bytes handed to the NATS thread and not yet
    /// acknowledged (0 once the log is at rest).
    pub unconfirmed_bytes: AtomicU64,
    /// Bytes of the live jobs' `Accepted` records.
    pub live_bytes: AtomicU64,
    /// Live jobs.
    pub live_jobs: AtomicU64,
    /// Purges sent, and the last one's time (ms since the Unix epoch).
    pub purges: AtomicU64,
    /// When the last purge was sent (ms since the Unix epoch; 0: never).
    pub last_purge_unix_ms: AtomicU64,
    /// The stream sequence below which the last purge removed everything.
    pub purged_below: AtomicU64,
    /// Jobs copied forward by compaction.
    pub relocated_jobs: AtomicU64,
    /// Repairs that brought the log back.
    pub repairs: AtomicU64,
    /// Faults by kind (index [`FaultKind::index`]).
    pub errors: [AtomicU64; FaultKind::ALL.len()],
    /// Jobs recovered at start.
    pub jobs_recovered: AtomicU64,
    /// Wall time of the recovery (ms).
    pub recovery_ms: AtomicU64,
}

impl JsShared {
    /// The state of shard `shard`'s log, kept in stream `stream`, which
    /// this start publishes to on `subject`.
    pub fn new(shard: usize, stream: String, subject: String) -> JsShared {
        JsShared {
            shard,
            stream,
            subject,
            fence_checked: Mutex::default(),
            progress: Mutex::default(),
            changed: Condvar::new(),
            stats: JsStats::default(),
            sync_hist: Mutex::new(None),
            ack_hist: Mutex::new(None),
        }
    }

    /// The stream's name.
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// This start's subject on the stream.
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// The shard hands `ticket` to the NATS thread as `parts` messages.
    pub fn handed(&self, ticket: u64, parts: u16) {
        let mut p = self.progress.lock();
        p.handed = p.handed.max(ticket);
        p.pending.insert(ticket, parts);
    }

    /// The shard hands `ticket`, a snapshot of every live job (a repair):
    /// once it is acknowledged every ticket up to it is durable.
    pub fn snapshot(&self, ticket: u64, parts: u16) {
        self.handed(ticket, parts);
        self.progress.lock().snapshot = Some(ticket);
    }

    /// The NATS thread: part `part` of `ticket` is stored at `seq`, its
    /// PubAck `took` after the first try.
    pub fn acked(&self, ticket: u64, part: u16, seq: u64, took: Duration) {
        {
            let mut p = self.progress.lock();
            p.acked.push(Acked { ticket, part, seq });
            p.last_seq = p.last_seq.max(seq);
            if let Some(left) = p.pending.get_mut(&ticket) {
                *left = left.saturating_sub(1);
                if *left == 0 {
                    p.pending.remove(&ticket);
                    if p.snapshot == Some(ticket) {
                        // Everything before the snapshot is superseded.
                        p.snapshot = None;
                        p.fault = None;
                        p.durable = p.durable.max(ticket);
                        let stale: Vec<u64> = p.pending.range(..ticket).map(|(t, _)| *t).collect();
                        for t in stale {
                            p.pending.remove(&t);
                        }
                        self.stats.repairs.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(shard = self.shard, stream = %self.stream, "replicated job log repaired: every live job is stored again; new jobs are accepted");
                    }
                    p.advance();
                }
            }
        }
        self.changed.notify_all();
        let us = (took.as_micros() as u64).max(1);
        for h in [&self.sync_hist, &self.ack_hist] {
            let mut h = h.lock();
            if h.is_none() {
                *h = Histogram::new_with_bounds(1, crate::limits::LATENCY_MAX_US, 2).ok();
            }
            if let Some(hist) = h.as_mut() {
                hist.saturating_record(us);
            }
        }
    }

    /// The NATS thread: part `part` of `ticket` was not confirmed within
    /// `nats_give_up`. Every ticket handed out so far is given up, and the
    /// log is faulty until its repair.
    pub fn not_confirmed(&self, ticket: u64, part: u16) {
        {
            let mut p = self.progress.lock();
            if ticket <= p.durable {
                return;
            }
            p.gave_up = p.gave_up.max(p.handed);
            if p.snapshot.is_some_and(|s| s <= ticket) {
                p.snapshot = None;
            }
            if p.fault.is_none() {
                self.stats.errors[FaultKind::Unreachable.index()].fetch_add(1, Ordering::Relaxed);
                tracing::error!(
                    shard = self.shard,
                    stream = %self.stream,
                    ticket,
                    part,
                    refused = "STORE_FAILED",
                    "the NATS JetStream cluster did not confirm a batch in time (no quorum? no server reachable?): \
                     its producers are refused, new jobs too, until the store takes a snapshot of every live job"
                );
            }
            // A router that lost its name stays so (no repair).
            if p.fault != Some(FaultKind::Fenced) {
                p.fault = Some(FaultKind::Unreachable);
            }
        }
        self.stats.give_ups.fetch_add(1, Ordering::Relaxed);
        self.changed.notify_all();
    }

    /// A lease renewal found another router's value on the name: that
    /// router took the name, and fences (or fenced) this one's streams.
    /// The shard is fenced at once ([`JsShared::fence`]).
    /// `true` the first time.
    pub fn taken(&self) -> bool {
        self.fence("a lease renewal found another router holding this router's name")
    }

    /// The NATS thread: part `part` of `ticket` cannot be stored: its
    /// publish found no responders and the stream no longer takes this
    /// start's subject (a later owner fenced it, `jslog` module docs,
    /// "Fencing"). Given up at once, and the shard is fenced
    /// ([`JsShared::fence`]). `true` the first time.
    pub fn fenced(&self, ticket: u64, part: u16) -> bool {
        self.stats.give_ups.fetch_add(1, Ordering::Relaxed);
        let first = self.fence(&format!(
            "ticket {ticket} part {part}: no responders on this start's subject {}, and stream {} no longer takes it",
            self.subject, self.stream
        ));
        self.changed.notify_all();
        first
    }

    /// Another router took the name (`how` says how this router learnt
    /// it): the shard is fenced (`FaultKind::Fenced`), for the rest of
    /// this router's life. Every ticket handed out is given up (its
    /// producers get `STORE_FAILED`), nothing more is acknowledged, new
    /// jobs are refused, the log never repairs, and the NATS thread
    /// sends none of its publishes again. `true` the first time (one
    /// error line per shard; the caller may say more).
    pub fn fence(&self, how: &str) -> bool {
        let first = {
            let mut p = self.progress.lock();
            p.gave_up = p.gave_up.max(p.handed);
            p.snapshot = None;
            let first = p.fault != Some(FaultKind::Fenced);
            if first {
                self.stats.errors[FaultKind::Fenced.index()].fetch_add(1, Ordering::Relaxed);
                p.fault = Some(FaultKind::Fenced);
                tracing::error!(
                    shard = self.shard,
                    stream = %self.stream,
                    how,
                    ownership = "fenced",
                    refused = "STORE_FAILED",
                    "fenced: another router took this router's name and its streams; this shard acknowledges and \
                     appends nothing more (producers get STORE_FAILED)"
                );
            }
            first
        };
        self.changed.notify_all();
        first
    }

    /// Whether this publish may ask the stream whether it still takes
    /// the shard's subject (after "no responders"): at most once per
    /// `gap` for the shard, so a thousand publishes in flight ask once.
    pub fn may_check_fence(&self, gap: Duration) -> bool {
        let mut last = self.fence_checked.lock();
        let now = Instant::now();
        if last.is_some_and(|t| now.saturating_duration_since(t) < gap) {
            return false;
        }
        *last = Some(now);
        true
    }

    /// The acknowledged parts since the last take.
    pub fn take_acked(&self) -> Vec<Acked> {
        std::mem::take(&mut self.progress.lock().acked)
    }

    /// The fault, if any.
    pub fn fault(&self) -> Option<FaultKind> {
        self.progress.lock().fault
    }

    /// Whether a repair's snapshot is in flight.
    pub fn repairing(&self) -> bool {
        self.progress.lock().snapshot.is_some()
    }

    /// Whether the repair's snapshot `ticket` was given up: the log is
    /// still faulty and no longer waits for it (a give-up of it, or of a
    /// later ticket, which was first tried after it, clears it).
    pub fn snapshot_given_up(&self, ticket: u64) -> bool {
        let p = self.progress.lock();
        p.fault.is_some() && p.snapshot != Some(ticket) && ticket > p.durable
    }

    /// Tickets handed out and not yet durable.
    pub fn unconfirmed(&self) -> usize {
        self.progress.lock().pending.len()
    }

    /// The highest stream sequence acknowledged so far.
    pub fn last_seq(&self) -> u64 {
        self.progress.lock().last_seq
    }

    fn state(&self) -> LogState {
        match self.progress.lock().fault {
            Some(kind) => LogState::Faulty(kind),
            None => LogState::Ok,
        }
    }
}

impl Durable for JsShared {
    fn make_durable(&self, upto: Ticket) -> bool {
        self.progress.lock().durable >= upto.0
    }

    /// Every PubAck wakes the waiters; one that does not make `upto`
    /// durable is waited through (returning at it would send the release
    /// thread to its 10 ms pause between asks, many times a second).
    fn wait(&self, upto: Ticket, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut p = self.progress.lock();
        while p.durable < upto.0 && p.gave_up < upto.0 {
            if self.changed.wait_until(&mut p, deadline).timed_out() {
                break;
            }
        }
        p.durable >= upto.0
    }

    /// [`crate::limits::NATS_STALL_TIMEOUT`]: longer than a leader election.
    fn stall_timeout(&self) -> Duration {
        crate::limits::NATS_STALL_TIMEOUT
    }

    fn durable_upto(&self) -> Ticket {
        Ticket(self.progress.lock().durable)
    }

    fn faulty(&self) -> bool {
        self.progress.lock().fault.is_some()
    }

    fn gave_up(&self, upto: Ticket) -> Option<StoreFault> {
        let p = self.progress.lock();
        (upto.0 > p.durable && upto.0 <= p.gave_up).then_some(StoreFault::Failed)
    }

    fn note_refused(&self, jobs: u64) {
        self.stats.refused_jobs.fetch_add(jobs, Ordering::Relaxed);
    }
}

impl LogStatus for JsShared {
    fn figures(&self) -> LogFigures {
        let s = &self.stats;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        LogFigures {
            bytes: get(&s.stream_bytes),
            live_jobs: get(&s.live_jobs),
            state: self.state(),
            errors: std::array::from_fn(|i| get(&s.errors[i])),
            free_bytes: None,
            repairs: get(&s.repairs),
            store: Some(StoreFigures {
                published: get(&s.published),
                retries: get(&s.retries),
                give_ups: get(&s.give_ups),
                refused_jobs: get(&s.refused_jobs),
                unconfirmed_batches: self.unconfirmed() as u64,
                purges: get(&s.purges),
                last_purge_unix_ms: get(&s.last_purge_unix_ms),
                ack_us: self.ack_hist.lock().clone(),
            }),
        }
    }

    fn to_json(&self, shard: usize) -> Value {
        let s = &self.stats;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let f = self.figures();
        let errors: serde_json::Map<String, Value> =
            FaultKind::ALL.iter().map(|k| (k.as_str().to_string(), json!(f.errors[k.index()]))).collect();
        let ack = f.store.as_ref().and_then(|s| s.ack_us.as_ref()).filter(|h| !h.is_empty());
        let ack_at = |q: f64| ack.map(|h| h.value_at_quantile(q));
        json!({
            "shard": shard,
            "stream": self.stream,
            "state": f.state.as_str(),
            "stream_bytes": f.bytes,
            "live_jobs": f.live_jobs,
            "live_bytes": get(&s.live_bytes),
            "unconfirmed_batches": self.unconfirmed(),
            "unconfirmed_bytes": get(&s.unconfirmed_bytes),
            "published": get(&s.published),
            "published_bytes": get(&s.published_bytes),
            "retries": get(&s.retries),
            "give_ups": get(&s.give_ups),
            "refused_jobs": get(&s.refused_jobs),
            "ack_p50_us": ack_at(0.5),
            "ack_p99_us": ack_at(0.99),
            "purges": get(&s.purges),
            "last_purge_unix_ms": get(&s.last_purge_unix_ms),
            "purged_below_seq": get(&s.purged_below),
            "relocated_jobs": get(&s.relocated_jobs),
            "repairs": f.repairs,
            "errors": errors,
            "jobs_recovered": get(&s.jobs_recovered),
            "recovery_ms": get(&s.recovery_ms),
        })
    }

    fn take_sync_histogram(&self) -> Option<Histogram<u64>> {
        self.sync_hist.lock().take()
    }
}
