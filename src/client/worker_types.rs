//! The types the worker handle ([`super::worker`]) and its I/O thread
//! (`worker_loop`) share: the job, its error, the settings, the counters, the
//! stopper. Both import them from here, and the handle starts the loop, so
//! the two depend one way only. Re-exported by [`super::worker`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use super::body::PythonCall;
use crate::limits;
use crate::protocol::emqp::Frame;
use crate::protocol::headers;
use crate::zmq_error::ZmqError;

/// One job: a REQUEST as the router forwarded it (docs/emqp.md "REQUEST").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// frame 3: the REQUEST msgid (the job id).
    pub msgid: Frame,
    /// frame 4: the queue the client named.
    pub queue: Frame,
    /// frame 5: headers CSV.
    pub headers: Frame,
    /// frame 6: the job body (a Python body `["run", {…}]` or any bytes, e.g. a
    /// text-protocol SCHED's data).
    pub body: Frame,
    /// Frames after frame 6, kept as sent.
    pub extra: Vec<Frame>,
}

impl Job {
    /// Whether the headers hold the token `reply-requested`.
    pub fn reply_requested(&self) -> bool {
        headers::has(&self.headers, headers::REPLY_REQUESTED)
    }

    /// The job's time limit: its `timeout:N` header in seconds, where
    /// `timeout:0` means no limit (as for EventMQ 0.3.13's workers; the
    /// router reads the header the same way, [`headers::header_timeout`],
    /// README "Deadlines"); `default` when the header is absent or not a
    /// whole number of seconds. `None`: no limit.
    pub fn time_limit(&self, default: Duration) -> Option<Duration> {
        match headers::header_timeout(&self.headers) {
            headers::HeaderTimeout::Absent => Some(default),
            headers::HeaderTimeout::NoLimit => None,
            headers::HeaderTimeout::Limit(limit) => Some(limit),
        }
    }

    /// The Python call in the body, if the body is one (docs/emqp.md "Job bodies").
    pub fn python_call(&self) -> Option<PythonCall> {
        PythonCall::parse(&self.body)
    }
}

/// Why a job did not succeed. Both are reported to the router as
/// `{"value": "<text>"}` like EventMQ, and counted apart here (the REPLY is marked `failed`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobError {
    /// The job failed; the text becomes the result value.
    #[error("{0}")]
    Failed(String),
    /// The job ran out of time; the result value is `"TimeoutError"`.
    #[error("TimeoutError")]
    Timeout,
}

/// Worker settings. Defaults follow EventMQ's jobmanager (docs/emqp.md "Differences from EventMQ").
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Router backend addresses: the worker connects to all of them at
    /// once (`ZMQ_IMMEDIATE`, ZMTP heartbeats) and registers with the one
    /// that is up (docs/failover.md). Semicolons inside the entries
    /// separate owners (router names, [`crate::config::addr::emqp_owners`]
    /// over the entries joined by commas): the worker then keeps one
    /// connection per owner and splits `concurrency` between them
    /// (docs/scaleout.md "Slots").
    pub addresses: Vec<String>,
    /// `(weight, name)` pairs sent in INFORM; empty = the router's defaults.
    pub queues: Vec<(i64, String)>,
    /// Jobs run at once (threads in the pool); EventMQ's `CONCURRENT_JOBS` = 4.
    pub concurrency: usize,
    /// HEARTBEAT send period (3 s).
    pub heartbeat_interval: Duration,
    /// One silence window (5 s, EventMQ's `HEARTBEAT_TIMEOUT`).
    pub heartbeat_timeout: Duration,
    /// Silent windows before the router is declared dead (3).
    pub heartbeat_liveness: u32,
    /// Wait for the ACK before INFORMing again under a new identity (5 s).
    pub inform_retry: Duration,
    /// Longest wait for running jobs at shutdown. Past it, the
    /// [`WorkerConfig::on_drain_timeout`] hook runs (if set) and the worker
    /// waits up to [`WorkerConfig::abandon_wait`] more for the jobs to end;
    /// every job still running then is reported failed to the router (a
    /// REPLY marked `failed`, so that the router retries it at once instead
    /// of holding it for its `kbye_grace`), and the worker closes.
    pub drain_timeout: Duration,
    /// Called once, on the I/O thread, when `drain_timeout` passes with jobs
    /// still running: it should make them end soon (`emq-worker` signals
    /// their commands' process groups). Must not block.
    pub on_drain_timeout: Option<DrainTimeoutHook>,
    /// How long after calling `on_drain_timeout` the worker waits for the
    /// jobs to end (their results are sent as usual) before it reports the
    /// rest failed. Not used without a hook.
    pub abandon_wait: Duration,
    /// Largest job-result REPLY sent, all frames together, in bytes
    /// ([`limits::WORKER_MAX_REPLY_BYTES`] by default): a result whose REPLY
    /// would be larger once JSON-encoded is replaced by a failed REPLY
    /// naming its size and this limit (counted in
    /// [`WorkerStats::oversized_results`]). Match it to the router's
    /// `max_message_bytes` (that less 64 KiB) when the router runs with a
    /// lower one. A value under [`limits::WORKER_MIN_REPLY_BYTES`] counts as
    /// that.
    pub max_reply_bytes: usize,
    /// CURVE client keys (`curve_key_file`, `curve_server_key`): `None`
    /// connects plain (NULL).
    pub curve: Option<crate::curve::ClientCurve>,
    /// With several owners: how long a free slot may sit idle at one owner
    /// while another owner used every slot it was given before the worker
    /// takes it back (UNREADY) and gives it to that owner
    /// ([`limits::WORKER_SLOT_MOVE_AFTER`], docs/scaleout.md "Slots").
    pub slot_move_after: Duration,
}

/// A function run when the drain timeout passes with jobs still running
/// ([`WorkerConfig::on_drain_timeout`]).
#[derive(Clone)]
pub struct DrainTimeoutHook(pub Arc<dyn Fn() + Send + Sync + 'static>);

impl std::fmt::Debug for DrainTimeoutHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DrainTimeoutHook")
    }
}

impl WorkerConfig {
    /// Defaults for one router backend address.
    pub fn new(address: &str) -> WorkerConfig {
        WorkerConfig {
            addresses: vec![address.to_string()],
            queues: Vec::new(),
            concurrency: 4,
            heartbeat_interval: limits::HEARTBEAT_INTERVAL,
            heartbeat_timeout: limits::HEARTBEAT_TIMEOUT,
            heartbeat_liveness: 3,
            inform_retry: limits::HEARTBEAT_TIMEOUT,
            drain_timeout: limits::WORKER_DRAIN_TIMEOUT,
            on_drain_timeout: None,
            abandon_wait: limits::WORKER_ABANDON_WAIT,
            max_reply_bytes: limits::WORKER_MAX_REPLY_BYTES,
            curve: None,
            slot_move_after: limits::WORKER_SLOT_MOVE_AFTER,
        }
    }

    /// Sets the INFORM queue list.
    pub fn queues(mut self, queues: Vec<(i64, String)>) -> WorkerConfig {
        self.queues = queues;
        self
    }

    /// Sets the number of concurrent jobs (at least 1; [`super::worker::Worker::start`]
    /// refuses more than [`limits::WORKER_MAX_CONCURRENCY`]).
    pub fn concurrency(mut self, n: usize) -> WorkerConfig {
        self.concurrency = n.max(1);
        self
    }

    /// Adds a router address (a standby: docs/failover.md).
    pub fn failover(mut self, address: &str) -> WorkerConfig {
        self.addresses.push(address.to_string());
        self
    }

    /// Router silence that triggers a reconnect: timeout × liveness (15 s).
    pub fn silence_timeout(&self) -> Duration {
        self.heartbeat_timeout * self.heartbeat_liveness.max(1)
    }
}

/// Counters since start (a snapshot).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerStats {
    /// Jobs whose handler returned `Ok`.
    pub succeeded: u64,
    /// Jobs that returned [`JobError::Failed`] or panicked.
    pub failed: u64,
    /// Jobs that returned [`JobError::Timeout`].
    pub timed_out: u64,
    /// Inbound messages that could not be decoded (logged and dropped).
    pub malformed: u64,
    /// Reconnects (new identity) after silence, KBYE or a failed INFORM.
    pub reconnects: u64,
    /// READY messages sent.
    pub ready_sent: u64,
    /// Job-result REPLYs sent.
    pub replies_sent: u64,
    /// Sends that failed (no connection, full pipe); logged.
    pub send_failed: u64,
    /// Jobs still running when the worker closed after its drain timeout
    /// (and the wait after its hook): reported failed to the router.
    pub abandoned: u64,
    /// Results not sent because their REPLY would have been over
    /// [`WorkerConfig::max_reply_bytes`]: a failed REPLY was sent instead
    /// (the job also counts in `succeeded` or `failed` as it ended).
    pub oversized_results: u64,
    /// The most jobs this worker held at once (running, across every
    /// router it serves): never over `concurrency` unless a router sent
    /// more jobs than READYs (then `over_limit` counts them).
    pub peak_busy: u64,
    /// Jobs received while every slot was already busy: a router sent
    /// more jobs than this worker announced (0 against emq's router).
    pub over_limit: u64,
    /// Free slots taken back from one router (UNREADY) to be given to
    /// another with work (docs/scaleout.md "Slots").
    pub slots_moved: u64,
}

/// Live counters shared by the I/O thread and the pool.
#[derive(Default)]
pub(crate) struct Counters {
    pub succeeded: AtomicU64,
    pub failed: AtomicU64,
    pub timed_out: AtomicU64,
    pub malformed: AtomicU64,
    pub reconnects: AtomicU64,
    pub ready_sent: AtomicU64,
    pub replies_sent: AtomicU64,
    pub send_failed: AtomicU64,
    pub abandoned: AtomicU64,
    pub oversized_results: AtomicU64,
    pub peak_busy: AtomicU64,
    pub over_limit: AtomicU64,
    pub slots_moved: AtomicU64,
}

impl Counters {
    pub(crate) fn snapshot(&self) -> WorkerStats {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        WorkerStats {
            succeeded: g(&self.succeeded),
            failed: g(&self.failed),
            timed_out: g(&self.timed_out),
            malformed: g(&self.malformed),
            reconnects: g(&self.reconnects),
            ready_sent: g(&self.ready_sent),
            replies_sent: g(&self.replies_sent),
            send_failed: g(&self.send_failed),
            abandoned: g(&self.abandoned),
            oversized_results: g(&self.oversized_results),
            peak_busy: g(&self.peak_busy),
            over_limit: g(&self.over_limit),
            slots_moved: g(&self.slots_moved),
        }
    }
}

/// Errors starting or running a worker.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// A ZeroMQ call failed; names the operation (and the router address
    /// for the DEALER's calls).
    #[error(transparent)]
    Zmq(#[from] ZmqError),
    /// Bad settings (no address, bad endpoint).
    #[error("worker config: {0}")]
    Config(String),
    /// The I/O thread panicked.
    #[error("worker I/O thread panicked")]
    Panicked,
}

/// Wakes the I/O thread: a PUSH socket (behind a mutex) paired with the
/// I/O thread's inproc PULL.
pub(crate) struct Waker(Mutex<zmq::Socket>);

impl Waker {
    pub fn wake(&self) {
        // A full pipe already means "wake up"; nothing is lost by dropping.
        let _ = self.0.lock().send(Vec::<u8>::new(), zmq::DONTWAIT);
    }
}

/// The job handler: runs on a pool thread.
pub type Handler = Arc<dyn Fn(Job) -> Result<Vec<u8>, JobError> + Send + Sync + 'static>;

/// Stops a running worker from another thread (e.g. a signal handler thread).
#[derive(Clone)]
pub struct Stopper {
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) waker: Arc<Waker>,
}

impl Stopper {
    /// A stopper that wakes the I/O thread through `wake_tx`, a PUSH socket
    /// connected to the I/O thread's inproc PULL.
    pub(crate) fn new(wake_tx: zmq::Socket) -> Stopper {
        Stopper { stop: Arc::new(AtomicBool::new(false)), waker: Arc::new(Waker(Mutex::new(wake_tx))) }
    }

    /// Asks the worker to send KBYE, drain and stop. Returns at once.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.waker.wake();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(headers: &[u8]) -> Job {
        Job {
            msgid: b"m".to_vec(),
            queue: b"q".to_vec(),
            headers: headers.to_vec(),
            body: Vec::new(),
            extra: Vec::new(),
        }
    }

    #[test]
    fn the_timeout_header_sets_the_limit_and_timeout_0_means_none() {
        let default = Duration::from_secs(300);
        assert_eq!(job(b"reply-requested,timeout:7").time_limit(default), Some(Duration::from_secs(7)));
        assert_eq!(job(b"timeout:0").time_limit(default), None, "EventMQ: timeout:0 is no limit");
        assert_eq!(job(b"reply-requested").time_limit(default), Some(default));
        assert_eq!(job(b"timeout:abc").time_limit(default), Some(default), "unreadable: as absent");
        assert_eq!(job(b"timeout:-1").time_limit(default), Some(default));
        assert_eq!(job(b"timeout:+5").time_limit(default), Some(default), "as the router reads it");
    }
}
