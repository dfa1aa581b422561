//! eMQP worker: a jobmanager in Rust (EventMQ 0.3.13 wire, spec §3, §6),
//! with EventMQ's jobmanager defects fixed:
//!
//! * **Eager pool** (J1): `concurrency` READYs right after the ACK, no wait
//!   for a router HEARTBEAT.
//! * **Exact READY accounting** (J2): after a reconnect only free slots are
//!   announced; a job that was running across the reconnect announces its
//!   slot on the new connection when it ends. Its result REPLY is dropped
//!   (the old router registration is gone, the router requeued the job).
//! * **Heartbeats never wait for jobs**: handlers run on a thread pool; the
//!   I/O thread only moves frames and timers.
//! * **Working failover** (J3): every reconnect uses the next address of the list.
//! * **INFORM is re-sent** while waiting for the ACK (J18): after
//!   `inform_retry` (5 s) without ACK, and after `heartbeat_timeout ×
//!   heartbeat_liveness` of router silence (15 s), the worker reconnects
//!   under a new identity to the next address (spec §6.6) and INFORMs again.
//!   (A second INFORM on the same identity would reset its slots in an
//!   EventMQ router, D12.)
//! * **KBYE and drain**: [`Worker::shutdown`] sends KBYE, lets running jobs
//!   finish (up to `drain_timeout`), sends their REPLYs, then closes.
//! * Headers are matched as whole tokens (J17): a job-result REPLY
//!   `{"value": "<text>"}` is sent when the headers hold `reply-requested`.
//!
//! A worker against a raw ROUTER that plays the router backend (runnable):
//!
//! ```
//! use emq::client::worker::{JobError, Worker, WorkerConfig};
//! let ctx = zmq::Context::new();
//! let router = ctx.socket(zmq::ROUTER).unwrap();
//! router.set_rcvtimeo(5000).unwrap(); // a doc test never hangs
//! router.bind("tcp://127.0.0.1:*").unwrap();
//! let endpoint = router.get_last_endpoint().unwrap().unwrap();
//!
//! let config = WorkerConfig::new(&endpoint).queues(vec![(10, "email".into())]).concurrency(2);
//! let worker = Worker::start(config, |job| match job.body.as_slice() {
//!     b"" => Err(JobError::Failed("empty body".into())),
//!     body => Ok(body.to_ascii_uppercase()),
//! })
//! .unwrap();
//!
//! let inform = router.recv_multipart(0).unwrap(); // [identity, "", "eMQP/1.0", "INFORM", msgid, queues, "worker"]
//! assert_eq!(inform[5], br#"[[10, "email"]]"#);
//! let id = inform[0].clone();
//! router.send_multipart([&id[..], b"", b"eMQP/1.0", b"ACK", b"ack-1", &inform[4]], 0).unwrap();
//! for _ in 0..2 {
//!     assert_eq!(router.recv_multipart(0).unwrap()[3], b"READY"); // one per free slot
//! }
//! router.send_multipart([&id[..], b"", b"eMQP/1.0", b"REQUEST", b"job-1", b"email", b"reply-requested", b"hi"], 0).unwrap();
//! let reply = router.recv_multipart(0).unwrap(); // [identity, "", "eMQP/1.0", "REPLY", msgid, result, "job-1"]
//! assert_eq!((&reply[5][..], &reply[6][..]), (&br#"{"value": "HI"}"#[..], &b"job-1"[..]));
//!
//! let stats = worker.shutdown().unwrap(); // KBYE, drain, stop
//! assert_eq!(stats.succeeded, 1);
//! ```

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;

use super::body::PythonCall;
use crate::limits;
use crate::protocol::emqp::Frame;
use crate::protocol::headers;

/// One job: a REQUEST as the router forwarded it (spec §3.3, V7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// D3: the REQUEST msgid (the job id).
    pub msgid: Frame,
    /// D4: the queue the client named.
    pub queue: Frame,
    /// D5: headers CSV.
    pub headers: Frame,
    /// D6: the job body (a Python body `["run", {…}]` or any bytes, e.g. a
    /// text-protocol SCHED's data).
    pub body: Frame,
    /// Frames after D6, kept as sent.
    pub extra: Vec<Frame>,
}

impl Job {
    /// Whether the headers hold the token `reply-requested`.
    pub fn reply_requested(&self) -> bool {
        headers::has(&self.headers, headers::REPLY_REQUESTED)
    }

    /// The `timeout:N` header in seconds, if present and > 0.
    pub fn timeout(&self) -> Option<Duration> {
        let v = headers::value(&self.headers, b"timeout")?;
        let secs: u64 = std::str::from_utf8(v).ok()?.trim().parse().ok()?;
        (secs > 0).then(|| Duration::from_secs(secs))
    }

    /// The Python call in the body, if the body is one (spec §4.1).
    pub fn python_call(&self) -> Option<PythonCall> {
        PythonCall::parse(&self.body)
    }
}

/// Why a job did not succeed. Both are reported to the router as
/// `{"value": "<text>"}` like EventMQ (J16), and counted apart here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobError {
    /// The job failed; the text becomes the result value.
    #[error("{0}")]
    Failed(String),
    /// The job ran out of time; the result value is `"TimeoutError"`.
    #[error("TimeoutError")]
    Timeout,
}

/// Worker settings. Defaults follow EventMQ's jobmanager (spec §6, §10).
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Router backend addresses; the first is used first, each reconnect
    /// moves to the next (failover).
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
    /// Longest wait for running jobs at shutdown.
    pub drain_timeout: Duration,
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
        }
    }

    /// Sets the INFORM queue list.
    pub fn queues(mut self, queues: Vec<(i64, String)>) -> WorkerConfig {
        self.queues = queues;
        self
    }

    /// Sets the number of concurrent jobs (at least 1).
    pub fn concurrency(mut self, n: usize) -> WorkerConfig {
        self.concurrency = n.max(1);
        self
    }

    /// Adds a failover address.
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
}

impl Counters {
    fn snapshot(&self) -> WorkerStats {
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
        }
    }
}

/// Errors starting or running a worker.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// A ZeroMQ call failed.
    #[error("worker zmq {what} failed: {source}")]
    Zmq {
        /// The operation.
        what: &'static str,
        /// The zmq error.
        source: zmq::Error,
    },
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
    /// Asks the worker to send KBYE, drain and stop. Returns at once.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.waker.wake();
    }
}

/// A running worker: an I/O thread plus `concurrency` pool threads.
pub struct Worker {
    stopper: Stopper,
    counters: Arc<Counters>,
    io: JoinHandle<Result<(), WorkerError>>,
}

impl Worker {
    /// Starts the worker: connects to the first address, INFORMs, and runs
    /// `handler` for each job on a pool of `config.concurrency` threads.
    ///
    /// # Errors
    /// [`WorkerError::Config`] when `config.addresses` is empty;
    /// [`WorkerError::Zmq`] when the sockets cannot be made.
    pub fn start<H>(config: WorkerConfig, handler: H) -> Result<Worker, WorkerError>
    where
        H: Fn(Job) -> Result<Vec<u8>, JobError> + Send + Sync + 'static,
    {
        if config.addresses.is_empty() {
            return Err(WorkerError::Config("no router address".into()));
        }
        let ctx = zmq::Context::new();
        let zerr = |what| move |source| WorkerError::Zmq { what, source };
        let wake_addr = format!("inproc://emq-worker-wake-{}", uuid::Uuid::new_v4());
        let wake_rx = ctx.socket(zmq::PULL).map_err(zerr("socket"))?;
        wake_rx.bind(&wake_addr).map_err(zerr("bind"))?;
        let wake_tx = ctx.socket(zmq::PUSH).map_err(zerr("socket"))?;
        wake_tx.set_linger(limits::WAKEUP_LINGER_MS).map_err(zerr("linger"))?;
        wake_tx.connect(&wake_addr).map_err(zerr("connect"))?;
        let stopper = Stopper { stop: Arc::new(AtomicBool::new(false)), waker: Arc::new(Waker(Mutex::new(wake_tx))) };
        let counters = Arc::new(Counters::default());
        let parts = super::worker_loop::Parts {
            ctx,
            config,
            handler: Arc::new(handler),
            wake_rx,
            stopper: stopper.clone(),
            counters: counters.clone(),
        };
        let io = std::thread::Builder::new()
            .name("emq-worker-io".into())
            .spawn(move || super::worker_loop::run(parts))
            .map_err(|e| WorkerError::Config(format!("cannot spawn the I/O thread: {e}")))?;
        Ok(Worker { stopper, counters, io })
    }

    /// The counters so far.
    pub fn stats(&self) -> WorkerStats {
        self.counters.snapshot()
    }

    /// A handle that stops the worker from another thread.
    pub fn stopper(&self) -> Stopper {
        self.stopper.clone()
    }

    /// Whether the worker has stopped (after a stop, a DISCONNECT or an error).
    pub fn is_finished(&self) -> bool {
        self.io.is_finished()
    }

    /// Sends KBYE, drains running jobs (up to `drain_timeout`) and waits
    /// for the worker to stop. Returns the final counters.
    ///
    /// # Errors
    /// The I/O thread's error, or [`WorkerError::Panicked`].
    pub fn shutdown(self) -> Result<WorkerStats, WorkerError> {
        self.stopper.stop();
        self.join()
    }

    /// Waits until the worker stops by itself or through a [`Stopper`].
    ///
    /// # Errors
    /// As [`Worker::shutdown`].
    pub fn join(self) -> Result<WorkerStats, WorkerError> {
        self.io.join().map_err(|_| WorkerError::Panicked)??;
        Ok(self.counters.snapshot())
    }
}
