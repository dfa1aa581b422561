//! Scheduler registry and SCHEDULE/UNSCHEDULE routing (shard 0 only).
//!
//! Fixes of EventMQ defects (spec §12): SCHEDULE goes round-robin over live
//! schedulers (D6); a failed forward is retried on the next scheduler (D7);
//! forwarding does not count as the scheduler's heartbeat (D7); a repeated
//! INFORM does not duplicate the entry (D12); SCHEDULE with no scheduler gets
//! an `ERROR` reply instead of vanishing.

use std::time::Instant;

use super::{Shard, Timer};
use crate::broker::msg::{Dest, OnFail, Outgoing};
use crate::broker::snapshot::SchedulerSnap;
use crate::broker::types::PeerId;
use crate::metrics::counters::Counters;
use crate::protocol::emqp::{heartbeat_timestamp, Command, Frame};

/// One registered scheduler.
#[derive(Debug)]
struct Entry {
    id: PeerId,
    last_seen: Instant,
    scheduled: u64,
}

/// Live schedulers in INFORM order, with a round-robin cursor.
#[derive(Debug, Default)]
pub struct Schedulers {
    list: Vec<Entry>,
    next: usize,
}

impl Schedulers {
    fn add(&mut self, id: PeerId, now: Instant) {
        self.remove(&id);
        self.list.push(Entry { id, last_seen: now, scheduled: 0 });
    }

    /// Refreshes a scheduler's liveness; unknown peers are ignored.
    pub fn touch(&mut self, id: &PeerId, now: Instant) {
        if let Some(e) = self.list.iter_mut().find(|e| &e.id == id) {
            e.last_seen = now;
        }
    }

    /// Forgets a scheduler (KBYE, expiry, unreachable).
    pub fn remove(&mut self, id: &PeerId) {
        self.list.retain(|e| &e.id != id);
    }

    /// The next scheduler in turn.
    fn pick(&mut self) -> Option<PeerId> {
        if self.list.is_empty() {
            return None;
        }
        self.next %= self.list.len();
        let e = &mut self.list[self.next];
        e.scheduled += 1;
        self.next += 1;
        Some(e.id.clone())
    }

    /// Snapshots with `hb` in seconds since `started`.
    pub fn snaps(&self, started: Instant) -> Vec<SchedulerSnap> {
        self.list
            .iter()
            .map(|e| SchedulerSnap {
                id: e.id.to_string(),
                hb: e.last_seen.saturating_duration_since(started).as_secs_f64(),
                scheduled: e.scheduled,
            })
            .collect()
    }
}

impl Shard {
    pub(super) fn handle_scheduler_inform(&mut self, id: PeerId, msgid: Frame, now: Instant) {
        tracing::info!(scheduler = %id, "scheduler registered");
        self.schedulers.add(id.clone(), now);
        self.send(Dest::Frontend, &id, Command::Ack { acked: msgid }, OnFail::Count);
        self.send(Dest::Frontend, &id, Command::Heartbeat { timestamp: heartbeat_timestamp() }, OnFail::Count);
    }

    pub(super) fn handle_schedule(&mut self, client: PeerId, msgid: Frame, frames: Vec<Frame>, unschedule: bool) {
        if unschedule {
            let ids: Vec<PeerId> = self.schedulers.list.iter().map(|e| e.id.clone()).collect();
            if ids.is_empty() {
                return self.no_scheduler(&client, msgid);
            }
            for id in ids {
                let out =
                    Outgoing { dest: Dest::Frontend, peer: id, frames: frames.clone(), on_fail: OnFail::Unschedule };
                self.out.send(out);
            }
            return;
        }
        match self.schedulers.pick() {
            Some(id) => {
                let on_fail = OnFail::Schedule { client };
                self.out.send(Outgoing { dest: Dest::Frontend, peer: id, frames, on_fail });
            }
            None => self.no_scheduler(&client, msgid),
        }
    }

    fn no_scheduler(&mut self, client: &PeerId, msgid: Frame) {
        Counters::bump(&self.ctx.counters.rejected_no_scheduler);
        self.send_error(client, msgid, "NO_SCHEDULER", "no scheduler is connected".into());
    }

    pub(super) fn handle_scheduler_send_failed(&mut self, id: PeerId, retry: Option<(PeerId, Vec<Frame>)>) {
        tracing::warn!(scheduler = %id, "scheduler unreachable; removed");
        self.schedulers.remove(&id);
        if let Some((client, frames)) = retry {
            let msgid = frames.get(3).cloned().unwrap_or_default();
            self.handle_schedule(client, msgid, frames, false);
        }
    }

    pub(super) fn scheduler_heartbeats_due(&mut self, now: Instant) {
        let ids: Vec<PeerId> = self.schedulers.list.iter().map(|e| e.id.clone()).collect();
        for id in ids {
            self.send(Dest::Frontend, &id, Command::Heartbeat { timestamp: heartbeat_timestamp() }, OnFail::Count);
        }
        self.timers.arm(now + self.ctx.config.heartbeat_interval, Timer::SchedulerHeartbeats);
    }

    pub(super) fn scheduler_expiry_due(&mut self, now: Instant) {
        let timeout = self.ctx.config.heartbeat_timeout;
        let before = self.schedulers.list.len();
        self.schedulers.list.retain(|e| {
            let alive = now.saturating_duration_since(e.last_seen) < timeout;
            if !alive {
                tracing::info!(scheduler = %e.id, "scheduler expired (heartbeat timeout)");
            }
            alive
        });
        for _ in self.schedulers.list.len()..before {
            Counters::bump(&self.ctx.counters.expired_schedulers);
        }
        // Checked every half timeout: a dead scheduler goes within 1.5 × timeout.
        self.timers.arm(now + timeout / 2, Timer::SchedulerExpiry);
    }

    /// KBYE to every scheduler (shutdown).
    pub(super) fn kbye_schedulers(&mut self) {
        let ids: Vec<PeerId> = self.schedulers.list.iter().map(|e| e.id.clone()).collect();
        for id in ids {
            self.send(Dest::Frontend, &id, Command::Kbye, OnFail::Count);
        }
    }
}
