//! The egress path: shards (and the admin thread) hand frames to the I/O
//! thread through an inproc PUSH → PULL pair, which wakes the I/O thread's
//! `zmq::poll` directly (DESIGN: "an inproc PAIR socket in the same
//! zmq::poll, or a file descriptor"; the socket carries the frames too, so
//! nothing is copied twice and no extra wake-up is needed).
//!
//! Wire inside the process: `[tag, peer identity, D-frames…]`. The tag says
//! which router socket to use and what to do if the send fails:
//! byte 0 `F`/`B`/`A` (frontend, backend, admin) or `X` (I/O thread: exit);
//! byte 1 `C` (count the failure), `J` + home shard (u32 LE) + worker key
//! (u64 LE), `S` + the client identity (SCHEDULE), `U` (UNSCHEDULE).

use crate::broker::msg::{Dest, OnFail, Outbox, Outgoing};
use crate::broker::types::{PeerId, WorkerKey};

/// An [`Outbox`] over an inproc PUSH socket. Its SNDHWM is 0 (no limit), so
/// a send never blocks the shard.
pub struct ZmqOutbox {
    socket: zmq::Socket,
}

impl ZmqOutbox {
    /// A PUSH socket in `ctx` connected to `endpoint` (the I/O thread's PULL).
    ///
    /// # Errors
    /// The ZeroMQ error of socket creation or connect.
    pub fn connect(ctx: &zmq::Context, endpoint: &str) -> Result<ZmqOutbox, zmq::Error> {
        let socket = ctx.socket(zmq::PUSH)?;
        socket.set_sndhwm(0)?;
        socket.set_linger(1000)?;
        socket.connect(endpoint)?;
        Ok(ZmqOutbox { socket })
    }

    /// Asks the I/O thread to exit once it has sent what came before.
    pub fn send_exit(&self) {
        if let Err(e) = self.socket.send_multipart([&b"X-"[..], b""], 0) {
            tracing::error!(error = %e, "cannot tell the I/O thread to exit");
        }
    }
}

impl Outbox for ZmqOutbox {
    fn send(&mut self, out: Outgoing) {
        let tag = encode_tag(out.dest, &out.on_fail);
        let frames = std::iter::once(tag).chain(std::iter::once(out.peer.0)).chain(out.frames);
        if let Err(e) = self.socket.send_multipart(frames, 0) {
            tracing::error!(error = %e, "egress send failed; message lost");
        }
    }
}

/// Encodes the tag frame.
pub fn encode_tag(dest: Dest, on_fail: &OnFail) -> Vec<u8> {
    let mut tag = vec![
        match dest {
            Dest::Frontend => b'F',
            Dest::Backend => b'B',
            Dest::Admin => b'A',
        },
        0,
    ];
    match on_fail {
        OnFail::Count => tag[1] = b'C',
        OnFail::Job { home, key } => {
            tag[1] = b'J';
            tag.extend_from_slice(&(*home as u32).to_le_bytes());
            tag.extend_from_slice(&key.0.to_le_bytes());
        }
        OnFail::Schedule { client } => {
            tag[1] = b'S';
            tag.extend_from_slice(&client.0);
        }
        OnFail::Unschedule => tag[1] = b'U',
    }
    tag
}

/// A decoded tag: `None` for the exit tag or an unreadable one.
pub fn decode_tag(tag: &[u8]) -> Option<(Dest, OnFail)> {
    let dest = match tag.first()? {
        b'F' => Dest::Frontend,
        b'B' => Dest::Backend,
        b'A' => Dest::Admin,
        _ => return None,
    };
    let on_fail = match *tag.get(1)? {
        b'C' => OnFail::Count,
        b'J' if tag.len() == 14 => {
            let home = u32::from_le_bytes(tag[2..6].try_into().ok()?) as usize;
            let key = WorkerKey(u64::from_le_bytes(tag[6..14].try_into().ok()?));
            OnFail::Job { home, key }
        }
        b'S' => OnFail::Schedule { client: PeerId(tag[2..].to_vec()) },
        b'U' => OnFail::Unschedule,
        _ => return None,
    };
    Some((dest, on_fail))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_round_trip() {
        for (d, f) in [
            (Dest::Backend, OnFail::Job { home: 3, key: WorkerKey(77) }),
            (Dest::Frontend, OnFail::Schedule { client: PeerId(vec![0, 1, 2]) }),
            (Dest::Admin, OnFail::Count),
            (Dest::Frontend, OnFail::Unschedule),
        ] {
            assert_eq!(decode_tag(&encode_tag(d, &f)), Some((d, f)));
        }
        assert_eq!(decode_tag(b"X-"), None);
    }
}
