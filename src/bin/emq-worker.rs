//! `emq-worker`: an eMQP worker for any language. Each job runs a command:
//!
//! ```text
//! emq-worker --queue email:10 --queue default:1 --concurrency 4 --timeout 30s \
//!            [--backend tcp://127.0.0.1:47290 --backend tcp://backup:47290] -- ./handle-job.sh args…
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
//! * Settings: flags, `EMQ_*` variables or `--config` (`--print-config`
//!   shows them); the command is checked at start (it must exist and be
//!   executable).

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use clap::Parser;
use emq::client::worker::{Job, JobError, Worker, WorkerConfig, WorkerStats};
use emq::config::{self, ConfigArgs, RawWorkerConfig};
use emq::limits;

/// A worker for any language: serves eMQP queues of an emq (or EventMQ)
/// router and runs a command for every job, the job's payload on its stdin,
/// its stdout as the result.
#[derive(Parser)]
#[command(version)]
struct Args {
    #[command(flatten)]
    config: ConfigArgs,
    #[command(flatten)]
    raw: RawWorkerConfig,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required_unless_present = "print_config")]
    command: Vec<String>,
}

fn main() {
    emq::program::exit_on_error("emq-worker", run());
}

fn run() -> anyhow::Result<()> {
    let args = Args::parse();
    let Some(settings) = config::start(&args.config, args.raw)? else { return Ok(()) };
    let program = executable(&args.command)?;
    let mut config = WorkerConfig::new(&settings.backend[0]).queues(settings.queues).concurrency(settings.concurrency);
    config.addresses = settings.backend;
    config.drain_timeout = settings.drain_timeout;
    config.heartbeat_timeout = settings.silence_timeout / 3;
    let mut command = args.command;
    command[0] = program.to_string_lossy().into_owned();
    let command = Arc::new(command);
    let default_timeout = settings.timeout;
    let worker = Worker::start(config, move |job| run_job(&command, &job, job.timeout().unwrap_or(default_timeout)))?;
    let stopper = worker.stopper();
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT])?;
    let handle = signals.handle();
    std::thread::spawn(move || {
        if signals.forever().next().is_some() {
            stopper.stop();
        }
    });
    report_periodically(&worker, settings.stats_interval);
    handle.close();
    let stats = worker.join()?;
    eprintln!("emq-worker: {}", summary(&stats));
    Ok(())
}

/// The command's program as a path that exists and may be run: a name
/// without `/` is looked up on `PATH`, like the shell does. Checked once at
/// start, so a typo fails here instead of failing every job.
fn executable(command: &[String]) -> anyhow::Result<PathBuf> {
    let Some(name) = command.first() else { bail!("no command: give one after --") };
    if name.contains('/') {
        let path = PathBuf::from(name);
        return match runnable(&path) {
            Ok(()) => Ok(path),
            Err(why) => bail!("command {name:?} {why}"),
        };
    }
    let dirs = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&dirs) {
        let path = dir.join(name);
        if runnable(&path).is_ok() {
            return Ok(path);
        }
    }
    bail!("command {name:?} not found on PATH (give its path, e.g. ./{name})")
}

/// Whether `path` is a file this process may execute; why not, otherwise.
fn runnable(path: &Path) -> Result<(), String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot be run: {e}"))?;
    if !meta.is_file() {
        return Err("is not a file".into());
    }
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return Err("has a NUL byte in its name".into());
    };
    // SAFETY: access(2) reads the NUL-terminated path and touches nothing else.
    let may_run = unsafe { libc::access(c_path.as_ptr(), libc::X_OK) } == 0;
    if !may_run || meta.permissions().mode() & 0o111 == 0 {
        return Err(format!("is not executable (chmod +x {})", path.display()));
    }
    Ok(())
}

fn report_periodically(worker: &Worker, every: Option<Duration>) {
    let every = every.unwrap_or(Duration::MAX);
    let mut next = Instant::now().checked_add(every);
    while !worker.is_finished() {
        std::thread::sleep(Duration::from_millis(200));
        if let Some(due) = next.filter(|due| Instant::now() >= *due) {
            next = due.checked_add(every);
            tracing::info!("{}", summary(&worker.stats()));
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
