//! [`WalShared`]: what a shard's write-ahead log shares with the threads
//! that wait on it: the durable point ([`Durable`], for the router's
//! release step), the file written now, and the log's figures
//! ([`LogStatus`], for STATUS and `/metrics`).
//!
//! Positions are the log's tickets ([`Ticket`]): bytes logged since the
//! log was opened, counted on across segments and repairs. With
//! `durability = "sync"` the durable point moves when a sync of the
//! current segment succeeds ([`Durable::make_durable`], on the shard's sync
//! thread or its own), with `"async"` when a batch is written (the promise
//! is that the OS holds it), and after a repair to everything logged (the
//! repair rewrote every live job). A sync that fails, or finds its segment
//! or directory gone, records a fault here; the shard picks it up at its
//! next batch ([`WalShared::take_fault`]) and repairs the log.

use std::fs::File;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use parking_lot::{Condvar, Mutex};
use serde_json::{json, Value};

use super::dir::{self, Identity};
use crate::config::Durability;
use crate::joblog::{Durable, FaultKind, LogFigures, LogState, LogStatus, Ticket};
use crate::limits;
use crate::metrics::latency::new_histogram;

/// A shard log's figures (relaxed atomics: written by the shard once per
/// batch, read by the admin side while it runs).
#[derive(Debug, Default)]
pub struct WalStats {
    /// Bytes of the shard's segment files.
    pub log_bytes: AtomicU64,
    /// Segment files.
    pub segments: AtomicU64,
    /// Jobs not done (waiting, offered, in flight, retrying, dead).
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
    /// The state ([`LogState`] as a code: see [`encode_state`]).
    state: AtomicU8,
    /// Faults so far by [`FaultKind::index`].
    pub errors: [AtomicU64; FaultKind::ALL.len()],
    /// Free bytes of the data directory's file system at the last check
    /// (`u64::MAX`: not checked yet).
    pub free_bytes: AtomicU64,
    /// Repairs that brought the log back.
    pub repairs: AtomicU64,
}

/// `LogState` as one byte: 0 ok, 1 disk alarm, 2 + kind index a fault.
fn encode_state(s: LogState) -> u8 {
    match s {
        LogState::Ok => 0,
        LogState::Alarm => 1,
        LogState::Faulty(kind) => 2 + kind.index() as u8,
    }
}

fn decode_state(b: u8) -> LogState {
    match b {
        0 => LogState::Ok,
        1 => LogState::Alarm,
        n => LogState::Faulty(FaultKind::ALL.get(usize::from(n - 2)).copied().unwrap_or(FaultKind::Other)),
    }
}

impl WalStats {
    /// Sets the state shown.
    pub fn set_state(&self, s: LogState) {
        self.state.store(encode_state(s), Ordering::Relaxed);
    }

    /// The state shown.
    pub fn state(&self) -> LogState {
        decode_state(self.state.load(Ordering::Relaxed))
    }

    /// Counts one fault of `kind`.
    pub fn count_fault(&self, kind: FaultKind) {
        self.errors[kind.index()].fetch_add(1, Ordering::Relaxed);
    }
}

/// The segment being written, as the sync side sees it.
#[derive(Debug)]
struct Head {
    /// Bumped at every repair: a fault found on an older generation's
    /// file is not this one's.
    generation: u64,
    /// The current segment (`None` while the log is faulty and has let
    /// go of its files).
    file: Option<Arc<File>>,
    /// The shard's directory as opened (checked after every sync).
    dir: Option<Arc<Identity>>,
    /// The position handed to the OS so far.
    written: u64,
}

/// What a shard's log shares (see the module docs).
#[derive(Debug)]
pub struct WalShared {
    mode: Durability,
    head: Mutex<Head>,
    /// The position whose promise holds (`sync`: synced; `async`: written).
    durable: AtomicU64,
    /// The position known synced (`async` deletes segments only behind it).
    synced: AtomicU64,
    /// 0, or 1 + the [`FaultKind::index`] of a fault found by a sync.
    fault: AtomicU8,
    /// Set while the log is faulty: nothing is made durable but by a repair.
    faulty: std::sync::atomic::AtomicBool,
    moved: Condvar,
    moved_lock: Mutex<()>,
    /// Figures for STATUS.
    pub stats: WalStats,
    hist: Mutex<Histogram<u64>>,
}

impl WalShared {
    /// A log of `mode` writing `file` (`None`: not made yet, a full disk)
    /// in `dir`, nothing logged yet.
    pub fn new(mode: Durability, file: Option<Arc<File>>, dir: Arc<Identity>) -> WalShared {
        let stats = WalStats { free_bytes: AtomicU64::new(u64::MAX), ..WalStats::default() };
        WalShared {
            mode,
            head: Mutex::new(Head { generation: 0, file, dir: Some(dir), written: 0 }),
            durable: AtomicU64::new(0),
            synced: AtomicU64::new(0),
            fault: AtomicU8::new(0),
            faulty: std::sync::atomic::AtomicBool::new(false),
            moved: Condvar::new(),
            moved_lock: Mutex::new(()),
            stats,
            hist: Mutex::new(new_histogram()),
        }
    }

    /// Everything up to `written` was handed to the OS. (With `async` that
    /// is the promise: the shard moves the durable point itself once it has
    /// checked its files, [`WalShared::advance`].)
    pub fn set_written(&self, written: u64) {
        self.head.lock().written = written;
    }

    /// The shard writes `file` in `dir` now (a new segment, or a repair:
    /// `repaired` starts a new generation). `None`: the log let go of its
    /// files after a fault.
    pub fn set_file(&self, file: Option<Arc<File>>, dir: Option<Arc<Identity>>, repaired: bool) {
        let mut head = self.head.lock();
        head.file = file;
        head.dir = dir;
        if repaired {
            // A fault a sync found in the files before is not the new ones'.
            head.generation += 1;
            self.fault.store(0, Ordering::Release);
        }
    }

    /// Marks everything up to `upto` durable and wakes the waiters.
    pub fn advance(&self, upto: u64) {
        let before = self.durable.fetch_max(upto, Ordering::AcqRel);
        if upto > before {
            let _guard = self.moved_lock.lock();
            self.moved.notify_all();
        }
    }

    /// Syncs the current segment on the calling thread and moves the
    /// durable point to what was written before the sync; a failure (or
    /// the segment or directory found gone) is recorded as a fault.
    /// Whether it succeeded. Never syncs a log with a fault reported or
    /// being repaired: after a failed sync Linux reports the lost writeback
    /// once, so a second sync of the same file may succeed over lost data.
    pub fn sync(&self) -> bool {
        let (generation, file, dir, written) = {
            let head = self.head.lock();
            let Some(file) = head.file.clone() else { return false };
            (head.generation, file, head.dir.clone(), head.written)
        };
        if self.in_fault() {
            return false;
        }
        if written <= self.synced.load(Ordering::Acquire) {
            return true;
        }
        let t0 = Instant::now();
        let path = || dir.as_ref().map_or_else(|| std::path::PathBuf::from("?"), |d| d.path.clone());
        let checked = file
            .sync_data()
            .map_err(|e| {
                tracing::error!(dir = %path().display(), error = %e, "syncing the write-ahead log failed");
                FaultKind::of(&e).max_io()
            })
            .and_then(|()| dir::linked(&file).map(drop))
            .and_then(|()| dir.as_ref().map_or(Ok(()), |d| d.check()));
        self.record_sync(t0.elapsed());
        let head = self.head.lock();
        if head.generation != generation {
            // A repair replaced the files meanwhile: this sync is moot.
            return false;
        }
        match checked {
            Ok(()) if !self.in_fault() => {
                self.synced.fetch_max(written, Ordering::AcqRel);
                drop(head);
                self.advance(written);
                true
            }
            Ok(()) => false,
            Err(kind) => {
                self.report_fault(kind);
                false
            }
        }
    }

    /// Whether a fault was reported and not yet repaired.
    fn in_fault(&self) -> bool {
        self.fault.load(Ordering::Acquire) != 0 || self.faulty.load(Ordering::Acquire)
    }

    /// The log is faulty (`true`) or repaired (`false`: waiters look
    /// again).
    pub fn set_faulty(&self, faulty: bool) {
        self.faulty.store(faulty, Ordering::Release);
        if !faulty {
            let _guard = self.moved_lock.lock();
            self.moved.notify_all();
        }
    }

    /// Records a fault for the shard to pick up; the log is faulty from
    /// now on (no more syncs) until the shard repairs it.
    pub fn report_fault(&self, kind: FaultKind) {
        self.faulty.store(true, Ordering::Release);
        self.fault.store(1 + kind.index() as u8, Ordering::Release);
    }

    /// Takes the fault a sync recorded, if any (the log stays faulty).
    pub fn take_fault(&self) -> Option<FaultKind> {
        match self.fault.swap(0, Ordering::AcqRel) {
            0 => None,
            n => FaultKind::ALL.get(usize::from(n - 1)).copied(),
        }
    }

    /// Whether the log is faulty now.
    pub fn faulty(&self) -> bool {
        self.in_fault()
    }

    /// Records one sync that took `took`.
    fn record_sync(&self, took: Duration) {
        let us = (took.as_micros() as u64).clamp(1, limits::LATENCY_MAX_US);
        let _ = self.hist.lock().record(us);
        self.stats.last_sync_us.store(us, Ordering::Relaxed);
        self.stats.syncs.fetch_add(1, Ordering::Relaxed);
    }

    /// Everything up to `upto` was rewritten and synced by a repair.
    pub fn repaired(&self, upto: u64) {
        self.synced.fetch_max(upto, Ordering::AcqRel);
        self.advance(upto);
    }

    /// The position known synced.
    pub fn synced(&self) -> u64 {
        self.synced.load(Ordering::Acquire)
    }

    fn durable_point(&self) -> u64 {
        self.durable.load(Ordering::Acquire)
    }
}

impl FaultKind {
    /// A failed sync: whatever its error says, the written data is in doubt.
    fn max_io(self) -> FaultKind {
        match self {
            FaultKind::Full | FaultKind::Other => FaultKind::Io,
            other => other,
        }
    }
}

impl Durable for WalShared {
    fn make_durable(&self, upto: Ticket) -> bool {
        if self.durable_point() >= upto.0 {
            return true;
        }
        if self.in_fault() || self.mode != Durability::Sync {
            return false;
        }
        self.sync() && self.durable_point() >= upto.0
    }

    /// Returns early, `false`, when the log is repaired without a rebuild
    /// (the caller then asks [`Durable::make_durable`] again).
    fn wait(&self, upto: Ticket, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut guard = self.moved_lock.lock();
        while self.durable_point() < upto.0 {
            if !self.faulty.load(Ordering::Acquire) && self.fault.load(Ordering::Acquire) == 0 {
                return false;
            }
            if self.moved.wait_until(&mut guard, deadline).timed_out() {
                break;
            }
        }
        self.durable_point() >= upto.0
    }

    fn durable_upto(&self) -> Ticket {
        Ticket(self.durable_point())
    }

    fn faulty(&self) -> bool {
        self.in_fault()
    }
}

impl LogStatus for WalShared {
    fn figures(&self) -> LogFigures {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let s = &self.stats;
        let free = get(&s.free_bytes);
        LogFigures {
            bytes: get(&s.log_bytes),
            live_jobs: get(&s.live_jobs),
            state: s.state(),
            errors: std::array::from_fn(|i| get(&s.errors[i])),
            free_bytes: (free != u64::MAX).then_some(free),
            repairs: get(&s.repairs),
            store: None,
        }
    }

    fn to_json(&self, shard: usize) -> Value {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let s = &self.stats;
        let f = self.figures();
        let errors: serde_json::Map<String, Value> =
            FaultKind::ALL.iter().map(|k| (k.as_str().to_string(), json!(f.errors[k.index()]))).collect();
        json!({
            "shard": shard,
            "state": f.state.as_str(),
            "log_bytes": get(&s.log_bytes),
            "segments": get(&s.segments),
            "live_jobs": get(&s.live_jobs),
            "live_bytes": get(&s.live_bytes),
            "last_sync_us": get(&s.last_sync_us),
            "syncs": get(&s.syncs),
            "jobs_recovered": get(&s.jobs_recovered),
            "recovery_ms": get(&s.recovery_ms),
            "relocated_jobs": get(&s.relocated_jobs),
            "deleted_segments": get(&s.deleted_segments),
            "free_bytes": f.free_bytes,
            "errors": errors,
            "repairs": f.repairs,
        })
    }

    fn take_sync_histogram(&self) -> Option<Histogram<u64>> {
        let h = std::mem::replace(&mut *self.hist.lock(), new_histogram());
        (!h.is_empty()).then_some(h)
    }
}
