//! Queue memory: fills one queue of a broker that has no worker for it with
//! N jobs (eMQP REQUESTs, or text SCHEDs), waits until the broker has taken
//! every one, and reports how much the broker's resident memory
//! (`VmRSS` from `/proc/<pid>/status`) grew per queued job, and its peak
//! (`VmHWM`) against the bytes of job bodies it admitted.
//!
//! eMQP: one DEALER pipelines REQUESTs (at most `WINDOW` unanswered) and
//! counts acceptance REPLYs; an `ERROR` ends the run unless
//! `--refusals-ok`, which counts `QUEUE_FULL` refusals and goes on (the
//! memory bound under a producer that keeps pushing). Text: one connection
//! pipelines `SCHED` lines and then waits for a barrier (an `ASK` whose
//! answer comes after every SCHED before it).
//!
//! `--hold N --backend ADDR` first registers a worker for the queue that
//! sends N READYs and never reads: the jobs go in flight to it and wait in
//! the router's socket towards it (a slow worker).

use std::time::{Duration, Instant};

use serde::Serialize;

use super::BenchError;
use crate::client::text::TextClient;
use crate::protocol::emqp::{new_msgid, VERSION};
use crate::protocol::text::ErrorCode;
use crate::zmq_error::ZmqError;

/// Most REQUESTs sent and not yet accepted.
const WINDOW: usize = 10_000;

/// What to fill.
#[derive(Debug, Clone, clap::Args, Serialize)]
pub struct FillSettings {
    /// The broker's eMQP frontend (REQUESTs); give this or `--text`.
    #[arg(long, value_parser = crate::config::addr::emqp_arg)]
    pub frontend: Option<String>,
    /// The broker's text address `HOST:PORT` (SCHEDs).
    #[arg(long, value_parser = crate::config::addr::text_arg)]
    pub text: Option<String>,
    /// Jobs to queue.
    #[arg(long, default_value_t = 1_000_000)]
    pub jobs: usize,
    /// Body size in bytes.
    #[arg(long, default_value_t = 64)]
    pub size: usize,
    /// Queue (no worker should serve it; a worker must have declared it for
    /// eMQP, or the jobs fall back to `default`, which is fine too).
    #[arg(long, default_value = "fill")]
    pub queue: String,
    /// The broker's process, whose resident memory is read.
    #[arg(long)]
    pub pid: u32,
    /// Refusals (`QUEUE_FULL`: a queue, memory or byte limit) are counted,
    /// not fatal.
    #[arg(long)]
    pub refusals_ok: bool,
    /// The broker's eMQP backend, for `--hold`.
    #[arg(long, value_parser = crate::config::addr::emqp_arg)]
    pub backend: Option<String>,
    /// Slots of a worker that never reads (READYs sent before the fill).
    #[arg(long, default_value_t = 0)]
    pub hold: usize,
    /// How long the whole fill may take.
    #[arg(long, default_value = "300s", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
}

/// The outcome.
#[derive(Debug, Clone, Serialize)]
pub struct FillResult {
    /// Jobs the broker took.
    pub jobs: usize,
    /// Jobs it refused (only with `--refusals-ok`).
    pub refused: usize,
    /// Body bytes of the jobs it took (`jobs` × `--size`).
    pub admitted_bytes: u64,
    /// Peak resident memory over the broker's life (`VmHWM`), in bytes.
    pub peak_rss_bytes: u64,
    /// Resident memory before, in bytes.
    pub rss_before_bytes: u64,
    /// Resident memory after, in bytes.
    pub rss_after_bytes: u64,
    /// (after − before) / jobs.
    pub bytes_per_job: f64,
    /// How long the fill took, in seconds.
    pub seconds: f64,
}

/// Resident memory of process `pid` in bytes (`VmRSS`).
///
/// # Errors
/// [`BenchError::Io`] or [`BenchError::Invalid`] when `/proc/<pid>/status`
/// cannot be read or has no `VmRSS` line.
pub fn rss_bytes(pid: u32) -> Result<u64, BenchError> {
    status_bytes(pid, "VmRSS:")
}

/// Peak resident memory of process `pid` in bytes (`VmHWM`).
///
/// # Errors
/// As [`rss_bytes`].
pub fn peak_rss_bytes(pid: u32) -> Result<u64, BenchError> {
    status_bytes(pid, "VmHWM:")
}

/// The `/proc/<pid>/status` line `key` (a size in kB), in bytes.
fn status_bytes(pid: u32, key: &str) -> Result<u64, BenchError> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).map_err(super::ioerr(format!("read {path}")))?;
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .ok_or_else(|| BenchError::Invalid(format!("{path} has no {key} line")))?;
    Ok(kb * 1024)
}

/// Fills the queue and measures.
///
/// # Errors
/// [`BenchError`] when the broker cannot be reached, refuses a job, or the
/// fill takes longer than the timeout.
pub fn run(s: &FillSettings) -> Result<FillResult, BenchError> {
    let before = rss_bytes(s.pid)?;
    let started = Instant::now();
    let deadline = started + s.timeout;
    let body = vec![b'x'; s.size];
    let ctx = zmq::Context::new();
    // Kept open (and unread) until the measurement is taken.
    let _holder = match (&s.backend, s.hold) {
        (_, 0) => None,
        (Some(backend), n) => Some(hold_worker(&ctx, backend, &s.queue, n)?),
        (None, _) => return Err(BenchError::Invalid("--hold needs --backend".into())),
    };
    let refused = match (&s.frontend, &s.text) {
        (Some(frontend), None) => fill_emqp(&ctx, frontend, s, &body, deadline)?,
        (None, Some(text)) => fill_text(text, s, &body, deadline)?,
        _ => return Err(BenchError::Invalid("give exactly one of --frontend and --text".into())),
    };
    let seconds = started.elapsed().as_secs_f64();
    // Let the broker's threads settle (allocator caches, pending frees).
    std::thread::sleep(Duration::from_millis(500));
    let after = rss_bytes(s.pid)?;
    let jobs = s.jobs - refused;
    let bytes_per_job = after.saturating_sub(before) as f64 / jobs.max(1) as f64;
    Ok(FillResult {
        jobs,
        refused,
        admitted_bytes: (jobs * s.size) as u64,
        peak_rss_bytes: peak_rss_bytes(s.pid)?,
        rss_before_bytes: before,
        rss_after_bytes: after,
        bytes_per_job,
        seconds,
    })
}

/// A worker for `queue` with `slots` READYs that never reads its socket.
fn hold_worker(ctx: &zmq::Context, backend: &str, queue: &str, slots: usize) -> Result<zmq::Socket, BenchError> {
    let w = ctx.socket(zmq::DEALER).map_err(ZmqError::at("socket"))?;
    w.set_linger(0).map_err(ZmqError::at("LINGER"))?;
    w.connect(backend).map_err(ZmqError::at(format!("connect {backend}")))?;
    let queues = serde_json::to_vec(&serde_json::json!([[10, queue]]))
        .map_err(|e| BenchError::Invalid(format!("queue list: {e}")))?;
    let inform: [&[u8]; 6] = [b"", VERSION, b"INFORM", &new_msgid(), &queues, b"worker"];
    w.send_multipart(inform, 0).map_err(ZmqError::at("send INFORM"))?;
    for _ in 0..slots {
        let ready: [&[u8]; 4] = [b"", VERSION, b"READY", &new_msgid()];
        w.send_multipart(ready, 0).map_err(ZmqError::at("send READY"))?;
    }
    // Let the router register the worker before jobs arrive.
    std::thread::sleep(Duration::from_millis(500));
    Ok(w)
}

/// Returns the number of refused jobs.
fn fill_emqp(
    ctx: &zmq::Context,
    frontend: &str,
    s: &FillSettings,
    body: &[u8],
    deadline: Instant,
) -> Result<usize, BenchError> {
    let d = ctx.socket(zmq::DEALER).map_err(ZmqError::at("socket"))?;
    d.set_linger(crate::limits::BENCH_LINGER_MS).map_err(ZmqError::at("LINGER"))?;
    d.set_sndhwm(0).map_err(ZmqError::at("SNDHWM"))?;
    d.set_rcvhwm(0).map_err(ZmqError::at("RCVHWM"))?;
    d.connect(frontend).map_err(ZmqError::at(format!("connect {frontend}")))?;
    let (mut sent, mut answered, mut refused) = (0usize, 0usize, 0usize);
    while answered < s.jobs {
        while sent < s.jobs && sent - answered < WINDOW {
            let frames: [&[u8]; 7] = [b"", VERSION, b"REQUEST", &new_msgid(), s.queue.as_bytes(), b"", body];
            d.send_multipart(frames, 0).map_err(ZmqError::at("send REQUEST"))?;
            sent += 1;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || d.poll(zmq::POLLIN, left.as_millis() as i64).map_err(ZmqError::at("poll"))? == 0 {
            return Err(BenchError::TargetDown(format!("{answered} of {} jobs answered in time", s.jobs)));
        }
        while let Ok(reply) = d.recv_multipart(zmq::DONTWAIT) {
            match reply.get(2).map(Vec::as_slice) {
                Some(b"REPLY") => answered += 1,
                Some(b"ERROR") => {
                    let code = reply.get(5).map(|c| String::from_utf8_lossy(c).into_owned()).unwrap_or_default();
                    if !(s.refusals_ok && code.starts_with("QUEUE_FULL")) {
                        return Err(BenchError::Invalid(format!("the broker refused job {answered}: {code}")));
                    }
                    answered += 1;
                    refused += 1;
                }
                _ => {}
            }
        }
    }
    Ok(refused)
}

/// Returns the number of refused jobs.
fn fill_text(addr: &str, s: &FillSettings, body: &[u8], deadline: Instant) -> Result<usize, BenchError> {
    let to = |e: crate::client::text::TextClientError| BenchError::Invalid(format!("text {addr}: {e}"));
    let timeout = deadline.saturating_duration_since(Instant::now());
    let mut c = TextClient::connect(addr, timeout).map_err(to)?;
    let mut left = s.jobs;
    while left > 0 {
        let n = left.min(10_000);
        c.pipeline_sched((0..n).map(|_| (body, Some(s.queue.as_str())))).map_err(to)?;
        left -= n;
    }
    // Errors of SCHEDs (QUEUE_FULL…) come back from the barrier as `Deferred`.
    match c.sync() {
        Ok(()) => Ok(0),
        Err(crate::client::text::TextClientError::Deferred(errors))
            if s.refusals_ok && errors.iter().all(|e| e.code == ErrorCode::QueueFull) =>
        {
            Ok(errors.len())
        }
        Err(e) => Err(to(e)),
    }
}
