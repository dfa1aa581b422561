//! eMQP worker: a jobmanager in Rust (EventMQ 0.3.13 wire, docs/emqp.md "Messages"),
//! with EventMQ's jobmanager defects fixed:
//!
//! * **Eager pool**: `concurrency` READYs right after the ACK, no wait
//!   for a router HEARTBEAT.
//! * **Exact READY accounting**: after a reconnect only free slots are
//!   announced; a job that was running across the reconnect announces its
//!   slot on the new connection when it ends. Its result REPLY is dropped
//!   (the old router registration is gone, the router requeued the job).
//! * **Heartbeats never wait for jobs**: handlers run on a thread pool; the
//!   I/O thread only moves frames and timers.
//! * **Working failover**: the worker connects to every address of its
//!   list at once (`ZMQ_IMMEDIATE`, ZMTP heartbeats), so it talks to the
//!   router that is up; a router that does not know it (one that took over
//!   a dead one's queues) answers its next HEARTBEAT or READY with
//!   DISCONNECT, and it registers there (docs/failover.md).
//! * **INFORM is re-sent** while waiting for the ACK: after
//!   `inform_retry` (5 s) without ACK, and after `heartbeat_timeout ×
//!   heartbeat_liveness` of router silence (15 s), the worker reconnects
//!   under a new identity (docs/emqp.md "Liveness") and INFORMs again.
//!   (A second INFORM on the same identity would reset its slots in an
//!   EventMQ router.)
//! * **Told it is unknown, it registers again**: `DISCONNECT` from the
//!   router means "I do not know you" (emq's router sends it to a worker it
//!   has expired or forgotten, the answer that also brings a real EventMQ
//!   jobmanager back): the worker reconnects under a new
//!   identity and INFORMs at once, keeping its running jobs (their results
//!   are dropped as above). While draining it ignores DISCONNECT.
//!   `ERROR BAD_INFORM` (its queue list refused) is logged with the
//!   router's reason.
//! * **KBYE and drain**: [`Worker::shutdown`] sends KBYE, lets running jobs
//!   finish (up to `drain_timeout`), sends their REPLYs, then closes. Jobs
//!   still running at `drain_timeout` are asked to stop (the
//!   `on_drain_timeout` hook, then up to `abandon_wait`) and the rest are
//!   reported failed, so the router retries them at once instead of
//!   holding them for its `kbye_grace`.
//! * **Results fit the router**: a REPLY that would be over
//!   [`WorkerConfig::max_reply_bytes`] (default
//!   [`limits::WORKER_MAX_REPLY_BYTES`]) once encoded is replaced by a
//!   failed REPLY saying so.
//! * Headers are matched as whole tokens: a job-result REPLY
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

use std::sync::Arc;
use std::thread::JoinHandle;

use super::worker_loop::{self, Parts};
use super::worker_types::Counters;
pub use super::worker_types::{
    DrainTimeoutHook, Handler, Job, JobError, Stopper, WorkerConfig, WorkerError, WorkerStats,
};
use crate::limits;
use crate::zmq_error::ZmqError;

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
    /// [`WorkerError::Config`] when `config.addresses` is empty or
    /// `config.concurrency` is over [`limits::WORKER_MAX_CONCURRENCY`];
    /// [`WorkerError::Zmq`] when the sockets cannot be made.
    pub fn start<H>(config: WorkerConfig, handler: H) -> Result<Worker, WorkerError>
    where
        H: Fn(Job) -> Result<Vec<u8>, JobError> + Send + Sync + 'static,
    {
        if config.addresses.is_empty() {
            return Err(WorkerError::Config("no router address".into()));
        }
        if config.concurrency > limits::WORKER_MAX_CONCURRENCY {
            return Err(WorkerError::Config(format!(
                "concurrency {} is over the limit of {} jobs at once",
                config.concurrency,
                limits::WORKER_MAX_CONCURRENCY
            )));
        }
        let ctx = zmq::Context::new();
        let wake_addr = format!("inproc://emq-worker-wake-{}", uuid::Uuid::new_v4());
        let wake_rx = ctx.socket(zmq::PULL).map_err(ZmqError::at("worker wake PULL socket"))?;
        wake_rx.bind(&wake_addr).map_err(ZmqError::at(format!("worker bind {wake_addr}")))?;
        let wake_tx = ctx.socket(zmq::PUSH).map_err(ZmqError::at("worker wake PUSH socket"))?;
        wake_tx.set_linger(limits::WAKEUP_LINGER_MS).map_err(ZmqError::at("worker wake PUSH linger"))?;
        wake_tx.connect(&wake_addr).map_err(ZmqError::at(format!("worker connect {wake_addr}")))?;
        let stopper = Stopper::new(wake_tx);
        let counters = Arc::new(Counters::default());
        let parts = Parts {
            ctx,
            config,
            handler: Arc::new(handler),
            wake_rx,
            stopper: stopper.clone(),
            counters: counters.clone(),
        };
        let io = std::thread::Builder::new()
            .name("emq-worker-io".into())
            .spawn(move || worker_loop::run(parts))
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

    /// Whether the worker has stopped (after a stop or an error).
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
