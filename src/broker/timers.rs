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
use std::time::{Duration, Instant};

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

/// A grid of instants `epoch + k × step` that peer timers are rounded to,
/// so that the heartbeats and expiry checks of many peers fall due
/// together and go out in one batch (one shard wake-up, one egress batch,
/// one I/O wake-up) instead of one wake-up each: Linux's timer slack, for
/// the shard. Every shard uses the router's start as its epoch, so their
/// grids agree.
#[derive(Debug, Clone, Copy)]
pub struct Grid {
    epoch: Instant,
    step: Duration,
}

impl Grid {
    /// Steps of at least 1 ms.
    pub fn new(epoch: Instant, step: Duration) -> Grid {
        Grid { epoch, step: step.max(Duration::from_millis(1)) }
    }

    /// The grid for peer timers of a router heartbeating every `interval`:
    /// steps of `interval` / 30, between 1 ms and 100 ms (100 ms for the
    /// default 3 s).
    pub fn for_heartbeats(epoch: Instant, interval: Duration) -> Grid {
        Grid::new(epoch, (interval / 30).min(Duration::from_millis(100)))
    }

    /// The grid step.
    pub fn step(&self) -> Duration {
        self.step
    }

    /// The last grid instant at or before `t` (`epoch` for any `t` before it).
    pub fn floor(&self, t: Instant) -> Instant {
        let since = t.saturating_duration_since(self.epoch).as_nanos();
        let step = self.step.as_nanos();
        self.epoch + Duration::from_nanos(u64::try_from(since / step * step).unwrap_or(u64::MAX))
    }

    /// The first grid instant at or after `t`.
    pub fn ceil(&self, t: Instant) -> Instant {
        let down = self.floor(t);
        if down >= t {
            down
        } else {
            down + self.step
        }
    }

    /// When to send the next HEARTBEAT to a peer sent one at `now`, every
    /// `interval`: the last grid instant at or before `now + interval`, so
    /// never later than the interval and at most one step earlier; a peer
    /// whose timer fires on the grid keeps a period of exactly `interval`
    /// when that is a whole number of steps (the default: 3 s, 100 ms).
    pub fn next_heartbeat(&self, now: Instant, interval: Duration) -> Instant {
        let due = self.floor(now + interval);
        if due > now {
            due
        } else {
            now + interval
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn grid_rounds_down_and_up_to_its_steps() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let g = Grid::new(t0, ms(100));
        assert_eq!(g.floor(t0 + ms(250)), t0 + ms(200));
        assert_eq!(g.ceil(t0 + ms(250)), t0 + ms(300));
        assert_eq!(g.floor(t0 + ms(300)), t0 + ms(300));
        assert_eq!(g.ceil(t0 + ms(300)), t0 + ms(300));
        assert_eq!(g.floor(t0), t0);
        assert_eq!(Grid::new(t0, Duration::ZERO).step(), ms(1));
    }

    #[test]
    fn heartbeat_grid_steps_are_a_thirtieth_of_the_interval_within_1_to_100_ms() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(Grid::for_heartbeats(t0, Duration::from_secs(3)).step(), ms(100));
        assert_eq!(Grid::for_heartbeats(t0, Duration::from_secs(60)).step(), ms(100));
        assert_eq!(Grid::for_heartbeats(t0, ms(300)).step(), ms(10));
        assert_eq!(Grid::for_heartbeats(t0, ms(10)).step(), ms(1));
    }

    #[test]
    fn next_heartbeat_is_never_later_than_the_interval_and_keeps_its_period_on_the_grid() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let g = Grid::new(t0, ms(100));
        let interval = Duration::from_secs(3);
        // Off the grid (an INFORM): at most one step early.
        let first = g.next_heartbeat(t0 + ms(1234), interval);
        assert_eq!(first, t0 + ms(4200));
        // Fired a little late, on the grid: the period stays 3 s.
        assert_eq!(g.next_heartbeat(first + ms(7), interval), first + interval);
        // Peers informing within one step share their deadlines.
        assert_eq!(g.next_heartbeat(t0 + ms(1201), interval), first);
        assert_eq!(g.next_heartbeat(t0 + ms(1299), interval), first);
        // An interval shorter than a step never yields the past.
        let coarse = Grid::new(t0, Duration::from_secs(1));
        assert_eq!(coarse.next_heartbeat(t0 + ms(500), ms(200)), t0 + ms(700));
    }
}
