//! The scheduler's state machine without sockets: the [`Timetable`] plus a
//! [`Store`], driven by SCHEDULE/UNSCHEDULE bodies and the clock. The peer
//! ([`super::peer`]) feeds it messages and sends what it returns.
//!
//! Store failures are logged and never stop scheduling: the in-memory
//! timetable stays authoritative for this run (EventMQ logged Redis errors
//! the same way, S14).

use chrono::{DateTime, SecondsFormat, Utc};
use chrono_tz::Tz;

use super::key::{key_body, KeyError, ScheduleKey};
use super::schedule::{Definition, ScheduleError};
use super::store::{Store, StoreError, Stored};
use super::timetable::{Change, Fire, Now, Outcome, Timetable};
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
    /// The REPLY's D5: `{"outcome": …, "key": …, "next_fire": RFC 3339 UTC
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
}

impl Service {
    /// Restores every stored schedule (no haste runs; first fires computed
    /// from `now`, spec §7.7). Records that no longer validate are logged
    /// and skipped.
    ///
    /// # Errors
    /// [`StoreError`] when the store cannot be read.
    pub fn restore(tz: Tz, mut store: Box<dyn Store>, now: Now) -> Result<Service, StoreError> {
        let mut timetable = Timetable::new(tz);
        for (key, stored) in store.load()? {
            let restored = Definition::from_record(stored.record).and_then(|def| {
                if def.key != key {
                    tracing::warn!(stored = %key, computed = %def.key, "stored key differs from the body's key");
                }
                timetable.restore(def, stored.runs_left, now)
            });
            if let Err(e) = restored {
                tracing::warn!(key = %key, error = %e, "skipping stored schedule");
            }
        }
        tracing::info!(schedules = timetable.len(), "restored schedules");
        Ok(Service { timetable, store })
    }

    /// The timetable (read-only).
    pub fn timetable(&self) -> &Timetable {
        &self.timetable
    }

    /// Handles a SCHEDULE received at `now` (spec §7.2 with the rules of
    /// [`Timetable::schedule`]). Returns the answer for the client and the
    /// haste REQUEST to emit, if any.
    ///
    /// # Errors
    /// [`ScheduleError`] for a malformed SCHEDULE; nothing is changed.
    pub fn handle_schedule(&mut self, body: &ScheduleBody, now: Now) -> Result<(Answer, Option<Fire>), ScheduleError> {
        let def = Definition::from_body(body)?;
        let key = def.key.clone();
        let (outcome, haste, changes) = self.timetable.schedule(def, now)?;
        tracing::info!(key = %key, ?outcome, haste = haste.is_some(), "SCHEDULE");
        if outcome != Outcome::Unchanged {
            self.persist(changes);
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
    /// or cron (spec §7.6, fixing S4). The answer says whether there was one
    /// (`unscheduled` or `not_found`).
    ///
    /// # Errors
    /// [`KeyError`] when the body (D7) cannot be keyed.
    pub fn handle_unschedule(&mut self, body: &ScheduleBody) -> Result<Answer, KeyError> {
        let key = key_body(&body.body)?.key;
        let found = self.timetable.unschedule(&key);
        tracing::info!(key = %key, found, "UNSCHEDULE");
        self.persist(vec![Change::Delete(key.clone())]);
        Ok(Answer { key, outcome: if found { "unscheduled" } else { "not_found" }, next_fire: None })
    }

    /// Handles a DROP (emq extension): another scheduler owns this key now,
    /// so this one forgets its copy; the store forgets it too
    /// ([`Store::forget`]: a file store deletes it, a shared Redis store
    /// leaves the record to its new owner). Undecodable bodies are logged.
    pub fn handle_drop(&mut self, body: &ScheduleBody) {
        let key = match key_body(&body.body) {
            Ok(k) => k.key,
            Err(e) => return tracing::warn!(error = %e, "DROP with a bad body ignored"),
        };
        if self.timetable.unschedule(&key) {
            tracing::info!(key = %key, "DROP: another scheduler owns this schedule now; forgotten here");
            if let Err(e) = self.store.forget(&key) {
                tracing::error!(key = %key, error = %e, "cannot forget a dropped schedule in the store");
            }
        }
    }

    /// The earliest fire time on the monotonic clock, if any job exists.
    pub fn next_deadline(&mut self) -> Option<std::time::Instant> {
        self.timetable.next_deadline()
    }

    /// Fires every job due at `now` and persists run counts and finished jobs.
    pub fn fire_due(&mut self, now: Now) -> Vec<Fire> {
        let (fires, changes) = self.timetable.fire_due(now);
        self.persist(changes);
        fires
    }

    /// Makes persisted changes durable (once per loop turn).
    pub fn sync(&mut self) {
        if let Err(e) = self.store.sync() {
            tracing::error!(error = %e, "cannot sync the schedule store");
        }
    }

    fn persist(&mut self, changes: Vec<Change>) {
        for change in changes {
            let result = match &change {
                Change::Put(key, runs_left) => match self.timetable.get(key) {
                    Some((def, _)) => {
                        self.store.put(key, &Stored { record: def.record.clone(), runs_left: *runs_left })
                    }
                    None => Ok(()),
                },
                Change::Delete(key) => self.store.delete(key),
            };
            if let Err(e) = result {
                tracing::error!(error = %e, ?change, "cannot persist schedule change");
            }
        }
    }

    /// The `SCHEDULES` admin reply: a JSON array of
    /// `{"key", "queue", "kind": "interval"|"cron", "interval_secs"|"cron",
    /// "next_fire" (RFC 3339 UTC), "runs_left" (null = unlimited)}`, earliest
    /// next fire first.
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
