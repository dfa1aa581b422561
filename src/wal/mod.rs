//! The write-ahead log: an accepted job survives a crash of the router.
//! The local implementation of the job log contract ([`crate::joblog`]).
//!
//! "A shard owns its log": each shard appends the records of its queues'
//! jobs to its own log, `<data dir>/wal/shard-<n>/`, a series of segment
//! files ([`segment`]) of records ([`record`]): `Accepted` (the whole job),
//! `Dispatched`, `Requeued`, `Buried` and `Done`. No lock is shared between
//! shards. A job's records go to the log of the shard that accepted it (the
//! low 16 bits of its [`crate::ids::JobId`]), which owns its queue; a
//! worker's home shard that learns a job is done tells that shard.
//!
//! # Group commit
//!
//! A shard writes the records of one batch of messages with one `write`
//! and hands the batch's ticket to its outbox ([`log::ShardLog`] as
//! [`crate::joblog::JobLog`]). With `durability = "sync"` nothing the batch
//! promised leaves the router before the log is synced past that ticket:
//! not the acceptance REPLYs (eMQP), not the answers to stored SCHEDs
//! (text). Jobs for workers leave at once: a worker may run a job whose
//! record is written but not yet synced, whose producer has no
//! acknowledgement yet (a power cut then loses a job that ran, never one
//! that was acknowledged). By default a per-shard sync thread syncs and
//! releases while the shard serves the next batch (`router::release`);
//! `wal_sync_thread = false` syncs on the shard's thread (README
//! "Durability" has both measured). `"async"` releases once written and
//! syncs every `sync_interval`: a crash of the process loses nothing
//! (records are written before anything is released), a power cut or
//! kernel crash loses at most the last `sync_interval` of acknowledged
//! jobs. `"memory"` keeps no log (EventMQ's behaviour).
//!
//! # Recovery ([`open`])
//!
//! At start the router locks the data directory ([`dir`]), then replays
//! every shard's directory in parallel ([`recover`]). Each queue's live
//! jobs (accepted, not done) come back in the order of their job ids,
//! which is the queue's order: a job only ever joins the back of a queue
//! with a fresh id (a `DCL` is logged as `Done` and a new `Accepted`), and
//! the jobs that went back to the front (requeued) are older than every job
//! that never left. Recovery returns facts ([`crate::joblog::Recovered`]):
//! which jobs were waiting, in flight or dead. The shard applies its retry
//! rule to the ones in flight and logs what it decided. Each shard's
//! acceptance count restarts above the highest sequence seen. When the
//! shard count changed (or a queue now hashes elsewhere, or damage was
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
//! # Faults
//!
//! A log that cannot write, sync or find its files refuses new jobs and
//! repairs itself (`log.rs` "Faults", `repair.rs`); docs/durability.md says
//! what each disk fault does. Nothing here stops the process.

pub mod dir;
pub mod held;
pub mod log;
pub mod record;
pub mod recover;
mod repair;
pub mod segment;
pub mod shared;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use dir::DataDir;
use log::{LogSettings, ShardLog};
use recover::{Replayed, ShardReplay};
use segment::{parse_shard_dir_name, SegmentInfo};

use crate::config::WalConfig;
use crate::ids::shard_of;
use crate::joblog::{JobState, Recovered, RecoveredJob};

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
    #[error("data directory {dir} is in use by another emq-router (it holds {dir}/lock, or the directory's name if the directory was deleted under it); give this router its own --data-dir")]
    Locked {
        /// The data directory.
        dir: PathBuf,
    },
    /// A segment the log needs is missing (see [`held`]).
    #[error("{file}: a segment of the log is missing ({count} missing in all): {held} lists it as one the log needs, \
             and the log never deleted it (deleted by hand, or lost by the file system?); the acknowledged jobs it held \
             would be lost. Put it back, or start with --recover-skip-damaged to go on without it")]
    Missing {
        /// The first missing segment.
        file: PathBuf,
        /// How many are missing.
        count: u64,
        /// The `held` file that lists them.
        held: PathBuf,
    },
    /// A segment whose header names another shard or number than its
    /// directory and file name: a copied shard directory or segment
    /// (docs/durability.md "Messages worth knowing"). Refused even with
    /// `--recover-skip-damaged`: going on would replay the copy's jobs.
    #[error("{file}: this segment's header says it is segment {number} of shard {shard}, not segment {} of shard {}: \
             a copied or renamed shard directory or segment? Remove the copy (its jobs are in the directory it was copied \
             from) or put it back where it came from; --recover-skip-damaged does not skip it, its jobs would be delivered twice", expected.1, expected.0)]
    Foreign {
        /// The segment file.
        file: PathBuf,
        /// The shard its header names.
        shard: u32,
        /// The number its header names.
        number: u32,
        /// The shard directory's index and the number in the file's name.
        expected: (usize, u32),
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

/// What one shard starts with.
#[derive(Debug)]
pub struct ShardStart {
    /// Its log, open for appending.
    pub log: ShardLog,
    /// What its log holds: every live job with its state, in id order,
    /// and its acceptance count. The shard applies its policy to them.
    pub recovered: Recovered,
}

/// What recovery found, for the start-up log line.
#[derive(Debug, Default, Clone)]
pub struct RecoveryReport {
    /// Live jobs found (waiting, in flight and dead).
    pub jobs: u64,
    /// Of those, jobs that were in flight.
    pub in_flight: u64,
    /// Of those, jobs in the dead sets.
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

impl RecoveryReport {
    /// Counts a shard's recovered `jobs` into the report (all, in flight, dead).
    pub fn count(&mut self, jobs: &[RecoveredJob]) {
        for r in jobs {
            self.jobs += 1;
            match r.state {
                JobState::Waiting => {}
                JobState::InFlight => self.in_flight += 1,
                JobState::Dead { .. } => self.dead += 1,
            }
        }
    }
}

/// The opened log: the locked data directory (keep it for the router's
/// life; every shard's log holds it too) and each shard's start.
#[derive(Debug)]
pub struct Opened {
    /// The locked data directory.
    pub dir: Arc<DataDir>,
    /// Shard by shard.
    pub shards: Vec<ShardStart>,
    /// What recovery found.
    pub report: RecoveryReport,
}

/// Locks the data directory, recovers every shard's log (in parallel) and
/// opens `shards` logs for appending, each with what it recovered. Jobs
/// are stamped as accepted at `now` by a router started at `epoch`.
///
/// # Errors
/// [`WalError`]: the directory is locked or unreadable, or damaged and
/// `skip_damaged` is false.
pub fn open(
    config: &WalConfig,
    shards: usize,
    skip_damaged: bool,
    epoch: Instant,
    now: Instant,
) -> Result<Opened, WalError> {
    let t0 = Instant::now();
    let dir = Arc::new(DataDir::lock(&config.data_dir())?);
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
        disk_free_limit: config.disk_free_limit,
    };
    let same_layout = layout_kept(&replays, shards);
    let starts = if same_layout {
        reopen(&dir, replays, shards, &settings)?
    } else {
        relayout(&dir, replays, shards, &settings)?
    };
    report.relayout = !same_layout;
    report.millis = t0.elapsed().as_millis() as u64;
    warn_if_smaller_than_free_limit(&dir, config.disk_free_limit);
    for s in &starts {
        let stats = &s.log.shared().stats;
        stats.jobs_recovered.store(s.recovered.jobs.len() as u64, std::sync::atomic::Ordering::Relaxed);
        stats.recovery_ms.store(report.millis, std::sync::atomic::Ordering::Relaxed);
        report.count(&s.recovered.jobs);
    }
    tracing::info!(
        dir = %dir.path().display(),
        jobs = report.jobs,
        in_flight = report.in_flight,
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

/// One warning at start when the data directory's whole file system is
/// smaller than `disk_free_limit`: its free space can never reach the
/// limit, so every new job would be refused for as long as the router runs.
fn warn_if_smaller_than_free_limit(dir: &DataDir, limit: u64) {
    match dir.space() {
        Ok(space) if limit > 0 && space.total < limit => tracing::warn!(
            dir = %dir.path().display(),
            total = space.total,
            limit,
            refused = "STORE_FULL",
            "the data directory's file system holds {} bytes in all, less than disk_free_limit ({limit} bytes): \
             every new job will be refused (STORE_FULL) for as long as the router runs. Lower disk_free_limit \
             (--disk-free-limit, EMQ_DISK_FREE_LIMIT; 0 turns the alarm off) below the free space you can spare, \
             or give the data directory a larger file system",
            space.total
        ),
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(dir = %dir.path().display(), error = %e, "cannot read the data directory's file system size")
        }
    }
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

/// A shard's live jobs as facts, in id order (the order of each queue).
pub(crate) fn facts(jobs: impl IntoIterator<Item = Replayed>) -> Vec<RecoveredJob> {
    let mut out: Vec<RecoveredJob> = jobs
        .into_iter()
        .map(|Replayed { job, in_flight, dead }| {
            let state = match (dead, in_flight) {
                (Some((why, at_unix_ms)), _) => JobState::Dead { why, at_unix_ms },
                (None, true) => JobState::InFlight,
                (None, false) => JobState::Waiting,
            };
            RecoveredJob { job, state }
        })
        .collect();
    // Ids are unique: an unstable sort gives the same order, faster.
    out.sort_unstable_by_key(|r| (r.job.id.seq(), r.job.id.shard()));
    out
}

/// The same layout: every shard keeps its segments and ids and appends to
/// a new segment.
fn reopen(
    dir: &Arc<DataDir>,
    mut replays: Vec<ShardReplay>,
    shards: usize,
    settings: &LogSettings,
) -> Result<Vec<ShardStart>, WalError> {
    let root = dir.wal();
    let mut starts = Vec::with_capacity(shards);
    for index in 0..shards {
        let at = replays.iter().position(|r| r.index == index);
        let replay = at.map(|i| replays.swap_remove(i)).unwrap_or_else(|| ShardReplay { index, ..Default::default() });
        let mut segments: BTreeMap<u32, SegmentInfo> = replay
            .segments
            .iter()
            .map(|s| (s.number, SegmentInfo { bytes: s.bytes, file: s.id, ..SegmentInfo::default() }))
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
            let info = segments.entry(r.job.log_tag()).or_default();
            info.live += 1;
            info.live_bytes += record::accepted_len(&r.job) as u64;
        }
        let jobs = facts(replay.jobs.into_values());
        let keys = Vec::from(replay.keys);
        let mut log =
            ShardLog::create(index, shards, dir.clone(), &root, settings.clone(), segments, next, replay.max_seq)?;
        // The shard dispatched these before the crash: the log keeps them
        // as out until the shard's recovery decides (a requeue or a burial).
        for r in jobs.iter().filter(|r| matches!(r.state, JobState::InFlight)) {
            log.lend(&r.job);
        }
        log.retire_dead_segments();
        starts.push(ShardStart { log, recovered: Recovered { jobs, accepted: replay.max_seq, keys } });
    }
    Ok(starts)
}

/// A new layout for `shards` shards: every live job re-hashed to its
/// queue's shard, given a fresh id there in queue order, and written to
/// `wal.new` (with its state: `Dispatched` for a job in flight, `Buried`
/// for a dead one), which then replaces `wal`; damaged segments are moved
/// to `damaged/` on the way.
fn relayout(
    dir: &Arc<DataDir>,
    replays: Vec<ShardReplay>,
    shards: usize,
    settings: &LogSettings,
) -> Result<Vec<ShardStart>, WalError> {
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
        let mut jobs = facts(jobs);
        // Each queue in its order, the dead set after the queues.
        jobs.sort_by_key(|r| matches!(r.state, JobState::Dead { .. }));
        let mut log = ShardLog::create(index, shards, dir.clone(), &new_root, settings.clone(), BTreeMap::new(), 1, 0)?;
        if !crate::joblog::relog(&mut log, index, &mut jobs) {
            return Err(WalError::Io {
                path: new_root.clone(),
                source: std::io::Error::other("writing the new layout failed"),
            });
        }
        let accepted = jobs.len() as u64;
        starts.push(ShardStart { log, recovered: Recovered { jobs, accepted, keys: Vec::new() } });
    }
    let marker = new_root.join("complete");
    std::fs::File::create(&marker).and_then(|f| f.sync_all()).map_err(WalError::io(&marker))?;
    dir::sync_dir(&new_root)?;
    set_aside(dir, &damaged);
    dir.settle()?;
    let root = dir.wal();
    for s in starts.iter_mut() {
        s.log.moved_to(&root)?;
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
