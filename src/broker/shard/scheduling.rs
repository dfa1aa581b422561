//! Scheduler handlers, on shard 0: INFORM, HEARTBEAT (and re-admission),
//! SCHEDULE/UNSCHEDULE routing, heartbeats to schedulers, expiry.
//!
//! Fixes of EventMQ 0.3.13's router (docs/emqp.md "Schedulers"): a failed
//! forward is retried on the next scheduler; forwarding does not count as
//! the scheduler's heartbeat; a repeated INFORM does not duplicate the
//! entry; SCHEDULE with no scheduler gets an `ERROR NO_SCHEDULER` reply.
//!
//! **Re-admission** (emq's rule): a HEARTBEAT on the frontend from a peer
//! the router does not know registers that peer as a scheduler again, and
//! it gets the ACK and HEARTBEAT of a fresh registration. Only schedulers
//! send HEARTBEATs on the frontend (clients never do, and a worker that
//! INFORMs there is refused before it could heartbeat), and a scheduler's
//! registration carries no data, so nothing is lost by taking the
//! heartbeat as its INFORM. It is the only thing that brings a real
//! EventMQ 0.3.13 scheduler back at once: it dies on `DISCONNECT` (its
//! handler raises, spec §12 S10), ignores `KBYE`, and any message from the
//! router (the acceptance REPLYs of its own REQUESTs included) resets its
//! 15 s liveness check, so a scheduler the router had expired after a
//! 7 s stall never registered again. Bounded by
//! [`crate::limits::MAX_SCHEDULERS`] like INFORM.

use super::{Cx, Shard, Timer};
use crate::broker::msg::{Dest, OnFail, Outgoing};
use crate::ids::{MsgId, PeerId};
use crate::limits;
use crate::metrics::counters::Counters;
use crate::protocol::emqp::{heartbeat_timestamp, Command, Frame};

impl Shard {
    pub(super) fn handle_scheduler_inform(&mut self, id: PeerId, msgid: MsgId, cx: &mut Cx) {
        if !self.admit_scheduler(&id, msgid, "scheduler registered", cx) {
            Counters::bump(&self.ctx.counters.rejected_inform);
        }
    }

    /// HEARTBEAT from a frontend peer: a registered scheduler is alive; an
    /// unknown one is re-admitted (module docs).
    pub(super) fn handle_scheduler_heartbeat(&mut self, id: PeerId, msgid: MsgId, cx: &mut Cx) {
        if self.schedulers.touch(&id, cx.now) {
            return;
        }
        if self.admit_scheduler(&id, msgid, "scheduler re-admitted on its HEARTBEAT", cx) {
            Counters::bump(&self.ctx.counters.readmitted_schedulers);
        }
    }

    /// Registers `id` (an INFORM, or a re-admitting HEARTBEAT whose msgid
    /// the ACK names) and sends the ACK and a first HEARTBEAT; refuses with
    /// `ERROR BUSY` past [`limits::MAX_SCHEDULERS`]. True when registered.
    fn admit_scheduler(&mut self, id: &PeerId, msgid: MsgId, what: &str, cx: &mut Cx) -> bool {
        if !self.schedulers.contains(id) && self.schedulers.len() >= limits::MAX_SCHEDULERS {
            tracing::warn!(scheduler = %id, limit = limits::MAX_SCHEDULERS, "scheduler refused: too many schedulers");
            let text = format!("{} schedulers are registered, the limit", limits::MAX_SCHEDULERS);
            self.send_error(id, msgid, "BUSY", text, cx);
            return false;
        }
        tracing::info!(scheduler = %id, "{what}");
        self.schedulers.add(id.clone(), cx.now);
        self.send(Dest::Frontend, id, Command::Ack { acked: msgid.0 }, OnFail::Count, cx);
        self.send(Dest::Frontend, id, Command::Heartbeat { timestamp: heartbeat_timestamp() }, OnFail::Count, cx);
        true
    }

    pub(super) fn handle_schedule(
        &mut self,
        client: PeerId,
        msgid: MsgId,
        frames: Vec<Frame>,
        unschedule: bool,
        cx: &mut Cx,
    ) {
        if unschedule {
            let ids = self.schedulers.ids();
            if ids.is_empty() {
                return self.no_scheduler(&client, msgid, cx);
            }
            for id in ids {
                let out =
                    Outgoing { dest: Dest::Frontend, peer: id, frames: frames.clone(), on_fail: OnFail::Unschedule };
                cx.out.emqp(out);
            }
            return;
        }
        match self.schedulers.pick() {
            Some(id) => {
                let on_fail = OnFail::Schedule { client };
                cx.out.emqp(Outgoing { dest: Dest::Frontend, peer: id, frames, on_fail });
            }
            None => self.no_scheduler(&client, msgid, cx),
        }
    }

    fn no_scheduler(&mut self, client: &PeerId, msgid: MsgId, cx: &mut Cx) {
        Counters::bump(&self.ctx.counters.rejected_no_scheduler);
        self.send_error(client, msgid, "NO_SCHEDULER", "no scheduler is connected".into(), cx);
    }

    pub(super) fn handle_scheduler_send_failed(
        &mut self,
        id: PeerId,
        retry: Option<(PeerId, Vec<Frame>)>,
        cx: &mut Cx,
    ) {
        tracing::warn!(scheduler = %id, "scheduler unreachable; removed");
        self.schedulers.remove(&id);
        if let Some((client, frames)) = retry {
            let msgid = MsgId(frames.get(3).cloned().unwrap_or_default());
            self.handle_schedule(client, msgid, frames, false, cx);
        }
    }

    pub(super) fn scheduler_heartbeats_due(&mut self, cx: &mut Cx) {
        for id in self.schedulers.ids() {
            self.send(Dest::Frontend, &id, Command::Heartbeat { timestamp: heartbeat_timestamp() }, OnFail::Count, cx);
        }
        self.timers.arm(cx.now + self.ctx.config.heartbeat_interval, Timer::SchedulerHeartbeats);
    }

    pub(super) fn scheduler_expiry_due(&mut self, cx: &mut Cx) {
        let timeout = self.ctx.config.heartbeat_timeout;
        for id in self.schedulers.expire(cx.now, timeout) {
            tracing::info!(scheduler = %id, "scheduler expired (heartbeat timeout)");
            Counters::bump(&self.ctx.counters.expired_schedulers);
        }
        // Checked every half timeout: a dead scheduler goes within 1.5 × timeout.
        self.timers.arm(cx.now + timeout / 2, Timer::SchedulerExpiry);
    }

    /// KBYE to every scheduler (shutdown).
    pub(super) fn kbye_schedulers(&mut self, cx: &mut Cx) {
        for id in self.schedulers.ids() {
            self.send(Dest::Frontend, &id, Command::Kbye, OnFail::Count, cx);
        }
    }
}
