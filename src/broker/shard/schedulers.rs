//! [`Schedulers`]: the registered schedulers (shard 0 only), in INFORM
//! order, with their routing names, and the choice of a scheduler for a new
//! schedule key. Data and its rules only: the handlers in `scheduling.rs`
//! decide what to do; [`super::owners`] remembers who owns what.
//!
//! A scheduler's **name** is the one it gave in its INFORM (emq-scheduler
//! sends a stable one), else its identity. A new key goes to the live
//! scheduler owning the fewest keys; among those, to the one with the
//! highest rendezvous score `score(k, s) = first 8 bytes of SHA-1(k ‖ 0x00
//! ‖ name(s))` (big-endian; ties, which need equal names, go to the
//! greater identity). Cost: one SHA-1 per live scheduler per new key.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sha1::{Digest, Sha1};

pub use super::owners::Name;
use crate::broker::snapshot::SchedulerSnap;
use crate::ids::PeerId;

/// One registered scheduler.
#[derive(Debug)]
struct Entry {
    id: PeerId,
    /// Its INFORM frame 6, else its identity.
    name: Name,
    /// Whether it sent a name (an emq-scheduler: it understands DROP).
    named: bool,
    last_seen: Instant,
    scheduled: u64,
}

/// Live schedulers in INFORM order.
#[derive(Debug, Default)]
pub struct Schedulers {
    list: Vec<Entry>,
    /// The last identities that lost their name to a newer registration,
    /// with that name, oldest first (at most [`DISPLACED_KEPT`]).
    displaced: std::collections::VecDeque<(Name, PeerId)>,
}

/// How many displaced (name, identity) pairs [`Schedulers`] remembers.
const DISPLACED_KEPT: usize = 64;

/// The rendezvous score of `name` for schedule `key` (module docs).
pub fn score(key: &[u8], name: &[u8]) -> u64 {
    let mut h = Sha1::new();
    h.update(key);
    h.update([0u8]);
    h.update(name);
    let d = h.finalize();
    u64::from_be_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]])
}

impl Schedulers {
    /// Registers `id` under `name` (a repeated INFORM replaces the entry:
    /// EventMQ added a duplicate). Another scheduler registered under the
    /// same name is replaced too (the newest registration of a name takes
    /// it over, as a restarted scheduler comes back under a new identity);
    /// its identity is returned.
    pub fn add(&mut self, id: PeerId, name: Option<Vec<u8>>, now: Instant) -> Option<PeerId> {
        self.remove(&id);
        let named = name.is_some();
        let name: Name = Arc::from(name.unwrap_or_else(|| id.0.to_vec()));
        let replaced = self.list.iter().position(|e| e.name == name).map(|i| self.list.remove(i).id);
        if let (true, Some(old)) = (named, &replaced) {
            if self.displaced.len() >= DISPLACED_KEPT {
                self.displaced.pop_front();
            }
            self.displaced.push_back((name.clone(), old.clone()));
        }
        self.list.push(Entry { id, name, named, last_seen: now, scheduled: 0 });
        replaced
    }

    /// Whether `id` lost `name` to a newer registration before: registering
    /// under it again means two live schedulers share the name (a restarted
    /// scheduler comes back under a new identity, never its old one), and
    /// they would take it from each other at every re-registration.
    pub fn was_displaced(&self, id: &PeerId, name: &[u8]) -> bool {
        self.displaced.iter().any(|(n, i)| i == id && n.as_ref() == name)
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

    /// The live scheduler for a new schedule `key` (module docs), given
    /// each name's current number of keys; `None` when none is registered.
    pub fn pick_for(&self, key: &[u8], load: impl Fn(&[u8]) -> usize) -> Option<(PeerId, Name)> {
        let best = self.list.iter().max_by(|a, b| {
            let (la, lb) = (load(&a.name), load(&b.name));
            lb.cmp(&la).then_with(|| score(key, &a.name).cmp(&score(key, &b.name))).then_with(|| a.id.0.cmp(&b.id.0))
        })?;
        Some((best.id.clone(), best.name.clone()))
    }

    /// The live scheduler registered under `name`.
    pub fn by_name(&self, name: &[u8]) -> Option<PeerId> {
        self.list.iter().find(|e| &*e.name == name).map(|e| e.id.clone())
    }

    /// Counts a SCHEDULE/UNSCHEDULE routed to `id` (ROUTER_SHOW_SCHEDULERS
    /// `scheduled`).
    pub fn count_routed(&mut self, id: &PeerId) {
        if let Some(e) = self.list.iter_mut().find(|e| &e.id == id) {
            e.scheduled += 1;
        }
    }

    /// Every scheduler's identity but `except`, in INFORM order, each with
    /// whether it gave a name (an emq-scheduler).
    pub fn others(&self, except: &PeerId) -> Vec<(PeerId, bool)> {
        self.list.iter().filter(|e| &e.id != except).map(|e| (e.id.clone(), e.named)).collect()
    }

    /// The names of the registered schedulers that gave one (emq-schedulers).
    pub fn named(&self) -> Vec<Name> {
        self.list.iter().filter(|e| e.named).map(|e| e.name.clone()).collect()
    }

    /// Every scheduler's identity, in INFORM order.
    pub fn ids(&self) -> Vec<PeerId> {
        self.list.iter().map(|e| e.id.clone()).collect()
    }

    /// When the longest-silent registered scheduler was last heard from
    /// (`None` when none is registered): its expiry is the next one due.
    pub fn earliest_seen(&self) -> Option<Instant> {
        self.list.iter().map(|e| e.last_seen).min()
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
                name: e.named.then(|| String::from_utf8_lossy(&e.name).into_owned()),
                hb: e.last_seen.saturating_duration_since(started).as_secs_f64(),
                scheduled: e.scheduled,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> PeerId {
        PeerId::from(s.as_bytes())
    }

    fn table(names: &[&str]) -> Schedulers {
        let mut t = Schedulers::default();
        for n in names {
            t.add(p(&format!("id-{n}")), Some(n.as_bytes().to_vec()), Instant::now());
        }
        t
    }

    #[test]
    fn new_keys_go_to_the_least_loaded_then_by_rendezvous() {
        let t = table(&["a", "b", "c"]);
        let load = |loads: &'static [(&'static str, usize)]| {
            move |n: &[u8]| loads.iter().find(|(k, _)| k.as_bytes() == n).map_or(0, |(_, l)| *l)
        };
        assert_eq!(t.pick_for(b"k", load(&[("a", 1), ("b", 0), ("c", 1)])).unwrap().0, p("id-b"));
        // Equal loads: the highest score wins, whatever the INFORM order.
        let (best, _) = t.pick_for(b"k", |_| 0).unwrap();
        let want = ["a", "b", "c"].into_iter().max_by_key(|n| score(b"k", n.as_bytes())).unwrap();
        assert_eq!(best, p(&format!("id-{want}")));
        let reversed = table(&["c", "b", "a"]);
        assert_eq!(reversed.pick_for(b"k", |_| 0).unwrap().0, best);
    }

    #[test]
    fn a_name_registered_again_replaces_its_old_entry() {
        let mut t = table(&["a", "b"]);
        assert_eq!(t.add(p("id-a-restarted"), Some(b"a".to_vec()), Instant::now()), Some(p("id-a")));
        assert_eq!((t.len(), t.by_name(b"a")), (2, Some(p("id-a-restarted"))));
        // No name: the identity is the name.
        t.add(p("python-uuid"), None, Instant::now());
        assert_eq!(t.by_name(b"python-uuid"), Some(p("python-uuid")));
        assert_eq!(t.others(&p("id-b")), vec![(p("id-a-restarted"), true), (p("python-uuid"), false)]);
    }

    #[test]
    fn a_displaced_identity_taking_its_name_back_is_told_from_a_restart() {
        let mut t = table(&["a"]);
        assert!(!t.was_displaced(&p("id-a2"), b"a"), "a second scheduler named a");
        t.add(p("id-a2"), Some(b"a".to_vec()), Instant::now());
        assert!(t.was_displaced(&p("id-a"), b"a"), "the first one comes back: two share the name");
        assert!(!t.was_displaced(&p("id-a-restarted"), b"a"), "a restart has a new identity");
        assert!(!t.was_displaced(&p("id-a"), b"b"));
        // The first "x" displaces nobody; each later one displaces the one before.
        for n in 0..=DISPLACED_KEPT {
            t.add(p(&format!("id-x{n}")), Some(b"x".to_vec()), Instant::now());
        }
        assert!(!t.was_displaced(&p("id-a"), b"a"), "bounded: the oldest pair forgotten");
    }

    #[test]
    fn score_is_stable() {
        // SHA-1("k\0a")[..8]: fixed by the rule, so routing survives restarts and upgrades.
        assert_eq!(score(b"k", b"a"), u64::from_be_bytes(Sha1::digest(b"k\0a")[..8].try_into().unwrap()));
    }
}
