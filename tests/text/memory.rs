//! [`MemoryBackend`]: the text backend contract in one mutex, so the text
//! server's tests run without the broker's shards (test support).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use emq::broker::msg::{TextAnswer, TextCmd, TextOutcome};
use emq::ids::{ConnId, OfferId, QueueName};
use emq::protocol::text::ErrorCode;
use emq::text::TextBackend;
use parking_lot::Mutex;

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
    queues: HashMap<QueueName, VecDeque<Vec<u8>>>,
    /// Live offers by sequence number.
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
    queue: QueueName,
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
        s.queues.get(&QueueName::named(queue)).map(|q| q.iter().cloned().collect()).unwrap_or_default()
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

    /// Takes the live offer `id` of `conn` out of the table.
    fn take(&self, conn: ConnId, id: OfferId) -> Result<(StateGuard<'_>, Held), ErrorCode> {
        let mut s = self.state.lock();
        s.expire(Instant::now());
        match s.offers.remove(&id.seq) {
            Some(held) if held.conn == conn => Ok((s, held)),
            Some(held) => {
                s.offers.insert(id.seq, held);
                Err(ErrorCode::NoTask)
            }
            None => Err(ErrorCode::NoTask),
        }
    }

    fn sched(&self, queue: QueueName, data: Vec<u8>) -> TextOutcome {
        let mut s = self.state.lock();
        if s.shutting_down {
            return TextOutcome::Refused(ErrorCode::ShuttingDown);
        }
        let q = s.queues.entry(queue).or_default();
        if q.len() >= self.max_queue_len {
            return TextOutcome::Refused(ErrorCode::QueueFull);
        }
        q.push_back(data);
        TextOutcome::Done
    }

    fn ask(&self, conn: ConnId, queue: QueueName) -> TextOutcome {
        let now = Instant::now();
        let mut s = self.state.lock();
        if s.shutting_down {
            return TextOutcome::Refused(ErrorCode::ShuttingDown);
        }
        s.expire(now);
        let Some(data) = s.queues.get_mut(&queue).and_then(VecDeque::pop_front) else {
            return TextOutcome::Nope;
        };
        s.next_id += 1;
        let (id, deadline) = (OfferId { shard: 0, seq: s.next_id }, now + self.offer_timeout);
        s.deadlines.push_back((deadline, id.seq));
        s.offers.insert(id.seq, Held { conn, queue, data: data.clone() });
        TextOutcome::Offer { id, data, deadline }
    }

    fn answer(&self, conn: ConnId, offer: OfferId, answer: TextAnswer) -> Result<(), ErrorCode> {
        let (mut s, held) = self.take(conn, offer)?;
        match answer {
            TextAnswer::Ack => s.counts.acked += 1,
            TextAnswer::Del => s.counts.deleted += 1,
            TextAnswer::Dcl => {
                s.counts.declined += 1;
                s.queues.entry(held.queue).or_default().push_back(held.data);
            }
        }
        Ok(())
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
    fn call(&self, conn: ConnId, cmd: TextCmd) -> TextOutcome {
        match cmd {
            TextCmd::Sched { queue, data } => self.sched(queue, data),
            TextCmd::Ask { queue } => self.ask(conn, queue),
            TextCmd::Answer { offer, answer } => match self.answer(conn, offer, answer) {
                Ok(()) => TextOutcome::Done,
                Err(code) => TextOutcome::Refused(code),
            },
            TextCmd::Release { offer } => {
                self.release(conn, offer);
                TextOutcome::Done
            }
        }
    }

    fn release(&self, conn: ConnId, offer: OfferId) {
        if let Ok((mut s, held)) = self.take(conn, offer) {
            s.counts.released += 1;
            s.queues.entry(held.queue).or_default().push_front(held.data);
        }
    }
}

mod tests {
    use super::*;

    const C: ConnId = ConnId(1);

    fn q(name: &str) -> QueueName {
        QueueName::named(name)
    }

    fn offer(b: &MemoryBackend, queue: &str) -> (OfferId, Vec<u8>) {
        match b.call(C, TextCmd::Ask { queue: q(queue) }) {
            TextOutcome::Offer { id, data, .. } => (id, data),
            other => panic!("no offer: {other:?}"),
        }
    }

    fn answer(b: &MemoryBackend, conn: ConnId, offer: OfferId, answer: TextAnswer) -> TextOutcome {
        b.call(conn, TextCmd::Answer { offer, answer })
    }

    fn sched(b: &MemoryBackend, queue: &str, data: &[u8]) -> TextOutcome {
        b.call(C, TextCmd::Sched { queue: q(queue), data: data.to_vec() })
    }

    #[test]
    fn memory_backend_fifo_ack_dcl_del_release() {
        let b = MemoryBackend::new(Duration::from_secs(60), 10);
        for d in [b"a", b"b", b"c"] {
            assert_eq!(sched(&b, "q", d), TextOutcome::Done);
        }
        let (a, data) = offer(&b, "q");
        assert_eq!(data, b"a");
        assert_eq!(answer(&b, C, a, TextAnswer::Dcl), TextOutcome::Done);
        assert_eq!(b.queue("q"), vec![b"b".to_vec(), b"c".to_vec(), b"a".to_vec()]);
        let (bb, _) = offer(&b, "q");
        b.release(C, bb);
        b.release(C, bb);
        assert_eq!(b.counts().released, 1, "a second release changes nothing");
        assert_eq!(answer(&b, C, bb, TextAnswer::Ack), TextOutcome::Refused(ErrorCode::NoTask));
        assert_eq!(b.queue("q")[0], b"b");
        let (bb, _) = offer(&b, "q");
        assert_eq!(answer(&b, ConnId(2), bb, TextAnswer::Ack), TextOutcome::Refused(ErrorCode::NoTask));
        assert_eq!(answer(&b, C, bb, TextAnswer::Del), TextOutcome::Done);
        let counts = b.counts();
        assert_eq!((counts.declined, counts.released, counts.deleted), (1, 1, 1));
        assert_eq!(b.call(C, TextCmd::Ask { queue: q("empty") }), TextOutcome::Nope);
    }

    #[test]
    fn memory_backend_lapsed_offers_return_to_the_front_in_order() {
        let b = MemoryBackend::new(Duration::ZERO, 10);
        for d in [b"a", b"b", b"c"] {
            sched(&b, "q", d);
        }
        let (a, _) = offer(&b, "q");
        let _ = b.queue("q"); // expires `a`
        assert_eq!(answer(&b, C, a, TextAnswer::Ack), TextOutcome::Refused(ErrorCode::NoTask));
        assert_eq!(b.queue("q"), vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]);
        assert_eq!(b.counts().timed_out, 1);
        assert_eq!(b.offers_held(), 0);
    }

    #[test]
    fn memory_backend_limits_and_draining() {
        let b = MemoryBackend::new(Duration::from_secs(60), 1);
        sched(&b, "q", b"a");
        assert_eq!(sched(&b, "q", b"b"), TextOutcome::Refused(ErrorCode::QueueFull));
        let (a, _) = offer(&b, "q");
        sched(&b, "q", b"b");
        assert_eq!(answer(&b, C, a, TextAnswer::Dcl), TextOutcome::Done);
        assert_eq!(b.queue("q").len(), 2, "a declined task is taken back above the limit");
        b.set_shutting_down(true);
        assert_eq!(sched(&b, "r", b"x"), TextOutcome::Refused(ErrorCode::ShuttingDown));
        assert_eq!(b.call(C, TextCmd::Ask { queue: q("q") }), TextOutcome::Refused(ErrorCode::ShuttingDown));
    }
}
