//! [`OfferTable`]: jobs this shard has offered to text connections
//! (docs/text-protocol.md "The offer"), one per connection, until ACK/DCL/DEL,
//! the connection's end, or the offer timeout. Data and its rules only: the
//! handlers in `text.rs` decide what to do.

use std::collections::{HashMap, HashSet};
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

/// What the offer timer of a connection finds.
#[derive(Debug)]
pub enum OfferCheck {
    /// The connection holds no offer: the timer is dropped.
    None,
    /// The offer is not due yet: re-arm the timer for this deadline.
    NotBefore(Instant),
    /// The offer lapsed and was taken out.
    Lapsed(Box<Offer>),
}

/// The offers of one shard, by connection.
#[derive(Debug)]
pub struct OfferTable {
    shard: usize,
    by_conn: HashMap<ConnId, Offer>,
    /// Offers held per queue (for STATUS without a scan).
    per_queue: HashMap<QueueName, usize>,
    next_seq: u64,
    /// Connections with an armed timeout timer: at most one timer per
    /// connection, re-armed when it fires early, so answered offers leave
    /// no timers behind to pile up.
    timed: HashSet<ConnId>,
}

impl OfferTable {
    /// The offers of shard `shard` (its index goes into every [`OfferId`]).
    pub fn new(shard: usize) -> OfferTable {
        OfferTable { shard, by_conn: HashMap::new(), per_queue: HashMap::new(), next_seq: 0, timed: HashSet::new() }
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
        (id, self.timed.insert(conn), displaced)
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
        self.timed.remove(&conn);
        let Some(deadline) = self.by_conn.get(&conn).map(|o| o.deadline) else { return OfferCheck::None };
        if deadline > now {
            self.timed.insert(conn);
            return OfferCheck::NotBefore(deadline);
        }
        match self.remove(conn) {
            Some(offer) => OfferCheck::Lapsed(Box::new(offer)),
            None => OfferCheck::None,
        }
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
