//! [`WorkerTable`]: the workers whose home is this shard, with their
//! liveness and their in-flight jobs. Data and its rules only: the handlers
//! in `peers.rs` decide what to do.
//!
//! In-flight jobs are found by the msgid a job-result REPLY carries. Client
//! msgids are not unique, so a worker may hold two jobs with one msgid: the
//! table keeps every job (keyed by the hash of the msgid in the job's own
//! buffer, so no key is copied), and a REPLY completes the oldest job with
//! that msgid. No job shadows another.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hashbrown::HashTable;

use crate::broker::job::Job;
use crate::broker::snapshot::WorkerSnap;
use crate::broker::types::{WorkerShared, WorkerState};
use crate::ids::{FastMap, PeerId, WorkerKey};

/// A job sent to a worker and not yet answered.
#[derive(Debug)]
pub struct InFlight {
    /// The job, kept to be requeued if the worker dies (its queue is
    /// [`Job::queue`]).
    pub job: Job,
    /// When it was dispatched.
    pub since: Instant,
    /// Dispatch order on this worker (ties of `since` are common).
    pub seq: u64,
}

/// A worker as its home shard holds it.
#[derive(Debug)]
struct HomeWorker {
    shared: Arc<WorkerShared>,
    last_seen: Instant,
    /// In-flight jobs, by the hash of their msgid.
    inflight: HashTable<InFlight>,
    /// Jobs sent to it since it registered (also the next [`InFlight::seq`]).
    dispatched: u64,
    kbye_at: Option<Instant>,
}

/// What the expiry timer of a worker finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// No such worker (any more).
    Gone,
    /// Not yet: check again at this deadline.
    NotBefore(Instant),
    /// Silent past the heartbeat timeout.
    Silent,
    /// Its KBYE grace is over.
    KbyeOver,
}

/// What a KBYE found.
#[derive(Debug)]
pub enum Kbye {
    /// The sender is not registered.
    Unknown,
    /// The worker had said KBYE before: nothing changes.
    Repeated,
    /// The worker's first KBYE: it is draining now.
    First(Arc<WorkerShared>),
}

/// A removed worker and the jobs it still held, oldest dispatch first.
#[derive(Debug)]
pub struct Removed {
    /// Its shared state (already marked dead).
    pub shared: Arc<WorkerShared>,
    /// Its in-flight jobs in dispatch order.
    pub jobs: Vec<InFlight>,
}

/// The workers of one home shard.
#[derive(Debug, Default)]
pub struct WorkerTable {
    by_id: FastMap<PeerId, HomeWorker>,
    by_key: FastMap<WorkerKey, PeerId>,
    /// Hashes msgids for the in-flight tables (seeded per process).
    msgid_hash: foldhash::fast::RandomState,
    /// Registered workers of every shard together (`max_workers`).
    count: Arc<AtomicUsize>,
}

impl WorkerTable {
    /// An empty table sharing the broker-wide worker count `count`.
    pub fn new(count: Arc<AtomicUsize>) -> WorkerTable {
        WorkerTable { count, ..WorkerTable::default() }
    }

    /// Whether the broker holds `max` workers or more (every shard's).
    pub fn full(&self, max: usize) -> bool {
        self.count.load(Ordering::Relaxed) >= max
    }

    /// The registration of `id`, if any.
    pub fn key_of(&self, id: &PeerId) -> Option<WorkerKey> {
        self.by_id.get(id).map(|w| w.shared.key)
    }

    /// The identity of registration `key`, if still registered.
    pub fn id_of(&self, key: WorkerKey) -> Option<&PeerId> {
        self.by_key.get(&key)
    }

    /// Adds a live worker (its identity must not be registered).
    pub fn register(&mut self, shared: Arc<WorkerShared>, now: Instant) {
        self.by_key.insert(shared.key, shared.id.clone());
        let w = HomeWorker { shared, last_seen: now, inflight: HashTable::new(), dispatched: 0, kbye_at: None };
        if self.by_id.insert(w.shared.id.clone(), w).is_none() {
            self.count.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Notes that `id` was heard from at `now`; its shared state, or `None`
    /// when it is not registered.
    pub fn touch(&mut self, id: &PeerId, now: Instant) -> Option<Arc<WorkerShared>> {
        let w = self.by_id.get_mut(id)?;
        w.last_seen = now;
        Some(w.shared.clone())
    }

    /// Records `job` as in flight on worker `key`. Gives the job back when
    /// the worker is gone or dead (the caller requeues it).
    pub fn record_dispatch(&mut self, key: WorkerKey, job: Job, now: Instant) -> Option<Job> {
        let Some(w) = self.by_key.get(&key).and_then(|id| self.by_id.get_mut(id)) else { return Some(job) };
        if w.shared.state() == WorkerState::Dead {
            return Some(job);
        }
        w.dispatched += 1;
        let hash = self.msgid_hash.hash_one(job.frames.msgid());
        let hasher = &self.msgid_hash;
        w.inflight.insert_unique(hash, InFlight { job, since: now, seq: w.dispatched }, |f| {
            hasher.hash_one(f.job.frames.msgid())
        });
        None
    }

    /// Completes the oldest job with `msgid` held by worker `id`.
    pub fn complete(&mut self, id: &PeerId, msgid: &[u8]) -> Option<InFlight> {
        let w = self.by_id.get_mut(id)?;
        let hash = self.msgid_hash.hash_one(msgid);
        let same = |f: &InFlight| f.job.frames.msgid() == msgid;
        let oldest = w.inflight.iter_hash(hash).filter(|f| same(f)).map(|f| f.seq).min()?;
        let found = w.inflight.find_entry(hash, |f| f.seq == oldest && same(f)).ok()?;
        Some(found.remove().0)
    }

    /// Notes a KBYE from `id` at `now` and marks it draining; repeats
    /// change nothing.
    pub fn kbye(&mut self, id: &PeerId, now: Instant) -> Kbye {
        let Some(w) = self.by_id.get_mut(id) else { return Kbye::Unknown };
        w.last_seen = now;
        if w.kbye_at.is_some() {
            return Kbye::Repeated;
        }
        w.kbye_at = Some(now);
        w.shared.set_state(WorkerState::Draining);
        Kbye::First(w.shared.clone())
    }

    /// Forgets registration `key`: marks it dead and hands back what it held.
    pub fn remove(&mut self, key: WorkerKey) -> Option<Removed> {
        let id = self.by_key.remove(&key)?;
        let w = self.by_id.remove(&id)?;
        self.count.fetch_sub(1, Ordering::Relaxed);
        w.shared.set_state(WorkerState::Dead);
        let mut jobs: Vec<InFlight> = w.inflight.into_iter().collect();
        jobs.sort_by_key(|f| f.seq);
        Some(Removed { shared: w.shared, jobs })
    }

    /// Whether worker `key` should go at `now`. A live worker lives one
    /// `timeout` past its last message. A worker that said KBYE is not
    /// expired by silence (a Python jobmanager stops heartbeating after its
    /// KBYE but still sends the REPLYs of the jobs it finishes): it lives
    /// `kbye_grace` past its KBYE while it holds jobs, one `timeout` when it
    /// holds none (so a job already on its way to it is still recorded).
    pub fn expiry(&self, key: WorkerKey, now: Instant, timeout: Duration, kbye_grace: Duration) -> Expiry {
        let Some(w) = self.by_key.get(&key).and_then(|id| self.by_id.get(id)) else { return Expiry::Gone };
        let deadline = match w.kbye_at {
            None => w.last_seen + timeout,
            Some(at) if w.inflight.is_empty() => at + timeout,
            Some(at) => at + kbye_grace,
        };
        match (deadline > now, w.kbye_at.is_some()) {
            (true, _) => Expiry::NotBefore(deadline),
            (false, true) => Expiry::KbyeOver,
            (false, false) => Expiry::Silent,
        }
    }

    /// Identities of every worker.
    pub fn ids(&self) -> Vec<PeerId> {
        self.by_id.keys().cloned().collect()
    }

    /// Every in-flight job with its worker's identity (shutdown log, tests).
    pub fn inflight(&self) -> impl Iterator<Item = (&PeerId, &InFlight)> {
        self.by_id.iter().flat_map(|(id, w)| w.inflight.iter().map(move |f| (id, f)))
    }

    /// Jobs in flight on every worker of this shard.
    pub fn inflight_count(&self) -> usize {
        self.by_id.values().map(|w| w.inflight.len()).sum()
    }

    /// Every worker's figures, sorted by identity; `hb` in seconds since
    /// `started` (EventMQ's monotonic `hb`).
    pub fn snaps(&self, now: Instant, started: Instant) -> Vec<WorkerSnap> {
        let mut out: Vec<WorkerSnap> = self
            .by_id
            .values()
            .map(|w| WorkerSnap {
                id: w.shared.id.to_string(),
                queues: w.shared.queues.iter().map(|(wt, q)| (*wt, q.to_string())).collect(),
                hb: w.last_seen.saturating_duration_since(started).as_secs_f64(),
                slots: w.shared.slots(),
                state: if w.shared.state() == WorkerState::Live { "live" } else { "draining" },
                processed: w.dispatched,
                inflight: w
                    .inflight
                    .iter()
                    .map(|f| (f.job.queue().to_string(), now.saturating_duration_since(f.since)))
                    .collect(),
            })
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }
}
