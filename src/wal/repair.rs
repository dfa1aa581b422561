//! Rebuilding a shard's log from memory after a fault that left what it
//! wrote in doubt (see `log.rs`, "Faults"): a failed sync, the data
//! directory or a segment deleted or replaced, a read-only or failing file
//! system, or more buffered records than a full disk may hold.
//!
//! Every live job is in the shard's memory: waiting, waiting for a retry
//! or dead ([`Holdings`]), or dispatched (the log's own copies). The
//! rebuild re-creates the data directory and takes its lock again if need
//! be ([`super::dir::DataDir::ensure`]), writes each job's `Accepted`
//! record (with `Buried` for a dead job, `Dispatched` for one out) into new
//! segments numbered above every segment the directory holds, syncs them
//! and the directory, writes the directory's `held` file naming only them
//! (`held.rs`), and only then deletes the older segments. A crash
//! part-way leaves the old segments with the new ones, whose copies
//! replace theirs at recovery (at worst a job finished while the log was
//! faulty comes back: at least once, never lost). The rebuild runs on the
//! shard's thread and takes time linear in the live jobs' bytes; the
//! router's log says how long.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use super::dir::{self, Identity};
use super::log::ShardLog;
use super::record;
use super::recover::list_segments;
use super::segment::{file_id, new_segment, SegmentInfo, SEGMENT_HEADER_BYTES};
use crate::ids::JobId;
use crate::job::{DeadJob, Job};
use crate::joblog::{FaultKind, Holdings};

/// A fault's kind and its OS error.
type Failure = (FaultKind, std::io::Error);

/// What a rebuild leaves for the log to take over.
#[derive(Debug)]
pub(super) struct Rebuilt {
    /// The new segments' figures.
    pub segments: BTreeMap<u32, SegmentInfo>,
    /// The last of them, written next.
    pub current: u32,
    /// Its file.
    pub file: Arc<File>,
    /// The shard's directory, as opened now.
    pub dir: Arc<Identity>,
}

/// Bytes gathered before each write.
const CHUNK_BYTES: usize = 1 << 20;

impl ShardLog {
    /// Rebuilds the log from `holdings` and its copies of dispatched jobs
    /// (see the module docs).
    ///
    /// # Errors
    /// The fault that stopped it; the new segments written so far are deleted.
    pub(super) fn rebuild(&mut self, holdings: &mut dyn Holdings) -> Result<(), Failure> {
        rebuild(self, holdings)
    }
}

/// [`ShardLog::rebuild`].
fn rebuild(log: &mut ShardLog, holdings: &mut dyn Holdings) -> Result<(), Failure> {
    let t0 = Instant::now();
    log.data_dir.ensure()?;
    let dir_path = log.dir_path.clone();
    let io = |e: std::io::Error| (FaultKind::of(&e), e);
    std::fs::create_dir_all(&dir_path).map_err(io)?;
    let identity = Arc::new(Identity::open(&dir_path).map_err(io)?);
    let existing = list_segments(&dir_path).map_err(wal_error)?;
    let above = existing.iter().map(|(n, _)| *n).max().unwrap_or(0).max(log.current);
    let first =
        above.checked_add(1).ok_or_else(|| (FaultKind::Other, std::io::Error::other("segment numbers exhausted")))?;
    let mut w = Writer::new(log, dir_path.clone(), first);
    for queue in holdings.queues() {
        holdings.visit_waiting(&queue, 0, usize::MAX, &mut |job| w.accepted(job));
    }
    holdings.visit_retrying(&mut |job| w.accepted(job));
    holdings.visit_dead(0, usize::MAX, &mut |dead| w.buried(dead));
    let mut lent = std::mem::take(&mut log.lent);
    for job in lent.values_mut() {
        w.accepted(job);
        w.dispatched(job.id);
    }
    log.lent = lent;
    let (jobs, bytes) = (w.jobs, w.bytes);
    let rebuilt = match w.finish(identity) {
        // `held` names only the new segments before the old ones go.
        Ok((r, made)) => match super::held::write(&dir_path, r.segments.keys().copied()) {
            Ok(()) => r,
            Err(e) => {
                remove_all(made);
                return Err((FaultKind::of(&e), e));
            }
        },
        Err((made, failure)) => {
            remove_all(made);
            return Err(failure);
        }
    };
    // Only now may the old segments go.
    for (n, path) in list_segments(&dir_path).map_err(wal_error)? {
        if n < first {
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!(file = %path.display(), error = %e, "cannot delete a segment the rebuild replaced");
            }
        }
    }
    dir::sync_dir(&dir_path).map_err(wal_error)?;
    log.clean_superseded(&rebuilt.dir);
    log.count_rewritten(bytes);
    log.start_over(rebuilt.segments, rebuilt.current, rebuilt.file, rebuilt.dir);
    tracing::warn!(shard = log.shard, dir = %dir_path.display(), jobs, bytes, millis = t0.elapsed().as_millis() as u64,
        "write-ahead log rebuilt from memory");
    Ok(())
}

/// Removes the segments a failed rebuild made.
fn remove_all(made: Vec<PathBuf>) {
    for path in made {
        let _ = std::fs::remove_file(path);
    }
}

fn wal_error(e: super::WalError) -> Failure {
    match e {
        super::WalError::Io { source, .. } => (FaultKind::of(&source), source),
        other => (FaultKind::Other, std::io::Error::other(other.to_string())),
    }
}

/// Writes records into new segments of one shard's directory, keeping
/// the first error (the visitors that feed it cannot return one).
struct Writer {
    dir: PathBuf,
    shard: usize,
    shards: usize,
    seq_floor: u64,
    segment_bytes: u64,
    segments: BTreeMap<u32, SegmentInfo>,
    current: u32,
    file: Option<File>,
    /// Bytes in the current file (header included).
    at: u64,
    buf: Vec<u8>,
    made: Vec<PathBuf>,
    failed: Option<Failure>,
    jobs: u64,
    /// Record bytes written (headers not counted: they are no position).
    bytes: u64,
}

impl Writer {
    fn new(log: &ShardLog, dir: PathBuf, first: u32) -> Writer {
        let mut w = Writer {
            dir,
            shard: log.shard,
            shards: log.shards,
            seq_floor: log.seq_floor,
            segment_bytes: log.settings.segment_bytes,
            segments: BTreeMap::new(),
            current: first,
            file: None,
            at: 0,
            buf: Vec::with_capacity(CHUNK_BYTES),
            made: Vec::new(),
            failed: None,
            jobs: 0,
            bytes: 0,
        };
        w.open(first);
        w
    }

    fn open(&mut self, number: u32) {
        if self.failed.is_some() {
            return;
        }
        self.made.push(super::segment::segment_path(&self.dir, number));
        match new_segment(&self.dir, self.shard, self.shards, number, self.seq_floor) {
            Ok(f) => {
                let info =
                    SegmentInfo { bytes: SEGMENT_HEADER_BYTES as u64, file: file_id(&f), ..SegmentInfo::default() };
                self.file = Some(f);
                self.current = number;
                self.at = SEGMENT_HEADER_BYTES as u64;
                self.segments.insert(number, info);
            }
            Err(e) => self.failed = Some(wal_error(e)),
        }
    }

    /// Room for `len` more bytes in the current segment (a record never
    /// spans two).
    fn room(&mut self, len: usize) {
        let bytes = self.segments.get(&self.current).map_or(0, |s| s.bytes);
        if bytes + len as u64 > self.segment_bytes && bytes > SEGMENT_HEADER_BYTES as u64 {
            self.flush();
            if let Some(f) = &self.file {
                if let Err(e) = f.sync_data() {
                    self.failed.get_or_insert((FaultKind::Io, e));
                }
            }
            match self.current.checked_add(1) {
                Some(next) => self.open(next),
                None => {
                    self.failed.get_or_insert((FaultKind::Other, std::io::Error::other("segment numbers exhausted")));
                }
            }
        }
    }

    fn flush(&mut self) {
        if self.buf.is_empty() || self.failed.is_some() {
            self.buf.clear();
            return;
        }
        if let Some(f) = &self.file {
            if let Err(e) = f.write_all_at(&self.buf, self.at) {
                self.failed = Some((FaultKind::of(&e), e));
            }
        }
        self.at += self.buf.len() as u64;
        self.buf.clear();
    }

    fn put(&mut self, len: usize, encode: impl FnOnce(&mut Vec<u8>)) {
        encode(&mut self.buf);
        let info = self.segments.entry(self.current).or_default();
        info.bytes += len as u64;
        self.bytes += len as u64;
        if self.buf.len() >= CHUNK_BYTES {
            self.flush();
        }
    }

    fn accepted(&mut self, job: &mut Job) {
        if self.failed.is_some() {
            return;
        }
        let len = record::accepted_len(job);
        self.room(len);
        self.put(len, |buf| record::encode_accepted(job, buf));
        job.set_log_tag(self.current);
        let info = self.segments.entry(self.current).or_default();
        info.live += 1;
        info.live_bytes += len as u64;
        self.jobs += 1;
    }

    fn dispatched(&mut self, id: JobId) {
        if self.failed.is_none() {
            self.put(record::ID_RECORD_BYTES, |buf| record::encode_dispatched(id, buf));
        }
    }

    /// A dead job: its `Accepted` and `Buried` records, in one segment.
    fn buried(&mut self, dead: &mut DeadJob) {
        if self.failed.is_some() {
            return;
        }
        self.room(record::accepted_len(&dead.job) + record::BURIED_RECORD_BYTES);
        self.accepted(&mut dead.job);
        let job = &dead.job;
        let (id, setbacks, why, at) = (job.id, job.redeliveries(), dead.why, dead.at_unix_ms);
        self.put(record::BURIED_RECORD_BYTES, |buf| record::encode_buried(id, setbacks, why, at, buf));
    }

    /// Writes what is left and syncs the last segment and the directory;
    /// what was rebuilt and the files made.
    ///
    /// # Errors
    /// The files made (to delete) and the first failure.
    fn finish(mut self, dir: Arc<Identity>) -> Result<(Rebuilt, Vec<PathBuf>), (Vec<PathBuf>, Failure)> {
        self.flush();
        if self.failed.is_none() {
            if let Some(f) = &self.file {
                if let Err(e) = f.sync_data() {
                    self.failed = Some((FaultKind::Io, e));
                }
            }
        }
        if self.failed.is_none() {
            if let Err(e) = dir::sync_dir(&self.dir) {
                self.failed = Some(wal_error(e));
            }
        }
        match (self.failed.take(), self.file.take()) {
            (None, Some(file)) => {
                Ok((Rebuilt { segments: self.segments, current: self.current, file: Arc::new(file), dir }, self.made))
            }
            (failed, _) => {
                let failure = failed.unwrap_or_else(|| (FaultKind::Other, std::io::Error::other("no segment")));
                Err((self.made, failure))
            }
        }
    }
}
