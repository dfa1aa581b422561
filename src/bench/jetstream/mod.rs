//! The raw JetStream per-message baseline (issue 27, point 8): what a
//! broker that stores one message per job on a NATS JetStream cluster does,
//! measured with the client emq's `replicated` durability uses, the way it
//! uses it: async-nats on one thread (`emq-js`) driving a current-thread
//! tokio runtime.
//!
//! One run: a fresh file-storage WorkQueue stream (`--replicas`, dedup
//! window 120 s) on `<stream>.>` and a durable pull consumer (explicit
//! ack). `--jobs` messages of `--size` bytes go to `<stream>.jobs`, each
//! with its own `Nats-Msg-Id` (`<stream>-<index>`; the index is also the
//! payload's first 8 bytes, little-endian), with `--in-flight` PubAcks
//! awaited at once. The consumer pulls up to [`FETCH_BATCH`] messages per
//! request and acks each one; the run ends when the stream reports no
//! message left (the acks applied: WorkQueue removal done), messages
//! delivered again meanwhile (an ack lost across a leader change brings its
//! job back after the consumer's 30 s ack wait) pulled and acked too. The
//! stream is deleted at the end, also after a failure.
//!
//! With `--concurrent` (the default) the consumer runs from the first
//! publish on, the fair "jobs through the broker" figure: jobs/s is N over
//! the time from the first publish to the stream found empty. Without it
//! the consumer starts after the last PubAck and jobs/s is N over the
//! publish time plus the consume time.
//!
//! A publish that fails transiently (its PubAck timed out; `StreamNotFound`,
//! which is how async-nats reports "no responders" while the stream has no
//! leader; a broken connection; too many PubAcks pending) is sent again
//! with the same message id, so it is stored once, after a back-off of
//! 50 ms doubling to 1 s, and counted. A job still failing after
//! [`RETRY_FOR`] fails the run, as does any other publish error.

mod flow;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer, stream};
use hdrhistogram::Histogram;
use serde::Serialize;

use super::idle::cpu_seconds;
use super::run::{Percentiles, RunResult};
use super::{ioerr, BenchError};

/// Messages asked for per pull request.
pub const FETCH_BATCH: usize = 256;
/// A job whose publish still fails after this long fails the run.
pub const RETRY_FOR: Duration = Duration::from_secs(60);
/// The first back-off after a transient publish error; doubled after each.
const RETRY_FIRST: Duration = Duration::from_millis(50);
/// The longest back-off between two tries of one publish.
const RETRY_MAX: Duration = Duration::from_secs(1);
/// The client's JetStream API and PubAck timeout (async-nats' default for
/// acks).
const JS_TIMEOUT: Duration = Duration::from_secs(5);
/// Connecting to a server.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Looking up, creating and deleting the stream and creating the consumer
/// are retried this long (a cluster just formed may not place a stream
/// yet), then fail.
const SETUP_FOR: Duration = Duration::from_secs(10);
/// The stream's duplicate window: a retried message id inside it is stored
/// once.
const DEDUP_WINDOW: Duration = Duration::from_secs(120);
/// The durable pull consumer's name.
const CONSUMER: &str = "emqbench";
/// Payload bytes holding the job's index.
const INDEX_BYTES: usize = 8;
/// The largest `--size` (async-nats refuses a payload over the server's
/// `max_payload`, 1 MiB by default).
const MAX_SIZE_BYTES: usize = 1 << 20;

/// What to run against which cluster.
#[derive(Debug, Clone, clap::Args, Serialize)]
pub struct JetStreamSettings {
    /// The cluster's client URLs, repeated or comma-separated; the client
    /// fails over between them.
    #[arg(
        long = "nats-url",
        value_name = "URL",
        env = "EMQ_NATS_URL",
        value_delimiter = ',',
        default_value = "nats://127.0.0.1:4222"
    )]
    pub nats_url: Vec<String>,
    /// Jobs: messages published, then consumed and acked.
    #[arg(long, default_value_t = 10_000)]
    pub jobs: u64,
    /// Payload bytes per message (8 to 1 MiB; the first 8 are the job's
    /// index).
    #[arg(long, default_value_t = 64)]
    pub size: usize,
    /// PubAcks awaited at once.
    #[arg(long, default_value_t = 256)]
    pub in_flight: usize,
    /// The stream's replicas (1 to 5; a cluster needs at least as many
    /// servers).
    #[arg(long, default_value_t = 3)]
    pub replicas: usize,
    /// The stream's name; it must not exist (it is deleted at the end).
    /// Default: `emqbench_<pid>_<unix time>`.
    #[arg(long)]
    pub stream: Option<String>,
    /// Consume while publishing (`--concurrent false`: after the last
    /// PubAck).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub concurrent: bool,
    /// The nats-servers' PIDs, comma-separated: their CPU time (user +
    /// system, `/proc/<pid>/stat`) over the run is reported per job.
    #[arg(long, value_delimiter = ',')]
    pub server_pids: Vec<u32>,
    /// Label of the target in reports.
    #[arg(long, default_value = "jetstream")]
    pub target_name: String,
    /// Hide the progress bar (drawn on stderr only when it is a terminal,
    /// and only for runs longer than ~2 s).
    #[arg(long, default_value_t = false)]
    pub no_progress: bool,
}

impl JetStreamSettings {
    /// The stream's name: `--stream`, or `emqbench_<pid>_<unix time>`.
    pub fn stream_name(&self) -> String {
        self.stream.clone().unwrap_or_else(|| {
            let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
            format!("emqbench_{}_{secs}", std::process::id())
        })
    }

    fn check(&self) -> Result<(), BenchError> {
        let bad = |why: String| Err(BenchError::Invalid(why));
        if self.jobs == 0 || usize::try_from(self.jobs).is_err() {
            return bad(format!("--jobs {}: give 1 or more", self.jobs));
        }
        if !(INDEX_BYTES..=MAX_SIZE_BYTES).contains(&self.size) {
            return bad(format!("--size {}: give {INDEX_BYTES} to {MAX_SIZE_BYTES} bytes", self.size));
        }
        if self.in_flight == 0 {
            return bad("--in-flight 0: give 1 or more".into());
        }
        if !(1..=5).contains(&self.replicas) {
            return bad(format!("--replicas {}: give 1 to 5", self.replicas));
        }
        let bad_char = |c: char| c.is_whitespace() || c.is_control() || ".*>/\\".contains(c);
        if let Some(name) = self.stream.as_deref().filter(|n| n.is_empty() || n.contains(bad_char)) {
            return bad(format!(
                "--stream {name:?}: a stream name is not empty and has no space, '.', '*', '>', '/' or '\\'"
            ));
        }
        if self.nats_url.iter().all(|u| u.trim().is_empty()) {
            return bad("--nats-url: give at least one URL".into());
        }
        Ok(())
    }
}

/// Retries of publishes by the error that caused them.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Retries {
    /// No PubAck within the client's timeout.
    pub timed_out: u64,
    /// `StreamNotFound`: no responders, the stream has no leader.
    pub no_responders: u64,
    /// The connection broke.
    pub broken_pipe: u64,
    /// The client's own limit of pending PubAcks.
    pub max_ack_pending: u64,
}

impl Retries {
    /// All retries.
    pub fn total(&self) -> u64 {
        self.timed_out + self.no_responders + self.broken_pipe + self.max_ack_pending
    }

    fn add(&mut self, other: &Retries) {
        self.timed_out += other.timed_out;
        self.no_responders += other.no_responders;
        self.broken_pipe += other.broken_pipe;
        self.max_ack_pending += other.max_ack_pending;
    }
}

/// CPU time used by this process and by the servers (`--server-pids`),
/// over one phase of the run, in seconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuUse {
    /// This process (user + system, all threads).
    pub client_s: f64,
    /// The servers together, when their PIDs were given.
    pub servers_s: Option<f64>,
}

impl CpuUse {
    /// The CPU clocks now (time used since each process started).
    fn read(server_pids: &[u32]) -> Result<CpuUse, BenchError> {
        let client_s = cpu_seconds(std::process::id())?;
        let servers_s = match server_pids {
            [] => None,
            pids => Some(pids.iter().map(|&p| cpu_seconds(p)).sum::<Result<f64, BenchError>>()?),
        };
        Ok(CpuUse { client_s, servers_s })
    }

    /// The time used between the reading `start` and this one.
    fn since(&self, start: &CpuUse) -> CpuUse {
        CpuUse {
            client_s: self.client_s - start.client_s,
            servers_s: self.servers_s.zip(start.servers_s).map(|(b, a)| b - a),
        }
    }
}

/// What one run measured.
#[derive(Debug, Clone)]
pub struct JetStreamRun {
    /// The stream used (and deleted).
    pub stream: String,
    /// True when the consumer ran alongside the publishes.
    pub concurrent: bool,
    /// Jobs acknowledged by a PubAck (each job once).
    pub published: u64,
    /// PubAcks saying "duplicate": an earlier try of the job was stored.
    pub duplicate_pubacks: u64,
    /// Publishes sent again after a transient error.
    pub retries: Retries,
    /// Distinct jobs delivered to the consumer (and acked).
    pub consumed: u64,
    /// Deliveries of a job already delivered (acked again).
    pub redelivered: u64,
    /// Deliveries whose payload named no job of this run (acked).
    pub foreign: u64,
    /// Pull requests that failed (retried).
    pub fetch_errors: u64,
    /// Messages the stream still held at the end (0 unless jobs were lost).
    pub left_in_stream: u64,
    /// First publish to last PubAck, in seconds.
    pub publish_s: f64,
    /// Consumer start to the stream found empty, in seconds (with
    /// `concurrent`, from the first publish).
    pub consume_s: f64,
    /// First publish to the stream found empty, in seconds.
    pub wall_s: f64,
    /// Each job's first try to its PubAck, in microseconds.
    pub puback_us: Histogram<u64>,
    /// With `concurrent`: each job's first try to its delivery to the
    /// consumer, in microseconds.
    pub delivery_us: Option<Histogram<u64>>,
    /// CPU by phase: `run` (concurrent), or `publish` and `consume`.
    pub cpu: Vec<(&'static str, CpuUse)>,
}

/// Runs the baseline on a thread of its own (`emq-js`, a current-thread
/// tokio runtime) and waits for it. `progress` counts PubAcks and jobs
/// consumed (up to twice `--jobs`).
///
/// # Errors
/// [`BenchError::Invalid`] for bad settings or an unreadable server PID;
/// [`BenchError::Nats`] when no server can be reached, the stream exists
/// already or cannot be created, a publish fails for good or the consumer
/// keeps failing (see the module docs); [`BenchError::Io`] when the thread
/// or runtime cannot start.
pub fn run(s: &JetStreamSettings, progress: Arc<AtomicU64>) -> Result<JetStreamRun, BenchError> {
    s.check()?;
    CpuUse::read(&s.server_pids)?;
    let settings = s.clone();
    let thread = std::thread::Builder::new()
        .name("emq-js".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(ioerr("start the JetStream runtime"))?;
            rt.block_on(session(&settings, progress))
        })
        .map_err(ioerr("spawn the JetStream thread"))?;
    thread.join().unwrap_or_else(|_| Err(BenchError::Invalid("the JetStream thread panicked".into())))
}

/// Connects, makes the stream and consumer, measures, deletes the stream.
async fn session(s: &JetStreamSettings, progress: Arc<AtomicU64>) -> Result<JetStreamRun, BenchError> {
    let urls = s.nats_url.join(",");
    let client = async_nats::ConnectOptions::new()
        .name("emq-bench")
        .connection_timeout(CONNECT_TIMEOUT)
        .connect(s.nats_url.as_slice())
        .await
        .map_err(|e| nats(format!("connect to {urls}"), e))?;
    let js = jetstream::ContextBuilder::new()
        .timeout(JS_TIMEOUT)
        .max_ack_inflight(s.in_flight)
        .backpressure_on_inflight(true)
        .build(client);
    let name = s.stream_name();
    let mut stream = create_stream(&js, &name, s.replicas).await?;
    let measured = async {
        let consumer = create_consumer(&stream).await?;
        flow::measure(&js, &mut stream, &consumer, s, progress).await
    }
    .await;
    let deleted = retrying(&format!("delete stream {name}"), || js.delete_stream(&name)).await;
    let run = measured?;
    deleted?;
    Ok(run)
}

/// The stream, which must not exist yet, created.
async fn create_stream(js: &jetstream::Context, name: &str, replicas: usize) -> Result<stream::Stream, BenchError> {
    use jetstream::context::GetStreamErrorKind;
    let exists = retrying(&format!("look up stream {name}"), || async {
        match js.get_stream(name).await {
            Ok(_) => Ok(true),
            Err(e) => match e.kind() {
                GetStreamErrorKind::JetStream(j) if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND => {
                    Ok(false)
                }
                _ => Err(e),
            },
        }
    })
    .await?;
    if exists {
        return Err(BenchError::Nats {
            what: format!("stream {name}"),
            detail: "exists already (emq-bench deletes the stream it used: name a new one)".into(),
        });
    }
    let config = stream::Config {
        name: name.to_string(),
        subjects: vec![format!("{name}.>")],
        retention: stream::RetentionPolicy::WorkQueue,
        storage: stream::StorageType::File,
        num_replicas: replicas,
        duplicate_window: DEDUP_WINDOW,
        ..Default::default()
    };
    let what = format!("create stream {name} (R{replicas}, file, work queue)");
    retrying(&what, || js.create_stream(config.clone())).await
}

/// The durable pull consumer with explicit acks.
async fn create_consumer(stream: &stream::Stream) -> Result<consumer::PullConsumer, BenchError> {
    let config = consumer::pull::Config {
        durable_name: Some(CONSUMER.into()),
        ack_policy: consumer::AckPolicy::Explicit,
        ..Default::default()
    };
    retrying(&format!("create consumer {CONSUMER}"), || stream.create_consumer(config.clone())).await
}

/// `attempt` until it succeeds, backing off 50 ms doubling to 1 s; its last
/// error once [`SETUP_FOR`] has passed.
async fn retrying<T, E, F, Fut>(what: &str, mut attempt: F) -> Result<T, BenchError>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let deadline = Instant::now() + SETUP_FOR;
    let mut pause = RETRY_FIRST;
    loop {
        match attempt().await {
            Ok(value) => return Ok(value),
            Err(e) if Instant::now() + pause >= deadline => {
                return Err(BenchError::Nats {
                    what: what.into(),
                    detail: format!("{e} (still failing after {SETUP_FOR:?})"),
                })
            }
            Err(_) => tokio::time::sleep(pause).await,
        }
        pause = (pause * 2).min(RETRY_MAX);
    }
}

/// A [`BenchError::Nats`] for `what` with the client's error.
fn nats(what: String, e: impl std::fmt::Display) -> BenchError {
    BenchError::Nats { what, detail: e.to_string() }
}

impl JetStreamRun {
    /// The run as a report row: sent = published, received = consumed,
    /// duplicates = redelivered, accepted = PubAcks, errors = publish
    /// retries; jobs/s as the module docs define it; the latency columns
    /// (and the `.hgrm` file) are the PubAck latency. Every other figure is
    /// in `extra` (see `loadtest/README.md`).
    pub fn result(&self, s: &JetStreamSettings) -> RunResult {
        let jobs_per_s = if self.wall_s > 0.0 { self.consumed as f64 / self.wall_s } else { 0.0 };
        let mut extra = serde_json::json!({
            "mode": if self.concurrent { "concurrent" } else { "sequential" },
            "stream": self.stream,
            "replicas": s.replicas,
            "in_flight": s.in_flight,
            "size_bytes": s.size,
            "jobs": s.jobs,
            "published": self.published,
            "consumed": self.consumed,
            "lost": self.published.saturating_sub(self.consumed),
            "redelivered": self.redelivered,
            "foreign": self.foreign,
            "duplicate_pubacks": self.duplicate_pubacks,
            "publish_retries": self.retries.total(),
            "retries": self.retries,
            "fetch_errors": self.fetch_errors,
            "left_in_stream": self.left_in_stream,
            "publish_s": self.publish_s,
            "publish_msgs_per_s": per_s(self.published, self.publish_s),
            "puback_us": micros(&self.puback_us),
            "consume_s": self.consume_s,
            "consume_msgs_per_s": per_s(self.consumed, self.consume_s),
            "wall_s": self.wall_s,
            "jobs_per_s": jobs_per_s,
        });
        if let (Some(h), Some(m)) = (&self.delivery_us, extra.as_object_mut()) {
            m.insert("delivery_us".into(), micros(h));
        }
        self.cpu_figures(&mut extra);
        RunResult {
            target: s.target_name.clone(),
            sent: self.published,
            received: self.consumed,
            lost: self.published.saturating_sub(self.consumed),
            duplicates: self.redelivered,
            accepted: self.published,
            errors: self.retries.total(),
            warmup_sent: 0,
            elapsed_s: self.wall_s,
            throughput_per_s: jobs_per_s,
            latency_ms: Percentiles::of(&self.puback_us),
            ack_latency_ms: None,
            extra: Some(extra),
            histogram: self.puback_us.clone(),
        }
    }

    /// `client_cpu_us_per_job` and, with server PIDs, `server_cpu_s` and
    /// `server_cpu_us_per_job`, over the whole run and (sequential) per
    /// phase as `…_publish`, `…_consume`.
    fn cpu_figures(&self, extra: &mut serde_json::Value) {
        let Some(m) = extra.as_object_mut() else { return };
        let jobs = self.published.max(1) as f64;
        let total = self.cpu.iter().fold(CpuUse::default(), |t, (_, c)| CpuUse {
            client_s: t.client_s + c.client_s,
            servers_s: c.servers_s.map(|s| s + t.servers_s.unwrap_or(0.0)),
        });
        let phases = if self.cpu.len() > 1 { self.cpu.as_slice() } else { &[] };
        for (suffix, c) in std::iter::once(("", &total)).chain(phases.iter().map(|(p, c)| (*p, c))) {
            let key = |k: &str| if suffix.is_empty() { k.to_string() } else { format!("{k}_{suffix}") };
            m.insert(key("client_cpu_us_per_job"), (c.client_s / jobs * 1e6).into());
            if let Some(servers) = c.servers_s {
                m.insert(key("server_cpu_s"), servers.into());
                m.insert(key("server_cpu_us_per_job"), (servers / jobs * 1e6).into());
            }
        }
    }
}

fn per_s(n: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        n as f64 / secs
    } else {
        0.0
    }
}

/// p50, p90, p99, p99.9 and max of a histogram in microseconds.
fn micros(h: &Histogram<u64>) -> serde_json::Value {
    serde_json::json!({
        "count": h.len(),
        "p50": h.value_at_quantile(0.5),
        "p90": h.value_at_quantile(0.9),
        "p99": h.value_at_quantile(0.99),
        "p999": h.value_at_quantile(0.999),
        "max": h.max(),
    })
}
