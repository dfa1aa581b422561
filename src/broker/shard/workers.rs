//! [`WorkerTable`]: the workers whose home is this shard, with their
//! liveness and their in-flight jobs. Data and its rules only: the handlers
//! in `peers.rs` decide what to do.
//!
//! In-flight jobs are found by the msgid a job-result REPLY carries. Client
//! msgids are not unique, so a worker may hold two jobs with one msgid: the
//! first is kept in the main map, later ones in a per-msgid overflow list,
//! and a REPLY completes the oldest. No job shadows another, and the common
//! case (unique msgids) costs one map entry per job.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::broker::snapshot::WorkerSnap;
use crate::broker::types::{Job, WorkerShared, WorkerState};
use crate::ids::{MsgId, PeerId, QueueName, WorkerKey};

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
struct HomeWorker {
    shared: Arc<WorkerShared>,
    last_seen: Instant,
    /// The oldest in-flight job per msgid.
    inflight: HashMap<MsgId, InFlight>,
    /// Younger in-flight jobs whose msgid is already in `inflight`, oldest first.
    repeated: HashMap<MsgId, VecDeque<InFlight>>,
    /// Jobs sent to it since it registered (also the next [`InFlight::seq`]).
    dispatched: u64,
    kbye_at: Option<Instant>,
}

impl HomeWorker {
    fn held(&self) -> usize {
        self.inflight.len() + self.repeated.values().map(VecDeque::len).sum::<usize>()
    }
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
    by_id: HashMap<PeerId, HomeWorker>,
    by_key: HashMap<WorkerKey, PeerId>,
}

impl WorkerTable {
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
        let w = HomeWorker {
            shared,
            last_seen: now,
            inflight: HashMap::new(),
            repeated: HashMap::new(),
            dispatched: 0,
            kbye_at: None,
        };
        self.by_id.insert(w.shared.id.clone(), w);
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
    pub fn record_dispatch(&mut self, key: WorkerKey, queue: QueueName, job: Job, now: Instant) -> Option<Job> {
        let Some(w) = self.by_key.get(&key).and_then(|id| self.by_id.get_mut(id)) else { return Some(job) };
        if w.shared.state() == WorkerState::Dead {
            return Some(job);
        }
        w.dispatched += 1;
        let f = InFlight { queue, since: now, seq: w.dispatched, job };
        match w.inflight.entry(f.job.msgid.clone()) {
            Entry::Vacant(slot) => {
                slot.insert(f);
            }
            Entry::Occupied(held) => w.repeated.entry(held.key().clone()).or_default().push_back(f),
        }
        None
    }

    /// Completes the oldest job with `msgid` held by worker `id`.
    pub fn complete(&mut self, id: &PeerId, msgid: &MsgId) -> Option<InFlight> {
        let w = self.by_id.get_mut(id)?;
        let done = w.inflight.remove(msgid)?;
        if let Some(list) = w.repeated.get_mut(msgid) {
            if let Some(next) = list.pop_front() {
                w.inflight.insert(msgid.clone(), next);
            }
            if list.is_empty() {
                w.repeated.remove(msgid);
            }
        }
        Some(done)
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
        let mut w = self.by_id.remove(&id)?;
        w.shared.set_state(WorkerState::Dead);
        let mut jobs: Vec<InFlight> = w.inflight.into_values().collect();
        jobs.extend(w.repeated.drain().flat_map(|(_, list)| list));
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
        self.by_id
            .iter()
            .flat_map(|(id, w)| w.inflight.values().chain(w.repeated.values().flatten()).map(move |f| (id, f)))
    }

    /// Jobs in flight on every worker of this shard.
    pub fn inflight_count(&self) -> usize {
        self.by_id.values().map(HomeWorker::held).sum()
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
                    .values()
                    .chain(w.repeated.values().flatten())
                    .map(|f| (f.queue.to_string(), now.saturating_duration_since(f.since)))
                    .collect(),
            })
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }
}
