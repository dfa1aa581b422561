//! Identifiers shared by every layer (protocol front ends, shards, admin,
//! metrics): newtypes, not aliases, so a queue name cannot be passed where a
//! peer identity is expected. Bytes are kept as they arrived: names and
//! identities from the network are never assumed to be UTF-8.
//!
//! Names, identities and msgids are [`InlineBytes`]: up to 40 bytes live
//! inside the value (a Python peer's identities and msgids are 36-byte uuid
//! texts), so copying one between threads costs no allocation.
//!
//! Hashing: maps keyed by these use [`FastMap`], foldhash seeded at random
//! per process. Keys come from the network, so the seed matters (an
//! attacker cannot precompute colliding names); the broker never shows
//! hash order (admin answers are sorted), which keeps the seed unobservable.

use std::borrow::Borrow;
use std::fmt;
use std::hash::BuildHasher;

use smallvec::SmallVec;

/// The shard that owns `key` (a queue name or a worker identity):
/// `hash(key) % shards` (DESIGN "Queue state lives on one shard"). A fixed
/// seed, so the same on every run of the same build; an attacker choosing
/// names can only unbalance shards, which no map depends on. `shards` 0
/// counts as 1.
pub fn shard_of(key: &[u8], shards: usize) -> usize {
    (foldhash::fast::FixedState::with_seed(0).hash_one(key) % shards.max(1) as u64) as usize
}

/// Bytes kept inline up to 40 bytes, on the heap beyond.
pub type InlineBytes = SmallVec<[u8; 40]>;

/// A hash map with foldhash, seeded at random per process (see the module docs).
pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// A hash set with foldhash, seeded at random per process.
pub type FastSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

macro_rules! byte_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub InlineBytes);

        impl $name {
            /// The bytes.
            pub fn as_bytes(&self) -> &[u8] {
                &self.0
            }
        }

        impl From<&[u8]> for $name {
            fn from(bytes: &[u8]) -> $name {
                $name(InlineBytes::from_slice(bytes))
            }
        }

        impl From<Vec<u8>> for $name {
            fn from(bytes: Vec<u8>) -> $name {
                $name(InlineBytes::from_vec(bytes))
            }
        }

        impl Borrow<[u8]> for $name {
            fn borrow(&self) -> &[u8] {
                &self.0
            }
        }
    };
}

byte_id! {
    /// A queue name: bytes as they arrive in REQUEST frame 4 or a text `@queue`.
    QueueName
}

byte_id! {
    /// A ZeroMQ peer identity: opaque bytes (36-byte uuid text for Python
    /// peers, 5 binary bytes for a peer that sets none).
    PeerId
}

byte_id! {
    /// An eMQP message id (frame frame 3): opaque bytes chosen by the sender (a
    /// uuid4 text for Python peers). Not unique: clients may repeat them, so
    /// the broker tracks jobs by [`JobId`].
    MsgId
}

impl QueueName {
    /// The queue named by `s`.
    pub fn named(s: &str) -> QueueName {
        QueueName::from(s.as_bytes())
    }
}

/// A unique number per worker registration: a re-INFORM from the same
/// identity gets a new key, so stale messages about the old entry are told
/// apart from the new one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkerKey(pub u64);

/// A text-protocol connection, unique for the router's lifetime (log field
/// `conn`, shown as `text-N`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u64);

/// The broker's own id of an accepted job, unique for the router's
/// lifetime whatever msgids clients send: the shard that accepted the job
/// (low 16 bits) and that shard's acceptance count (the rest).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobId(pub u64);

impl JobId {
    /// The `seq`-th job accepted by shard `shard` (`shard` < 65,536, the
    /// router's shard limit).
    pub fn new(shard: usize, seq: u64) -> JobId {
        JobId((seq << 16) | (shard as u64 & 0xffff))
    }

    /// The index of the shard that accepted the job (and whose write-ahead
    /// log holds its records).
    pub fn shard(self) -> usize {
        (self.0 & 0xffff) as usize
    }

    /// The accepting shard's sequence number of the job (from 1).
    pub fn seq(self) -> u64 {
        self.0 >> 16
    }

    /// The id that [`JobId`]'s `Display` shows as `text` (`<shard>-<seq>`),
    /// if `text` is one (shard below 65,536, seq below 2^48).
    pub fn parse(text: &str) -> Option<JobId> {
        let (shard, seq) = text.trim().split_once('-')?;
        let (shard, seq): (u64, u64) = (shard.parse().ok()?, seq.parse().ok()?);
        (shard <= 0xffff && seq < (1 << 48)).then(|| JobId::new(shard as usize, seq))
    }
}

/// `<shard>-<seq>`, as logs show it (`job=0-17`).
impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.shard(), self.seq())
    }
}

/// A text offer: the shard holding it and that shard's offer number, so an
/// answer finds its shard and a stale answer is told apart from a newer
/// offer to the same connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OfferId {
    /// Index of the shard that holds the offer.
    pub shard: usize,
    /// The shard's offer sequence number.
    pub seq: u64,
}

/// Shows bytes as text when they are UTF-8, escaped otherwise.
pub fn show(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) => s.to_string(),
        Err(_) => bytes.escape_ascii().to_string(),
    }
}

/// Bytes for a log line: escaped, cut at 512 bytes (with the length noted).
pub fn cut(bytes: &[u8]) -> String {
    let shown = bytes[..bytes.len().min(512)].escape_ascii().to_string();
    if bytes.len() > 512 {
        format!("{shown}…({} bytes)", bytes.len())
    } else {
        shown
    }
}

macro_rules! show_bytes {
    ($($t:ident),*) => {$(
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&show(&self.0))
            }
        }

        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:?}", show(&self.0))
            }
        }
    )*};
}

show_bytes!(QueueName, PeerId, MsgId);

impl fmt::Display for ConnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "text-{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_forms() {
        assert_eq!(QueueName::named("email").to_string(), "email");
        assert_eq!(PeerId::from(&[0xff, b'a'][..]).to_string(), "\\xffa");
        assert_eq!(ConnId(7).to_string(), "text-7");
        assert_eq!(cut(&[b'x'; 600]).len(), 512 + "…(600 bytes)".len());
    }

    #[test]
    fn job_ids_of_two_shards_differ() {
        assert_ne!(JobId::new(0, 1), JobId::new(1, 1));
        assert_eq!(JobId::new(3, 5).0 & 0xffff, 3);
        assert_eq!((JobId::new(3, 5).shard(), JobId::new(3, 5).seq()), (3, 5));
        assert_eq!(JobId::new(3, 5).to_string(), "3-5");
    }
}
