//! The pieces every load mode shares: the run clock, the job body that
//! carries the send timestamp, the send pacer (closed or open loop) and the
//! per-client tally of what was sent and received.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use super::LoadSettings;
use crate::limits::LATENCY_MAX_US;

/// Nanoseconds since the run's start, on one monotonic clock shared by
/// every thread of the run (clients and workers are in one process).
#[derive(Debug, Clone, Copy)]
pub struct Clock(Instant);

impl Clock {
    /// Starts the clock now.
    pub fn start() -> Clock {
        Clock(Instant::now())
    }

    /// Nanoseconds since the start.
    pub fn now_ns(&self) -> u64 {
        self.0.elapsed().as_nanos() as u64
    }

    /// The instant `ns` nanoseconds after the start.
    pub fn at(&self, ns: u64) -> Instant {
        self.0 + Duration::from_nanos(ns)
    }
}

/// A job body: the JSON array `["bench",client,seq,send_ns,"xxx…"]`, padded
/// with `x` up to `size` bytes (never shorter than the fields need).
pub fn encode(client: usize, seq: u64, send_ns: u64, size: usize) -> Vec<u8> {
    let mut b = format!("[\"bench\",{client},{seq},{send_ns},\"").into_bytes();
    let pad = size.saturating_sub(b.len() + 2);
    b.resize(b.len() + pad, b'x');
    b.extend_from_slice(b"\"]");
    b
}

/// Reads `(client, seq, send_ns)` back from a body made by [`encode`];
/// `None` for anything else (the caller counts it as foreign).
pub fn decode(body: &[u8]) -> Option<(usize, u64, u64)> {
    let rest = body.strip_prefix(b"[\"bench\",")?;
    let mut it = rest.splitn(4, |b| *b == b',');
    let mut num = || -> Option<u64> { std::str::from_utf8(it.next()?).ok()?.parse().ok() };
    let client = num()? as usize;
    let seq = num()?;
    let send_ns = num()?;
    Some((client, seq, send_ns))
}

/// A new latency histogram in microseconds (3 significant digits, up to
/// [`LATENCY_MAX_US`]).
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_MAX_US, 3).expect("constant bounds 1..LATENCY_MAX_US, 3 digits are valid")
}

/// Decides when one client may send: a window of jobs in flight (closed
/// loop) or a fixed schedule (open loop), until its share of the requests
/// or the end of the sending time.
#[derive(Debug)]
pub struct Pacer {
    window: usize,
    interval_ns: Option<u64>,
    next_ns: u64,
    warmup_ns: u64,
    share: Option<u64>,
    stop_ns: Option<u64>,
    measured_sent: u64,
}

impl Pacer {
    /// The pacer of client `index` of `settings.clients`.
    pub fn new(settings: &LoadSettings, index: usize) -> Pacer {
        let clients = settings.clients.max(1) as u64;
        let warmup_ns = settings.warmup.as_nanos() as u64;
        let share = settings.request_bound().map(|r| r / clients + u64::from((index as u64) < r % clients));
        let interval_ns = settings.rate.filter(|r| *r > 0.0).map(|r| (1e9 * clients as f64 / r) as u64);
        // Open-loop clients start staggered so their sends interleave.
        let next_ns = interval_ns.map(|i| i * index as u64 / clients).unwrap_or(0);
        let stop_ns = settings.duration.map(|d| warmup_ns + d.as_nanos() as u64);
        Pacer { window: settings.in_flight.max(1), interval_ns, next_ns, warmup_ns, share, stop_ns, measured_sent: 0 }
    }

    /// Whether this client has sent all it will send.
    pub fn finished(&self, now_ns: u64) -> bool {
        self.share.is_some_and(|s| self.measured_sent >= s) || self.stop_ns.is_some_and(|s| now_ns >= s)
    }

    /// The timestamp to put in the next job if it may be sent now, given
    /// `outstanding` jobs in flight; `None` to wait.
    pub fn next_send(&mut self, now_ns: u64, outstanding: u64) -> Option<u64> {
        if self.finished(now_ns) {
            return None;
        }
        let t = match self.interval_ns {
            None if outstanding < self.window as u64 => now_ns,
            None => return None,
            Some(_) if now_ns < self.next_ns => return None,
            Some(i) => {
                let t = self.next_ns;
                self.next_ns += i;
                t
            }
        };
        if t >= self.warmup_ns {
            self.measured_sent += 1;
        }
        Some(t)
    }

    /// How long to wait before the next send may be due (open loop), at
    /// most `cap`; `cap` once this client has sent all it will (its
    /// schedule stops moving then: waiting for it spun through the drain).
    pub fn wait(&self, now_ns: u64, cap: Duration) -> Duration {
        match self.interval_ns {
            Some(_) if !self.finished(now_ns) => Duration::from_nanos(self.next_ns.saturating_sub(now_ns)).min(cap),
            _ => cap,
        }
    }
}

/// What one client sent and what came back for it.
#[derive(Debug, Clone)]
pub struct Tally {
    warmup_ns: u64,
    send_ns: Vec<u64>,
    seen: Vec<u8>,
    /// Measured jobs sent.
    pub sent: u64,
    /// Warm-up jobs sent (not measured).
    pub warmup_sent: u64,
    /// Jobs received by a worker or consumer at least once (warm-up included).
    pub received_all: u64,
    /// Measured jobs received at least once.
    pub received: u64,
    /// Receipts of a job already received.
    pub duplicates: u64,
    /// Acceptance REPLYs (eMQP).
    pub accepted: u64,
    /// ERRORs, or `ERR` lines.
    pub errors: u64,
    /// Latency send → receipt, µs, measured jobs only.
    pub latency: Histogram<u64>,
    /// Latency send → acceptance REPLY, µs, measured jobs only.
    pub ack_latency: Histogram<u64>,
    /// Latest receipt of a measured job, ns.
    pub last_receipt_ns: u64,
    /// Earliest send of a measured job, ns.
    pub first_send_ns: Option<u64>,
    /// CPU time of the eMQP client threads (the producers) over the whole
    /// run, warm-up included, ns; 0 where a mode does not measure it.
    pub producer_cpu_ns: u64,
}

impl Tally {
    /// An empty tally; jobs sent before `warmup_ns` are not measured.
    pub fn new(warmup_ns: u64) -> Tally {
        Tally {
            warmup_ns,
            send_ns: Vec::new(),
            seen: Vec::new(),
            sent: 0,
            warmup_sent: 0,
            received_all: 0,
            received: 0,
            duplicates: 0,
            accepted: 0,
            producer_cpu_ns: 0,
            errors: 0,
            latency: histogram(),
            ack_latency: histogram(),
            last_receipt_ns: 0,
            first_send_ns: None,
        }
    }

    /// Records a send; returns the job's sequence number.
    pub fn on_send(&mut self, send_ns: u64) -> u64 {
        let seq = self.send_ns.len() as u64;
        self.send_ns.push(send_ns);
        self.seen.push(0);
        if send_ns >= self.warmup_ns {
            self.sent += 1;
            self.first_send_ns.get_or_insert(send_ns);
        } else {
            self.warmup_sent += 1;
        }
        seq
    }

    /// Jobs sent and not yet received.
    pub fn outstanding(&self) -> u64 {
        (self.send_ns.len() as u64).saturating_sub(self.received_all)
    }

    /// Acceptance REPLYs still due: jobs sent (warm-up included) not yet
    /// acknowledged (a target that never sends them, like the one-message
    /// forwarder, owes them all: the client's wait for them is bounded).
    pub fn acks_outstanding(&self) -> u64 {
        (self.send_ns.len() as u64).saturating_sub(self.accepted)
    }

    /// Records that job `seq` reached a receiver at `recv_ns`.
    pub fn on_receipt(&mut self, seq: u64, recv_ns: u64) {
        let Some(seen) = self.seen.get_mut(seq as usize) else {
            self.errors += 1;
            return;
        };
        *seen = seen.saturating_add(1);
        if *seen > 1 {
            self.duplicates += 1;
            return;
        }
        self.received_all += 1;
        let send_ns = self.send_ns[seq as usize];
        if send_ns >= self.warmup_ns {
            self.received += 1;
            self.last_receipt_ns = self.last_receipt_ns.max(recv_ns);
            let _ = self.latency.record(recv_ns.saturating_sub(send_ns).div_ceil(1000).max(1));
        }
    }

    /// Records the acceptance of job `seq` at `now_ns`.
    pub fn on_ack(&mut self, seq: u64, now_ns: u64) {
        self.accepted += 1;
        if let Some(&send_ns) = self.send_ns.get(seq as usize) {
            if send_ns >= self.warmup_ns {
                let _ = self.ack_latency.record(now_ns.saturating_sub(send_ns).div_ceil(1000).max(1));
            }
        }
    }

    /// Adds `other` into `self` (per-client tallies into a run total).
    pub fn merge(&mut self, other: &Tally) {
        self.sent += other.sent;
        self.warmup_sent += other.warmup_sent;
        self.received_all += other.received_all;
        self.received += other.received;
        self.duplicates += other.duplicates;
        self.accepted += other.accepted;
        self.errors += other.errors;
        self.producer_cpu_ns += other.producer_cpu_ns;
        let _ = self.latency.add(&other.latency);
        let _ = self.ack_latency.add(&other.ack_latency);
        self.last_receipt_ns = self.last_receipt_ns.max(other.last_receipt_ns);
        self.first_send_ns = match (self.first_send_ns, other.first_send_ns) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_round_trip_and_padding() {
        let b = encode(3, 17, 123_456, 64);
        assert_eq!(b.len(), 64);
        assert!(serde_json::from_slice::<serde_json::Value>(&b).is_ok());
        assert_eq!(decode(&b), Some((3, 17, 123_456)));
        assert_eq!(decode(b"[\"other\",1,2,3]"), None);
    }

    #[test]
    fn an_open_loop_pacer_that_sent_its_share_waits_the_whole_cap() {
        let settings = LoadSettings { clients: 1, rate: Some(1000.0), requests: Some(2), ..LoadSettings::default() };
        let mut p = Pacer::new(&settings, 0);
        let warm = settings.warmup.as_nanos() as u64;
        let cap = Duration::from_millis(50);
        let mut now = warm;
        while p.next_send(now, 0).is_some() || !p.finished(now) {
            now += 1_000_000;
        }
        assert_eq!(p.wait(now, cap), cap, "finished: nothing is due any more");
        assert_eq!(p.wait(now + 10_000_000_000, cap), cap);
        let fresh = Pacer::new(&settings, 0);
        assert_eq!(fresh.wait(warm, cap), Duration::ZERO, "due now");
    }

    #[test]
    fn tally_counts_duplicates_and_warmup() {
        let mut t = Tally::new(100);
        let a = t.on_send(50);
        let b = t.on_send(200);
        t.on_receipt(a, 60);
        t.on_receipt(b, 2200);
        t.on_receipt(b, 2300);
        assert_eq!((t.sent, t.warmup_sent, t.received, t.received_all, t.duplicates), (1, 1, 1, 2, 1));
        assert_eq!(t.latency.len(), 1);
        assert_eq!(t.outstanding(), 0);
    }
}
