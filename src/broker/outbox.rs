//! [`Outbox`]: where a shard's handlers put what they produce (frames for
//! ZeroMQ peers, messages for other shards, text answers) and how a batch
//! ends (released now, or after the job log holds its ticket). The
//! router's implementation sends into channels (`crate::router::outbox`);
//! tests collect into `Vec`s ([`VecOutbox`]).

use super::egress::Outgoing;
use super::inbox::ShardMsg;
use super::text_port::{TextPort, TextReply};

/// Where a shard's handlers put what they produce. The router's
/// implementation sends into channels (src/router); tests collect into
/// `Vec`s ([`VecOutbox`]).
///
/// Order: within one handler, messages to other shards are handed over
/// before later frames, so a shard can tell a worker's home shard about a
/// job before the job's frames can reach the worker.
pub trait Outbox {
    /// Frames for a ZeroMQ peer, sent by the I/O thread. Never blocks.
    fn emqp(&mut self, out: Outgoing);
    /// A message for shard `index`, at the back of its inbox. To the
    /// sender itself only for the next step of a long admin operation
    /// ([`ShardMsg::DeadStep`]): a shard keeps its other messages to itself
    /// in its own local queue.
    fn shard(&mut self, index: usize, msg: ShardMsg);
    /// An answer for a text connection.
    fn text(&mut self, port: &TextPort, reply: TextReply);
    /// The end of a batch of messages: wake whoever has to act on what was
    /// handed over (one wake-up per batch instead of one per message).
    fn flush(&mut self) {}
    /// The end of a batch whose promises wait for the job log to hold
    /// everything before `ticket` ([`crate::joblog::Commit::After`]):
    /// frames for workers ([`super::egress::Dest::Backend`]), frontend frames other than
    /// acceptance REPLYs ([`super::egress::OutMsg::Accepted`]) and text answers that
    /// promise nothing leave now; acceptance REPLYs, and text answers to
    /// stored SCHEDs with the later answers to their connections
    /// ([`TextReply::stored`]), once the log holds the ticket. Messages to
    /// other shards are never held. The default flushes at once.
    fn flush_after(&mut self, ticket: crate::joblog::Ticket) {
        let _ = ticket;
        self.flush();
    }
}

/// An [`Outbox`] that keeps everything, in order, for tests and tools.
#[derive(Debug, Default)]
pub struct VecOutbox {
    /// Frames for peers.
    pub emqp: Vec<Outgoing>,
    /// Messages for other shards: `(index, message)`.
    pub shards: Vec<(usize, ShardMsg)>,
    /// Text answers: `(port id, reply)`.
    pub text: Vec<(u64, TextReply)>,
}

impl Outbox for VecOutbox {
    fn emqp(&mut self, out: Outgoing) {
        self.emqp.push(out);
    }

    fn shard(&mut self, index: usize, msg: ShardMsg) {
        self.shards.push((index, msg));
    }

    fn text(&mut self, port: &TextPort, reply: TextReply) {
        self.text.push((port.id, reply));
    }
}
