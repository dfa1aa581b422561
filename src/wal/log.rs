//! [`ShardLog`]: one shard's write-ahead log while the router runs, the
//! local implementation of [`JobLog`].
//!
//! Each hook appends a record to an in-memory buffer. At the end of every
//! batch [`JobLog::commit`] writes the buffer with one positional write
//! and returns the batch's ticket (see [`super::shared`] for when a ticket
//! is durable).
//!
//! Per segment the log tracks the jobs whose latest `Accepted` record it
//! holds ([`SegmentInfo`], found through [`Job::log_tag`]). A segment
//! other than the current one whose jobs are all done is deleted, once
//! everything written before that moment is synced; compaction
//! ([`JobLog::maintain`]) copies waiting and dead jobs forward out of
//! segments that are less than 1/[`limits::WAL_DISK_FACTOR`] live, so that
//! they die. The log keeps a copy of every job it saw dispatched and not
//! yet back (`lent`): such a job may finish on another shard, which sends
//! only its id, and a repair rewrites it.
//!
//! # Faults
//!
//! A write, a sync, a new segment or a check of the log's files can fail.
//! The log then refuses new jobs ([`JobLog::refusal`]) and repairs itself
//! from [`JobLog::maintain`], retrying with back-off
//! ([`limits::WAL_RETRY_MIN`] doubling to [`limits::WAL_RETRY_MAX`]):
//!
//! * **out of space** (`ENOSPC`, `EDQUOT`): the unwritten records stay
//!   buffered and are written again at the same offset (a torn write is
//!   overwritten) until the write succeeds; past
//!   [`limits::WAL_FAULT_BUFFER_BYTES`] of them the log gives up the buffer
//!   and rebuilds instead. Meanwhile segments whose jobs are all done are
//!   still deleted (or cut to their header), so the disk gets space back
//!   as consumers finish jobs. A router started on a full disk starts in
//!   this fault, its current segment made once there is space;
//! * **anything else** (read-only, an I/O error, a failed sync, the data
//!   directory, the shard's directory or a segment deleted or replaced):
//!   what was written since the last sync is in doubt. The log lets go of
//!   its files and the data directory's (so the file system can be
//!   unmounted and checked) and, once the directory can be written again,
//!   *rebuilds*: it writes every live job, from the shard's memory
//!   ([`Holdings`]) and its own copies of dispatched jobs, into new
//!   segments, syncs them, deletes the old ones, and moves the durable
//!   point past every ticket handed out (`repair.rs`).
//!
//! Acknowledgements wait meanwhile: nothing is acknowledged that the log
//! does not hold.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::dir::{self, DataDir, Identity};
use super::held;
use super::record;
use super::segment::{file_id, new_segment, segment_path, shard_dir, SegmentInfo, SEGMENT_HEADER_BYTES};
use super::shared::WalShared;
use crate::config::Durability;
use crate::ids::{FastMap, JobId, QueueName};
use crate::job::{DeadJob, Job};
use crate::joblog::{Commit, Durable, FaultKind, Holdings, JobLog, LogState, LogStatus, StoreFault, Ticket};
use crate::limits;

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

/// How a log was opened (see [`ShardLog::create`]).
#[derive(Debug, Clone)]
pub struct LogSettings {
    /// `Sync` or `Async` (a `Memory` router has no log).
    pub durability: Durability,
    /// `Async`: the sync period.
    pub sync_interval: Duration,
    /// Segment size.
    pub segment_bytes: u64,
    /// New jobs are refused while the data directory's file system has
    /// less free space than this (bytes; 0: never).
    pub disk_free_limit: u64,
}

/// A fault being repaired (see the module docs, "Faults").
#[derive(Debug, Clone, Copy)]
pub(super) struct Fault {
    /// What went wrong (the latest).
    pub kind: FaultKind,
    /// The buffer was given up (or never can be written again): the log
    /// must be rebuilt from memory.
    pub rebuild: bool,
    /// When the next attempt is due.
    pub next_try: Instant,
    /// The wait after the next failed attempt.
    pub backoff: Duration,
    /// Attempts so far.
    pub tries: u64,
}

/// One shard's write-ahead log (see the module docs).
#[derive(Debug)]
pub struct ShardLog {
    pub(super) shard: usize,
    pub(super) shards: usize,
    pub(super) data_dir: Arc<DataDir>,
    /// The shard's directory as opened (`None` after a fault let go of it).
    pub(super) dir: Option<Arc<Identity>>,
    pub(super) dir_path: PathBuf,
    pub(super) settings: LogSettings,
    pub(super) segments: BTreeMap<u32, SegmentInfo>,
    pub(super) current: u32,
    /// The shard's directory as opened before a fault that found it gone
    /// (moved away, say), while it is still linked: once the rebuild made
    /// a new one, the superseded segments are removed through it, not by
    /// path ([`ShardLog::clean_superseded`]).
    superseded: Option<Arc<Identity>>,
    /// The current segment's file is not made yet (the router started on
    /// a full disk): `held` does not name it until it is.
    unmade: bool,
    /// The current segment (`None` after a fault let go of it).
    pub(super) file: Option<Arc<File>>,
    buf: Vec<u8>,
    /// Bytes logged since the log was opened, the buffer included: the
    /// position tickets name.
    pub(super) logged: u64,
    /// The position handed to the OS.
    pub(super) written: u64,
    /// `Async`: since when something written is not synced.
    unsynced_since: Option<Instant>,
    /// The largest job sequence seen (the floor of the next segment).
    pub(super) seq_floor: u64,
    /// Segments that died (they go once their moved jobs are synced, see
    /// [`ShardLog::delete_dead`]).
    deletions: Vec<u32>,
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
    /// Jobs dispatched and not back (done, requeued or buried), by id, as
    /// they were when they went out, their tags kept current.
    pub(super) lent: FastMap<JobId, Job>,
    pub(super) fault: Option<Fault>,
    /// Whether free space is below `disk_free_limit`.
    alarm: bool,
    /// Free bytes at the last `statvfs` (`u64::MAX` before the first), and
    /// [`ShardLog::logged`] then: what was logged since counts against it,
    /// so a burst between two checks cannot pass `disk_free_limit`.
    free_at_check: u64,
    logged_at_check: u64,
    /// When free space and the files are checked next.
    next_check: Option<Instant>,
    pub(super) shared: Arc<WalShared>,
}

impl ShardLog {
    /// Opens shard `shard`'s log in `<root>/shard-<shard>` with a new
    /// segment numbered `number`, knowing the older `segments`, for a
    /// router of `shards` shards whose shard has accepted `seq_floor` jobs
    /// so far, in the locked `data_dir`.
    ///
    /// # Errors
    /// [`super::WalError::Io`] naming the file.
    #[allow(clippy::too_many_arguments)]
    pub fn create(
        shard: usize,
        shards: usize,
        data_dir: Arc<DataDir>,
        root: &Path,
        settings: LogSettings,
        segments: BTreeMap<u32, SegmentInfo>,
        number: u32,
        seq_floor: u64,
    ) -> Result<ShardLog, super::WalError> {
        let dir_path = shard_dir(root, shard);
        std::fs::create_dir_all(&dir_path).map_err(super::WalError::io(&dir_path))?;
        let identity = Arc::new(Identity::open(&dir_path).map_err(super::WalError::io(&dir_path))?);
        // On a full disk the router starts all the same, its log in the
        // `Full` fault: producers refused, consumers served, the segment
        // made once dead segments freed space (see [`ShardLog::repair`]).
        let (file, full) = match open_segment(&dir_path, shard, shards, number, seq_floor, segments.keys().copied()) {
            Ok(file) => (Some(Arc::new(file)), None),
            Err(super::WalError::Io { source, .. }) if FaultKind::of(&source) == FaultKind::Full => {
                (None, Some(source))
            }
            Err(e) => return Err(e),
        };
        let id = file.as_deref().and_then(file_id);
        let shared = Arc::new(WalShared::new(settings.durability, file.clone(), identity.clone()));
        let mut log = ShardLog {
            shard,
            shards,
            data_dir,
            dir: Some(identity),
            dir_path,
            settings,
            segments,
            current: number,
            unmade: full.is_some(),
            superseded: None,
            file,
            buf: Vec::new(),
            logged: 0,
            written: 0,
            unsynced_since: None,
            seq_floor,
            deletions: Vec::new(),
            pass: None,
            last_ref: (0, 0),
            last_pass_at: 0,
            last_commit: None,
            lent: FastMap::default(),
            fault: None,
            alarm: false,
            free_at_check: u64::MAX,
            logged_at_check: 0,
            next_check: None,
            shared,
        };
        log.segments
            .insert(number, SegmentInfo { bytes: SEGMENT_HEADER_BYTES as u64, file: id, ..SegmentInfo::default() });
        if let Some(e) = full {
            log.fail(FaultKind::Full, &e, "starting a new segment", Instant::now());
        }
        // Free space is looked at before the shard takes its first job:
        // a router started below `disk_free_limit` refuses from the first.
        log.look_at_free_space();
        log.show_state();
        log.update_stats();
        Ok(log)
    }

    /// The log's shared parts (STATUS, the release step).
    pub fn shared(&self) -> &Arc<WalShared> {
        &self.shared
    }

    /// The log now lives under `root` (its directory was renamed with the
    /// layout; open files stay valid).
    ///
    /// # Errors
    /// The shard directory cannot be opened at its new path.
    pub fn moved_to(&mut self, root: &Path) -> Result<(), super::WalError> {
        self.dir_path = shard_dir(root, self.shard);
        let identity = Arc::new(Identity::open(&self.dir_path).map_err(super::WalError::io(&self.dir_path))?);
        self.shared.set_file(self.file.clone(), Some(identity.clone()), false);
        self.dir = Some(identity);
        Ok(())
    }

    /// The segment records go to now.
    pub fn current_segment(&self) -> u32 {
        self.current
    }

    /// Every segment's figures, by number (tests, tools).
    pub fn segments(&self) -> &BTreeMap<u32, SegmentInfo> {
        &self.segments
    }

    /// Bytes of the segment files, and of the live jobs' records.
    pub fn disk_and_live_bytes(&self) -> (u64, u64) {
        self.segments.values().fold((0, 0), |(b, lb), i| (b + i.bytes, lb + i.live_bytes))
    }

    /// Whether records are kept in the buffer now (not while the log waits
    /// to be rebuilt from memory).
    fn keeping(&self) -> bool {
        !self.fault.is_some_and(|f| f.rebuild)
    }

    /// Schedules the deletion of every segment but the current one whose
    /// jobs are all done (start-up).
    pub fn retire_dead_segments(&mut self) {
        let dead = self.segments.iter().filter(|(n, s)| **n != self.current && s.is_dead()).map(|(n, _)| *n);
        self.deletions.extend(dead);
    }

    /// Knows `job` as dispatched without logging it again (it was in
    /// flight when the log was last open).
    pub(super) fn lend(&mut self, job: &Job) {
        self.lent.insert(job.id, job.clone());
    }

    /// A job the log saw dispatched comes back: its copy goes, and its tag
    /// is the copy's (a repair may have moved its record since it left).
    fn returned(&mut self, job: &mut Job) {
        if let Some(copy) = self.lent.remove(&job.id) {
            job.set_log_tag(copy.log_tag());
        }
    }

    /// Appends the `Accepted` record of `job` to the current segment.
    fn append_accepted(&mut self, job: &mut Job) {
        let len = record::accepted_len(job);
        self.make_room(len);
        self.seq_floor = self.seq_floor.max(job.id.seq());
        record::encode_accepted(job, &mut self.buf);
        job.set_log_tag(self.current);
        self.count_in(len);
    }

    /// Job `id` (its latest `Accepted` record of `bytes` in `tag`) is done.
    /// Counted out also while no record is kept: a segment whose jobs are
    /// all done may go even on a full disk (see [`ShardLog::delete_dead`]).
    fn append_done(&mut self, id: JobId, tag: u32, bytes: usize) {
        if self.keeping() {
            self.make_room(record::ID_RECORD_BYTES);
            record::encode_done(id, &mut self.buf);
            self.grow(record::ID_RECORD_BYTES);
            self.refer_to(tag);
        }
        self.count_out(tag, bytes);
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

    /// Copies waiting `job` forward into the current segment, unless it is
    /// there already (compaction).
    fn relocate(&mut self, job: &mut Job) {
        if job.log_tag() != self.current {
            self.copy_forward(job);
            self.shared.stats.relocated_jobs.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Writes a new `Accepted` record of waiting `job` (its content, its
    /// delivery count) and moves it to the current segment.
    fn copy_forward(&mut self, job: &mut Job) {
        let (from, len) = (job.log_tag(), record::accepted_len(job));
        self.append_accepted(job);
        self.refer_to(from);
        if let Some(info) = self.segments.get_mut(&from) {
            info.moved_upto = self.logged;
        }
        self.count_out(from, len);
    }

    fn count_in(&mut self, len: usize) {
        let cur = self.segments.entry(self.current).or_default();
        cur.bytes += len as u64;
        cur.live += 1;
        cur.live_bytes += len as u64;
        self.logged += len as u64;
    }

    fn grow(&mut self, len: usize) {
        self.segments.entry(self.current).or_default().bytes += len as u64;
        self.logged += len as u64;
    }

    fn count_out(&mut self, segment: u32, record_bytes: usize) {
        let Some(info) = self.segments.get_mut(&segment) else { return };
        info.live = info.live.saturating_sub(1);
        info.live_bytes = info.live_bytes.saturating_sub(record_bytes as u64);
        if info.is_dead() && segment != self.current {
            self.deletions.push(segment);
        }
    }

    /// Starts a new segment first when `len` more bytes would pass the
    /// segment size (a record never spans two segments). Not while the
    /// log is faulty: its records then wait in the buffer (the segment may
    /// pass its size once).
    fn make_room(&mut self, len: usize) {
        let bytes = self.segments.get(&self.current).map_or(0, |s| s.bytes);
        if self.fault.is_none()
            && bytes + len as u64 > self.settings.segment_bytes
            && bytes > SEGMENT_HEADER_BYTES as u64
        {
            if let Err((kind, e)) = self.rotate() {
                self.fail(kind, &e, "starting a new segment", Instant::now());
            }
        }
    }

    /// Closes the current segment (written and synced) and opens the next.
    fn rotate(&mut self) -> Result<(), (FaultKind, std::io::Error)> {
        let Some(next) = self.current.checked_add(1) else {
            tracing::error!(shard = self.shard, "segment numbers exhausted; the current segment grows on");
            return Ok(());
        };
        self.write_out()?;
        self.sync_now()?;
        // `held` names the new segment before anything goes to it, and no
        // longer names the hollow ones, which can go now.
        let needed: Vec<u32> = self.segments.iter().filter(|(_, s)| !s.hollow).map(|(n, _)| *n).collect();
        let file =
            open_segment(&self.dir_path, self.shard, self.shards, next, self.seq_floor, needed).map_err(wal_failure)?;
        let old = std::mem::replace(&mut self.current, next);
        let info = SegmentInfo { bytes: SEGMENT_HEADER_BYTES as u64, file: file_id(&file), ..SegmentInfo::default() };
        let file = Arc::new(file);
        self.shared.set_file(Some(file.clone()), self.dir.clone(), false);
        self.file = Some(file);
        self.segments.insert(next, info);
        if self.segments.get(&old).is_some_and(SegmentInfo::is_dead) {
            self.deletions.push(old);
        }
        let hollow: Vec<u32> = self.segments.iter().filter(|(_, s)| s.hollow).map(|(n, _)| *n).collect();
        if !hollow.is_empty() {
            self.unlink(&hollow);
        }
        Ok(())
    }

    /// Hands the buffered records to the OS: one positional write at the
    /// end of what the current segment holds, so that a write retried
    /// after a failure overwrites whatever part of it reached the file.
    fn write_out(&mut self) -> Result<(), (FaultKind, std::io::Error)> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let Some(file) = &self.file else {
            return Err((FaultKind::Gone, std::io::Error::other("the log let go of its segment")));
        };
        let at = self.segment_len();
        file.write_all_at(&self.buf, at).map_err(|e| (FaultKind::of(&e), e))?;
        self.written += self.buf.len() as u64;
        self.buf.clear();
        self.shared.set_written(self.written);
        Ok(())
    }

    /// Bytes of the current segment already in its file.
    fn segment_len(&self) -> u64 {
        let counted = self.segments.get(&self.current).map_or(SEGMENT_HEADER_BYTES as u64, |s| s.bytes);
        counted - self.buf.len() as u64
    }

    /// Syncs the current segment on the shard's thread.
    fn sync_now(&mut self) -> Result<(), (FaultKind, std::io::Error)> {
        self.unsynced_since = None;
        if self.shared.sync() {
            return Ok(());
        }
        let kind = self.shared.take_fault().unwrap_or(FaultKind::Io);
        Err((kind, std::io::Error::other("sync failed")))
    }

    /// Records a fault of `kind` found while `what` failed with `e` (see
    /// the module docs, "Faults").
    pub(super) fn fail(&mut self, kind: FaultKind, e: &std::io::Error, what: &str, now: Instant) {
        self.shared.stats.count_fault(kind);
        let first = self.fault.is_none();
        let rebuild = kind != FaultKind::Full || self.fault.is_some_and(|f| f.rebuild);
        let backoff = match self.fault {
            Some(f) => (f.backoff * 2).min(limits::WAL_RETRY_MAX),
            None => limits::WAL_RETRY_MIN,
        };
        let tries = self.fault.map_or(0, |f| f.tries + 1);
        // The first cause names the fault until it is repaired (a failed
        // sync after a read-only write is its consequence), unless this one
        // is worse: it needs a rebuild where the first did not.
        // A directory or file found gone or replaced always names the
        // fault: while it does, nothing is deleted by path (a full disk
        // deletes dead segments, `delete_dead`) and a moved directory is
        // cleaned after the rebuild (`let_go`).
        let kind = match self.fault {
            Some(_) if kind == FaultKind::Gone => kind,
            Some(f) if f.rebuild || !rebuild => f.kind,
            _ => kind,
        };
        self.fault = Some(Fault { kind, rebuild, next_try: now + backoff, backoff, tries });
        self.shared.set_faulty(true);
        // Compaction waits for the repair (and starts over after it).
        self.pass = None;
        if rebuild {
            self.let_go();
        }
        self.show_state();
        if first {
            tracing::error!(shard = self.shard, dir = %self.dir_path.display(), error = %e, kind = kind.as_str(),
                "write-ahead log: {what} failed; new jobs are refused ({}) until the log is repaired, \
                 jobs held are served from memory", kind.refusal().code());
        } else {
            crate::log_limited!(warn, shard = self.shard, dir = %self.dir_path.display(), error = %e,
                kind = kind.as_str(), tries, "write-ahead log: still faulty ({what} failed)");
        }
    }

    /// Gives up the buffer and every file (the data directory's too): the
    /// log will be rebuilt from memory.
    fn let_go(&mut self) {
        self.buf.clear();
        self.pass = None;
        self.file = None;
        let old = self.dir.take();
        if self.fault.is_some_and(|f| f.kind == FaultKind::Gone) && self.superseded.is_none() {
            self.superseded = old.filter(|d| dir::linked(&d.file).is_ok());
        }
        self.shared.set_file(None, None, false);
        self.data_dir.release();
    }

    /// After a rebuild in `now` (the shard's directory as opened now):
    /// when the directory the log wrote before is another one, still
    /// linked (the data directory was moved or renamed), removes the log's
    /// files in it through its descriptor, so that no copy of the jobs the
    /// rebuild moved stays behind to come back if it is ever started on.
    pub(super) fn clean_superseded(&mut self, now: &Identity) {
        let Some(old) = self.superseded.take() else { return };
        let id = |f: &File| file_id(f);
        if id(&old.file) == id(&now.file) || dir::linked(&old.file).is_err() {
            return;
        }
        match dir::remove_log_files_at(&old.file) {
            Ok(n) => tracing::warn!(shard = self.shard, segments = n, was = %old.path.display(),
                "removed the log's segments from its old directory (moved away while the router ran), through the directory opened at start"),
            Err(e) => tracing::error!(shard = self.shard, was = %old.path.display(), error = %e,
                "cannot clean the log's old directory (moved away while the router ran): its segments hold copies of jobs now in the new log"),
        }
    }

    /// The state as STATUS shows it.
    fn show_state(&self) {
        let state = match (self.fault, self.alarm) {
            (Some(f), _) => LogState::Faulty(f.kind),
            (None, true) => LogState::Alarm,
            (None, false) => LogState::Ok,
        };
        self.shared.stats.set_state(state);
    }

    /// Checks free space and, when the log is healthy, its files (once per
    /// [`limits::WAL_CHECK_INTERVAL`]).
    fn check(&mut self, now: Instant) {
        if self.next_check.is_some_and(|t| now < t) {
            return;
        }
        self.next_check = Some(now + limits::WAL_CHECK_INTERVAL);
        self.look_at_free_space();
        if self.fault.is_none() {
            if let Err(kind) = self.files_check() {
                self.fail(kind, &std::io::Error::other("deleted or replaced"), "checking the log's files", now);
            } else if let Err((kind, e)) = self.segments_check() {
                self.fail(kind, &e, "checking the log's segments", now);
            } else if self.data_dir.check().is_err() {
                // The log's own files are fine: only the lock file went
                // (or another shard let go of it); take it again.
                if let Err((kind, e)) = self.data_dir.ensure() {
                    self.fail(kind, &e, "locking the data directory again", now);
                }
            }
        }
        self.show_state();
    }

    /// Reads the data directory's free space (`statvfs`) and sets the
    /// alarm by it, saying so when it changes: at open, and from
    /// [`ShardLog::check`].
    fn look_at_free_space(&mut self) {
        let free = match self.data_dir.free_bytes() {
            Ok(free) => free,
            Err(e) => {
                crate::log_limited!(warn, shard = self.shard, error = %e, "cannot read the data directory's free space");
                return;
            }
        };
        self.shared.stats.free_bytes.store(free, Ordering::Relaxed);
        (self.free_at_check, self.logged_at_check) = (free, self.logged - self.buf.len() as u64);
        let alarm = self.past_free_limit();
        if alarm == self.alarm {
            return;
        }
        self.alarm = alarm;
        let limit = self.settings.disk_free_limit;
        // The code producers get: a fault's own comes first.
        match (alarm, self.fault) {
            (true, None) => tracing::warn!(shard = self.shard, free, limit, refused = "STORE_FULL",
                "free disk space below disk_free_limit: new jobs are refused (STORE_FULL)"),
            (true, Some(f)) => tracing::warn!(shard = self.shard, free, limit, refused = f.kind.refusal().code(),
                "free disk space below disk_free_limit: new jobs are refused ({} while the log's fault lasts, then STORE_FULL)",
                f.kind.refusal().code()),
            (false, None) => tracing::info!(shard = self.shard, free, limit,
                "free disk space above disk_free_limit again: new jobs are accepted"),
            (false, Some(f)) => tracing::info!(shard = self.shard, free, limit, refused = f.kind.refusal().code(),
                "free disk space above disk_free_limit again; new jobs stay refused ({}) until the log is repaired",
                f.kind.refusal().code()),
        }
    }

    /// Whether the shard's directory and current segment are still the
    /// ones the log writes, the segment no shorter than what was written
    /// to it (deleted, replaced or truncated shows as `Gone`). One `fstat`
    /// of the segment and a `stat` and `fstat` of the directory: cheap
    /// enough for every batch with `async`.
    fn files_check(&self) -> Result<(), FaultKind> {
        if let Some(file) = &self.file {
            if dir::linked(file)? < self.segment_len() {
                return Err(FaultKind::Gone);
            }
        }
        self.dir.as_ref().map_or(Err(FaultKind::Gone), |d| d.check())
    }

    /// Whether every other segment the log still needs (one with a live
    /// job, or with records that cancel records in an older one) is still
    /// the file the log wrote, at least as long as it was written: a
    /// segment deleted, replaced by another file or truncated would lose
    /// its jobs at the next start, so it is a fault (`Gone`) and the log is
    /// rebuilt from memory. Cost: one `stat` per such segment, only from
    /// the check every [`limits::WAL_CHECK_INTERVAL`] (segments are
    /// [`LogSettings::segment_bytes`] each, so a log holds few of them:
    /// about 2 × its live bytes / segment size, see [`limits::WAL_DISK_FACTOR`]).
    fn segments_check(&self) -> Result<(), (FaultKind, std::io::Error)> {
        use std::os::unix::fs::MetadataExt;
        let needed = self.segments.iter().filter(|(n, s)| **n != self.current && !s.is_dead());
        for (&n, info) in needed {
            let path = segment_path(&self.dir_path, n);
            let why = match std::fs::symlink_metadata(&path) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => "deleted".to_string(),
                Err(e) => return Err((FaultKind::of(&e), e)),
                Ok(m) if info.file.is_some_and(|id| id != (m.dev(), m.ino())) => "replaced by another file".to_string(),
                Ok(m) if m.len() < info.bytes => format!("truncated to {} of {} bytes", m.len(), info.bytes),
                Ok(_) => continue,
            };
            return Err((FaultKind::Gone, std::io::Error::other(format!("{}: {why}", path.display()))));
        }
        Ok(())
    }

    /// Deletes the dead segments whose deletion is safe now (see
    /// [`ShardLog::retire`]).
    ///
    /// Also during a `Full` fault (not during another: what the log wrote
    /// is in doubt, the rebuild deletes every old segment): that is how a
    /// full disk gets space back as consumers finish jobs, with no record
    /// written. A job finished then whose `Done` record was not written
    /// and whose segment stays comes back at the next start (redelivered,
    /// never lost).
    fn delete_dead(&mut self) {
        if self.deletions.is_empty() || self.fault.is_some_and(|f| f.kind != FaultKind::Full) {
            return;
        }
        let ready = self.deletable();
        if !ready.is_empty() {
            self.retire(&ready);
        }
    }

    /// The dead segments other than the current one that may go now, in
    /// order: none of their jobs is live, the copies of those moved forward
    /// are synced, and every older segment whose records theirs cancel is
    /// gone ([`SegmentInfo::is_dead`]). Their jobs' `Done` records need not
    /// be written: deleting the segment takes the jobs with it, which is at
    /// least as strong (this is what frees space on a full disk). The
    /// candidates are those noted as they died; one not ready yet is kept.
    fn deletable(&mut self) -> Vec<u32> {
        let synced = self.shared.synced();
        let candidates = std::mem::take(&mut self.deletions);
        let mut ready = Vec::new();
        for n in candidates {
            match self.segments.get(&n) {
                Some(s) if n != self.current && s.is_dead() && !s.hollow => {
                    if s.moved_upto <= synced {
                        ready.push(n);
                    } else {
                        self.deletions.push(n);
                    }
                }
                _ => {}
            }
        }
        ready.sort_unstable();
        ready.dedup();
        ready
    }

    /// Removes the dead segments `ready` (see [`ShardLog::deletable`]):
    /// writes `held` without them (and without the hollow ones), deletes
    /// them and the hollow ones, and syncs the directory; when `held`
    /// cannot be written (a full disk), cuts each to its header instead
    /// (hollow: its records are gone, its file stays until `held` can be
    /// written). Either way, once that is durable, the segments whose
    /// records cancel records in them may go in turn.
    fn retire(&mut self, ready: &[u32]) {
        let hollow: Vec<u32> = self.segments.iter().filter(|(_, s)| s.hollow).map(|(n, _)| *n).collect();
        let unmade = self.unmade.then_some(self.current);
        let needed = self
            .segments
            .iter()
            .filter(|(n, s)| !s.hollow && ready.binary_search(n).is_err() && Some(**n) != unmade)
            .map(|(n, _)| *n);
        let gone = match held::write(&self.dir_path, needed) {
            Ok(()) => {
                let all: Vec<u32> = ready.iter().chain(&hollow).copied().collect();
                let gone = self.unlink(&all);
                gone.into_iter().filter(|n| ready.binary_search(n).is_ok()).collect()
            }
            Err(e) => {
                crate::log_limited!(warn, shard = self.shard, dir = %self.dir_path.display(), error = %e,
                    "cannot write the list of the log's segments: dead segments are cut to their header instead of deleted");
                ready.iter().copied().filter(|&n| self.hollow(n)).collect::<Vec<u32>>()
            }
        };
        self.freed(&gone);
    }

    /// Deletes the segment files `numbers` (dead, and no longer in `held`)
    /// and syncs the directory; the numbers deleted (or already gone). A
    /// directory that cannot be synced is a fault: what was deleted is in
    /// doubt, and the log is rebuilt.
    fn unlink(&mut self, numbers: &[u32]) -> Vec<u32> {
        let mut gone = Vec::new();
        for &n in numbers {
            let path = segment_path(&self.dir_path, n);
            // Through the directory as opened, not by path: a path may name
            // another directory by now (the data directory moved).
            let removed = match &self.dir {
                Some(d) => dir::unlink_at(&d.file, &segment_path(Path::new(""), n)),
                None => std::fs::remove_file(&path),
            };
            match removed {
                Ok(()) => self.shared.stats.deleted_segments.fetch_add(1, Ordering::Relaxed),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
                Err(e) => {
                    tracing::warn!(shard = self.shard, file = %path.display(), error = %e, "cannot delete a dead segment");
                    self.deletions.push(n);
                    continue;
                }
            };
            self.segments.remove(&n);
            gone.push(n);
        }
        if !gone.is_empty() {
            // Durable before any segment that depended on them can go (at a
            // later call): a crash never leaves a segment whose cancelling
            // records are gone.
            let synced = match &self.dir {
                Some(d) => d.file.sync_all(),
                None => dir::sync_dir(&self.dir_path).map_err(|e| wal_failure(e).1),
            };
            if let Err(source) = synced {
                self.fail(FaultKind::of(&source), &source, "syncing the log directory", Instant::now());
                return Vec::new();
            }
        }
        gone
    }

    /// Cuts dead segment `n` to its header and syncs it: its records are
    /// gone, which needs no space (the current segment too, on a full
    /// disk: what waits in the buffer is then written after its header).
    /// Whether it worked.
    fn hollow(&mut self, n: u32) -> bool {
        let header = SEGMENT_HEADER_BYTES as u64;
        let path = segment_path(&self.dir_path, n);
        let cut = match (&self.file, n == self.current) {
            (Some(file), true) => file.set_len(header).and_then(|()| file.sync_all()),
            (None, true) => return false,
            (_, false) => std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .and_then(|f| f.set_len(header).and_then(|()| f.sync_all())),
        };
        if let Err(e) = cut {
            crate::log_limited!(warn, shard = self.shard, file = %path.display(), error = %e, "cannot empty a dead segment");
            return false;
        }
        let waiting = self.buf.len() as u64;
        let current = n == self.current;
        if let Some(info) = self.segments.get_mut(&n) {
            info.bytes = header + if current { waiting } else { 0 };
            info.hollow = !current;
        }
        true
    }

    /// Segments `gone` were deleted or emptied, durably: the segments whose
    /// records cancelled records in them may die in turn.
    fn freed(&mut self, gone: &[u32]) {
        if gone.is_empty() {
            return;
        }
        for (n, info) in self.segments.iter_mut() {
            let before = info.older.len();
            info.older.retain(|o| !gone.contains(o));
            if info.older.len() < before && *n != self.current && info.is_dead() && !info.hollow {
                self.deletions.push(*n);
            }
        }
    }

    pub(super) fn update_stats(&self) {
        let s = &self.shared.stats;
        let (bytes, live, live_bytes) =
            self.segments.values().fold((0, 0, 0), |(b, l, lb), i| (b + i.bytes, l + i.live, lb + i.live_bytes));
        s.log_bytes.store(bytes, Ordering::Relaxed);
        s.segments.store(self.segments.len() as u64, Ordering::Relaxed);
        s.live_jobs.store(live, Ordering::Relaxed);
        s.live_bytes.store(live_bytes, Ordering::Relaxed);
    }

    /// One bounded step of compaction (at most
    /// [`limits::WAL_COMPACT_STEP_JOBS`] jobs looked at and
    /// [`limits::WAL_COMPACT_STEP_BYTES`] copied): starts a pass when the
    /// log is over its bound ([`limits::WAL_DISK_FACTOR`] × live bytes +
    /// one segment) and some old segment is less than 1/factor live; copies
    /// forward the waiting jobs whose record lies in such a segment, then
    /// the dead jobs (with their `Buried` record). Jobs in flight, offered
    /// or waiting for a retry are not copied: they keep their segment until
    /// they finish or come back.
    fn compact_step(&mut self, holdings: &mut dyn Holdings) {
        if self.pass.is_none() {
            self.pass = self.plan(holdings);
        }
        let Some(mut pass) = self.pass.take() else { return };
        let (mut looked, start) = (0, self.buf.len());
        while looked < limits::WAL_COMPACT_STEP_JOBS && self.buf.len() - start < limits::WAL_COMPACT_STEP_BYTES {
            let max = limits::WAL_COMPACT_STEP_JOBS - looked;
            let Some(queue) = pass.queues.get(pass.at).cloned() else {
                let victims = std::mem::take(&mut pass.victims);
                let (seen, next) = holdings.visit_dead(pass.dead_at, max, &mut |d| {
                    if victims.binary_search(&d.job.log_tag()).is_ok() {
                        self.append_buried(d);
                    }
                });
                pass.victims = victims;
                looked += seen.max(1);
                match next {
                    Some(at) if self.fault.is_none() => pass.dead_at = at,
                    _ => {
                        self.last_pass_at = self.logged;
                        return;
                    }
                }
                continue;
            };
            let victims = std::mem::take(&mut pass.victims);
            let (seen, next) = holdings.visit_waiting(&queue, pass.pos, max, &mut |job| {
                if victims.binary_search(&job.log_tag()).is_ok() {
                    self.relocate(job);
                }
            });
            pass.victims = victims;
            looked += seen.max(1);
            match next {
                Some(pos) => pass.pos = pos,
                None => (pass.at, pass.pos) = (pass.at + 1, 0),
            }
        }
        // A fault during the step (a new segment that could not be made)
        // ends the pass.
        if self.fault.is_none() {
            self.pass = Some(pass);
        }
    }

    /// A pass, when the log is over its bound and has victims.
    fn plan(&self, holdings: &dyn Holdings) -> Option<Pass> {
        let (disk, live) = self.disk_and_live_bytes();
        let factor = limits::WAL_DISK_FACTOR;
        if disk <= factor * live + self.settings.segment_bytes
            || (self.last_pass_at > 0 && self.logged < self.last_pass_at + self.settings.segment_bytes / 2)
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
        Some(Pass { victims, queues: holdings.queues(), at: 0, pos: 0, dead_at: 0 })
    }

    /// The `Buried` record of `dead`, in the same segment as the job's
    /// latest `Accepted` record (copied forward when it lies elsewhere), so
    /// the two are kept or deleted together.
    fn append_buried(&mut self, dead: &mut DeadJob) {
        let len = record::accepted_len(&dead.job);
        self.make_room(len + record::BURIED_RECORD_BYTES);
        if dead.job.log_tag() != self.current {
            self.copy_forward(&mut dead.job);
        }
        let job = &dead.job;
        record::encode_buried(job.id, job.redeliveries(), dead.why, dead.at_unix_ms, &mut self.buf);
        self.grow(record::BURIED_RECORD_BYTES);
    }

    /// Starts over in what a repair wrote (see `repair.rs`): `segments`,
    /// the last of which, `current`, is `file` in `dir`; every position
    /// logged so far is durable.
    pub(super) fn start_over(
        &mut self,
        segments: BTreeMap<u32, SegmentInfo>,
        current: u32,
        file: Arc<File>,
        dir: Arc<Identity>,
    ) {
        self.segments = segments;
        self.current = current;
        self.unmade = false;
        self.dir = Some(dir.clone());
        self.file = Some(file.clone());
        self.written = self.logged;
        self.buf.clear();
        self.deletions.clear();
        self.pass = None;
        self.last_ref = (0, 0);
        self.unsynced_since = None;
        self.shared.set_file(Some(file), Some(dir), true);
        self.shared.set_written(self.written);
        self.shared.repaired(self.logged);
    }

    /// Appends `bytes` of records the repair wrote straight to a file
    /// (positions count them as logged and written).
    pub(super) fn count_rewritten(&mut self, bytes: u64) {
        self.logged += bytes;
    }
}

impl JobLog for ShardLog {
    fn accepted(&mut self, job: &mut Job) {
        self.seq_floor = self.seq_floor.max(job.id.seq());
        if self.keeping() {
            self.append_accepted(job);
        }
    }

    fn client_key(&mut self, id: JobId, at_unix_ms: u64, client: &[u8], msgid: &[u8]) {
        if self.keeping() {
            let len = record::client_key_len(client, msgid);
            self.make_room(len);
            if record::encode_client_key(id, at_unix_ms, client, msgid, &mut self.buf).is_some() {
                self.grow(len);
            }
        }
    }

    fn dispatched(&mut self, job: &Job) {
        self.lent.insert(job.id, job.clone());
        if self.keeping() {
            self.make_room(record::ID_RECORD_BYTES);
            record::encode_dispatched(job.id, &mut self.buf);
            self.grow(record::ID_RECORD_BYTES);
        }
    }

    /// A job that has lost a delivery (its worker died, it failed) is
    /// copied forward whole, so its delivery count lives in the `Accepted`
    /// record that stays as long as the job does; any other gets a small
    /// `Requeued` record.
    fn requeued(&mut self, job: &mut Job) {
        self.returned(job);
        if !self.keeping() {
            return;
        }
        if job.redeliveries() > 0 {
            return self.copy_forward(job);
        }
        self.make_room(record::ID_RECORD_BYTES + 1);
        record::encode_requeued(job.id, job.redeliveries(), &mut self.buf);
        self.grow(record::ID_RECORD_BYTES + 1);
    }

    fn buried(&mut self, dead: &mut DeadJob) {
        self.returned(&mut dead.job);
        if self.keeping() {
            self.append_buried(dead);
        }
    }

    /// A fresh `Accepted` record (its setbacks as the job now counts them)
    /// supersedes its `Buried` one.
    fn unburied(&mut self, job: &mut Job) {
        if self.keeping() {
            self.copy_forward(job);
        }
    }

    fn done(&mut self, job: &Job) {
        let (tag, bytes) = match self.lent.remove(&job.id) {
            Some(copy) => (copy.log_tag(), record::accepted_len(&copy)),
            None => (job.log_tag(), record::accepted_len(job)),
        };
        self.append_done(job.id, tag, bytes);
    }

    fn done_elsewhere(&mut self, id: JobId) {
        match self.lent.remove(&id) {
            Some(copy) => self.append_done(id, copy.log_tag(), record::accepted_len(&copy)),
            None => tracing::debug!(shard = self.shard, job = %id, "done elsewhere, but not known as dispatched"),
        }
    }

    fn commit(&mut self, now: Instant) -> Commit {
        self.last_commit = Some(now);
        if let Some(kind) = self.shared.take_fault() {
            self.fail(kind, &std::io::Error::other("found by a sync"), "syncing", now);
        }
        let wrote = self.fault.is_none() && !self.buf.is_empty();
        if self.fault.is_none() {
            if let Err((kind, e)) = self.write_out() {
                self.fail(kind, &e, "writing", now);
            }
        }
        self.give_up_buffer_past_its_bound();
        if !self.alarm && self.past_free_limit() {
            // What was written since the last look may have passed the
            // limit (or compaction freed space meanwhile): look now.
            self.next_check = None;
        }
        self.check(now);
        if self.fault.is_none() && self.settings.durability == Durability::Async && wrote {
            // Released at its write: its files must still be the log's.
            if let Err(kind) = self.files_check() {
                self.fail(kind, &std::io::Error::other("deleted or replaced"), "checking the log's files", now);
            }
        }
        if self.fault.is_none() && self.settings.durability == Durability::Async {
            self.shared.advance(self.written);
            self.async_sync(now);
        }
        self.delete_dead();
        self.update_stats();
        if self.logged > self.shared.durable_upto().0 {
            Commit::After(Ticket(self.logged))
        } else {
            Commit::Release
        }
    }

    fn durable(&self) -> Arc<dyn Durable> {
        self.shared.clone()
    }

    fn refusal(&self) -> Option<StoreFault> {
        match (self.fault, self.alarm || self.past_free_limit()) {
            (Some(f), _) => Some(f.kind.refusal()),
            (None, true) => Some(StoreFault::Full),
            (None, false) => None,
        }
    }

    /// At once while compaction has work left; with `async`, when the log
    /// must be synced next; when a repair is due; and every
    /// [`limits::WAL_CHECK_INTERVAL`] to look at free space and the files.
    fn next_deadline(&self) -> Option<Instant> {
        if self.fault.is_none() && (self.pass.is_some() || !self.buf.is_empty()) {
            return self.last_commit;
        }
        // A faulty log syncs nothing until its repair (`commit`).
        let sync = match self.settings.durability {
            Durability::Async if self.fault.is_none() => self.unsynced_since.map(|t| t + self.settings.sync_interval),
            _ => None,
        };
        let repair = self.fault.map(|f| f.next_try);
        [sync, repair, self.next_check].into_iter().flatten().min()
    }

    fn maintain(&mut self, now: Instant, holdings: &mut dyn Holdings) {
        self.check(now);
        match self.fault {
            None => self.compact_step(holdings),
            Some(f) if now >= f.next_try => self.repair(now, holdings),
            Some(_) => {}
        }
    }

    fn sync_all(&mut self) -> bool {
        if self.fault.is_some() {
            return false;
        }
        let result = self.write_out().and_then(|()| self.sync_now());
        if let Err((kind, e)) = result {
            self.fail(kind, &e, "syncing", Instant::now());
            return false;
        }
        self.delete_dead();
        self.update_stats();
        true
    }

    fn status(&self) -> Arc<dyn LogStatus> {
        self.shared.clone()
    }
}

impl ShardLog {
    /// `async`: syncs once the sync interval has passed since something
    /// was first left unsynced; checks the files first (the batch was
    /// released at its write).
    fn async_sync(&mut self, now: Instant) {
        if self.written <= self.shared.synced() {
            return;
        }
        let since = *self.unsynced_since.get_or_insert(now);
        if now.saturating_duration_since(since) < self.settings.sync_interval {
            return;
        }
        if let Err((kind, e)) = self.sync_now() {
            self.fail(kind, &e, "syncing", now);
        }
    }

    /// A log waiting for a full disk whose records waiting pass
    /// [`limits::WAL_FAULT_BUFFER_BYTES`] gives them up: it will be
    /// rebuilt from memory once the disk takes writes again.
    fn give_up_buffer_past_its_bound(&mut self) {
        let Some(f) = &mut self.fault else { return };
        if f.rebuild || self.buf.len() <= limits::WAL_FAULT_BUFFER_BYTES {
            return;
        }
        f.rebuild = true;
        let bound = limits::WAL_FAULT_BUFFER_BYTES;
        tracing::warn!(shard = self.shard, bound, "write-ahead log: more records wait for the full disk than it keeps; it will be rebuilt from memory instead");
        self.let_go();
    }

    /// Whether the bytes logged since the last `statvfs` would take free
    /// space below `disk_free_limit` (no system call: the shard asks at
    /// every new job).
    fn past_free_limit(&self) -> bool {
        let limit = self.settings.disk_free_limit;
        limit > 0 && self.free_at_check.saturating_sub(self.logged - self.logged_at_check) < limit
    }

    /// Makes the current segment's file when the router started without
    /// it (a full disk), `held` naming it.
    fn make_current(&mut self) -> Result<(), (FaultKind, std::io::Error)> {
        if !self.unmade {
            return Ok(());
        }
        let needed: Vec<u32> = self.segments.iter().filter(|(_, s)| !s.hollow).map(|(n, _)| *n).collect();
        let file = open_segment(&self.dir_path, self.shard, self.shards, self.current, self.seq_floor, needed)
            .map_err(wal_failure)?;
        let file = Arc::new(file);
        if let Some(info) = self.segments.get_mut(&self.current) {
            info.file = file_id(&file);
        }
        self.shared.set_file(Some(file.clone()), self.dir.clone(), false);
        self.file = Some(file);
        self.unmade = false;
        Ok(())
    }

    /// One attempt to repair the log (see the module docs, "Faults").
    fn repair(&mut self, now: Instant, holdings: &mut dyn Holdings) {
        let Some(fault) = self.fault else { return };
        let result = if fault.rebuild {
            self.buf.clear();
            self.rebuild(holdings)
        } else {
            self.make_current()
                .and_then(|()| self.files_check().map_err(|k| (k, std::io::Error::other("deleted or replaced"))))
                .and_then(|()| self.write_out())
        };
        match result {
            Ok(()) => {
                let tries = fault.tries + 1;
                self.fault = None;
                if self.settings.durability == Durability::Async {
                    self.shared.advance(self.written);
                }
                self.shared.set_faulty(false);
                self.shared.stats.repairs.fetch_add(1, Ordering::Relaxed);
                self.next_check = None;
                self.check(now);
                self.show_state();
                self.update_stats();
                let how = if fault.rebuild { "rebuilt from memory" } else { "written again" };
                if self.alarm {
                    tracing::warn!(shard = self.shard, dir = %self.dir_path.display(), tries, refused = "STORE_FULL",
                        "write-ahead log repaired ({how}); new jobs stay refused (STORE_FULL): free disk space is below disk_free_limit");
                } else {
                    tracing::warn!(shard = self.shard, dir = %self.dir_path.display(), tries, "write-ahead log repaired ({how}): new jobs are accepted again");
                }
            }
            Err((kind, e)) => self.fail(kind, &e, if fault.rebuild { "rebuilding" } else { "writing again" }, now),
        }
    }
}

/// Creates segment `number` ([`new_segment`]) and writes `held` naming it
/// with `others` (see `held.rs`); the segment is removed when `held`
/// cannot be written.
fn open_segment(
    dir: &Path,
    shard: usize,
    shards: usize,
    number: u32,
    seq_floor: u64,
    others: impl IntoIterator<Item = u32>,
) -> Result<File, super::WalError> {
    let file = new_segment(dir, shard, shards, number, seq_floor)?;
    let mut needed: Vec<u32> = others.into_iter().chain([number]).collect();
    needed.sort_unstable();
    needed.dedup();
    if let Err(source) = held::write(dir, needed) {
        let _ = std::fs::remove_file(segment_path(dir, number));
        return Err(super::WalError::Io { path: held::held_path(dir), source });
    }
    Ok(file)
}

/// A [`super::WalError`] as a fault's kind and OS error.
fn wal_failure(e: super::WalError) -> (FaultKind, std::io::Error) {
    match e {
        super::WalError::Io { source, .. } => (FaultKind::of(&source), source),
        other => (FaultKind::Other, std::io::Error::other(other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{JobFrames, Origin};
    use crate::joblog::fake::OneQueue;

    fn log_in(dir: &Path, durability: Durability) -> ShardLog {
        log_limited(dir, durability, 0)
    }

    fn log_limited(dir: &Path, durability: Durability, disk_free_limit: u64) -> ShardLog {
        let data = Arc::new(DataDir::lock(dir).expect("locks"));
        let root = data.wal();
        let settings = LogSettings {
            durability,
            sync_interval: Duration::from_secs(3600),
            segment_bytes: 1 << 20,
            disk_free_limit,
        };
        ShardLog::create(0, 1, data, &root, settings, BTreeMap::new(), 1, 0).expect("log")
    }

    fn job(seq: u64) -> Job {
        let frames = JobFrames::new(b"m", b"q", b"", b"body", &[] as &[&[u8]]).expect("frames");
        let now = Instant::now();
        Job::new(JobId::new(0, seq), frames, Origin::Emqp, false, now, now)
    }

    #[test]
    fn a_sync_that_finds_its_segment_gone_holds_the_ticket_until_a_rebuild() {
        let tmp = tempfile::tempdir().unwrap();
        let mut log = log_in(tmp.path(), Durability::Sync);
        let mut j = job(1);
        log.accepted(&mut j);
        let Commit::After(ticket) = log.commit(Instant::now()) else { panic!("a ticket to wait for") };
        std::fs::remove_file(segment_path(&log.dir_path, log.current)).unwrap();
        // The sync (the sync thread's, here called directly) finds it.
        let durable = log.durable();
        assert!(!durable.make_durable(ticket), "a sync of a deleted segment does not make it durable");
        log.accepted(&mut job(2));
        let now = Instant::now();
        let _ = log.commit(now);
        assert_eq!(log.refusal(), Some(StoreFault::Failed), "new jobs refused");
        assert!(!log.shared().sync(), "never synced again before the repair");
        assert!(!durable.make_durable(ticket));
        // Its back-off passed: rebuilt from what the shard holds.
        let mut holdings = OneQueue(vec![j]);
        log.maintain(now + limits::WAL_RETRY_MIN, &mut holdings);
        assert_eq!(log.refusal(), None, "repaired");
        assert!(durable.make_durable(ticket), "every ticket handed out is durable");
        assert!(durable.durable_upto() >= ticket);
        assert_eq!(holdings.0[0].log_tag(), log.current, "the job's record is in the new segment");
    }

    /// After a failed sync Linux reports lost writeback once: a later sync
    /// of the same file (a rotation on the shard's thread, say) may succeed
    /// over lost data. A reported fault stops every sync until a repair.
    #[test]
    fn a_reported_fault_stops_every_sync_until_the_repair() {
        let tmp = tempfile::tempdir().unwrap();
        let mut log = log_in(tmp.path(), Durability::Sync);
        log.accepted(&mut job(1));
        let Commit::After(ticket) = log.commit(Instant::now()) else { panic!("a ticket to wait for") };
        log.shared().report_fault(FaultKind::Io);
        assert!(!log.shared().sync(), "the file is fine, the fault was reported: no sync");
        assert!(log.durable().durable_upto() < ticket);
        assert!(!log.sync_all(), "nor a sync of everything");
        assert_eq!(log.refusal(), Some(StoreFault::Failed));
    }

    #[test]
    fn a_fault_ends_compaction_and_the_shard_does_not_spin() {
        let tmp = tempfile::tempdir().unwrap();
        let mut log = log_in(tmp.path(), Durability::Async);
        let now = Instant::now();
        let _ = log.commit(now);
        log.pass = Some(Pass { victims: vec![1], queues: Vec::new(), at: 0, pos: 0, dead_at: 0 });
        assert_eq!(log.next_deadline(), Some(now), "a pass under way: at once");
        log.fail(FaultKind::Full, &std::io::Error::other("test"), "writing", now);
        assert!(log.pass.is_none(), "the pass ends with the fault");
        let next = log.next_deadline().expect("a retry is due");
        assert!(next >= now + limits::WAL_RETRY_MIN, "the loop waits for the back-off: {:?}", next - now);
    }

    /// `async` with records left unsynced when the fault came: no sync is
    /// tried until the repair, so the sync interval must not wake the
    /// shard (it woke at once, again and again, until a repair succeeded).
    #[test]
    fn a_fault_with_records_unsynced_does_not_wake_the_shard_for_a_sync() {
        let tmp = tempfile::tempdir().unwrap();
        let mut log = log_in(tmp.path(), Durability::Async);
        log.settings.sync_interval = Duration::from_millis(1);
        let now = Instant::now();
        log.accepted(&mut job(1));
        let _ = log.commit(now);
        assert!(log.unsynced_since.is_some(), "a record written, not synced");
        log.fail(FaultKind::ReadOnly, &std::io::Error::other("test"), "writing", now);
        let next = log.next_deadline().expect("a retry is due");
        assert!(next >= now + limits::WAL_RETRY_MIN, "the loop waits for the back-off: {:?}", next - now);
    }

    /// Black-box finding 3: free space is read every second, and a burst
    /// in between counts against it: new jobs are refused as soon as what
    /// was logged since the last `statvfs` would take free space below
    /// `disk_free_limit`; the next `statvfs` (forced at that commit)
    /// decides with the real figure.
    #[test]
    fn bytes_logged_between_free_space_checks_count_against_the_limit() {
        let tmp = tempfile::tempdir().unwrap();
        let mut log = log_in(tmp.path(), Durability::Sync);
        log.settings.disk_free_limit = 1 << 20;
        let now = Instant::now();
        let _ = log.commit(now);
        let free = log.free_at_check;
        assert!(free > 64 << 20, "the test needs 64 MiB free: {free}");
        assert_eq!(log.refusal(), None);
        // As if the last statvfs found 3 records' room above the limit.
        let len = record::accepted_len(&job(1)) as u64;
        log.free_at_check = (1 << 20) + 3 * len;
        log.logged_at_check = log.logged;
        log.next_check = Some(now + Duration::from_secs(3600));
        for seq in 1..=3 {
            log.accepted(&mut job(seq));
            assert_eq!(log.refusal(), None, "job {seq}: still at or above the limit");
        }
        log.accepted(&mut job(4));
        assert_eq!(log.refusal(), Some(StoreFault::Full), "the 4th job's record passes the limit: refused at once");
        // The commit looks at the real free space at once, not in an hour.
        let _ = log.commit(now);
        assert!(log.free_at_check > 32 << 20, "read again: {}", log.free_at_check);
        assert_eq!(log.refusal(), None, "the real free space is far above the limit");
    }

    /// New-user finding 1: the log reads free space when it opens, so a
    /// router started below `disk_free_limit` refuses its first job (it
    /// used to accept jobs until the first check, at the first commit or
    /// a second later), says so once, and STATUS shows the alarm at once.
    #[test]
    fn a_log_opened_below_disk_free_limit_refuses_before_its_first_commit() {
        let tmp = tempfile::tempdir().unwrap();
        let free = dir::free_bytes(tmp.path()).unwrap();
        let limit = free.saturating_mul(2).max(1 << 40);
        let (log, said) = crate::logging::capture("warn", || log_limited(tmp.path(), Durability::Sync, limit));
        assert_eq!(log.refusal(), Some(StoreFault::Full), "refused before any commit or check");
        assert!(log.alarm);
        assert_eq!(log.shared().stats.state(), LogState::Alarm, "STATUS says disk_alarm from the start");
        let seen = log.shared().stats.free_bytes.load(Ordering::Relaxed);
        assert!(seen > 0 && seen < limit, "free space read at open: {seen}");
        let line = "free disk space below disk_free_limit: new jobs are refused (STORE_FULL)";
        assert_eq!(said.matches(line).count(), 1, "one warning: {said}");
        drop(log);
        // Above the limit (and with the alarm off): accepted, nothing said.
        for limit in [1, 0] {
            let tmp = tempfile::tempdir().unwrap();
            let (log, said) = crate::logging::capture("warn", || log_limited(tmp.path(), Durability::Sync, limit));
            assert_eq!(log.refusal(), None, "limit {limit}");
            assert_eq!(log.shared().stats.state(), LogState::Ok, "limit {limit}");
            assert!(!said.contains("disk_free_limit"), "limit {limit}: {said}");
        }
    }

    /// New-user finding 2's kin: a line that names a refusal names the one
    /// producers get. Free space falling below the limit during a fault
    /// that refuses with `STORE_FAILED` says so; a repair that ends with
    /// free space below the limit does not say jobs are accepted.
    #[test]
    fn the_alarm_and_repair_lines_name_the_code_producers_get() {
        let tmp = tempfile::tempdir().unwrap();
        let mut log = log_in(tmp.path(), Durability::Sync);
        let now = Instant::now();
        log.fail(FaultKind::ReadOnly, &std::io::Error::other("test"), "writing", now);
        assert_eq!(log.refusal(), Some(StoreFault::Failed));
        log.settings.disk_free_limit = u64::MAX;
        let ((), said) = crate::logging::capture("warn", || log.look_at_free_space());
        assert_eq!(log.refusal(), Some(StoreFault::Failed), "the fault's code comes first");
        assert!(
            said.contains(
                "free disk space below disk_free_limit: new jobs are refused (STORE_FAILED while the log's fault lasts, then STORE_FULL)"
            ),
            "{said}"
        );
        // The repair (a rebuild) works; free space stays below the limit.
        let mut holdings = OneQueue(Vec::new());
        let ((), said) = crate::logging::capture("warn", || log.maintain(now + limits::WAL_RETRY_MIN, &mut holdings));
        assert_eq!(log.refusal(), Some(StoreFault::Full), "repaired, still below the limit");
        assert!(
            said.contains("write-ahead log repaired (rebuilt from memory); new jobs stay refused (STORE_FULL): free disk space is below disk_free_limit"),
            "{said}"
        );
        assert!(!said.contains("new jobs are accepted"), "{said}");
    }
}
