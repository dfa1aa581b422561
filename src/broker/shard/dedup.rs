//! The duplicate window (docs/failover.md "Duplicates"): the keys of the
//! REQUESTs a shard accepted lately, so that a REQUEST sent again (the
//! emq client re-sends an unanswered REQUEST after a lost connection, with
//! the same msgid and routing identity) makes no second job.
//!
//! * Key: the client's ZeroMQ routing identity as the router saw it (at
//!   most 255 bytes, ZeroMQ's bound) and the REQUEST's msgid (at most
//!   [`limits::MAX_MSGID_BYTES`]).
//! * Where: on the shard that owns the queue the REQUEST names (the shard
//!   the I/O thread hands it to), so one lookup per REQUEST on that
//!   shard's thread, no lock.
//! * Bounds: a key is kept [`limits::DEDUP_WINDOW`] after its acceptance
//!   (wall clock, ms since the Unix epoch, so the same across a restart)
//!   and a shard keeps at most [`limits::DEDUP_MAX_KEYS`]: past it the
//!   oldest key goes first (counted by the caller, `dedup_evicted`). Each
//!   operation is O(1) amortised: keys leave in acceptance order from the
//!   front of a queue.
//!
//! Keys are inserted in acceptance order, so the front of the order queue
//! is the oldest; a wall clock stepped back only makes some keys stay
//! longer, never past the count bound.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::ids::{FastMap, JobId};
use crate::limits;

/// Longest key: a length byte, an identity of 255 bytes and a msgid of
/// [`limits::MAX_MSGID_BYTES`].
const MAX_KEY_BYTES: usize = 1 + 255 + limits::MAX_MSGID_BYTES;

/// One remembered REQUEST.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    /// The job it made (the id it had then: a `DCL` or a restart in a new
    /// layout gives a job a new id).
    pub job: JobId,
    /// When it was accepted, in ms since the Unix epoch.
    pub at_unix_ms: u64,
}

/// A shard's duplicate window (see the module docs).
#[derive(Debug)]
pub struct DedupWindow {
    keys: FastMap<Arc<[u8]>, Seen>,
    /// The same keys, oldest first.
    order: VecDeque<Arc<[u8]>>,
    window_ms: u64,
    max: usize,
}

impl Default for DedupWindow {
    fn default() -> Self {
        DedupWindow::new(limits::DEDUP_WINDOW, limits::DEDUP_MAX_KEYS)
    }
}

/// Writes the key of (`client`, `msgid`) into `buf`: the client's length
/// byte, the client, the msgid; `None` when either is longer than a key
/// holds (neither can be, see [`MAX_KEY_BYTES`]).
fn key<'a>(client: &[u8], msgid: &[u8], buf: &'a mut [u8; MAX_KEY_BYTES]) -> Option<&'a [u8]> {
    let client_len = u8::try_from(client.len()).ok()?;
    if msgid.len() > limits::MAX_MSGID_BYTES {
        return None;
    }
    let end = 1 + client.len() + msgid.len();
    buf[0] = client_len;
    buf[1..1 + client.len()].copy_from_slice(client);
    buf[1 + client.len()..end].copy_from_slice(msgid);
    Some(&buf[..end])
}

impl DedupWindow {
    /// A window keeping keys `window` long, at most `max` of them (at
    /// least 1).
    pub fn new(window: std::time::Duration, max: usize) -> DedupWindow {
        let window_ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX);
        DedupWindow { keys: FastMap::default(), order: VecDeque::new(), window_ms, max: max.max(1) }
    }

    /// Keys remembered now.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether no key is remembered.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Forgets the keys accepted `window` or more before `now_unix_ms`.
    pub fn expire(&mut self, now_unix_ms: u64) {
        while let Some(front) = self.order.front() {
            let at = self.keys.get(front).map_or(0, |s| s.at_unix_ms);
            if at.saturating_add(self.window_ms) > now_unix_ms {
                break;
            }
            if let Some(k) = self.order.pop_front() {
                self.keys.remove(&k);
            }
        }
    }

    /// The REQUEST (`client`, `msgid`) accepted within the window before
    /// `now_unix_ms`, if one was (expired keys are forgotten first).
    pub fn find(&mut self, client: &[u8], msgid: &[u8], now_unix_ms: u64) -> Option<Seen> {
        self.expire(now_unix_ms);
        let mut buf = [0u8; MAX_KEY_BYTES];
        let k = key(client, msgid, &mut buf)?;
        self.keys.get(k).copied()
    }

    /// Remembers (`client`, `msgid`) as `seen` (a key already there keeps
    /// its first job); returns how many keys were forgotten early to stay
    /// within the count bound (0 or 1).
    pub fn insert(&mut self, client: &[u8], msgid: &[u8], seen: Seen) -> usize {
        let mut buf = [0u8; MAX_KEY_BYTES];
        let Some(k) = key(client, msgid, &mut buf) else { return 0 };
        if self.keys.contains_key(k) {
            return 0;
        }
        let mut evicted = 0;
        while self.keys.len() >= self.max {
            match self.order.pop_front() {
                Some(old) => {
                    self.keys.remove(&old);
                    evicted += 1;
                }
                None => break,
            }
        }
        let k: Arc<[u8]> = Arc::from(k);
        self.keys.insert(k.clone(), seen);
        self.order.push_back(k);
        evicted
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn seen(job: u64, at: u64) -> Seen {
        Seen { job: JobId(job), at_unix_ms: at }
    }

    #[test]
    fn a_key_is_found_within_the_window_and_not_after() {
        let mut w = DedupWindow::new(Duration::from_secs(600), 10);
        assert_eq!(w.insert(b"client-a", b"m1", seen(1, 1_000)), 0);
        assert_eq!(w.find(b"client-a", b"m1", 1_000 + 599_999), Some(seen(1, 1_000)));
        assert_eq!(w.find(b"client-b", b"m1", 1_000), None, "another identity, same msgid");
        assert_eq!(w.find(b"client-a", b"m2", 1_000), None, "same identity, another msgid");
        assert_eq!(w.find(b"client-a", b"m1", 1_000 + 600_000), None, "ten minutes on");
        assert!(w.is_empty());
    }

    #[test]
    fn identity_and_msgid_cannot_run_into_each_other() {
        let mut w = DedupWindow::new(Duration::from_secs(600), 10);
        w.insert(b"ab", b"c", seen(1, 0));
        assert_eq!(w.find(b"a", b"bc", 0), None);
        assert_eq!(w.find(b"ab", b"c", 0), Some(seen(1, 0)));
        w.insert(&[7u8; 255], &[9u8; 255], seen(2, 0));
        assert_eq!(w.find(&[7u8; 255], &[9u8; 255], 0), Some(seen(2, 0)));
        assert_eq!(w.insert(&[7u8; 256], b"m", seen(3, 0)), 0);
        assert_eq!(w.find(&[7u8; 256], b"m", 0), None, "an identity ZeroMQ cannot carry is never a key");
    }

    #[test]
    fn the_oldest_key_goes_first_past_the_count_and_is_counted() {
        let mut w = DedupWindow::new(Duration::from_secs(600), 3);
        for i in 0..3u64 {
            assert_eq!(w.insert(b"c", &i.to_le_bytes(), seen(i, i)), 0);
        }
        assert_eq!(w.insert(b"c", &0u64.to_le_bytes(), seen(9, 9)), 0, "a known key keeps its first job");
        assert_eq!(w.find(b"c", &0u64.to_le_bytes(), 3), Some(seen(0, 0)));
        assert_eq!(w.insert(b"c", &3u64.to_le_bytes(), seen(3, 3)), 1);
        assert_eq!(w.len(), 3);
        assert_eq!(w.find(b"c", &0u64.to_le_bytes(), 3), None, "the oldest was forgotten");
        assert_eq!(w.find(b"c", &1u64.to_le_bytes(), 3), Some(seen(1, 1)));
    }
}
