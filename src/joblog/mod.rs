//! The job log contract: what a dispatcher shard tells the log that keeps
//! its jobs across a restart, and what it gets back. The shard owns queue
//! semantics (order, selection, retries, the dead set); a log only records
//! what happened to each job and says when a record is durable. Every
//! durability class is one implementation of [`JobLog`]: the local
//! write-ahead log (`crate::wal`), no log at all ([`NoLog`], `durability =
//! "memory"`) and, in the shard tests, a fake that can be told to fail,
//! fill up or stall (`fake`).
//!
//! ```text
//!  shard ──accepted / dispatched / requeued / buried / unburied / done──► JobLog
//!        ◄── commit(now): Release, or After(ticket) ──────────────────────┘
//!  outbox: acceptances wait until Durable::make_durable(ticket) holds
//!  shard ──maintain(now, holdings)──► compaction; repair after a fault
//! ```
//!
//! # Tickets
//!
//! A [`Ticket`] is a position in one shard's log: everything the shard
//! logged before the [`JobLog::commit`] that returned it. The shard hands
//! it to its outbox with the batch's output; what the batch promised
//! (acceptance REPLYs, answers to stored SCHEDs) leaves once
//! [`Durable::make_durable`] says the log holds it. The log never hands
//! out a file or a thread: where the waiting happens is the router's
//! choice (`router::release`).
//!
//! # Faults
//!
//! A log that cannot keep new records does not stop the process. It says
//! so ([`JobLog::refusal`]); the shard then refuses new jobs with that
//! [`StoreFault`]'s code, serves its consumers from memory and keeps
//! calling [`JobLog::maintain`], which repairs the log when the cause goes
//! away (docs/durability.md). Nothing is acknowledged that the log does
//! not hold: tickets handed out before the fault wait for the repair.
//!
//! # Recovery
//!
//! A log recovers *facts* ([`Recovered`]): every live job with the state
//! its records left it in. The shard applies its policy to them (a job in
//! flight at the crash counts a setback, and past its retries goes to the
//! dead set: the same rule as at run time, in one place).

pub mod nolog;

#[cfg(test)]
pub mod fake;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::ids::{JobId, QueueName};
use crate::job::{DeadJob, Job, Setback};

pub use nolog::NoLog;

/// The explanation of a refusal that comes after the job was taken: its
/// batch was given up (a replicated log's `nats_give_up`), so the job is
/// not acknowledged, yet it was in the router's memory and may run. The
/// eMQP `ERROR`'s text, and the text after a text `ERR STORE_FAILED` (or
/// `STORE_FULL`) to a SCHED; its first words, `not confirmed:`, are
/// stable (docs/text-protocol.md): any other refusal means nothing
/// changed.
pub const NOT_CONFIRMED: &str =
    "not confirmed: the job log did not confirm this job in time; it is not acknowledged and may or may not run";

/// A position in a shard's log (see the module docs, "Tickets"): counted
/// by the log, only ever growing while the router runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Ticket(pub u64);

/// What the output of a committed batch may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commit {
    /// Leave now: nothing it promises waits for the log.
    Release,
    /// What it promises leaves once the log holds everything before this
    /// ticket ([`Durable::make_durable`]); frames for workers and answers
    /// that promise nothing leave now.
    After(Ticket),
}

/// Why a log cannot keep new jobs now: the refusal code producers get
/// (eMQP `ERROR <code>`, text `ERR <code>`; docs/durability.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoreFault {
    /// The store is out of space, or its free space is below
    /// `disk_free_limit`: `STORE_FULL`.
    Full,
    /// The store cannot be written (read-only, I/O errors, its directory
    /// gone or taken): `STORE_FAILED`.
    Failed,
}

impl StoreFault {
    /// The refusal code on the wire.
    pub fn code(self) -> &'static str {
        match self {
            StoreFault::Full => "STORE_FULL",
            StoreFault::Failed => "STORE_FAILED",
        }
    }
}

/// Makes a shard's log durable up to a [`Ticket`]: what the router's
/// release step calls, on the shard's thread or on one of its own
/// (`wal_sync_thread`). Shared between them, so `Send + Sync`.
pub trait Durable: Send + Sync {
    /// Blocks until the log holds everything before `upto` (syncing it
    /// when that is this log's way), and says whether it does. `false`
    /// when the log is faulty: the caller keeps what waits for `upto` and
    /// asks again later ([`Durable::wait`]); a repair makes it durable.
    fn make_durable(&self, upto: Ticket) -> bool;

    /// Blocks until `upto` is durable, made so by someone else (a repair
    /// on the shard's thread), or until `timeout`; whether it is.
    fn wait(&self, upto: Ticket, timeout: Duration) -> bool;

    /// The highest ticket known durable now (does not block). The shard
    /// reads it at every commit: a log whose durable point stays behind
    /// for [`Durable::stall_timeout`] is stalled, and new jobs
    /// are refused until it moves again.
    fn durable_upto(&self) -> Ticket;

    /// How long acknowledgements may wait without the durable point
    /// moving before the shard calls the log stalled and refuses new jobs
    /// ([`crate::limits::LOG_STALL_TIMEOUT`], a disk's bound, unless the
    /// log says otherwise: a replicated one rides out a leader election).
    fn stall_timeout(&self) -> Duration {
        crate::limits::LOG_STALL_TIMEOUT
    }

    /// Whether the log is faulty now: nothing becomes durable until it is
    /// repaired (the outbox then lets refusals leave at once rather than
    /// behind acknowledgements that wait for the repair).
    fn faulty(&self) -> bool {
        false
    }

    /// Whether the log gave up on `upto` for good (the replicated log: a
    /// batch the store did not confirm within `nats_give_up`), and with
    /// which refusal: what waits for it is then refused to its producers
    /// (eMQP `ERROR <code>`, text `ERR <code>`), never acknowledged. `None`
    /// (every local log): it may still become durable.
    fn gave_up(&self, upto: Ticket) -> Option<StoreFault> {
        let _ = upto;
        None
    }

    /// `jobs` acceptances were refused because the log gave up on them
    /// (counted for STATUS and `/metrics`).
    fn note_refused(&self, jobs: u64) {
        let _ = jobs;
    }
}

/// The live jobs a shard holds itself, as its log may need to rewrite them
/// (compaction copies waiting and dead jobs forward; a repair rewrites
/// every live job). Jobs in flight or offered are the log's own to know:
/// it saw them go out ([`JobLog::dispatched`]).
///
/// Positions are the tables' own: they shift as queues move, so a caller
/// going on later may see a job twice or miss one (compaction tolerates
/// both; a repair visits everything in one call).
pub trait Holdings {
    /// The names of the queues that may hold waiting jobs.
    fn queues(&self) -> Vec<QueueName>;

    /// Calls `f` on up to `max` waiting jobs of `queue` from position
    /// `from`; returns how many it saw and the position to go on from
    /// (`None` at the end of the queue).
    fn visit_waiting(
        &mut self,
        queue: &QueueName,
        from: usize,
        max: usize,
        f: &mut dyn FnMut(&mut Job),
    ) -> (usize, Option<usize>);

    /// Calls `f` on up to `max` dead jobs from burial number `from`,
    /// oldest first; returns how many it saw and the number to go on from.
    fn visit_dead(&mut self, from: u64, max: usize, f: &mut dyn FnMut(&mut DeadJob)) -> (usize, Option<u64>);

    /// Calls `f` on every job waiting out a retry back-off.
    fn visit_retrying(&mut self, f: &mut dyn FnMut(&mut Job));
}

/// What a log's records say of one live job at recovery.
#[derive(Debug, Clone)]
pub enum JobState {
    /// Waiting in its queue.
    Waiting,
    /// Dispatched to a worker or offered to a text connection when the
    /// log ended: the shard counts it one setback ([`Setback::Crash`]).
    InFlight,
    /// In the dead set: its last setback and burial time (ms since the
    /// Unix epoch).
    Dead {
        /// Why its last try came to nothing.
        why: Setback,
        /// When it was buried.
        at_unix_ms: u64,
    },
}

/// One live job found at recovery.
#[derive(Debug, Clone)]
pub struct RecoveredJob {
    /// The job: content, id, setbacks so far, and the log's tag.
    pub job: Job,
    /// What its records say.
    pub state: JobState,
}

/// What a log found at start, for its shard: facts, no policy applied.
#[derive(Debug, Default)]
pub struct Recovered {
    /// Every live job, in id order (the order of each queue).
    pub jobs: Vec<RecoveredJob>,
    /// The shard's acceptance count so far: new job ids continue above it.
    pub accepted: u64,
    /// The duplicate-window keys found in the log's
    /// [`crate::wal::record::Record::ClientKey`] records, in log order (the
    /// records of finished jobs too, while the log still holds them);
    /// the shard keeps those still inside its window.
    pub keys: Vec<RecoveredKey>,
}

/// One duplicate-window key found at recovery (see [`Recovered::keys`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveredKey {
    /// The job it made.
    pub id: JobId,
    /// When that job was accepted, in ms since the Unix epoch.
    pub at_unix_ms: u64,
    /// The client's routing identity.
    pub client: crate::ids::PeerId,
    /// The REQUEST's msgid.
    pub msgid: crate::ids::MsgId,
}

/// Writes recovered `jobs` into `log`, a new layout's log of shard
/// `index`: each job gets a fresh id there (its position in `jobs`, from 1,
/// so order them as their queues and dead set go) and the records of its
/// state (`Dispatched` for a job in flight, `Buried` for a dead one). Then
/// syncs the log; whether it holds them.
pub fn relog(log: &mut dyn JobLog, index: usize, jobs: &mut [RecoveredJob]) -> bool {
    for (seq, r) in jobs.iter_mut().enumerate() {
        r.job.id = JobId::new(index, seq as u64 + 1);
        log.accepted(&mut r.job);
        match r.state {
            JobState::Waiting => {}
            JobState::InFlight => log.dispatched(&r.job),
            JobState::Dead { why, at_unix_ms } => {
                let mut dead = DeadJob { job: r.job.clone(), why, at_unix_ms };
                log.buried(&mut dead);
                r.job = dead.job;
            }
        }
    }
    log.sync_all()
}

/// One shard's job log (see the module docs). Every hook is called on the
/// shard's thread, in the order things happen; each only appends to an
/// in-memory batch, which [`JobLog::commit`] writes at the batch's end.
pub trait JobLog: Send {
    /// Whether another router took this log's store (the replicated log's
    /// fence, docs/replicated.md "Failover"): the jobs this shard holds are
    /// the new owner's, read from the same log, so the shard hands none out
    /// any more (no eMQP dispatch, no text offer). Never for a local log.
    fn fenced(&self) -> bool {
        false
    }

    /// A new job (or a declined one, under a fresh id): its whole content
    /// is logged; the log may set [`Job::log_tag`].
    fn accepted(&mut self, job: &mut Job);

    /// Who sent job `id` (just logged by [`JobLog::accepted`]): the key of
    /// the router's duplicate window, its client's routing identity and its
    /// msgid, accepted at `at_unix_ms` (ms since the Unix epoch). A log
    /// that keeps jobs writes it as a [`crate::wal::record::Record::ClientKey`]
    /// record, and gives it back at recovery ([`Recovered::keys`]) while it
    /// holds that record. Nothing by default ([`NoLog`]).
    fn client_key(&mut self, id: JobId, at_unix_ms: u64, client: &[u8], msgid: &[u8]) {
        let _ = (id, at_unix_ms, client, msgid);
    }

    /// The job went to a worker or was offered to a text connection. Until
    /// it is done, requeued or buried, the log knows it as dispatched (and
    /// may keep a copy: the job may finish on another shard).
    fn dispatched(&mut self, job: &Job);

    /// The job waits at the front of its queue again, or for a retry (its
    /// setbacks as [`Job::redeliveries`] counts them).
    fn requeued(&mut self, job: &mut Job);

    /// The job went to the dead set.
    fn buried(&mut self, dead: &mut DeadJob);

    /// A dead job goes back to its queue (its setbacks reset).
    fn unburied(&mut self, job: &mut Job);

    /// A job this shard holds is finished: completed, acknowledged,
    /// deleted, declined (before its fresh acceptance) or dropped from the
    /// dead set.
    fn done(&mut self, job: &Job);

    /// Job `id`, which this log saw dispatched, finished on another shard
    /// (a worker's home).
    fn done_elsewhere(&mut self, id: JobId);

    /// The end of a batch: writes what the batch logged and says what its
    /// output may do.
    fn commit(&mut self, now: Instant) -> Commit;

    /// The handle the release step waits on ([`Durable`]).
    fn durable(&self) -> Arc<dyn Durable>;

    /// Why new jobs must be refused now, if they must (checked for every
    /// new job: cheap).
    fn refusal(&self) -> Option<StoreFault>;

    /// Whether this log keeps jobs across a restart at all (`false` for
    /// [`NoLog`]): the shard then skips what only a log needs (telling
    /// another shard's log a job is done, a fresh id for a declined job).
    fn keeps_jobs(&self) -> bool {
        true
    }

    /// When the shard's loop must come back for the log even if no message
    /// comes (a periodic sync, compaction work, a repair, a health check).
    fn next_deadline(&self) -> Option<Instant>;

    /// Housekeeping after a commit: one bounded compaction step over the
    /// shard's `holdings`, or, when the log is faulty and its back-off has
    /// passed, an attempt to repair it (which may rewrite every live job).
    fn maintain(&mut self, now: Instant, holdings: &mut dyn Holdings);

    /// Writes and makes durable everything logged so far, on the calling
    /// thread (start-up, shutdown); whether the log now holds it.
    fn sync_all(&mut self) -> bool;

    /// What the log can say of itself for STATUS, `/metrics` and the
    /// status page; read by other threads while the shard runs.
    fn status(&self) -> Arc<dyn LogStatus>;
}

/// A log's state as other threads read it (relaxed reads of figures the
/// shard updates once per batch).
pub trait LogStatus: Send + Sync {
    /// The common figures.
    fn figures(&self) -> LogFigures;

    /// Everything the log can say, for STATUS (`emq.wal.shards[]`).
    fn to_json(&self, shard: usize) -> serde_json::Value;

    /// The durations of the syncs since the last take (microseconds), for
    /// the latency reporter; `None` for a log that does not sync.
    fn take_sync_histogram(&self) -> Option<hdrhistogram::Histogram<u64>>;
}

/// Kinds of store errors, as counted (`/metrics`
/// `emq_log_errors_total{kind}`, STATUS `errors`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultKind {
    /// Out of space (`ENOSPC`, `EDQUOT`).
    Full,
    /// Read-only (`EROFS`) or not permitted (`EACCES`, `EPERM`).
    ReadOnly,
    /// An I/O error, or a sync that failed.
    Io,
    /// The data directory, a shard's directory, a segment or the lock
    /// file was deleted or replaced.
    Gone,
    /// Another router holds the data directory's lock (the local log;
    /// the replicated store's counterpart is [`FaultKind::Fenced`]).
    Taken,
    /// The replicated store did not confirm a batch within `nats_give_up`
    /// (no quorum, no server reachable).
    Unreachable,
    /// Another router took the router's name and fenced this one: its
    /// stream no longer takes this start's subject (a publish found no
    /// responders), or a lease renewal found the other holder
    /// (docs/replicated.md, "Failover"). Final: no repair.
    Fenced,
    /// Anything else.
    Other,
}

impl FaultKind {
    /// Every kind, in counter order.
    pub const ALL: [FaultKind; 8] = [
        FaultKind::Full,
        FaultKind::ReadOnly,
        FaultKind::Io,
        FaultKind::Gone,
        FaultKind::Taken,
        FaultKind::Unreachable,
        FaultKind::Fenced,
        FaultKind::Other,
    ];

    /// The kind's name in STATUS and `/metrics`.
    pub fn as_str(self) -> &'static str {
        match self {
            FaultKind::Full => "full",
            FaultKind::ReadOnly => "read_only",
            FaultKind::Io => "io",
            FaultKind::Gone => "gone",
            FaultKind::Taken => "taken",
            FaultKind::Unreachable => "unreachable",
            FaultKind::Fenced => "fenced",
            FaultKind::Other => "other",
        }
    }

    /// Its index in [`FaultKind::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The refusal producers get while the log has this fault.
    pub fn refusal(self) -> StoreFault {
        match self {
            FaultKind::Full => StoreFault::Full,
            _ => StoreFault::Failed,
        }
    }

    /// The kind of an OS error.
    pub fn of(e: &std::io::Error) -> FaultKind {
        match e.raw_os_error() {
            Some(libc::ENOSPC | libc::EDQUOT) => FaultKind::Full,
            Some(libc::EROFS | libc::EACCES | libc::EPERM) => FaultKind::ReadOnly,
            Some(libc::EIO) => FaultKind::Io,
            Some(libc::ENOENT | libc::ESTALE) => FaultKind::Gone,
            _ => FaultKind::Other,
        }
    }
}

/// The state of a log, as STATUS names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogState {
    /// Keeping every record.
    #[default]
    Ok,
    /// Free space is below `disk_free_limit`: new jobs are refused,
    /// everything else is logged.
    Alarm,
    /// A fault: new jobs are refused; the log retries with back-off.
    Faulty(FaultKind),
}

impl LogState {
    /// The state's name in STATUS and `/metrics` (`ok`, `disk_alarm`, or
    /// the fault's kind).
    pub fn as_str(self) -> &'static str {
        match self {
            LogState::Ok => "ok",
            LogState::Alarm => "disk_alarm",
            LogState::Faulty(kind) => kind.as_str(),
        }
    }
}

/// The figures every log gives (zero where a log has none).
#[derive(Debug, Clone, Default)]
pub struct LogFigures {
    /// Bytes the log occupies in its store.
    pub bytes: u64,
    /// Jobs it holds live.
    pub live_jobs: u64,
    /// Its state now.
    pub state: LogState,
    /// Errors so far, by [`FaultKind`] (index [`FaultKind::index`]).
    pub errors: [u64; FaultKind::ALL.len()],
    /// Free bytes of the store's file system at the last check, when the
    /// log checks.
    pub free_bytes: Option<u64>,
    /// Repairs that brought the log back.
    pub repairs: u64,
    /// A replicated log's figures of its store (`None` for a local log).
    pub store: Option<StoreFigures>,
}

/// What a replicated log (`crate::jslog`) says of its store, for
/// `/metrics` (`emq_store_*`) and the status page.
#[derive(Debug, Clone, Default)]
pub struct StoreFigures {
    /// Messages published (first tries).
    pub published: u64,
    /// Publishes retried (timeouts, no responders, a lost connection).
    pub retries: u64,
    /// Publishes given up after `nats_give_up`.
    pub give_ups: u64,
    /// Jobs refused because their batch was given up.
    pub refused_jobs: u64,
    /// Batches handed to the store and not yet confirmed.
    pub unconfirmed_batches: u64,
    /// Purges of done records sent.
    pub purges: u64,
    /// When the last purge was sent (ms since the Unix epoch; 0: never).
    pub last_purge_unix_ms: u64,
    /// PubAck latency since start (µs, from the first try), cumulative.
    pub ack_us: Option<hdrhistogram::Histogram<u64>>,
}
