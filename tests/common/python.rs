//! The real Python EventMQ 0.3.13 as a test peer: its venv, jobmanagers and
//! the client driver scripts in `tests/interop/`.
//!
//! [`venv`] runs `tests/interop/setup-venv.sh` once per test binary (it is
//! idempotent and locked, so this is quick when the venv exists). If the venv
//! cannot be created the calling test **fails** with the script's output: the
//! interop tests never skip silently.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use super::proc::{self, Child, TestDir};

/// How long a driver script may run before the test gives up on it.
pub const SCRIPT_TIMEOUT: Duration = Duration::from_secs(120);

/// The project root (where Cargo.toml is).
pub fn project_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `tests/interop/`: job functions, driver scripts, setup script.
pub fn interop_dir() -> PathBuf {
    project_root().join("tests").join("interop")
}

/// The venv with eventmq 0.3.13 (`$EMQ_VENV` or `<project>/.venv`), created
/// by `tests/interop/setup-venv.sh` on first use. Panics with the script's
/// output if it cannot be created.
pub fn venv() -> PathBuf {
    static VENV: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let ready = VENV.get_or_init(|| {
        let script = interop_dir().join("setup-venv.sh");
        let out = Command::new("bash")
            .arg(&script)
            .output()
            .map_err(|e| format!("cannot run bash {}: {e}", script.display()))?;
        if !out.status.success() {
            return Err(format!(
                "{} failed ({}):\n{}{}",
                script.display(),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(std::env::var_os("EMQ_VENV").map(PathBuf::from).unwrap_or_else(|| project_root().join(".venv")))
    });
    match ready {
        Ok(path) => path.clone(),
        Err(why) => panic!("the Python EventMQ venv needed by the interop tests could not be created: {why}"),
    }
}

/// A command running `<venv>/bin/<program>` with the interop environment:
/// no inherited `EVENTMQ_*` settings, no config file, the job module on
/// `PYTHONPATH`, unbuffered output, and no hard exit when `redis` is missing.
pub fn venv_cmd(program: &str) -> Command {
    let mut cmd = Command::new(venv().join("bin").join(program));
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("EVENTMQ_") {
            cmd.env_remove(key);
        }
    }
    cmd.current_dir(interop_dir())
        .env("EVENTMQ_CONFIG_FILE", "/nonexistent/emq-interop.conf")
        .env("EVENTMQ_REDIS_STARTUP_ERROR_HARD_KILL", "false")
        .env("PYTHONPATH", interop_dir())
        .env("PYTHONUNBUFFERED", "1")
        .env("PYTHONDONTWRITEBYTECODE", "1");
    cmd
}

/// A command running the driver script `tests/interop/<script>` with the
/// venv's python (see [`venv_cmd`]).
pub fn script_cmd(script: &str) -> Command {
    let mut cmd = venv_cmd("python");
    cmd.arg(interop_dir().join(script));
    cmd
}

/// Runs a driver script to completion; panics (with its output) unless it
/// exits 0 within [`SCRIPT_TIMEOUT`]. Returns its stdout.
pub fn run_script(dir: &TestDir, name: &str, cmd: &mut Command) -> String {
    let (status, out, err) = proc::run(name, cmd, &dir.path, SCRIPT_TIMEOUT);
    match status {
        Some(s) if s.success() => out,
        Some(s) => panic!("{name} failed ({s}):\nstdout:\n{out}\nstderr:\n{err}"),
        None => panic!("{name} did not finish within {SCRIPT_TIMEOUT:?}:\nstdout:\n{out}\nstderr:\n{err}"),
    }
}

/// Starts a real `emq-jobmanager -J <concurrency>` connected to `backend`,
/// serving `queues_json` (`EVENTMQ_QUEUES`, e.g. `[[10,"default"]]`; the
/// `-Q` flag is ignored in 0.3.13). Its worker processes
/// inherit `INTEROP_JM=<label>`, which the job functions write into each
/// line. Log: `<dir>/jm-<label>.log`.
pub fn start_jobmanager(dir: &TestDir, backend: &str, label: &str, queues_json: &str, concurrency: u32) -> Child {
    spawn_jobmanager(dir, venv_cmd("emq-jobmanager"), backend, label, queues_json, concurrency)
}

/// `scripts/emq-curve-launch.py` with the venv's python and the interop
/// environment (see [`venv_cmd`]), set up to run the Python script
/// `program` (add its arguments) as a CURVE client with `key` (a
/// `.key_secret`) and the server's public `server_key` (a `.key` file).
pub fn curve_launch_cmd(key: &Path, server_key: &Path, program: &Path) -> Command {
    let mut cmd = venv_cmd("python");
    cmd.arg(project_root().join("scripts").join("emq-curve-launch.py"))
        .arg("--key-file")
        .arg(key)
        .arg("--server-key")
        .arg(server_key)
        .arg("--")
        .arg(program);
    cmd
}

/// Like [`start_jobmanager`], the unchanged `emq-jobmanager` running under
/// `scripts/emq-curve-launch.py` as a CURVE client of `backend` (see
/// [`curve_launch_cmd`]).
pub fn start_curve_jobmanager(
    dir: &TestDir,
    (key, server_key): (&Path, &Path),
    backend: &str,
    label: &str,
    queues_json: &str,
) -> Child {
    let cmd = curve_launch_cmd(key, server_key, &venv().join("bin").join("emq-jobmanager"));
    spawn_jobmanager(dir, cmd, backend, label, queues_json, 1)
}

fn spawn_jobmanager(
    dir: &TestDir,
    mut cmd: Command,
    backend: &str,
    label: &str,
    queues_json: &str,
    concurrency: u32,
) -> Child {
    cmd.args(["-J", &concurrency.to_string()])
        .env("EVENTMQ_WORKER_ADDR", backend)
        .env("EVENTMQ_WORKER_ADDR_DEFAULT", backend)
        .env("EVENTMQ_WORKER_ADDR_FAILOVER", backend)
        .env("EVENTMQ_QUEUES", queues_json)
        .env("INTEROP_JM", label);
    Child::spawn(&format!("jobmanager-{label}"), &mut cmd, &dir.join(&format!("jm-{label}.log")))
}

/// Starts a real `emq-scheduler` connected to `frontend` (no redis server:
/// its persistence attempts go to a closed port and only log warnings).
/// Log: `<dir>/scheduler.log`.
pub fn start_scheduler(dir: &TestDir, frontend: &str) -> Child {
    spawn_scheduler(dir, frontend, "scheduler")
}

/// Like [`start_scheduler`], for tests running several schedulers: the
/// process is named `scheduler-<label>`, its log is
/// `<dir>/scheduler-<label>.log` (it logs each `Received new SCHEDULE
/// request: [...]` at INFO level, job arguments included).
pub fn start_scheduler_labelled(dir: &TestDir, frontend: &str, label: &str) -> Child {
    spawn_scheduler(dir, frontend, &format!("scheduler-{label}"))
}

fn spawn_scheduler(dir: &TestDir, frontend: &str, name: &str) -> Child {
    let mut cmd = venv_cmd("emq-scheduler");
    cmd.env("EVENTMQ_SCHEDULER_ADDR", frontend)
        .env("EVENTMQ_RQ_HOST", "127.0.0.1")
        .env("EVENTMQ_RQ_PORT", super::ports::free_port().to_string())
        .env("INTEROP_JM", "S");
    Child::spawn(name, &mut cmd, &dir.join(&format!("{name}.log")))
}

/// One job handed to the broker by [`send_jobs`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentJob {
    /// `<prefix>-<i:05>-<queue>`, written by the job into the jobs file.
    pub tag: String,
    /// The queue it was sent to.
    pub queue: String,
    /// The REQUEST msgid.
    pub msgid: String,
}

/// Sends `count` jobs with the real Python client (`defer_job`), job i to
/// `queues[i % len]`; each job appends to `out` (a `run` line, or `start` and
/// `done` lines around `sleep` seconds). Panics unless all were sent.
pub fn send_jobs(
    dir: &TestDir,
    frontend: &str,
    out: &Path,
    count: usize,
    queues: &[&str],
    prefix: &str,
    sleep: Option<f64>,
) -> Vec<SentJob> {
    let mut cmd = script_cmd("emq_send_jobs.py");
    cmd.args([
        "--frontend",
        frontend,
        "--count",
        &count.to_string(),
        "--queues",
        &queues.join(","),
        "--prefix",
        prefix,
    ])
    .arg("--out")
    .arg(out);
    if let Some(secs) = sleep {
        cmd.args(["--sleep", &secs.to_string()]);
    }
    let stdout = run_script(dir, &format!("send-{prefix}"), &mut cmd);
    let sent: Vec<SentJob> = stdout
        .lines()
        .filter_map(|line| {
            let mut it = line.strip_prefix("sent ")?.split(' ');
            let (tag, queue, msgid) = (it.next()?, it.next()?, it.next()?);
            Some(SentJob { tag: tag.into(), queue: queue.into(), msgid: msgid.into() })
        })
        .collect();
    assert_eq!(sent.len(), count, "emq_send_jobs.py reported {} jobs sent, want {count}:\n{stdout}", sent.len());
    assert!(stdout.contains(&format!("total {count}")), "emq_send_jobs.py did not finish:\n{stdout}");
    sent
}

/// Sends SCHEDULE (every `interval` s) of `record(out, tag)` with the real
/// client (`messages.schedule`). Returns the msgid.
pub fn schedule(dir: &TestDir, frontend: &str, out: &Path, tag: &str, interval: u32) -> String {
    schedule_cmd(dir, frontend, out, tag, &["--interval", &interval.to_string()])
}

/// Sends UNSCHEDULE for `record(out, tag)` (`messages.schedule(...,
/// unschedule=True)`; `jobs.unschedule` always raises in 0.3.13).
pub fn unschedule(dir: &TestDir, frontend: &str, out: &Path, tag: &str) -> String {
    schedule_cmd(dir, frontend, out, tag, &["--unschedule"])
}

/// Sends SCHEDULE of `record(out, tag)` on `queue` with the cron
/// expression `cron` (`messages.schedule(..., cron=cron, queue=queue)`).
/// Returns the msgid.
pub fn schedule_cron(dir: &TestDir, frontend: &str, out: &Path, tag: &str, queue: &str, cron: &str) -> String {
    schedule_cmd(dir, frontend, out, tag, &["--cron", cron, "--queue", queue])
}

/// Like [`unschedule`] for a job scheduled on `queue` (the schedule key
/// ignores the queue, docs/emqp.md "The scheduler"; the client call passes it anyway).
pub fn unschedule_from(dir: &TestDir, frontend: &str, out: &Path, tag: &str, queue: &str) -> String {
    schedule_cmd(dir, frontend, out, tag, &["--unschedule", "--queue", queue])
}

fn schedule_cmd(dir: &TestDir, frontend: &str, out: &Path, tag: &str, extra: &[&str]) -> String {
    let mut cmd = script_cmd("emq_schedule.py");
    cmd.args(["--frontend", frontend, "--tag", tag]).arg("--out").arg(out).args(extra);
    let name = format!("schedule{}-{tag}", extra[0]);
    let stdout = run_script(dir, &name, &mut cmd);
    stdout.trim().strip_prefix("msgid ").unwrap_or_else(|| panic!("{name}: no msgid in {stdout:?}")).to_string()
}

/// Sends `count` PUBLISH messages (`send_publish_request`) of `message_json`
/// on `topic` to a pub device at `addr`. Returns the msgids.
pub fn publish(dir: &TestDir, addr: &str, topic: &str, message_json: &str, count: usize) -> Vec<String> {
    let mut cmd = script_cmd("emq_publish.py");
    cmd.args(["--addr", addr, "--topic", topic, "--message", message_json, "--count", &count.to_string()]);
    let stdout = run_script(dir, &format!("publish-{topic}"), &mut cmd);
    let ids: Vec<String> = stdout.lines().filter_map(|l| l.strip_prefix("msgid ")).map(String::from).collect();
    assert_eq!(ids.len(), count, "emq_publish.py output:\n{stdout}");
    ids
}

/// Runs the real `emq-cli -a <admin>` with `commands` on stdin and returns
/// each printed answer, parsed from its Python dict repr into JSON
/// (`Null` when emq-cli printed `None`, i.e. got no reply within 1 s).
pub fn emq_cli(dir: &TestDir, admin: &str, commands: &[&str]) -> Vec<serde_json::Value> {
    let mut cmd = script_cmd("emq_cli.py");
    cmd.args(["--admin", admin]).args(commands);
    let stdout = run_script(dir, "emq-cli", &mut cmd);
    let answers: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap_or_else(|e| panic!("emq_cli.py line {l:?}: {e}")))
        .map(|v| v["answer"].clone())
        .collect();
    assert_eq!(answers.len(), commands.len(), "emq_cli.py output:\n{stdout}");
    answers
}
