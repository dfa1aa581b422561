//! Read-only observers of the shards under a [`Harness`]: where every job
//! is, which registrations exist, timers, counters, snapshots and the shape
//! of frames. Nothing here changes a shard.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::harness::Harness;
use crate::broker::egress::Outgoing;
use crate::broker::snapshot::ShardSnapshot;
use crate::ids::{ConnId, OfferId, PeerId, WorkerKey};
use crate::metrics::counters::Counters;

/// A job held by a worker, as its home shard records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// The queue it was taken from (after the fallback).
    pub queue: String,
    /// Its body.
    pub body: String,
    /// Its msgid.
    pub msgid: String,
}

/// A job offered to a text connection.
#[derive(Debug, Clone)]
pub struct Offered {
    /// The connection.
    pub conn: ConnId,
    /// The offer.
    pub id: OfferId,
    /// Its queue.
    pub queue: String,
    /// Its body.
    pub body: String,
    /// When it lapses.
    pub deadline: Instant,
}

/// Every job of every shard, by place.
#[derive(Debug, Default)]
pub struct Jobs {
    /// Waiting bodies by queue, front first.
    pub waiting: BTreeMap<String, Vec<String>>,
    /// In-flight jobs by worker registration, in dispatch order, with the
    /// worker's identity.
    pub inflight: BTreeMap<WorkerKey, (String, Vec<Held>)>,
    /// Text offers.
    pub offered: Vec<Offered>,
    /// Bodies waiting out a retry back-off, by queue, earliest first.
    pub retrying: BTreeMap<String, Vec<String>>,
    /// Bodies in the dead set, by queue, oldest burial first.
    pub dead: BTreeMap<String, Vec<String>>,
}

impl Jobs {
    /// Every body with its place (`waiting:q`, `inflight:w`, `offered:q`),
    /// a body held twice appearing twice.
    pub fn places(&self) -> Vec<(String, String)> {
        let waiting =
            self.waiting.iter().flat_map(|(q, bodies)| bodies.iter().map(move |b| (b.clone(), format!("waiting:{q}"))));
        let inflight = self
            .inflight
            .values()
            .flat_map(|(w, held)| held.iter().map(move |h| (h.body.clone(), format!("inflight:{w}"))));
        let offered = self.offered.iter().map(|o| (o.body.clone(), format!("offered:{}", o.queue)));
        waiting.chain(inflight).chain(offered).collect()
    }

    /// The queue of every job present.
    pub fn queues(&self) -> impl Iterator<Item = (&str, &str)> {
        let waiting = self.waiting.iter().flat_map(|(q, bodies)| bodies.iter().map(move |b| (b.as_str(), q.as_str())));
        let inflight =
            self.inflight.values().flat_map(|(_, held)| held.iter().map(|h| (h.body.as_str(), h.queue.as_str())));
        let offered = self.offered.iter().map(|o| (o.body.as_str(), o.queue.as_str()));
        waiting.chain(inflight).chain(offered)
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

impl Harness {
    /// The current registration of worker `id`, if any.
    pub fn key_of(&self, id: &str) -> Option<WorkerKey> {
        self.shards[self.shard_of(id)].workers.key_of(&PeerId::from(id.as_bytes()))
    }

    /// Every registered worker: identity → registration.
    pub fn registered(&self) -> BTreeMap<String, WorkerKey> {
        let ids = self.shards.iter().flat_map(|s| s.workers.ids());
        ids.map(|id| {
            let name = text(&id.0);
            let key = self.key_of(&name).expect("a listed worker is registered");
            (name, key)
        })
        .collect()
    }

    /// Armed timers of shard `index` (stale ones included).
    pub fn timers(&self, index: usize) -> usize {
        self.shards[index].timers.len()
    }

    /// The value of one broker-wide counter.
    pub fn counter(&self, pick: fn(&Counters) -> &AtomicU64) -> u64 {
        pick(&self.ctx.counters).load(Ordering::Relaxed)
    }

    /// Shard `index`'s snapshot now.
    pub fn snapshot(&self, index: usize) -> ShardSnapshot {
        self.shards[index].snapshot(self.now)
    }

    /// Every job of every shard, by place.
    pub fn jobs(&self) -> Jobs {
        let mut jobs = Jobs::default();
        for shard in &self.shards {
            // Each queue's jobs come front first, one queue after another.
            for (queue, job) in shard.queues.waiting_jobs() {
                jobs.waiting.entry(text(&queue.0)).or_default().push(text(job.frames.body()));
            }
            let mut flights: Vec<_> = shard.workers.inflight().collect();
            flights.sort_by_key(|(_, f)| f.seq);
            for (id, f) in flights {
                let key = shard.workers.key_of(id).expect("a worker holding jobs is registered");
                let entry = jobs.inflight.entry(key).or_insert_with(|| (text(&id.0), Vec::new()));
                let (queue, body, msgid) =
                    (text(f.job.queue_bytes()), text(f.job.frames.body()), text(f.job.frames.msgid()));
                let held = Held { queue, body, msgid };
                entry.1.push(held);
            }
            for (conn, o) in shard.offers.iter() {
                let (queue, body) = (text(&o.queue.0), text(o.job.frames.body()));
                jobs.offered.push(Offered { conn: *conn, id: o.id, queue, body, deadline: o.deadline });
            }
            for (_, job) in shard.retries.iter() {
                jobs.retrying.entry(text(job.queue_bytes())).or_default().push(text(job.frames.body()));
            }
            for d in shard.dead.iter(None) {
                jobs.dead.entry(text(d.job.queue_bytes())).or_default().push(text(d.job.frames.body()));
            }
        }
        jobs
    }

    /// Bodies of the jobs in flight or offered at their last allowed
    /// delivery ([`crate::limits::MAX_RETRIES`] returns behind them): a
    /// crash now counts one more, so recovery dead-letters them.
    pub fn at_last_delivery(&self) -> std::collections::BTreeSet<String> {
        let last = |j: &crate::job::Job| j.redeliveries() >= crate::limits::MAX_RETRIES;
        let mut out = std::collections::BTreeSet::new();
        for shard in &self.shards {
            out.extend(shard.workers.inflight().filter(|(_, f)| last(&f.job)).map(|(_, f)| text(f.job.frames.body())));
            out.extend(shard.offers.iter().filter(|(_, o)| last(&o.job)).map(|(_, o)| text(o.job.frames.body())));
        }
        out
    }

    /// A name `{prefix}{n}` owned by shard `index` (the first such `n`).
    pub fn name_on(&self, index: usize, prefix: &str) -> String {
        let mut names = (0..).map(|n| format!("{prefix}{n}"));
        names.find(|n| self.shard_of(n) == index).expect("some name hashes to every shard")
    }
}

/// The frames of `o` as text, the fresh msgid (frame 3) shown as `*`.
pub fn shape(o: &Outgoing) -> Vec<String> {
    o.frames().iter().enumerate().map(|(i, f)| if i == 3 { "*".to_string() } else { text(f) }).collect()
}
