//! Text-protocol handlers on the queue's shard (docs/text-protocol.md; emq's
//! contract in docs/text-protocol.md): SCHED, ASK and the offer. An offered
//! job is held in the [`super::offers::OfferTable`], keyed by connection,
//! until ACK/DCL/DEL, the connection ends, or the offer timeout, which this
//! shard alone decides; the deadline goes back with the offer so the
//! connection can forget it at the same moment.

use super::offers::OfferCheck;
use super::{Cx, Shard, Timer};
use crate::broker::counts::QueueCounter;
use crate::broker::msg::{TextAnswer, TextCmd, TextOutcome, TextPort, TextReply, TextRequest};
use crate::broker::types::NewJob;
use crate::ids::{ConnId, OfferId, QueueName};
use crate::metrics::counters::Counters;
use crate::metrics::latency::Kind;
use crate::protocol::text::ErrorCode;

impl Shard {
    /// Runs text commands in order; each but `Release` gets one answer on `port`.
    pub(super) fn handle_text(&mut self, port: &TextPort, cmds: Vec<TextRequest>, cx: &mut Cx) {
        for TextRequest { conn, cmd } in cmds {
            let outcome = match cmd {
                TextCmd::Sched { queue, data } => self.text_sched(queue, data, cx),
                TextCmd::Ask { queue } => self.text_ask(conn, queue, cx),
                TextCmd::Answer { offer, answer } => self.text_answer(conn, offer, answer, cx),
                TextCmd::Release { offer } => {
                    self.text_release(conn, offer, cx);
                    continue;
                }
            };
            cx.out.text(port, TextReply { conn, outcome });
        }
    }

    fn text_sched(&mut self, queue: QueueName, data: Vec<u8>, cx: &mut Cx) -> TextOutcome {
        let job = NewJob::text(&queue, data);
        match self.accept(queue, job, cx) {
            Ok(_) => TextOutcome::Done,
            Err(code) => TextOutcome::Refused(code),
        }
    }

    fn text_ask(&mut self, conn: ConnId, queue: QueueName, cx: &mut Cx) -> TextOutcome {
        let Some(job) = self.queues.pop(&queue) else { return TextOutcome::Nope };
        self.queues.count(&queue, QueueCounter::Dispatched);
        tracing::debug!(%queue, job = %job.id, msgid = %job.msgid, %conn, "job offered");
        self.latency.record(&queue, Kind::QueueWait, cx.now.saturating_duration_since(job.accepted_at));
        let data = job.body.clone();
        let deadline = cx.now + self.ctx.config.text.offer_timeout;
        let (id, arm, displaced) = self.offers.offer(conn, queue, job, cx.now, deadline);
        if arm {
            self.timers.arm(deadline, Timer::OfferTimeout(conn));
        }
        if let Some(old) = displaced {
            // The front end sends one ASK at a time per connection; never
            // lose an offer anyway.
            self.enqueue_again(old.queue, old.job, true, cx);
        }
        TextOutcome::Offer { id, data, deadline }
    }

    fn text_answer(&mut self, conn: ConnId, offer: OfferId, answer: TextAnswer, cx: &mut Cx) -> TextOutcome {
        let Some(offer) = self.offers.take(conn, offer) else { return TextOutcome::Refused(ErrorCode::NoTask) };
        match answer {
            TextAnswer::Ack => {
                Counters::bump(&self.ctx.counters.text_acked);
                self.queues.count(&offer.queue, QueueCounter::Completed);
                tracing::debug!(queue = %offer.queue, job = %offer.job.id, %conn, "job completed (ACK)");
                self.latency.record(&offer.queue, Kind::Service, cx.now.saturating_duration_since(offer.since));
                let end_to_end = cx.now.saturating_duration_since(offer.job.accepted_at);
                self.latency.record(&offer.queue, Kind::EndToEnd, end_to_end);
            }
            TextAnswer::Del => {
                Counters::bump(&self.ctx.counters.text_deleted);
                self.queues.count(&offer.queue, QueueCounter::Failed);
                tracing::debug!(queue = %offer.queue, job = %offer.job.id, %conn, "job failed (DEL)");
            }
            TextAnswer::Dcl => {
                Counters::bump(&self.ctx.counters.text_declined);
                self.enqueue_again(offer.queue, offer.job, false, cx);
            }
        }
        TextOutcome::Done
    }

    /// Puts `conn`'s offer back at the front of its queue, if still held.
    fn text_release(&mut self, conn: ConnId, offer: OfferId, cx: &mut Cx) {
        let Some(offer) = self.offers.take(conn, offer) else { return };
        Counters::bump(&self.ctx.counters.text_returned_disconnect);
        self.enqueue_again(offer.queue, offer.job, true, cx);
    }

    pub(super) fn offer_timeout_due(&mut self, conn: ConnId, cx: &mut Cx) {
        match self.offers.check(conn, cx.now) {
            OfferCheck::None => {}
            OfferCheck::NotBefore(deadline) => self.timers.arm(deadline, Timer::OfferTimeout(conn)),
            OfferCheck::Lapsed(offer) => {
                Counters::bump(&self.ctx.counters.text_returned_timeout);
                tracing::info!(%conn, queue = %offer.queue, "text offer timed out; back to the front");
                let offer = *offer;
                self.enqueue_again(offer.queue, offer.job, true, cx);
            }
        }
    }
}
