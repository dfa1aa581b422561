//! The job data model, below the broker and its log: [`JobFrames`], the
//! job's frames in one shared allocation; [`Job`], the small record a queue
//! holds; [`Setback`] and [`DeadJob`]. Plain data: it
//! imports only [`crate::ids`] and [`crate::limits`], so the broker, the
//! job log's backends and the codecs share it without knowing each other.
//!
//! Layout of the allocation (one `Arc<[u8]>`):
//!
//! ```text
//! [total u32][msgid len u8][queue len u8][headers len u16][body len u32]
//! msgid | queue | headers | body | (extra frame: len u32, bytes)*
//! ```
//!
//! All integers little-endian. The frames are copied once, from the
//! received ZeroMQ messages into this buffer; from then on they are shared,
//! never copied: the in-flight record and the frames on their way to a
//! worker hold the same allocation (see `src/zmq_io/frames.rs`). A 64-byte
//! job with a 36-byte msgid costs one 144-byte allocation and a 40-byte
//! [`Job`] (README "Performance" has the measured bytes per queued job).

use std::mem::MaybeUninit;
use std::sync::Arc;
use std::time::Instant;

use crate::ids::{JobId, QueueName};
use crate::limits;

mod setback;
pub use setback::{unix_ms_now, DeadJob, Setback};

const HEADER: usize = 12;

/// Why frames cannot become a job (each a limit of [`crate::limits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum JobFramesError {
    /// The msgid is longer than [`limits::MAX_MSGID_BYTES`].
    #[error("the msgid has {0} bytes; at most {max} are accepted", max = limits::MAX_MSGID_BYTES)]
    MsgIdTooLong(usize),
    /// The queue name is longer than [`limits::MAX_QUEUE_NAME_BYTES`].
    #[error("the queue name has {0} bytes; at most {max} are accepted", max = limits::MAX_QUEUE_NAME_BYTES)]
    QueueTooLong(usize),
    /// The headers are longer than [`limits::MAX_HEADERS_BYTES`].
    #[error("the headers have {0} bytes; at most {max} are accepted", max = limits::MAX_HEADERS_BYTES)]
    HeadersTooLong(usize),
    /// The frames together pass 4 GiB.
    #[error("the job has {0} bytes; at most 4 GiB are accepted")]
    TooBig(usize),
    /// A stored buffer does not hold frames ([`JobFrames::from_bytes`]).
    #[error("stored job frames are malformed: {0}")]
    Malformed(&'static str),
}

/// A job's frames in one shared buffer (see the module docs). Cloning is a
/// reference count increment.
#[derive(Clone, PartialEq, Eq)]
pub struct JobFrames(Arc<[u8]>);

impl JobFrames {
    /// Copies the frames of a REQUEST into one buffer.
    ///
    /// # Errors
    /// [`JobFramesError`] naming the frame past its limit.
    pub fn new<F: AsRef<[u8]>>(
        msgid: &[u8],
        queue: &[u8],
        headers: &[u8],
        body: &[u8],
        extra: &[F],
    ) -> Result<JobFrames, JobFramesError> {
        if msgid.len() > limits::MAX_MSGID_BYTES {
            return Err(JobFramesError::MsgIdTooLong(msgid.len()));
        }
        if queue.len() > limits::MAX_QUEUE_NAME_BYTES {
            return Err(JobFramesError::QueueTooLong(queue.len()));
        }
        if headers.len() > limits::MAX_HEADERS_BYTES {
            return Err(JobFramesError::HeadersTooLong(headers.len()));
        }
        let extra_len: usize = extra.iter().map(|f| 4 + f.as_ref().len()).sum();
        let total = HEADER + msgid.len() + queue.len() + headers.len() + body.len() + extra_len;
        let total32 = u32::try_from(total).map_err(|_| JobFramesError::TooBig(total))?;
        // One allocation, written in place (no Vec copied into the Arc: for
        // large bodies that halves the bytes copied and keeps a freed
        // buffer from fragmenting the heap).
        let mut buf: Arc<[MaybeUninit<u8>]> = Arc::new_uninit_slice(total);
        let mut out = Writer { buf: Arc::get_mut(&mut buf).ok_or(JobFramesError::Malformed("shared"))?, at: 0 };
        out.put(&total32.to_le_bytes());
        out.put(&[msgid.len() as u8, queue.len() as u8]);
        out.put(&(headers.len() as u16).to_le_bytes());
        out.put(&(body.len() as u32).to_le_bytes());
        for part in [msgid, queue, headers, body] {
            out.put(part);
        }
        for f in extra {
            let f = f.as_ref();
            out.put(&(f.len() as u32).to_le_bytes());
            out.put(f);
        }
        if out.at != total {
            return Err(JobFramesError::Malformed("frames do not fill the buffer"));
        }
        // SAFETY: `out` wrote every byte of `buf` once (`out.at == total`,
        // and `put` panics rather than write past the end).
        Ok(JobFrames(unsafe { buf.assume_init() }))
    }

    /// Takes a buffer as [`JobFrames::bytes`] wrote it (read back from the
    /// write-ahead log): checks that its header agrees with its length, so
    /// every accessor stays in bounds.
    ///
    /// # Errors
    /// [`JobFramesError::Malformed`] naming what does not add up.
    pub fn from_bytes(bytes: &[u8]) -> Result<JobFrames, JobFramesError> {
        let head = bytes.get(..HEADER).ok_or(JobFramesError::Malformed("shorter than its header"))?;
        let total = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        if total != bytes.len() {
            return Err(JobFramesError::Malformed("total length differs from the buffer's"));
        }
        let body = u32::from_le_bytes([head[8], head[9], head[10], head[11]]) as usize;
        let fixed = HEADER + head[4] as usize + head[5] as usize + u16::from_le_bytes([head[6], head[7]]) as usize;
        let mut at = fixed
            .checked_add(body)
            .filter(|end| *end <= total)
            .ok_or(JobFramesError::Malformed("frames pass the end"))?;
        while at < total {
            let len = bytes.get(at..at + 4).ok_or(JobFramesError::Malformed("extra frame length cut"))?;
            let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
            at = (at + 4)
                .checked_add(len)
                .filter(|end| *end <= total)
                .ok_or(JobFramesError::Malformed("extra frame passes the end"))?;
        }
        Ok(JobFrames(Arc::from(bytes)))
    }

    fn lens(&self) -> (usize, usize, usize, usize) {
        let b = &self.0;
        let body = u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize;
        (b[4] as usize, b[5] as usize, u16::from_le_bytes([b[6], b[7]]) as usize, body)
    }

    /// REQUEST frame 3, the client's msgid.
    pub fn msgid(&self) -> &[u8] {
        let (m, ..) = self.lens();
        &self.0[HEADER..HEADER + m]
    }

    /// REQUEST frame 4, the queue as the client named it.
    pub fn queue(&self) -> &[u8] {
        let (m, q, ..) = self.lens();
        &self.0[HEADER + m..HEADER + m + q]
    }

    /// REQUEST frame 5, the headers CSV as the client sent it.
    pub fn headers(&self) -> &[u8] {
        let (m, q, h, _) = self.lens();
        &self.0[HEADER + m + q..HEADER + m + q + h]
    }

    /// Where the body lies in [`JobFrames::bytes`].
    pub fn body_range(&self) -> std::ops::Range<usize> {
        let (m, q, h, b) = self.lens();
        let start = HEADER + m + q + h;
        start..start + b
    }

    /// REQUEST frame 6, the body.
    pub fn body(&self) -> &[u8] {
        &self.0[self.body_range()]
    }

    /// REQUEST frame 7 and later, forwarded unchanged.
    pub fn extra(&self) -> impl Iterator<Item = &[u8]> {
        let mut at = self.body_range().end;
        std::iter::from_fn(move || {
            let len = self.0.get(at..at + 4)?;
            let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
            let frame = self.0.get(at + 4..at + 4 + len)?;
            at += 4 + len;
            Some(frame)
        })
    }

    /// The whole buffer (its length is its first four bytes, little-endian).
    pub fn bytes(&self) -> &Arc<[u8]> {
        &self.0
    }

    /// Bytes held by the buffer (what a queue's byte limit counts).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Never true: a buffer holds at least its header.
    pub fn is_empty(&self) -> bool {
        false
    }
}

impl std::fmt::Debug for JobFrames {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobFrames")
            .field("msgid", &crate::ids::show(self.msgid()))
            .field("queue", &crate::ids::show(self.queue()))
            .field("body_bytes", &self.body().len())
            .finish()
    }
}

/// Where a job came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// An eMQP REQUEST.
    Emqp,
    /// A text-protocol SCHED.
    Text,
}

/// One accepted job: 40 bytes and its [`JobFrames`].
///
/// Layout (kept at 40 bytes, a unit test checks it): the id (8), the frames
/// (16), the acceptance time (8), the job log's tag (4, see
/// [`Job::log_tag`]) and one packed word (4) holding [`Job::back_from`] (24 bits),
/// [`Job::redeliveries`] (6 bits, saturating at 63), the origin and the
/// fallback flag (1 bit each).
#[derive(Clone, Debug)]
pub struct Job {
    /// The broker's id: unique, unlike the msgid.
    pub id: JobId,
    /// The frames.
    pub frames: JobFrames,
    /// When the broker took responsibility for it, in nanoseconds since the
    /// router started (see [`Job::accepted_at`]).
    accepted_ns: u64,
    /// See [`Job::log_tag`].
    log_tag: u32,
    /// `back_from` (bits 0..24), redeliveries (24..30), text origin (30),
    /// fallback (31).
    packed: u32,
}

const BACK_FROM_BITS: u32 = 24;
const BACK_FROM_MASK: u32 = (1 << BACK_FROM_BITS) - 1;
const REDELIVERIES_SHIFT: u32 = 24;
/// Most setbacks a [`Job`] counts (6 bits); above every retry limit
/// ([`crate::limits::MAX_RETRIES_HEADER`]).
pub const MAX_REDELIVERIES_COUNTED: u32 = 63;
const REDELIVERIES_MASK: u32 = (MAX_REDELIVERIES_COUNTED) << REDELIVERIES_SHIFT;
const TEXT_BIT: u32 = 1 << 30;
const FALLBACK_BIT: u32 = 1 << 31;

impl Job {
    /// A job accepted as `id` at `now` by a router started at `epoch`.
    pub fn new(id: JobId, frames: JobFrames, origin: Origin, fallback: bool, epoch: Instant, now: Instant) -> Job {
        let accepted_ns = now.saturating_duration_since(epoch).as_nanos().min(u64::MAX as u128) as u64;
        let mut packed = 0;
        if origin == Origin::Text {
            packed |= TEXT_BIT;
        }
        if fallback {
            packed |= FALLBACK_BIT;
        }
        Job { id, frames, accepted_ns, log_tag: 0, packed }
    }

    /// Its setbacks ([`Setback`]): tries that came to
    /// nothing because it failed, passed its deadline, or the worker or
    /// text connection holding it went away, or the router stopped while it
    /// was in flight. Past its allowed retries it goes to the dead set
    /// ([`crate::broker::retry::allowed_retries`]). Counts up to
    /// [`MAX_REDELIVERIES_COUNTED`].
    pub fn redeliveries(&self) -> u32 {
        (self.packed & REDELIVERIES_MASK) >> REDELIVERIES_SHIFT
    }

    /// Sets [`Job::redeliveries`] (values above [`MAX_REDELIVERIES_COUNTED`]
    /// are kept as that).
    pub fn set_redeliveries(&mut self, n: u32) {
        let n = n.min(MAX_REDELIVERIES_COUNTED);
        self.packed = (self.packed & !REDELIVERIES_MASK) | (n << REDELIVERIES_SHIFT);
    }

    /// Who sent it.
    pub fn origin(&self) -> Origin {
        if self.packed & TEXT_BIT != 0 {
            Origin::Text
        } else {
            Origin::Emqp
        }
    }

    /// It runs on `default` because its own queue was unknown.
    pub fn fallback(&self) -> bool {
        self.packed & FALLBACK_BIT != 0
    }

    /// Where the shard's job log keeps the job's record: opaque to
    /// everyone but the log that set it (the write-ahead log puts the
    /// number of the segment holding the job's latest `Accepted` record
    /// there, `crate::wal`); 0 until a log sets it.
    pub fn log_tag(&self) -> u32 {
        self.log_tag
    }

    /// Sets [`Job::log_tag`] (the job log's business only).
    pub fn set_log_tag(&mut self, tag: u32) {
        self.log_tag = tag;
    }

    /// While the job waits at the front of its queue again because worker
    /// registration `key` was removed holding it (or while it was on its
    /// way to it): `Some(key)`, so the jobs that registration sends back keep
    /// their order (see `QueueTable::push_front`); `None` for every other
    /// waiting job. The key is kept to its low 24 bits (never 0): two
    /// registrations 2²⁴ apart would only share the ordering rule, never
    /// lose a job.
    pub fn back_from(&self) -> Option<u32> {
        let key = self.packed & BACK_FROM_MASK;
        (key != 0).then_some(key)
    }

    /// Sets or clears [`Job::back_from`].
    pub fn set_back_from(&mut self, key: Option<crate::ids::WorkerKey>) {
        let key = key.map_or(0, |k| ((k.0 as u32) & BACK_FROM_MASK).max(1));
        self.packed = (self.packed & !BACK_FROM_MASK) | key;
    }

    /// When the job was accepted, for a router started at `epoch`.
    pub fn accepted_at(&self, epoch: Instant) -> Instant {
        epoch + std::time::Duration::from_nanos(self.accepted_ns)
    }

    /// The queue it waits in: its own, or `default` after the fallback.
    pub fn queue(&self) -> QueueName {
        if self.fallback() {
            QueueName::named(limits::DEFAULT_QUEUE)
        } else {
            QueueName::from(self.frames.queue())
        }
    }

    /// The queue's name as bytes (no copy).
    pub fn queue_bytes(&self) -> &[u8] {
        if self.fallback() {
            limits::DEFAULT_QUEUE.as_bytes()
        } else {
            self.frames.queue()
        }
    }
}

/// Writes slices one after another into an uninitialised buffer.
struct Writer<'a> {
    buf: &'a mut [MaybeUninit<u8>],
    at: usize,
}

impl Writer<'_> {
    /// Writes `bytes` at the cursor and moves it on.
    ///
    /// # Panics
    /// When `bytes` passes the end of the buffer (a length computed wrong).
    fn put(&mut self, bytes: &[u8]) {
        self.buf[self.at..self.at + bytes.len()].write_copy_of_slice(bytes);
        self.at += bytes.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let f =
            JobFrames::new(b"m-1", b"email", b"guarantee", &[7u8; 64], &[b"x1".as_slice(), b"".as_slice()]).unwrap();
        assert_eq!(f.msgid(), b"m-1");
        assert_eq!(f.queue(), b"email");
        assert_eq!(f.headers(), b"guarantee");
        assert_eq!(f.body(), &[7u8; 64][..]);
        assert_eq!(f.extra().collect::<Vec<_>>(), [b"x1".as_slice(), b"".as_slice()]);
        assert_eq!(f.len(), u32::from_le_bytes(f.bytes()[..4].try_into().unwrap()) as usize);
        let none: &[&[u8]] = &[];
        assert_eq!(JobFrames::new(b"", b"q", b"", b"", none).unwrap().extra().count(), 0);
    }

    #[test]
    fn limits_refuse_with_the_frame_named() {
        let none: &[&[u8]] = &[];
        let long = vec![b'q'; 256];
        assert_eq!(JobFrames::new(b"m", &long, b"", b"", none), Err(JobFramesError::QueueTooLong(256)));
        assert_eq!(JobFrames::new(&long, b"q", b"", b"", none), Err(JobFramesError::MsgIdTooLong(256)));
    }

    #[test]
    fn stored_frames_are_checked() {
        let f = JobFrames::new(b"m-1", b"email", b"h", &[7u8; 64], &[b"x1".as_slice()]).unwrap();
        let back = JobFrames::from_bytes(f.bytes()).unwrap();
        assert_eq!(back, f);
        let mut cut = f.bytes().to_vec();
        cut.pop();
        assert!(JobFrames::from_bytes(&cut).is_err());
        let mut long_body = f.bytes().to_vec();
        long_body[8] = 200;
        assert!(JobFrames::from_bytes(&long_body).is_err());
        assert!(JobFrames::from_bytes(&[1, 2]).is_err());
    }

    #[test]
    fn packed_fields_do_not_disturb_each_other() {
        let f = JobFrames::new(b"m", b"q", b"", b"", &[] as &[&[u8]]).unwrap();
        let now = Instant::now();
        let mut j = Job::new(JobId(9), f, Origin::Text, true, now, now);
        j.set_back_from(Some(crate::ids::WorkerKey((1 << 24) + 5)));
        j.set_redeliveries(70);
        j.set_log_tag(u32::MAX);
        assert_eq!((j.back_from(), j.redeliveries(), j.origin(), j.fallback()), (Some(5), 63, Origin::Text, true));
        j.set_back_from(Some(crate::ids::WorkerKey(1 << 24)));
        assert_eq!(j.back_from(), Some(1), "a key whose low bits are 0 still counts");
        j.set_back_from(None);
        j.set_redeliveries(2);
        assert_eq!((j.back_from(), j.redeliveries(), j.origin(), j.fallback()), (None, 2, Origin::Text, true));
        assert_eq!(j.log_tag(), u32::MAX);
    }

    #[test]
    fn a_job_is_small() {
        assert!(std::mem::size_of::<Job>() <= 40, "{}", std::mem::size_of::<Job>());
    }
}
