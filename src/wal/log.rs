//! [`ShardLog`]: one shard's write-ahead log while the router runs.
//!
//! The shard calls a hook per event ([`ShardLog::accepted`],
//! [`ShardLog::dispatched`], [`ShardLog::requeued`], [`ShardLog::done`]);
//! each appends a record to an in-memory buffer. At the end of every batch
//! [`ShardLog::commit`] writes the buffer with one `write` and, by
//! durability:
//!
//! * `sync` on the shard thread: syncs (`fdatasync`) once, then the shard
//!   releases the batch's output;
//! * `sync` with the sync thread: returns a [`SyncWait`]; the shard's
//!   outbox hands the batch's output to the thread, which syncs and then
//!   releases it, while the shard serves the next batch;
//! * `async`: releases at once and syncs when [`ShardLog::next_deadline`]
//!   comes (every `sync_interval` while something is unsynced).
//!
//! Per segment the log tracks the jobs whose latest `Accepted` record it
//! holds ([`SegmentInfo`], found through [`Job::wal_segment`]). A segment
//! other than the current one whose jobs are all done is deleted, once
//! everything written before that moment is durable; compaction
//! ([`ShardLog::compact_step`]) copies waiting jobs forward out of segments
//! that are less than 1/[`limits::WAL_DISK_FACTOR`] live, so that they die.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use parking_lot::Mutex;
use serde_json::{json, Value};

use super::record;
use super::segment::{segment_path, SegmentHeader, SegmentInfo, SEGMENT_HEADER_BYTES};
use super::sync::{SyncThread, SyncWait};
use super::Durability;
use crate::broker::job::Job;
use crate::broker::retry::DeadJob;
use crate::broker::shard::dead_set::DeadSet;
use crate::broker::shard::queues::QueueTable;
use crate::ids::{JobId, QueueName};
use crate::limits;
use crate::metrics::latency::new_histogram;

/// A shard log's figures for STATUS, updated once per batch (relaxed
/// atomics: read by the admin thread while the shard runs).
#[derive(Debug, Default)]
pub struct WalStats {
    /// Bytes of the shard's segment files.
    pub log_bytes: AtomicU64,
    /// Segment files.
    pub segments: AtomicU64,
    /// Jobs not done (waiting, offered, in flight).
    pub live_jobs: AtomicU64,
    /// Bytes of those jobs' `Accepted` records.
    pub live_bytes: AtomicU64,
    /// Duration of the last sync, in microseconds.
    pub last_sync_us: AtomicU64,
    /// Syncs so far.
    pub syncs: AtomicU64,
    /// Jobs recovered at start.
    pub jobs_recovered: AtomicU64,
    /// How long this shard's recovery took, in milliseconds.
    pub recovery_ms: AtomicU64,
    /// Jobs copied forward by compaction.
    pub relocated_jobs: AtomicU64,
    /// Segments deleted since start.
    pub deleted_segments: AtomicU64,
}

impl WalStats {
    /// The figures as JSON (`shard` added).
    pub fn to_json(&self, shard: usize) -> Value {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        json!({
            "shard": shard,
            "log_bytes": get(&self.log_bytes),
            "segments": get(&self.segments),
            "live_jobs": get(&self.live_jobs),
            "live_bytes": get(&self.live_bytes),
            "last_sync_us": get(&self.last_sync_us),
            "syncs": get(&self.syncs),
            "jobs_recovered": get(&self.jobs_recovered),
            "recovery_ms": get(&self.recovery_ms),
            "relocated_jobs": get(&self.relocated_jobs),
            "deleted_segments": get(&self.deleted_segments),
        })
    }
}

/// What a shard's log shares with its sync thread and the admin side.
#[derive(Debug)]
pub struct SyncShared {
    /// The shard's log directory (for error messages).
    pub dir: PathBuf,
    /// The log position known durable.
    pub synced: AtomicU64,
    /// Figures for STATUS.
    pub stats: Arc<WalStats>,
    /// Sync durations since the last take (microseconds).
    hist: Mutex<Histogram<u64>>,
}

impl SyncShared {
    /// Nothing synced yet, for the log in `dir`.
    pub fn new(dir: PathBuf) -> SyncShared {
        SyncShared {
            dir,
            synced: AtomicU64::new(0),
            stats: Arc::new(WalStats::default()),
            hist: Mutex::new(new_histogram()),
        }
    }

    /// Records one sync that took `took`.
    pub fn record_sync(&self, took: Duration) {
        let us = (took.as_micros() as u64).clamp(1, limits::LATENCY_MAX_US);
        let _ = self.hist.lock().record(us);
        self.stats.last_sync_us.store(us, Ordering::Relaxed);
        self.stats.syncs.fetch_add(1, Ordering::Relaxed);
    }

    /// Hands over the sync durations recorded since the last take.
    pub fn take_sync_histogram(&self) -> Histogram<u64> {
        std::mem::replace(&mut *self.hist.lock(), new_histogram())
    }
}

/// A compaction pass: every waiting job of the shard is looked at once,
/// and those whose record lies in a victim segment are copied forward.
#[derive(Debug)]
struct Pass {
    victims: Vec<u32>,
    queues: Vec<QueueName>,
    at: usize,
    pos: usize,
    /// Once the queues are done: the dead set's burial number to go on from.
    dead_at: u64,
}

/// What the output of a committed batch may do.
#[derive(Debug)]
pub enum Commit {
    /// Leave now: nothing it promises waits for a sync (`async`, or no
    /// new records).
    Release,
    /// Frames for workers may leave now, and text answers that promise
    /// nothing; acceptances and text answers to stored SCHEDs (with what
    /// follows them on their connections) once the sync thread has made
    /// the log durable up to the wait (see `router::outbox`).
    AfterSync(SyncWait),
    /// Frames for workers may leave now; the caller syncs
    /// ([`ShardLog::sync_here`]), then releases the rest.
    SyncHere,
}

/// How a log was opened (see [`ShardLog::create`]).
#[derive(Debug, Clone)]
pub struct LogSettings {
    /// `Sync` or `Async` (a `Memory` router has no log).
    pub durability: Durability,
    /// `Async`: the sync period.
    pub sync_interval: Duration,
    /// Segment size.
    pub segment_bytes: u64,
    /// `Sync`: a sync thread releases the output (else the shard syncs).
    pub sync_thread: bool,
}

/// One shard's write-ahead log (see the module docs).
#[derive(Debug)]
pub struct ShardLog {
    shard: usize,
    shards: usize,
    dir: PathBuf,
    settings: LogSettings,
    segments: BTreeMap<u32, SegmentInfo>,
    current: u32,
    file: Arc<File>,
    buf: Vec<u8>,
    /// Bytes handed to the OS since the log was opened (a position).
    written: u64,
    /// The highest position handed to the sync thread.
    sync_requested: u64,
    /// `Async`: since when something written is not synced.
    unsynced_since: Option<Instant>,
    /// The largest job sequence seen (the floor of the next segment).
    seq_floor: u64,
    /// Segments to delete once the log is durable up to the position given.
    deletions: Vec<(u32, u64)>,
    pass: Option<Pass>,
    /// `(current, older)` of the last reference noted ([`ShardLog::refer_to`]),
    /// so a batch of `Done`s naming one older segment costs one lookup.
    last_ref: (u32, u32),
    /// The log position when the last pass ended: a new one waits until
    /// half a segment more was written, so that segments kept by jobs in
    /// flight are not rescanned at every batch.
    last_pass_at: u64,
    /// The `now` of the last commit.
    last_commit: Option<Instant>,
    shared: Arc<SyncShared>,
}

impl ShardLog {
    /// Opens shard `shard`'s log in `dir` with a new segment numbered
    /// `number`, knowing the older `segments`, for a router of `shards`
    /// shards whose shard has accepted `seq_floor` jobs so far.
    ///
    /// # Errors
    /// [`super::WalError::Io`] naming the file.
    pub fn create(
        shard: usize,
        shards: usize,
        dir: &Path,
        settings: LogSettings,
        segments: BTreeMap<u32, SegmentInfo>,
        number: u32,
        seq_floor: u64,
    ) -> Result<ShardLog, super::WalError> {
        std::fs::create_dir_all(dir).map_err(super::WalError::io(dir))?;
        let file = new_segment(dir, shard, shards, number, seq_floor)?;
        let shared = Arc::new(SyncShared::new(dir.to_path_buf()));
        let mut log = ShardLog {
            shard,
            shards,
            dir: dir.to_path_buf(),
            settings,
            segments,
            current: number,
            file: Arc::new(file),
            buf: Vec::new(),
            written: 0,
            sync_requested: 0,
            unsynced_since: None,
            seq_floor,
            deletions: Vec::new(),
            pass: None,
            last_ref: (0, 0),
            last_pass_at: 0,
            last_commit: None,
            shared,
        };
        log.segments.insert(number, SegmentInfo { bytes: SEGMENT_HEADER_BYTES as u64, ..SegmentInfo::default() });
        log.update_stats();
        Ok(log)
    }

    /// The log's shared parts (sync thread, STATUS, latency reporter).
    pub fn shared(&self) -> &Arc<SyncShared> {
        &self.shared
    }

    /// Starts this log's sync thread, if its settings ask for one.
    ///
    /// # Errors
    /// The OS error when the thread cannot be spawned.
    pub fn sync_thread(&self) -> std::io::Result<Option<SyncThread>> {
        if self.settings.durability == Durability::Sync && self.settings.sync_thread {
            return SyncThread::start(self.shard, self.shared.clone()).map(Some);
        }
        Ok(None)
    }

    /// The log now lives in `dir` (its directory was renamed; open files
    /// stay valid).
    pub fn moved_to(&mut self, dir: &Path) {
        self.dir = dir.to_path_buf();
    }

    /// The segment records go to now.
    pub fn current_segment(&self) -> u32 {
        self.current
    }

    /// `job` was accepted: logs it and notes its segment in the job.
    pub fn accepted(&mut self, job: &mut Job) {
        let len = record::accepted_len(job);
        self.make_room(len);
        self.seq_floor = self.seq_floor.max(job.id.seq());
        record::encode_accepted(job, &mut self.buf);
        job.set_wal_segment(self.current);
        self.count_in(len);
    }

    /// Job `id` went to a worker or a text connection.
    pub fn dispatched(&mut self, id: JobId) {
        self.make_room(record::ID_RECORD_BYTES);
        record::encode_dispatched(id, &mut self.buf);
        self.grow(record::ID_RECORD_BYTES);
    }

    /// `job` waits at the front of its queue again. A job that has lost a
    /// delivery (its worker died) is copied forward whole, so its delivery
    /// count lives in the `Accepted` record that stays as long as the job
    /// does; any other gets a small `Requeued` record.
    pub fn requeued(&mut self, job: &mut Job) {
        if job.redeliveries() > 0 {
            return self.copy_forward(job);
        }
        self.make_room(record::ID_RECORD_BYTES + 1);
        record::encode_requeued(job.id, job.redeliveries(), &mut self.buf);
        self.grow(record::ID_RECORD_BYTES + 1);
    }

    /// Dead job `dead` lies in the dead set: a `Buried` record, in the same
    /// segment as the job's latest `Accepted` record (copied forward when
    /// it lies elsewhere), so the two are kept or deleted together.
    pub fn buried(&mut self, dead: &mut DeadJob) {
        let len = record::accepted_len(&dead.job);
        self.make_room(len + record::BURIED_RECORD_BYTES);
        if dead.job.wal_segment() != self.current {
            self.copy_forward(&mut dead.job);
        }
        let job = &dead.job;
        record::encode_buried(job.id, job.redeliveries(), dead.why, dead.at_unix_ms, &mut self.buf);
        self.grow(record::BURIED_RECORD_BYTES);
    }

    /// Schedules the deletion of every segment but the current one whose
    /// jobs are all done, once what is written now is durable (start-up).
    pub fn retire_dead_segments(&mut self) {
        let at = self.position();
        let dead = self.segments.iter().filter(|(n, s)| **n != self.current && s.is_dead()).map(|(n, _)| (*n, at));
        self.deletions.extend(dead);
    }

    /// Job `id`, whose `Accepted` record of `record_bytes` is in `segment`,
    /// is done.
    pub fn done(&mut self, id: JobId, segment: u32, record_bytes: usize) {
        self.make_room(record::ID_RECORD_BYTES);
        record::encode_done(id, &mut self.buf);
        self.grow(record::ID_RECORD_BYTES);
        self.refer_to(segment);
        self.count_out(segment, record_bytes);
    }

    /// A record just written to the current segment cancels or supersedes
    /// one in `older`: the current segment must outlive it (see
    /// [`SegmentInfo::older`]).
    fn refer_to(&mut self, older: u32) {
        // Most `Done`s of a batch name the segment the previous one named.
        if older == self.current || self.last_ref == (self.current, older) {
            return;
        }
        self.last_ref = (self.current, older);
        if self.segments.contains_key(&older) {
            self.segments.entry(self.current).or_default().older.insert(older);
        }
    }

    /// Dead job `job` goes back to its queue: a fresh `Accepted` record
    /// (its setbacks as the job now counts them) supersedes its `Buried` one.
    pub fn unburied(&mut self, job: &mut Job) {
        self.copy_forward(job);
    }

    /// Copies waiting `job` forward into the current segment, unless it is
    /// there already (compaction).
    pub fn relocate(&mut self, job: &mut Job) {
        if job.wal_segment() != self.current {
            self.copy_forward(job);
            self.shared.stats.relocated_jobs.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Writes a new `Accepted` record of waiting `job` (its content, its
    /// delivery count) and moves it to the current segment.
    fn copy_forward(&mut self, job: &mut Job) {
        let (from, len) = (job.wal_segment(), record::accepted_len(job));
        self.make_room(len);
        record::encode_accepted(job, &mut self.buf);
        job.set_wal_segment(self.current);
        self.count_in(len);
        self.refer_to(from);
        self.count_out(from, len);
    }

    /// Bytes logged since the log was opened, buffered ones included.
    fn position(&self) -> u64 {
        self.written + self.buf.len() as u64
    }

    fn count_in(&mut self, len: usize) {
        let cur = self.segments.entry(self.current).or_default();
        cur.bytes += len as u64;
        cur.live += 1;
        cur.live_bytes += len as u64;
    }

    fn grow(&mut self, len: usize) {
        self.segments.entry(self.current).or_default().bytes += len as u64;
    }

    fn count_out(&mut self, segment: u32, record_bytes: usize) {
        let Some(info) = self.segments.get_mut(&segment) else { return };
        info.live = info.live.saturating_sub(1);
        info.live_bytes = info.live_bytes.saturating_sub(record_bytes as u64);
        if info.is_dead() && segment != self.current {
            self.deletions.push((segment, self.position()));
        }
    }

    /// Starts a new segment first when `len` more bytes would pass the
    /// segment size (a record never spans two segments).
    fn make_room(&mut self, len: usize) {
        let bytes = self.segments.get(&self.current).map_or(0, |s| s.bytes);
        if bytes + len as u64 > self.settings.segment_bytes && bytes > SEGMENT_HEADER_BYTES as u64 {
            self.rotate();
        }
    }

    /// Closes the current segment (written and synced) and opens the next.
    fn rotate(&mut self) {
        let Some(next) = self.current.checked_add(1) else {
            tracing::error!(shard = self.shard, "segment numbers exhausted; the current segment grows on");
            return;
        };
        self.write_out();
        self.sync_now();
        let file = match new_segment(&self.dir, self.shard, self.shards, next, self.seq_floor) {
            Ok(f) => f,
            Err(e) => super::fail_stop("opening a new segment", &self.dir, &std::io::Error::other(e.to_string())),
        };
        let old = std::mem::replace(&mut self.current, next);
        self.file = Arc::new(file);
        self.segments.insert(next, SegmentInfo { bytes: SEGMENT_HEADER_BYTES as u64, ..SegmentInfo::default() });
        if self.segments.get(&old).is_some_and(SegmentInfo::is_dead) {
            self.deletions.push((old, self.written));
        }
    }

    /// Hands the buffered records to the OS.
    fn write_out(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        if let Err(e) = (&*self.file).write_all(&self.buf) {
            super::fail_stop("writing", &segment_path(&self.dir, self.current), &e);
        }
        self.written += self.buf.len() as u64;
        self.buf.clear();
    }

    fn sync_now(&mut self) {
        if self.written > self.shared.synced.load(Ordering::Acquire) {
            super::sync::sync(&self.file, self.written, &self.shared);
        }
        self.unsynced_since = None;
    }

    /// The end of a batch: writes its records (one `write`) and says what
    /// the batch's output may do (see [`Commit`]). With `Async`, also syncs
    /// when the sync interval has passed.
    pub fn commit(&mut self, now: Instant) -> Commit {
        self.last_commit = Some(now);
        self.write_out();
        let commit = match (self.settings.durability, self.settings.sync_thread) {
            (Durability::Sync, true) if self.written > self.sync_requested => {
                self.sync_requested = self.written;
                Commit::AfterSync(SyncWait { file: self.file.clone(), upto: self.written })
            }
            (Durability::Sync, false) if self.written > self.shared.synced.load(Ordering::Acquire) => Commit::SyncHere,
            (Durability::Async, _) => {
                if self.written > self.shared.synced.load(Ordering::Acquire) {
                    let since = *self.unsynced_since.get_or_insert(now);
                    if now.saturating_duration_since(since) >= self.settings.sync_interval {
                        self.sync_now();
                    }
                }
                Commit::Release
            }
            _ => Commit::Release,
        };
        self.delete_dead();
        self.update_stats();
        commit
    }

    /// [`Commit::SyncHere`]: syncs on the calling thread (the shard's).
    pub fn sync_here(&mut self) {
        self.sync_now();
        self.delete_dead();
    }

    /// Writes and syncs everything now, on the calling thread (start-up,
    /// shutdown, tests).
    pub fn sync_all(&mut self) {
        self.write_out();
        self.sync_now();
        self.delete_dead();
        self.update_stats();
    }

    /// When the shard's loop must come back for the log even if no
    /// message comes: at once while compaction has work left (records
    /// buffered, a pass under way); with `Async`, when the log must be
    /// synced next, if anything is unsynced. (Segments waiting for a sync
    /// to be deleted wait for the next batch: no wake-up of their own.)
    pub fn next_deadline(&self) -> Option<Instant> {
        if self.pass.is_some() || !self.buf.is_empty() {
            return self.last_commit;
        }
        match self.settings.durability {
            Durability::Async => self.unsynced_since.map(|t| t + self.settings.sync_interval),
            _ => None,
        }
    }

    /// Deletes the dead segments whose deletion is durable-safe now.
    fn delete_dead(&mut self) {
        if self.deletions.is_empty() {
            return;
        }
        let synced = self.shared.synced.load(Ordering::Acquire);
        let mut keep = Vec::new();
        let mut gone = Vec::new();
        for (segment, after) in std::mem::take(&mut self.deletions) {
            let still_dead = segment != self.current && self.segments.get(&segment).is_some_and(SegmentInfo::is_dead);
            if !still_dead {
                continue;
            }
            if after > synced {
                keep.push((segment, after));
                continue;
            }
            let path = segment_path(&self.dir, segment);
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    self.shared.stats.deleted_segments.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(shard = self.shard, file = %path.display(), error = %e, "cannot delete a dead segment");
                }
            }
            self.segments.remove(&segment);
            gone.push(segment);
        }
        self.deletions = keep;
        if gone.is_empty() {
            return;
        }
        // The deletions are made durable before any segment that depended
        // on them can go (at a later call): a crash never leaves a segment
        // whose cancelling records are gone.
        if let Err(e) = super::dir::sync_dir(&self.dir) {
            tracing::warn!(shard = self.shard, dir = %self.dir.display(), error = %e, "cannot sync the log directory");
        }
        let at = self.position();
        for (n, info) in self.segments.iter_mut() {
            let before = info.older.len();
            info.older.retain(|n| !gone.contains(n));
            let freed = info.older.len() < before;
            if freed && *n != self.current && info.is_dead() {
                self.deletions.push((*n, at));
            }
        }
    }

    fn update_stats(&self) {
        let s = &self.shared.stats;
        let (bytes, live, live_bytes) =
            self.segments.values().fold((0, 0, 0), |(b, l, lb), i| (b + i.bytes, l + i.live, lb + i.live_bytes));
        s.log_bytes.store(bytes, Ordering::Relaxed);
        s.segments.store(self.segments.len() as u64, Ordering::Relaxed);
        s.live_jobs.store(live, Ordering::Relaxed);
        s.live_bytes.store(live_bytes, Ordering::Relaxed);
    }

    /// Bytes of the segment files, and of the live jobs' records.
    pub fn disk_and_live_bytes(&self) -> (u64, u64) {
        self.segments.values().fold((0, 0), |(b, lb), i| (b + i.bytes, lb + i.live_bytes))
    }

    /// Every segment's figures, by number (tests, tools).
    pub fn segments(&self) -> &BTreeMap<u32, SegmentInfo> {
        &self.segments
    }

    /// One bounded step of compaction (at most
    /// [`limits::WAL_COMPACT_STEP_JOBS`] jobs looked at and
    /// [`limits::WAL_COMPACT_STEP_BYTES`] copied): starts a pass when the
    /// log is over its bound ([`limits::WAL_DISK_FACTOR`] × live bytes +
    /// one segment) and some old segment is less than 1/factor live; copies
    /// forward the waiting jobs of `queues` whose record lies in such a
    /// segment, then the jobs of the dead set `dead` (with their `Buried`
    /// record). Jobs in flight, offered or waiting for a retry are not
    /// copied: they keep their segment until they finish or come back.
    pub fn compact_step(&mut self, queues: &mut QueueTable, dead: &mut DeadSet) {
        if self.pass.is_none() {
            self.pass = self.plan(queues);
        }
        let Some(mut pass) = self.pass.take() else { return };
        let (mut looked, start) = (0, self.buf.len());
        while looked < limits::WAL_COMPACT_STEP_JOBS && self.buf.len() - start < limits::WAL_COMPACT_STEP_BYTES {
            let Some(queue) = pass.queues.get(pass.at).cloned() else {
                let max = limits::WAL_COMPACT_STEP_JOBS - looked;
                let (seen, next) = dead.visit_mut(pass.dead_at, max, |d| {
                    if pass.victims.binary_search(&d.job.wal_segment()).is_ok() {
                        self.buried(d);
                    }
                });
                looked += seen.max(1);
                match next {
                    Some(at) => pass.dead_at = at,
                    None => {
                        self.last_pass_at = self.position();
                        return;
                    }
                }
                continue;
            };
            let max = limits::WAL_COMPACT_STEP_JOBS - looked;
            let (seen, next) = queues.visit_waiting_mut(&queue.0, pass.pos, max, |job| {
                if pass.victims.binary_search(&job.wal_segment()).is_ok() {
                    self.relocate(job);
                }
            });
            looked += seen.max(1);
            match next {
                Some(pos) => pass.pos = pos,
                None => (pass.at, pass.pos) = (pass.at + 1, 0),
            }
        }
        self.pass = Some(pass);
    }

    /// A pass, when the log is over its bound and has victims.
    fn plan(&self, queues: &QueueTable) -> Option<Pass> {
        let (disk, live) = self.disk_and_live_bytes();
        let factor = limits::WAL_DISK_FACTOR;
        if disk <= factor * live + self.settings.segment_bytes
            || (self.last_pass_at > 0 && self.position() < self.last_pass_at + self.settings.segment_bytes / 2)
        {
            return None;
        }
        let victims: Vec<u32> = self
            .segments
            .iter()
            .filter(|(n, s)| **n != self.current && s.live > 0 && s.live_bytes * factor < s.bytes)
            .map(|(n, _)| *n)
            .collect();
        if victims.is_empty() {
            return None;
        }
        tracing::debug!(shard = self.shard, disk, live, victims = victims.len(), "log compaction pass");
        Some(Pass { victims, queues: queues.names(), at: 0, pos: 0, dead_at: 0 })
    }
}

/// Creates segment `number` in `dir` with its header, synced, and syncs the
/// directory so the file stays after a crash.
fn new_segment(dir: &Path, shard: usize, shards: usize, number: u32, seq_floor: u64) -> Result<File, super::WalError> {
    let path = segment_path(dir, number);
    let header = SegmentHeader { shard: shard as u32, shards: shards as u32, number, seq_floor };
    let mut file = OpenOptions::new().create_new(true).write(true).open(&path).map_err(super::WalError::io(&path))?;
    file.write_all(&header.encode()).and_then(|()| file.sync_data()).map_err(super::WalError::io(&path))?;
    super::dir::sync_dir(dir)?;
    Ok(file)
}
