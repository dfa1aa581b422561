//! Persistence of schedules across restarts (EventMQ 0.3.13 never restored its own): the [`Store`] trait,
//! and [`FileStore`], the embedded default.
//!
//! # FileStore format
//! One append-only log, `<data dir>/schedules.log`. Each line is
//! `<crc32 of payload, 8 lowercase hex> <payload JSON>\n`, the payload being
//! `{"op":"put","key":K,"record":[queue,headers,interval,body,cron],"runs_left":N|null,"next_ms":T}`
//! or `{"op":"del","key":K}`; `next_ms` is [`Stored::next_fire`] in Unix
//! milliseconds, absent when unknown (logs written before it existed read
//! as unknown). A put is written at every run of a schedule (its next fire
//! moved), so the log grows by one line per run and is compacted as below.
//!
//! Crash safety:
//! * every change is one `write` of one whole line, so a `kill -9` loses
//!   nothing already written (the page cache survives the process);
//! * [`Store::sync`] (`fdatasync`) is called once per scheduler loop turn that
//!   changed something (group commit), so a power loss loses at most the last
//!   turn's changes;
//! * on load, a torn last line (no newline, or a bad checksum) is ignored and
//!   a bad line in the middle is skipped, each logged with its line number
//!   and why; a log with any such line is first **moved aside** as
//!   `schedules.log.damaged-<UTC time>`, so the compaction below never
//!   destroys the damaged original (an operator can still read it);
//! * after load, and when the log holds many dead lines, the log is compacted:
//!   live records are written to `schedules.log.tmp`, fsynced, renamed over
//!   the log, and the directory is fsynced. A crash at any point leaves either
//!   the old or the new log; a leftover `.tmp` is deleted on the next start.
//! * an exclusive lock on `<data dir>/lock` stops two schedulers sharing a
//!   directory.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::key::ScheduleKey;
use crate::limits;

/// A persisted schedule: SCHEDULE frames 4..8 as received, the runs left
/// (`None`: unlimited) and when it is due next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// `[queue, headers, interval, body, cron]` (the record of docs/emqp.md "The scheduler").
    pub record: [String; 5],
    /// Runs left of a `run_count` job.
    pub runs_left: Option<u64>,
    /// The wall time (UTC) the schedule was due next when it was last
    /// written (written at every run, so a restart keeps the schedule's
    /// phase: docs/emqp.md "The scheduler", "Restarts"). `None`: unknown
    /// (a record written before the field existed, or by a Python scheduler);
    /// such a schedule is restored as if registered at the restart.
    pub next_fire: Option<DateTime<Utc>>,
}

/// A storage failure: which file or server, and why.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A file operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Another process holds the data directory's lock (after retrying
    /// for about a second).
    #[error("{0}: locked by another emq-scheduler")]
    Locked(PathBuf),
    /// A Redis command failed.
    #[error("redis: {0}")]
    Redis(String),
    /// A NATS store request failed, or was refused (the lease).
    #[error("nats: {0}")]
    Nats(String),
    /// An entry could not be encoded.
    #[error("encoding a store entry: {0}")]
    Encode(String),
}

/// Where schedules live between runs. Implementations: [`FileStore`],
/// [`super::redis_store::RedisStore`] and [`super::nats_store::NatsStore`].
pub trait Store {
    /// Every stored schedule, by key.
    ///
    /// # Errors
    /// [`StoreError`] when the store cannot be read at all (damaged entries
    /// are skipped and logged instead).
    fn load(&mut self) -> Result<Vec<(ScheduleKey, Stored)>, StoreError>;
    /// Stores (or replaces) one schedule.
    ///
    /// # Errors
    /// [`StoreError`] when the write fails.
    fn put(&mut self, key: &ScheduleKey, stored: &Stored) -> Result<(), StoreError>;
    /// Removes one schedule (absent keys are fine).
    ///
    /// # Errors
    /// [`StoreError`] when the write fails.
    fn delete(&mut self, key: &ScheduleKey) -> Result<(), StoreError>;
    /// Makes every change so far durable.
    ///
    /// # Errors
    /// [`StoreError`] when the flush fails.
    fn sync(&mut self) -> Result<(), StoreError>;
    /// Forgets a schedule that another scheduler owns now (a DROP): a
    /// store of this scheduler's own deletes it (the default); a store
    /// shared with the new owner keeps the record for it.
    ///
    /// # Errors
    /// [`StoreError`] when the write fails.
    fn forget(&mut self, key: &ScheduleKey) -> Result<(), StoreError> {
        self.delete(key)
    }
    /// Upkeep of a store shared by several schedulers, run every
    /// [`crate::limits::SCHEDULER_STORE_RETRY`]: renews this scheduler's
    /// claim and reports schedules it has taken over and schedules another
    /// scheduler owns now. A store of this scheduler's own has nothing to
    /// report (the default).
    ///
    /// # Errors
    /// [`StoreError`] when the store cannot be reached.
    fn reconcile(&mut self) -> Result<Reconciled, StoreError> {
        Ok(Reconciled::default())
    }
    /// Whether this scheduler may fire now: a store shared with standbys
    /// answers by its lease ([`super::lease`]); a store of this
    /// scheduler's own always may (the default).
    fn fence(&self) -> Fence {
        Fence::Open
    }
    /// Refuses a schedule the store could never take (its record too
    /// large), saying why; the default takes every one.
    ///
    /// # Errors
    /// Why the record cannot be stored.
    fn admit(&self, _record: &[String; 5]) -> Result<(), String> {
        Ok(())
    }
}

/// What [`Store::fence`] says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fence {
    /// This scheduler is active: it may fire and write.
    Open,
    /// Not now (why): its lease is not renewed in time; it may open again.
    Closed(String),
    /// Never again (why): another scheduler holds the name; this one stops.
    Lost(String),
}

/// What [`Store::reconcile`] found.
#[derive(Debug, Default)]
pub struct Reconciled {
    /// Schedules this scheduler owns now and did not hold: to run.
    pub claimed: Vec<(ScheduleKey, Stored)>,
    /// Schedules it held that another scheduler owns now: to forget.
    pub lost: Vec<ScheduleKey>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
enum Entry {
    Put {
        key: String,
        record: [String; 5],
        runs_left: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        next_ms: Option<i64>,
    },
    Del {
        key: String,
    },
}

/// The embedded append-only log store. See the module docs.
#[derive(Debug)]
pub struct FileStore {
    dir: PathBuf,
    log: File,
    data: DataDir,
    live: BTreeMap<ScheduleKey, Stored>,
    lines: usize,
    dirty: bool,
}

impl FileStore {
    /// Opens (creating if needed) the store in `dir`, locks it, replays and
    /// compacts the log.
    ///
    /// # Errors
    /// [`StoreError::Io`] for file errors, [`StoreError::Locked`] when another
    /// process holds the directory.
    pub fn open(dir: &Path) -> Result<FileStore, StoreError> {
        let data = DataDir::open(dir)?;
        let tmp = dir.join("schedules.log.tmp");
        if tmp.exists() {
            tracing::warn!(path = %tmp.display(), "removing unfinished compaction file");
            fs::remove_file(&tmp).map_err(io_err(&tmp))?;
        }
        let path = dir.join("schedules.log");
        let Replay { live, skipped } = replay(&path)?;
        if !skipped.is_empty() {
            move_aside(&path, &skipped)?;
        }
        let log = write_compacted(dir, &live)?;
        Ok(FileStore { dir: dir.to_path_buf(), log, data, lines: live.len(), live, dirty: false })
    }

    fn append(&mut self, entry: &Entry) -> Result<(), StoreError> {
        let payload = serde_json::to_string(entry).map_err(|e| StoreError::Encode(e.to_string()))?;
        let line = format!("{:08x} {payload}\n", crc32fast::hash(payload.as_bytes()));
        self.log.write_all(line.as_bytes()).map_err(io_err(&self.dir.join("schedules.log")))?;
        self.lines += 1;
        self.dirty = true;
        if self.lines > limits::SCHEDULER_COMPACT_MIN_LINES.max(2 * self.live.len()) {
            self.log = write_compacted(&self.dir, &self.live)?;
            self.lines = self.live.len();
            self.dirty = false;
        }
        Ok(())
    }
}

impl Store for FileStore {
    fn load(&mut self) -> Result<Vec<(ScheduleKey, Stored)>, StoreError> {
        Ok(self.live.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
    }

    fn put(&mut self, key: &ScheduleKey, stored: &Stored) -> Result<(), StoreError> {
        self.live.insert(key.clone(), stored.clone());
        self.append(&put_entry(key, stored))
    }

    fn delete(&mut self, key: &ScheduleKey) -> Result<(), StoreError> {
        if self.live.remove(key).is_some() {
            self.append(&Entry::Del { key: key.to_string() })?;
        }
        Ok(())
    }

    fn sync(&mut self) -> Result<(), StoreError> {
        if self.dirty {
            self.log.sync_data().map_err(io_err(&self.dir.join("schedules.log")))?;
            self.dirty = false;
        }
        Ok(())
    }
}

impl FileStore {
    /// The scheduler's stable name ([`DataDir::stable_name`]).
    ///
    /// # Errors
    /// As [`DataDir::stable_name`].
    pub fn stable_name(&self) -> Result<String, StoreError> {
        self.data.stable_name()
    }
}

/// A scheduler's data directory, locked for as long as the value lives: no
/// two schedulers share one (a [`FileStore`] lives in it; a scheduler with
/// a Redis store keeps only its name there).
#[derive(Debug)]
pub struct DataDir {
    dir: PathBuf,
    _lock: File,
}

impl DataDir {
    /// Creates `dir` if needed and takes its lock (`<dir>/lock`).
    ///
    /// # Errors
    /// [`StoreError::Io`], or [`StoreError::Locked`] when another process
    /// holds the directory.
    pub fn open(dir: &Path) -> Result<DataDir, StoreError> {
        fs::create_dir_all(dir).map_err(io_err(dir))?;
        let lock_path = dir.join("lock");
        let lock =
            OpenOptions::new().create(true).truncate(false).write(true).open(&lock_path).map_err(io_err(&lock_path))?;
        // Retried briefly: a copy of a just-closed lock descriptor can live
        // on in a child process between its fork and exec (std's files are
        // close-on-exec), and a restarted scheduler's predecessor may still be
        // exiting.
        let mut tries = 0;
        while lock.try_lock().is_err() {
            tries += 1;
            if tries >= limits::SCHEDULER_LOCK_TRIES {
                return Err(StoreError::Locked(dir.to_path_buf()));
            }
            std::thread::sleep(limits::SCHEDULER_LOCK_RETRY);
        }
        Ok(DataDir { dir: dir.to_path_buf(), _lock: lock })
    }

    /// The scheduler's stable name, kept in `<dir>/name` (made of a fresh
    /// uuid4 at first start): what the router routes schedules by, and the
    /// owner a shared Redis store records, so this directory's schedules
    /// come back to it after a restart. The directory is locked, so no two
    /// schedulers share the name.
    ///
    /// # Errors
    /// [`StoreError::Io`] when the file cannot be read or written.
    pub fn stable_name(&self) -> Result<String, StoreError> {
        let path = self.dir.join("name");
        match fs::read_to_string(&path) {
            Ok(text) if !text.trim().is_empty() => return Ok(text.trim().to_string()),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(&path)(e)),
        }
        let name = uuid::Uuid::new_v4().hyphenated().to_string();
        let tmp = self.dir.join("name.tmp");
        fs::write(&tmp, format!("{name}\n")).map_err(io_err(&tmp))?;
        fs::rename(&tmp, &path).map_err(io_err(&path))?;
        Ok(name)
    }
}

fn put_entry(key: &ScheduleKey, stored: &Stored) -> Entry {
    Entry::Put {
        key: key.to_string(),
        record: stored.record.clone(),
        runs_left: stored.runs_left,
        next_ms: stored.next_fire.map(|t| t.timestamp_millis()),
    }
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io { path: path.to_path_buf(), source }
}

/// What [`replay`] read: the live records and the lines it could not use.
struct Replay {
    live: BTreeMap<ScheduleKey, Stored>,
    /// `line N: why`, in file order.
    skipped: Vec<String>,
}

/// Reads the log and applies its valid lines in order.
fn replay(path: &Path) -> Result<Replay, StoreError> {
    let (mut live, mut skipped) = (BTreeMap::new(), Vec::new());
    let mut bytes = Vec::new();
    match File::open(path) {
        Ok(mut f) => f.read_to_end(&mut bytes).map_err(io_err(path))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Replay { live, skipped }),
        Err(e) => return Err(io_err(path)(e)),
    };
    let complete = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    let lines = bytes[..complete].split(|b| *b == b'\n').enumerate().filter(|(_, l)| !l.is_empty());
    for (n, line) in lines {
        match parse_line(line) {
            Ok(Entry::Put { key, record, runs_left, next_ms }) => match ScheduleKey::from_hex(&key) {
                Some(k) => {
                    let next_fire = next_ms.and_then(DateTime::from_timestamp_millis);
                    live.insert(k, Stored { record, runs_left, next_fire });
                }
                None => skipped.push(format!("line {}: bad key {key:?}", n + 1)),
            },
            Ok(Entry::Del { key }) => match ScheduleKey::from_hex(&key) {
                Some(k) => {
                    live.remove(&k);
                }
                None => skipped.push(format!("line {}: bad key {key:?}", n + 1)),
            },
            Err(why) => skipped.push(format!("line {}: {why}", n + 1)),
        }
    }
    if complete < bytes.len() {
        let n = bytes[..complete].iter().filter(|b| **b == b'\n').count() + 1;
        skipped.push(format!("line {n}: torn last line ({} bytes, no newline)", bytes.len() - complete));
    }
    Ok(Replay { live, skipped })
}

fn parse_line(line: &[u8]) -> Result<Entry, &'static str> {
    let (Some(crc), Some(b' '), Some(payload)) = (line.get(..8), line.get(8), line.get(9..)) else {
        return Err("not a log line (checksum, space, JSON)");
    };
    let crc =
        std::str::from_utf8(crc).ok().and_then(|c| u32::from_str_radix(c, 16).ok()).ok_or("bad checksum field")?;
    if crc32fast::hash(payload) != crc {
        return Err("checksum mismatch");
    }
    serde_json::from_slice(payload).map_err(|_| "not a log entry")
}

/// Moves a damaged log aside as `<log>.damaged-<UTC time>` before it is
/// compacted, and logs what was skipped.
fn move_aside(path: &Path, skipped: &[String]) -> Result<(), StoreError> {
    let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%SZ");
    let mut aside = path.with_file_name(format!("schedules.log.damaged-{stamp}"));
    let mut n = 1;
    while aside.exists() {
        n += 1;
        aside = path.with_file_name(format!("schedules.log.damaged-{stamp}-{n}"));
    }
    fs::rename(path, &aside).map_err(io_err(&aside))?;
    let shown = &skipped[..skipped.len().min(limits::SCHEDULER_DAMAGED_LINES_LOGGED)];
    tracing::warn!(
        log = %path.display(),
        kept = %aside.display(),
        skipped = skipped.len(),
        lines = ?shown,
        "the schedule log has lines that cannot be read: moved aside, the readable records are kept"
    );
    Ok(())
}

/// Writes the live records to a temp file, fsyncs, renames it over the log,
/// fsyncs the directory, and returns the log opened for appending.
fn write_compacted(dir: &Path, live: &BTreeMap<ScheduleKey, Stored>) -> Result<File, StoreError> {
    let (tmp, path) = (dir.join("schedules.log.tmp"), dir.join("schedules.log"));
    let mut out = Vec::new();
    for (key, s) in live {
        let entry = put_entry(key, s);
        let payload = serde_json::to_string(&entry).map_err(|e| StoreError::Encode(e.to_string()))?;
        out.extend_from_slice(format!("{:08x} {payload}\n", crc32fast::hash(payload.as_bytes())).as_bytes());
    }
    let mut f = File::create(&tmp).map_err(io_err(&tmp))?;
    f.write_all(&out).map_err(io_err(&tmp))?;
    f.sync_all().map_err(io_err(&tmp))?;
    drop(f);
    fs::rename(&tmp, &path).map_err(io_err(&path))?;
    File::open(dir).and_then(|d| d.sync_all()).map_err(io_err(dir))?;
    OpenOptions::new().append(true).open(&path).map_err(io_err(&path))
}
