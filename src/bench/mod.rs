//! The load generator behind `emq-bench` (project issue 6).
//!
//! * [`emqp`]: N client DEALERs sending REQUESTs and M in-process workers
//!   against any eMQP broker (emq-router, the Python EventMQ router, or the
//!   [`baseline`] forwarder).
//! * [`text`]: P producers (`SCHED`) and C consumers (`ASK`/`ACK`) against
//!   any text-protocol address; [`beanstalk`]: the same load in beanstalkd's
//!   protocol (`put`, `reserve-with-timeout 0`/`delete`); both through the
//!   shared [`lines`] driver; [`pipeline`]: producers only, pipelined
//!   SCHEDs or `put`s; [`link`]: their connections, plain or TLS (the
//!   text mode against a `text_tls` listener, with a token).
//! * [`report`]: summary table, JSON record, `.hgrm` files; [`plot`]: SVG of
//!   latency by percentile.
//! * [`idle`]: many idle workers that only heartbeat, with the broker's CPU
//!   read from `/proc/<pid>/stat`.
//! * [`fill`]: a queue filled with N jobs, with the broker's resident memory
//!   per queued job.
//! * [`jetstream`]: the raw JetStream per-message baseline: one message per
//!   job on a NATS JetStream stream, published, consumed and acked with
//!   async-nats on one thread.
//!
//! What is measured (both modes): the send timestamp travels in the job body
//! (nanoseconds since the run's start, taken from the *intended* send time
//! in open loop, so coordinated omission is corrected by construction). The
//! latency of a job is **client send → the worker (or text consumer)
//! receiving it**, stamped by the receiver on the same clock. That works for
//! brokers that never send results back (EventMQ never forwards job results
//! to clients). eMQP runs also record **client send → acceptance REPLY**
//! where the broker sends one (`ack_latency_ms`).

pub mod baseline;
pub mod beanstalk;
pub mod body;
pub mod emqp;
pub mod fill;
pub mod idle;
pub mod jetstream;
pub mod lines;
pub mod link;
pub mod pipeline;
pub mod plot;
pub mod report;
pub mod run;
pub mod text;

use std::time::Duration;

use serde::Serialize;

use crate::zmq_error::ZmqError;

/// Load shape shared by every mode. Units are in the names; durations
/// accept humantime text (`500ms`, `10s`).
#[derive(Debug, Clone, clap::Args, Serialize)]
pub struct LoadSettings {
    /// Client connections (eMQP DEALERs, or text producers).
    #[arg(long, default_value_t = 4)]
    pub clients: usize,
    /// Workers (eMQP), or text consumers.
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
    /// READY credits each eMQP worker gives (jobs it may hold at once).
    #[arg(long, default_value_t = 1)]
    pub slots: usize,
    /// Closed loop: jobs in flight per client (sent, not yet received by a
    /// worker or consumer). Ignored when `--rate` is given.
    #[arg(long, default_value_t = 16)]
    pub in_flight: usize,
    /// Open loop: total send rate in requests per second, spread evenly over
    /// the clients; latency counts from the intended send time.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Stop after this many measured requests (after warm-up). When neither
    /// this nor `--duration` is given: 10,000.
    #[arg(long)]
    pub requests: Option<u64>,
    /// Stop sending after this long (after warm-up).
    #[arg(long, value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub duration: Option<Duration>,
    /// Warm-up: requests sent this early are answered but not measured.
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub warmup: Duration,
    /// Job body size in bytes (the body is padded up to it).
    #[arg(long, default_value_t = 64)]
    pub size: usize,
    /// Number of queues (`bench-0` … ); requests go round-robin over them.
    #[arg(long, default_value_t = 1)]
    pub queues: usize,
    /// Worker weights, one per queue, comma-separated (default 10 each).
    #[arg(long, value_delimiter = ',')]
    pub weights: Vec<i64>,
    /// Time a worker spends on each job before its job-result REPLY.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub service_time: Duration,
    /// The target counts as down when it shows no sign of life this long
    /// (no ACK to INFORM, no connection, no job reaching a worker).
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub probe_timeout: Duration,
    /// After the last send, how long to wait for outstanding jobs.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub drain_timeout: Duration,
    /// Pipeline mode (`--pipeline`): jobs per write; a producer keeps
    /// `--in-flight` jobs unacknowledged.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Text and beanstalk consumers: long-poll for up to this long per ask
    /// (`ASK <queue> <ms>`; beanstalkd `reserve-with-timeout <s>`, whole
    /// seconds) instead of backing off after an empty answer.
    #[arg(long, value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub ask_wait: Option<Duration>,
    /// Hide the progress bar (it is drawn on stderr only when stderr is a
    /// terminal, and only for runs longer than ~2 s).
    #[arg(long, default_value_t = false)]
    pub no_progress: bool,
}

impl Default for LoadSettings {
    /// The CLI defaults (one source of truth: the `#[arg]` attributes).
    fn default() -> Self {
        #[derive(clap::Parser)]
        struct Wrap {
            #[command(flatten)]
            load: LoadSettings,
        }
        <Wrap as clap::Parser>::parse_from(["emq-bench"]).load
    }
}

impl LoadSettings {
    /// Measured requests to send when the run is bounded by count.
    pub fn request_bound(&self) -> Option<u64> {
        match (self.requests, self.duration) {
            (None, None) => Some(10_000),
            (r, _) => r,
        }
    }

    /// Queue names and weights: `[(weight, "bench-i")]`.
    pub fn queue_list(&self) -> Vec<(i64, String)> {
        (0..self.queues.max(1)).map(|i| (self.weights.get(i).copied().unwrap_or(10), format!("bench-{i}"))).collect()
    }
}

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The target showed no sign of life within the probe timeout.
    #[error("target down: {0}")]
    TargetDown(String),
    /// A ZeroMQ call failed; names what was being done.
    #[error(transparent)]
    Zmq(#[from] ZmqError),
    /// A socket or file operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done (names the path or address).
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// Bad settings or input file.
    #[error("{0}")]
    Invalid(String),
    /// A NATS or JetStream step failed: no server reachable, a stream that
    /// cannot be created, a publish still failing after its retries
    /// (`emq-bench` exits with status 2).
    #[error("{what}: {detail}")]
    Nats {
        /// What was being done (names the URLs, stream or message id).
        what: String,
        /// The client's or server's error.
        detail: String,
    },
}

pub(crate) fn ioerr(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> BenchError {
    let what = what.into();
    move |source| BenchError::Io { what, source }
}
