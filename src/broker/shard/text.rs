//! Text-protocol handlers on the queue's shard (text-protocol.md): SCHED,
//! ASK (plain and long-poll) and the offer. An offered job is held in the
//! [`super::offers::OfferTable`], keyed by connection, until ACK/DCL/DEL,
//! the connection's end, or the offer timeout, which this shard alone
//! decides; the deadline goes back with the offer so the connection can
//! forget it at the same moment.
//!
//! Long-poll ASKs wait in the [`super::waits::WaitTable`]. A task arriving
//! in a queue goes first to an eMQP worker with a free slot (the push rule
//! of text-protocol.md "One broker, one queue namespace"), then to the ASK
//! that has waited longest ([`Shard::serve_waits`], called by every path
//! that adds a task: SCHED, REQUEST, requeue, DCL, a returned offer).
//!
//! Every ASK also keeps its queue known for `text_ask_grace`
//! ([`super::asked::AskedQueues`]); a long-poll ASK keeps it known while it
//! waits.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use super::offers::OfferCheck;
use super::waits::WaitCheck;
use super::{Cx, Shard, Timer};
use crate::broker::counts::QueueCounter;
use crate::broker::text_port::{TextAnswer, TextCmd, TextOutcome, TextPort, TextReply, TextRequest};
use crate::ids::{ConnId, OfferId, QueueName};
use crate::job::Setback;
use crate::job::{Job, JobFrames, Origin};
use crate::metrics::counters::Counters;
use crate::metrics::latency::Kind;
use crate::protocol::text::ErrorCode;

/// Why an offer came back to its queue.
#[derive(Debug, Clone, Copy)]
enum Returned {
    /// The connection ended holding it.
    Disconnect,
    /// Its offer timeout passed.
    Timeout,
}

impl Shard {
    /// Runs text commands in order. Each is answered once on `port`, except
    /// `Release` and `Cancel` (never) and an `AskWait` that waits (later).
    pub(super) fn handle_text(&mut self, port: &TextPort, cmds: Vec<TextRequest>, cx: &mut Cx) {
        for TextRequest { conn, cmd } in cmds {
            let sched = matches!(cmd, TextCmd::Sched { .. });
            let outcome = match cmd {
                TextCmd::Sched { queue, data } => self.text_sched(queue, data, cx),
                TextCmd::Ask { queue } => self.text_ask(conn, queue, cx),
                TextCmd::AskWait { queue, wait } => match self.text_ask_wait(conn, queue, wait, port, cx) {
                    Some(outcome) => outcome,
                    None => continue,
                },
                TextCmd::Answer { offer, answer } => self.text_answer(conn, offer, answer, cx),
                TextCmd::Release { offer } => {
                    self.text_release(conn, offer, cx);
                    continue;
                }
                TextCmd::Cancel => {
                    self.text_cancel(conn, cx);
                    continue;
                }
            };
            let stored = sched && outcome == TextOutcome::Done;
            cx.out.text(port, TextReply { conn, outcome, stored });
        }
    }

    fn text_sched(&mut self, queue: QueueName, data: Vec<u8>, cx: &mut Cx) -> TextOutcome {
        // A text job's msgid (what an eMQP worker sees in frame 3): a fresh uuid4,
        // like every msgid EventMQ peers make.
        let mut buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
        let msgid = uuid::Uuid::new_v4().hyphenated().encode_lower(&mut buf);
        let none: &[&[u8]] = &[];
        let frames = match JobFrames::new(msgid.as_bytes(), &queue.0, b"", &data, none) {
            Ok(frames) => frames,
            // The text decoder bounds lines and names well below these limits.
            Err(_) => return TextOutcome::Refused(ErrorCode::TooBig),
        };
        if let Err(code) = self.admit(&queue, frames.len(), cx.now) {
            return TextOutcome::Refused(code);
        }
        let mut job = Job::new(self.next_job_id(), frames, Origin::Text, false, self.ctx.started, cx.now);
        self.log_accepted(&mut job);
        self.enqueue_new(&queue, job, cx);
        TextOutcome::Done
    }

    fn text_ask(&mut self, conn: ConnId, queue: QueueName, cx: &mut Cx) -> TextOutcome {
        if let Err(code) = self.note_ask(&queue, cx) {
            return TextOutcome::Refused(code);
        }
        if self.log.fenced() {
            // Its jobs are the new owner's (JobLog::fenced): none to offer.
            return TextOutcome::Nope;
        }
        match self.queues.pop(&queue.0) {
            Some(job) => self.offer_job(conn, queue, job, cx),
            None => TextOutcome::Nope,
        }
    }

    /// A long-poll ASK: answered now when a task waits (or the wait is 0),
    /// else `None` and the connection joins the queue's line.
    fn text_ask_wait(
        &mut self,
        conn: ConnId,
        queue: QueueName,
        wait: Duration,
        port: &TextPort,
        cx: &mut Cx,
    ) -> Option<TextOutcome> {
        if wait.is_zero() || self.queues.waiting(&queue.0) > 0 {
            return Some(self.text_ask(conn, queue, cx));
        }
        if let Err(code) = self.note_ask(&queue, cx) {
            return Some(TextOutcome::Refused(code));
        }
        let deadline = cx.now + wait;
        let (arm, displaced) = self.waits.add(conn, queue, port.clone(), deadline);
        if arm {
            self.timers.arm(deadline, Timer::AskTimeout(conn));
        }
        if let Some(old) = displaced {
            // The front end sends one ASK at a time per connection; answer a
            // displaced wait anyway rather than leave it unanswered.
            cx.out.text(&old.port, TextReply::new(conn, TextOutcome::Nope));
        }
        None
    }

    /// Records that `queue` was asked for. Refuses (`QUEUE_LIMIT`, counted)
    /// a name that is no queue yet, is not asked for already, and that
    /// nothing else makes known, when the broker holds `max_queues` queues
    /// (an ASK names a queue like a SCHED does: README "Limits",
    /// `max_queues`) or the table of asked names is full.
    fn note_ask(&mut self, queue: &QueueName, cx: &mut Cx) -> Result<(), ErrorCode> {
        let name = &queue.0;
        let known = self.queues.is_known(name);
        let new_name = !known && !self.queues.exists(name) && !self.asked.is_live(name, cx.now);
        let room = !new_name || self.queues.total() < self.ctx.config.max_queues;
        let until = cx.now + self.ctx.config.text.ask_grace;
        if room && (self.asked.touch(queue, cx.now, until).is_ok() || known) {
            return Ok(());
        }
        Counters::bump(&self.ctx.counters.rejected_queue_limit);
        Err(ErrorCode::QueueLimit)
    }

    /// Whether a REQUEST for `queue` stays on it: the rule of
    /// [`super::queues::QueueTable::is_known`], or a text client ASKed for
    /// it within `text_ask_grace`, or a long-poll ASK waits on it, or the
    /// router began serving less than `queue_learn_grace` ago (its workers
    /// may not have declared their queues again yet: after a restart or a
    /// take-over they re-register within a heartbeat or two). A name
    /// known only so, with no queue yet, stays known only while a queue may
    /// still be made (fewer than `max_queues`): past that the REQUEST goes
    /// to `default`, as it would without the ASK, and is never refused
    /// `QUEUE_LIMIT` for a name it did not choose to create.
    pub(super) fn queue_known(&self, queue: &[u8], cx: &Cx) -> bool {
        if self.queues.is_known(queue) {
            return true;
        }
        let asked = self.asked.is_live(queue, cx.now) || self.waits.has(queue);
        let learning = cx.now.saturating_duration_since(self.ctx.serving_since) < self.ctx.config.queue_learn_grace;
        (asked || learning) && (self.queues.exists(queue) || self.queues.total() < self.ctx.config.max_queues)
    }

    /// The queues [`Shard::queue_known`] keeps known for text clients at
    /// `now` (ASKed within `text_ask_grace`, or a long-poll ASK waits on
    /// them), sorted, for STATUS's `asked_queues`.
    pub(super) fn asked_queues(&self, now: Instant) -> Vec<String> {
        let names: BTreeSet<&QueueName> = self.asked.live(now).chain(self.waits.queues()).collect();
        names.into_iter().map(QueueName::to_string).collect()
    }

    /// Offers `job` of `queue` to `conn` until the offer timeout.
    fn offer_job(&mut self, conn: ConnId, queue: QueueName, job: Job, cx: &mut Cx) -> TextOutcome {
        self.log_dispatched(&job);
        let waited = cx.now.saturating_duration_since(job.accepted_at(self.ctx.started));
        self.latency.record(&queue.0, Kind::QueueWait, waited);
        self.queues.count(&queue, QueueCounter::Dispatched);
        tracing::debug!(%queue, job = %job.id, msgid = %crate::ids::show(job.frames.msgid()), %conn, "job offered");
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

    /// Hands waiting jobs of `queue` to the long-poll ASKs waiting on it,
    /// longest-waiting first (after eMQP workers took what they could).
    pub(super) fn serve_waits(&mut self, queue: &QueueName, cx: &mut Cx) {
        while self.waits.has(&queue.0) && self.queues.waiting(&queue.0) > 0 {
            let Some(waiter) = self.waits.pop(&queue.0) else { return };
            let Some(job) = self.queues.pop(&queue.0) else { return };
            let outcome = self.offer_job(waiter.conn, waiter.queue, job, cx);
            cx.out.text(&waiter.port, TextReply::new(waiter.conn, outcome));
        }
    }

    fn text_answer(&mut self, conn: ConnId, offer: OfferId, answer: TextAnswer, cx: &mut Cx) -> TextOutcome {
        let Some(offer) = self.offers.take(conn, offer) else { return TextOutcome::Refused(ErrorCode::NoTask) };
        match answer {
            TextAnswer::Ack => {
                Counters::bump(&self.ctx.counters.text_acked);
                self.queues.count(&offer.queue, QueueCounter::Completed);
                tracing::debug!(queue = %offer.queue, job = %offer.job.id, msgid = %crate::ids::show(offer.job.frames.msgid()), %conn, "job completed (ACK)");
                self.latency.record(&offer.queue.0, Kind::Service, cx.now.saturating_duration_since(offer.since));
                let end_to_end = cx.now.saturating_duration_since(offer.job.accepted_at(self.ctx.started));
                self.latency.record(&offer.queue.0, Kind::EndToEnd, end_to_end);
                self.job_done(&offer.job, cx);
            }
            TextAnswer::Del => {
                Counters::bump(&self.ctx.counters.text_deleted);
                self.queues.count(&offer.queue, QueueCounter::Failed);
                tracing::debug!(queue = %offer.queue, job = %offer.job.id, msgid = %crate::ids::show(offer.job.frames.msgid()), %conn, "job failed (DEL)");
                self.job_done(&offer.job, cx);
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
        self.return_offer(offer.queue, offer.job, Returned::Disconnect, cx);
    }

    /// The connection closed while its long-poll ASK waits here: `NOPE` now.
    fn text_cancel(&mut self, conn: ConnId, cx: &mut Cx) {
        if let Some(waiter) = self.waits.remove(conn) {
            cx.out.text(&waiter.port, TextReply::new(conn, TextOutcome::Nope));
        }
    }

    /// An offer came back: one setback of its job (text-protocol.md
    /// "Limits on connections"). Out of retries the job goes to the dead
    /// set like an eMQP job whose workers died (`dead.rs`); otherwise back
    /// to the front of its queue.
    fn return_offer(&mut self, queue: QueueName, mut job: Job, why: Returned, cx: &mut Cx) {
        debug_assert_eq!(job.queue_bytes(), &queue.0[..]);
        let counters = &self.ctx.counters;
        Counters::bump(match why {
            Returned::Disconnect => &counters.text_returned_disconnect,
            Returned::Timeout => &counters.text_returned_timeout,
        });
        job.set_redeliveries(job.redeliveries() + 1);
        if self.out_of_retries(&job) {
            Counters::bump(&counters.text_dead_lettered);
        }
        self.handle_set_back(job, Setback::Returned, cx);
    }

    pub(super) fn offer_timeout_due(&mut self, conn: ConnId, cx: &mut Cx) {
        match self.offers.check(conn, cx.now) {
            OfferCheck::None => {}
            OfferCheck::NotBefore(deadline) => self.timers.arm(deadline, Timer::OfferTimeout(conn)),
            OfferCheck::Lapsed(offer) => {
                let offer = *offer;
                tracing::debug!(queue = %offer.queue, job = %offer.job.id, msgid = %crate::ids::show(offer.job.frames.msgid()), %conn, "text offer timed out");
                self.return_offer(offer.queue, offer.job, Returned::Timeout, cx);
            }
        }
    }

    pub(super) fn ask_timeout_due(&mut self, conn: ConnId, cx: &mut Cx) {
        match self.waits.check(conn, cx.now) {
            WaitCheck::None => {}
            WaitCheck::NotBefore(deadline) => self.timers.arm(deadline, Timer::AskTimeout(conn)),
            WaitCheck::Lapsed(waiter) => {
                Counters::bump(&self.ctx.counters.text_ask_waits_expired);
                cx.out.text(&waiter.port, TextReply::new(conn, TextOutcome::Nope));
            }
        }
    }
}
