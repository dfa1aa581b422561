//! Segment files: names, the 32-byte header, and what a shard knows about
//! each of its segments.
//!
//! A shard's log is the files `<data dir>/wal/shard-<n>/<number>.wal`,
//! numbers counting up from 1 (ten digits, so names sort by number). Each
//! starts with a header, little-endian:
//!
//! ```text
//! "EMQWAL" 0x00 0x01   format name and version (8 bytes)
//! shard u32            the shard that wrote it
//! shards u32           how many shards the router had then
//! number u32           the segment's number
//! seq_floor u64        the shard's acceptance count when the segment began
//! crc32c u32           of the 28 bytes before
//! ```
//!
//! then records ([`super::record`]) until its end. `new_segment` makes
//! one (header written and synced, the directory synced).

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Bytes of a segment header.
pub const SEGMENT_HEADER_BYTES: usize = 32;
const FORMAT: &[u8; 8] = b"EMQWAL\x00\x01";

/// A segment's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentHeader {
    /// The shard that wrote it.
    pub shard: u32,
    /// The router's shard count when it was written.
    pub shards: u32,
    /// The segment's number.
    pub number: u32,
    /// The shard's acceptance count when the segment began: every job id
    /// the shard gives out later has a larger sequence.
    pub seq_floor: u64,
}

impl SegmentHeader {
    /// The header's bytes.
    pub fn encode(&self) -> [u8; SEGMENT_HEADER_BYTES] {
        let mut out = [0u8; SEGMENT_HEADER_BYTES];
        out[..8].copy_from_slice(FORMAT);
        out[8..12].copy_from_slice(&self.shard.to_le_bytes());
        out[12..16].copy_from_slice(&self.shards.to_le_bytes());
        out[16..20].copy_from_slice(&self.number.to_le_bytes());
        out[20..28].copy_from_slice(&self.seq_floor.to_le_bytes());
        let crc = crc32c::crc32c(&out[..28]);
        out[28..].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// Reads a header from the start of `buf`; `None` when it is cut short,
    /// of another format or damaged.
    pub fn decode(buf: &[u8]) -> Option<SegmentHeader> {
        let b = buf.get(..SEGMENT_HEADER_BYTES)?;
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        if &b[..8] != FORMAT || crc32c::crc32c(&b[..28]) != u32_at(28) {
            return None;
        }
        let mut seq = [0u8; 8];
        seq.copy_from_slice(&b[20..28]);
        Some(SegmentHeader {
            shard: u32_at(8),
            shards: u32_at(12),
            number: u32_at(16),
            seq_floor: u64::from_le_bytes(seq),
        })
    }
}

/// The directory of shard `shard`'s log under the log root (`<data dir>/wal`).
pub fn shard_dir(root: &Path, shard: usize) -> PathBuf {
    root.join(format!("shard-{shard}"))
}

/// The file of segment `number` in a shard's directory.
pub fn segment_path(dir: &Path, number: u32) -> PathBuf {
    dir.join(format!("{number:010}.wal"))
}

/// The segment number a file name stands for (`0000000042.wal` → 42).
pub fn parse_segment_name(name: &str) -> Option<u32> {
    let digits = name.strip_suffix(".wal")?;
    if digits.len() != 10 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The shard index a directory name stands for (`shard-3` → 3).
pub fn parse_shard_dir_name(name: &str) -> Option<usize> {
    let digits = name.strip_prefix("shard-")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// What a shard tracks per segment of its log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SegmentInfo {
    /// Bytes in the file (header included).
    pub bytes: u64,
    /// Jobs whose latest `Accepted` record is in this segment and that are
    /// not done: waiting, offered, in flight, waiting for a retry or dead.
    pub live: u64,
    /// Bytes of those jobs' `Accepted` records.
    pub live_bytes: u64,
    /// Older segments holding records that records here cancel (`Done`)
    /// or supersede (an `Accepted` copied forward). This segment may only
    /// be deleted once they are: deleted first, it would take those
    /// records' cancellation with it, and a finished job would come back at
    /// the next start.
    pub older: BTreeSet<u32>,
    /// The file's device and inode as the log made or found it (`None`:
    /// not known): the periodic check tells a segment replaced by another
    /// file from the log's own.
    pub file: Option<(u64, u64)>,
    /// The log position just past the last copy of one of its jobs moved
    /// forward out of it (compaction, a requeue with a setback, a burial,
    /// an unburial): the segment may only go once that copy is synced.
    pub moved_upto: u64,
    /// The segment is dead and its file was cut to its header (its
    /// records gone) because the log could not write the `held` file that
    /// must come before a deletion (a full disk); it is deleted later.
    pub hollow: bool,
}

impl SegmentInfo {
    /// Whether the segment can be deleted (unless it is the current one):
    /// no live job, and every older segment it cancels records of is gone.
    pub fn is_dead(&self) -> bool {
        self.live == 0 && self.older.is_empty()
    }
}

/// The device and inode of an open file (`None` if `fstat` fails).
pub fn file_id(file: &File) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    file.metadata().ok().map(|m| (m.dev(), m.ino()))
}

/// Creates segment `number` in `dir` with its header, synced, and syncs the
/// directory so the file stays after a crash.
pub(super) fn new_segment(
    dir: &Path,
    shard: usize,
    shards: usize,
    number: u32,
    seq_floor: u64,
) -> Result<File, super::WalError> {
    let path = segment_path(dir, number);
    let header = SegmentHeader { shard: shard as u32, shards: shards as u32, number, seq_floor };
    let file = OpenOptions::new().create_new(true).write(true).open(&path).map_err(super::WalError::io(&path))?;
    let made = file
        .write_all_at(&header.encode(), 0)
        .and_then(|()| file.sync_data())
        .map_err(super::WalError::io(&path))
        .and_then(|()| super::dir::sync_dir(dir));
    if let Err(e) = made {
        // Not left half made: the next try creates it again.
        let _ = std::fs::remove_file(&path);
        return Err(e);
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_damage_is_refused() {
        let h = SegmentHeader { shard: 3, shards: 4, number: 17, seq_floor: 1 << 40 };
        let bytes = h.encode();
        assert_eq!(SegmentHeader::decode(&bytes), Some(h));
        for i in 0..SEGMENT_HEADER_BYTES {
            let mut bad = bytes;
            bad[i] ^= 0x10;
            assert_eq!(SegmentHeader::decode(&bad), None, "flip at {i}");
        }
        assert_eq!(SegmentHeader::decode(&bytes[..31]), None);
    }

    #[test]
    fn names() {
        let dir = shard_dir(Path::new("/d/wal"), 2);
        assert_eq!(segment_path(&dir, 42), Path::new("/d/wal/shard-2/0000000042.wal"));
        assert_eq!(parse_segment_name("0000000042.wal"), Some(42));
        assert_eq!(parse_segment_name("42.wal"), None);
        assert_eq!(parse_segment_name("0000000042.wal.tmp"), None);
        assert_eq!(parse_shard_dir_name("shard-12"), Some(12));
        assert_eq!(parse_shard_dir_name("shard-"), None);
        assert_eq!(parse_shard_dir_name("shard-1x"), None);
    }
}
