//! Redis persistence with EventMQ 0.3.13's key layout (docs/emqp.md "The scheduler"), so a
//! Python scheduler and emq-scheduler can read each other's schedules:
//!
//! * a LIST `interval_jobs` holding the keys of interval **and** cron jobs;
//! * per key, a STRING holding `json.dumps([queue, headers, interval, body,
//!   cron])` (Python formatting, body double-encoded);
//! * after each run of a `run_count` job the headers are rewritten with
//!   `run_count:<remaining>` (as Python does; the haste run's decrement is
//!   persisted too; EventMQ did not).
//!
//! Differences from Python, all fixes: restore works; the LIST gets no
//! duplicate keys; an unreachable server is an error at startup.
//! Limitation: since only the rewritten headers are stored, a client that
//! re-sends the original `run_count:N` SCHEDULE after a restart counts as a
//! changed definition (replaced, with a haste run). The embedded
//! [`super::store::FileStore`] keeps the original frames and has no such gap.

use std::collections::HashSet;

use super::key::ScheduleKey;
use super::store::{Store, StoreError, Stored};
use crate::protocol::headers;
use crate::protocol::pyjson::{self, PyJson};

/// The LIST of schedule keys (EventMQ's name).
pub const LIST_KEY: &str = "interval_jobs";

/// A Redis-backed [`Store`]. Reconnects on the next operation after a
/// connection error.
pub struct RedisStore {
    client: redis::Client,
    con: Option<redis::Connection>,
    listed: HashSet<String>,
}

fn rerr(e: redis::RedisError) -> StoreError {
    StoreError::Redis(e.to_string())
}

impl RedisStore {
    /// Connects to `url` (`redis://[:password@]host:port/db`) and checks the
    /// server answers.
    ///
    /// # Errors
    /// [`StoreError::Redis`] for a bad URL or an unreachable server.
    pub fn connect(url: &str) -> Result<RedisStore, StoreError> {
        let client = redis::Client::open(url).map_err(rerr)?;
        let mut store = RedisStore { client, con: None, listed: HashSet::new() };
        let _: String = store.run(&redis::cmd("PING"))?;
        Ok(store)
    }

    fn run<T: redis::FromRedisValue>(&mut self, cmd: &redis::Cmd) -> Result<T, StoreError> {
        if self.con.is_none() {
            self.con = Some(
                self.client
                    .get_connection_with_timeout(crate::limits::SCHEDULER_REDIS_CONNECT_TIMEOUT)
                    .map_err(rerr)?,
            );
        }
        let con = self.con.as_mut().ok_or_else(|| StoreError::Redis("no connection".into()))?;
        cmd.query(con).map_err(|e| {
            if e.is_connection_dropped() || e.is_io_error() {
                self.con = None;
            }
            rerr(e)
        })
    }
}

/// The STRING value EventMQ stores for a schedule: Python's `json.dumps` of
/// the five frames, with the headers' `run_count:` token set to `runs_left`
/// when the job has a run count (docs/emqp.md "The scheduler").
///
/// ```
/// use emq::scheduler::redis_store::encode_record;
/// use emq::scheduler::store::Stored;
/// let record = ["default".into(), "guarantee,run_count:5".into(), "60".into(), "[\"run\", {}]".into(), "".into()];
/// let v = encode_record(&Stored { record, runs_left: Some(2) });
/// assert_eq!(v, r#"["default", "guarantee,run_count:2", "60", "[\"run\", {}]", ""]"#);
/// ```
pub fn encode_record(stored: &Stored) -> String {
    let mut record = stored.record.clone();
    if let Some(n) = stored.runs_left {
        record[1] = record[1]
            .split(',')
            .map(|h| if h.contains("run_count:") { format!("run_count:{n}") } else { h.to_string() })
            .collect::<Vec<_>>()
            .join(",");
    }
    PyJson::Array(record.iter().map(|s| PyJson::Str(pyjson::py_str(s))).collect()).dumps(false)
}

/// Reads a STRING value back: the five frames, and the runs left taken from
/// the headers' `run_count:N`.
///
/// # Errors
/// [`StoreError::Redis`] when the value is not a JSON array of 5 strings.
pub fn decode_record(value: &str) -> Result<Stored, StoreError> {
    let fields: Vec<String> = serde_json::from_str(value).map_err(|e| StoreError::Redis(format!("bad record: {e}")))?;
    let record: [String; 5] =
        fields.try_into().map_err(|_| StoreError::Redis("bad record: not 5 fields".to_string()))?;
    let runs_left = headers::value(record[1].as_bytes(), b"run_count")
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|v| v.trim().parse().ok());
    Ok(Stored { record, runs_left })
}

impl Store for RedisStore {
    fn load(&mut self) -> Result<Vec<(ScheduleKey, Stored)>, StoreError> {
        let keys: Vec<String> = self.run(redis::cmd("LRANGE").arg(LIST_KEY).arg(0).arg(-1))?;
        let mut out = Vec::new();
        for key in keys {
            if !self.listed.insert(key.clone()) {
                continue; // EventMQ's duplicates
            }
            let value: Option<String> = self.run(redis::cmd("GET").arg(&key))?;
            let (Some(k), Some(value)) = (ScheduleKey::from_hex(&key), value) else {
                tracing::warn!(key = %key, "redis: listed key without a valid record");
                continue;
            };
            match decode_record(&value) {
                Ok(stored) => out.push((k, stored)),
                Err(e) => tracing::warn!(key = %key, error = %e, "redis: skipping record"),
            }
        }
        Ok(out)
    }

    fn put(&mut self, key: &ScheduleKey, stored: &Stored) -> Result<(), StoreError> {
        let _: () = self.run(redis::cmd("SET").arg(key.as_str()).arg(encode_record(stored)))?;
        if !self.listed.contains(key.as_str()) {
            let _: i64 = self.run(redis::cmd("LPUSH").arg(LIST_KEY).arg(key.as_str()))?;
            self.listed.insert(key.to_string());
        }
        Ok(())
    }

    fn delete(&mut self, key: &ScheduleKey) -> Result<(), StoreError> {
        let _: i64 = self.run(redis::cmd("LREM").arg(LIST_KEY).arg(0).arg(key.as_str()))?;
        let _: i64 = self.run(redis::cmd("DEL").arg(key.as_str()))?;
        self.listed.remove(key.as_str());
        Ok(())
    }

    fn sync(&mut self) -> Result<(), StoreError> {
        Ok(())
    }
}
