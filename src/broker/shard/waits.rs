//! [`WaitTable`]: long-poll ASKs (`ASK <queue> <ms>`) waiting for a task of
//! a queue of this shard (text-protocol.md "Extension: long-poll ASK"), at
//! most one per connection, served in arrival order. Data and its rules
//! only: the handlers in `text.rs` decide what to do.
//!
//! Bounded by the connections: the text front end sends a connection's
//! next ASK only after the previous one is answered. A wait leaves the
//! table when it is served, times out or is cancelled; its place in the
//! queue's line is then skipped when reached, and the line is rebuilt when
//! skipped places outnumber live ones.

use std::collections::VecDeque;
use std::time::Instant;

use super::offers::{ConnTimers, Due};
use crate::broker::text_port::TextPort;
use crate::ids::{ConnId, FastMap, QueueName};

/// A waiting ASK.
#[derive(Debug)]
pub struct Waiter {
    /// The connection.
    pub conn: ConnId,
    /// The queue it waits on.
    pub queue: QueueName,
    /// Where its answer goes.
    pub port: TextPort,
    /// When it is answered `NOPE` if no task came.
    pub deadline: Instant,
    /// Its place in the queue's line.
    ticket: u64,
}

/// One queue's line of waiting connections.
#[derive(Debug, Default)]
struct Line {
    /// `(conn, ticket)`, oldest first; places of waits that ended are
    /// skipped.
    places: VecDeque<(ConnId, u64)>,
    /// Waits still live in `places`.
    live: usize,
}

/// What the wait timer of a connection finds.
pub type WaitCheck = Due<Waiter>;

/// The waiting ASKs of one shard.
#[derive(Debug, Default)]
pub struct WaitTable {
    by_conn: FastMap<ConnId, Waiter>,
    lines: FastMap<QueueName, Line>,
    /// Connections with an armed wait timer.
    timed: ConnTimers,
    next_ticket: u64,
}

impl WaitTable {
    /// Puts `conn` at the back of `queue`'s line until `deadline`. Returns
    /// whether a timer must be armed for the connection, and a wait the
    /// connection already had (the front end allows one; a displaced one is
    /// handed back to be answered, never lost).
    pub fn add(&mut self, conn: ConnId, queue: QueueName, port: TextPort, deadline: Instant) -> (bool, Option<Waiter>) {
        let displaced = self.remove(conn);
        self.next_ticket += 1;
        let ticket = self.next_ticket;
        let line = self.lines.entry(queue.clone()).or_default();
        line.places.push_back((conn, ticket));
        line.live += 1;
        self.by_conn.insert(conn, Waiter { conn, queue, port, deadline, ticket });
        (self.timed.arm(conn, deadline), displaced)
    }

    /// Whether a connection waits on `queue`.
    pub fn has(&self, queue: &[u8]) -> bool {
        self.lines.contains_key(queue)
    }

    /// The queues a connection waits on, in no order.
    pub fn queues(&self) -> impl Iterator<Item = &QueueName> {
        self.lines.keys()
    }

    /// Whether no connection waits anywhere on this shard.
    pub fn is_empty(&self) -> bool {
        self.by_conn.is_empty()
    }

    /// Connections waiting now.
    pub fn len(&self) -> usize {
        self.by_conn.len()
    }

    /// Takes the connection that has waited longest on `queue`.
    pub fn pop(&mut self, queue: &[u8]) -> Option<Waiter> {
        loop {
            let (conn, ticket) = self.lines.get_mut(queue)?.places.pop_front()?;
            if self.by_conn.get(&conn).is_some_and(|w| w.ticket == ticket) {
                return self.remove(conn);
            }
        }
    }

    /// Takes `conn`'s wait out, wherever it is.
    pub fn remove(&mut self, conn: ConnId) -> Option<Waiter> {
        let waiter = self.by_conn.remove(&conn)?;
        if let Some(line) = self.lines.get_mut(&waiter.queue) {
            line.live -= 1;
            if line.live == 0 {
                self.lines.remove(&waiter.queue);
            } else if line.places.len() > 2 * line.live + 16 {
                let by_conn = &self.by_conn;
                line.places.retain(|(c, t)| by_conn.get(c).is_some_and(|w| w.ticket == *t));
            }
        }
        Some(waiter)
    }

    /// The connection's wait timer fired at `now`.
    pub fn check(&mut self, conn: ConnId, now: Instant) -> WaitCheck {
        let deadline = self.by_conn.get(&conn).map(|w| w.deadline);
        let mut timed = std::mem::take(&mut self.timed);
        let due = timed.fired(conn, now, deadline, || self.remove(conn));
        self.timed = timed;
        due
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn port() -> TextPort {
        TextPort { id: 1, tx: crossbeam_channel::unbounded().0, wake: None }
    }

    #[test]
    fn arrival_order_cancellation_and_timeouts() {
        let t0 = Instant::now();
        let (q, r) = (QueueName::named("q"), QueueName::named("r"));
        let mut w = WaitTable::default();
        for c in 1..=3 {
            assert!(w.add(ConnId(c), q.clone(), port(), t0 + Duration::from_secs(c)).0);
        }
        assert!(w.remove(ConnId(2)).is_some());
        assert_eq!(w.pop(&q.0).map(|x| x.conn), Some(ConnId(1)));
        assert!(matches!(w.check(ConnId(3), t0), WaitCheck::None), "not its time: a replaced timer");
        assert!(matches!(w.check(ConnId(3), t0 + Duration::from_secs(3)), WaitCheck::Lapsed(_)));
        w.add(ConnId(4), r.clone(), port(), t0 + Duration::from_secs(1));
        w.remove(ConnId(4));
        assert!(!w.add(ConnId(4), r.clone(), port(), t0 + Duration::from_secs(5)).0, "its timer is armed");
        let due = w.check(ConnId(4), t0 + Duration::from_secs(1));
        assert!(matches!(due, WaitCheck::NotBefore(d) if d == t0 + Duration::from_secs(5)));
        assert!(w.remove(ConnId(4)).is_some());
        assert!(!w.has(&q.0) && w.is_empty(), "the line goes with its last wait");
        let (arm, displaced) = w.add(ConnId(1), r.clone(), port(), t0);
        assert!(arm, "an earlier deadline than the armed one needs its own timer");
        assert!(displaced.is_none());
        let (arm, _) = w.add(ConnId(1), r.clone(), port(), t0 + Duration::from_secs(9));
        assert!(!arm, "a later one is re-armed when the earlier fires");
        let (_, displaced) = w.add(ConnId(1), q.clone(), port(), t0);
        assert_eq!(displaced.map(|x| x.queue), Some(r.clone()));
        assert!(!w.has(&r.0) && w.has(&q.0) && w.len() == 1);
        assert_eq!(w.queues().collect::<Vec<_>>(), [&q]);
    }

    #[test]
    fn skipped_places_do_not_pile_up() {
        let t0 = Instant::now();
        let q = QueueName::named("q");
        let mut w = WaitTable::default();
        w.add(ConnId(0), q.clone(), port(), t0);
        for c in 1..1000 {
            w.add(ConnId(c), q.clone(), port(), t0);
            w.remove(ConnId(c));
        }
        assert!(w.lines[&q].places.len() <= 2 * w.lines[&q].live + 17);
        assert_eq!(w.pop(&q.0).map(|x| x.conn), Some(ConnId(0)));
    }
}
