//! Records of the write-ahead log: a pure codec over bytes (no files).
//!
//! Every record is a 10-byte header and a payload, integers little-endian:
//!
//! ```text
//! [magic 0xE7 u8][type u8][payload length u32][crc32c u32][payload]
//! ```
//!
//! The checksum (CRC-32C, Castagnoli) covers the type, the length and the
//! payload. Payloads:
//!
//! | type | record | payload |
//! |---|---|---|
//! | 1 | [`Record::Accepted`] | job id u64, redeliveries u8, flags u8 (bit 0: text origin, bit 1: fallback to `default`), the job's frames as [`JobFrames::bytes`] holds them |
//! | 2 | [`Record::Dispatched`] | job id u64 |
//! | 3 | [`Record::Requeued`] | job id u64, redeliveries u8 |
//! | 4 | [`Record::Done`] | job id u64 |
//! | 5 | [`Record::Buried`] | job id u64, setbacks u8, reason u8 ([`Setback::code`]), burial time u64 (ms since the Unix epoch) |
//! | 6 | [`Record::ClientKey`] | job id u64, acceptance time u64 (ms since the Unix epoch), client identity length u8, the identity, msgid length u8, the msgid |
//!
//! Type 6 is new with the router's duplicate window (docs/failover.md
//! "Duplicates"): it follows the `Accepted` record of an eMQP job the
//! router accepted from a REQUEST, and names who sent it. It is a record of
//! its own, not a second version of `Accepted`, so that `Accepted` keeps
//! its size ([`accepted_len`], which the logs' byte accounting and
//! compaction use) and a [`Job`] keeps its 40 bytes. A log written before
//! it decodes as before: its jobs have no key. A router older than type 6
//! reading a log that holds one takes it for damage (no downgrade).
//!
//! [`decode`] takes a slice and returns a record and its length, or says
//! why the bytes at the start of the slice are not one (cut short, or
//! damaged); it never reads past the slice.

use crate::ids::JobId;
use crate::job::Setback;
use crate::job::{Job, JobFrames, Origin};

/// The first byte of every record.
pub const MAGIC: u8 = 0xE7;
/// Bytes of a record header.
pub const HEADER_BYTES: usize = 10;
/// Bytes of a [`Record::Dispatched`] or [`Record::Done`] record.
pub const ID_RECORD_BYTES: usize = HEADER_BYTES + 8;
/// Bytes of a [`Record::Buried`] record.
pub const BURIED_RECORD_BYTES: usize = HEADER_BYTES + 18;
/// Bytes an [`Record::Accepted`] record adds to its job's frames.
pub const ACCEPTED_OVERHEAD_BYTES: usize = HEADER_BYTES + 10;

const ACCEPTED: u8 = 1;
const DISPATCHED: u8 = 2;
const REQUEUED: u8 = 3;
const DONE: u8 = 4;
const BURIED: u8 = 5;
const CLIENT_KEY: u8 = 6;

const FLAG_TEXT: u8 = 1;
const FLAG_FALLBACK: u8 = 2;

/// One record, borrowing the bytes it was decoded from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record<'a> {
    /// The shard took responsibility for a job (or, for a job copied
    /// forward by compaction or declined with `DCL`, the job waits again
    /// with this content and delivery count).
    Accepted {
        /// The job's id.
        id: JobId,
        /// Deliveries it had lost before (see [`Job::redeliveries`]).
        redeliveries: u8,
        /// Who sent it.
        origin: Origin,
        /// It waits in `default` because its own queue was unknown.
        fallback: bool,
        /// Its frames, as [`JobFrames::bytes`] holds them.
        frames: &'a [u8],
    },
    /// The job went to a worker or was offered to a text connection.
    Dispatched {
        /// The job's id.
        id: JobId,
    },
    /// The job waits at the front of its queue again.
    Requeued {
        /// The job's id.
        id: JobId,
        /// Its delivery count now.
        redeliveries: u8,
    },
    /// The job is finished: completed, acknowledged, deleted, or dropped
    /// from the dead set.
    Done {
        /// The job's id.
        id: JobId,
    },
    /// The job ran out of retries and lies in the dead set (until a
    /// `Requeued` record takes it back out, or `Done`).
    Buried {
        /// The job's id.
        id: JobId,
        /// Its setbacks in all.
        redeliveries: u8,
        /// Its last setback.
        why: Setback,
        /// When it was buried, in ms since the Unix epoch.
        at_unix_ms: u64,
    },
    /// Who sent the job: the key of the router's duplicate window
    /// (`broker::shard::dedup`), written after the job's first `Accepted`
    /// record. Not written for text jobs (no msgid) nor for copies made by
    /// compaction, `DCL` or a move to a new layout.
    ClientKey {
        /// The job's id.
        id: JobId,
        /// When the router accepted it, in ms since the Unix epoch.
        at_unix_ms: u64,
        /// The client's ZeroMQ routing identity as the router saw it (at
        /// most 255 bytes, ZeroMQ's own limit).
        client: &'a [u8],
        /// The REQUEST's msgid (at most [`crate::limits::MAX_MSGID_BYTES`]).
        msgid: &'a [u8],
    },
}

/// Why the bytes at the start of a slice are not a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The slice ends inside the record (a torn write at the end of a log).
    #[error("record cut short: {have} of {need} bytes")]
    Incomplete {
        /// Bytes the record needs.
        need: usize,
        /// Bytes there are.
        have: usize,
    },
    /// The first byte is not [`MAGIC`].
    #[error("no record starts here (byte {0:#04x})")]
    BadMagic(u8),
    /// The checksum does not match.
    #[error("checksum mismatch")]
    BadChecksum,
    /// The checksum matches but the payload does not fit its type.
    #[error("record of type {kind} has a malformed payload of {len} bytes")]
    BadPayload {
        /// The record type byte.
        kind: u8,
        /// The payload length.
        len: usize,
    },
}

impl Record<'_> {
    /// The job the record is about.
    pub fn id(&self) -> JobId {
        match self {
            Record::Accepted { id, .. }
            | Record::Dispatched { id }
            | Record::Requeued { id, .. }
            | Record::Done { id }
            | Record::Buried { id, .. }
            | Record::ClientKey { id, .. } => *id,
        }
    }
}

/// Bytes of the [`Record::Accepted`] record of `job`.
pub fn accepted_len(job: &Job) -> usize {
    ACCEPTED_OVERHEAD_BYTES + job.frames.len()
}

/// Appends the [`Record::Accepted`] record of `job` to `out`.
pub fn encode_accepted(job: &Job, out: &mut Vec<u8>) {
    let start = begin(out, ACCEPTED);
    out.extend_from_slice(&job.id.0.to_le_bytes());
    out.push(job.redeliveries().min(u8::MAX as u32) as u8);
    let mut flags = 0;
    if job.origin() == Origin::Text {
        flags |= FLAG_TEXT;
    }
    if job.fallback() {
        flags |= FLAG_FALLBACK;
    }
    out.push(flags);
    out.extend_from_slice(job.frames.bytes());
    finish(out, start);
}

/// Appends a [`Record::Dispatched`] record.
pub fn encode_dispatched(id: JobId, out: &mut Vec<u8>) {
    encode_id(DISPATCHED, id, out);
}

/// Appends a [`Record::Done`] record.
pub fn encode_done(id: JobId, out: &mut Vec<u8>) {
    encode_id(DONE, id, out);
}

/// Appends a [`Record::Requeued`] record.
pub fn encode_requeued(id: JobId, redeliveries: u32, out: &mut Vec<u8>) {
    let start = begin(out, REQUEUED);
    out.extend_from_slice(&id.0.to_le_bytes());
    out.push(redeliveries.min(u8::MAX as u32) as u8);
    finish(out, start);
}

/// Appends a [`Record::Buried`] record.
pub fn encode_buried(id: JobId, redeliveries: u32, why: Setback, at_unix_ms: u64, out: &mut Vec<u8>) {
    let start = begin(out, BURIED);
    out.extend_from_slice(&id.0.to_le_bytes());
    out.push(redeliveries.min(u8::MAX as u32) as u8);
    out.push(why.code());
    out.extend_from_slice(&at_unix_ms.to_le_bytes());
    finish(out, start);
}

/// Bytes of the [`Record::ClientKey`] record of `client` and `msgid`.
pub fn client_key_len(client: &[u8], msgid: &[u8]) -> usize {
    HEADER_BYTES + 18 + client.len() + msgid.len()
}

/// Appends a [`Record::ClientKey`] record; `None` (nothing written) when
/// `client` or `msgid` passes 255 bytes (neither can: ZeroMQ bounds
/// routing identities at 255 bytes and the router msgids at
/// [`crate::limits::MAX_MSGID_BYTES`]).
pub fn encode_client_key(id: JobId, at_unix_ms: u64, client: &[u8], msgid: &[u8], out: &mut Vec<u8>) -> Option<()> {
    let (client_len, msgid_len) = (u8::try_from(client.len()).ok()?, u8::try_from(msgid.len()).ok()?);
    let start = begin(out, CLIENT_KEY);
    out.extend_from_slice(&id.0.to_le_bytes());
    out.extend_from_slice(&at_unix_ms.to_le_bytes());
    out.push(client_len);
    out.extend_from_slice(client);
    out.push(msgid_len);
    out.extend_from_slice(msgid);
    finish(out, start);
    Some(())
}

fn encode_id(kind: u8, id: JobId, out: &mut Vec<u8>) {
    let start = begin(out, kind);
    out.extend_from_slice(&id.0.to_le_bytes());
    finish(out, start);
}

/// Writes a header with room for the length and checksum; returns where it starts.
fn begin(out: &mut Vec<u8>, kind: u8) -> usize {
    let start = out.len();
    out.extend_from_slice(&[MAGIC, kind, 0, 0, 0, 0, 0, 0, 0, 0]);
    start
}

/// Fills in the length and checksum of the record that starts at `start`.
fn finish(out: &mut [u8], start: usize) {
    let len = (out.len() - start - HEADER_BYTES) as u32;
    out[start + 2..start + 6].copy_from_slice(&len.to_le_bytes());
    let crc = checksum(&out[start + 1..start + 6], &out[start + HEADER_BYTES..]);
    out[start + 6..start + 10].copy_from_slice(&crc.to_le_bytes());
}

fn checksum(type_and_len: &[u8], payload: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(type_and_len), payload)
}

/// Decodes the record at the start of `buf`: the record and its length in
/// bytes, or why there is none.
///
/// # Errors
/// [`DecodeError`]: cut short, not a record, checksum or payload wrong.
pub fn decode(buf: &[u8]) -> Result<(Record<'_>, usize), DecodeError> {
    let Some(header) = buf.get(..HEADER_BYTES) else {
        return match buf.first() {
            Some(&b) if b != MAGIC => Err(DecodeError::BadMagic(b)),
            _ => Err(DecodeError::Incomplete { need: HEADER_BYTES, have: buf.len() }),
        };
    };
    if header[0] != MAGIC {
        return Err(DecodeError::BadMagic(header[0]));
    }
    let len = u32::from_le_bytes([header[2], header[3], header[4], header[5]]) as usize;
    let total = HEADER_BYTES.saturating_add(len);
    let Some(payload) = buf.get(HEADER_BYTES..total) else {
        return Err(DecodeError::Incomplete { need: total, have: buf.len() });
    };
    let crc = u32::from_le_bytes([header[6], header[7], header[8], header[9]]);
    if checksum(&header[1..6], payload) != crc {
        return Err(DecodeError::BadChecksum);
    }
    let bad = || DecodeError::BadPayload { kind: header[1], len };
    let id = payload.get(..8).map(|b| JobId(u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])));
    let record = match (header[1], id) {
        (ACCEPTED, Some(id)) if len >= 10 + 12 => {
            let flags = payload[9];
            let origin = if flags & FLAG_TEXT != 0 { Origin::Text } else { Origin::Emqp };
            let fallback = flags & FLAG_FALLBACK != 0;
            Record::Accepted { id, redeliveries: payload[8], origin, fallback, frames: &payload[10..] }
        }
        (DISPATCHED, Some(id)) if len == 8 => Record::Dispatched { id },
        (REQUEUED, Some(id)) if len == 9 => Record::Requeued { id, redeliveries: payload[8] },
        (DONE, Some(id)) if len == 8 => Record::Done { id },
        (BURIED, Some(id)) if len == 18 => {
            let why = Setback::from_code(payload[9]).ok_or_else(bad)?;
            let ms = &payload[10..18];
            let at_unix_ms = u64::from_le_bytes([ms[0], ms[1], ms[2], ms[3], ms[4], ms[5], ms[6], ms[7]]);
            Record::Buried { id, redeliveries: payload[8], why, at_unix_ms }
        }
        (CLIENT_KEY, Some(id)) if len >= 18 => {
            let ms = &payload[8..16];
            let at_unix_ms = u64::from_le_bytes([ms[0], ms[1], ms[2], ms[3], ms[4], ms[5], ms[6], ms[7]]);
            let client_len = payload[16] as usize;
            let client = payload.get(17..17 + client_len).ok_or_else(bad)?;
            let msgid_len = *payload.get(17 + client_len).ok_or_else(bad)? as usize;
            let msgid_at = 18 + client_len;
            if msgid_at + msgid_len != len {
                return Err(bad());
            }
            Record::ClientKey { id, at_unix_ms, client, msgid: &payload[msgid_at..] }
        }
        _ => return Err(bad()),
    };
    Ok((record, total))
}

/// Where the next record that decodes starts in `buf` at or after `from`,
/// if any (used after a damaged record, to tell damage in the middle of a
/// log from a torn end).
pub fn next_valid(buf: &[u8], from: usize) -> Option<usize> {
    let mut at = from;
    while let Some(i) = buf.get(at..).and_then(|rest| memchr::memchr(MAGIC, rest)) {
        let start = at + i;
        if decode(&buf[start..]).is_ok() {
            return Some(start);
        }
        at = start + 1;
    }
    None
}

/// The job a [`Record::Accepted`] describes, accepted at `now` by a router
/// started at `epoch`, in segment `segment`.
///
/// # Errors
/// [`crate::job::JobFramesError`] when the stored frames are malformed.
pub fn job_of(
    id: JobId,
    redeliveries: u8,
    origin: Origin,
    fallback: bool,
    frames: &[u8],
    epoch: std::time::Instant,
    now: std::time::Instant,
) -> Result<Job, crate::job::JobFramesError> {
    let mut job = Job::new(id, JobFrames::from_bytes(frames)?, origin, fallback, epoch, now);
    job.set_redeliveries(u32::from(redeliveries));
    Ok(job)
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    fn job(id: u64, text: bool) -> Job {
        let frames = JobFrames::new(b"msg-1", b"email", b"guarantee", &[7u8; 64], &[b"x".as_slice()]).unwrap();
        let origin = if text { Origin::Text } else { Origin::Emqp };
        let now = Instant::now();
        let mut j = Job::new(JobId(id), frames, origin, text, now, now);
        j.set_redeliveries(3);
        j
    }

    fn all_records() -> Vec<u8> {
        let mut buf = Vec::new();
        encode_accepted(&job(1 << 16, true), &mut buf);
        encode_dispatched(JobId(1 << 16), &mut buf);
        encode_requeued(JobId(1 << 16), 4, &mut buf);
        encode_done(JobId(1 << 16), &mut buf);
        buf
    }

    #[test]
    fn every_record_round_trips() {
        let buf = all_records();
        let (rec, n) = decode(&buf).unwrap();
        assert_eq!(n, accepted_len(&job(1 << 16, true)));
        let Record::Accepted { id, redeliveries, origin, fallback, frames } = rec else { panic!("{rec:?}") };
        assert_eq!((id, redeliveries, origin, fallback), (JobId(1 << 16), 3, Origin::Text, true));
        let now = Instant::now();
        let back = job_of(id, redeliveries, origin, fallback, frames, now, now).unwrap();
        assert_eq!((back.frames.body(), back.redeliveries()), (&[7u8; 64][..], 3));
        let (rec, m) = decode(&buf[n..]).unwrap();
        assert_eq!((rec, m), (Record::Dispatched { id: JobId(1 << 16) }, ID_RECORD_BYTES));
        let (rec, k) = decode(&buf[n + m..]).unwrap();
        assert_eq!(rec, Record::Requeued { id: JobId(1 << 16), redeliveries: 4 });
        let (rec, _) = decode(&buf[n + m + k..]).unwrap();
        assert_eq!(rec, Record::Done { id: JobId(1 << 16) });
        let mut buf = Vec::new();
        encode_buried(JobId(1 << 16), 6, Setback::Deadline, 1_700_000_000_123, &mut buf);
        assert_eq!(buf.len(), BURIED_RECORD_BYTES);
        let (rec, n) = decode(&buf).unwrap();
        assert_eq!(n, BURIED_RECORD_BYTES);
        let want = Record::Buried {
            id: JobId(1 << 16),
            redeliveries: 6,
            why: Setback::Deadline,
            at_unix_ms: 1_700_000_000_123,
        };
        assert_eq!(rec, want);
        buf[HEADER_BYTES + 9] = 77;
        let crc = checksum(&buf[1..6], &buf[HEADER_BYTES..]);
        buf[6..10].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(decode(&buf), Err(DecodeError::BadPayload { kind: 5, .. })), "an unknown reason is refused");
    }

    #[test]
    fn every_cut_is_incomplete_and_every_flip_is_caught() {
        let buf = all_records();
        let (_, first) = decode(&buf).unwrap();
        for cut in 1..first {
            assert!(matches!(decode(&buf[..cut]), Err(DecodeError::Incomplete { .. })), "cut at {cut}");
        }
        for at in 0..first {
            for bit in [0x01u8, 0x80] {
                let mut bad = buf.clone();
                bad[at] ^= bit;
                assert!(decode(&bad[..first]).is_err(), "flip of bit {bit:#x} at {at} went unnoticed");
            }
        }
        assert_eq!(decode(&[]), Err(DecodeError::Incomplete { need: HEADER_BYTES, have: 0 }));
        assert_eq!(decode(&[0]), Err(DecodeError::BadMagic(0)));
    }

    #[test]
    fn next_valid_skips_damage_and_finds_nothing_in_a_torn_tail() {
        let buf = all_records();
        let (_, first) = decode(&buf).unwrap();
        let mut bad = buf.clone();
        bad[first / 2] ^= 0xff;
        assert_eq!(next_valid(&bad, 1), Some(first));
        assert_eq!(next_valid(&buf[..first - 1], 1), None);
    }

    /// An `Accepted` record as a log written before type 6 holds it (bytes
    /// built by hand, as that version's encoder wrote them): it still
    /// decodes, and nothing in it names a client.
    #[test]
    fn an_old_accepted_record_still_decodes() {
        let frames = JobFrames::new(b"m-1", b"q", b"", b"body", &[] as &[&[u8]]).unwrap();
        let mut payload = Vec::new();
        payload.extend_from_slice(&7u64.to_le_bytes());
        payload.extend_from_slice(&[2, 0]);
        payload.extend_from_slice(frames.bytes());
        let mut buf = vec![MAGIC, ACCEPTED];
        buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        let crc = checksum(&buf[1..6], &payload);
        buf.extend_from_slice(&crc.to_le_bytes());
        buf.extend_from_slice(&payload);
        let (rec, n) = decode(&buf).unwrap();
        assert_eq!(n, buf.len());
        let want = Record::Accepted {
            id: JobId(7),
            redeliveries: 2,
            origin: Origin::Emqp,
            fallback: false,
            frames: frames.bytes(),
        };
        assert_eq!(rec, want);
    }

    #[test]
    fn a_client_key_round_trips_and_its_cuts_are_refused() {
        let mut buf = Vec::new();
        let client = [0u8, 1, 2, 0xff];
        encode_client_key(JobId(1 << 16), 1_700_000_000_456, &client, b"msg-1", &mut buf).unwrap();
        assert_eq!(buf.len(), client_key_len(&client, b"msg-1"));
        let (rec, n) = decode(&buf).unwrap();
        assert_eq!(n, buf.len());
        let want =
            Record::ClientKey { id: JobId(1 << 16), at_unix_ms: 1_700_000_000_456, client: &client, msgid: b"msg-1" };
        assert_eq!(rec, want);
        assert_eq!(rec.id(), JobId(1 << 16));
        let mut empty = Vec::new();
        encode_client_key(JobId(3), 0, b"", b"", &mut empty).unwrap();
        assert!(matches!(decode(&empty), Ok((Record::ClientKey { client: b"", msgid: b"", .. }, _))));
        assert_eq!(encode_client_key(JobId(3), 0, &[0; 256], b"m", &mut Vec::new()), None, "past 255 bytes");
        // A payload whose lengths do not add up is refused, not read past.
        for payload_len in 18..buf.len() - HEADER_BYTES {
            let mut bad = buf[..HEADER_BYTES + payload_len].to_vec();
            bad[2..6].copy_from_slice(&(payload_len as u32).to_le_bytes());
            let crc = checksum(&bad[1..6], &bad[HEADER_BYTES..]);
            bad[6..10].copy_from_slice(&crc.to_le_bytes());
            assert!(matches!(decode(&bad), Err(DecodeError::BadPayload { kind: CLIENT_KEY, .. })), "{payload_len}");
        }
    }

    #[test]
    fn a_checksummed_record_with_a_wrong_payload_is_refused() {
        let mut buf = Vec::new();
        let start = begin(&mut buf, DONE);
        buf.extend_from_slice(&[1, 2, 3]);
        finish(&mut buf, start);
        assert_eq!(decode(&buf), Err(DecodeError::BadPayload { kind: DONE, len: 3 }));
    }
}
