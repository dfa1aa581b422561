//! `emq-worker`: an eMQP worker for any language. Each job runs a command:
//!
//! ```text
//! emq-worker --queue email:10 --queue default:1 --concurrency 4 --timeout 30s \
//!            [--router tcp://127.0.0.1:47290 --router tcp://backup:47290] -- ./handle-job.sh args…
//! ```
//!
//! * The job's payload (the REQUEST body frame) goes to the child's stdin;
//!   `EMQ_MSGID`, `EMQ_QUEUE` and `EMQ_HEADERS` are in its environment.
//! * Exit status 0 is success and stdout becomes the result (`{"value": "<stdout>"}`);
//!   any other exit fails the job (result: `command failed: exit status: N`).
//!   The child's stderr is ours (the worker's log).
//! * Past the timeout (the job's `timeout:N` header, else `--timeout`) the
//!   child's whole process group is killed and the job counts as timed out.
//! * SIGTERM/SIGINT: KBYE, running jobs finish (up to `--drain-timeout`), counters printed.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use emq::client::worker::{Job, JobError, Worker, WorkerConfig, WorkerStats};
use emq::limits;

/// Run a command for every eMQP job.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    /// Queue as NAME or NAME:WEIGHT (weight default 10); repeat for several.
    /// None = the router's default queues.
    #[arg(long = "queue", short = 'Q')]
    queues: Vec<String>,
    /// Jobs run at once (at least 1).
    #[arg(long, short = 'J', default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..))]
    concurrency: u64,
    /// Per-job time limit when the job has no `timeout:N` header.
    #[arg(long, default_value = "300s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// Router backend address; repeat for failover (each reconnect moves on).
    #[arg(long = "router", short = 'B', env = "EMQ_BACKEND_ADDR", default_value = limits::BACKEND_ADDR)]
    routers: Vec<String>,
    /// Longest wait for running jobs at shutdown.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    drain_timeout: Duration,
    /// Router silence before reconnecting under a new identity.
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    silence_timeout: Duration,
    /// Period of the counters log line (0 = only on exit).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    stats_interval: Duration,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

fn parse_queue(spec: &str) -> anyhow::Result<(i64, String)> {
    let (name, weight) = match spec.rsplit_once(':') {
        Some((n, w)) => {
            (n, w.parse::<i64>().with_context(|| format!("queue {spec:?}: weight {w:?} is not an integer"))?)
        }
        None => (spec, limits::DEFAULT_QUEUE_WEIGHT),
    };
    if name.is_empty() {
        bail!("queue {spec:?}: empty name");
    }
    Ok((weight, name.to_string()))
}

fn main() -> anyhow::Result<()> {
    emq::logging::init_from_env();
    let args = Args::parse();
    let queues = args.queues.iter().map(|q| parse_queue(q)).collect::<anyhow::Result<Vec<_>>>()?;
    let mut config = WorkerConfig::new(&args.routers[0]).queues(queues).concurrency(args.concurrency as usize);
    config.addresses = args.routers.clone();
    config.drain_timeout = args.drain_timeout;
    config.heartbeat_timeout = args.silence_timeout / 3;
    let command = Arc::new(args.command.clone());
    let default_timeout = args.timeout;
    let worker = Worker::start(config, move |job| run_job(&command, &job, job.timeout().unwrap_or(default_timeout)))?;
    let stopper = worker.stopper();
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT])?;
    let handle = signals.handle();
    std::thread::spawn(move || {
        if signals.forever().next().is_some() {
            stopper.stop();
        }
    });
    report_periodically(&worker, args.stats_interval);
    handle.close();
    let stats = worker.join()?;
    eprintln!("emq-worker: {}", summary(&stats));
    Ok(())
}

fn report_periodically(worker: &Worker, every: Duration) {
    let mut next = Instant::now() + every;
    while !worker.is_finished() {
        std::thread::sleep(Duration::from_millis(200));
        if !every.is_zero() && Instant::now() >= next {
            tracing::info!("{}", summary(&worker.stats()));
            next += every;
        }
    }
}

fn summary(s: &WorkerStats) -> String {
    format!(
        "jobs ok={} failed={} timed_out={}; malformed={} reconnects={} ready_sent={} replies_sent={} send_failed={}",
        s.succeeded, s.failed, s.timed_out, s.malformed, s.reconnects, s.ready_sent, s.replies_sent, s.send_failed
    )
}

/// Runs the command for one job: payload on stdin, stdout as the result.
fn run_job(command: &[String], job: &Job, timeout: Duration) -> Result<Vec<u8>, JobError> {
    let msgid = String::from_utf8_lossy(&job.msgid).into_owned();
    let mut child = Command::new(&command[0])
        .args(&command[1..])
        .env("EMQ_MSGID", &msgid)
        .env("EMQ_QUEUE", String::from_utf8_lossy(&job.queue).as_ref())
        .env("EMQ_HEADERS", String::from_utf8_lossy(&job.headers).as_ref())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| {
            tracing::warn!(msgid, command = %command[0], error = %e, "job failed: cannot start the command");
            JobError::Failed(format!("cannot start {:?}: {e}", command[0]))
        })?;
    let pid = child.id();
    let stdin = child.stdin.take();
    let body = job.body.clone();
    // Writer thread: a child that never reads stdin must not block us.
    std::thread::spawn(move || {
        if let Some(mut s) = stdin {
            let _ = s.write_all(&body);
        }
    });
    let stdout = child.stdout.take();
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        if let Some(s) = stdout {
            let _ = s.take(limits::WORKER_MAX_RESULT_BYTES as u64).read_to_end(&mut out);
        }
        out
    });
    let (status_tx, status_rx) = crossbeam_channel::bounded(1);
    std::thread::spawn(move || {
        let _ = status_tx.send(child.wait());
    });
    let status = match status_rx.recv_timeout(timeout) {
        Ok(Ok(status)) => status,
        Ok(Err(e)) => return Err(JobError::Failed(format!("cannot wait for the command: {e}"))),
        Err(_) => {
            // SAFETY: kill(2) with a negative pid signals the process group we
            // created for this child (process_group(0)); it touches no memory.
            unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
            let _ = status_rx.recv();
            tracing::warn!(msgid, ?timeout, "job timed out: process group killed");
            return Err(JobError::Timeout);
        }
    };
    let out = reader.join().unwrap_or_default();
    if status.success() {
        Ok(out)
    } else {
        tracing::warn!(msgid, %status, "job failed");
        Err(JobError::Failed(format!("command failed: {status}")))
    }
}
