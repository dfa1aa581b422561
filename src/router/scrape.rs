//! One reading of the whole router for the HTTP server: every shard's
//! snapshot, the latency histograms, the broker-wide counters and the text
//! front end's figures, with the queues folded to at most
//! `metrics_max_queues` names (the rest summed as [`OTHER_QUEUE`]), and
//! each shard's job log (bytes, free space, state, errors). Both
//! `/metrics` ([`super::prometheus`]) and the status page
//! ([`super::status_page`]) render one.

use std::collections::BTreeMap;
use std::sync::Arc;

use hdrhistogram::Histogram;
use parking_lot::Mutex;

use super::Broker;
use crate::broker::counts::{QueueCounter, QueueCounts};
use crate::broker::snapshot::{SchedulerSnap, WorkerSnap};
use crate::joblog::{FaultKind, LogFigures, LogState, LogStatus};
use crate::metrics::latency::{new_histogram, Kind, LatencyStore};
use crate::text::{TextStats, TextStatsSnapshot};

/// The label of the queues past `metrics_max_queues`, summed.
pub const OTHER_QUEUE: &str = "_other";

/// One queue (or [`OTHER_QUEUE`]) as the HTTP server shows it.
#[derive(Debug, Clone, Default)]
pub struct QueueRow {
    /// Queue name.
    pub name: String,
    /// Jobs waiting.
    pub waiting: u64,
    /// Jobs held by eMQP workers or offered to text consumers.
    pub in_flight: u64,
    /// Jobs waiting out a back-off before a retry.
    pub retrying: u64,
    /// Jobs in the dead set now.
    pub dead: u64,
    /// Counts since start.
    pub counts: QueueCounts,
    /// Latency histograms since start, by [`Kind`] (`Kind as usize`).
    pub latency: [Option<Histogram<u64>>; 3],
}

/// What the router looked like at one moment.
#[derive(Debug, Clone, Default)]
pub struct Scrape {
    /// Seconds since the router started.
    pub uptime_secs: f64,
    /// Whether it drains (refuses new work).
    pub draining: bool,
    /// Shards.
    pub shards: usize,
    /// Queues by name, at most `metrics_max_queues` of them plus
    /// [`OTHER_QUEUE`] when some were folded.
    pub queues: Vec<QueueRow>,
    /// Queues summed into [`OTHER_QUEUE`].
    pub folded: usize,
    /// Every worker.
    pub workers: Vec<WorkerSnap>,
    /// Every scheduler.
    pub schedulers: Vec<SchedulerSnap>,
    /// The broker-wide counters by name ([`crate::metrics::counters::Counters`]).
    pub counters: Vec<(String, u64)>,
    /// The text front end's figures, when it is on.
    pub text: Option<TextStatsSnapshot>,
    /// Shards that did not answer in time (their queues are missing).
    pub shards_silent: usize,
    /// Bytes of the jobs in the dead sets.
    pub dead_bytes: u64,
    /// Each shard's job log, by shard (empty with `durability = "memory"`).
    pub logs: Vec<LogFigures>,
    /// `disk_free_limit`, when the router keeps a log.
    pub disk_free_limit: Option<u64>,
    /// The ownership of the router name (`durability = "replicated"`).
    pub ownership: Option<crate::jslog::ownership::OwnershipFigures>,
    /// How the HTTP server admits clients ("Basic auth (2 users)", "TLS"),
    /// set by the server for its status page; `None`: open to anyone who
    /// reaches it.
    pub http_access: Option<String>,
    /// The CURVE endpoints' counters, when the router has any.
    pub curve: Option<super::curve::CurveFigures>,
    /// The router's `router_name` (the `router` label of every `/metrics`
    /// series).
    pub router_name: String,
    /// The other router names of its stream prefix, as last listed
    /// (`durability = "replicated"`; empty otherwise).
    pub peers: Vec<crate::jslog::peers::PeerRouter>,
}

impl Scrape {
    /// Free bytes of the data directory's file system, as the shards last
    /// read it (the least of their readings: one file system).
    pub fn disk_free(&self) -> Option<u64> {
        self.logs.iter().filter_map(|l| l.free_bytes).min()
    }

    /// Whether any shard's log refuses new jobs for lack of space (the
    /// alarm, or a write that found the disk full).
    pub fn disk_alarm(&self) -> bool {
        self.logs.iter().any(|l| matches!(l.state, LogState::Alarm | LogState::Faulty(FaultKind::Full)))
    }
}

impl Scrape {
    /// The broker-wide counter `name`, 0 when unknown.
    pub fn counter(&self, name: &str) -> u64 {
        self.counters.iter().find(|(n, _)| n == name).map_or(0, |(_, v)| *v)
    }
}

/// Where a [`Scrape`] is read from.
#[derive(Clone)]
pub struct Sources {
    /// The shards.
    pub broker: Broker,
    /// The latency histograms (merged on each reading).
    pub latency: Arc<Mutex<LatencyStore>>,
    /// The text front end's counters, when it is on.
    pub text: Option<Arc<TextStats>>,
    /// Each shard's job log (none with `durability = "memory"`).
    pub logs: Vec<Arc<dyn LogStatus>>,
    /// `disk_free_limit`, when the router keeps a log.
    pub disk_free_limit: Option<u64>,
    /// The ownership of the router name (`durability = "replicated"`).
    pub ownership: Option<Arc<crate::jslog::ownership::Ownership>>,
    /// The CURVE endpoints' counters (none without a `*_curve` address).
    pub curve: Option<Arc<super::curve::CurveShared>>,
    /// The router's `router_name`.
    pub router_name: String,
}

impl Sources {
    /// Reads the router now, folding queues past `max_queues`.
    pub fn read(&self, max_queues: usize) -> Scrape {
        super::reporter::collect(&self.broker, &self.latency);
        let asked = self.broker.snapshots_asked();
        let shards_silent = self.broker.shards.len().saturating_sub(asked.answers.len());
        let snaps = asked.answers;
        let latency = self.latency.lock();
        // Every queue any figure names: one held now, or known only by its
        // retrying or dead jobs, a job in flight (after a restart the dead
        // set's queues may have no table yet) or its latency.
        let held = snaps.iter().flat_map(|s| s.queues.iter().map(|q| q.name.as_str()));
        let waiting = snaps.iter().flat_map(|s| s.retrying.iter().chain(&s.dead).map(|(q, _)| q.as_str()));
        let in_flight = snaps.iter().flat_map(|s| &s.workers).flat_map(|w| w.inflight.iter().map(|(q, _)| q.as_str()));
        let timed = latency.cumulative().keys().filter(|(_, k)| *k != Kind::WalSync).map(|(q, _)| q.as_str());
        let mut names: Vec<&str> = held.chain(waiting).chain(in_flight).collect();
        names.sort_unstable();
        names.dedup();
        // Queues that hold something now get labels first; those known
        // only by their latency since start (maybe long forgotten) after.
        let live: std::collections::HashSet<&str> = names.iter().copied().collect();
        let mut past: Vec<&str> = timed.filter(|q| !live.contains(q)).collect();
        past.sort_unstable();
        past.dedup();
        names.extend(past);
        let kept: std::collections::HashSet<&str> = names.iter().take(max_queues).copied().collect();
        let folded = names.len().saturating_sub(kept.len());
        let label = |name: &str| if kept.contains(name) { name.to_string() } else { OTHER_QUEUE.to_string() };
        let mut rows: BTreeMap<String, QueueRow> = BTreeMap::new();
        let row = |rows: &mut BTreeMap<String, QueueRow>, name: &str| -> String {
            let l = label(name);
            rows.entry(l.clone()).or_insert_with(|| QueueRow { name: l.clone(), ..QueueRow::default() });
            l
        };
        for q in snaps.iter().flat_map(|s| &s.queues) {
            let l = row(&mut rows, &q.name);
            if let Some(r) = rows.get_mut(&l) {
                r.waiting += q.waiting as u64;
                r.in_flight += q.offered as u64;
                for &c in QueueCounter::ALL {
                    r.counts.add(c, q.counts.get(c));
                }
            }
        }
        for (queue, n, dead) in snaps.iter().flat_map(|s| {
            s.retrying.iter().map(|(q, n)| (q, *n, false)).chain(s.dead.iter().map(|(q, n)| (q, *n, true)))
        }) {
            let l = row(&mut rows, queue);
            if let Some(r) = rows.get_mut(&l) {
                *(if dead { &mut r.dead } else { &mut r.retrying }) += n as u64;
            }
        }
        for (queue, _) in snaps.iter().flat_map(|s| &s.workers).flat_map(|w| &w.inflight) {
            let l = row(&mut rows, queue);
            if let Some(r) = rows.get_mut(&l) {
                r.in_flight += 1;
            }
        }
        for ((queue, kind), h) in latency.cumulative() {
            // Per-shard figures (the log's sync time) are not a queue's.
            if *kind == Kind::WalSync {
                continue;
            }
            let l = row(&mut rows, queue);
            if let Some(slot) = rows.get_mut(&l).and_then(|r| r.latency.get_mut(*kind as usize)) {
                let _ = slot.get_or_insert_with(new_histogram).add(h);
            }
        }
        let ctx = &self.broker.ctx;
        let counters = match ctx.counters.to_json() {
            serde_json::Value::Object(m) => m.into_iter().map(|(k, v)| (k, v.as_u64().unwrap_or(0))).collect(),
            _ => Vec::new(),
        };
        let mut queues: Vec<QueueRow> = rows.into_values().collect();
        // `_other` sorts before letters: put it last.
        queues.sort_by_key(|r| (r.name == OTHER_QUEUE, r.name.clone()));
        let mut workers: Vec<WorkerSnap> = snaps.iter().flat_map(|s| s.workers.iter().cloned()).collect();
        workers.sort_by(|a, b| a.id.cmp(&b.id));
        Scrape {
            uptime_secs: ctx.started.elapsed().as_secs_f64(),
            draining: ctx.draining.load(std::sync::atomic::Ordering::Acquire),
            shards: ctx.shards,
            queues,
            folded,
            workers,
            schedulers: snaps.iter().flat_map(|s| s.schedulers.iter().cloned()).collect(),
            counters,
            text: self.text.as_ref().map(|t| t.snapshot()),
            shards_silent,
            dead_bytes: snaps.iter().map(|s| s.dead_bytes as u64).sum(),
            logs: self.logs.iter().map(|l| l.figures()).collect(),
            disk_free_limit: self.disk_free_limit,
            ownership: self.ownership.as_ref().map(|o| o.figures()),
            http_access: None,
            curve: self.curve.as_ref().map(|c| c.figures()),
            router_name: self.router_name.clone(),
            peers: self.ownership.as_ref().map(|o| o.peers().list()).unwrap_or_default(),
        }
    }
}

/// Every [`Kind`] with the histogram of `row`, when recorded.
pub fn latencies(row: &QueueRow) -> impl Iterator<Item = (Kind, &Histogram<u64>)> {
    Kind::ALL.into_iter().filter_map(|k| row.latency[k as usize].as_ref().map(|h| (k, h)))
}
