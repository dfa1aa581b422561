//! [`Owners`]: which scheduler owns which schedule key (shard 0 only), so
//! that every SCHEDULE and UNSCHEDULE of a schedule reaches the scheduler
//! that holds it. Data and its rules only: `scheduling.rs` routes.
//!
//! Rules (emq's; EventMQ sent every SCHEDULE to its newest scheduler):
//! * **Sticky**: a key is routed to the scheduler the router gave it to,
//!   while a scheduler of that name is registered. Schedulers are known by
//!   the name they give in their INFORM (emq-scheduler sends a stable one),
//!   else by their identity; so an emq-scheduler that restarts under a new
//!   identity gets its keys back.
//! * **New keys**, and keys whose owner is gone, go to the live scheduler
//!   owning the fewest keys; ties are broken by rendezvous hashing
//!   ([`super::schedulers::score`]), so with one scheduler per key the
//!   choice is still a pure function of the key and the live names. (Pure
//!   rendezvous hashing would need no table, but it puts two keys on one
//!   of two schedulers half the time; the table keeps the load even.)
//! * UNSCHEDULE forgets the key (nobody holds it any more).
//! * At most [`limits::MAX_ROUTED_SCHEDULE_KEYS`] keys are remembered; past
//!   that the key routed least recently is forgotten (its next SCHEDULE is
//!   placed anew, and the router's DROP makes its old holder forget it).
//!
//! Cost: O(log n) per SCHEDULE in the table size, plus O(live schedulers).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::limits;

/// A scheduler's routing name: its INFORM name, or its identity.
pub type Name = Arc<[u8]>;

#[derive(Debug)]
struct Owned {
    name: Name,
    stamp: u64,
}

/// Key → owner, with per-owner counts and least-recently-routed eviction.
#[derive(Debug, Default)]
pub struct Owners {
    by_key: HashMap<Vec<u8>, Owned>,
    /// Routing order: stamp → key (the oldest is evicted first).
    order: BTreeMap<u64, Vec<u8>>,
    load: HashMap<Name, usize>,
    next_stamp: u64,
}

impl Owners {
    /// The owner of `key`, if it has one; the key counts as just routed.
    pub fn get(&mut self, key: &[u8]) -> Option<Name> {
        let stamp = self.bump();
        let owned = self.by_key.get_mut(key)?;
        self.order.remove(&owned.stamp);
        owned.stamp = stamp;
        self.order.insert(stamp, key.to_vec());
        Some(owned.name.clone())
    }

    /// Gives `key` to `name` (replacing any earlier owner), evicting the
    /// least recently routed key when the table is full; true when a key
    /// was evicted.
    pub fn assign(&mut self, key: &[u8], name: Name) -> bool {
        self.remove(key);
        let mut evicted = false;
        if self.by_key.len() >= limits::MAX_ROUTED_SCHEDULE_KEYS {
            if let Some((_, oldest)) = self.order.pop_first() {
                self.forget(&oldest);
                evicted = true;
            }
        }
        let stamp = self.bump();
        *self.load.entry(name.clone()).or_default() += 1;
        self.order.insert(stamp, key.to_vec());
        self.by_key.insert(key.to_vec(), Owned { name, stamp });
        evicted
    }

    /// Forgets `key` (UNSCHEDULE).
    pub fn remove(&mut self, key: &[u8]) {
        if let Some(owned) = self.by_key.get(key) {
            self.order.remove(&owned.stamp);
            self.forget(key);
        }
    }

    /// Keys owned by `name`.
    pub fn load(&self, name: &[u8]) -> usize {
        self.load.get(name).copied().unwrap_or(0)
    }

    /// Keys remembered.
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    /// Whether no key is remembered.
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    fn forget(&mut self, key: &[u8]) {
        let Some(owned) = self.by_key.remove(key) else { return };
        if let Some(n) = self.load.get_mut(&owned.name) {
            *n -= 1;
            if *n == 0 {
                self.load.remove(&owned.name);
            }
        }
    }

    fn bump(&mut self) -> u64 {
        self.next_stamp += 1;
        self.next_stamp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> Name {
        Arc::from(s.as_bytes())
    }

    #[test]
    fn assign_move_and_forget_keep_the_counts() {
        let mut o = Owners::default();
        o.assign(b"k1", n("a"));
        o.assign(b"k2", n("a"));
        o.assign(b"k3", n("b"));
        assert_eq!((o.load(b"a"), o.load(b"b")), (2, 1));
        o.assign(b"k1", n("b"));
        assert_eq!((o.load(b"a"), o.load(b"b"), o.len()), (1, 2, 3));
        o.remove(b"k2");
        assert_eq!((o.load(b"a"), o.get(b"k2")), (0, None));
        assert_eq!(o.get(b"k3"), Some(n("b")));
    }

    #[test]
    fn the_least_recently_routed_key_is_evicted_when_full() {
        let mut o = Owners::default();
        for i in 0..limits::MAX_ROUTED_SCHEDULE_KEYS {
            o.assign(format!("k{i}").as_bytes(), n("a"));
        }
        assert!(o.get(b"k0").is_some(), "k0 routed again: now the most recent");
        assert!(o.assign(b"new", n("b")), "one key evicted");
        assert_eq!(o.len(), limits::MAX_ROUTED_SCHEDULE_KEYS);
        assert!(o.get(b"k1").is_none(), "k1 was the least recently routed");
        assert!(o.get(b"k0").is_some());
        assert_eq!(o.load(b"a") + o.load(b"b"), limits::MAX_ROUTED_SCHEDULE_KEYS);
    }
}
