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
//! duplicate keys; every command has a timeout (connect
//! [`limits::SCHEDULER_REDIS_CONNECT_TIMEOUT`], read and write
//! [`limits::SCHEDULER_REDIS_IO_TIMEOUT`]), so a paused Redis cannot block
//! the scheduler (EventMQ's blocked); a put and a delete are each one Lua script
//! (`EVAL`), which Redis runs atomically like a `MULTI`/`EXEC` transaction,
//! so a crash between two commands cannot leave a record without its place
//! in the list (or the other way round). A script has one reply, so a
//! paused Redis costs one read timeout per write (a transaction of four
//! commands waited for six replies, one timeout each).
//!
//! **Sharing one Redis among emq-schedulers** (emq extension keys, ignored
//! by Python): each scheduler holds a lease, `emq:scheduler:alive:<name>`
//! (expires after [`limits::SCHEDULER_REDIS_LEASE`], renewed on every
//! [`Store::reconcile`]), and each schedule names its owner in
//! `emq:scheduler:owner:<key>` (written with the record). A scheduler
//! loads only the schedules it owns or can claim: those with no owner
//! (written by a Python scheduler, or before owners existed) or whose
//! owner's lease has lapsed; a claim is one atomic `EVAL`. So when a
//! scheduler dies, another takes its schedules over within a lease and a
//! reconcile period, and a schedule the router gave to another scheduler
//! since (its owner changed) is dropped from memory here.
//!
//! **Next fires** (emq extension, ignored by Python): `emq:scheduler:next:<key>`
//! holds [`Stored::next_fire`] as Unix milliseconds, written with the
//! record (so at every run) and deleted with it; a record without one is
//! restored as if registered at the restart.
//!
//! Limitation: since only the rewritten headers are stored, a client that
//! re-sends the original `run_count:N` SCHEDULE after a restart counts as a
//! changed definition (replaced, with a haste run). The embedded
//! [`super::store::FileStore`] keeps the original frames and has no such gap.

use std::collections::HashSet;

use super::key::ScheduleKey;
use super::store::{Reconciled, Store, StoreError, Stored};
use crate::limits;
use crate::protocol::headers;
use crate::protocol::pyjson::{self, PyJson};

/// The LIST of schedule keys (EventMQ's name).
pub const LIST_KEY: &str = "interval_jobs";
/// Prefix of a scheduler's lease key (emq extension): `<prefix><name>`.
pub const ALIVE_PREFIX: &str = "emq:scheduler:alive:";
/// Prefix of a schedule's owner key (emq extension): `<prefix><key>`.
pub const OWNER_PREFIX: &str = "emq:scheduler:owner:";
/// Prefix of a schedule's next-fire key (emq extension): `<prefix><key>`,
/// Unix milliseconds as text.
pub const NEXT_PREFIX: &str = "emq:scheduler:next:";

/// Claims `KEYS[1]` (an owner key) for `ARGV[1]` unless another scheduler
/// whose lease (`ARGV[2]` .. owner) is alive holds it. Returns 1 if the
/// caller owns the schedule now.
const CLAIM: &str = r"
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] and redis.call('EXISTS', ARGV[2] .. cur) == 1 then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
return 1
";

/// Stores a schedule: `KEYS` = record key, list, owner key, next-fire
/// key; `ARGV` = record, owner name, next fire (Unix ms, or empty when
/// unknown). The key ends up listed exactly once.
const PUT: &str = r"
redis.call('SET', KEYS[1], ARGV[1])
redis.call('LREM', KEYS[2], 0, KEYS[1])
redis.call('LPUSH', KEYS[2], KEYS[1])
redis.call('SET', KEYS[3], ARGV[2])
if ARGV[3] == '' then redis.call('DEL', KEYS[4]) else redis.call('SET', KEYS[4], ARGV[3]) end
return 1
";

/// Deletes a schedule: `KEYS` = record key, list, owner key, next-fire key.
const DELETE: &str = r"
redis.call('LREM', KEYS[2], 0, KEYS[1])
redis.call('DEL', KEYS[1], KEYS[3], KEYS[4])
return 1
";

/// A Redis-backed [`Store`], shared safely by several emq-schedulers (module
/// docs). Reconnects on the next operation after a connection error.
pub struct RedisStore {
    client: redis::Client,
    con: Option<redis::Connection>,
    /// This scheduler's name: its lease and the owner it writes.
    name: String,
    /// The keys this scheduler holds.
    mine: HashSet<String>,
}

fn rerr(e: redis::RedisError) -> StoreError {
    StoreError::Redis(e.to_string())
}

impl RedisStore {
    /// A store at `url` (`redis://[:password@]host:port/db`) for the
    /// scheduler named `name`. Does not connect yet: an unreachable server
    /// shows up on the first operation (the scheduler starts, schedules
    /// from memory and retries).
    ///
    /// # Errors
    /// [`StoreError::Redis`] for a bad URL.
    pub fn open(url: &str, name: &str) -> Result<RedisStore, StoreError> {
        let client = redis::Client::open(url).map_err(rerr)?;
        Ok(RedisStore { client, con: None, name: name.to_string(), mine: HashSet::new() })
    }

    fn con(&mut self) -> Result<&mut redis::Connection, StoreError> {
        if self.con.is_none() {
            let con = self.client.get_connection_with_timeout(limits::SCHEDULER_REDIS_CONNECT_TIMEOUT).map_err(rerr)?;
            con.set_read_timeout(Some(limits::SCHEDULER_REDIS_IO_TIMEOUT)).map_err(rerr)?;
            con.set_write_timeout(Some(limits::SCHEDULER_REDIS_IO_TIMEOUT)).map_err(rerr)?;
            self.con = Some(con);
        }
        self.con.as_mut().ok_or_else(|| StoreError::Redis("no connection".into()))
    }

    /// Runs a command or an atomic pipeline; a connection error drops the
    /// connection (the next operation reconnects).
    fn query<T: redis::FromRedisValue>(
        &mut self,
        run: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> Result<T, StoreError> {
        let result = run(self.con()?);
        result.map_err(|e| {
            if e.is_connection_dropped() || e.is_io_error() || e.is_timeout() {
                self.con = None;
            }
            rerr(e)
        })
    }

    /// Renews this scheduler's lease.
    fn renew(&mut self) -> Result<(), StoreError> {
        let (key, ms) = (format!("{ALIVE_PREFIX}{}", self.name), limits::SCHEDULER_REDIS_LEASE.as_millis() as u64);
        self.query(|c| redis::cmd("SET").arg(&key).arg(1).arg("PX").arg(ms).query::<()>(c))
    }

    /// Every listed key with its record, for the keys this scheduler owns or
    /// has just claimed; and the keys it held that another owns now.
    fn scan(&mut self) -> Result<Reconciled, StoreError> {
        self.renew()?;
        let keys: Vec<String> = self.query(|c| redis::cmd("LRANGE").arg(LIST_KEY).arg(0).arg(-1).query(c))?;
        let mut out = Reconciled::default();
        let mut seen = HashSet::new();
        for key in keys {
            if !seen.insert(key.clone()) {
                continue; // EventMQ's duplicates
            }
            let claim = redis::cmd("EVAL")
                .arg(CLAIM)
                .arg(1)
                .arg(format!("{OWNER_PREFIX}{key}"))
                .arg(&self.name)
                .arg(ALIVE_PREFIX)
                .clone();
            let owned: i64 = self.query(|c| claim.query(c))?;
            if owned == 0 {
                if self.mine.remove(&key) {
                    out.lost.extend(ScheduleKey::from_hex(&key));
                }
                continue;
            }
            let fresh = self.mine.insert(key.clone());
            if !fresh {
                continue;
            }
            let value: Option<String> = self.query(|c| redis::cmd("GET").arg(&key).query(c))?;
            let (Some(k), Some(value)) = (ScheduleKey::from_hex(&key), value) else {
                tracing::warn!(key = %key, "redis: listed key without a valid record");
                continue;
            };
            let next: Option<String> = self.query(|c| redis::cmd("GET").arg(format!("{NEXT_PREFIX}{key}")).query(c))?;
            match decode_record(&value) {
                Ok(mut stored) => {
                    stored.next_fire = next
                        .and_then(|ms| ms.trim().parse::<i64>().ok())
                        .and_then(chrono::DateTime::from_timestamp_millis);
                    out.claimed.push((k, stored))
                }
                Err(e) => tracing::warn!(key = %key, error = %e, "redis: skipping record"),
            }
        }
        for gone in self.mine.iter().filter(|k| !seen.contains(*k)).cloned().collect::<Vec<_>>() {
            // Unscheduled through another scheduler (a shared store).
            self.mine.remove(&gone);
            out.lost.extend(ScheduleKey::from_hex(&gone));
        }
        Ok(out)
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
/// let v = encode_record(&Stored { record, runs_left: Some(2), next_fire: None });
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
/// the headers' `run_count:N` (the next fire, kept under its own key, is
/// `None` here).
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
    Ok(Stored { record, runs_left, next_fire: None })
}

impl Store for RedisStore {
    /// The schedules this scheduler owns or can claim (module docs).
    fn load(&mut self) -> Result<Vec<(ScheduleKey, Stored)>, StoreError> {
        Ok(self.scan()?.claimed)
    }

    /// One script: the record, the key's one place in the list, and its
    /// owner (this scheduler).
    fn put(&mut self, key: &ScheduleKey, stored: &Stored) -> Result<(), StoreError> {
        let k = key.as_str();
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(PUT).arg(4).arg(k).arg(LIST_KEY).arg(format!("{OWNER_PREFIX}{k}")).arg(format!("{NEXT_PREFIX}{k}"));
        let next = stored.next_fire.map(|t| t.timestamp_millis().to_string()).unwrap_or_default();
        cmd.arg(encode_record(stored)).arg(&self.name).arg(next);
        self.query(|c| cmd.query::<i64>(c))?;
        self.mine.insert(k.to_string());
        Ok(())
    }

    /// One script: out of the list, record and owner deleted.
    fn delete(&mut self, key: &ScheduleKey) -> Result<(), StoreError> {
        let k = key.as_str();
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(DELETE).arg(4).arg(k).arg(LIST_KEY).arg(format!("{OWNER_PREFIX}{k}")).arg(format!("{NEXT_PREFIX}{k}"));
        self.query(|c| cmd.query::<i64>(c))?;
        self.mine.remove(k);
        Ok(())
    }

    fn sync(&mut self) -> Result<(), StoreError> {
        Ok(())
    }

    /// The record stays: the store is shared, and the new owner keeps it.
    fn forget(&mut self, key: &ScheduleKey) -> Result<(), StoreError> {
        self.mine.remove(key.as_str());
        Ok(())
    }

    /// Renews the lease, claims orphaned schedules and reports those
    /// another scheduler owns now.
    fn reconcile(&mut self) -> Result<Reconciled, StoreError> {
        self.scan()
    }
}
