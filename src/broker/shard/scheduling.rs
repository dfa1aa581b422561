//! Scheduler handlers, on shard 0: INFORM, HEARTBEAT (and re-admission),
//! SCHEDULE/UNSCHEDULE routing and answers, heartbeats to schedulers,
//! expiry.
//!
//! Fixes of EventMQ 0.3.13's router (docs/emqp.md "Schedulers"): a failed
//! forward is retried on the next scheduler; forwarding does not count as
//! the scheduler's heartbeat; a repeated INFORM does not duplicate the
//! entry; SCHEDULE with no scheduler gets an `ERROR NO_SCHEDULER` reply.
//!
//! **Routing** (emq's rule; EventMQ sent every SCHEDULE to its newest
//! scheduler, round-robin before this): a SCHEDULE or UNSCHEDULE goes to
//! the *owner* of its schedule key (the key the scheduler computes from the
//! job body, [`crate::scheduler::key`]): the scheduler the router gave the
//! key to, while it is registered, else the least loaded live scheduler,
//! ties broken by rendezvous hashing ([`super::owners`],
//! [`super::schedulers`]). So repeats and changes of a schedule always
//! reach the scheduler that holds it while it lives. The router first
//! checks the message with the scheduler's own rules ([`check_schedule`])
//! and refuses what a scheduler would refuse, with the same code and
//! reason: an EventMQ scheduler dies on such a message (S6). What the owner
//! answers (emq-scheduler: `REPLY` with the outcome, or `ERROR <CODE>
//! <text>`; EventMQ's scheduler: nothing) goes back to the client that
//! sent the message ([`super::answers`]). The other schedulers drop any
//! copy of the schedule they still hold from before a change of owner
//! (`copy_to_others`), so after any SCHEDULE of a key at most one live
//! emq-scheduler runs it.
//!
//! **A scheduler that dies** keeps its keys in the router's table: when it
//! comes back under its name (emq-scheduler keeps its name in its data
//! directory) they route to it again, and it restores their schedules
//! from its store. Meanwhile its schedules do not run, except that with a
//! shared Redis store another emq-scheduler takes them over once the dead
//! one's lease lapses ([`crate::scheduler::redis_store`]). A schedule sent
//! again while its owner was away belongs to its new owner from then on;
//! the old owner, back with its stored copy, drops that copy at the next
//! SCHEDULE of the key, and until then both may run it (apps that re-send
//! their schedules at start heal this at once).
//!
//! **Re-admission** (emq's rule): a HEARTBEAT on the frontend from a peer
//! the router does not know registers that peer as a scheduler again, and
//! it gets the ACK and HEARTBEAT of a fresh registration. Only schedulers
//! send HEARTBEATs on the frontend (clients never do, and a worker that
//! INFORMs there is refused before it could heartbeat), and a scheduler's
//! registration carries no data, so nothing is lost by taking the
//! heartbeat as its INFORM. It is the only thing that brings a real
//! EventMQ 0.3.13 scheduler back at once: it dies on `DISCONNECT` (its
//! handler raises, docs/emqp.md "Differences from EventMQ"), ignores `KBYE`, and any message from the
//! router (the acceptance REPLYs of its own REQUESTs included) resets its
//! 15 s liveness check, so a scheduler the router had expired after a
//! 7 s stall never registered again. Bounded by
//! [`crate::limits::MAX_SCHEDULERS`] like INFORM.

use super::owners::Name;
use super::tombstones::Kind;
use super::{Cx, Shard, Timer};
use crate::broker::egress::{Dest, OnFail, OutMsg, Outgoing};
use crate::broker::inbox::Schedule;
use crate::ids::{show, MsgId, PeerId};
use crate::limits;
use crate::metrics::counters::Counters;
use crate::protocol::emqp::{heartbeat_timestamp, new_msgid, Command, Frame, Message};
use crate::scheduler::schedule::check_schedule;

impl Shard {
    pub(super) fn handle_scheduler_inform(&mut self, id: PeerId, msgid: MsgId, name: Option<Vec<u8>>, cx: &mut Cx) {
        // An empty name frame decodes as no name (docs/emqp.md "Frames").
        if let Some(n) = name.as_ref().filter(|n| n.is_empty() || n.len() > limits::MAX_SCHEDULER_NAME_BYTES) {
            Counters::bump(&self.ctx.counters.rejected_inform);
            let text = format!("scheduler name of {} bytes: 1 to {} bytes", n.len(), limits::MAX_SCHEDULER_NAME_BYTES);
            return self.send_error(&id, msgid, "BAD_INFORM", text, cx);
        }
        if !self.admit_scheduler(&id, name, msgid, "scheduler registered", cx) {
            Counters::bump(&self.ctx.counters.rejected_inform);
        }
    }

    /// HEARTBEAT from a frontend peer: a registered scheduler is alive; an
    /// unknown one is re-admitted (module docs).
    pub(super) fn handle_scheduler_heartbeat(&mut self, id: PeerId, msgid: MsgId, cx: &mut Cx) {
        if self.schedulers.touch(&id, cx.now) {
            return;
        }
        if self.admit_scheduler(&id, None, msgid, "scheduler re-admitted on its HEARTBEAT", cx) {
            Counters::bump(&self.ctx.counters.readmitted_schedulers);
        }
    }

    /// Registers `id` (an INFORM, or a re-admitting HEARTBEAT whose msgid
    /// the ACK names) and sends the ACK and a first HEARTBEAT; refuses with
    /// `ERROR BUSY` past `max_schedulers` (counted). True when registered.
    fn admit_scheduler(&mut self, id: &PeerId, name: Option<Vec<u8>>, msgid: MsgId, what: &str, cx: &mut Cx) -> bool {
        let max = self.ctx.config.max_schedulers;
        if !self.schedulers.contains(id) && self.schedulers.len() >= max {
            Counters::bump(&self.ctx.counters.rejected_scheduler_limit);
            crate::log_limited!(warn, scheduler = %id, limit = max, "scheduler refused: too many schedulers");
            let text = format!("{max} schedulers are registered, the limit (max_schedulers)");
            self.send_error(id, msgid, "BUSY", text, cx);
            return false;
        }
        let shown = name.as_deref().map(show);
        tracing::info!(scheduler = %id, name = ?shown, "{what}");
        if name.as_deref().is_some_and(|n| self.schedulers.was_displaced(id, n)) {
            Counters::bump(&self.ctx.counters.scheduler_name_conflicts);
            crate::log_limited!(
                warn,
                scheduler = %id,
                name = ?shown,
                "two live schedulers share this name and take it from each other: give each its own name"
            );
        }
        if let Some(n) = name.as_deref() {
            self.deliver_tombstones(id, n, cx);
        }
        if let Some(old) = self.schedulers.add(id.clone(), name, cx.now) {
            tracing::info!(scheduler = %id, replaced = %old, "the name's earlier registration is replaced");
        }
        self.send(Dest::Frontend, id, Command::Ack { acked: msgid.0.to_vec() }, OnFail::Count, cx);
        self.send_heartbeat(Dest::Frontend, id, cx);
        true
    }

    /// SCHEDULE or UNSCHEDULE from `client` (module docs "Routing"):
    /// refused with the reason when invalid, else forwarded to the key's
    /// owner, which answers the client; the others drop any copy.
    pub(super) fn handle_schedule(&mut self, sched: Schedule, cx: &mut Cx) {
        let key = match check_schedule(&sched.body, sched.unschedule) {
            Ok(key) => key,
            Err(e) => {
                Counters::bump(&self.ctx.counters.rejected_schedule_invalid);
                tracing::info!(client = %sched.client, msgid = %sched.msgid, error = %e, "SCHEDULE refused");
                return self.send_error(&sched.client, sched.msgid, e.code(), e.to_string(), cx);
            }
        };
        self.answers.expire(cx.now, limits::SCHEDULE_ANSWER_TIMEOUT);
        if self.answers.len() >= limits::MAX_PENDING_SCHEDULE_ANSWERS {
            Counters::bump(&self.ctx.counters.rejected_schedule_busy);
            let text = format!("{} SCHEDULE answers are pending, the limit; retry later", self.answers.len());
            return self.send_error(&sched.client, sched.msgid, "BUSY", text, cx);
        }
        let k = key.as_str().as_bytes();
        let away = self.owners.get(k).filter(|name| self.schedulers.by_name(name).is_none());
        if let (true, Some(name)) = (sched.unschedule, away.as_ref()) {
            return self.defer_unschedule(&sched, k, name, cx);
        }
        let Some(owner) = self.route(k, sched.unschedule) else {
            return self.no_scheduler(&sched.client, sched.msgid, cx);
        };
        // Schedulers not connected now hear of it when they register
        // ([`super::tombstones`]): an UNSCHEDULE always; a SCHEDULE when it
        // moved the key from an owner that is away, or follows a tombstone.
        let kind = match sched.unschedule {
            true => Some(Kind::Unschedule),
            false if away.is_some() || self.tombstones.contains(k) => Some(Kind::Drop),
            false => None,
        };
        if let Some(kind) = kind {
            self.record_tombstone(k, kind, sched.frames.clone());
        }
        tracing::debug!(%key, scheduler = %owner, client = %sched.client, msgid = %sched.msgid, "routed");
        // Cannot fail: the table had room (checked above).
        let _ = self.answers.insert(owner.clone(), sched.msgid.clone(), sched.client.clone(), cx.now);
        self.copy_to_others(&owner, &sched, cx);
        let on_fail = OnFail::Schedule { client: sched.client.clone() };
        cx.out.emqp(Outgoing { dest: Dest::Frontend, peer: owner, msg: OutMsg::Frames(sched.frames), on_fail });
    }

    /// The scheduler that owns `key` ([`super::owners`] rules), counted as
    /// routed to; an UNSCHEDULE also forgets the key. `None` when no
    /// scheduler is registered.
    fn route(&mut self, key: &[u8], unschedule: bool) -> Option<PeerId> {
        let kept = self.owners.get(key).and_then(|name| self.schedulers.by_name(&name));
        let owner = match kept {
            Some(id) => id,
            None => {
                let owners = &self.owners;
                let (id, name) = self.schedulers.pick_for(key, |n| owners.load(n))?;
                if self.owners.assign(key, name) {
                    Counters::bump(&self.ctx.counters.schedule_owners_forgotten);
                }
                id
            }
        };
        if unschedule {
            self.owners.remove(key);
        }
        self.schedulers.count_routed(&owner);
        Some(owner)
    }

    /// Every scheduler but the owner forgets its copy of the schedule, if
    /// it holds one (from before a change of owner): an UNSCHEDULE goes to
    /// all of them, a SCHEDULE becomes a DROP for the emq-schedulers (an
    /// EventMQ scheduler knows no DROP, and an UNSCHEDULE would delete the
    /// record the owner keeps in a shared Redis store). Their copies carry a
    /// fresh msgid, so only the owner's answer reaches the client.
    fn copy_to_others(&mut self, owner: &PeerId, sched: &Schedule, cx: &mut Cx) {
        for (id, named) in self.schedulers.others(owner) {
            let word: &[u8] = match (sched.unschedule, named) {
                (true, _) => b"UNSCHEDULE",
                (false, true) => b"DROP",
                (false, false) => continue,
            };
            let mut frames = sched.frames.clone();
            if frames.len() > 3 {
                frames[2] = word.to_vec();
                frames[3] = new_msgid();
            }
            let msg = OutMsg::Frames(frames);
            cx.out.emqp(Outgoing { dest: Dest::Frontend, peer: id, msg, on_fail: OnFail::Unschedule });
        }
    }

    /// An UNSCHEDULE whose owner `owner` is not connected: the router
    /// keeps a tombstone that the owner gets before its ACK when it
    /// registers again ([`super::tombstones`]), sends the UNSCHEDULE to
    /// every connected scheduler (any of them may hold an older copy;
    /// fresh msgids, their answers are dropped), and answers the client
    /// itself: `REPLY` with `{"outcome":"deferred","key":…,"next_fire":null,
    /// "owner":<name>}` (docs/emqp.md "Schedulers"). Before this the
    /// UNSCHEDULE went to a live scheduler, which answered `not_found`, and
    /// the owner restored the schedule and ran it when it came back.
    fn defer_unschedule(&mut self, sched: &Schedule, key: &[u8], owner: &Name, cx: &mut Cx) {
        Counters::bump(&self.ctx.counters.schedule_unschedules_deferred);
        let shown = show(owner);
        tracing::info!(client = %sched.client, msgid = %sched.msgid, owner = %shown, "UNSCHEDULE deferred: its owner is not connected");
        self.owners.remove(key);
        self.record_tombstone(key, Kind::Unschedule, sched.frames.clone());
        for id in self.schedulers.ids() {
            self.schedulers.count_routed(&id);
            let mut frames = sched.frames.clone();
            if frames.len() > 3 {
                frames[3] = new_msgid();
            }
            cx.out.emqp(Outgoing {
                dest: Dest::Frontend,
                peer: id,
                msg: OutMsg::Frames(frames),
                on_fail: OnFail::Count,
            });
        }
        let detail = serde_json::json!({
            "outcome": "deferred",
            "key": String::from_utf8_lossy(key),
            "next_fire": null,
            "owner": shown,
        });
        let mut frames = Message::new(Command::Reply { body: sched.msgid.0.to_vec() }).encode();
        frames.push(detail.to_string().into_bytes());
        let msg = OutMsg::Frames(frames);
        cx.out.emqp(Outgoing { dest: Dest::Frontend, peer: sched.client.clone(), msg, on_fail: OnFail::Count });
    }

    /// Records a tombstone naming the connected emq-schedulers (they get the
    /// message now); counts and logs evictions.
    fn record_tombstone(&mut self, key: &[u8], kind: Kind, frames: Vec<Frame>) {
        let evicted = self.tombstones.record(key, kind, frames, self.schedulers.named());
        self.count_evicted_tombstones(evicted);
    }

    fn count_evicted_tombstones(&self, evicted: usize) {
        if evicted > 0 {
            let c = &self.ctx.counters.schedule_tombstones_evicted;
            c.fetch_add(evicted as u64, std::sync::atomic::Ordering::Relaxed);
            crate::log_limited!(
                warn,
                evicted,
                limit = limits::MAX_SCHEDULE_TOMBSTONES,
                "schedule tombstones forgotten to make room: a scheduler away since then may run those schedules again"
            );
        }
    }

    /// Sends scheduler `id`, registering under `name`, the UNSCHEDULE or
    /// DROP of every tombstone it has not had, before its ACK (module docs
    /// of [`super::tombstones`]).
    fn deliver_tombstones(&mut self, id: &PeerId, name: &[u8], cx: &mut Cx) {
        let name: Name = std::sync::Arc::from(name);
        let (messages, evicted) = self.tombstones.deliver(&name);
        self.count_evicted_tombstones(evicted);
        for (kind, mut frames) in messages {
            Counters::bump(&self.ctx.counters.schedule_tombstones_delivered);
            if frames.len() > 3 {
                frames[2] = match kind {
                    Kind::Unschedule => b"UNSCHEDULE".to_vec(),
                    Kind::Drop => b"DROP".to_vec(),
                };
                frames[3] = new_msgid();
            }
            let msg = OutMsg::Frames(frames);
            cx.out.emqp(Outgoing { dest: Dest::Frontend, peer: id.clone(), msg, on_fail: OnFail::Count });
        }
    }

    fn no_scheduler(&mut self, client: &PeerId, msgid: MsgId, cx: &mut Cx) {
        Counters::bump(&self.ctx.counters.rejected_no_scheduler);
        self.send_error(client, msgid, "NO_SCHEDULER", "no scheduler is connected".into(), cx);
    }

    /// A REPLY or ERROR from a frontend peer about `refers_to`: a
    /// scheduler's answer to a SCHEDULE/UNSCHEDULE goes, verbatim, to the
    /// client that sent it.
    pub(super) fn handle_scheduler_answer(&mut self, id: PeerId, refers_to: MsgId, frames: Vec<Frame>, cx: &mut Cx) {
        let error = frames.get(2).is_some_and(|w| w.as_slice() == b"ERROR");
        if error {
            Counters::bump(&self.ctx.counters.scheduler_errors);
            let (code, text) = (frames.get(5).map(|f| show(f)), frames.get(6).map(|f| show(f)));
            tracing::info!(scheduler = %id, msgid = %refers_to, ?code, ?text, "scheduler refused a message");
        }
        match self.answers.take(&id, &refers_to) {
            Some(client) => {
                Counters::bump(&self.ctx.counters.schedule_answers_forwarded);
                let msg = OutMsg::Frames(frames);
                cx.out.emqp(Outgoing { dest: Dest::Frontend, peer: client, msg, on_fail: OnFail::Count });
            }
            None => {
                Counters::bump(&self.ctx.counters.schedule_answers_unmatched);
                tracing::debug!(peer = %id, msgid = %refers_to, error, "answer nobody waits for (dropped)");
            }
        }
    }

    /// A forward to scheduler `id` failed: it is forgotten, and a SCHEDULE
    /// or UNSCHEDULE for which it was the owner is routed again.
    pub(super) fn handle_scheduler_send_failed(&mut self, id: PeerId, retry: Option<Schedule>, cx: &mut Cx) {
        tracing::warn!(scheduler = %id, "scheduler unreachable; removed");
        self.schedulers.remove(&id);
        if let Some(sched) = retry {
            self.answers.take(&id, &sched.msgid);
            self.handle_schedule(sched, cx);
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
        let expired = self.answers.expire(cx.now, limits::SCHEDULE_ANSWER_TIMEOUT);
        self.ctx.counters.schedule_answers_expired.fetch_add(expired as u64, std::sync::atomic::Ordering::Relaxed);
        self.arm_scheduler_expiry(cx.now);
    }

    /// Arms the next scheduler expiry check at the earliest instant a
    /// registered scheduler can be silent for `heartbeat_timeout`, rounded
    /// up to the heartbeat grid, as for workers (docs/emqp.md "Liveness":
    /// never early, at most one grid step late); with none registered, one
    /// timeout from `now` (a scheduler registering later expires no
    /// earlier than that, and a message only moves its deadline later).
    /// Before this, the check ran every half timeout, so a silent
    /// scheduler went after up to 1.5 × the timeout (7.1–8.3 s for 5 s).
    pub(super) fn arm_scheduler_expiry(&mut self, now: std::time::Instant) {
        let timeout = self.ctx.config.heartbeat_timeout;
        let deadline = self.schedulers.earliest_seen().map_or(now + timeout, |seen| seen + timeout);
        self.timers.arm(self.grid.ceil(deadline.max(now)), Timer::SchedulerExpiry);
    }

    /// KBYE to every scheduler (shutdown).
    pub(super) fn kbye_schedulers(&mut self, cx: &mut Cx) {
        for id in self.schedulers.ids() {
            self.send(Dest::Frontend, &id, Command::Kbye, OnFail::Count, cx);
        }
    }
}
