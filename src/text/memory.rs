//! [`MemoryBackend`]: the text backend contract in one mutex, for tests and
//! for running the text front end alone.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::backend::{ConnId, Offer, OfferHandle, TextBackend};
use crate::protocol::text::ErrorCode;

/// Queues as `VecDeque`s behind one `Mutex`, with offer tracking. Offer
/// timeouts are applied lazily: every call first returns lapsed offers to the
/// front of their queues, so a lapsed task is back before anyone can ask
/// for it.
#[derive(Debug)]
pub struct MemoryBackend {
    offer_timeout: Duration,
    max_queue_len: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    queues: HashMap<String, VecDeque<Vec<u8>>>,
    /// Live offers by id.
    offers: HashMap<u64, Held>,
    /// `(deadline, id)` in offer order; the timeout is fixed, so deadlines
    /// are ascending. Ids of answered offers are skipped when popped.
    deadlines: VecDeque<(Instant, u64)>,
    next_id: u64,
    shutting_down: bool,
    counts: MemoryCounts,
}

#[derive(Debug)]
struct Held {
    conn: ConnId,
    queue: String,
    data: Vec<u8>,
}

/// What happened to offers, for test assertions.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MemoryCounts {
    /// Tasks accepted with ACK.
    pub acked: u64,
    /// Tasks declined with DCL.
    pub declined: u64,
    /// Tasks deleted with DEL.
    pub deleted: u64,
    /// Offers returned by `release`.
    pub released: u64,
    /// Offers returned by their timeout.
    pub timed_out: u64,
}

impl MemoryBackend {
    /// A backend whose offers lapse after `offer_timeout` and whose queues
    /// hold at most `max_queue_len` waiting tasks (SCHED past it:
    /// `QueueFull`).
    pub fn new(offer_timeout: Duration, max_queue_len: usize) -> MemoryBackend {
        MemoryBackend { offer_timeout, max_queue_len, state: Mutex::new(State::default()) }
    }

    /// The waiting tasks of `queue`, front first (after applying lapsed offers).
    pub fn queue(&self, queue: &str) -> Vec<Vec<u8>> {
        let mut s = self.state.lock();
        s.expire(Instant::now());
        s.queues.get(queue).map(|q| q.iter().cloned().collect()).unwrap_or_default()
    }

    /// How many offers are held now (after applying lapsed offers).
    pub fn offers_held(&self) -> usize {
        let mut s = self.state.lock();
        s.expire(Instant::now());
        s.offers.len()
    }

    /// The counters so far.
    pub fn counts(&self) -> MemoryCounts {
        self.state.lock().counts
    }

    /// Starts or stops draining: SCHED and ASK get `ShuttingDown`.
    pub fn set_shutting_down(&self, on: bool) {
        self.state.lock().shutting_down = on;
    }

    /// Takes the live offer `handle` of `conn` out of the table.
    fn take(&self, conn: ConnId, handle: OfferHandle) -> Result<(StateGuard<'_>, Held), ErrorCode> {
        let mut s = self.state.lock();
        s.expire(Instant::now());
        match s.offers.remove(&handle.id) {
            Some(held) if held.conn == conn => Ok((s, held)),
            Some(held) => {
                s.offers.insert(handle.id, held);
                Err(ErrorCode::NoTask)
            }
            None => Err(ErrorCode::NoTask),
        }
    }
}

type StateGuard<'a> = parking_lot::MutexGuard<'a, State>;

impl State {
    /// Returns every offer whose deadline is at or before `now` to the front
    /// of its queue, keeping their order.
    fn expire(&mut self, now: Instant) {
        let mut lapsed = Vec::new();
        while let Some(&(deadline, id)) = self.deadlines.front() {
            if deadline > now {
                break;
            }
            self.deadlines.pop_front();
            if let Some(held) = self.offers.remove(&id) {
                lapsed.push(held);
            }
        }
        for held in lapsed.into_iter().rev() {
            self.counts.timed_out += 1;
            self.queues.entry(held.queue).or_default().push_front(held.data);
        }
    }
}

impl TextBackend for MemoryBackend {
    fn sched(&self, queue: &str, data: Vec<u8>) -> Result<(), ErrorCode> {
        let mut s = self.state.lock();
        if s.shutting_down {
            return Err(ErrorCode::ShuttingDown);
        }
        let q = s.queues.entry(queue.to_string()).or_default();
        if q.len() >= self.max_queue_len {
            return Err(ErrorCode::QueueFull);
        }
        q.push_back(data);
        Ok(())
    }

    fn ask(&self, conn: ConnId, queue: &str) -> Result<Option<Offer>, ErrorCode> {
        let now = Instant::now();
        let mut s = self.state.lock();
        if s.shutting_down {
            return Err(ErrorCode::ShuttingDown);
        }
        s.expire(now);
        let Some(data) = s.queues.get_mut(queue).and_then(VecDeque::pop_front) else {
            return Ok(None);
        };
        s.next_id += 1;
        let handle = OfferHandle { id: s.next_id, deadline: now + self.offer_timeout };
        s.deadlines.push_back((handle.deadline, handle.id));
        s.offers.insert(handle.id, Held { conn, queue: queue.to_string(), data: data.clone() });
        Ok(Some(Offer { handle, data }))
    }

    fn ack(&self, conn: ConnId, offer: OfferHandle) -> Result<(), ErrorCode> {
        let (mut s, _) = self.take(conn, offer)?;
        s.counts.acked += 1;
        Ok(())
    }

    fn dcl(&self, conn: ConnId, offer: OfferHandle) -> Result<(), ErrorCode> {
        let (mut s, held) = self.take(conn, offer)?;
        s.counts.declined += 1;
        s.queues.entry(held.queue).or_default().push_back(held.data);
        Ok(())
    }

    fn del(&self, conn: ConnId, offer: OfferHandle) -> Result<(), ErrorCode> {
        let (mut s, _) = self.take(conn, offer)?;
        s.counts.deleted += 1;
        Ok(())
    }

    fn release(&self, conn: ConnId, offer: OfferHandle) -> bool {
        match self.take(conn, offer) {
            Ok((mut s, held)) => {
                s.counts.released += 1;
                s.queues.entry(held.queue).or_default().push_front(held.data);
                true
            }
            Err(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const C: ConnId = ConnId(1);

    fn offer(b: &MemoryBackend, q: &str) -> Offer {
        b.ask(C, q).unwrap().unwrap()
    }

    #[test]
    fn fifo_ack_dcl_del_release() {
        let b = MemoryBackend::new(Duration::from_secs(60), 10);
        for d in [b"a", b"b", b"c"] {
            b.sched("q", d.to_vec()).unwrap();
        }
        let a = offer(&b, "q");
        assert_eq!(a.data, b"a");
        b.dcl(C, a.handle).unwrap();
        assert_eq!(b.queue("q"), vec![b"b".to_vec(), b"c".to_vec(), b"a".to_vec()]);
        let bb = offer(&b, "q");
        assert!(b.release(C, bb.handle));
        assert!(!b.release(C, bb.handle));
        assert_eq!(b.ack(C, bb.handle), Err(ErrorCode::NoTask));
        assert_eq!(b.queue("q")[0], b"b");
        let bb = offer(&b, "q");
        assert_eq!(b.ack(ConnId(2), bb.handle), Err(ErrorCode::NoTask));
        b.del(C, bb.handle).unwrap();
        let counts = b.counts();
        assert_eq!((counts.declined, counts.released, counts.deleted), (1, 1, 1));
        assert_eq!(b.ask(C, "empty"), Ok(None));
    }

    #[test]
    fn lapsed_offers_return_to_the_front_in_order() {
        let b = MemoryBackend::new(Duration::ZERO, 10);
        for d in [b"a", b"b", b"c"] {
            b.sched("q", d.to_vec()).unwrap();
        }
        let a = offer(&b, "q");
        let _ = b.queue("q"); // expires `a`
        assert_eq!(b.ack(C, a.handle), Err(ErrorCode::NoTask));
        assert_eq!(b.queue("q"), vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]);
        assert_eq!(b.counts().timed_out, 1);
        assert_eq!(b.offers_held(), 0);
    }

    #[test]
    fn limits_and_draining() {
        let b = MemoryBackend::new(Duration::from_secs(60), 1);
        b.sched("q", b"a".to_vec()).unwrap();
        assert_eq!(b.sched("q", b"b".to_vec()), Err(ErrorCode::QueueFull));
        let a = offer(&b, "q");
        b.sched("q", b"b".to_vec()).unwrap();
        b.dcl(C, a.handle).unwrap();
        assert_eq!(b.queue("q").len(), 2, "a declined task is taken back above the limit");
        b.set_shutting_down(true);
        assert_eq!(b.sched("r", b"x".to_vec()), Err(ErrorCode::ShuttingDown));
        assert_eq!(b.ask(C, "q"), Err(ErrorCode::ShuttingDown));
    }
}
