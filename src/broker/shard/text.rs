//! Text-protocol handlers on the queue's shard: SCHED, ASK and the offer
//! (text-protocol.md "The offer"). An offered job is held here, keyed by
//! connection, until ACK/DCL/DEL, the connection ends, or the offer timeout.

use std::time::Instant;

use crossbeam_channel::Sender;

use super::{Shard, Timer};
use crate::broker::msg::{TextAnswer, TextRefusal};
use crate::broker::types::{ConnId, Job, Origin, QueueName};
use crate::metrics::counters::Counters;
use crate::metrics::latency::Kind;
use crate::protocol::emqp::new_msgid;

/// A job offered to a text connection.
#[derive(Debug)]
pub struct Offer {
    /// Its queue.
    pub queue: QueueName,
    /// The job.
    pub job: Job,
    /// Distinguishes this offer's timeout from an earlier one's.
    pub seq: u64,
    /// When it was offered.
    pub since: Instant,
    /// When it goes back to its queue unless answered.
    pub deadline: Instant,
}

impl Shard {
    pub(super) fn handle_text_sched(
        &mut self,
        queue: QueueName,
        data: Vec<u8>,
        reply: Sender<Result<(), TextRefusal>>,
    ) {
        let result = self.text_sched(queue, data);
        let _ = reply.send(result);
    }

    fn text_sched(&mut self, queue: QueueName, data: Vec<u8>) -> Result<(), TextRefusal> {
        if self.is_draining() {
            Counters::bump(&self.ctx.counters.rejected_shutting_down);
            return Err(TextRefusal::ShuttingDown);
        }
        if self.queues.get(&queue).map_or(0, |q| q.waiting.len()) >= self.ctx.config.max_queue_len {
            Counters::bump(&self.ctx.counters.rejected_queue_full);
            return Err(TextRefusal::QueueFull);
        }
        Counters::bump(&self.ctx.counters.accepted_jobs);
        let job = Job {
            msgid: new_msgid(),
            queue_frame: queue.0.clone(),
            headers: Vec::new(),
            body: data,
            extra: Vec::new(),
            accepted_at: Instant::now(),
            origin: Origin::Text,
            redeliveries: 0,
        };
        self.enqueue(queue, job, false);
        Ok(())
    }

    pub(super) fn handle_text_ask(
        &mut self,
        conn: ConnId,
        queue: QueueName,
        reply: Sender<Option<(u64, Vec<u8>)>>,
        now: Instant,
    ) {
        let job = self.queues.get_mut(&queue).and_then(|q| q.waiting.pop_front());
        let Some(job) = job else {
            let _ = reply.send(None);
            return;
        };
        let body = job.body.clone();
        self.latency.record(&queue, Kind::QueueWait, now.saturating_duration_since(job.accepted_at));
        self.offer_seq += 1;
        let seq = self.offer_seq;
        if let Some(old) = self.offers.insert(
            conn,
            Offer { queue: queue.clone(), job, seq, since: now, deadline: now + self.ctx.config.text.offer_timeout },
        ) {
            // The connection enforces one offer at a time; never lose one anyway.
            self.enqueue(old.queue, old.job, true);
        }
        // One timer per connection, re-armed when it fires early: answered
        // offers leave no timer behind to pile up in the heap.
        if self.offer_timers.insert(conn) {
            self.timers.arm(now + self.ctx.config.text.offer_timeout, Timer::OfferTimeout(conn));
        }
        if reply.send(Some((seq, body))).is_err() {
            // The connection went away between ASK and the answer.
            self.handle_text_release(conn, seq);
        }
    }

    pub(super) fn handle_text_answer(
        &mut self,
        conn: ConnId,
        seq: u64,
        answer: TextAnswer,
        reply: Sender<Result<(), TextRefusal>>,
    ) {
        let Some(offer) = self.take_offer(conn, seq) else {
            let _ = reply.send(Err(TextRefusal::NoTask));
            return;
        };
        match answer {
            TextAnswer::Ack => {
                Counters::bump(&self.ctx.counters.text_acked);
                let now = Instant::now();
                self.latency.record(&offer.queue, Kind::Service, now.saturating_duration_since(offer.since));
                self.latency.record(&offer.queue, Kind::EndToEnd, now.saturating_duration_since(offer.job.accepted_at));
            }
            TextAnswer::Del => Counters::bump(&self.ctx.counters.text_deleted),
            TextAnswer::Dcl => {
                Counters::bump(&self.ctx.counters.text_declined);
                self.enqueue(offer.queue, offer.job, false);
            }
        }
        let _ = reply.send(Ok(()));
    }

    /// Removes and returns `conn`'s offer if it is offer `seq`.
    fn take_offer(&mut self, conn: ConnId, seq: u64) -> Option<Offer> {
        if self.offers.get(&conn).is_some_and(|o| o.seq == seq) {
            self.offers.remove(&conn)
        } else {
            None
        }
    }

    /// Puts `conn`'s offer `seq` back at the front; whether it was held.
    pub(super) fn handle_text_release(&mut self, conn: ConnId, seq: u64) -> bool {
        let Some(offer) = self.take_offer(conn, seq) else { return false };
        Counters::bump(&self.ctx.counters.text_returned_disconnect);
        self.enqueue(offer.queue, offer.job, true);
        true
    }

    pub(super) fn offer_timeout_due(&mut self, conn: ConnId, now: Instant) {
        self.offer_timers.remove(&conn);
        let Some(deadline) = self.offers.get(&conn).map(|o| o.deadline) else { return };
        if deadline > now {
            self.offer_timers.insert(conn);
            self.timers.arm(deadline, Timer::OfferTimeout(conn));
            return;
        }
        if let Some(offer) = self.offers.remove(&conn) {
            Counters::bump(&self.ctx.counters.text_returned_timeout);
            tracing::info!(conn = conn.0, queue = %offer.queue, "text offer timed out; back to the front");
            self.enqueue(offer.queue, offer.job, true);
        }
    }
}
