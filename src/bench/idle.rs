//! Idle-worker load: many workers INFORM once, then only HEARTBEAT every
//! [`HEARTBEAT_INTERVAL`] (as EventMQ jobmanagers do), while the broker's
//! CPU time is read from `/proc/<pid>/stat` (utime + stime, in USER_HZ =
//! 100 ticks per second) at the start and end of the measured time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::body::Tally;
use super::run::RunResult;
use super::BenchError;
use crate::limits::HEARTBEAT_INTERVAL;
use crate::protocol::emqp::{heartbeat_timestamp, new_msgid, VERSION};
use crate::zmq_error::ZmqError;

/// Sockets per ZeroMQ context: libzmq's default `ZMQ_MAX_SOCKETS` is 1,023.
const SOCKETS_PER_CONTEXT: usize = 1000;

/// Settings of an idle run.
#[derive(Debug, Clone, clap::Args, Serialize)]
pub struct IdleSettings {
    /// The broker's backend.
    #[arg(long, value_parser = crate::config::addr::emqp_arg)]
    pub backend: String,
    /// Idle workers (each a DEALER: two file descriptors here, one in the broker).
    #[arg(long, default_value_t = 1000)]
    pub workers: usize,
    /// Measured time, after every worker is ACKed.
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub duration: Duration,
    /// Idle workers another process keeps connected meanwhile (recorded in
    /// the result only, as `total_workers`).
    #[arg(long, default_value_t = 0)]
    pub other_workers: usize,
    /// PID of the broker whose CPU time is read (none: CPU not reported).
    #[arg(long)]
    pub pid: Option<u32>,
    /// How long the INFORMs may take to be ACKed, all together.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub probe_timeout: Duration,
}

/// CPU seconds (user + system) used so far by process `pid`.
///
/// # Errors
/// [`BenchError::Io`] when `/proc/<pid>/stat` is unreadable;
/// [`BenchError::Invalid`] when it cannot be parsed.
pub fn cpu_seconds(pid: u32) -> Result<f64, BenchError> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).map_err(super::ioerr(format!("read {path}")))?;
    // Fields after the `(comm)`, which may hold spaces: state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
    match (ticks(11), ticks(12)) {
        (Some(u), Some(s)) => Ok((u + s) as f64 / 100.0),
        _ => Err(BenchError::Invalid(format!("{path}: unexpected format"))),
    }
}

/// Runs the idle load; the result's `extra` holds the broker CPU share and
/// heartbeat counts. `heartbeats` counts HEARTBEATs received.
///
/// # Errors
/// [`BenchError::TargetDown`] when not every INFORM is ACKed within the
/// probe timeout; [`BenchError::Zmq`] for socket failures.
pub fn run(s: &IdleSettings, heartbeats: Arc<AtomicU64>) -> Result<RunResult, BenchError> {
    let mut groups = Vec::new();
    for chunk in (0..s.workers).collect::<Vec<_>>().chunks(SOCKETS_PER_CONTEXT) {
        let ctx = zmq::Context::new();
        let mut socks = Vec::new();
        for _ in chunk {
            let d = ctx.socket(zmq::DEALER).map_err(ZmqError::at("socket"))?;
            d.set_linger(crate::limits::BENCH_LINGER_MS).map_err(ZmqError::at("LINGER"))?;
            d.set_identity(&new_msgid()).map_err(ZmqError::at("identity"))?;
            d.connect(&s.backend).map_err(ZmqError::at(format!("connect {}", s.backend)))?;
            d.send_multipart([b"" as &[u8], VERSION, b"INFORM", &new_msgid(), b"", b"worker"].iter(), 0)
                .map_err(ZmqError::at("INFORM"))?;
            socks.push(d);
        }
        groups.push((ctx, socks));
    }
    let all = || groups.iter().flat_map(|(_, v)| v.iter());
    let acked = AtomicU64::new(0);
    let deadline = Instant::now() + s.probe_timeout;
    while acked.load(Ordering::Relaxed) < s.workers as u64 {
        if Instant::now() > deadline {
            let n = acked.load(Ordering::Relaxed);
            return Err(BenchError::TargetDown(format!("only {n} of {} INFORMs ACKed by {}", s.workers, s.backend)));
        }
        all().for_each(|d| drain(d, &acked, &heartbeats));
        std::thread::sleep(Duration::from_millis(20));
    }
    let cpu0 = s.pid.map(cpu_seconds).transpose()?;
    let start = Instant::now();
    let mut next_hb = start;
    while start.elapsed() < s.duration {
        if Instant::now() >= next_hb {
            for d in all() {
                let hb = [b"" as &[u8], VERSION, b"HEARTBEAT", &new_msgid(), &heartbeat_timestamp()];
                d.send_multipart(hb.iter(), zmq::DONTWAIT).map_err(ZmqError::at("HEARTBEAT"))?;
            }
            next_hb += HEARTBEAT_INTERVAL;
        }
        all().for_each(|d| drain(d, &acked, &heartbeats));
        std::thread::sleep(Duration::from_millis(100));
    }
    let elapsed = start.elapsed().as_secs_f64();
    let cpu = match (s.pid, cpu0) {
        (Some(pid), Some(c0)) => Some((cpu_seconds(pid)? - c0) / elapsed * 100.0),
        _ => None,
    };
    for d in all() {
        let _ = d.send_multipart([b"" as &[u8], VERSION, b"KBYE", &new_msgid()].iter(), zmq::DONTWAIT);
    }
    let mut r = RunResult::from_tally("idle", &Tally::new(0));
    r.elapsed_s = elapsed;
    r.extra = Some(serde_json::json!({
        "workers": s.workers,
        "total_workers": s.workers + s.other_workers,
        "broker_cpu_percent_of_one_core": cpu,
        "heartbeats_received": heartbeats.load(Ordering::Relaxed),
    }));
    Ok(r)
}

fn drain(d: &zmq::Socket, acked: &AtomicU64, heartbeats: &AtomicU64) {
    while let Ok(f) = d.recv_multipart(zmq::DONTWAIT) {
        match f.get(2).map(Vec::as_slice) {
            Some(b"ACK") => drop(acked.fetch_add(1, Ordering::Relaxed)),
            Some(b"HEARTBEAT") => drop(heartbeats.fetch_add(1, Ordering::Relaxed)),
            _ => {}
        }
    }
}
