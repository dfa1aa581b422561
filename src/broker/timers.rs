//! The shard's timer structure: a min-heap of `(deadline, event)`.
//!
//! Heartbeat and expiry timers are *lazy*: a message from a worker only
//! updates its `last_seen`; the heap entry is looked at when it falls due and
//! re-armed if the peer was heard from since. So the cost is one heap
//! operation per peer per interval, whatever the traffic, and nothing at all
//! between deadlines: the shard blocks until [`Timers::next_deadline`]
//! (beanstalkd's `prottick` habit; every loop
//! blocks until its next deadline).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;

/// A heap of timers carrying events of type `E`.
#[derive(Debug)]
pub struct Timers<E: Ord> {
    heap: BinaryHeap<Reverse<(Instant, u64, E)>>,
    seq: u64,
}

impl<E: Ord> Default for Timers<E> {
    fn default() -> Self {
        Timers { heap: BinaryHeap::new(), seq: 0 }
    }
}

impl<E: Ord> Timers<E> {
    /// Arms `event` at `deadline`. Events with equal deadlines fire in the
    /// order they were armed.
    pub fn arm(&mut self, deadline: Instant, event: E) {
        self.seq += 1;
        self.heap.push(Reverse((deadline, self.seq, event)));
    }

    /// The earliest deadline, if any timer is armed.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse((d, _, _))| *d)
    }

    /// Removes and returns the earliest event due at or before `now`.
    pub fn pop_due(&mut self, now: Instant) -> Option<E> {
        if self.next_deadline()? > now {
            return None;
        }
        self.heap.pop().map(|Reverse((_, _, e))| e)
    }

    /// Number of armed timers (stale ones included).
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether no timer is armed.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn fires_in_deadline_order_and_only_when_due() {
        let t0 = Instant::now();
        let mut t = Timers::default();
        t.arm(t0 + Duration::from_secs(2), 'b');
        t.arm(t0 + Duration::from_secs(1), 'a');
        t.arm(t0 + Duration::from_secs(2), 'c');
        assert_eq!(t.next_deadline(), Some(t0 + Duration::from_secs(1)));
        assert_eq!(t.pop_due(t0), None);
        assert_eq!(t.pop_due(t0 + Duration::from_secs(5)), Some('a'));
        assert_eq!(t.pop_due(t0 + Duration::from_secs(5)), Some('b'));
        assert_eq!(t.pop_due(t0 + Duration::from_secs(5)), Some('c'));
        assert!(t.is_empty());
    }
}
