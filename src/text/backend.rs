//! The queue operations the text server needs, as one narrow trait, so the
//! server can run against the broker's shards or against
//! [`super::MemoryBackend`] in tests.

use std::time::Instant;

use crate::protocol::text::ErrorCode;

/// A text connection's id, unique for the server's lifetime (log field `conn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u64);

impl std::fmt::Display for ConnId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "text-{}", self.0)
    }
}

/// What a connection keeps of a task offered to it: enough for the backend
/// to find the task again, and when the offer lapses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OfferHandle {
    /// The backend's id for this offer (opaque to the server; a sharded
    /// backend may encode the shard in it).
    pub id: u64,
    /// When the offer timeout ends (set by the backend from its configured
    /// offer timeout). From then on the connection no longer holds the offer.
    pub deadline: Instant,
}

/// A task offered to a connection by [`TextBackend::ask`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offer {
    /// The handle to answer the offer with.
    pub handle: OfferHandle,
    /// The task's bytes (written as `WANT? <data>`).
    pub data: Vec<u8>,
}

/// The queue operations behind the text protocol (text-protocol.md).
///
/// # Contract
///
/// * **Queues.** FIFO per queue name; names are already valid (1 to 255
///   bytes of `A-Z a-z 0-9 _ - . :`). Queues are shared with eMQP.
/// * **One offer per connection.** The server calls `ask` only when it holds
///   no live offer for `conn` (it answers `ERR PENDING` itself), and it calls
///   `ack`, `dcl`, `del` and `release` only with the handle `ask` gave that
///   same connection, at most once per handle.
/// * **Offer timeouts belong to the backend.** An offer not answered by its
///   `deadline` goes back to the **front** of its queue at or soon after the
///   deadline, with no call from the server. From the deadline on, `ack`,
///   `dcl` and `del` with that handle return `Err(ErrorCode::NoTask)` and
///   change nothing, and `release` does nothing. The server forgets an offer
///   whose deadline has passed (and may then `ask` again).
/// * **Order.** A task returned by `release` or by timeout goes to the front
///   of its queue (the order of the queue is kept); `dcl` puts it at the
///   back. Taken-back tasks are stored even above the queue limit.
/// * **Errors.** `sched` may return `QueueFull` or `ShuttingDown` (nothing
///   stored); `ask` may return `ShuttingDown`. The server writes the code
///   with its default text; nothing else changes.
/// * Calls for one connection come from one thread, in the order of the
///   connection's commands; calls for different connections run in parallel.
pub trait TextBackend: Send + Sync + 'static {
    /// Adds `data` at the back of `queue`.
    ///
    /// # Errors
    /// `QueueFull` at the queue limit, `ShuttingDown` while draining.
    fn sched(&self, queue: &str, data: Vec<u8>) -> Result<(), ErrorCode>;

    /// Offers the oldest task of `queue` to `conn`, holding it until the
    /// answer, the deadline, or `release`. `Ok(None)`: nothing to offer now.
    ///
    /// # Errors
    /// `ShuttingDown` while draining (optional).
    fn ask(&self, conn: ConnId, queue: &str) -> Result<Option<Offer>, ErrorCode>;

    /// `ACK`: the task is removed; the client owns it.
    ///
    /// # Errors
    /// `NoTask` when the offer has lapsed.
    fn ack(&self, conn: ConnId, offer: OfferHandle) -> Result<(), ErrorCode>;

    /// `DCL`: the task moves to the back of its queue.
    ///
    /// # Errors
    /// `NoTask` when the offer has lapsed.
    fn dcl(&self, conn: ConnId, offer: OfferHandle) -> Result<(), ErrorCode>;

    /// `DEL`: the task is removed and counted as deleted.
    ///
    /// # Errors
    /// `NoTask` when the offer has lapsed.
    fn del(&self, conn: ConnId, offer: OfferHandle) -> Result<(), ErrorCode>;

    /// The connection ended (END, close, error) while holding `offer`: the
    /// task goes back to the front of its queue. Returns whether it did
    /// (false when the offer had already lapsed).
    fn release(&self, conn: ConnId, offer: OfferHandle) -> bool;
}
