//! Text-protocol load (text-protocol.md): P producers send
//! `SCHED <body>@<queue>` lines, C consumers loop `ASK <queue>` →
//! `WANT? <body>` → `ACK`, backing off after `NOPE` (200 µs doubling to
//! 10 ms). Latency is the SCHED time carried in the body → the consumer
//! reading the `WANT?` line. Producers count `ERR` lines.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};

use super::body::{self, Clock, Pacer, Tally};
use super::{ioerr, BenchError, LoadSettings};

/// `(seq, receipt ns)`: a consumer telling a producer its task arrived.
type Receipt = (u64, u64);

const NOPE_BACKOFF_MIN: Duration = Duration::from_micros(200);
const NOPE_BACKOFF_MAX: Duration = Duration::from_millis(10);

fn connect(addr: SocketAddr, timeout: Duration) -> Result<TcpStream, BenchError> {
    let s = TcpStream::connect_timeout(&addr, timeout)
        .map_err(|e| BenchError::TargetDown(format!("cannot connect to text address {addr}: {e}")))?;
    s.set_nodelay(true).map_err(ioerr("TCP_NODELAY"))?;
    Ok(s)
}

/// Runs one text load against `addr` (`HOST:PORT`); `progress` counts
/// measured tasks received.
///
/// # Errors
/// [`BenchError::TargetDown`] when a connection fails or no task at all
/// reaches a consumer; [`BenchError::Io`] for socket failures.
pub fn run(addr: &str, settings: &LoadSettings, progress: Arc<AtomicU64>) -> Result<Tally, BenchError> {
    let addr = addr
        .to_socket_addrs()
        .map_err(ioerr(format!("resolve {addr}")))?
        .next()
        .ok_or_else(|| BenchError::Invalid(format!("{addr}: no address")))?;
    let clock = Clock::start();
    let stop = Arc::new(AtomicBool::new(false));
    let (txs, rxs): (Vec<Sender<Receipt>>, Vec<Receiver<Receipt>>) =
        (0..settings.clients.max(1)).map(|_| crossbeam_channel::unbounded()).unzip();
    let queues: Vec<String> = settings.queue_list().into_iter().map(|(_, q)| q).collect();
    let mut consumers = Vec::new();
    for i in 0..settings.workers.max(1) {
        let stream = connect(addr, settings.probe_timeout)?;
        let (txs, stop, q) = (txs.clone(), stop.clone(), queues[i % queues.len()].clone());
        consumers.push(std::thread::spawn(move || consume(stream, &q, &txs, clock, &stop)));
    }
    let mut producers = Vec::new();
    for (i, rx) in rxs.into_iter().enumerate() {
        let stream = connect(addr, settings.probe_timeout)?;
        let (s, q, p) = (settings.clone(), queues.clone(), progress.clone());
        producers.push(std::thread::spawn(move || produce(stream, i, &s, &q, &rx, clock, &p)));
    }
    let mut total = Tally::new(settings.warmup.as_nanos() as u64);
    let mut first_err = None;
    for p in producers {
        match p.join() {
            Ok(Ok(t)) => total.merge(&t),
            Ok(Err(e)) => first_err = first_err.or(Some(e)),
            Err(_) => first_err = first_err.or(Some(BenchError::Invalid("producer thread panicked".into()))),
        }
    }
    stop.store(true, Ordering::Release);
    for c in consumers {
        total.errors += c.join().unwrap_or(0);
    }
    match first_err {
        Some(e) => Err(e),
        None if total.received_all == 0 => {
            Err(BenchError::TargetDown(format!("no task reached a consumer via {addr}")))
        }
        None => Ok(total),
    }
}

/// One producer: SCHED lines as the pacer allows; receipts come from the
/// consumers over `rx` as `(seq, receipt ns)`.
fn produce(
    mut stream: TcpStream,
    index: usize,
    s: &LoadSettings,
    queues: &[String],
    rx: &Receiver<Receipt>,
    clock: Clock,
    progress: &AtomicU64,
) -> Result<Tally, BenchError> {
    let errors = Arc::new(AtomicU64::new(0));
    let reader = {
        let (r, e) = (stream.try_clone().map_err(ioerr("clone stream"))?, errors.clone());
        std::thread::spawn(move || count_err_lines(r, &e))
    };
    let mut pacer = Pacer::new(s, index);
    let mut tally = Tally::new(s.warmup.as_nanos() as u64);
    let mut drain_end: Option<u64> = None;
    let mut out = Vec::new();
    loop {
        let now = clock.now_ns();
        while let Some(t) = pacer.next_send(clock.now_ns(), tally.outstanding()) {
            let seq = tally.on_send(t);
            out.extend_from_slice(b"SCHED ");
            out.extend_from_slice(&body::encode(index, seq, t, s.size));
            out.push(b'@');
            out.extend_from_slice(queues[seq as usize % queues.len()].as_bytes());
            out.push(b'\n');
        }
        if !out.is_empty() {
            stream.write_all(&out).map_err(ioerr("send SCHED"))?;
            out.clear();
        }
        if pacer.finished(now) {
            let end = *drain_end.get_or_insert(now + s.drain_timeout.as_nanos() as u64);
            if tally.outstanding() == 0 || now >= end {
                break;
            }
        }
        if let Ok((seq, ns)) = rx.recv_timeout(pacer.wait(now, Duration::from_millis(10))) {
            tally.on_receipt(seq, ns);
        }
        let before = tally.received;
        rx.try_iter().for_each(|(seq, ns)| tally.on_receipt(seq, ns));
        progress.fetch_add(tally.received - before, Ordering::Relaxed);
    }
    let _ = stream.write_all(b"END\n");
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let _ = reader.join();
    tally.errors += errors.load(Ordering::Relaxed);
    Ok(tally)
}

fn count_err_lines(stream: TcpStream, errors: &AtomicU64) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    for line in BufReader::new(stream).split(b'\n') {
        match line {
            Ok(l) if l.starts_with(b"ERR") => drop(errors.fetch_add(1, Ordering::Relaxed)),
            Ok(_) => {}
            Err(_) => return,
        }
    }
}

/// One consumer: ASK/ACK until `stop`; returns the `ERR` lines it got.
fn consume(stream: TcpStream, queue: &str, producers: &[Sender<Receipt>], clock: Clock, stop: &AtomicBool) -> u64 {
    let mut errors = 0;
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    let Ok(mut w) = stream.try_clone() else { return 1 };
    let mut r = BufReader::new(stream);
    let ask = format!("ASK {queue}\n").into_bytes();
    let mut line = Vec::new();
    let mut backoff = NOPE_BACKOFF_MIN;
    let mut asked = false;
    let mut stalled = 0u32;
    while !stop.load(Ordering::Acquire) || asked {
        if !asked {
            if w.write_all(&ask).is_err() {
                return errors + 1;
            }
            asked = true;
        }
        match r.read_until(b'\n', &mut line) {
            Ok(0) => return errors + 1,
            Ok(_) if line.ends_with(b"\n") => {}
            Ok(_) => continue,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                // After the stop, an unanswered ASK is given up after ~2 s.
                stalled += u32::from(stop.load(Ordering::Acquire));
                if stalled > 10 {
                    break;
                }
                continue;
            }
            Err(_) => return errors + 1,
        }
        asked = false;
        if let Some(data) = line.strip_prefix(b"WANT? ") {
            let now = clock.now_ns();
            if let Some((c, seq, _)) = body::decode(data.strip_suffix(b"\n").unwrap_or(data)) {
                if let Some(tx) = producers.get(c) {
                    let _ = tx.send((seq, now));
                }
            }
            backoff = NOPE_BACKOFF_MIN;
            // ACK and the next ASK in one write.
            let mut next = b"ACK\n".to_vec();
            if !stop.load(Ordering::Acquire) {
                next.extend_from_slice(&ask);
                asked = true;
            }
            if w.write_all(&next).is_err() {
                return errors + 1;
            }
        } else if line.starts_with(b"NOPE") {
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(NOPE_BACKOFF_MAX);
        } else {
            errors += 1;
        }
        line.clear();
    }
    let _ = w.write_all(b"END\n");
    errors
}
