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

    /// Refreshes a scheduler's liveness; false (and nothing changed) when
    /// `id` is not registered.
    pub fn touch(&mut self, id: &PeerId, now: Instant) -> bool {
        match self.list.iter_mut().find(|e| &e.id == id) {
            Some(e) => {
                e.last_seen = now;
                true
            }
            None => false,
        }
    }

    /// Whether `id` is registered.
    pub fn contains(&self, id: &PeerId) -> bool {
        self.list.iter().any(|e| &e.id == id)
    }

    /// Registered schedulers.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Whether none is registered.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Forgets a scheduler (KBYE, expiry, unreachable).
    pub fn remove(&mut self, id: &PeerId) {
        self.list.retain(|e| &e.id != id);
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

    /// Every scheduler's identity, in INFORM order.
    pub fn ids(&self) -> Vec<PeerId> {
        self.list.iter().map(|e| e.id.clone()).collect()
    }

    /// Removes and returns the schedulers silent for `timeout` or longer.
    pub fn expire(&mut self, now: Instant, timeout: Duration) -> Vec<PeerId> {
        let mut gone = Vec::new();
        self.list.retain(|e| {
            let alive = now.saturating_duration_since(e.last_seen) < timeout;
            if !alive {
                gone.push(e.id.clone());
            }
            alive
        });
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
