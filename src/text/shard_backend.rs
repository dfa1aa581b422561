//! The broker's [`TextBackend`]: every operation goes to the shard that owns
//! the queue, over its channel, and waits for the answer. Offers live on
//! that shard (text-protocol.md "The offer"), which also owns their timeout.
//!
//! An [`OfferHandle`]'s id packs the shard index (low 16 bits) and the
//! shard's offer sequence number (the rest), so ACK/DCL/DEL/release go back
//! to the right shard and a stale handle is refused there.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;

use super::backend::{ConnId, Offer, OfferHandle, TextBackend};
use crate::broker::msg::{ShardMsg, TextAnswer, TextRefusal};
use crate::broker::types::{shard_of, ConnId as ShardConn, QueueName};
use crate::protocol::text::ErrorCode;

/// How long a connection waits for a shard's answer before it reports the
/// broker as shutting down (shards answer in microseconds unless stopped).
const SHARD_ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// [`TextBackend`] over the dispatcher shards.
pub struct ShardBackend {
    shards: Arc<[Sender<ShardMsg>]>,
    offer_timeout: Duration,
    draining: Arc<AtomicBool>,
}

impl ShardBackend {
    /// A backend over `shards`, whose offers lapse after `offer_timeout`
    /// (the same value the shards use).
    pub fn new(shards: Arc<[Sender<ShardMsg>]>, offer_timeout: Duration, draining: Arc<AtomicBool>) -> ShardBackend {
        ShardBackend { shards, offer_timeout, draining }
    }

    fn shard(&self, queue: &str) -> usize {
        shard_of(queue.as_bytes(), self.shards.len())
    }

    /// Sends `msg` to shard `index` and waits for the answer on `rx`.
    fn call<T>(&self, index: usize, msg: ShardMsg, rx: crossbeam_channel::Receiver<T>) -> Result<T, ErrorCode> {
        let Some(tx) = self.shards.get(index) else { return Err(ErrorCode::NoTask) };
        tx.send(msg).map_err(|_| ErrorCode::ShuttingDown)?;
        rx.recv_timeout(SHARD_ANSWER_TIMEOUT).map_err(|_| ErrorCode::ShuttingDown)
    }

    fn answer(&self, conn: ConnId, offer: OfferHandle, answer: TextAnswer) -> Result<(), ErrorCode> {
        let (index, seq) = unpack(offer.id);
        let (reply, rx) = crossbeam_channel::bounded(1);
        let msg = ShardMsg::TextAnswer { conn: ShardConn(conn.0), seq, answer, reply };
        self.call(index, msg, rx)?.map_err(refusal)
    }
}

fn pack(index: usize, seq: u64) -> u64 {
    (seq << 16) | (index as u64 & 0xffff)
}

fn unpack(id: u64) -> (usize, u64) {
    ((id & 0xffff) as usize, id >> 16)
}

fn refusal(r: TextRefusal) -> ErrorCode {
    match r {
        TextRefusal::QueueFull => ErrorCode::QueueFull,
        TextRefusal::ShuttingDown => ErrorCode::ShuttingDown,
        TextRefusal::NoTask => ErrorCode::NoTask,
    }
}

impl TextBackend for ShardBackend {
    fn sched(&self, queue: &str, data: Vec<u8>) -> Result<(), ErrorCode> {
        if self.draining.load(Ordering::Acquire) {
            return Err(ErrorCode::ShuttingDown);
        }
        let (reply, rx) = crossbeam_channel::bounded(1);
        let msg = ShardMsg::TextSched { queue: QueueName::named(queue), data, reply };
        self.call(self.shard(queue), msg, rx)?.map_err(refusal)
    }

    fn ask(&self, conn: ConnId, queue: &str) -> Result<Option<Offer>, ErrorCode> {
        let index = self.shard(queue);
        let (reply, rx) = crossbeam_channel::bounded(1);
        let msg = ShardMsg::TextAsk { conn: ShardConn(conn.0), queue: QueueName::named(queue), reply };
        let answer = self.call(index, msg, rx)?;
        Ok(answer.map(|(seq, data)| Offer {
            handle: OfferHandle { id: pack(index, seq), deadline: Instant::now() + self.offer_timeout },
            data,
        }))
    }

    fn ack(&self, conn: ConnId, offer: OfferHandle) -> Result<(), ErrorCode> {
        self.answer(conn, offer, TextAnswer::Ack)
    }

    fn dcl(&self, conn: ConnId, offer: OfferHandle) -> Result<(), ErrorCode> {
        self.answer(conn, offer, TextAnswer::Dcl)
    }

    fn del(&self, conn: ConnId, offer: OfferHandle) -> Result<(), ErrorCode> {
        self.answer(conn, offer, TextAnswer::Del)
    }

    fn release(&self, conn: ConnId, offer: OfferHandle) -> bool {
        let (index, seq) = unpack(offer.id);
        let (reply, rx) = crossbeam_channel::bounded(1);
        let msg = ShardMsg::TextRelease { conn: ShardConn(conn.0), seq, reply: Some(reply) };
        self.call(index, msg, rx).unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn handle_ids_round_trip() {
        assert_eq!(super::unpack(super::pack(7, 123_456)), (7, 123_456));
    }
}
