//! Weighted worker selection for one queue (EventMQ 0.3.13, docs/emqp.md "Selection").
//!
//! The candidate list holds one `(weight, worker)` entry per worker serving
//! the queue, sorted by weight, highest first, stably. Selection walks from
//! the front, skipping workers without a free slot, and claims a slot on the
//! first one that has one. EventMQ then appends every popped entry to the
//! back and re-sorts stably; since the list is sorted, that equals rotating
//! the chosen worker's weight tier so the chosen entry (and the skipped ones
//! before it in its tier) move to the end of that tier. Higher tiers were
//! popped whole and keep their order. So: the highest tier with capacity
//! wins, and workers within a tier take turns. The cost is O(entries
//! skipped + tier size), with no sort per job.
//!
//! Workers that leave (KBYE, expiry) are not searched for: a worker that is
//! not live can never claim a slot, so its entry is dropped when selection
//! meets it, or all at once when more than half the list is stale. A KBYE
//! storm of N workers therefore costs O(N) in total, not O(N²).

use std::sync::Arc;

use super::types::{WorkerShared, WorkerState};
use crate::ids::WorkerKey;

/// The candidates of one queue, in selection order.
#[derive(Debug, Default)]
pub struct Candidates {
    list: Vec<(i64, Arc<WorkerShared>)>,
    /// Entries known to be stale (removed, not yet dropped).
    stale: usize,
}

impl Candidates {
    /// Adds a worker with `weight`, after every entry of the same or higher
    /// weight (a stable insert, as EventMQ's append-then-sort). Each
    /// registration has a key of its own, so it is added once.
    pub fn add(&mut self, weight: i64, worker: Arc<WorkerShared>) {
        let at = self.list.partition_point(|(w, _)| *w >= weight);
        self.list.insert(at, (weight, worker));
    }

    /// The worker registered under `key` leaves (it is no longer live, so
    /// it cannot be selected): its entry is dropped lazily (see the module
    /// docs).
    pub fn remove(&mut self, _key: WorkerKey) {
        self.stale += 1;
        if self.stale * 2 > self.list.len() {
            self.list.retain(|(_, w)| w.state() == WorkerState::Live);
            self.stale = 0;
        }
    }

    /// Claims a slot on the next worker by EventMQ's rule and returns it.
    /// Workers met on the way that are no longer live are dropped.
    pub fn select(&mut self) -> Option<Arc<WorkerShared>> {
        let mut saw_gone = false;
        let found = self.list.iter().position(|(_, w)| {
            saw_gone |= w.state() != WorkerState::Live;
            w.try_claim()
        });
        let chosen = self.list[found?].1.clone();
        let mut i = found?;
        if saw_gone {
            // Gone entries are dropped only when met, so a healthy list costs
            // nothing extra per job.
            self.list.retain(|(_, w)| w.state() == WorkerState::Live);
            self.stale = 0;
            match self.list.iter().position(|(_, w)| w.key == chosen.key) {
                Some(at) => i = at,
                // Died since the claim: its home shard requeues the job.
                None => return Some(chosen),
            }
        }
        let weight = self.list[i].0;
        let start = self.list.partition_point(|(w, _)| *w > weight);
        let end = self.list.partition_point(|(w, _)| *w >= weight);
        self.list[start..end].rotate_left(i - start + 1);
        Some(chosen)
    }

    /// Whether no live worker serves the queue.
    pub fn is_empty(&self) -> bool {
        self.iter().next().is_none()
    }

    /// The live entries in selection order: `(weight, worker)`.
    pub fn iter(&self) -> impl Iterator<Item = &(i64, Arc<WorkerShared>)> {
        self.list.iter().filter(|(_, w)| w.state() == WorkerState::Live)
    }

    /// Number of entries (gone ones not yet dropped included).
    pub fn len(&self) -> usize {
        self.list.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{PeerId, QueueName};

    fn worker(key: u64, name: &str) -> Arc<WorkerShared> {
        Arc::new(WorkerShared::new(WorkerKey(key), PeerId::from(name.as_bytes()), 0, vec![(10, QueueName::named("q"))]))
    }

    fn order(c: &Candidates) -> Vec<String> {
        c.iter().map(|(w, x)| format!("{w}{}", x.id)).collect()
    }

    /// EventMQ's `test_prioritize_queue_list` sequence (docs/emqp.md "Selection").
    #[test]
    fn eventmq_example() {
        let [b, a, d, e, cc] = [worker(1, "b"), worker(2, "a"), worker(3, "d"), worker(4, "e"), worker(5, "c")];
        let mut c = Candidates::default();
        for (wt, w) in [(10, &b), (10, &a), (0, &d), (0, &e), (0, &cc)] {
            c.add(wt, w.clone());
        }
        for w in [&b, &d] {
            w.add_slot();
        }
        assert_eq!(c.select().map(|w| w.id.to_string()), Some("b".into()));
        assert_eq!(order(&c), ["10a", "10b", "0d", "0e", "0c"]);
        assert_eq!(c.select().map(|w| w.id.to_string()), Some("d".into()));
        assert_eq!(order(&c), ["10a", "10b", "0e", "0c", "0d"]);
        assert!(c.select().is_none());
    }

    #[test]
    fn rotation_within_tier_and_dead_skipped() {
        let ws: Vec<_> = (0..3).map(|i| worker(i, &format!("w{i}"))).collect();
        let mut c = Candidates::default();
        for w in &ws {
            c.add(5, w.clone());
            w.add_slot();
            w.add_slot();
        }
        let picks: Vec<String> = (0..4).filter_map(|_| c.select()).map(|w| w.id.to_string()).collect();
        assert_eq!(picks, ["w0", "w1", "w2", "w0"]);
        ws[1].set_state(WorkerState::Dead);
        assert_eq!(c.select().map(|w| w.id.to_string()), Some("w2".into()));
        assert_eq!(c.len(), 2);
    }
}
