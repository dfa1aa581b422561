//! The clients of the fault tests beyond the steady [`load`]: the main
//! load's threads ([`Load`]), jobs sent and acknowledged one by one before
//! a fault, queues served from memory during one, and the jobs a router
//! holds taken after its restart.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::ledger::{self, lock, Answer, Shared};
use super::load::{self, Flow, Gate, Threads};
use super::rig::Node;
use super::{PRE_JOBS, SERVED_BOUND};
use crate::common::wait;

/// Producers and consumers of the main queues (`default` over eMQP, `tq`
/// over text).
pub(crate) struct Load {
    pub(crate) producers: Threads,
    pub(crate) consumers: Threads,
    pub(crate) quiet: Arc<AtomicBool>,
}

impl Load {
    /// One producer per protocol (eMQP every 4 ms, text every 8 ms) and one
    /// consumer per protocol.
    pub(crate) fn start(node: &Node, ledger: &Shared) -> Load {
        let quiet = Arc::new(AtomicBool::new(false));
        let flow = |prefix: &str, queue: &str, ms: u64| Flow {
            prefix: prefix.into(),
            queue: queue.into(),
            pace: Duration::from_millis(ms),
            quiet: quiet.clone(),
        };
        let mut producers = Threads::default();
        let (fe, f, l) = (node.frontend(), flow("e", "default", 4), ledger.clone());
        producers.spawn(move |stop| load::emqp_producer(fe, f, l, stop));
        let (addr, f, l) = (node.text(), flow("t", "tq", 8), ledger.clone());
        producers.spawn(move |stop| load::text_producer(addr, f, l, stop));
        let consumers = Load::consumers(node, ledger);
        Load { producers, consumers, quiet }
    }

    /// A worker on `default` and a text consumer of `tq`.
    pub(crate) fn consumers(node: &Node, ledger: &Shared) -> Threads {
        let mut consumers = Threads::default();
        let (be, l) = (node.backend(), ledger.clone());
        let queues = r#"[[10, "default"]]"#.to_string();
        consumers.spawn(move |stop| load::emqp_worker(be, "w0".into(), queues, Gate::open(), l, stop));
        let (addr, l) = (node.text(), ledger.clone());
        consumers.spawn(move |stop| load::text_consumer(addr, "c0".into(), "tq".into(), l, stop));
        consumers
    }

    /// Stops sending, waits (bounded) for the answers of what was sent,
    /// stops the producers.
    pub(crate) fn quiet_producers(self, ledger: &Shared) -> Threads {
        self.quiet.store(true, Ordering::Relaxed);
        let answered = wait::until(Duration::from_secs(15), || lock(ledger).jobs.values().all(|s| s.answer.is_some()));
        self.producers.stop();
        assert!(answered, "answers missing 15 s after the last send: {}", lock(ledger).counts());
        self.consumers
    }
}

/// Sends `n` jobs `<prefix>-<i>` to `queue` over eMQP, each acknowledged
/// before the next; records them in the ledger.
pub(crate) fn send_acked_emqp(node: &Node, ledger: &Shared, prefix: &str, queue: &str, n: usize) {
    let ctx = zmq::Context::new();
    let s = load::dealer(&ctx, &node.frontend());
    for i in 0..n {
        let body = format!("{prefix}-{i:04}");
        let frames: [&[u8]; 7] =
            [b"", b"eMQP/1.0", b"REQUEST", body.as_bytes(), queue.as_bytes(), b"", body.as_bytes()];
        let at = Instant::now();
        s.send_multipart(frames, 0).expect("send a REQUEST");
        let f = load::recv_within(&s, 10_000).unwrap_or_else(|| panic!("no answer to {body}"));
        assert_eq!((f[2].as_slice(), f[4].as_slice()), (&b"REPLY"[..], body.as_bytes()), "{body} acknowledged");
        lock(ledger).jobs.insert(body, ledger::Sent { at, answer: Some((Instant::now(), Answer::Acked)) });
    }
}

/// Sends `n` tasks `<prefix>-<i>` to `queue` over text and waits for the
/// `NOPE` behind them (all stored); records them in the ledger.
pub(crate) fn send_acked_text(node: &Node, ledger: &Shared, prefix: &str, queue: &str, n: usize) {
    use std::io::Write;
    let s = std::net::TcpStream::connect(node.text()).expect("a text connection");
    s.set_read_timeout(Some(Duration::from_millis(100))).expect("read timeout");
    let mut r = std::io::BufReader::new(s.try_clone().expect("clone"));
    let bodies: Vec<String> = (0..n).map(|i| format!("{prefix}-{i:04}")).collect();
    let mut out: String = bodies.iter().map(|b| format!("SCHED {b}@{queue}\n")).collect();
    out += "ASK probe\n";
    let at = Instant::now();
    (&s).write_all(out.as_bytes()).expect("write");
    let stop = AtomicBool::new(false);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|sc| {
        sc.spawn(|| tx.send(load::read_line(&mut r, &stop)));
        let line = rx.recv_timeout(Duration::from_secs(10));
        stop.store(true, Ordering::Relaxed);
        assert_eq!(line, Ok(Some("NOPE".to_string())), "{n} SCHEDs to {queue} stored");
    });
    let mut l = lock(ledger);
    for b in bodies {
        l.jobs.insert(b, ledger::Sent { at, answer: Some((Instant::now(), Answer::Acked)) });
    }
}

/// A one-slot eMQP worker registered on `queue` (see [`Gate`]) on a
/// thread of `threads`; returns once the router acknowledged its INFORM.
pub(crate) fn gated_worker(node: &Node, ledger: &Shared, queue: &str, gate: &Arc<Gate>, threads: &mut Threads) {
    let (be, l, g, name) = (node.backend(), ledger.clone(), gate.clone(), format!("take-{queue}"));
    let queues = format!(r#"[[10, "{queue}"]]"#);
    threads.spawn(move |stop| load::emqp_worker(be, name, queues, g, l, stop));
    let informed = wait::until(Duration::from_secs(10), || gate.informed.load(Ordering::Relaxed));
    assert!(informed, "a worker on {queue} registered");
}

/// How many jobs the worker of [`gated_worker`] on `queue` ran.
pub(crate) fn taken(ledger: &Shared, queue: &str) -> usize {
    let name = format!("take-{queue}");
    lock(ledger).deliveries.iter().filter(|d| d.consumer == name).count()
}

/// Runs `n` jobs of `queue` with a new one-slot eMQP worker within
/// `within`; how many it ran.
pub(crate) fn take_emqp(node: &Node, ledger: &Shared, queue: &str, n: usize, within: Duration) -> usize {
    let mut threads = Threads::default();
    let before = taken(ledger, queue);
    gated_worker(node, ledger, queue, &Gate::open(), &mut threads);
    wait::until(within, || taken(ledger, queue) >= before + n);
    threads.stop();
    taken(ledger, queue) - before
}

/// Takes every task of `queue` over text (`ASK`, `ACK` until `NOPE`),
/// within `within`; the bodies in order.
pub(crate) fn take_text(node: &Node, ledger: &Shared, queue: &str, within: Duration) -> Vec<String> {
    use std::io::Write;
    let s = std::net::TcpStream::connect(node.text()).expect("a text connection");
    s.set_read_timeout(Some(Duration::from_millis(100))).expect("read timeout");
    s.set_nodelay(true).expect("nodelay");
    let mut r = std::io::BufReader::new(s.try_clone().expect("clone"));
    let stop = AtomicBool::new(false);
    let deadline = Instant::now() + within;
    let mut got = Vec::new();
    while Instant::now() < deadline {
        (&s).write_all(format!("ASK {queue}\n").as_bytes()).expect("write ASK");
        match load::read_line(&mut r, &stop) {
            Some(l) if l.starts_with("WANT? ") => {
                let body = l["WANT? ".len()..].to_string();
                lock(ledger)
                    .deliveries
                    .push(ledger::Delivery { consumer: format!("take-{queue}"), body: body.clone() });
                got.push(body);
                (&s).write_all(b"ACK\n").expect("write ACK");
            }
            Some(l) if l == "NOPE" => break,
            other => panic!("ASK {queue} got {other:?}"),
        }
    }
    got
}

/// Takes one task of `queue` over text (`ASK`) and does not answer it: it
/// stays offered (in flight) while the connection returned is open.
pub(crate) fn offer_text(node: &Node, ledger: &Shared, queue: &str) -> std::net::TcpStream {
    use std::io::Write;
    let s = std::net::TcpStream::connect(node.text()).expect("a text connection");
    s.set_read_timeout(Some(Duration::from_millis(100))).expect("read timeout");
    let mut r = std::io::BufReader::new(s.try_clone().expect("clone"));
    (&s).write_all(format!("ASK {queue}\n").as_bytes()).expect("write ASK");
    let line = load::read_line(&mut r, &AtomicBool::new(false));
    let body =
        line.as_deref().and_then(|l| l.strip_prefix("WANT? ")).unwrap_or_else(|| panic!("ASK {queue}: {line:?}"));
    lock(ledger).deliveries.push(ledger::Delivery { consumer: format!("offered-{queue}"), body: body.to_string() });
    s
}

/// Jobs queued before a fault on `pre-e` (eMQP, its worker registered
/// and not READY) and `pre-t` (text), served during it.
pub(crate) struct PreQueues {
    gate: Arc<Gate>,
    worker: Threads,
}

impl PreQueues {
    /// Queues [`PRE_JOBS`] jobs on each.
    pub(crate) fn queue(node: &Node, ledger: &Shared) -> PreQueues {
        let (gate, mut worker) = (Arc::new(Gate::default()), Threads::default());
        gated_worker(node, ledger, "pre-e", &gate, &mut worker);
        send_acked_emqp(node, ledger, "pre-e", "pre-e", PRE_JOBS);
        send_acked_text(node, ledger, "pre-t", "pre-t", PRE_JOBS);
        PreQueues { gate, worker }
    }

    /// During a fault: the jobs are served from memory (the worker runs
    /// them, a text client ASKs them), within [`SERVED_BOUND`]; how long
    /// it took.
    pub(crate) fn serve(self, node: &Node, ledger: &Shared) -> Duration {
        let t0 = Instant::now();
        self.gate.go.store(true, Ordering::Relaxed);
        wait::until(SERVED_BOUND, || taken(ledger, "pre-e") >= PRE_JOBS);
        self.worker.stop();
        let ran = taken(ledger, "pre-e");
        let asked = take_text(node, ledger, "pre-t", SERVED_BOUND);
        let want: Vec<String> = (0..PRE_JOBS).map(|i| format!("pre-t-{i:04}")).collect();
        assert_eq!((ran, &asked), (PRE_JOBS, &want), "jobs queued before the fault are served from memory");
        t0.elapsed()
    }
}

/// Waits until no job is in flight (a consumer stopped with one is
/// requeued after its heartbeat timeout); the waiting jobs by queue then.
pub(crate) fn waiting_when_idle(node: &Node) -> BTreeMap<String, u64> {
    let idle = wait::until_ok(Duration::from_secs(20), || {
        let s = node.status()?;
        if s["inflight_messages_by_queue"].as_object().is_some_and(|m| m.is_empty()) {
            let w = s["waiting_messages_by_queue"].as_object().cloned().unwrap_or_default();
            Ok(w.into_iter().map(|(q, n)| (q, n.as_u64().unwrap_or(0))).collect())
        } else {
            Err(format!("in flight: {}", s["inflight_messages_by_queue"]))
        }
    });
    idle.unwrap_or_else(|why| panic!("jobs stay in flight: {why}"))
}

/// Sends `body` to `queue` over eMQP from a fresh client every 200 ms
/// until a REPLY comes, within `within`; how long it took.
pub(crate) fn send_until_acked(
    node: &Node,
    ledger: &Shared,
    body: &str,
    queue: &str,
    within: Duration,
) -> Result<Duration, String> {
    let t0 = Instant::now();
    let ctx = zmq::Context::new();
    let mut last = String::new();
    let mut n = 0;
    while t0.elapsed() < within {
        let s = load::dealer(&ctx, &node.frontend());
        let b = format!("{body}-{n}");
        n += 1;
        let frames: [&[u8]; 7] = [b"", b"eMQP/1.0", b"REQUEST", b.as_bytes(), queue.as_bytes(), b"", b.as_bytes()];
        let at = Instant::now();
        s.send_multipart(frames, 0).map_err(|e| e.to_string())?;
        lock(ledger).jobs.insert(b.clone(), ledger::Sent { at, answer: None });
        match load::recv_within(&s, 2000) {
            Some(f) if f[2] == b"REPLY" => {
                lock(ledger).jobs.insert(b, ledger::Sent { at, answer: Some((Instant::now(), Answer::Acked)) });
                return Ok(t0.elapsed());
            }
            Some(f) => {
                let text = |i: usize| String::from_utf8_lossy(&f[i]).into_owned();
                last = format!("{:?}", f.iter().map(|x| String::from_utf8_lossy(x)).collect::<Vec<_>>());
                if f[2] == b"ERROR" {
                    let answer = Answer::Refused { code: text(5), text: text(6) };
                    lock(ledger).jobs.insert(b, ledger::Sent { at, answer: Some((Instant::now(), answer)) });
                }
            }
            None => last = "no answer in 2 s".into(),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Err(format!("not acknowledged within {within:?}; last answer {last}"))
}
