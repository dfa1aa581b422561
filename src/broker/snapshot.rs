//! What a shard reports to the admin thread, and the merge of all shards
//! into EventMQ's admin JSON shapes, with emq's extra keys (docs/emqp.md
//! "Admin").

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Map, Value};

use super::counts::{QueueCounter, QueueCounts};

/// One queue as its owning shard sees it.
#[derive(Debug, Clone, Default)]
pub struct QueueSnap {
    /// Queue name (display form).
    pub name: String,
    /// Jobs waiting.
    pub waiting: usize,
    /// Jobs held by text connections (offered, unanswered).
    pub offered: usize,
    /// Jobs dispatched to eMQP workers since start.
    pub processed: u64,
    /// Both protocols' job counts since start.
    pub counts: QueueCounts,
    /// Whether a worker has declared the queue (a REQUEST for it then never
    /// falls back to `default`).
    pub served: bool,
    /// Selection order: `(weight, worker id)`.
    pub candidates: Vec<(i64, String)>,
}

/// One worker as its home shard sees it.
#[derive(Debug, Clone, Default)]
pub struct WorkerSnap {
    /// Identity (display form).
    pub id: String,
    /// `(weight, queue)` in INFORM order.
    pub queues: Vec<(i64, String)>,
    /// Seconds since broker start of the last message (EventMQ's monotonic `hb`).
    pub hb: f64,
    /// Free slots.
    pub slots: i64,
    /// `live` or `draining`.
    pub state: &'static str,
    /// Jobs dispatched to it since registration.
    pub processed: u64,
    /// In-flight jobs per queue with their age.
    pub inflight: Vec<(String, Duration)>,
}

/// One scheduler (shard 0 only).
#[derive(Debug, Clone, Default)]
pub struct SchedulerSnap {
    /// Identity (display form).
    pub id: String,
    /// The name it gave in its INFORM (emq-scheduler), if any.
    pub name: Option<String>,
    /// Seconds since broker start of the last message.
    pub hb: f64,
    /// SCHEDULEs routed to it.
    pub scheduled: u64,
}

/// A shard's whole state, for the admin queries.
#[derive(Debug, Clone, Default)]
pub struct ShardSnapshot {
    /// Queues owned by the shard.
    pub queues: Vec<QueueSnap>,
    /// Workers whose home is the shard.
    pub workers: Vec<WorkerSnap>,
    /// Schedulers (shard 0).
    pub schedulers: Vec<SchedulerSnap>,
    /// Long-poll ASKs (`ASK <queue> <ms>`) waiting on the shard now.
    pub asks_waiting: usize,
    /// Queues a text client ASKed for within `text_ask_grace`, or that a
    /// long-poll ASK waits on now, sorted: a REQUEST for one stays on it
    /// even when no worker declared it.
    pub asked: Vec<String>,
    /// `(queue, jobs)` waiting out a back-off before a retry.
    pub retrying: Vec<(String, usize)>,
    /// `(queue, jobs)` in the dead set.
    pub dead: Vec<(String, usize)>,
    /// Bytes of the jobs in the dead set.
    pub dead_bytes: usize,
}

impl ShardSnapshot {
    /// Jobs waiting (for a worker or a retry), offered or in flight: what
    /// a drain waits for.
    pub fn pending(&self) -> usize {
        self.queues.iter().map(|q| q.waiting + q.offered).sum::<usize>()
            + self.workers.iter().map(|w| w.inflight.len()).sum::<usize>()
            + self.retrying.iter().map(|(_, n)| n).sum::<usize>()
    }
}

/// End-to-end latency percentiles of one queue since the router started, in
/// milliseconds: `(p50, p99)`.
pub type EndToEnd = BTreeMap<String, (f64, f64)>;

/// STATUS JSON: EventMQ's keys in EventMQ's order (docs/emqp.md "Admin"),
/// then emq's: the per-queue counters of both protocols
/// ([`QueueCounter`]), text offers, end-to-end latency percentiles,
/// the queues workers serve (`served_queues`), the queues text clients
/// asked for (`asked_queues`, [`ShardSnapshot::asked`]), and `emq`
/// (`extras`).
pub fn status_json(shards: &[ShardSnapshot], end_to_end: &EndToEnd, extras: Value) -> Value {
    let mut inflight: BTreeMap<String, (u64, Duration, Duration)> = BTreeMap::new();
    let mut by_worker = Map::new();
    for w in shards.iter().flat_map(|s| &s.workers) {
        by_worker.insert(w.id.clone(), json!(w.processed));
        for (q, age) in &w.inflight {
            let e = inflight.entry(q.clone()).or_default();
            e.0 += 1;
            e.1 += *age;
            e.2 = e.2.max(*age);
        }
    }
    let queues: Vec<&QueueSnap> = shards.iter().flat_map(|s| &s.queues).collect();
    let ms = |d: Duration| d.as_millis() as u64;
    let obj = |f: &dyn Fn(&QueueSnap) -> Option<Value>| -> Value {
        Value::Object(queues.iter().filter_map(|q| f(q).map(|v| (q.name.clone(), v))).collect())
    };
    let percentile = |pick: fn(&(f64, f64)) -> f64| -> Value {
        Value::Object(end_to_end.iter().map(|(q, p)| (q.clone(), json!(round_ms(pick(p))))).collect())
    };
    let mut status = json!({
        "inflight_messages_by_queue": inflight.iter().map(|(q, e)| (q.clone(), json!(e.0))).collect::<Map<_, _>>(),
        "latency_messages_by_queue": inflight.iter().map(|(q, e)| (q.clone(), json!(ms(e.1) / e.0.max(1)))).collect::<Map<_, _>>(),
        "max_latency_messages_by_queue": inflight.iter().map(|(q, e)| (q.clone(), json!(ms(e.2)))).collect::<Map<_, _>>(),
        "waiting_messages_by_queue": obj(&|q| (q.waiting > 0).then(|| json!(q.waiting))),
        "processed_messages_by_queue": obj(&|q| (q.processed > 0).then(|| json!(q.processed))),
        "processed_messages_by_worker": by_worker,
        "offered_messages_by_queue": obj(&|q| (q.offered > 0).then(|| json!(q.offered))),
    });
    if let Some(m) = status.as_object_mut() {
        for &counter in QueueCounter::ALL {
            let counts = obj(&|q| Some(q.counts.get(counter)).filter(|n| *n > 0).map(|n| json!(n)));
            m.insert(counter.status_key().into(), counts);
        }
        let by_queue = |pick: fn(&ShardSnapshot) -> &Vec<(String, usize)>| -> Value {
            let mut all: BTreeMap<&str, usize> = BTreeMap::new();
            for (q, n) in shards.iter().flat_map(pick) {
                *all.entry(q).or_default() += n;
            }
            Value::Object(all.into_iter().map(|(q, n)| (q.to_string(), json!(n))).collect())
        };
        m.insert("retrying_messages_by_queue".into(), by_queue(|s| &s.retrying));
        m.insert("dead_messages_by_queue".into(), by_queue(|s| &s.dead));
        m.insert("end_to_end_p50_ms_by_queue".into(), percentile(|p| p.0));
        m.insert("end_to_end_p99_ms_by_queue".into(), percentile(|p| p.1));
        let mut served: Vec<&str> = queues.iter().filter(|q| q.served).map(|q| q.name.as_str()).collect();
        served.sort_unstable();
        m.insert("served_queues".into(), json!(served));
        let mut asked: Vec<&str> = shards.iter().flat_map(|s| &s.asked).map(String::as_str).collect();
        asked.sort_unstable();
        asked.dedup();
        m.insert("asked_queues".into(), json!(asked));
        m.insert("emq".into(), extras);
    }
    status
}

/// Milliseconds as people read them: two decimals.
pub fn round_ms(ms: f64) -> f64 {
    (ms * 100.0).round() / 100.0
}

/// Seconds since a peer was last heard from, `uptime` seconds after the
/// router started, from its `hb` (seconds since start), to a tenth.
fn seen_ago(uptime: f64, hb: f64) -> f64 {
    ((uptime - hb).max(0.0) * 10.0).round() / 10.0
}

/// ROUTER_SHOW_WORKERS JSON (EventMQ's shape, docs/emqp.md "Admin"), with
/// `inflight`, `state` and `seen_secs_ago` per worker added; `uptime` is
/// the router's, in seconds.
pub fn workers_json(shards: &[ShardSnapshot], uptime: f64) -> Value {
    let mut workers = Map::new();
    for w in shards.iter().flat_map(|s| &s.workers) {
        workers.insert(
            w.id.clone(),
            json!({
                "queues": w.queues.iter().map(|(wt, q)| json!([wt, q])).collect::<Vec<_>>(),
                "hb": w.hb,
                "available_slots": w.slots,
                "inflight": w.inflight.len(),
                "state": w.state,
                "seen_secs_ago": seen_ago(uptime, w.hb),
            }),
        );
    }
    let mut queues = Map::new();
    for q in shards.iter().flat_map(|s| &s.queues) {
        if !q.candidates.is_empty() {
            queues.insert(q.name.clone(), json!(q.candidates.iter().map(|(w, id)| json!([w, id])).collect::<Vec<_>>()));
        }
    }
    json!({ "connected_workers": workers, "connected_queues": queues })
}

/// ROUTER_SHOW_SCHEDULERS JSON (EventMQ's shape, docs/emqp.md "Admin"),
/// with `scheduled`, `name` (an emq-scheduler's stable name, or null) and
/// `seen_secs_ago` added; `uptime` is the router's,
/// in seconds.
pub fn schedulers_json(shards: &[ShardSnapshot], uptime: f64) -> Value {
    let s: Map<String, Value> = shards
        .iter()
        .flat_map(|s| &s.schedulers)
        .map(|s| {
            let entry = json!({
                "hb": s.hb,
                "scheduled": s.scheduled,
                "name": s.name,
                "seen_secs_ago": seen_ago(uptime, s.hb),
            });
            (s.id.clone(), entry)
        })
        .collect();
    json!({ "connected_schedulers": s })
}
