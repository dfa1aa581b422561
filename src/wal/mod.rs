//! The write-ahead log: an accepted job survives a crash of the router.
//!
//! DESIGN "A shard owns its log": each shard appends the records of its
//! queues' jobs to its own log, `<data dir>/wal/shard-<n>/`, a series of
//! segment files ([`segment`]) of records ([`record`]): `Accepted` (the
//! whole job), `Dispatched`, `Requeued`, `Buried` and `Done`. No lock is shared
//! between shards. A job's records go to the log of the shard that accepted
//! it (the low 16 bits of its [`crate::ids::JobId`]), which owns its queue;
//! a worker's home shard that learns a job is done tells that shard.
//!
//! # Group commit
//!
//! A shard writes the records of one batch of messages with one `write` and
//! makes them durable with one `fdatasync` ([`log::ShardLog::commit`]).
//! With `durability = "sync"` nothing the batch promised leaves the router
//! before that sync: not the acceptance REPLYs (eMQP), not the text
//! answers (so a text producer's next reply means its earlier SCHEDs are
//! stored). Jobs for workers leave at once: a worker may run a job whose
//! record is written but not yet synced, whose producer has no
//! acknowledgement yet (a power cut then loses a job that ran, never one
//! that was acknowledged). By default a per-shard sync thread ([`sync`])
//! syncs and releases while the shard serves the next batch;
//! `wal_sync_thread = false` syncs on the shard's thread (README
//! "Durability" has both measured). `"async"` releases at once and syncs
//! every `sync_interval`: a crash of the process loses nothing (records
//! are written before anything is released), a power cut or kernel crash
//! loses at most the last `sync_interval` of acknowledged jobs.
//! `"memory"` keeps no log (EventMQ's behaviour).
//!
//! # Recovery ([`open`])
//!
//! At start the router locks the data directory ([`dir`]), then replays
//! every shard's directory in parallel ([`recover`]). Each queue's live
//! jobs (accepted, not done) are put back in the order of their job ids,
//! which is the queue's order: a job only ever joins the back of a queue
//! with a fresh id (a `DCL` is logged as `Done` and a new `Accepted`), and
//! the jobs that went back to the front (requeued) are older than every job
//! that never left. Jobs in flight at the crash go back too, counted as one
//! setback (to the dead set when out of retries). A job in the dead set is
//! an `Accepted` record followed by a `Buried` one: recovery puts it back
//! in its shard's dead set. Each
//! shard's acceptance count restarts above the highest sequence seen. When
//! the shard count changed (or a queue now hashes elsewhere, or damage was
//! skipped), the recovered jobs are written into a new layout with fresh
//! ids, which then replaces the old one ([`dir`]).
//!
//! # Compaction
//!
//! A segment whose jobs are all done is deleted; a shard copies waiting
//! jobs forward out of old segments less than half live, so the log's disk
//! use stays within [`crate::limits::WAL_DISK_FACTOR`] × the bytes of its
//! live jobs' records plus one segment (jobs in flight or offered keep
//! their segment until they finish). Each step is bounded per batch.
//!
//! # Failures
//!
//! A shard that cannot write or sync its log stops the router ([`fail_stop`]):
//! acknowledging jobs it cannot store would break the promise, and what was
//! synced before is recovered at the next start.

pub mod dir;
pub mod log;
pub mod record;
pub mod recover;
pub mod segment;
pub mod sync;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

pub use dir::default_data_dir;
use dir::DataDir;
use log::{LogSettings, ShardLog};
use recover::{Replayed, ShardReplay};
use segment::{parse_shard_dir_name, shard_dir, SegmentInfo};

use crate::broker::job::Job;
use crate::broker::retry::{allowed_retries, DeadJob, Setback};
use crate::broker::types::shard_of;
use crate::config::WalConfig;
use crate::ids::{show, FastMap, FastSet, JobId, QueueName};

/// What an acknowledgement promises (setting `durability`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Acknowledged once synced to disk.
    Sync,
    /// Acknowledged once written; synced every `sync_interval`.
    Async,
    /// No log.
    Memory,
}

impl Durability {
    /// The setting's word.
    pub fn as_str(self) -> &'static str {
        match self {
            Durability::Sync => "sync",
            Durability::Async => "async",
            Durability::Memory => "memory",
        }
    }
}

/// Why the log cannot be opened.
#[derive(Debug, thiserror::Error)]
pub enum WalError {
    /// A file operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Another process holds the data directory.
    #[error("data directory {dir} is in use by another emq-router (its lock file {dir}/lock is held); give this router its own --data-dir")]
    Locked {
        /// The data directory.
        dir: PathBuf,
    },
    /// A record in the middle of the log is damaged.
    #[error("{file}: damaged log record at byte offset {offset} ({why}), with valid records after it; \
             start with --recover-skip-damaged to skip the damaged bytes (the segment is then moved to the data directory's damaged/ folder)")]
    Damaged {
        /// The segment file.
        file: PathBuf,
        /// Byte offset of the damaged record in it.
        offset: u64,
        /// What is wrong.
        why: String,
    },
}

impl WalError {
    /// A closure making an [`WalError::Io`] for `path`.
    pub fn io(path: &Path) -> impl Fn(std::io::Error) -> WalError + '_ {
        move |source| WalError::Io { path: path.to_path_buf(), source }
    }
}

/// Logs a failure to write or sync the log and stops the process (exit
/// status 70, `EX_SOFTWARE`): see the module docs, "Failures".
pub fn fail_stop(what: &str, path: &Path, e: &std::io::Error) -> ! {
    tracing::error!(file = %path.display(), error = %e, "write-ahead log: {what} failed; stopping the router \
        (jobs acknowledged so far are in the log and come back at the next start)");
    std::process::exit(70)
}

/// What one shard starts with.
#[derive(Debug)]
pub struct ShardStart {
    /// Its log, open for appending.
    pub log: ShardLog,
    /// Its recovered queues, each in order (front first).
    pub queues: Vec<(QueueName, Vec<Job>)>,
    /// Its recovered dead set, oldest burial first.
    pub dead: Vec<DeadJob>,
    /// The queue of each job this recovery moved to the dead set (in
    /// flight at the crash, out of retries), to be counted.
    pub buried_now: Vec<QueueName>,
    /// Its acceptance count so far (new ids continue above it).
    pub accepted: u64,
}

/// What recovery found, for the start-up log line and STATUS.
#[derive(Debug, Default, Clone)]
pub struct RecoveryReport {
    /// Jobs put back in queues.
    pub jobs: u64,
    /// Of those, jobs that were in flight (counted one delivery).
    pub in_flight: u64,
    /// Jobs moved to the dead set because of that delivery.
    pub dead_lettered: u64,
    /// Jobs in the dead sets, those included.
    pub dead: u64,
    /// Records replayed.
    pub records: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Torn tails truncated.
    pub torn: u64,
    /// Damaged stretches skipped, and their bytes.
    pub damaged: (u64, u64),
    /// Whether the jobs were written into a new layout.
    pub relayout: bool,
    /// Wall time of the whole recovery, in milliseconds.
    pub millis: u64,
}

/// The opened log: the locked data directory (keep it for the router's
/// life) and each shard's start.
#[derive(Debug)]
pub struct Opened {
    /// The locked data directory.
    pub dir: DataDir,
    /// Shard by shard.
    pub shards: Vec<ShardStart>,
    /// What recovery found.
    pub report: RecoveryReport,
}

/// Locks the data directory, recovers every shard's log (in parallel) and
/// opens `shards` logs for appending, with their recovered queues. Jobs
/// are stamped as accepted at `now` by a router started at `epoch`. A job
/// in flight at the crash counts a setback; out of `max_retries` (or its
/// `retry:N`) it goes to its shard's dead set.
///
/// # Errors
/// [`WalError`]: the directory is locked or unreadable, or damaged and
/// `skip_damaged` is false.
pub fn open(
    config: &WalConfig,
    shards: usize,
    skip_damaged: bool,
    max_retries: u32,
    epoch: Instant,
    now: Instant,
) -> Result<Opened, WalError> {
    let t0 = Instant::now();
    let dir = DataDir::lock(&config.data_dir())?;
    dir.settle()?;
    let root = dir.wal();
    std::fs::create_dir_all(&root).map_err(WalError::io(&root))?;
    let replays = replay_all(&root, skip_damaged, epoch, now)?;
    let mut report = RecoveryReport::default();
    for r in &replays {
        report.records += r.records;
        report.bytes += r.bytes;
        report.torn += r.torn.len() as u64;
        report.damaged.0 += r.damage.len() as u64;
        report.damaged.1 += r.damage.iter().map(|d| d.bytes).sum::<u64>();
    }
    let settings = LogSettings {
        durability: config.durability,
        sync_interval: config.sync_interval,
        segment_bytes: config.segment_bytes,
        sync_thread: config.sync_thread,
    };
    let same_layout = layout_kept(&replays, shards);
    let starts = if same_layout {
        reopen(&root, replays, shards, max_retries, &settings, &mut report)?
    } else {
        relayout(&dir, replays, shards, max_retries, &settings, &mut report)?
    };
    report.millis = t0.elapsed().as_millis() as u64;
    for s in &starts {
        let stats = &s.log.shared().stats;
        let jobs: usize = s.queues.iter().map(|(_, j)| j.len()).sum();
        stats.jobs_recovered.store(jobs as u64, std::sync::atomic::Ordering::Relaxed);
        stats.recovery_ms.store(report.millis, std::sync::atomic::Ordering::Relaxed);
    }
    tracing::info!(
        dir = %dir.path().display(),
        jobs = report.jobs,
        in_flight = report.in_flight,
        dead_lettered = report.dead_lettered,
        dead = report.dead,
        records = report.records,
        bytes = report.bytes,
        torn = report.torn,
        damaged = report.damaged.0,
        damaged_bytes = report.damaged.1,
        relayout = report.relayout,
        millis = report.millis,
        "write-ahead log recovered"
    );
    Ok(Opened { dir, shards: starts, report })
}

/// Replays every `shard-<n>` directory under `root`, each on a thread.
fn replay_all(root: &Path, skip: bool, epoch: Instant, now: Instant) -> Result<Vec<ShardReplay>, WalError> {
    let mut dirs = Vec::new();
    for entry in std::fs::read_dir(root).map_err(WalError::io(root))? {
        let entry = entry.map_err(WalError::io(root))?;
        if let Some(i) = entry.file_name().to_str().and_then(parse_shard_dir_name) {
            dirs.push((i, entry.path()));
        }
    }
    dirs.sort();
    let results: Vec<Result<ShardReplay, WalError>> = std::thread::scope(|s| {
        let handles: Vec<_> = dirs
            .iter()
            .map(|(i, path)| {
                std::thread::Builder::new()
                    .name(format!("emq-recover-{i}"))
                    .spawn_scoped(s, move || recover::replay_dir(path, *i, skip, epoch, now))
            })
            .collect();
        handles
            .into_iter()
            .zip(&dirs)
            .map(|(h, (_, path))| match h {
                Ok(h) => h.join().unwrap_or_else(|_| Err(io_other(path, "recovery thread panicked"))),
                Err(e) => Err(WalError::Io { path: path.clone(), source: e }),
            })
            .collect()
    });
    results.into_iter().collect()
}

fn io_other(path: &Path, what: &str) -> WalError {
    WalError::Io { path: path.to_path_buf(), source: std::io::Error::other(what.to_string()) }
}

/// Whether the logs can be kept as they are for `shards` shards: every
/// directory is one of those shards, every segment was written for that
/// many shards, every job's queue still hashes to its directory's shard,
/// and nothing damaged was skipped.
fn layout_kept(replays: &[ShardReplay], shards: usize) -> bool {
    replays.iter().all(|r| {
        r.index < shards
            && r.damage.is_empty()
            && r.segments.iter().all(|s| !s.damaged && s.header.is_some_and(|h| h.shards as usize == shards))
            && r.jobs.values().all(|j| shard_of(j.job.queue_bytes(), shards) == r.index)
    })
}

/// What [`queues_of`] makes of a shard's live jobs.
struct Queues {
    /// By queue, each in id order.
    queues: Vec<(QueueName, Vec<Job>)>,
    /// The dead set, oldest burial first.
    dead: Vec<DeadJob>,
    /// Of those, the jobs buried now: in flight at the crash, out of retries.
    buried_now: FastSet<JobId>,
    /// Jobs that were in flight (their delivery count is one up).
    in_flight: FastSet<JobId>,
}

/// Live jobs of one shard grouped by queue, each queue in id order, with
/// jobs that were in flight counted one setback (and buried when out of
/// retries with `max_retries`, counted in `report`), and the dead set.
fn queues_of(jobs: Vec<Replayed>, max_retries: u32, report: &mut RecoveryReport) -> Queues {
    let mut by_queue: FastMap<QueueName, Vec<Job>> = FastMap::default();
    let (mut dead, mut buried_now, mut in_flight) = (Vec::new(), FastSet::default(), FastSet::default());
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    for Replayed { mut job, in_flight: was_in_flight, dead: buried } in jobs {
        if let Some((why, at_unix_ms)) = buried {
            dead.push(DeadJob { job, why, at_unix_ms });
            continue;
        }
        if was_in_flight {
            report.in_flight += 1;
            job.set_redeliveries(job.redeliveries() + 1);
            if job.redeliveries() > allowed_retries(&job, max_retries) {
                report.dead_lettered += 1;
                let (msgid, bytes) = (show(job.frames.msgid()), job.frames.len());
                tracing::error!(job = %job.id, queue = %job.queue(), %msgid, bytes, "job moved to the dead set at recovery: in flight at its last allowed try");
                buried_now.insert(job.id);
                dead.push(DeadJob { job, why: Setback::Crash, at_unix_ms: now_ms });
                continue;
            }
            in_flight.insert(job.id);
        }
        by_queue.entry(job.queue()).or_default().push(job);
    }
    dead.sort_by_key(|d| (d.at_unix_ms, d.job.id.seq()));
    report.dead += dead.len() as u64;
    let mut queues: Vec<(QueueName, Vec<Job>)> = by_queue.into_iter().collect();
    queues.sort_by(|a, b| a.0.cmp(&b.0));
    for (_, jobs) in &mut queues {
        // Ids are unique: an unstable sort gives the same order, faster.
        jobs.sort_unstable_by_key(|j| (j.id.seq(), j.id.shard()));
        report.jobs += jobs.len() as u64;
    }
    Queues { queues, dead, buried_now, in_flight }
}

/// The same layout: every shard keeps its segments and ids, copies the
/// jobs that were in flight forward with their delivery counted and logs
/// `Done` for those dead-lettered, in a new segment, synced before serving.
fn reopen(
    root: &Path,
    mut replays: Vec<ShardReplay>,
    shards: usize,
    max_retries: u32,
    settings: &LogSettings,
    report: &mut RecoveryReport,
) -> Result<Vec<ShardStart>, WalError> {
    let mut starts = Vec::with_capacity(shards);
    for index in 0..shards {
        let at = replays.iter().position(|r| r.index == index);
        let replay = at.map(|i| replays.swap_remove(i)).unwrap_or_else(|| ShardReplay { index, ..Default::default() });
        let mut segments: BTreeMap<u32, SegmentInfo> = replay
            .segments
            .iter()
            .map(|s| (s.number, SegmentInfo { bytes: s.bytes, ..SegmentInfo::default() }))
            .collect();
        for &(newer, older) in &replay.refs {
            if segments.contains_key(&older) {
                if let Some(info) = segments.get_mut(&newer) {
                    info.older.insert(older);
                }
            }
        }
        let next = segments.keys().next_back().map_or(1, |n| n.saturating_add(1));
        for r in replay.jobs.values() {
            let info = segments.entry(r.job.wal_segment()).or_default();
            info.live += 1;
            info.live_bytes += record::accepted_len(&r.job) as u64;
        }
        let jobs: Vec<Replayed> = replay.jobs.into_values().collect();
        let Queues { mut queues, mut dead, buried_now, in_flight } = queues_of(jobs, max_retries, report);
        let dir = shard_dir(root, index);
        let mut log = ShardLog::create(index, shards, &dir, settings.clone(), segments, next, replay.max_seq)?;
        for job in queues.iter_mut().flat_map(|(_, jobs)| jobs.iter_mut()) {
            if in_flight.contains(&job.id) {
                log.requeued(job);
            }
        }
        let mut buried_queues = Vec::new();
        for d in dead.iter_mut().filter(|d| buried_now.contains(&d.job.id)) {
            log.buried(d);
            buried_queues.push(d.job.queue());
        }
        log.retire_dead_segments();
        log.sync_all();
        starts.push(ShardStart { log, queues, dead, buried_now: buried_queues, accepted: replay.max_seq });
    }
    Ok(starts)
}

/// A new layout for `shards` shards: every live job re-hashed to its
/// queue's shard, given a fresh id there in queue order, and written to
/// `wal.new`, which then replaces `wal`; damaged segments are moved to
/// `damaged/` on the way.
fn relayout(
    dir: &DataDir,
    replays: Vec<ShardReplay>,
    shards: usize,
    max_retries: u32,
    settings: &LogSettings,
    report: &mut RecoveryReport,
) -> Result<Vec<ShardStart>, WalError> {
    report.relayout = true;
    let old_shards: Vec<usize> = replays.iter().map(|r| r.index).collect();
    tracing::warn!(
        ?old_shards,
        shards,
        "the log's layout changes (shard count, hashing or damage skipped): rewriting it"
    );
    let new_root = dir.wal_new();
    if new_root.exists() {
        std::fs::remove_dir_all(&new_root).map_err(WalError::io(&new_root))?;
    }
    let damaged: Vec<PathBuf> =
        replays.iter().flat_map(|r| r.segments.iter().filter(|s| s.damaged).map(|s| s.path.clone())).collect();
    let mut per_shard: Vec<Vec<Replayed>> = (0..shards).map(|_| Vec::new()).collect();
    for r in replays {
        for (_, rep) in r.jobs {
            per_shard[shard_of(rep.job.queue_bytes(), shards)].push(rep);
        }
    }
    let mut starts = Vec::with_capacity(shards);
    for (index, jobs) in per_shard.into_iter().enumerate() {
        let Queues { mut queues, mut dead, buried_now, .. } = queues_of(jobs, max_retries, report);
        let buried_queues: Vec<QueueName> =
            dead.iter().filter(|d| buried_now.contains(&d.job.id)).map(|d| d.job.queue()).collect();
        let mut log =
            ShardLog::create(index, shards, &shard_dir(&new_root, index), settings.clone(), BTreeMap::new(), 1, 0)?;
        let mut seq = 0;
        for (_, jobs) in &mut queues {
            for job in jobs.iter_mut() {
                seq += 1;
                job.id = JobId::new(index, seq);
                log.accepted(job);
            }
        }
        for d in &mut dead {
            seq += 1;
            d.job.id = JobId::new(index, seq);
            log.accepted(&mut d.job);
            log.buried(d);
        }
        log.sync_all();
        starts.push(ShardStart { log, queues, dead, buried_now: buried_queues, accepted: seq });
    }
    let marker = new_root.join("complete");
    std::fs::File::create(&marker).and_then(|f| f.sync_all()).map_err(WalError::io(&marker))?;
    dir::sync_dir(&new_root)?;
    set_aside(dir, &damaged);
    dir.settle()?;
    let root = dir.wal();
    for (index, s) in starts.iter_mut().enumerate() {
        s.log.moved_to(&shard_dir(&root, index));
    }
    Ok(starts)
}

/// Moves damaged segments to `<data dir>/damaged/` (logged; a failure to
/// move is logged too: the old layout is removed anyway).
fn set_aside(dir: &DataDir, damaged: &[PathBuf]) {
    if damaged.is_empty() {
        return;
    }
    let to = dir.damaged();
    if let Err(e) = std::fs::create_dir_all(&to) {
        tracing::error!(dir = %to.display(), error = %e, "cannot create the folder for damaged segments");
        return;
    }
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs();
    for path in damaged {
        let shard =
            path.parent().and_then(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let target = to.join(format!("{stamp}-{shard}-{name}"));
        match std::fs::rename(path, &target) {
            Ok(()) => tracing::warn!(from = %path.display(), to = %target.display(), "damaged segment moved aside"),
            Err(e) => tracing::error!(file = %path.display(), error = %e, "cannot move a damaged segment aside"),
        }
    }
}
