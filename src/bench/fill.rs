//! Queue memory: fills one queue of a broker that has no worker for it with
//! N jobs (eMQP REQUESTs, or text SCHEDs), waits until the broker has taken
//! every one, and reports how much the broker's resident memory
//! (`VmRSS` from `/proc/<pid>/status`) grew per queued job.
//!
//! eMQP: one DEALER pipelines REQUESTs (at most [`WINDOW`] unanswered) and
//! counts acceptance REPLYs; an `ERROR` ends the run. Text: one connection
//! pipelines `SCHED` lines and then waits for a barrier (an `ASK` whose
//! answer comes after every SCHED before it).

use std::time::{Duration, Instant};

use serde::Serialize;

use super::BenchError;
use crate::client::text::TextClient;
use crate::protocol::emqp::{new_msgid, VERSION};
use crate::zmq_error::ZmqError;

/// Most REQUESTs sent and not yet accepted.
const WINDOW: usize = 10_000;

/// What to fill.
#[derive(Debug, Clone, clap::Args, Serialize)]
pub struct FillSettings {
    /// The broker's eMQP frontend (REQUESTs); give this or `--text`.
    #[arg(long)]
    pub frontend: Option<String>,
    /// The broker's text address `HOST:PORT` (SCHEDs).
    #[arg(long)]
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
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).map_err(super::ioerr(format!("read {path}")))?;
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .ok_or_else(|| BenchError::Invalid(format!("{path} has no VmRSS line")))?;
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
    match (&s.frontend, &s.text) {
        (Some(frontend), None) => fill_emqp(frontend, s, &body, deadline)?,
        (None, Some(text)) => fill_text(text, s, &body, deadline)?,
        _ => return Err(BenchError::Invalid("give exactly one of --frontend and --text".into())),
    }
    let seconds = started.elapsed().as_secs_f64();
    // Let the broker's threads settle (allocator caches, pending frees).
    std::thread::sleep(Duration::from_millis(500));
    let after = rss_bytes(s.pid)?;
    let bytes_per_job = after.saturating_sub(before) as f64 / s.jobs.max(1) as f64;
    Ok(FillResult { jobs: s.jobs, rss_before_bytes: before, rss_after_bytes: after, bytes_per_job, seconds })
}

fn fill_emqp(frontend: &str, s: &FillSettings, body: &[u8], deadline: Instant) -> Result<(), BenchError> {
    let ctx = zmq::Context::new();
    let d = ctx.socket(zmq::DEALER).map_err(ZmqError::at("socket"))?;
    d.set_linger(crate::limits::BENCH_LINGER_MS).map_err(ZmqError::at("LINGER"))?;
    d.set_sndhwm(0).map_err(ZmqError::at("SNDHWM"))?;
    d.set_rcvhwm(0).map_err(ZmqError::at("RCVHWM"))?;
    d.connect(frontend).map_err(ZmqError::at(format!("connect {frontend}")))?;
    let (mut sent, mut accepted) = (0usize, 0usize);
    while accepted < s.jobs {
        while sent < s.jobs && sent - accepted < WINDOW {
            let frames: [&[u8]; 7] = [b"", VERSION, b"REQUEST", &new_msgid(), s.queue.as_bytes(), b"", body];
            d.send_multipart(frames, 0).map_err(ZmqError::at("send REQUEST"))?;
            sent += 1;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || d.poll(zmq::POLLIN, left.as_millis() as i64).map_err(ZmqError::at("poll"))? == 0 {
            return Err(BenchError::TargetDown(format!("{accepted} of {} jobs accepted in time", s.jobs)));
        }
        while let Ok(reply) = d.recv_multipart(zmq::DONTWAIT) {
            match reply.get(2).map(Vec::as_slice) {
                Some(b"REPLY") => accepted += 1,
                Some(b"ERROR") => {
                    let code = reply.get(5).map(|c| String::from_utf8_lossy(c).into_owned()).unwrap_or_default();
                    return Err(BenchError::Invalid(format!("the broker refused job {accepted}: {code}")));
                }
                _ => {}
            }
        }
    }
    Ok(())
}

fn fill_text(addr: &str, s: &FillSettings, body: &[u8], deadline: Instant) -> Result<(), BenchError> {
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
    c.sync().map_err(to)
}
