//! [`Tombstones`]: UNSCHEDULEs (and moves of a schedule to a new owner)
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
    /// schedulers that got the message now). A drop keeps the names of an
    /// earlier tombstone of the key. Returns how many tombstones were
    /// evicted to make room.
    pub fn record(&mut self, key: &[u8], kind: Kind, frames: Vec<Frame>, told: Vec<Name>) -> usize {
        let mut names: HashSet<Name> = told.into_iter().collect();
        if let Some(old) = self.take(key) {
            if kind == Kind::Drop {
                names.extend(old.told);
            }
        }
        let bytes = key.len() + frames.iter().map(Vec::len).sum::<usize>();
        let mut evicted = 0;
        while !self.by_key.is_empty()
            && (self.by_key.len() >= limits::MAX_SCHEDULE_TOMBSTONES
                || self.bytes + bytes > limits::MAX_SCHEDULE_TOMBSTONE_BYTES)
        {
            let Some((_, oldest)) = self.order.pop_first() else { break };
            if let Some(t) = self.by_key.remove(&oldest) {
                self.bytes -= t.bytes;
                evicted += 1;
            }
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
    /// `(kind, frames)`; it is named in each from now on.
    pub fn deliver(&mut self, name: &Name) -> Vec<(Kind, Vec<Frame>)> {
        let mut out = Vec::new();
        for key in self.order.values() {
            let Some(t) = self.by_key.get_mut(key) else { continue };
            if t.told.insert(name.clone()) {
                out.push((t.kind, t.frames.clone()));
            }
        }
        out
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
    fn a_registrant_gets_each_tombstone_once_and_a_drop_keeps_the_names() {
        let mut t = Tombstones::default();
        t.record(b"k1", Kind::Unschedule, vec![b"u1".to_vec()], vec![n("b")]);
        t.record(b"k2", Kind::Unschedule, vec![b"u2".to_vec()], vec![]);
        assert!(t.is_unscheduled(b"k1"));
        assert_eq!(t.deliver(&n("b")), vec![(Kind::Unschedule, vec![b"u2".to_vec()])]);
        assert_eq!(t.deliver(&n("a")).len(), 2);
        assert!(t.deliver(&n("a")).is_empty(), "told once");
        // k1 scheduled again: a drop for those not told yet.
        t.record(b"k1", Kind::Drop, vec![b"s1".to_vec()], vec![n("c")]);
        assert!(!t.is_unscheduled(b"k1"));
        assert_eq!(
            t.deliver(&n("d")),
            vec![(Kind::Unschedule, vec![b"u2".to_vec()]), (Kind::Drop, vec![b"s1".to_vec()])]
        );
        assert!(t.deliver(&n("a")).is_empty(), "a had both");
        assert_eq!(t.deliver(&n("c")), vec![(Kind::Unschedule, vec![b"u2".to_vec()])], "c had only the drop");
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
