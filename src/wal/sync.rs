//! The per-shard sync thread (`wal_sync_thread = true`, the default with
//! `durability = "sync"`): the shard writes a batch's records and goes on
//! with the next batch; this thread syncs the log and only then releases
//! what the batch promised (acceptance REPLYs and other frontend frames,
//! text answers to stored SCHEDs and what follows them on their
//! connections; frames for workers and other text answers leave at once, see
//! `router::outbox` and
//! [`crate::broker::msg::Outbox::flush_after_sync`]). Requests that pile
//! up while a sync runs share the next one (group commit across batches).
//! Releases keep the order of the batches.

use std::fs::File;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};

use super::log::SyncShared;
use crate::limits;

/// What must be durable before a release: the log up to `upto` (a position
/// counted in bytes written by this shard since start), in `file`.
#[derive(Debug, Clone)]
pub struct SyncWait {
    /// The segment file holding the last of those bytes (earlier segments
    /// are synced when they are closed).
    pub file: Arc<File>,
    /// The position to be durable.
    pub upto: u64,
}

/// A batch's output, handed over once its records are durable.
pub type Release = Box<dyn FnOnce() + Send>;

struct Job {
    wait: Option<SyncWait>,
    release: Release,
}

/// A shard's sync thread. Dropping it lets the thread finish what it was
/// given, then joins it.
pub struct SyncThread {
    tx: Option<Sender<Job>>,
    /// Releases handed over and not yet done (so the owner keeps order:
    /// while any is outstanding, everything goes through the thread).
    outstanding: Arc<AtomicUsize>,
    join: Option<JoinHandle<()>>,
}

impl SyncThread {
    /// Starts `emq-sync-<shard>`, recording into `shared`.
    ///
    /// # Errors
    /// The OS error when the thread cannot be spawned.
    pub fn start(shard: usize, shared: Arc<SyncShared>) -> std::io::Result<SyncThread> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let outstanding = Arc::new(AtomicUsize::new(0));
        let left = outstanding.clone();
        let join =
            std::thread::Builder::new().name(format!("emq-sync-{shard}")).spawn(move || run(rx, shared, left))?;
        Ok(SyncThread { tx: Some(tx), outstanding, join: Some(join) })
    }

    /// Runs `release` once the log is durable up to `wait` (at once, in
    /// order, when `wait` is `None`).
    pub fn release_after(&self, wait: Option<SyncWait>, release: Release) {
        self.outstanding.fetch_add(1, Ordering::AcqRel);
        if let Some(tx) = &self.tx {
            if let Err(e) = tx.send(Job { wait, release }) {
                // Only at teardown; run it here rather than lose it.
                self.outstanding.fetch_sub(1, Ordering::AcqRel);
                (e.0.release)();
            }
        }
    }

    /// Whether releases handed over are still waiting.
    pub fn busy(&self) -> bool {
        self.outstanding.load(Ordering::Acquire) > 0
    }
}

impl Drop for SyncThread {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(j) = self.join.take() {
            let _ = j.join();
        }
    }
}

fn run(rx: Receiver<Job>, shared: Arc<SyncShared>, outstanding: Arc<AtomicUsize>) {
    while let Ok(first) = rx.recv() {
        let mut jobs = vec![first];
        jobs.extend(rx.try_iter().take(limits::BATCH));
        let last = jobs.iter().rev().find_map(|j| j.wait.clone());
        if let Some(wait) = last {
            if wait.upto > shared.synced.load(Ordering::Acquire) {
                sync(&wait.file, wait.upto, &shared);
            }
        }
        let n = jobs.len();
        for job in jobs {
            (job.release)();
        }
        outstanding.fetch_sub(n, Ordering::AcqRel);
    }
}

/// Syncs `file`, records the time, and notes `upto` as durable; stops the
/// process when the sync fails (see [`super::fail_stop`]).
pub(super) fn sync(file: &File, upto: u64, shared: &SyncShared) {
    let t0 = Instant::now();
    if let Err(e) = file.sync_data() {
        super::fail_stop("syncing", &shared.dir, &e);
    }
    shared.record_sync(t0.elapsed());
    shared.synced.fetch_max(upto, Ordering::AcqRel);
}

/// A counter of positions, for tests.
#[doc(hidden)]
pub fn position(a: &AtomicU64) -> u64 {
    a.load(Ordering::Acquire)
}
