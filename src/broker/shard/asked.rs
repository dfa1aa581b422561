//! [`AskedQueues`]: the queue names a text client has ASKed for recently.
//! Such a queue counts as served, like one an eMQP worker declared, so an
//! eMQP REQUEST for it waits there instead of falling back to `default`
//! (text-protocol.md "One broker, one queue namespace"; README "Unknown
//! queues"), until `text_ask_grace` after the last ASK. Data and its rules
//! only: the handlers in `text.rs` and `flow.rs` use it.
//!
//! Bounded: at most `cap` names; names whose grace has passed are dropped
//! as new ones arrive, in the order their grace ends, at amortised constant
//! cost per ASK.

use std::collections::VecDeque;
use std::time::Instant;

use crate::ids::{FastMap, QueueName};

/// Recently asked queue names with the end of their grace.
#[derive(Debug)]
pub struct AskedQueues {
    /// Name → end of its grace.
    until: FastMap<QueueName, Instant>,
    /// `(end of grace when queued, name)`, oldest first. A name whose grace
    /// was extended since is queued again when its old entry comes up, so
    /// there is at most one entry per name.
    order: VecDeque<(Instant, QueueName)>,
    cap: usize,
    /// Names forgotten since the last [`AskedQueues::sweep`].
    forgotten: usize,
}

/// [`AskedQueues::touch`] found the table full of names in their grace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full;

impl AskedQueues {
    /// A table of at most `cap` names (at least one).
    pub fn new(cap: usize) -> AskedQueues {
        AskedQueues { until: FastMap::default(), order: VecDeque::new(), cap: cap.max(1), forgotten: 0 }
    }

    /// Records an ASK for `queue` at `now`: it stays known until `until`.
    ///
    /// # Errors
    /// [`Full`] when `queue` is new and every one of the `cap` names held is
    /// still in its grace; nothing changes then.
    pub fn touch(&mut self, queue: &QueueName, now: Instant, until: Instant) -> Result<(), Full> {
        if let Some(end) = self.until.get_mut(queue) {
            *end = until;
            return Ok(());
        }
        self.prune(now);
        if self.until.len() >= self.cap {
            return Err(Full);
        }
        self.until.insert(queue.clone(), until);
        self.order.push_back((until, queue.clone()));
        Ok(())
    }

    /// Whether `queue` was ASKed for within its grace, as of `now`.
    pub fn is_live(&self, queue: &[u8], now: Instant) -> bool {
        self.until.get(queue).is_some_and(|end| *end > now)
    }

    /// The names in their grace at `now`, in no order (STATUS lists them).
    /// Linear in the names held.
    pub fn live(&self, now: Instant) -> impl Iterator<Item = &QueueName> {
        self.until.iter().filter(move |(_, end)| **end > now).map(|(name, _)| name)
    }

    /// Names held (in their grace or not yet dropped).
    pub fn len(&self) -> usize {
        self.until.len()
    }

    /// Whether no name is held.
    pub fn is_empty(&self) -> bool {
        self.until.is_empty()
    }

    /// Forgets the names whose grace is over and gives back the memory of a
    /// burst (the queue sweep calls this, so that a burst of one-off names
    /// is freed even when no new name is asked for). Returns how many names
    /// were forgotten since the last sweep, here or as new names arrived.
    pub fn sweep(&mut self, now: Instant) -> usize {
        self.prune(now);
        if self.until.capacity() > 4 * self.until.len().max(64) {
            self.until.shrink_to_fit();
            self.order.shrink_to_fit();
        }
        std::mem::take(&mut self.forgotten)
    }

    fn prune(&mut self, now: Instant) {
        while let Some((queued, _)) = self.order.front() {
            if *queued > now {
                return;
            }
            let Some((_, name)) = self.order.pop_front() else { return };
            match self.until.get(&name) {
                Some(end) if *end > now => self.order.push_back((*end, name)),
                _ => {
                    self.until.remove(&name);
                    self.forgotten += 1;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn grace_extends_and_ends_and_the_cap_holds() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let (a, b, c) = (QueueName::named("a"), QueueName::named("b"), QueueName::named("c"));
        let mut asked = AskedQueues::new(2);
        assert_eq!(asked.touch(&a, t0, t0 + s(10)), Ok(()));
        assert_eq!(asked.touch(&b, t0, t0 + s(10)), Ok(()));
        assert_eq!(asked.touch(&c, t0 + s(1), t0 + s(11)), Err(Full));
        assert_eq!(asked.touch(&a, t0 + s(5), t0 + s(15)), Ok(()), "a known name is always refreshed");
        assert!(asked.is_live(&a.0, t0 + s(12)) && !asked.is_live(&b.0, t0 + s(12)));
        assert_eq!(asked.live(t0 + s(12)).collect::<Vec<_>>(), [&a], "b is held but its grace is over");
        assert_eq!(asked.touch(&c, t0 + s(12), t0 + s(22)), Ok(()), "b's grace is over: its place is free");
        assert_eq!(asked.len(), 2);
        assert!(!asked.is_live(&b.0, t0 + s(12)));
        assert_eq!(asked.touch(&b, t0 + s(16), t0 + s(26)), Ok(()), "a is over too");
        assert!(asked.is_live(&c.0, t0 + s(16)) && asked.is_live(&b.0, t0 + s(16)) && !asked.is_live(&a.0, t0 + s(16)));
    }
}
