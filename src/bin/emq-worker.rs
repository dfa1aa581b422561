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
//! * The timeout (the job's `timeout:N` header, else `--timeout`) covers the
//!   whole job: the command must have exited and its stdout reached its end
//!   (a background child holding it open counts) by then, else the child's
//!   whole process group is killed and the job counts as timed out.
//! * Stdout over [`limits::WORKER_MAX_OUTPUT_BYTES`]: the process group is
//!   killed and the job fails (`output over 15728640 bytes: job killed`).
//! * A result whose REPLY would be over `--max-reply-bytes` (default
//!   [`limits::WORKER_MAX_REPLY_BYTES`], for a router on its default
//!   `max_message_bytes`) once JSON-encoded is replaced by a failed REPLY
//!   naming its size and the limit.
//! * SIGTERM, SIGINT or SIGHUP ([`emq::program::stop_signals`]): KBYE,
//!   running jobs finish (up to `--drain-timeout`);
//!   then their process groups get SIGTERM, SIGKILL after
//!   [`limits::WORKER_KILL_GRACE`], and each job is reported failed to the
//!   router (which retries it on another worker instead of holding it for
//!   its `kbye_grace`); counters printed.
//! * Settings: flags, `EMQ_*` variables or `--config` (`--print-config`
//!   shows them); the command is checked at start (it must exist and be
//!   executable).

use std::collections::HashSet;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use clap::Parser;
use emq::client::worker::{DrainTimeoutHook, Job, JobError, Worker, WorkerConfig, WorkerStats};
use emq::config::{self, ConfigArgs, RawWorkerConfig};
use emq::limits;
use parking_lot::Mutex;

/// A worker for any language: serves eMQP queues of an emq (or EventMQ)
/// router and runs a command for every job, the job's payload on its stdin,
/// its stdout as the result. SIGTERM, SIGINT and SIGHUP stop it: KBYE, then
/// running jobs get `--drain-timeout`.
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
    let running = Arc::new(Running::default());
    let stopper = running.clone();
    config.on_drain_timeout = Some(DrainTimeoutHook(Arc::new(move || stopper.stop_all())));
    config.abandon_wait = limits::WORKER_ABANDON_WAIT;
    config.max_reply_bytes = settings.max_reply_bytes;
    let addresses = emq::config::addr::emqp_list(&config.addresses.join(","))?.len();
    config.curve = emq::curve::ClientCurve::from_settings(
        settings.curve_key_file.as_deref(),
        settings.curve_server_key.as_deref(),
        addresses,
    )?;
    let mut command = args.command;
    command[0] = program.to_string_lossy().into_owned();
    let command = Arc::new(command);
    let default_timeout = settings.timeout;
    let worker = Worker::start(config, move |job| run_job(&command, &job, job.time_limit(default_timeout), &running))?;
    let stopper = worker.stopper();
    let mut signals = signal_hook::iterator::Signals::new(emq::program::stop_signals())?;
    let handle = signals.handle();
    std::thread::spawn(move || {
        if signals.forever().next().is_some() {
            stopper.stop();
        }
    });
    report_periodically(&worker, settings.stats_interval);
    handle.close();
    let stats = worker.join()?;
    emq::program::diagnostic(format_args!("emq-worker: {}", summary(&stats)));
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
        "jobs ok={} failed={} timed_out={} abandoned={}; malformed={} reconnects={} ready_sent={} replies_sent={} \
         send_failed={} oversized_results={} peak_busy={} over_limit={} slots_moved={}",
        s.succeeded,
        s.failed,
        s.timed_out,
        s.abandoned,
        s.malformed,
        s.reconnects,
        s.ready_sent,
        s.replies_sent,
        s.send_failed,
        s.oversized_results,
        s.peak_busy,
        s.over_limit,
        s.slots_moved
    )
}

/// The process groups of the commands running now, so that the drain
/// timeout can stop them. A group is registered from its command's start
/// until just before its leader is reaped, so a signal never reaches a
/// reused process id.
#[derive(Default)]
struct Running {
    groups: Mutex<HashSet<i32>>,
    /// Set at the drain timeout: commands that end now were stopped.
    stopping: AtomicBool,
}

impl Running {
    /// The drain-timeout hook: SIGTERM to every running command's process
    /// group now, SIGKILL to those still registered after
    /// [`limits::WORKER_KILL_GRACE`]. Returns at once.
    fn stop_all(self: &Arc<Self>) {
        self.stopping.store(true, Ordering::SeqCst);
        let count = self.signal_all(libc::SIGTERM);
        tracing::warn!(count, grace = ?limits::WORKER_KILL_GRACE, "drain timeout: SIGTERM to the running commands' process groups");
        let me = self.clone();
        let killer = std::thread::Builder::new().name("emq-worker-kill".into()).spawn(move || {
            std::thread::sleep(limits::WORKER_KILL_GRACE);
            let count = me.signal_all(libc::SIGKILL);
            if count > 0 {
                tracing::warn!(count, "drain timeout: SIGKILL to the process groups still running");
            }
        });
        if let Err(e) = killer {
            tracing::error!(error = %e, "cannot start the SIGKILL timer: SIGKILL now");
            self.signal_all(libc::SIGKILL);
        }
    }

    fn signal_all(&self, signal: libc::c_int) -> usize {
        let groups = self.groups.lock();
        for &pgid in groups.iter() {
            kill_group(pgid, signal);
        }
        groups.len()
    }

    /// Registers a command's process group; if the worker is already
    /// stopping, kills it at once.
    fn register(&self, pgid: i32) {
        let mut groups = self.groups.lock();
        groups.insert(pgid);
        if self.stopping.load(Ordering::SeqCst) {
            kill_group(pgid, libc::SIGKILL);
        }
    }

    fn unregister(&self, pgid: i32) {
        self.groups.lock().remove(&pgid);
    }
}

/// Sends `signal` to the process group `pgid`.
fn kill_group(pgid: i32, signal: libc::c_int) {
    // SAFETY: kill(2) with a negative pid signals the process group we
    // created for a command (process_group(0)); it touches no memory.
    unsafe { libc::kill(-pgid, signal) };
}

/// Why a job's command was stopped before it finished.
enum Cut {
    /// The deadline passed.
    Deadline,
    /// Its stdout went over [`limits::WORKER_MAX_OUTPUT_BYTES`].
    TooMuchOutput,
    /// Reading or waiting failed.
    Io(&'static str, std::io::Error),
}

/// Runs the command for one job: payload on stdin, stdout as the result.
/// Everything (writing the payload, reading stdout to its end, waiting for
/// the exit) is bounded by the job's time limit (`None`: no limit).
fn run_job(command: &[String], job: &Job, timeout: Option<Duration>, running: &Running) -> Result<Vec<u8>, JobError> {
    let msgid = String::from_utf8_lossy(&job.msgid).into_owned();
    // A deadline too far to represent is no deadline (`timeout:N` is any u64).
    let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
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
    let pid = child.id() as i32;
    running.register(pid);
    let (stdin, stdout) = (child.stdin.take(), child.stdout.take());
    let result = match pump(stdin, &job.body, stdout, deadline) {
        Ok(out) => match wait_exit(pid, deadline) {
            Ok(()) => Ok(out),
            Err(cut) => Err(cut),
        },
        Err(cut) => Err(cut),
    };
    let out = match result {
        Ok(out) => out,
        Err(cut) => {
            // Not reaped yet: the group and the pid are still ours.
            kill_group(pid, libc::SIGKILL);
            let _ = child.kill();
            running.unregister(pid);
            reap_later(child);
            return Err(match cut {
                Cut::Deadline => {
                    tracing::warn!(msgid, ?timeout, "job timed out: process group killed");
                    JobError::Timeout
                }
                Cut::TooMuchOutput => {
                    let max = limits::WORKER_MAX_OUTPUT_BYTES;
                    tracing::warn!(msgid, max, "job failed: output over the limit, process group killed");
                    JobError::Failed(format!("output over {max} bytes: job killed"))
                }
                Cut::Io(what, e) => {
                    tracing::warn!(msgid, error = %e, "job failed: cannot {what} the command, process group killed");
                    JobError::Failed(format!("cannot {what} the command: {e}"))
                }
            });
        }
    };
    running.unregister(pid);
    let status = child.wait().map_err(|e| JobError::Failed(format!("cannot wait for the command: {e}")))?;
    if status.success() {
        Ok(out)
    } else if running.stopping.load(Ordering::SeqCst) {
        tracing::warn!(msgid, %status, "job stopped at the drain timeout");
        Err(JobError::Failed(format!("stopped at the worker's drain timeout: {status}")))
    } else {
        tracing::warn!(msgid, %status, "job failed");
        Err(JobError::Failed(format!("command failed: {status}")))
    }
}

/// Reaps a killed command on a thread of its own, so that the job does not
/// wait even for that.
fn reap_later(mut child: Child) {
    let spawned = std::thread::Builder::new().name("emq-worker-reap".into()).spawn(move || {
        let _ = child.wait();
    });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start a thread to reap a killed command: it stays a zombie");
    }
}

/// Makes a pipe end non-blocking (ours alone: the command has the other end).
fn set_nonblocking(fd: i32) -> std::io::Result<()> {
    // SAFETY: fcntl(2) on a descriptor we own; no memory is passed.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Milliseconds for poll(2) until `deadline` (rounded up; -1: none).
fn poll_ms(deadline: Option<Instant>) -> Option<i32> {
    let Some(deadline) = deadline else { return Some(-1) };
    let left = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero())?;
    Some(left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32)
}

/// Writes `body` to the command's stdin and reads its stdout to the end,
/// both at once (a command may write before it reads), until `deadline`.
/// A command that stops reading its stdin early is not an error.
fn pump(
    stdin: Option<ChildStdin>,
    body: &[u8],
    stdout: Option<ChildStdout>,
    deadline: Option<Instant>,
) -> Result<Vec<u8>, Cut> {
    let mut stdin = stdin.filter(|_| !body.is_empty());
    let Some(mut stdout) = stdout else { return Err(Cut::Io("read", ErrorKind::BrokenPipe.into())) };
    set_nonblocking(stdout.as_raw_fd()).map_err(|e| Cut::Io("read", e))?;
    if let Some(s) = &stdin {
        set_nonblocking(s.as_raw_fd()).map_err(|e| Cut::Io("write to", e))?;
    }
    let (mut written, mut out) = (0, Vec::new());
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let mut fds = vec![libc::pollfd { fd: stdout.as_raw_fd(), events: libc::POLLIN, revents: 0 }];
        if let Some(s) = &stdin {
            fds.push(libc::pollfd { fd: s.as_raw_fd(), events: libc::POLLOUT, revents: 0 });
        }
        let Some(ms) = poll_ms(deadline) else { return Err(Cut::Deadline) };
        // SAFETY: `fds` is a live array of `fds.len()` pollfd structs.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == ErrorKind::Interrupted {
                continue;
            }
            return Err(Cut::Io("read", e));
        }
        if fds.get(1).is_some_and(|f| f.revents != 0) {
            if let Some(s) = stdin.as_mut() {
                match s.write(&body[written..]) {
                    Ok(n) => written += n,
                    Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {}
                    // The command closed its stdin (EPIPE): it read what it wanted.
                    Err(_) => written = body.len(),
                }
                if written >= body.len() {
                    stdin = None;
                }
            }
        }
        if fds[0].revents != 0 {
            match stdout.read(&mut buf) {
                Ok(0) => return Ok(out),
                Ok(n) => {
                    if out.len() + n > limits::WORKER_MAX_OUTPUT_BYTES {
                        return Err(Cut::TooMuchOutput);
                    }
                    out.extend_from_slice(&buf[..n]);
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {}
                Err(e) => return Err(Cut::Io("read", e)),
            }
        }
    }
}

/// Waits until the command `pid` has exited, without reaping it (so its
/// process group stays ours to signal), until `deadline`.
fn wait_exit(pid: i32, deadline: Option<Instant>) -> Result<(), Cut> {
    let mut pause = Duration::from_millis(1);
    loop {
        // SAFETY: a zeroed siginfo_t is a valid out-parameter for waitid(2).
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let flags = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
        // SAFETY: waitid(2) writes only into `info`; WNOWAIT leaves the child unreaped.
        if unsafe { libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, flags) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == ErrorKind::Interrupted {
                continue;
            }
            return Err(Cut::Io("wait for", e));
        }
        // SAFETY: after a successful waitid(2), si_pid is set (0: not exited yet).
        if unsafe { info.si_pid() } != 0 {
            return Ok(());
        }
        let left = match deadline {
            None => pause,
            Some(d) => match d.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()) {
                Some(left) => left,
                None => return Err(Cut::Deadline),
            },
        };
        std::thread::sleep(pause.min(left));
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}
