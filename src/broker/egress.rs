//! Egress: what a shard sends a ZeroMQ peer ([`Outgoing`]), typed so that
//! the eMQP I/O thread (`crate::zmq_io`) builds the frames straight from
//! the job's buffer, and what the I/O thread does when a send fails
//! ([`OnFail`]).

use crate::ids::{PeerId, WorkerKey};
use crate::job::JobFrames;
use crate::protocol::emqp::Frame;

/// Which router socket a frame list goes out on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dest {
    /// Frontend (clients, schedulers).
    Frontend,
    /// Backend (workers).
    Backend,
    /// Admin (emq-cli).
    Admin,
}

/// What the I/O thread does when a send fails.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnFail {
    /// Count it and move on (acceptance REPLY, heartbeat, ERROR…).
    Count,
    /// A job to a worker: tell its home shard ([`crate::broker::inbox::ShardMsg::SendFailed`]).
    Job {
        /// The worker's home shard.
        home: usize,
        /// The worker registration.
        key: WorkerKey,
    },
    /// A SCHEDULE or UNSCHEDULE to its owner: drop that scheduler and
    /// route the message again ([`crate::broker::inbox::Schedule::from_frames`] rebuilds it).
    Schedule {
        /// The client that sent it.
        client: PeerId,
    },
    /// A copy for a scheduler that does not own the key (UNSCHEDULE, DROP):
    /// drop that scheduler.
    Unschedule,
}

/// A message for one peer on one socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// The socket.
    pub dest: Dest,
    /// The peer's identity.
    pub peer: PeerId,
    /// What to send.
    pub msg: OutMsg,
    /// What to do if the send fails.
    pub on_fail: OnFail,
}

impl Outgoing {
    /// The frames of [`Outgoing::msg`] (see [`OutMsg::to_frames`]).
    pub fn frames(&self) -> Vec<Frame> {
        self.msg.to_frames()
    }
}

/// What to send, typed so the I/O thread builds the ZeroMQ frames straight
/// from the job's buffer (no intermediate frame lists on the hot path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutMsg {
    /// A job for a worker: `["", "eMQP/1.0", "REQUEST", msgid, queue,
    /// headers with "reply-requested" first, body, extra…]`.
    Job(JobFrames),
    /// The acceptance REPLY of a REQUEST: `["", "eMQP/1.0", "REPLY", <fresh
    /// msgid>, <the REQUEST's msgid>]`.
    Accepted(JobFrames),
    /// `["", "eMQP/1.0", "HEARTBEAT", <fresh msgid>, <wall clock>]`, stamped
    /// when sent.
    Heartbeat,
    /// Any other message, as frames.
    Frames(Vec<Frame>),
}

impl OutMsg {
    /// The frames this stands for (a fresh msgid where one is made at send
    /// time), for tests, logs and failed sends.
    pub fn to_frames(&self) -> Vec<Frame> {
        use crate::protocol::emqp::{heartbeat_timestamp, new_msgid, VERSION};
        let head = |word: &[u8]| vec![Vec::new(), VERSION.to_vec(), word.to_vec()];
        match self {
            OutMsg::Job(f) => {
                let mut out = head(b"REQUEST");
                out.push(f.msgid().to_vec());
                out.push(f.queue().to_vec());
                out.push(crate::protocol::headers::with_reply_requested(f.headers()));
                out.push(f.body().to_vec());
                out.extend(f.extra().map(<[u8]>::to_vec));
                out
            }
            OutMsg::Accepted(f) => {
                let mut out = head(b"REPLY");
                out.extend([new_msgid(), f.msgid().to_vec()]);
                out
            }
            OutMsg::Heartbeat => {
                let mut out = head(b"HEARTBEAT");
                out.extend([new_msgid(), heartbeat_timestamp()]);
                out
            }
            OutMsg::Frames(frames) => frames.clone(),
        }
    }
}
