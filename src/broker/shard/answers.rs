//! [`PendingAnswers`]: which client sent which SCHEDULE/UNSCHEDULE, so that
//! the scheduler's answer (an acceptance `REPLY`, or `ERROR <CODE> <text>`)
//! goes back to it (shard 0 only). Data and its rules only: the handlers in
//! `scheduling.rs` decide what to do.
//!
//! Entries are keyed by `(scheduler, msgid)`: msgids come from clients and
//! are not unique, so two clients' SCHEDULEs with one msgid to one
//! scheduler wait in a FIFO, and answers (which a scheduler sends in the
//! order it got the messages) complete the oldest. At most
//! [`limits::MAX_PENDING_SCHEDULE_ANSWERS`] wait at once; each is forgotten
//! [`limits::SCHEDULE_ANSWER_TIMEOUT`] after it was forwarded (an EventMQ
//! scheduler never answers). Every operation is O(1) amortized.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use crate::ids::{MsgId, PeerId};
use crate::limits;

#[derive(Debug)]
struct Waiting {
    seq: u64,
    client: PeerId,
}

/// The table is full: the SCHEDULE is refused (`ERROR BUSY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full;

/// Clients waiting for a scheduler's answer. See the module docs.
#[derive(Debug, Default)]
pub struct PendingAnswers {
    by_key: HashMap<(PeerId, MsgId), VecDeque<Waiting>>,
    /// Forwarding order, for expiry: `(when, key, seq)`. May hold entries
    /// already answered; they are skipped on expiry and dropped when the
    /// queue is compacted.
    order: VecDeque<(Instant, (PeerId, MsgId), u64)>,
    next_seq: u64,
    live: usize,
}

impl PendingAnswers {
    /// Remembers that `client` sent `msgid`, forwarded to `scheduler` at
    /// `now`.
    ///
    /// # Errors
    /// [`Full`] when [`limits::MAX_PENDING_SCHEDULE_ANSWERS`] are waiting.
    pub fn insert(&mut self, scheduler: PeerId, msgid: MsgId, client: PeerId, now: Instant) -> Result<(), Full> {
        if self.live >= limits::MAX_PENDING_SCHEDULE_ANSWERS {
            return Err(Full);
        }
        if self.order.len() >= 2 * limits::MAX_PENDING_SCHEDULE_ANSWERS {
            self.compact();
        }
        self.next_seq += 1;
        let key = (scheduler, msgid);
        self.by_key.entry(key.clone()).or_default().push_back(Waiting { seq: self.next_seq, client });
        self.order.push_back((now, key, self.next_seq));
        self.live += 1;
        Ok(())
    }

    /// The client waiting longest for `scheduler`'s answer to `msgid`, now
    /// answered.
    pub fn take(&mut self, scheduler: &PeerId, msgid: &MsgId) -> Option<PeerId> {
        let key = (scheduler.clone(), msgid.clone());
        let list = self.by_key.get_mut(&key)?;
        let waiting = list.pop_front()?;
        if list.is_empty() {
            self.by_key.remove(&key);
        }
        self.live -= 1;
        Some(waiting.client)
    }

    /// Forgets entries forwarded `timeout` or longer before `now`; returns
    /// how many were still waiting.
    pub fn expire(&mut self, now: Instant, timeout: Duration) -> usize {
        let mut expired = 0;
        while let Some((at, _, _)) = self.order.front() {
            if now.saturating_duration_since(*at) < timeout {
                break;
            }
            let Some((_, key, seq)) = self.order.pop_front() else { break };
            if let Some(list) = self.by_key.get_mut(&key) {
                if list.front().is_some_and(|w| w.seq == seq) {
                    list.pop_front();
                    self.live -= 1;
                    expired += 1;
                }
                if list.is_empty() {
                    self.by_key.remove(&key);
                }
            }
        }
        expired
    }

    /// Clients waiting now.
    pub fn len(&self) -> usize {
        self.live
    }

    /// Whether no client waits.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Drops answered entries from the expiry queue.
    fn compact(&mut self) {
        let by_key = &self.by_key;
        self.order.retain(|(_, key, seq)| by_key.get(key).is_some_and(|l| l.iter().any(|w| w.seq == *seq)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> PeerId {
        PeerId::from(s.as_bytes())
    }

    fn m(s: &str) -> MsgId {
        MsgId::from(s.as_bytes())
    }

    #[test]
    fn one_msgid_from_two_clients_answers_the_oldest_first() {
        let (mut t, now) = (PendingAnswers::default(), Instant::now());
        t.insert(p("s1"), m("x"), p("c1"), now).unwrap();
        t.insert(p("s1"), m("x"), p("c2"), now).unwrap();
        t.insert(p("s2"), m("x"), p("c3"), now).unwrap();
        assert_eq!(t.take(&p("s2"), &m("x")), Some(p("c3")));
        assert_eq!(t.take(&p("s1"), &m("x")), Some(p("c1")));
        assert_eq!(t.take(&p("s1"), &m("x")), Some(p("c2")));
        assert_eq!(t.take(&p("s1"), &m("x")), None);
        assert!(t.is_empty());
    }

    #[test]
    fn entries_expire_and_the_table_is_bounded() {
        let (mut t, now) = (PendingAnswers::default(), Instant::now());
        t.insert(p("s"), m("old"), p("c"), now).unwrap();
        t.insert(p("s"), m("new"), p("c"), now + Duration::from_secs(5)).unwrap();
        assert_eq!(t.expire(now + Duration::from_secs(10), Duration::from_secs(10)), 1);
        assert_eq!((t.take(&p("s"), &m("old")), t.len()), (None, 1));
        for i in 1..limits::MAX_PENDING_SCHEDULE_ANSWERS {
            t.insert(p("s"), m(&i.to_string()), p("c"), now).unwrap();
        }
        assert_eq!(t.insert(p("s"), m("one-too-many"), p("c"), now), Err(Full));
        // Answered entries free their place, and the expiry queue stays bounded.
        for round in 0..3 {
            for i in 1..limits::MAX_PENDING_SCHEDULE_ANSWERS {
                assert!(t.take(&p("s"), &m(&i.to_string())).is_some(), "round {round}");
                t.insert(p("s"), m(&i.to_string()), p("c"), now).unwrap();
            }
        }
        assert!(t.order.len() <= 2 * limits::MAX_PENDING_SCHEDULE_ANSWERS);
    }
}
