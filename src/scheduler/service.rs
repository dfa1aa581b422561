//! The scheduler's state machine without sockets: the [`Timetable`] plus a
//! [`Store`], driven by SCHEDULE/UNSCHEDULE bodies and the clock. The peer
//! ([`super::peer`]) feeds it messages and sends what it returns.
//!
//! **Store failures never stop scheduling** (emq's rule; EventMQ only
//! logged Redis errors and lost the change): the in-memory timetable
//! stays authoritative; a change the store cannot take is remembered (by
//! key: the latest state of each schedule is what gets written) and the
//! store is tried again every [`limits::SCHEDULER_STORE_RETRY`], not on
//! every change, so a store that times out costs the loop one timeout per
//! retry. A failure is logged at most once per
//! [`limits::SCHEDULER_STORE_LOG_EVERY`] (with how many were not), and the
//! recovery once. A store unreachable at start is loaded when it comes
//! back ([`Store::reconcile`] then reports its schedules).

use std::collections::BTreeSet;
use std::time::Instant;

use chrono::{DateTime, SecondsFormat, Utc};
use chrono_tz::Tz;

use super::key::{key_body, KeyError, ScheduleKey};
use super::schedule::{Definition, ScheduleError};
use super::store::{Fence, Store, StoreError, Stored};
use super::timetable::{Change, Fire, Now, Outcome, Timetable};
use crate::client::body::PythonCall;
use crate::limits;
use crate::protocol::emqp::ScheduleBody;

/// What a scheduler answers to a SCHEDULE or UNSCHEDULE it took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The schedule key.
    pub key: ScheduleKey,
    /// `added`, `replaced`, `unchanged`, `removed` (`run_count:0`),
    /// `unscheduled` or `not_found`.
    pub outcome: &'static str,
    /// The next fire time, if the schedule runs again.
    pub next_fire: Option<DateTime<Utc>>,
}

impl Answer {
    /// The REPLY's frame 5: `{"outcome": …, "key": …, "next_fire": RFC 3339 UTC
    /// or null}`.
    ///
    /// ```
    /// use emq::scheduler::service::Answer;
    /// let key = emq::scheduler::key::ScheduleKey::from_hex(&"a".repeat(40)).unwrap();
    /// let a = Answer { key, outcome: "not_found", next_fire: None };
    /// assert_eq!(a.to_json(), format!(r#"{{"outcome":"not_found","key":"{}","next_fire":null}}"#, "a".repeat(40)));
    /// ```
    pub fn to_json(&self) -> String {
        let next = self.next_fire.map(|t| t.to_rfc3339_opts(SecondsFormat::Secs, true));
        serde_json::json!({ "outcome": self.outcome, "key": self.key.as_str(), "next_fire": next }).to_string()
    }
}

/// Timetable + store. See the module docs.
pub struct Service {
    timetable: Timetable,
    store: Box<dyn Store>,
    /// Schedules whose latest state the store has not taken yet.
    dirty: BTreeSet<ScheduleKey>,
    /// While the store fails: when to try it again.
    retry_at: Option<Instant>,
    /// When the store's upkeep ([`Store::reconcile`]) runs next.
    upkeep_at: Instant,
    /// When a store failure was last logged, and how many since were not.
    logged: Option<(Instant, u64)>,
    /// A failure was logged and no recovery since.
    down_logged: bool,
}

impl Service {
    /// Restores every stored schedule (no haste runs; each keeps its phase
    /// from its stored next fire, and one that fell due while the
    /// scheduler was down fires once at once: [`Timetable::restore`],
    /// docs/emqp.md "The scheduler"). Records that no longer validate are logged
    /// and skipped. A store that cannot be read is logged and tried again
    /// later (module docs).
    pub fn restore(tz: Tz, mut store: Box<dyn Store>, now: Now) -> Service {
        let loaded = store.load();
        let mut service = Service {
            timetable: Timetable::new(tz),
            store,
            dirty: BTreeSet::new(),
            retry_at: None,
            upkeep_at: now.mono + limits::SCHEDULER_STORE_RETRY,
            logged: None,
            down_logged: false,
        };
        match loaded {
            Ok(stored) => service.add_stored(stored, now),
            Err(e) => {
                service.store_failed(&e, now.mono);
                service.upkeep_at = now.mono;
            }
        }
        tracing::info!(schedules = service.timetable.len(), "restored schedules");
        service
    }

    /// Adds stored schedules to the timetable (no haste runs).
    fn add_stored(&mut self, stored: Vec<(ScheduleKey, Stored)>, now: Now) {
        for (key, stored) in stored {
            let restored = Definition::from_record(stored.record).and_then(|def| {
                if def.key != key {
                    tracing::warn!(stored = %key, computed = %def.key, "stored key differs from the body's key");
                }
                self.timetable.restore(def, stored.runs_left, stored.next_fire, now)
            });
            if let Err(e) = restored {
                tracing::warn!(key = %key, error = %e, "skipping stored schedule");
            }
        }
    }

    /// The timetable (read-only).
    pub fn timetable(&self) -> &Timetable {
        &self.timetable
    }

    /// Handles a SCHEDULE received at `now` (docs/emqp.md "The scheduler" with the rules of
    /// [`Timetable::schedule`]). Returns the answer for the client and the
    /// haste REQUEST to emit, if any.
    ///
    /// # Errors
    /// [`ScheduleError`] for a malformed SCHEDULE; nothing is changed.
    pub fn handle_schedule(&mut self, body: &ScheduleBody, now: Now) -> Result<(Answer, Option<Fire>), ScheduleError> {
        let def = Definition::from_body(body)?;
        self.store.admit(&def.record).map_err(ScheduleError::TooBig)?;
        if let Fence::Closed(why) | Fence::Lost(why) = self.store.fence() {
            // Neither run nor kept: a standby may take the name before
            // the store can take the schedule.
            return Err(ScheduleError::NotActive(why));
        }
        let key = def.key.clone();
        let (outcome, haste, changes) = self.timetable.schedule(def, now)?;
        tracing::info!(key = %key, ?outcome, haste = haste.is_some(), "SCHEDULE");
        if outcome != Outcome::Unchanged {
            self.persist(changes, now);
        }
        let word = match outcome {
            Outcome::Added => "added",
            Outcome::Replaced => "replaced",
            Outcome::Unchanged => "unchanged",
            Outcome::Removed => "removed",
        };
        let next_fire = self.timetable.next_of(&key, now);
        Ok((Answer { key, outcome: word, next_fire }, haste))
    }

    /// Handles an UNSCHEDULE: removes the job with the body's key, interval
    /// or cron (EventMQ kept cron jobs running). The answer says whether there was one
    /// (`unscheduled` or `not_found`).
    ///
    /// # Errors
    /// [`KeyError`] when the body (frame 7) cannot be keyed.
    pub fn handle_unschedule(&mut self, body: &ScheduleBody) -> Result<Answer, KeyError> {
        let key = key_body(&body.body)?.key;
        let found = self.timetable.unschedule(&key);
        tracing::info!(key = %key, found, "UNSCHEDULE");
        self.persist(vec![Change::Delete(key.clone())], Now::read());
        Ok(Answer { key, outcome: if found { "unscheduled" } else { "not_found" }, next_fire: None })
    }

    /// Handles a DROP (emq extension): another scheduler owns this key now,
    /// so this one forgets its copy; the store forgets it too
    /// ([`Store::forget`]: a file store deletes it, a shared Redis store
    /// leaves the record to its new owner). Undecodable bodies are logged.
    pub fn handle_drop(&mut self, body: &ScheduleBody) {
        let key = match key_body(&body.body) {
            Ok(k) => k.key,
            Err(e) => {
                crate::log_limited!(warn, error = %e, "DROP with a bad body ignored");
                return;
            }
        };
        if self.timetable.unschedule(&key) {
            tracing::info!(key = %key, "DROP: another scheduler owns this schedule now; forgotten here");
            if let Err(e) = self.store.forget(&key) {
                self.dirty.insert(key);
                self.store_failed(&e, Instant::now());
            }
        }
    }

    /// The earliest fire time on the monotonic clock, if any job exists;
    /// while the store's fence is closed ([`Store::fence`]), no later than
    /// the next look at it.
    pub fn next_deadline(&mut self) -> Option<std::time::Instant> {
        let next = self.timetable.next_deadline();
        if self.store.fence() == Fence::Open {
            return next;
        }
        let look = Instant::now() + limits::SCHEDULER_NATS_LEASE_POLL;
        Some(next.map_or(look, |n| n.max(look)))
    }

    /// Why this scheduler must stop, once its store's lease is lost for
    /// good (another scheduler holds its name: [`Fence::Lost`]).
    pub fn lease_lost(&self) -> Option<String> {
        match self.store.fence() {
            Fence::Lost(why) => Some(why),
            _ => None,
        }
    }

    /// When [`Service::maintain`] has work next: a store retry or upkeep.
    pub fn next_maintenance(&self) -> Instant {
        self.retry_at.map_or(self.upkeep_at, |r| r.min(self.upkeep_at))
    }

    /// Fires every job due at `now` and persists run counts, next fires
    /// and finished jobs, **before** the fires are returned to be sent.
    /// Nothing fires while the store's fence is closed ([`Store::fence`]:
    /// a standby may hold the name); fires whose write ended after the
    /// fence closed are dropped, not sent (a run lost rather than run
    /// twice: docs in [`super::nats_store`]).
    pub fn fire_due(&mut self, now: Now) -> Vec<Fire> {
        if self.store.fence() != Fence::Open {
            return Vec::new();
        }
        let (fires, changes) = self.timetable.fire_due(now);
        self.persist(changes, now);
        if !fires.is_empty() {
            if let Fence::Closed(why) | Fence::Lost(why) = self.store.fence() {
                tracing::warn!(runs = fires.len(), why = %why, "runs not sent: the lease lapsed while they were stored");
                return Vec::new();
            }
        }
        fires
    }

    /// Makes persisted changes durable (once per loop turn; skipped while
    /// the store fails).
    pub fn sync(&mut self) {
        if self.retry_at.is_some() {
            return;
        }
        if let Err(e) = self.store.sync() {
            self.store_failed(&e, Instant::now());
        }
    }

    /// Retries a failing store when due, and runs the store's upkeep when
    /// due: schedules it reports as taken over are added (no haste run),
    /// those another scheduler owns now are forgotten.
    pub fn maintain(&mut self, now: Now) {
        let retry_due = self.retry_at.is_some_and(|at| now.mono >= at);
        if self.retry_at.is_some() && !retry_due {
            return;
        }
        if !self.dirty.is_empty() {
            self.flush(now);
            if self.retry_at.is_some() {
                return;
            }
        }
        if !retry_due && now.mono < self.upkeep_at {
            return;
        }
        self.upkeep_at = now.mono + limits::SCHEDULER_STORE_RETRY;
        match self.store.reconcile() {
            Ok(found) => {
                self.recovered();
                for key in &found.lost {
                    if self.timetable.unschedule(key) {
                        tracing::info!(key = %key, "another scheduler owns this schedule now; forgotten here");
                    }
                }
                let new: Vec<(ScheduleKey, Stored)> =
                    found.claimed.into_iter().filter(|(k, _)| !self.contains(k)).collect();
                if !new.is_empty() {
                    tracing::info!(schedules = new.len(), "schedules loaded from the store");
                }
                self.add_stored(new, now);
            }
            Err(e) => self.store_failed(&e, now.mono),
        }
    }

    /// Schedule changes still to be stored (while the store fails).
    pub fn unstored(&self) -> usize {
        self.dirty.len()
    }

    /// Notes the changed schedules and writes them, unless the store is
    /// failing and its retry is not due.
    fn persist(&mut self, changes: Vec<Change>, now: Now) {
        if changes.is_empty() {
            return;
        }
        for change in changes {
            let (Change::Put(key, _) | Change::Delete(key)) = change;
            self.dirty.insert(key);
        }
        if self.retry_at.is_none_or(|at| now.mono >= at) {
            self.flush(now);
        }
    }

    /// Writes the current state of every changed schedule (definition,
    /// runs left, next fire); stops at the first failure (the store is
    /// retried later).
    fn flush(&mut self, now: Now) {
        while let Some(key) = self.dirty.first().cloned() {
            let next_fire = self.timetable.next_of(&key, now);
            let result = match self.timetable.get(&key) {
                Some((def, runs_left)) => {
                    self.store.put(&key, &Stored { record: def.record.clone(), runs_left, next_fire })
                }
                None => self.store.delete(&key),
            };
            if let Err(e) = result {
                return self.store_failed(&e, now.mono);
            }
            self.dirty.remove(&key);
        }
        self.recovered();
    }

    /// The store answered: no retry pending; the recovery is logged once
    /// after a logged failure.
    fn recovered(&mut self) {
        if self.retry_at.take().is_some() && std::mem::take(&mut self.down_logged) {
            tracing::info!("the schedule store is reachable again; every change is stored");
        }
    }

    /// The store failed: retry later; log at most once per
    /// [`limits::SCHEDULER_STORE_LOG_EVERY`].
    fn store_failed(&mut self, e: &StoreError, now: Instant) {
        self.retry_at = Some(now + limits::SCHEDULER_STORE_RETRY);
        match &mut self.logged {
            Some((at, skipped)) if now.saturating_duration_since(*at) < limits::SCHEDULER_STORE_LOG_EVERY => {
                *skipped += 1;
            }
            logged => {
                let skipped = logged.map_or(0, |(_, n)| n);
                tracing::error!(
                    error = %e,
                    unstored = self.dirty.len(),
                    failures_not_logged = skipped,
                    retry_in = ?limits::SCHEDULER_STORE_RETRY,
                    "cannot reach the schedule store: scheduling from memory"
                );
                *logged = Some((now, 0));
                self.down_logged = true;
            }
        }
    }

    /// The `SCHEDULES` admin reply: a JSON array of
    /// `{"key", "queue", "kind": "interval"|"cron", "interval_secs"|"cron",
    /// "next_fire" (RFC 3339 UTC), "runs_left" (null = unlimited),
    /// "callable" (`module.function`)}`, earliest next fire first.
    pub fn schedules_json(&self, now: Now) -> String {
        let rows: Vec<serde_json::Value> = self
            .timetable
            .list(now)
            .into_iter()
            .map(|j| {
                let mut row = serde_json::Map::new();
                row.insert("key".into(), j.key.as_str().into());
                row.insert("queue".into(), j.queue.into());
                match (j.interval_secs, j.cron) {
                    (Some(secs), _) => {
                        row.insert("kind".into(), "interval".into());
                        row.insert("interval_secs".into(), secs.into());
                    }
                    (None, cron) => {
                        row.insert("kind".into(), "cron".into());
                        row.insert("cron".into(), cron.unwrap_or_default().into());
                    }
                }
                row.insert("next_fire".into(), j.next_fire.to_rfc3339_opts(SecondsFormat::Secs, true).into());
                row.insert("runs_left".into(), j.runs_left.into());
                row.insert("callable".into(), PythonCall::parse(j.body.as_bytes()).map(|c| c.name()).into());
                serde_json::Value::Object(row)
            })
            .collect();
        serde_json::Value::Array(rows).to_string()
    }

    /// Whether a job with `key` exists.
    pub fn contains(&self, key: &ScheduleKey) -> bool {
        self.timetable.get(key).is_some()
    }
}
