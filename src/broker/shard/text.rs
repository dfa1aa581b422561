//! Text-protocol handlers on the queue's shard (text-protocol.md; emq's
//! contract in docs/text-protocol.md): SCHED, ASK and the offer. An offered
//! job is held in the [`super::offers::OfferTable`], keyed by connection,
//! until ACK/DCL/DEL, the connection ends, or the offer timeout, which this
//! shard alone decides; the deadline goes back with the offer so the
//! connection can forget it at the same moment.

use super::offers::OfferCheck;
use super::{Cx, Shard, Timer};
use crate::broker::job::{Job, JobFrames, Origin};
use crate::broker::msg::{TextAnswer, TextCmd, TextOutcome, TextPort, TextReply, TextRequest};
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
        if let Err(code) = self.admit(&queue) {
            return TextOutcome::Refused(code);
        }
        let id = self.next_job_id();
        // A text job's msgid (what an eMQP worker sees in D3): a fresh uuid4,
        // like every msgid EventMQ peers make.
        let mut buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
        let msgid = uuid::Uuid::new_v4().hyphenated().encode_lower(&mut buf);
        let none: &[&[u8]] = &[];
        let frames = match JobFrames::new(msgid.as_bytes(), &queue.0, b"", &data, none) {
            Ok(frames) => frames,
            // The text decoder bounds lines and names well below these limits.
            Err(_) => return TextOutcome::Refused(ErrorCode::TooBig),
        };
        let mut job = Job::new(id, frames, Origin::Text, false, self.ctx.started, cx.now);
        self.log_accepted(&mut job);
        self.enqueue_new(&queue, job, cx);
        TextOutcome::Done
    }

    fn text_ask(&mut self, conn: ConnId, queue: QueueName, cx: &mut Cx) -> TextOutcome {
        let Some(job) = self.queues.pop(&queue.0) else { return TextOutcome::Nope };
        self.log_dispatched(&job);
        let waited = cx.now.saturating_duration_since(job.accepted_at(self.ctx.started));
        self.latency.record(&queue.0, Kind::QueueWait, waited);
        let data = job.frames.body().to_vec();
        let deadline = cx.now + self.ctx.config.text.offer_timeout;
        let (id, arm, displaced) = self.offers.offer(conn, queue, job, cx.now, deadline);
        if arm {
            self.timers.arm(deadline, Timer::OfferTimeout(conn));
        }
        if let Some(old) = displaced {
            // The front end sends one ASK at a time per connection; never
            // lose an offer anyway.
            self.enqueue_again(old.job, true, cx);
        }
        TextOutcome::Offer { id, data, deadline }
    }

    fn text_answer(&mut self, conn: ConnId, offer: OfferId, answer: TextAnswer, cx: &mut Cx) -> TextOutcome {
        let Some(offer) = self.offers.take(conn, offer) else { return TextOutcome::Refused(ErrorCode::NoTask) };
        match answer {
            TextAnswer::Ack => {
                Counters::bump(&self.ctx.counters.text_acked);
                self.latency.record(&offer.queue.0, Kind::Service, cx.now.saturating_duration_since(offer.since));
                let end_to_end = cx.now.saturating_duration_since(offer.job.accepted_at(self.ctx.started));
                self.latency.record(&offer.queue.0, Kind::EndToEnd, end_to_end);
                self.log_done(&offer.job, cx);
            }
            TextAnswer::Del => {
                Counters::bump(&self.ctx.counters.text_deleted);
                self.log_done(&offer.job, cx);
            }
            TextAnswer::Dcl => {
                Counters::bump(&self.ctx.counters.text_declined);
                let mut job = offer.job;
                self.log_declined(&mut job);
                self.enqueue_again(job, false, cx);
            }
        }
        TextOutcome::Done
    }

    /// Puts `conn`'s offer back at the front of its queue, if still held.
    fn text_release(&mut self, conn: ConnId, offer: OfferId, cx: &mut Cx) {
        let Some(offer) = self.offers.take(conn, offer) else { return };
        Counters::bump(&self.ctx.counters.text_returned_disconnect);
        self.enqueue_again(offer.job, true, cx);
    }

    pub(super) fn offer_timeout_due(&mut self, conn: ConnId, cx: &mut Cx) {
        match self.offers.check(conn, cx.now) {
            OfferCheck::None => {}
            OfferCheck::NotBefore(deadline) => self.timers.arm(deadline, Timer::OfferTimeout(conn)),
            OfferCheck::Lapsed(offer) => {
                Counters::bump(&self.ctx.counters.text_returned_timeout);
                tracing::info!(%conn, queue = %offer.queue, "text offer timed out; back to the front");
                self.enqueue_again(offer.job, true, cx);
            }
        }
    }
}
