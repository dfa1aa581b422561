//! [`OfferTable`]: jobs this shard has offered to text connections
//! (docs/text-protocol.md "The offer"), one per connection, until ACK/DCL/DEL,
//! the connection's end, or the offer timeout. Data and its rules only: the
//! handlers in `text.rs` decide what to do.

use std::collections::HashMap;
use std::time::Instant;

use crate::broker::types::Job;
use crate::ids::{ConnId, OfferId, QueueName};

/// A job offered to a text connection.
#[derive(Debug)]
pub struct Offer {
    /// Its queue.
    pub queue: QueueName,
    /// The job.
    pub job: Job,
    /// The offer's id (answers must name it).
    pub id: OfferId,
    /// When it was offered.
    pub since: Instant,
    /// When it goes back to its queue unless answered.
    pub deadline: Instant,
}

/// What a connection's timer finds when it fires (offers here, long-poll
/// waits in `waits.rs`).
#[derive(Debug)]
pub enum Due<T> {
    /// The connection holds nothing timed: the timer is dropped.
    None,
    /// Not due yet: re-arm the timer for this deadline.
    NotBefore(Instant),
    /// Due: taken out of its table.
    Lapsed(Box<T>),
}

/// What the offer timer of a connection finds.
pub type OfferCheck = Due<Offer>;

/// The timers of one kind armed per connection: at most one per
/// connection at a time (a new one only when it must fire earlier), re-armed
/// when it fires early, so entries answered before their deadline leave no
/// timers behind to pile up.
#[derive(Debug, Default)]
pub struct ConnTimers(HashMap<ConnId, Instant>);

impl ConnTimers {
    /// Notes that `conn` needs its timer at `deadline`; whether a timer must
    /// be armed (none is armed, or only a later one).
    pub fn arm(&mut self, conn: ConnId, deadline: Instant) -> bool {
        match self.0.get(&conn) {
            Some(armed) if *armed <= deadline => false,
            _ => {
                self.0.insert(conn, deadline);
                true
            }
        }
    }

    /// `conn`'s timer fired at `now`; `deadline` is that of what it holds
    /// (if anything), and `take` takes it out of its table once due. A timer
    /// replaced by an earlier one finds nothing to do.
    pub fn fired<T>(
        &mut self,
        conn: ConnId,
        now: Instant,
        deadline: Option<Instant>,
        take: impl FnOnce() -> Option<T>,
    ) -> Due<T> {
        match self.0.get(&conn) {
            Some(armed) if *armed <= now => self.0.remove(&conn),
            _ => return Due::None,
        };
        let Some(deadline) = deadline else { return Due::None };
        if deadline > now {
            self.0.insert(conn, deadline);
            return Due::NotBefore(deadline);
        }
        take().map_or(Due::None, |t| Due::Lapsed(Box::new(t)))
    }
}

/// The offers of one shard, by connection.
#[derive(Debug)]
pub struct OfferTable {
    shard: usize,
    by_conn: HashMap<ConnId, Offer>,
    /// Offers held per queue (for STATUS without a scan).
    per_queue: HashMap<QueueName, usize>,
    next_seq: u64,
    /// Connections with an armed timeout timer.
    timed: ConnTimers,
}

impl OfferTable {
    /// The offers of shard `shard` (its index goes into every [`OfferId`]).
    pub fn new(shard: usize) -> OfferTable {
        OfferTable {
            shard,
            by_conn: HashMap::new(),
            per_queue: HashMap::new(),
            next_seq: 0,
            timed: ConnTimers::default(),
        }
    }

    /// Offers `job` of `queue` to `conn` until `deadline`. Returns the
    /// offer's id, whether a timer must be armed for the connection, and an
    /// offer the connection still held (the front end allows one offer at a
    /// time; a displaced one is handed back, never lost).
    pub fn offer(
        &mut self,
        conn: ConnId,
        queue: QueueName,
        job: Job,
        now: Instant,
        deadline: Instant,
    ) -> (OfferId, bool, Option<Offer>) {
        self.next_seq += 1;
        let id = OfferId { shard: self.shard, seq: self.next_seq };
        *self.per_queue.entry(queue.clone()).or_default() += 1;
        let displaced = self.by_conn.insert(conn, Offer { queue, job, id, since: now, deadline });
        if let Some(old) = &displaced {
            self.uncount(&old.queue);
        }
        (id, self.timed.arm(conn, deadline), displaced)
    }

    /// Offers held now on `queue`.
    pub fn held(&self, queue: &QueueName) -> usize {
        self.per_queue.get(queue).copied().unwrap_or(0)
    }

    fn uncount(&mut self, queue: &QueueName) {
        if let Some(n) = self.per_queue.get_mut(queue) {
            *n -= 1;
            if *n == 0 {
                self.per_queue.remove(queue);
            }
        }
    }

    fn remove(&mut self, conn: ConnId) -> Option<Offer> {
        let offer = self.by_conn.remove(&conn)?;
        self.uncount(&offer.queue);
        Some(offer)
    }

    /// Takes out `conn`'s offer if it is offer `id` (else nothing changes).
    pub fn take(&mut self, conn: ConnId, id: OfferId) -> Option<Offer> {
        if self.by_conn.get(&conn).is_some_and(|o| o.id == id) {
            self.remove(conn)
        } else {
            None
        }
    }

    /// The connection's offer timer fired at `now`.
    pub fn check(&mut self, conn: ConnId, now: Instant) -> OfferCheck {
        let deadline = self.by_conn.get(&conn).map(|o| o.deadline);
        let mut timed = std::mem::take(&mut self.timed);
        let due = timed.fired(conn, now, deadline, || self.remove(conn));
        self.timed = timed;
        due
    }

    /// Every offer with its connection (shutdown log, tests).
    pub fn iter(&self) -> impl Iterator<Item = (&ConnId, &Offer)> {
        self.by_conn.iter()
    }

    /// Offers held now.
    pub fn len(&self) -> usize {
        self.by_conn.len()
    }

    /// Whether no offer is held.
    pub fn is_empty(&self) -> bool {
        self.by_conn.is_empty()
    }
}
