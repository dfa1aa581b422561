//! The queue operations the text server needs, as one narrow trait over the
//! broker's text contract ([`TextCmd`] in, [`TextOutcome`] out), so the
//! server can run against the broker's shards or against a plain in-memory
//! queue in tests.

use crate::broker::msg::{TextCmd, TextOutcome, TextReply};
use crate::ids::{ConnId, OfferId};
use crate::limits;
use crate::protocol::text::ErrorCode;

/// The outcome of a command handed over with [`TextBackend::submit`].
pub enum Pending {
    /// Already known.
    Ready(TextOutcome),
    /// To come on this channel (the shard's answers for the command's port).
    Waiting(crossbeam_channel::Receiver<Vec<TextReply>>),
}

impl Pending {
    /// Waits for the outcome (up to [`limits::TEXT_SHARD_ANSWER_TIMEOUT`];
    /// no answer counts as the broker shutting down).
    pub fn wait(self) -> TextOutcome {
        match self {
            Pending::Ready(outcome) => outcome,
            Pending::Waiting(rx) => match rx.recv_timeout(limits::TEXT_SHARD_ANSWER_TIMEOUT) {
                Ok(mut replies) if !replies.is_empty() => replies.swap_remove(0).outcome,
                _ => TextOutcome::Refused(ErrorCode::ShuttingDown),
            },
        }
    }
}

/// The queue operations behind the text protocol (text-protocol.md).
///
/// # Contract
///
/// * **Queues.** FIFO per queue name; names are already valid (1 to 255
///   bytes of `A-Z a-z 0-9 _ - . :`). Queues are shared with eMQP.
/// * **Outcomes.** `Sched` → `Done` or `Refused(QueueFull | ShuttingDown)`
///   (nothing stored); `Ask` → `Offer`, `Nope` or `Refused`; `Answer` →
///   `Done`, or `Refused(NoTask)` once the offer has lapsed (nothing
///   changes then).
/// * **One offer per connection.** The server sends `Ask` only when it
///   holds no live offer for `conn` (it answers `ERR PENDING` itself), and
///   answers or releases only an offer that `Ask` gave that same
///   connection, at most once.
/// * **Offer timeouts belong to the backend.** An offer not answered by the
///   `deadline` given with it goes back to the **front** of its queue at or
///   soon after the deadline, with no call from the server. The server
///   forgets an offer whose deadline has passed (and may then ask again).
/// * **Order.** A task released or timed out goes to the front of its queue
///   (the order of the queue is kept); `DCL` puts it at the back. Taken-back
///   tasks are stored even above the queue limit.
/// * Calls for one connection come from one thread, in the order of the
///   connection's commands; calls for different connections run in parallel.
pub trait TextBackend: Send + Sync + 'static {
    /// Runs `cmd` (not a `Release`) for `conn` and returns its outcome.
    fn call(&self, conn: ConnId, cmd: TextCmd) -> TextOutcome;

    /// Hands `cmd` over without waiting for its outcome (the server uses it
    /// for `Sched` and `Answer`, whose outcomes only matter before the
    /// connection's next reply). Commands submitted and called for one connection still run
    /// in the order given. The default runs it at once.
    fn submit(&self, conn: ConnId, cmd: TextCmd) -> Pending {
        Pending::Ready(self.call(conn, cmd))
    }

    /// The connection ended (END, close, error) while holding `offer`: the
    /// task goes back to the front of its queue, unless the offer already
    /// lapsed. Does not wait.
    fn release(&self, conn: ConnId, offer: OfferId);
}
