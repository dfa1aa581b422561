//! [`Schedulers`]: the registered schedulers (shard 0 only), in INFORM
//! order, with a round-robin cursor. Data and its rules only: the handlers
//! in `peers.rs` decide what to do.

use std::time::{Duration, Instant};

use crate::broker::snapshot::SchedulerSnap;
use crate::ids::PeerId;

/// One registered scheduler.
#[derive(Debug)]
struct Entry {
    id: PeerId,
    last_seen: Instant,
    scheduled: u64,
}

/// Live schedulers in INFORM order, with a round-robin cursor.
#[derive(Debug, Default)]
pub struct Schedulers {
    list: Vec<Entry>,
    next: usize,
}

impl Schedulers {
    /// Registers `id` (a repeated INFORM replaces the entry: EventMQ added a
    /// duplicate).
    pub fn add(&mut self, id: PeerId, now: Instant) {
        self.remove(&id);
        self.list.push(Entry { id, last_seen: now, scheduled: 0 });
    }

    /// Refreshes a scheduler's liveness; unknown peers are ignored.
    pub fn touch(&mut self, id: &PeerId, now: Instant) {
        if let Some(e) = self.list.iter_mut().find(|e| &e.id == id) {
            e.last_seen = now;
        }
    }

    /// Forgets a scheduler (KBYE, expiry, unreachable). The cursor keeps
    /// pointing at the scheduler whose turn is next.
    pub fn remove(&mut self, id: &PeerId) {
        let Some(at) = self.list.iter().position(|e| &e.id == id) else { return };
        self.list.remove(at);
        if at < self.next {
            self.next -= 1;
        }
    }

    /// The next scheduler in turn, counted as having been given a SCHEDULE.
    pub fn pick(&mut self) -> Option<PeerId> {
        if self.list.is_empty() {
            return None;
        }
        self.next %= self.list.len();
        let e = &mut self.list[self.next];
        e.scheduled += 1;
        self.next += 1;
        Some(e.id.clone())
    }

    /// Registered schedulers.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Whether `id` is registered.
    pub fn has(&self, id: &PeerId) -> bool {
        self.list.iter().any(|e| &e.id == id)
    }

    /// Every scheduler's identity, in INFORM order.
    pub fn ids(&self) -> Vec<PeerId> {
        self.list.iter().map(|e| e.id.clone()).collect()
    }

    /// Removes and returns the schedulers silent for `timeout` or longer.
    pub fn expire(&mut self, now: Instant, timeout: Duration) -> Vec<PeerId> {
        let silent = |e: &&Entry| now.saturating_duration_since(e.last_seen) >= timeout;
        let gone: Vec<PeerId> = self.list.iter().filter(silent).map(|e| e.id.clone()).collect();
        for id in &gone {
            self.remove(id);
        }
        gone
    }

    /// Snapshots with `hb` in seconds since `started`.
    pub fn snaps(&self, started: Instant) -> Vec<SchedulerSnap> {
        self.list
            .iter()
            .map(|e| SchedulerSnap {
                id: e.id.to_string(),
                hb: e.last_seen.saturating_duration_since(started).as_secs_f64(),
                scheduled: e.scheduled,
            })
            .collect()
    }
}
