//! The scheduler's state machine without sockets: the [`Timetable`] plus a
//! [`Store`], driven by SCHEDULE/UNSCHEDULE bodies and the clock. The peer
//! ([`super::peer`]) feeds it messages and sends what it returns.
//!
//! Store failures are logged and never stop scheduling: the in-memory
//! timetable stays authoritative for this run (EventMQ logged Redis errors
//! the same way).

use chrono::{DateTime, SecondsFormat, Utc};
use chrono_tz::Tz;

use super::key::{key_body, KeyError, ScheduleKey};
use super::schedule::{Definition, ScheduleError};
use super::store::{Store, StoreError, Stored};
use super::timetable::{Change, Fire, Outcome, Timetable};
use crate::client::body::PythonCall;
use crate::protocol::emqp::ScheduleBody;

/// Timetable + store. See the module docs.
pub struct Service {
    timetable: Timetable,
    store: Box<dyn Store>,
}

impl Service {
    /// Restores every stored schedule (no haste runs; first fires computed
    /// from `now`, docs/emqp.md "The scheduler"). Records that no longer validate are logged
    /// and skipped.
    ///
    /// # Errors
    /// [`StoreError`] when the store cannot be read.
    pub fn restore(tz: Tz, mut store: Box<dyn Store>, now: DateTime<Utc>) -> Result<Service, StoreError> {
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

    /// Handles a SCHEDULE received at `now` (docs/emqp.md "The scheduler" with the rules of
    /// [`Timetable::schedule`]). Returns the haste REQUEST to emit, if any.
    ///
    /// # Errors
    /// [`ScheduleError`] for a malformed SCHEDULE; nothing is changed.
    pub fn handle_schedule(&mut self, body: &ScheduleBody, now: DateTime<Utc>) -> Result<Option<Fire>, ScheduleError> {
        let def = Definition::from_body(body)?;
        let key = def.key.clone();
        let (outcome, haste, changes) = self.timetable.schedule(def, now)?;
        tracing::info!(key = %key, ?outcome, haste = haste.is_some(), "SCHEDULE");
        if outcome != Outcome::Unchanged {
            self.persist(changes);
        }
        Ok(haste)
    }

    /// Handles an UNSCHEDULE: removes the job with the body's key, interval
    /// or cron (docs/emqp.md "The scheduler"). Returns whether a job was removed.
    ///
    /// # Errors
    /// [`KeyError`] when the body (frame 7) cannot be keyed.
    pub fn handle_unschedule(&mut self, body: &ScheduleBody) -> Result<bool, KeyError> {
        let key = key_body(&body.body)?.key;
        let found = self.timetable.unschedule(&key);
        tracing::info!(key = %key, found, "UNSCHEDULE");
        self.persist(vec![Change::Delete(key)]);
        Ok(found)
    }

    /// The earliest fire time, if any job exists.
    pub fn next_deadline(&mut self) -> Option<DateTime<Utc>> {
        self.timetable.next_deadline()
    }

    /// Fires every job due at `now` and persists run counts and finished jobs.
    pub fn fire_due(&mut self, now: DateTime<Utc>) -> Vec<Fire> {
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
    /// "next_fire" (RFC 3339 UTC), "runs_left" (null = unlimited),
    /// "callable" (`module.function`)}`, earliest next fire first.
    pub fn schedules_json(&self) -> String {
        let rows: Vec<serde_json::Value> = self
            .timetable
            .list()
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
