//! eMQP load: N client DEALERs sending REQUESTs to a broker's frontend and M
//! in-process workers on its backend (INFORM, READY per slot, job-result
//! REPLY + READY per job, HEARTBEAT every second, KBYE at the end).
//!
//! Frames follow EventMQ 0.3.13 (docs/emqp.md "Messages"). A worker that receives a
//! REQUEST stamps the time and tells the client that sent it over an
//! inproc PUSH/PULL pair, so the client tallies every job (and any
//! duplicate) on one thread. Clients also count acceptance REPLYs (frame 4 =
//! REQUEST msgid) and ERRORs.
//!
//! Several owners (docs/scaleout.md: `;` between router names in the
//! target's frontend and backend lists): every client keeps one DEALER per
//! owner and sends its REQUESTs round-robin over them, one REQUEST at a
//! time (as the eMQP client library spreads them), so each client loads
//! every owner alike and the client-side cost of spreading is measured;
//! worker `i` serves owner `i mod owners` only (one socket, its own READY
//! credits), so the workers are split over the owners and no owner gets
//! more credits than its share. One owner: exactly the load as before.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use super::body::{self, Clock, Pacer, Tally};
use super::{BenchError, LoadSettings};
use crate::curve::{self, ClientCurve};
use crate::protocol::emqp::{heartbeat_timestamp, new_msgid, VERSION};
use crate::zmq_error::ZmqError;

/// An eMQP broker to load: its frontend (clients) and backend (workers).
#[derive(Debug, Clone)]
pub struct Target {
    /// Frontend address, e.g. `tcp://127.0.0.1:47291`; several separated
    /// by `,` (one owner and its standby) and owners separated by `;`.
    pub frontend: String,
    /// Backend address, as `frontend`: the same owners in the same order.
    pub backend: String,
    /// CURVE client keys every client and worker connects with (the i-th
    /// server key for the i-th address of each list); `None`: plain.
    pub curve: Option<ClientCurve>,
}

/// Shared by every thread of one run.
struct RunCtx {
    settings: LoadSettings,
    /// The frontend's owners (one address list each, as `connect_all`
    /// takes it: `a` or `a,standby`), with the CURVE keys of each.
    frontends: Vec<(String, Option<ClientCurve>)>,
    /// The backend's owners, as `frontends`.
    backends: Vec<(String, Option<ClientCurve>)>,
    zctx: zmq::Context,
    nonce: String,
    stop: AtomicBool,
    progress: Arc<AtomicU64>,
}

impl RunCtx {
    fn done_endpoint(&self, client: usize) -> String {
        format!("inproc://emq-bench-{}-{client}", self.nonce)
    }
}

fn socket(ctx: &RunCtx, kind: zmq::SocketType) -> Result<zmq::Socket, BenchError> {
    let s = ctx.zctx.socket(kind).map_err(ZmqError::at("socket"))?;
    s.set_linger(crate::limits::BENCH_LINGER_MS).map_err(ZmqError::at("LINGER"))?;
    s.set_sndhwm(crate::limits::ZMQ_HWM).map_err(ZmqError::at("SNDHWM"))?;
    s.set_rcvhwm(crate::limits::ZMQ_HWM).map_err(ZmqError::at("RCVHWM"))?;
    Ok(s)
}

/// Runs one load against `target`; `progress` counts measured jobs received.
///
/// # Errors
/// [`BenchError::TargetDown`] when a worker gets no ACK to its INFORM within
/// the probe timeout, when a send blocks that long, or when no job at all
/// reaches a worker; [`BenchError::Zmq`] for socket failures;
/// [`BenchError::Invalid`] when the frontend and backend lists name a
/// different number of owners, or there are fewer workers than owners.
pub fn run(target: &Target, settings: &LoadSettings, progress: Arc<AtomicU64>) -> Result<Tally, BenchError> {
    let frontends = owners(&target.frontend, target.curve.as_ref())?;
    let backends = owners(&target.backend, target.curve.as_ref())?;
    if frontends.len() != backends.len() {
        return Err(BenchError::Invalid(format!(
            "{} frontend owners but {} backend owners: give both lists the same owners in the same order",
            frontends.len(),
            backends.len()
        )));
    }
    if settings.workers.max(1) < backends.len() {
        return Err(BenchError::Invalid(format!(
            "--workers {} for {} owners: every owner needs a worker of its own",
            settings.workers,
            backends.len()
        )));
    }
    let ctx = Arc::new(RunCtx {
        settings: settings.clone(),
        frontends,
        backends,
        zctx: zmq::Context::new(),
        nonce: uuid::Uuid::new_v4().simple().to_string(),
        stop: AtomicBool::new(false),
        progress,
    });
    let (ready_tx, ready_rx) = crossbeam_channel::unbounded();
    let mut clock_txs = Vec::new();
    let mut workers = Vec::new();
    for i in 0..settings.workers.max(1) {
        let (tx, rx) = crossbeam_channel::bounded(1);
        clock_txs.push(tx);
        let (c, r) = (ctx.clone(), ready_tx.clone());
        workers.push(std::thread::spawn(move || worker(&c, i, r, rx)));
    }
    let ready = wait_ready(&ready_rx, settings.workers.max(1));
    if let Err(e) = ready {
        ctx.stop.store(true, Ordering::Release);
        drop(clock_txs);
        workers.into_iter().for_each(|w| drop(w.join()));
        return Err(e);
    }
    let clock = Clock::start();
    for tx in &clock_txs {
        let _ = tx.send(clock);
    }
    let clients: Vec<JoinHandle<Result<Tally, BenchError>>> = (0..settings.clients.max(1))
        .map(|i| {
            let c = ctx.clone();
            std::thread::spawn(move || client(&c, i, clock))
        })
        .collect();
    let mut total = Tally::new(settings.warmup.as_nanos() as u64);
    let mut first_err = None;
    for c in clients {
        match c.join() {
            Ok(Ok(t)) => total.merge(&t),
            Ok(Err(e)) => first_err = first_err.or(Some(e)),
            Err(_) => first_err = first_err.or(Some(BenchError::Invalid("client thread panicked".into()))),
        }
    }
    ctx.stop.store(true, Ordering::Release);
    workers.into_iter().for_each(|w| drop(w.join()));
    if let Some(e) = first_err {
        return Err(e);
    }
    if total.received_all == 0 {
        return Err(BenchError::TargetDown(format!("no REQUEST reached a worker via {}", target.frontend)));
    }
    Ok(total)
}

/// Splits `list` into owners ([`crate::config::addr::emqp_owners`]), each
/// as one comma-separated address list with its CURVE keys: the server
/// keys of its addresses (by their position in the whole list), or the one
/// key for all. A list without `;` stays one owner, exactly as given.
fn owners(list: &str, curve: Option<&ClientCurve>) -> Result<Vec<(String, Option<ClientCurve>)>, BenchError> {
    if !list.contains(';') {
        return Ok(vec![(list.to_string(), curve.cloned())]);
    }
    let groups = crate::config::addr::emqp_owners(list).map_err(|e| BenchError::Invalid(e.to_string()))?;
    let mut first = 0;
    let mut out = Vec::with_capacity(groups.len());
    for g in groups {
        let keys = curve.map(|c| ClientCurve {
            pair: c.pair.clone(),
            server_keys: (first..first + g.len()).map(|i| *c.server_key_for(i)).collect(),
        });
        first += g.len();
        out.push((g.join(","), keys));
    }
    Ok(out)
}

fn wait_ready(rx: &Receiver<Result<(), BenchError>>, n: usize) -> Result<(), BenchError> {
    for _ in 0..n {
        match rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(BenchError::Invalid("worker thread ended early".into())),
        }
    }
    Ok(())
}

fn send(sock: &zmq::Socket, frames: &[&[u8]], what: &str) -> Result<(), BenchError> {
    match sock.send_multipart(frames.iter(), 0) {
        Err(zmq::Error::EAGAIN) => Err(BenchError::TargetDown(format!("{what}: send blocked past the probe timeout"))),
        r => r.map_err(|e| ZmqError::new(what.to_string(), e).into()),
    }
}

/// Connects to one address as before, or to each of a comma-separated list
/// with `ZMQ_IMMEDIATE` and ZMTP heartbeats (docs/failover.md): a single
/// address is measured exactly as it always was. With `curve`, each
/// connect is a CURVE client's (nothing else changes).
fn connect_all(sock: &zmq::Socket, addrs: &str, curve: Option<&ClientCurve>) -> Result<(), BenchError> {
    if !addrs.contains(',') {
        match curve {
            None => sock.connect(addrs).map_err(ZmqError::at(format!("connect {addrs}")))?,
            Some(c) => curve::connect_curve(sock, addrs, &c.pair, c.server_key_for(0))?,
        }
        return Ok(());
    }
    crate::client::connect_router_curve(sock, addrs, curve).map_err(|e| BenchError::Invalid(e.to_string()))?;
    Ok(())
}

/// One worker: INFORM, wait for the ACK (the probe), then serve jobs.
fn worker(ctx: &RunCtx, index: usize, ready: Sender<Result<(), BenchError>>, clock: Receiver<Clock>) {
    let setup = || -> Result<(zmq::Socket, Vec<zmq::Socket>), BenchError> {
        let sock = socket(ctx, zmq::DEALER)?;
        sock.set_identity(&new_msgid()).map_err(ZmqError::at("identity"))?;
        sock.set_sndtimeo(ctx.settings.probe_timeout.as_millis() as i32).map_err(ZmqError::at("SNDTIMEO"))?;
        let (backend, curve) = &ctx.backends[index % ctx.backends.len()];
        connect_all(&sock, backend, curve.as_ref())?;
        let queues: Vec<(i64, String)> = ctx.settings.queue_list();
        let queues = serde_json::to_vec(&queues).unwrap_or_default();
        send(&sock, &[b"", VERSION, b"INFORM", b"bench-inform", &queues, b"worker"], "INFORM")?;
        wait_ack(&sock, ctx.settings.probe_timeout, backend)?;
        let mut done = Vec::new();
        for c in 0..ctx.settings.clients.max(1) {
            let push = socket(ctx, zmq::PUSH)?;
            push.connect(&ctx.done_endpoint(c)).map_err(ZmqError::at("connect inproc"))?;
            done.push(push);
        }
        Ok((sock, done))
    };
    let (sock, done) = match setup() {
        Ok(s) => s,
        Err(e) => return drop(ready.send(Err(e))),
    };
    let _ = ready.send(Ok(()));
    let Ok(clock) = clock.recv() else { return };
    if let Err(e) = serve(ctx, &sock, &done, clock) {
        tracing::warn!(worker = index, "worker stopped: {e}");
    }
    let _ = sock.send_multipart([b"" as &[u8], VERSION, b"KBYE", &new_msgid()].iter(), zmq::DONTWAIT);
}

fn wait_ack(sock: &zmq::Socket, timeout: Duration, backend: &str) -> Result<(), BenchError> {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        let left = end.saturating_duration_since(Instant::now()).as_millis() as i64;
        if sock.poll(zmq::POLLIN, left.max(1)).map_err(ZmqError::at("poll"))? > 0 {
            let f = sock.recv_multipart(0).map_err(ZmqError::at("recv"))?;
            if f.get(2).map(Vec::as_slice) == Some(b"ACK") {
                return Ok(());
            }
        }
    }
    Err(BenchError::TargetDown(format!(
        "no ACK to INFORM from {backend} within {}",
        humantime::format_duration(timeout)
    )))
}

fn serve(ctx: &RunCtx, sock: &zmq::Socket, done: &[zmq::Socket], clock: Clock) -> Result<(), BenchError> {
    for _ in 0..ctx.settings.slots.max(1) {
        send(sock, &[b"", VERSION, b"READY", &new_msgid()], "READY")?;
    }
    let mut next_hb = Instant::now();
    while !ctx.stop.load(Ordering::Acquire) {
        if Instant::now() >= next_hb {
            send(sock, &[b"", VERSION, b"HEARTBEAT", &new_msgid(), &heartbeat_timestamp()], "HEARTBEAT")?;
            next_hb = Instant::now() + Duration::from_secs(1);
        }
        if sock.poll(zmq::POLLIN, 100).map_err(ZmqError::at("poll"))? == 0 {
            continue;
        }
        while let Ok(f) = sock.recv_multipart(zmq::DONTWAIT) {
            if f.len() >= 7 && f[2] == b"REQUEST" {
                job(ctx, sock, done, clock, &f)?;
            }
        }
    }
    Ok(())
}

fn job(ctx: &RunCtx, sock: &zmq::Socket, done: &[zmq::Socket], clock: Clock, f: &[Vec<u8>]) -> Result<(), BenchError> {
    let recv_ns = clock.now_ns();
    if let Some((client, seq, _)) = body::decode(&f[6]) {
        if let Some(push) = done.get(client) {
            let mut note = [0u8; 16];
            note[..8].copy_from_slice(&seq.to_le_bytes());
            note[8..].copy_from_slice(&recv_ns.to_le_bytes());
            push.send(&note[..], 0).map_err(ZmqError::at("inproc notify"))?;
        }
    }
    if !ctx.settings.service_time.is_zero() {
        std::thread::sleep(ctx.settings.service_time);
    }
    send(sock, &[b"", VERSION, b"REPLY", &new_msgid(), b"{\"value\": null}", &f[3]], "REPLY")?;
    send(sock, &[b"", VERSION, b"READY", &new_msgid()], "READY")
}

/// Longest wait, once every job reached a worker, for the next acceptance
/// REPLY still due (each one that comes starts the wait again, so a target
/// that acknowledges after a slow sync is waited for; one that sends some
/// but not all, like the Python router, or none, like the one-message
/// forwarder, costs a client this much at the end of a run; throughput
/// and latency do not count it). The drain timeout bounds the whole wait.
const ACK_GRACE: Duration = Duration::from_secs(1);

/// One client: sends REQUESTs as its pacer allows, tallies receipts and
/// acceptance REPLYs, and returns once every job is in or the drain ends.
fn client(ctx: &RunCtx, index: usize, clock: Clock) -> Result<Tally, BenchError> {
    let mut tally = client_load(ctx, index, clock)?;
    tally.producer_cpu_ns = thread_cpu_ns();
    Ok(tally)
}

/// CPU time of the calling thread so far, ns (0 if the clock fails).
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec into the valid `ts`.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return 0;
    }
    (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64)
}

fn client_load(ctx: &RunCtx, index: usize, clock: Clock) -> Result<Tally, BenchError> {
    let s = &ctx.settings;
    let mut dealers = Vec::with_capacity(ctx.frontends.len());
    for (frontend, curve) in &ctx.frontends {
        let dealer = socket(ctx, zmq::DEALER)?;
        dealer.set_identity(&new_msgid()).map_err(ZmqError::at("identity"))?;
        dealer.set_sndtimeo(s.probe_timeout.as_millis() as i32).map_err(ZmqError::at("SNDTIMEO"))?;
        connect_all(&dealer, frontend, curve.as_ref())?;
        dealers.push(dealer);
    }
    let pull = socket(ctx, zmq::PULL)?;
    pull.bind(&ctx.done_endpoint(index)).map_err(ZmqError::at("bind inproc"))?;
    let queues: Vec<Vec<u8>> = s.queue_list().into_iter().map(|(_, q)| q.into_bytes()).collect();
    let mut pacer = Pacer::new(s, index);
    let mut tally = Tally::new(s.warmup.as_nanos() as u64);
    let mut drain_end: Option<u64> = None;
    let mut acks_end: Option<u64> = None;
    let mut acks_seen = 0;
    loop {
        let mut now = clock.now_ns();
        while let Some(t) = pacer.next_send(now, tally.outstanding()) {
            let seq = tally.on_send(t);
            let msgid = format!("{index}:{seq}");
            let q = &queues[seq as usize % queues.len()];
            // Round-robin over the owners, one REQUEST at a time.
            let dealer = &dealers[seq as usize % dealers.len()];
            send(
                dealer,
                &[b"", VERSION, b"REQUEST", msgid.as_bytes(), q, b"", &body::encode(index, seq, t, s.size)],
                "REQUEST",
            )?;
            now = clock.now_ns();
        }
        if pacer.finished(now) {
            let end = *drain_end.get_or_insert(now + s.drain_timeout.as_nanos() as u64);
            // Acceptance REPLYs may trail the jobs (emq with durability
            // "sync" sends them after the sync; workers get jobs before):
            // once every job is in, wait for them while they keep coming.
            if tally.outstanding() == 0 {
                if tally.accepted != acks_seen {
                    (acks_seen, acks_end) = (tally.accepted, None);
                }
                let acks_end = *acks_end.get_or_insert(now + ACK_GRACE.as_nanos() as u64);
                if tally.acks_outstanding() == 0 || now >= acks_end.min(end) {
                    return Ok(tally);
                }
            } else if now >= end {
                return Ok(tally);
            }
        }
        let wait = pacer.wait(now, Duration::from_millis(10));
        let mut items: Vec<zmq::PollItem> = dealers.iter().map(|d| d.as_poll_item(zmq::POLLIN)).collect();
        items.push(pull.as_poll_item(zmq::POLLIN));
        if zmq::poll(&mut items, wait.as_millis() as i64).map_err(ZmqError::at("poll"))? == 0 && wait > Duration::ZERO {
            std::thread::sleep(wait.min(Duration::from_micros(200)));
        }
        drain(ctx, &dealers, &pull, &clock, &mut tally)?;
    }
}

fn drain(
    ctx: &RunCtx,
    dealers: &[zmq::Socket],
    pull: &zmq::Socket,
    clock: &Clock,
    t: &mut Tally,
) -> Result<(), BenchError> {
    for dealer in dealers {
        while let Ok(f) = dealer.recv_multipart(zmq::DONTWAIT) {
            match f.get(2).map(Vec::as_slice) {
                Some(b"REPLY") if f.len() == 5 => {
                    let seq = std::str::from_utf8(&f[4])
                        .ok()
                        .and_then(|m| m.split_once(':'))
                        .and_then(|(_, s)| s.parse().ok());
                    t.on_ack(seq.unwrap_or(u64::MAX), clock.now_ns());
                }
                Some(b"ERROR") => t.errors += 1,
                _ => {}
            }
        }
    }
    while let Ok(note) = pull.recv_bytes(zmq::DONTWAIT) {
        if note.len() == 16 {
            let seq = u64::from_le_bytes(note[..8].try_into().unwrap_or_default());
            let recv_ns = u64::from_le_bytes(note[8..].try_into().unwrap_or_default());
            let before = t.received;
            t.on_receipt(seq, recv_ns);
            ctx.progress.fetch_add(t.received - before, Ordering::Relaxed);
        }
    }
    Ok(())
}
