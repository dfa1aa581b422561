//! [`Tombstones`]: UNSCHEDULE messages (and moves of a schedule to a new owner)
//! that a scheduler not connected at the time has not heard of yet (shard 0
//! only), so that a scheduler that comes back with a stored copy of a
//! schedule forgets it before it runs it. Data and its rules only:
//! `scheduling.rs` records and delivers.
//!
//! Rules (emq's; EventMQ forgot an UNSCHEDULE its scheduler did not get,
//! and emq before this answered `not_found` while the owner was away,
//! which then restored and ran the schedule):
//! * every UNSCHEDULE leaves a tombstone for its key, naming the named
//!   schedulers (emq-schedulers, which keep their schedules and come back
//!   under their name) that got it at once;
//! * a SCHEDULE of the key turns its tombstone into a *drop*: a scheduler
//!   that registers later gets `DROP` (forget your copy, another scheduler
//!   owns it now; a shared Redis record is kept) instead of `UNSCHEDULE`;
//!   a SCHEDULE that moves a key away from an owner that is not connected
//!   leaves such a drop too;
//! * when a named scheduler registers (INFORM with a name), it gets, before
//!   its ACK, the UNSCHEDULE or DROP of every tombstone that does not name
//!   it yet, and is named in them. A scheduler handles messages in order
//!   and fires only once ACKed, so it forgets those schedules before it
//!   could run them;
//! * at most [`limits::MAX_SCHEDULE_TOMBSTONES`] tombstones holding at most
//!   [`limits::MAX_SCHEDULE_TOMBSTONE_BYTES`] of frames are kept; past
//!   either the oldest goes (counted: `schedule_tombstones_evicted`). They
//!   live in the router's memory: a router restart forgets them.
//!
//! Cost: O(1) per UNSCHEDULE; O(tombstones) per named registration.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::owners::Name;
use crate::limits;
use crate::protocol::emqp::Frame;

/// Bytes counted for each name a tombstone holds, beside the name itself
/// (its `Arc` and the set's slot), toward
/// [`limits::MAX_SCHEDULE_TOMBSTONE_BYTES`].
const NAME_COST_BYTES: usize = 48;

/// What a later registrant gets for a tombstone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The schedule was removed: `UNSCHEDULE`.
    Unschedule,
    /// Another scheduler owns it now: `DROP`.
    Drop,
}

#[derive(Debug)]
struct Tomb {
    kind: Kind,
    /// The UNSCHEDULE or SCHEDULE as received (D-frames); the command word
    /// and msgid are replaced when it is delivered.
    frames: Vec<Frame>,
    /// Named schedulers that have it.
    told: HashSet<Name>,
    stamp: u64,
    bytes: usize,
}

/// Tombstones by schedule key. See the module docs.
#[derive(Debug, Default)]
pub struct Tombstones {
    by_key: HashMap<Vec<u8>, Tomb>,
    order: BTreeMap<u64, Vec<u8>>,
    bytes: usize,
    next_stamp: u64,
}

impl Tombstones {
    /// Records `kind` for `key` with `frames`, naming `told` (the named
    /// schedulers that got the message now), in place of any earlier
    /// tombstone of the key: a drop names only those connected now, so a
    /// scheduler that became the key's owner since an earlier UNSCHEDULE,
    /// and is away now, still gets it. The bytes counted include the names
    /// (`NAME_COST_BYTES` each beside the name). Returns how many
    /// tombstones were evicted to make room.
    pub fn record(&mut self, key: &[u8], kind: Kind, frames: Vec<Frame>, told: Vec<Name>) -> usize {
        let names: HashSet<Name> = told.into_iter().collect();
        self.take(key);
        let bytes = key.len()
            + frames.iter().map(Vec::len).sum::<usize>()
            + names.iter().map(|n| n.len() + NAME_COST_BYTES).sum::<usize>();
        let mut evicted = 0;
        while !self.by_key.is_empty()
            && (self.by_key.len() >= limits::MAX_SCHEDULE_TOMBSTONES
                || self.bytes + bytes > limits::MAX_SCHEDULE_TOMBSTONE_BYTES)
        {
            evicted += self.evict_oldest();
        }
        self.next_stamp += 1;
        self.order.insert(self.next_stamp, key.to_vec());
        self.bytes += bytes;
        self.by_key.insert(key.to_vec(), Tomb { kind, frames, told: names, stamp: self.next_stamp, bytes });
        evicted
    }

    /// Whether `key` has a tombstone of either kind.
    pub fn contains(&self, key: &[u8]) -> bool {
        self.by_key.contains_key(key)
    }

    /// Whether `key` has an UNSCHEDULE tombstone (not a drop).
    pub fn is_unscheduled(&self, key: &[u8]) -> bool {
        self.by_key.get(key).is_some_and(|t| t.kind == Kind::Unschedule)
    }

    /// The messages scheduler `name` has not had yet, oldest first, as
    /// `(kind, frames)`; it is named in each from now on. The names count
    /// toward [`limits::MAX_SCHEDULE_TOMBSTONE_BYTES`], so registrations
    /// under ever new names evict the oldest tombstones instead of growing
    /// memory; the second value is how many were evicted so.
    pub fn deliver(&mut self, name: &Name) -> (Vec<(Kind, Vec<Frame>)>, usize) {
        let mut out = Vec::new();
        let cost = name.len() + NAME_COST_BYTES;
        for key in self.order.values() {
            let Some(t) = self.by_key.get_mut(key) else { continue };
            if t.told.insert(name.clone()) {
                out.push((t.kind, t.frames.clone()));
                t.bytes += cost;
                self.bytes += cost;
            }
        }
        let mut evicted = 0;
        while self.bytes > limits::MAX_SCHEDULE_TOMBSTONE_BYTES && !self.by_key.is_empty() {
            evicted += self.evict_oldest();
        }
        (out, evicted)
    }

    /// Forgets the oldest tombstone: 1, or 0 when there is none.
    fn evict_oldest(&mut self) -> usize {
        let Some((_, oldest)) = self.order.pop_first() else { return 0 };
        match self.by_key.remove(&oldest) {
            Some(t) => {
                self.bytes -= t.bytes;
                1
            }
            None => 0,
        }
    }

    /// Tombstones kept.
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    fn take(&mut self, key: &[u8]) -> Option<Tomb> {
        let t = self.by_key.remove(key)?;
        self.order.remove(&t.stamp);
        self.bytes -= t.bytes;
        Some(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn n(s: &str) -> Name {
        Arc::from(s.as_bytes())
    }

    #[test]
    fn a_registrant_gets_each_tombstone_once_and_a_drop_names_only_those_connected_now() {
        let mut t = Tombstones::default();
        t.record(b"k1", Kind::Unschedule, vec![b"u1".to_vec()], vec![n("b")]);
        t.record(b"k2", Kind::Unschedule, vec![b"u2".to_vec()], vec![]);
        assert!(t.is_unscheduled(b"k1"));
        assert_eq!(t.deliver(&n("b")).0, vec![(Kind::Unschedule, vec![b"u2".to_vec()])]);
        assert_eq!(t.deliver(&n("a")).0.len(), 2);
        assert!(t.deliver(&n("a")).0.is_empty(), "told once");
        // k1 scheduled again, to c: a drop for every scheduler not
        // connected now, even one told of the UNSCHEDULE (it may have
        // owned k1 since).
        t.record(b"k1", Kind::Drop, vec![b"s1".to_vec()], vec![n("c")]);
        assert!(!t.is_unscheduled(b"k1"));
        assert_eq!(
            t.deliver(&n("d")).0,
            vec![(Kind::Unschedule, vec![b"u2".to_vec()]), (Kind::Drop, vec![b"s1".to_vec()])]
        );
        assert_eq!(t.deliver(&n("a")).0, vec![(Kind::Drop, vec![b"s1".to_vec()])], "a had the UNSCHEDULE only");
        assert_eq!(t.deliver(&n("c")).0, vec![(Kind::Unschedule, vec![b"u2".to_vec()])], "c had only the drop");
    }

    #[test]
    fn registrations_under_ever_new_names_evict_instead_of_growing() {
        let mut t = Tombstones::default();
        let frames = vec![vec![0u8; 1000]];
        for i in 0..1000 {
            t.record(format!("k{i}").as_bytes(), Kind::Unschedule, frames.clone(), vec![]);
        }
        let mut evicted = 0;
        for i in 0..2000 {
            let (out, gone) = t.deliver(&n(&format!("name-{i:04}")));
            assert_eq!(out.len(), t.len() + gone, "every tombstone left, and the ones evicted after delivery");
            evicted += gone;
            assert!(t.bytes <= limits::MAX_SCHEDULE_TOMBSTONE_BYTES);
        }
        assert!(evicted > 0 && t.len() < 1000, "{evicted} evicted, {} left", t.len());
    }

    #[test]
    fn the_oldest_tombstone_goes_when_full() {
        let mut t = Tombstones::default();
        let mut evicted = 0;
        for i in 0..limits::MAX_SCHEDULE_TOMBSTONES + 3 {
            evicted += t.record(format!("k{i}").as_bytes(), Kind::Unschedule, vec![b"x".to_vec()], vec![]);
        }
        assert_eq!((t.len(), evicted), (limits::MAX_SCHEDULE_TOMBSTONES, 3));
        assert!(!t.is_unscheduled(b"k0") && t.is_unscheduled(b"k3"));
    }
}
