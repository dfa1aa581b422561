//! ZeroMQ frames in and out of the I/O thread without intermediate copies.
//!
//! * In: [`Inbound`] receives a multipart message into reusable
//!   `zmq::Message` slots (no allocation per frame for small frames; libzmq
//!   keeps larger ones in its receive buffer) and reads `more` from each
//!   message rather than with a `getsockopt` per frame.
//! * Out: [`send_out`] writes an [`OutMsg`] frame by frame. Frames of up to
//!   33 bytes are copied into the message itself (ZeroMQ's "very small
//!   message": no allocation). Larger frames of a job (msgid, body) are
//!   handed to ZeroMQ as pointers into the job's shared buffer
//!   ([`JobFrames`]): the buffer's reference count keeps it alive until
//!   ZeroMQ has sent it, so a job's body is copied once in its life, when it
//!   is received.

use std::ffi::c_void;
use std::ops::Range;
use std::sync::Arc;

use crate::broker::egress::OutMsg;
use crate::job::JobFrames;
use crate::limits;
use crate::protocol::emqp::VERSION;
use crate::protocol::headers::{self, REPLY_REQUESTED};

/// Frames up to this size are stored inside `zmq_msg_t` (libzmq's
/// `max_vsm_size`): copying them costs no allocation.
const VSM_BYTES: usize = 33;

/// A received frame that can be decoded in place.
#[repr(transparent)]
pub struct InFrame(pub zmq::Message);

impl AsRef<[u8]> for InFrame {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// Reusable slots for one multipart message at a time.
#[derive(Default)]
pub struct Inbound {
    slots: Vec<InFrame>,
    len: usize,
}

/// What [`Inbound::recv`] got.
#[derive(Debug, PartialEq, Eq)]
pub enum Received {
    /// Nothing waiting.
    Nothing,
    /// A message of this many frames (identity first) is in [`Inbound::frames`].
    Frames(usize),
    /// A message of more than [`limits::MAX_FRAMES`] frames: read whole,
    /// and only its first [`limits::MAX_FRAMES`] frames kept in
    /// [`Inbound::frames`] (enough to answer its msgid).
    TooManyFrames {
        /// Its frames, identity first.
        frames: usize,
        /// The bytes of all its frames but the identity, those not kept
        /// included, so that its size is judged before its frame count
        /// (docs/emqp.md "ERROR").
        bytes: usize,
    },
}

impl Inbound {
    /// Receives the next message from `socket` without blocking.
    ///
    /// # Errors
    /// The zmq error of a failed receive (not `EAGAIN`).
    pub fn recv(&mut self, socket: &zmq::Socket) -> Result<Received, zmq::Error> {
        self.len = 0;
        let mut total = 0;
        let mut bytes = 0usize;
        loop {
            let at = self.len.min(limits::MAX_FRAMES);
            if at == self.slots.len() {
                self.slots.push(InFrame(zmq::Message::new()));
            }
            let flags = if total == 0 { zmq::DONTWAIT } else { 0 };
            match socket.recv(&mut self.slots[at].0, flags) {
                Ok(()) => {}
                Err(zmq::Error::EAGAIN) if total == 0 => return Ok(Received::Nothing),
                Err(e) => return Err(e),
            }
            if total > 0 {
                bytes = bytes.saturating_add(self.slots[at].0.len());
            }
            total += 1;
            self.len = (at + 1).min(limits::MAX_FRAMES);
            if !self.slots[at].0.get_more() {
                break;
            }
        }
        if total > limits::MAX_FRAMES {
            // Slots 0..MAX_FRAMES were each written once; later frames
            // went to the spare slot past them.
            self.len = limits::MAX_FRAMES;
            return Ok(Received::TooManyFrames { frames: total, bytes });
        }
        Ok(Received::Frames(total))
    }

    /// The frames of the last message received (of one with too many, its
    /// first [`limits::MAX_FRAMES`]).
    pub fn frames(&self) -> &[InFrame] {
        &self.slots[..self.len]
    }
}

/// Sends `msg` to `peer` on `socket`; fails only on the first frame (the
/// peer is unknown, or its pipe is full), so nothing partial is sent.
///
/// # Errors
/// The zmq error of the identity frame: `EHOSTUNREACH`, `EAGAIN`.
pub fn send_out(socket: &mut zmq::Socket, peer: &[u8], msg: &OutMsg) -> Result<(), zmq::Error> {
    let more = zmq::SNDMORE | zmq::DONTWAIT;
    socket.send(peer, more)?;
    match msg {
        OutMsg::Job(f) => {
            send_head(socket, b"REQUEST")?;
            send_shared(socket, f, msgid_range(f), zmq::SNDMORE)?;
            socket.send(f.queue(), zmq::SNDMORE)?;
            send_headers(socket, f.headers())?;
            let mut extra = f.extra().peekable();
            let body_flags = if extra.peek().is_some() { zmq::SNDMORE } else { 0 };
            send_shared(socket, f, f.body_range(), body_flags)?;
            while let Some(frame) = extra.next() {
                socket.send(frame, if extra.peek().is_some() { zmq::SNDMORE } else { 0 })?;
            }
            Ok(())
        }
        OutMsg::Accepted(f) => {
            send_head(socket, b"REPLY")?;
            send_msgid(socket)?;
            send_shared(socket, f, msgid_range(f), 0)
        }
        OutMsg::Heartbeat => {
            send_head(socket, b"HEARTBEAT")?;
            send_msgid(socket)?;
            let mut buf = [0u8; 32];
            socket.send(timestamp(&mut buf), 0)
        }
        OutMsg::Frames(frames) => {
            let last = frames.len().saturating_sub(1);
            for (i, frame) in frames.iter().enumerate() {
                socket.send(&frame[..], if i < last { zmq::SNDMORE } else { 0 })?;
            }
            Ok(())
        }
    }
}

fn send_head(socket: &mut zmq::Socket, word: &[u8]) -> Result<(), zmq::Error> {
    socket.send(&b""[..], zmq::SNDMORE)?;
    socket.send(VERSION, zmq::SNDMORE)?;
    socket.send(word, zmq::SNDMORE)
}

/// A fresh msgid (a hyphenated uuid4, like Python's `str(uuid.uuid4())`),
/// formatted on the stack.
fn send_msgid(socket: &mut zmq::Socket) -> Result<(), zmq::Error> {
    let mut buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
    let text = uuid::Uuid::new_v4().hyphenated().encode_lower(&mut buf);
    socket.send(text.as_bytes(), zmq::SNDMORE)
}

/// The headers with `reply-requested` first (added when absent), so every
/// worker answers with a job-result REPLY (docs/emqp.md "At-least-once").
fn send_headers(socket: &mut zmq::Socket, given: &[u8]) -> Result<(), zmq::Error> {
    if headers::has(given, REPLY_REQUESTED) {
        return socket.send(given, zmq::SNDMORE);
    }
    let mut out: smallvec::SmallVec<[u8; 64]> = smallvec::SmallVec::new();
    out.extend_from_slice(REPLY_REQUESTED);
    if !given.is_empty() {
        out.push(b',');
        out.extend_from_slice(given);
    }
    socket.send(&out[..], zmq::SNDMORE)
}

fn msgid_range(f: &JobFrames) -> Range<usize> {
    let start = f.body_range().start - f.headers().len() - f.queue().len() - f.msgid().len();
    start..start + f.msgid().len()
}

/// The HEARTBEAT timestamp: the wall clock in seconds as decimal text, like
/// Python's `str(time.time())` (receivers never read it), written into `buf`.
fn timestamp(buf: &mut [u8; 32]) -> &[u8] {
    use std::io::Write;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let mut cursor = std::io::Cursor::new(&mut buf[..]);
    let _ = write!(cursor, "{}.{:06}", now.as_secs(), now.subsec_micros());
    let len = cursor.position() as usize;
    &buf[..len]
}

/// Sends `range` of the job's buffer: copied when small, else lent to
/// ZeroMQ with a reference to the buffer.
fn send_shared(socket: &mut zmq::Socket, f: &JobFrames, range: Range<usize>, flags: i32) -> Result<(), zmq::Error> {
    if range.len() <= VSM_BYTES {
        return socket.send(&f.bytes()[range], flags);
    }
    send_lent(socket, f.bytes().clone(), range, flags)
}

/// Sends `range` of `buf` as one frame without copying it: the ZeroMQ
/// message points into the buffer and holds one reference to it until
/// libzmq is done with the bytes.
fn send_lent(socket: &mut zmq::Socket, buf: Arc<[u8]>, range: Range<usize>, flags: i32) -> Result<(), zmq::Error> {
    assert!(range.end <= buf.len(), "a frame lies inside its job's buffer");
    let base = Arc::into_raw(buf) as *const u8;
    let mut msg = zmq_sys::zmq_msg_t { __: [0; 64] };
    // SAFETY: `base + range` lies inside the buffer (asserted above); the
    // buffer stays alive until `release` gives back the reference taken by
    // `into_raw`, which libzmq calls exactly once, when the message is sent
    // or closed. On every path below the message is either sent (libzmq owns
    // it) or closed (which calls `release`), or, when it was never
    // initialised, the reference is given back directly.
    unsafe {
        let data = base.add(range.start) as *mut c_void;
        if zmq_sys::zmq_msg_init_data(&mut msg, data, range.len(), Some(release), base as *mut c_void) != 0 {
            let buf = rebuild(base);
            return socket.send(&buf[range], flags);
        }
        if zmq_sys::zmq_msg_send(&mut msg, socket.as_mut_ptr(), flags) == -1 {
            let err = zmq::Error::from_raw(zmq_sys::zmq_errno());
            zmq_sys::zmq_msg_close(&mut msg);
            return Err(err);
        }
    }
    Ok(())
}

/// Rebuilds the `Arc<[u8]>` behind a buffer's data pointer; the buffer's
/// first four bytes hold its length ([`JobFrames`] layout).
///
/// # Safety
/// `base` must come from `Arc::<[u8]>::into_raw` of a [`JobFrames`] buffer
/// whose reference has not been given back yet.
unsafe fn rebuild(base: *const u8) -> Arc<[u8]> {
    let len = u32::from_le_bytes(*(base as *const [u8; 4])) as usize;
    Arc::from_raw(std::ptr::slice_from_raw_parts(base, len))
}

/// libzmq's free function for lent frames: gives back the reference.
unsafe extern "C" fn release(_data: *mut c_void, hint: *mut c_void) {
    drop(rebuild(hint as *const u8));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_frames_go_out_as_eventmq_frames_and_the_buffer_is_given_back() {
        let ctx = zmq::Context::new();
        let mut router = ctx.socket(zmq::ROUTER).unwrap();
        router.set_router_mandatory(true).unwrap();
        router.bind("inproc://frames-test").unwrap();
        let dealer = ctx.socket(zmq::DEALER).unwrap();
        dealer.set_identity(b"w1").unwrap();
        dealer.connect("inproc://frames-test").unwrap();
        dealer.send(&b"hi"[..], 0).unwrap();
        let _ = router.recv_multipart(0).unwrap();
        let f =
            JobFrames::new(b"msgid-0123456789-0123456789-0123456789", b"q", b"guarantee", &[5u8; 64], &[b"x"]).unwrap();
        send_out(&mut router, b"w1", &OutMsg::Job(f.clone())).unwrap();
        let got = dealer.recv_multipart(0).unwrap();
        assert_eq!(got, OutMsg::Job(f.clone()).to_frames());
        assert_eq!(Arc::strong_count(f.bytes()), 1, "libzmq gave the lent references back");
        assert_eq!(send_out(&mut router, b"nobody", &OutMsg::Job(f.clone())), Err(zmq::Error::EHOSTUNREACH));
        assert_eq!(Arc::strong_count(f.bytes()), 1);
    }
}
