//! The messages of a replicated log stream: a fixed header, then records
//! exactly as the local write-ahead log writes them (`crate::wal::record`,
//! each with its own checksum).
//!
//! ```text
//! "EMQJ" | version u8 = 1 | shard u16 | shards u16 | boot u32 | ticket u64 | part u16 | parts u16 | records…
//! ```
//!
//! All integers big-endian. `boot` grows with every start of a router on
//! the stream (above the highest boot found and the Unix time in seconds),
//! `ticket` with every batch the shard commits in that boot; a batch larger
//! than the server's max payload is `parts` messages. PubAcks arrive in any
//! order and a retried publish may land after a later batch, so replay
//! applies messages in `(boot, ticket, part)` order, not stream order.
//!
//! The messages of a repair's snapshot (every live job, `jslog::log`) carry
//! the NATS header [`SNAPSHOT_HEADER`]: at replay the last whole snapshot
//! supersedes every batch before it in that order, also one stored after
//! it in the stream (a publish given up, then stored late).

/// The magic bytes every message starts with.
pub const MAGIC: &[u8; 4] = b"EMQJ";
/// The format version.
pub const VERSION: u8 = 1;
/// Bytes of the header.
pub const HEADER_BYTES: usize = 4 + 1 + 2 + 2 + 4 + 8 + 2 + 2;
/// The NATS header (value `1`) on every message of a repair's snapshot.
pub const SNAPSHOT_HEADER: &str = "Emq-Snapshot";
/// The NATS header of a fence marker (`jslog` module docs, "Fencing"):
/// the message a start that took the router name publishes on its own
/// subject before it reads the stream. Its value is the new holder's JSON
/// identity (the lease's value); its payload is empty: it holds no batch
/// and replay skips it.
pub const FENCE_HEADER: &str = "Emq-Fence";

/// A message's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The shard whose log it is.
    pub shard: u16,
    /// The shard count of the layout it was written in.
    pub shards: u16,
    /// The router start that wrote it.
    pub boot: u32,
    /// The batch.
    pub ticket: u64,
    /// Which part of the batch (from 0).
    pub part: u16,
    /// How many parts the batch has.
    pub parts: u16,
}

impl Header {
    /// Appends the header to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.extend_from_slice(&self.shard.to_be_bytes());
        out.extend_from_slice(&self.shards.to_be_bytes());
        out.extend_from_slice(&self.boot.to_be_bytes());
        out.extend_from_slice(&self.ticket.to_be_bytes());
        out.extend_from_slice(&self.part.to_be_bytes());
        out.extend_from_slice(&self.parts.to_be_bytes());
    }

    /// The header of `msg` and the records after it.
    ///
    /// # Errors
    /// What is wrong: too short, another magic or version.
    pub fn decode(msg: &[u8]) -> Result<(Header, &[u8]), String> {
        if msg.len() < HEADER_BYTES {
            return Err(format!("{} bytes, shorter than the {HEADER_BYTES}-byte header", msg.len()));
        }
        let (head, records) = msg.split_at(HEADER_BYTES);
        if &head[..4] != MAGIC {
            return Err("not an emq log message (no EMQJ magic)".into());
        }
        if head[4] != VERSION {
            return Err(format!("format version {} (this emq reads {VERSION})", head[4]));
        }
        let u16_at = |i: usize| u16::from_be_bytes([head[i], head[i + 1]]);
        let mut b4 = [0u8; 4];
        b4.copy_from_slice(&head[9..13]);
        let mut b8 = [0u8; 8];
        b8.copy_from_slice(&head[13..21]);
        let h = Header {
            shard: u16_at(5),
            shards: u16_at(7),
            boot: u32::from_be_bytes(b4),
            ticket: u64::from_be_bytes(b8),
            part: u16_at(21),
            parts: u16_at(23),
        };
        if h.part >= h.parts {
            return Err(format!("part {} of {}", h.part, h.parts));
        }
        Ok((h, records))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_round_trips_and_a_bad_one_is_named() {
        let h = Header { shard: 3, shards: 4, boot: 1_700_000_000, ticket: u64::MAX - 1, part: 1, parts: 2 };
        let mut buf = Vec::new();
        h.encode(&mut buf);
        assert_eq!(buf.len(), HEADER_BYTES);
        buf.extend_from_slice(b"records");
        assert_eq!(Header::decode(&buf), Ok((h, &b"records"[..])));
        assert!(Header::decode(&buf[..10]).unwrap_err().contains("shorter"));
        let mut bad = buf.clone();
        bad[0] = b'X';
        assert!(Header::decode(&bad).unwrap_err().contains("magic"));
        let mut bad = buf.clone();
        bad[4] = 9;
        assert!(Header::decode(&bad).unwrap_err().contains("version 9"));
        let mut bad = buf;
        bad[22] = 5;
        assert!(Header::decode(&bad).unwrap_err().contains("part 5 of 2"));
    }
}
