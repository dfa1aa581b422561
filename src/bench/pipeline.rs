//! Pipelined submission through a line [`Dialect`], producers only: each
//! connection writes its jobs `--batch` at a time without waiting, keeping
//! at most `--in-flight` jobs unacknowledged. A job counts as received
//! (stored) when its acknowledgement arrives: beanstalkd answers every
//! `put` (`INSERTED`); the text protocol answers a successful SCHED with
//! nothing, so each batch ends with a barrier line whose reply (an `ERR`
//! that changes nothing) comes after the replies of every SCHED before it.
//! Latency is send → acknowledgement; throughput is jobs stored per second.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::body::{self, Clock, Pacer, Tally};
use super::lines::{resolve_owners, Dialect};
use super::link::{self, LinkRead, LinkWrite};
use super::{ioerr, BenchError, LoadSettings};
use crate::client::text::TextClientOptions;

/// A batch sent and not yet acknowledged.
struct Batch {
    /// The jobs in it.
    seqs: Vec<u64>,
    /// Reply lines still to come for it.
    replies: usize,
}

/// Runs a pipelined submission of `dialect` against `addr`, every
/// connection opened with `link` (TLS, a token; [`link::open`]);
/// `progress` counts measured jobs acknowledged.
///
/// # Errors
/// [`BenchError::TargetDown`] when a connection fails or no job is
/// acknowledged; [`BenchError::Io`] for socket failures.
pub fn run(
    addr: &str,
    settings: &LoadSettings,
    progress: Arc<AtomicU64>,
    dialect: &'static dyn Dialect,
    link: &TextClientOptions,
) -> Result<Tally, BenchError> {
    let owners = resolve_owners(addr, settings.clients.max(1))?;
    let clock = Clock::start();
    let mut producers = Vec::new();
    for i in 0..settings.clients.max(1) {
        // Producer i writes to owner i mod N (lines.rs "Several owners").
        let stream = link::open(owners[i % owners.len()], settings.probe_timeout, link)?;
        let (s, p) = (settings.clone(), progress.clone());
        producers.push(std::thread::spawn(move || produce(stream, i, &s, clock, &p, dialect)));
    }
    let mut total = Tally::new(settings.warmup.as_nanos() as u64);
    for p in producers {
        match p.join() {
            Ok(Ok(t)) => total.merge(&t),
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(BenchError::Invalid("producer thread panicked".into())),
        }
    }
    if total.received_all == 0 {
        return Err(BenchError::TargetDown(format!("no job acknowledged by {addr}")));
    }
    Ok(total)
}

/// One pipelining connection's state.
struct Producer<'a> {
    s: &'a LoadSettings,
    index: usize,
    queue: String,
    clock: Clock,
    dialect: &'a dyn Dialect,
    pacer: Pacer,
    tally: Tally,
    selected: String,
    batches: VecDeque<Batch>,
}

fn produce(
    (stream, mut w): (LinkRead, LinkWrite),
    index: usize,
    s: &LoadSettings,
    clock: Clock,
    progress: &AtomicU64,
    dialect: &dyn Dialect,
) -> Result<Tally, BenchError> {
    stream.set_read_timeout(Some(Duration::from_millis(200))).map_err(ioerr("read timeout"))?;
    let mut r = BufReader::new(stream);
    let queue = s.queue_list().into_iter().next().map(|(_, q)| q).unwrap_or_default();
    let mut p = Producer {
        s,
        index,
        queue,
        clock,
        dialect,
        pacer: Pacer::new(s, index),
        tally: Tally::new(s.warmup.as_nanos() as u64),
        selected: String::new(),
        batches: VecDeque::new(),
    };
    let (mut out, mut line, mut drain_end) = (Vec::new(), Vec::new(), None);
    loop {
        while p.fill(&mut out) {}
        if !out.is_empty() {
            w.write_all(&out).map_err(ioerr("send batch"))?;
            out.clear();
        }
        let now = clock.now_ns();
        if p.pacer.finished(now) {
            let end = *drain_end.get_or_insert(now + s.drain_timeout.as_nanos() as u64);
            if p.batches.is_empty() || now >= end {
                break;
            }
        }
        match r.read_until(b'\n', &mut line) {
            Ok(0) => return Err(BenchError::TargetDown("connection closed".into())),
            Ok(_) if line.ends_with(b"\n") => {}
            Ok(_) => continue,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => continue,
            Err(e) => return Err(ioerr("read reply")(e)),
        }
        let reply = line.strip_suffix(b"\n").unwrap_or(&line);
        p.on_reply(reply.strip_suffix(b"\r").unwrap_or(reply), progress);
        line.clear();
    }
    let _ = w.write_all(dialect.bye());
    Ok(p.tally)
}

impl Producer<'_> {
    /// Appends the next batch (as the pacer allows) to `out`, with its
    /// barrier; whether there was one.
    fn fill(&mut self, out: &mut Vec<u8>) -> bool {
        let mut batch = Batch { seqs: Vec::new(), replies: 0 };
        while batch.seqs.len() < self.s.batch.max(1) {
            let Some(t) = self.pacer.next_send(self.clock.now_ns(), self.tally.outstanding()) else { break };
            let seq = self.tally.on_send(t);
            // A protocol that selects a queue per connection answers that too.
            let selects = self.selected != self.queue;
            let body = body::encode(self.index, seq, t, self.s.size);
            self.dialect.put(out, &body, &self.queue, &mut self.selected);
            batch.replies += 1 + usize::from(selects);
            batch.seqs.push(seq);
        }
        if batch.seqs.is_empty() {
            return false;
        }
        if let Some(barrier) = self.dialect.barrier() {
            out.extend_from_slice(barrier);
            batch.replies = 1;
        }
        self.batches.push_back(batch);
        true
    }

    /// Takes one reply line; acknowledges the oldest batch once all its
    /// replies came.
    fn on_reply(&mut self, reply: &[u8], progress: &AtomicU64) {
        let done = match self.dialect.barrier() {
            Some(_) if self.dialect.is_barrier_reply(reply) => true,
            Some(_) => {
                self.tally.errors += 1;
                false
            }
            None => {
                self.tally.errors += u64::from(self.dialect.producer_error(reply));
                self.batches.front_mut().is_some_and(|b| {
                    b.replies = b.replies.saturating_sub(1);
                    b.replies == 0
                })
            }
        };
        if !done {
            return;
        }
        let before = self.tally.received;
        let now = self.clock.now_ns();
        for seq in self.batches.pop_front().map(|b| b.seqs).unwrap_or_default() {
            self.tally.on_receipt(seq, now);
        }
        progress.fetch_add(self.tally.received - before, Ordering::Relaxed);
    }
}
