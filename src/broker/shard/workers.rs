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

use crate::broker::snapshot::WorkerSnap;
use crate::broker::types::{WorkerShared, WorkerState};
use crate::ids::{FastMap, PeerId, QueueName, WorkerKey};
use crate::job::Job;

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
    /// When the router takes it back if unanswered (see `deadline.rs`).
    pub deadline: Option<Instant>,
}

/// A job taken back from a worker by its deadline, remembered until the
/// worker answers it, or until as long again has passed.
#[derive(Debug)]
struct Owed {
    /// The job's msgid, which its late REPLY carries.
    msgid: Box<[u8]>,
    /// Its queue: the worker gets none of its jobs until it answers.
    queue: QueueName,
    /// When the answer is no longer waited for: the job's own time limit
    /// (with its grace) after it was taken back. An answer can be lost
    /// (a REPLY over ZeroMQ's message size limit, a send error a worker
    /// swallows), and a live worker must not be barred from a queue for
    /// good by a message that will never come.
    until: Instant,
}

/// Owed answers no longer waited for (see `Owed::until`).
#[derive(Debug, PartialEq, Eq)]
pub struct Forgiven {
    /// The job's msgid.
    pub msgid: Box<[u8]>,
    /// Its queue.
    pub queue: QueueName,
    /// The worker still owes another answer on that queue.
    pub still_owed: bool,
}

/// What a worker's deadline timer finds ([`WorkerTable::take_lapsed`]).
#[derive(Debug)]
pub struct Lapsed {
    /// Jobs past their deadline, taken back, oldest dispatch first.
    pub jobs: Vec<InFlight>,
    /// Owed answers no longer waited for.
    pub forgiven: Vec<Forgiven>,
    /// The next instant to arm the timer for.
    pub next: Option<Instant>,
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
    /// The deadline its timer is armed for, if one is.
    deadline_armed: Option<Instant>,
    /// Jobs taken back by their deadline whose answer it owes, oldest first.
    owed: Vec<Owed>,
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

    /// The identity to heartbeat for registration `key`: `None` when it is
    /// gone or has said KBYE (it gets no more HEARTBEATs).
    pub fn heartbeat_target(&self, key: WorkerKey) -> Option<&PeerId> {
        let id = self.by_key.get(&key)?;
        self.by_id.get(id).filter(|w| w.kbye_at.is_none()).map(|_| id)
    }

    /// Adds a live worker (its identity must not be registered).
    pub fn register(&mut self, shared: Arc<WorkerShared>, now: Instant) {
        self.by_key.insert(shared.key, shared.id.clone());
        let w = HomeWorker {
            shared,
            last_seen: now,
            inflight: HashTable::new(),
            dispatched: 0,
            kbye_at: None,
            deadline_armed: None,
            owed: Vec::new(),
        };
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

    /// Records `job` as in flight on worker `key`, to be answered by
    /// `deadline`. Gives the job back when the worker is gone or dead (the
    /// caller requeues it).
    pub fn record_dispatch(
        &mut self,
        key: WorkerKey,
        job: Job,
        now: Instant,
        deadline: Option<Instant>,
    ) -> Option<Job> {
        let Some(w) = self.by_key.get(&key).and_then(|id| self.by_id.get_mut(id)) else { return Some(job) };
        if w.shared.state() == WorkerState::Dead {
            return Some(job);
        }
        w.dispatched += 1;
        let hash = self.msgid_hash.hash_one(job.frames.msgid());
        let hasher = &self.msgid_hash;
        w.inflight.insert_unique(hash, InFlight { job, since: now, seq: w.dispatched, deadline }, |f| {
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

    /// Whether a deadline timer must be armed at `at` for worker `key`:
    /// none is armed, or the armed one is later. Notes it as armed.
    pub fn arm_deadline(&mut self, key: WorkerKey, at: Instant) -> bool {
        let Some(w) = self.by_key.get(&key).and_then(|id| self.by_id.get_mut(id)) else { return false };
        if w.deadline_armed.is_some_and(|armed| armed <= at) {
            return false;
        }
        w.deadline_armed = Some(at);
        true
    }

    /// The deadline timer of worker `key` fired at `now`: takes its jobs
    /// past their deadline (oldest dispatch first), remembers that it owes
    /// their answers (each for as long as the job's time limit again),
    /// forgets owed answers waited for that long, and gives the next
    /// instant to arm. `None` when the worker is gone or a later timer is
    /// armed (this one is stale).
    pub fn take_lapsed(&mut self, key: WorkerKey, now: Instant) -> Option<Lapsed> {
        let w = self.by_key.get(&key).and_then(|id| self.by_id.get_mut(id))?;
        if w.deadline_armed.is_some_and(|armed| armed > now) {
            return None;
        }
        let lapsed_at = |f: &InFlight| f.deadline.is_some_and(|d| d <= now);
        let mut seqs: Vec<(u64, u64)> = Vec::new();
        for f in w.inflight.iter() {
            if lapsed_at(f) {
                seqs.push((f.seq, self.msgid_hash.hash_one(f.job.frames.msgid())));
            }
        }
        seqs.sort_unstable();
        let mut lapsed = Vec::with_capacity(seqs.len());
        for (seq, hash) in seqs {
            if let Ok(found) = w.inflight.find_entry(hash, |f| f.seq == seq) {
                let f = found.remove().0;
                let span = f.deadline.map_or(Duration::ZERO, |d| d.saturating_duration_since(f.since));
                w.owed.push(Owed { msgid: f.job.frames.msgid().into(), queue: f.job.queue(), until: now + span });
                lapsed.push(f);
            }
        }
        let mut forgiven = Vec::new();
        if w.owed.iter().any(|o| o.until <= now) {
            let (gone, kept): (Vec<Owed>, Vec<Owed>) =
                std::mem::take(&mut w.owed).into_iter().partition(|o| o.until <= now);
            w.owed = kept;
            for o in gone {
                let still_owed = w.owed.iter().any(|k| k.queue == o.queue);
                forgiven.push(Forgiven { msgid: o.msgid, queue: o.queue, still_owed });
            }
        }
        let next_owed = w.owed.iter().map(|o| o.until).min();
        w.deadline_armed = w.inflight.iter().filter_map(|f| f.deadline).chain(next_owed).min();
        Some(Lapsed { jobs: lapsed, forgiven, next: w.deadline_armed })
    }

    /// Jobs taken back by their deadline whose answer worker `key` owes.
    pub fn owed(&self, key: WorkerKey) -> usize {
        self.by_key.get(&key).and_then(|id| self.by_id.get(id)).map_or(0, |w| w.owed.len())
    }

    /// A REPLY from `id` for `msgid` that answers a job taken back by its
    /// deadline: forgets that it owes it, and gives the worker's
    /// registration, the job's queue and whether the worker still owes
    /// another answer on that queue. `None` for any other REPLY.
    pub fn late_reply(&mut self, id: &PeerId, msgid: &[u8]) -> Option<(WorkerKey, QueueName, bool)> {
        let w = self.by_id.get_mut(id)?;
        let at = w.owed.iter().position(|o| &o.msgid[..] == msgid)?;
        let owed = w.owed.remove(at);
        let still = w.owed.iter().any(|o| o.queue == owed.queue);
        Some((w.shared.key, owed.queue, still))
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
