//! Durability (issue 12) over real sockets: `kill -9` of `emq-router` at
//! random points while numbered eMQP and text producers and consumers run,
//! restarts on the same data directory, torn writes, a flipped byte, the
//! lock file, and a clean restart keeping queues in order. Disk faults
//! (full, read-only, deleted) are in [`faults`].
//!
//! The crash test's rules (what "acknowledged" and "in flight" mean here):
//! * an eMQP job is acknowledged when its acceptance REPLY arrived, refused
//!   when an `ERROR` for it did; a text job is acknowledged when a later
//!   reply on its connection arrived (the producer sends `ASK probe`, a
//!   queue nobody fills, after every SCHED: `NOPE`), refused when an `ERR`
//!   came before that `NOPE`;
//! * a consumer takes one job at a time (a worker with one slot, a text
//!   client ASKing after its ACK), so its next job (or `NOPE`) shows that
//!   the router stored the completion of the one before; a consumer's last
//!   job before a crash is "in flight at the crash";
//! * after every restart: every acknowledged job is delivered at least
//!   once; a job is delivered again only after a restart, and only if its
//!   earlier delivery was in flight at that crash; nothing is delivered
//!   that was never sent or that was refused; and each consumer gets the
//!   jobs no one had before in the producer's order.
//!
//! `EMQ_CRASH_KILLS` sets the number of kills of the CI tests (3 by
//! default); the soak, [`crash_soak_25_kills_each_protocol_and_mode`], is
//! `#[ignore]`d (about 30 s): `cargo test --release --test tests
//! crash_soak -- --ignored --nocapture`. `EMQ_CRASH_SEED` sets the random
//! seed (printed by every run).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::common::ports::{free_port, is_listening, zmq_endpoint};
use crate::common::proc::{Child, TestDir};
use crate::common::router::rust_router_bin;
use crate::common::wait;
use crate::common::watchdog::Watchdog;

mod faults;

/// The router binary on fixed ports and a data directory, restartable
/// (also used by the replicated-log tests, `tests/replicated.rs` and
/// `tests/replicated_faults.rs`).
pub(crate) struct Node {
    /// Frontend, backend, admin and text ports.
    pub(crate) ports: [u16; 4],
    /// Its data directory.
    pub(crate) data: PathBuf,
    /// Where its output goes (appended).
    pub(crate) log: PathBuf,
    /// Its HTTP port (`/metrics`, the status page); `None`: `--metrics off`.
    pub(crate) metrics: Option<u16>,
}

impl Node {
    pub(crate) fn new(dir: &TestDir) -> Node {
        Node::with_data(dir, dir.join("router-data"))
    }

    /// A node whose data directory is `data` (on a file system of the
    /// test's own, say).
    pub(crate) fn with_data(dir: &TestDir, data: PathBuf) -> Node {
        let ports = [free_port(), free_port(), free_port(), free_port()];
        Node { ports, data, log: dir.join("router.log"), metrics: None }
    }

    pub(crate) fn frontend(&self) -> String {
        zmq_endpoint(self.ports[0])
    }

    pub(crate) fn backend(&self) -> String {
        zmq_endpoint(self.ports[1])
    }

    pub(crate) fn admin(&self) -> String {
        zmq_endpoint(self.ports[2])
    }

    pub(crate) fn text(&self) -> String {
        format!("127.0.0.1:{}", self.ports[3])
    }

    pub(crate) fn command(&self, extra: &[&str]) -> Command {
        let mut cmd = Command::new(rust_router_bin());
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("EMQ_") {
                cmd.env_remove(key);
            }
        }
        // EventMQ's unknown-queue rule from the first second (tests that
        // want `queue_learn_grace` give the flag).
        cmd.env("EMQ_QUEUE_LEARN_GRACE", "0s");
        cmd.args(["--frontend", &self.frontend(), "--backend", &self.backend()])
            .args(["--admin", &self.admin(), "--text", &self.text()])
            .args(["--drain-timeout", "200ms", "--latency-interval", "0s"])
            .args(["--metrics", &self.metrics.map_or("off".to_string(), |p| format!("127.0.0.1:{p}"))])
            .arg("--data-dir")
            .arg(&self.data)
            .args(extra);
        cmd
    }

    /// Starts the router and waits until every port listens.
    pub(crate) fn start(&self, extra: &[&str]) -> Child {
        let mut child = Child::spawn("router", &mut self.command(extra), &self.log);
        let up =
            wait::until(Duration::from_secs(30), || !child.is_alive() || self.ports.iter().all(|&p| is_listening(p)));
        assert!(up && child.is_alive(), "router did not come up\n{}", child.log_tail(40));
        child
    }

    /// Runs the router expecting it to exit at once; its status and log.
    pub(crate) fn run_to_exit(&self, extra: &[&str], dir: &TestDir) -> (Option<std::process::ExitStatus>, String) {
        let (status, _, err) =
            crate::common::proc::run("router-once", &mut self.command(extra), &dir.path, Duration::from_secs(30));
        (status, err)
    }

    /// STATUS as JSON.
    pub(crate) fn status(&self) -> serde_json::Value {
        self.ask("STATUS")
    }

    /// The JSON answer to admin command `command` (`STATUS`, `LATENCY`).
    pub(crate) fn ask(&self, command: &str) -> serde_json::Value {
        let ctx = zmq::Context::new();
        let sock = ctx.socket(zmq::DEALER).expect("socket");
        sock.set_linger(0).expect("linger");
        sock.connect(&self.admin()).expect("connect");
        sock.send_multipart([&b""[..], b"eMQP/1.0", command.as_bytes(), b"s1"], 0).expect("send");
        let mut items = [sock.as_poll_item(zmq::POLLIN)];
        zmq::poll(&mut items, 5000).expect("poll");
        assert!(items[0].is_readable(), "no {command} reply");
        let f = sock.recv_multipart(0).expect("recv");
        serde_json::from_slice(&f[4]).expect("the answer is JSON")
    }
}

/// What the producers sent and saw acknowledged or refused, and what
/// consumers got.
#[derive(Default)]
struct Ledger {
    sent: BTreeSet<String>,
    acked: BTreeSet<String>,
    /// Jobs the router refused (eMQP `ERROR`, text `ERR`): never accepted.
    refused: BTreeSet<String>,
    /// Refusals by code (`QUEUE_FULL`, `STORE_FULL`, …).
    codes: BTreeMap<String, u64>,
    /// Deliveries in arrival order: `(phase, consumer, body, confirmed)`;
    /// `confirmed` is set once the same consumer got its next job or NOPE.
    delivered: Vec<(usize, String, String, bool)>,
}

impl Ledger {
    fn deliver(&mut self, phase: usize, consumer: &str, body: String) {
        self.confirm(phase, consumer);
        self.delivered.push((phase, consumer.to_string(), body, false));
    }

    /// How many jobs were sent, acknowledged, refused and delivered.
    fn counts(&self) -> String {
        let (sent, acked, refused) = (self.sent.len(), self.acked.len(), self.refused.len());
        format!("sent {sent}, acked {acked}, refused {refused}, delivered {}", self.delivered.len())
    }

    /// The consumer's previous delivery in this phase is complete for sure.
    fn confirm(&mut self, phase: usize, consumer: &str) {
        if let Some(d) = self.delivered.iter_mut().rev().find(|d| d.0 == phase && d.1 == consumer) {
            d.3 = true;
        }
    }
}

type Shared = Arc<Mutex<Ledger>>;

/// Most jobs sent and not yet delivered before producers pause: consumers
/// take one job at a time, so the backlog must stay drainable.
const BACKLOG: usize = 1000;

/// Whether producers should pause (the backlog is full).
fn backlog_full(ledger: &Shared) -> bool {
    let l = lock(ledger);
    l.sent.len() > l.delivered.len() + l.refused.len() + BACKLOG
}

fn lock(l: &Shared) -> std::sync::MutexGuard<'_, Ledger> {
    l.lock().unwrap_or_else(|e| e.into_inner())
}

/// A DEALER with a fresh uuid identity, connected to `endpoint`.
pub(crate) fn dealer(ctx: &zmq::Context, endpoint: &str) -> Option<zmq::Socket> {
    let s = ctx.socket(zmq::DEALER).ok()?;
    s.set_linger(0).ok()?;
    s.set_identity(uuid::Uuid::new_v4().to_string().as_bytes()).ok()?;
    s.connect(endpoint).ok()?;
    Some(s)
}

/// One message from `s` within `ms` milliseconds.
pub(crate) fn recv_within(s: &zmq::Socket, ms: i64) -> Option<Vec<Vec<u8>>> {
    let mut items = [s.as_poll_item(zmq::POLLIN)];
    zmq::poll(&mut items, ms).ok()?;
    if items[0].is_readable() {
        s.recv_multipart(0).ok()
    } else {
        None
    }
}

/// Sends numbered REQUESTs to `default`, up to 8 unacknowledged.
fn emqp_producer(node_fe: String, next: Arc<AtomicU64>, ledger: Shared, stop: Arc<AtomicBool>) {
    let ctx = zmq::Context::new();
    let Some(s) = dealer(&ctx, &node_fe) else { return };
    let mut outstanding = 0;
    while !stop.load(Ordering::Relaxed) {
        while outstanding < 8 && !backlog_full(&ledger) {
            let body = format!("e-{:08}", next.fetch_add(1, Ordering::Relaxed));
            lock(&ledger).sent.insert(body.clone());
            let frames: [&[u8]; 7] = [b"", b"eMQP/1.0", b"REQUEST", body.as_bytes(), b"default", b"", body.as_bytes()];
            if s.send_multipart(frames, zmq::DONTWAIT).is_err() {
                return;
            }
            outstanding += 1;
        }
        if let Some(f) = recv_within(&s, 50) {
            // Both answers name the REQUEST's msgid (its body) in frame 4.
            let body = || String::from_utf8_lossy(&f[4]).into_owned();
            match f.get(2).map(Vec::as_slice) {
                Some(b"REPLY") if f.len() == 5 => lock(&ledger).acked.insert(body()),
                Some(b"ERROR") if f.len() >= 6 => {
                    let mut l = lock(&ledger);
                    *l.codes.entry(String::from_utf8_lossy(&f[5]).into_owned()).or_default() += 1;
                    l.refused.insert(body())
                }
                _ => continue,
            };
            outstanding -= 1;
        }
    }
}

/// A worker with one slot on `default`: records each job, then REPLY + READY.
fn emqp_worker(node_be: String, name: String, phase: usize, ledger: Shared, stop: Arc<AtomicBool>) {
    let ctx = zmq::Context::new();
    let Some(s) = dealer(&ctx, &node_be) else { return };
    let inform: [&[u8]; 6] = [b"", b"eMQP/1.0", b"INFORM", b"inform-1", br#"[[10, "default"]]"#, b"worker"];
    if s.send_multipart(inform, 0).is_err() {
        return;
    }
    let mut informed = false;
    while !stop.load(Ordering::Relaxed) {
        let Some(f) = recv_within(&s, 50) else { continue };
        match f.get(2).map(Vec::as_slice) {
            Some(b"ACK") if !informed => {
                informed = true;
                let _ = s.send_multipart([&b""[..], b"eMQP/1.0", b"READY", b"r"], 0);
            }
            Some(b"REQUEST") if f.len() >= 7 => {
                lock(&ledger).deliver(phase, &name, String::from_utf8_lossy(&f[6]).into_owned());
                let reply: [&[u8]; 6] = [b"", b"eMQP/1.0", b"REPLY", b"rep", b"{\"value\": null}", &f[3]];
                let _ = s.send_multipart(reply, 0);
                let _ = s.send_multipart([&b""[..], b"eMQP/1.0", b"READY", b"r"], 0);
            }
            _ => {}
        }
    }
}

/// A text protocol connection to `addr` (writer, reader): `TCP_NODELAY`,
/// reads time out every 200 ms (see [`read_line`]).
pub(crate) fn text_conn(addr: &str) -> Option<(TcpStream, BufReader<TcpStream>)> {
    let s = TcpStream::connect(addr).ok()?;
    // ACK has no answer: without NODELAY the next command waits for the
    // delayed TCP acknowledgement (40 ms) behind it.
    s.set_nodelay(true).ok()?;
    s.set_read_timeout(Some(Duration::from_millis(200))).ok()?;
    let r = BufReader::new(s.try_clone().ok()?);
    Some((s, r))
}

/// Reads one line, retrying read timeouts until `stop`; `None` on EOF,
/// error or stop.
pub(crate) fn read_line(r: &mut BufReader<TcpStream>, stop: &AtomicBool) -> Option<String> {
    let mut line = String::new();
    loop {
        match r.read_line(&mut line) {
            Ok(0) => return None,
            Ok(_) if line.ends_with('\n') => return Some(line.trim_end().to_string()),
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                if stop.load(Ordering::Relaxed) {
                    return None;
                }
            }
            Err(_) => return None,
        }
    }
}

/// SCHEDs numbered tasks to `tq`, four per write, each followed by an
/// `ASK probe`: a task is acknowledged by that ASK's `NOPE`, and refused
/// when an `ERR` (SCHED answers nothing when it works) comes before it.
fn text_producer(addr: String, next: Arc<AtomicU64>, ledger: Shared, stop: Arc<AtomicBool>) {
    let Some((mut w, mut r)) = text_conn(&addr) else { return };
    while !stop.load(Ordering::Relaxed) {
        if backlog_full(&ledger) {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        }
        let group: Vec<String> = (0..4).map(|_| format!("t-{:08}", next.fetch_add(1, Ordering::Relaxed))).collect();
        let mut out = String::new();
        for body in &group {
            out += &format!("SCHED {body}@tq\nASK probe\n");
        }
        lock(&ledger).sent.extend(group.iter().cloned());
        if w.write_all(out.as_bytes()).is_err() {
            return;
        }
        for body in group {
            let mut refused = None;
            loop {
                match read_line(&mut r, &stop) {
                    Some(line) if line == "NOPE" => break,
                    Some(err) if err.starts_with("ERR ") && refused.is_none() => {
                        refused = err.split(' ').nth(1).map(str::to_string);
                    }
                    Some(other) => panic!("text producer got {other:?} for {body}"),
                    None => return,
                }
            }
            let mut l = lock(&ledger);
            match refused {
                Some(code) => {
                    *l.codes.entry(code).or_default() += 1;
                    l.refused.insert(body);
                }
                None => {
                    l.acked.insert(body);
                }
            }
        }
    }
}

/// ASK tq → record → ACK, one task at a time.
fn text_consumer(addr: String, name: String, phase: usize, ledger: Shared, stop: Arc<AtomicBool>) {
    let Some((mut w, mut r)) = text_conn(&addr) else { return };
    while !stop.load(Ordering::Relaxed) {
        if w.write_all(b"ASK tq\n").is_err() {
            return;
        }
        match read_line(&mut r, &stop) {
            Some(line) if line.starts_with("WANT? ") => {
                lock(&ledger).deliver(phase, &name, line["WANT? ".len()..].to_string());
                if w.write_all(b"ACK\n").is_err() {
                    return;
                }
            }
            Some(line) if line == "NOPE" => {
                lock(&ledger).confirm(phase, &name);
                std::thread::sleep(Duration::from_millis(5));
            }
            Some(other) => panic!("text consumer got {other:?}"),
            None => return,
        }
    }
}

/// The threads of one phase.
struct Phase {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Phase {
    fn start(node: &Node, phase: usize, producers: bool, ledger: &Shared, counters: &[Arc<AtomicU64>; 2]) -> Phase {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        let spawn = |f: Box<dyn FnOnce() + Send>| std::thread::spawn(f);
        for i in 0..2 {
            let (be, l, st) = (node.backend(), ledger.clone(), stop.clone());
            threads.push(spawn(Box::new(move || emqp_worker(be, format!("w{i}"), phase, l, st))));
            let (addr, l, st) = (node.text(), ledger.clone(), stop.clone());
            threads.push(spawn(Box::new(move || text_consumer(addr, format!("c{i}"), phase, l, st))));
        }
        if producers {
            let (fe, n, l, st) = (node.frontend(), counters[0].clone(), ledger.clone(), stop.clone());
            threads.push(spawn(Box::new(move || emqp_producer(fe, n, l, st))));
            let (addr, n, l, st) = (node.text(), counters[1].clone(), ledger.clone(), stop.clone());
            threads.push(spawn(Box::new(move || text_producer(addr, n, l, st))));
        }
        Phase { stop, threads }
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            if let Err(e) = t.join() {
                std::panic::resume_unwind(e);
            }
        }
    }
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// xorshift64, reproducible from the printed seed.
fn next_random(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Checks the ledger against the rules in the module docs.
fn check(ledger: &Ledger) {
    let delivered: BTreeSet<&String> = ledger.delivered.iter().map(|d| &d.2).collect();
    let never_sent: Vec<&&String> = delivered.iter().filter(|b| !ledger.sent.contains(**b)).collect();
    assert!(never_sent.is_empty(), "delivered but never sent: {never_sent:?}");
    let refused: Vec<&&String> = delivered.iter().filter(|b| ledger.refused.contains(**b)).collect();
    assert!(refused.is_empty(), "delivered but refused when sent: {refused:?}");
    let both: Vec<&String> = ledger.acked.intersection(&ledger.refused).collect();
    assert!(both.is_empty(), "both acknowledged and refused: {both:?}");
    let lost: Vec<&String> = ledger.acked.iter().filter(|b| !delivered.contains(b)).collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged jobs never delivered, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(10)]
    );
    // A job comes again only after a restart, and only if its delivery
    // before was in flight at that crash (not confirmed).
    let mut seen: BTreeMap<&String, (usize, bool)> = BTreeMap::new();
    for (phase, consumer, body, confirmed) in &ledger.delivered {
        if let Some(&(was_phase, was_confirmed)) = seen.get(body) {
            assert!(
                *phase > was_phase,
                "{body} delivered twice in phase {was_phase} (again to {consumer}): no restart between"
            );
            assert!(!was_confirmed, "{body} delivered again (phase {phase}, {consumer}) after a confirmed completion");
        }
        seen.insert(body, (*phase, *confirmed));
    }
    let mut first_seen = BTreeSet::new();
    let mut last: BTreeMap<(usize, &String, char), &String> = BTreeMap::new();
    for (phase, consumer, body, _) in &ledger.delivered {
        if !first_seen.insert(body) {
            continue;
        }
        let key = (*phase, consumer, body.chars().next().unwrap_or('?'));
        if let Some(prev) = last.get(&key) {
            assert!(*prev < body, "{consumer} in phase {phase} got {body} after {prev}: order of fresh jobs broken");
        }
        last.insert(key, body);
    }
}

#[test]
fn crash_kill_9_at_random_points_loses_no_acknowledged_job() {
    crash_test("crash", &[], env_number("EMQ_CRASH_KILLS", 3));
}

/// The soak: 25 kills with the default durability (sync, one shard), then
/// 25 with [`ASYNC_TWO_SHARDS`].
#[test]
#[ignore = "soak (about 30 s): cargo test --release --test tests crash_soak -- --ignored"]
fn crash_soak_25_kills_each_protocol_and_mode() {
    crash_test("crash-soak", &[], 25);
    crash_test("crash-soak-async", &ASYNC_TWO_SHARDS, 25);
}

/// `durability = "async"` (a process crash loses nothing: records are
/// written before anything is released), two shards (a worker's home shard
/// tells the queue's shard of completions), and a queue limit the backlog
/// passes, so both protocols' producers also get refusals (`QUEUE_FULL`).
const ASYNC_TWO_SHARDS: [&str; 6] = ["--durability", "async", "--shards", "2", "--max-queue-len", "100"];

/// The crash test with [`ASYNC_TWO_SHARDS`].
#[test]
fn crash_kill_9_async_two_shards() {
    crash_test("crash-async", &ASYNC_TWO_SHARDS, env_number("EMQ_CRASH_KILLS", 3));
}

/// `kills` runs of the load, each ended by a `kill -9` at a random point,
/// then a drain, then [`check`].
fn crash_test(name: &str, flags: &[&str], kills: u64) {
    let _w = Watchdog::new(name, 60 + 20 * kills);
    let clock = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64);
    let seed = env_number("EMQ_CRASH_SEED", clock | 1);
    eprintln!("{name} test: {kills} kills, EMQ_CRASH_SEED={seed}, flags {flags:?}");
    let mut rng = seed;
    let dir = TestDir::new(name);
    let node = Node::new(&dir);
    let ledger: Shared = Arc::default();
    let counters = [Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0))];
    for phase in 0..kills as usize {
        let mut router = node.start(flags);
        let threads = Phase::start(&node, phase, true, &ledger, &counters);
        let run_ms = 100 + next_random(&mut rng) % 700;
        std::thread::sleep(Duration::from_millis(run_ms));
        router.kill_group();
        threads.stop();
        if std::env::var_os("EMQ_CRASH_VERBOSE").is_some() {
            eprintln!("{}", router.log_tail(15));
        }
        let l = lock(&ledger);
        let mut per: BTreeMap<&str, usize> = BTreeMap::new();
        for d in l.delivered.iter().filter(|d| d.0 == phase) {
            *per.entry(d.1.as_str()).or_default() += 1;
        }
        eprintln!("phase {phase}: killed after {run_ms} ms; {} (this phase: {per:?})", l.counts());
    }
    let _router = node.start(flags);
    let drain = Phase::start(&node, kills as usize, false, &ledger, &counters);
    let done = wait::until(Duration::from_secs(60), || {
        let l = lock(&ledger);
        let got: BTreeSet<&String> = l.delivered.iter().map(|d| &d.2).collect();
        l.acked.iter().all(|b| got.contains(b)) && {
            let s = node.status();
            s["waiting_messages_by_queue"].as_object().is_some_and(|m| m.is_empty())
                && s["inflight_messages_by_queue"].as_object().is_some_and(|m| m.is_empty())
        }
    });
    drain.stop();
    let l = lock(&ledger);
    eprintln!("end: {}", l.counts());
    check(&l);
    assert!(done, "not drained within 60 s");
    assert!(l.acked.len() > kills as usize, "the load ran (acked {})", l.acked.len());
}

/// Sends `n` text SCHEDs to `q` and waits for a later reply (stored).
pub(crate) fn sched(text: &str, q: &str, n: usize) {
    let (mut w, mut r) = text_conn(text).expect("text connection");
    let mut out = String::new();
    for i in 0..n {
        out += &format!("SCHED job-{i:04}@{q}\n");
    }
    out += "ASK probe\n";
    w.write_all(out.as_bytes()).expect("write");
    assert_eq!(read_line(&mut r, &AtomicBool::new(false)).as_deref(), Some("NOPE"));
}

/// Every task waiting in `q` (ASK + ACK until NOPE).
pub(crate) fn drain(text: &str, q: &str) -> Vec<String> {
    let (mut w, mut r) = text_conn(text).expect("text connection");
    let mut got = Vec::new();
    loop {
        w.write_all(format!("ASK {q}\n").as_bytes()).expect("write");
        match read_line(&mut r, &AtomicBool::new(false)) {
            Some(l) if l.starts_with("WANT? ") => {
                got.push(l["WANT? ".len()..].to_string());
                w.write_all(b"ACK\n").expect("write");
            }
            Some(l) if l == "NOPE" => return got,
            other => panic!("drain got {other:?}"),
        }
    }
}

/// The segment files of shard 0, oldest first.
fn segments(data: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(data.join("wal/shard-0"))
        .expect("shard dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "wal"))
        .collect();
    files.sort();
    files
}

#[test]
fn a_flipped_byte_stops_start_up_and_skip_damaged_starts_with_the_rest() {
    let _w = Watchdog::new("flipped_byte", 90);
    let dir = TestDir::new("flipped");
    let node = Node::new(&dir);
    let mut router = node.start(&[]);
    sched(&node.text(), "q", 50);
    router.terminate(Duration::from_secs(10));
    let file = segments(&node.data).into_iter().find(|p| std::fs::metadata(p).map(|m| m.len() > 1000).unwrap_or(false));
    let file = file.expect("a segment holding the 50 jobs");
    let mut bytes = std::fs::read(&file).unwrap();
    let at = bytes.len() / 2;
    // The damaged record is the one holding byte `at`: it starts where the
    // record before it ends.
    let ends = record_ends(&bytes);
    let offset = ends.iter().copied().filter(|&e| e <= at).max().unwrap_or(emq::wal::segment::SEGMENT_HEADER_BYTES);
    assert!(ends.last().is_some_and(|&last| last > at + 60), "valid records after the damaged one: {ends:?}");
    bytes[at] ^= 0x5a;
    std::fs::write(&file, &bytes).unwrap();

    let (status, log) = node.run_to_exit(&[], &dir);
    assert!(status.is_some_and(|s| !s.success()), "start-up must fail: {status:?}\n{log}");
    let damaged = format!("{}: damaged log record at byte offset {offset} (", file.display());
    assert!(log.contains(&damaged), "{damaged}\n{log}");
    assert!(log.contains("--recover-skip-damaged"), "{log}");

    let router = node.start(&["--recover-skip-damaged"]);
    let got = drain(&node.text(), "q");
    assert_eq!(got.len(), 49, "one record lost to the flipped byte: {got:?}");
    let mut sorted = got.clone();
    sorted.sort();
    assert_eq!(got, sorted, "the rest in order");
    let moved = std::fs::read_dir(node.data.join("damaged")).expect("damaged/ folder").count();
    assert_eq!(moved, 1, "the damaged segment is set aside");
    // The start past the damage names the same offset, and how much it skipped.
    let log = std::fs::read_to_string(&node.log).expect("router log");
    let skipped = ends.iter().find(|&&e| e > at).map(|e| e - offset);
    let named = format!("skipping damaged log bytes file={} offset={offset} skipped_bytes=", file.display());
    assert!(log.contains(&named), "{named}\n{}", router.log_tail(20));
    assert!(skipped.is_some_and(|n| log.contains(&format!("{named}{n} "))), "{skipped:?} bytes\n{log}");
}

/// Copies the directory tree `from` to `to` (files and folders only).
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create dir");
    for entry in std::fs::read_dir(from).expect("read dir").flatten() {
        let target = to.join(entry.file_name());
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy file");
        }
    }
}

/// Byte offsets where each record of a segment ends, in file order.
fn record_ends(bytes: &[u8]) -> Vec<usize> {
    let mut at = emq::wal::segment::SEGMENT_HEADER_BYTES;
    let mut ends = Vec::new();
    while let Ok((_, n)) = emq::wal::record::decode(&bytes[at..]) {
        at += n;
        ends.push(at);
    }
    assert_eq!(at, bytes.len(), "the segment is whole before it is cut");
    ends
}

/// A torn write: the last segment of a killed router cut at random
/// offsets (inside the last record, on a record boundary, anywhere, inside
/// the segment header); every start recovers the whole records before the
/// cut, in order, and nothing after it.
#[test]
fn a_torn_last_record_is_cut_and_the_rest_recovered() {
    let _w = Watchdog::new("torn_tail", 150);
    let dir = TestDir::new("torn");
    let node = Node::new(&dir);
    let mut router = node.start(&[]);
    sched(&node.text(), "q", 20);
    router.kill_group();
    let snapshot = dir.join("snapshot");
    copy_tree(&node.data, &snapshot);
    let last = segments(&node.data).pop().expect("a segment");
    let whole = std::fs::read(&last).expect("read the segment");
    let ends = record_ends(&whole);
    assert_eq!(ends.len(), 20, "one Accepted record per job");
    let len = whole.len();
    let clock = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64);
    let mut rng = env_number("EMQ_TORN_SEED", clock | 1);
    eprintln!("torn test: EMQ_TORN_SEED={rng}");
    let header = emq::wal::segment::SEGMENT_HEADER_BYTES;
    let mut cuts = vec![
        len - 1 - (next_random(&mut rng) % 40) as usize, // inside the last record (each is over 60 bytes)
        ends[(next_random(&mut rng) % 19) as usize],     // on a record boundary
        header + (next_random(&mut rng) as usize % (len - header)), // anywhere after the header
        (next_random(&mut rng) % header as u64) as usize, // inside the segment header
    ];
    cuts.push(header + (next_random(&mut rng) as usize % (len - header)));
    for cut in cuts {
        let _ = std::fs::remove_dir_all(&node.data);
        copy_tree(&snapshot, &node.data);
        std::fs::OpenOptions::new().write(true).open(&last).expect("open").set_len(cut as u64).expect("truncate");
        let mut router = node.start(&[]);
        let got = drain(&node.text(), "q");
        let kept = ends.iter().filter(|&&e| e <= cut).count();
        let want: Vec<String> = (0..kept).map(|i| format!("job-{i:04}")).collect();
        assert_eq!(got, want, "cut at byte {cut} of {len}: the whole records before it, in order");
        router.kill_group();
    }
}

#[test]
fn a_second_router_on_the_same_data_dir_exits_with_a_clear_error() {
    let _w = Watchdog::new("second_router", 60);
    let dir = TestDir::new("second");
    let node = Node::new(&dir);
    let _router = node.start(&[]);
    let other = Node {
        ports: [free_port(), free_port(), free_port(), free_port()],
        data: node.data.clone(),
        log: dir.join("other.log"),
        metrics: None,
    };
    let (status, log) = other.run_to_exit(&[], &dir);
    assert!(status.is_some_and(|s| !s.success()), "{status:?}\n{log}");
    assert!(log.contains("is in use by another emq-router"), "{log}");
}

#[test]
fn a_clean_restart_keeps_both_protocols_queues_in_order() {
    let _w = Watchdog::new("clean_restart", 90);
    let dir = TestDir::new("restart");
    let node = Node::new(&dir);
    let mut router = node.start(&[]);
    sched(&node.text(), "q", 30);
    let ctx = zmq::Context::new();
    let c = dealer(&ctx, &node.frontend()).expect("client");
    for i in 0..30 {
        let body = format!("e-{i:04}");
        let frames: [&[u8]; 7] = [b"", b"eMQP/1.0", b"REQUEST", body.as_bytes(), b"default", b"", body.as_bytes()];
        c.send_multipart(frames, 0).unwrap();
        let reply = recv_within(&c, 5000).expect("acceptance REPLY");
        assert_eq!(reply[4], body.as_bytes());
    }
    // Durability sync: each acceptance waited for its own sync, every sync
    // is in LATENCY's `wal_sync` histogram of its shard.
    let latency = node.ask("LATENCY");
    let syncs = node.status()["emq"]["wal"]["shards"][0]["syncs"].as_u64();
    let timed = latency["wal_sync"]["shard-0"]["count"].as_u64();
    assert!(timed.is_some_and(|n| n >= 30) && timed == syncs, "{syncs:?} syncs: {latency}");
    assert_eq!(latency["wal_sync"].as_object().map(|m| m.len()), Some(1), "{latency}");
    let status = router.terminate(Duration::from_secs(10));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    let _router = node.start(&[]);
    let s = node.status();
    assert_eq!(s["waiting_messages_by_queue"], serde_json::json!({"default": 30, "q": 30}), "{s}");
    assert_eq!(s["emq"]["wal"]["shards"][0]["jobs_recovered"], 60, "{s}");
    let got = drain(&node.text(), "q");
    assert_eq!(got, (0..30).map(|i| format!("job-{i:04}")).collect::<Vec<_>>());
    let w = dealer(&ctx, &node.backend()).expect("worker");
    let inform: [&[u8]; 6] = [b"", b"eMQP/1.0", b"INFORM", b"i", br#"[[10, "default"]]"#, b"worker"];
    w.send_multipart(inform, 0).unwrap();
    let mut got = Vec::new();
    while got.len() < 30 {
        let f = recv_within(&w, 5000).expect("a job");
        match f[2].as_slice() {
            b"ACK" => w.send_multipart([&b""[..], b"eMQP/1.0", b"READY", b"r"], 0).unwrap(),
            b"REQUEST" => {
                got.push(String::from_utf8_lossy(&f[6]).into_owned());
                let reply: [&[u8]; 6] = [b"", b"eMQP/1.0", b"REPLY", b"rep", b"{\"value\": null}", &f[3]];
                w.send_multipart(reply, 0).unwrap();
                w.send_multipart([&b""[..], b"eMQP/1.0", b"READY", b"r"], 0).unwrap();
            }
            _ => {}
        }
    }
    assert_eq!(got, (0..30).map(|i| format!("e-{i:04}")).collect::<Vec<_>>());
}

/// A shard directory copied over another (shard 0's segments put in shard
/// 1's directory, as a hand-made backup restored to the wrong place) is
/// refused at start, also with `--recover-skip-damaged`, which would
/// deliver the copy's jobs twice; the message says what it is; with the
/// copy removed the router starts and every job is there once.
#[test]
fn a_copied_shard_directory_is_refused_at_start_even_when_skipping_damage() {
    let _w = Watchdog::new("copied-shard", 90);
    let dir = TestDir::new("copied-shard");
    let node = Node::new(&dir);
    let flags = ["--shards", "2"];
    let mut router = node.start(&flags);
    sched(&node.text(), "kept", 10);
    let status = router.terminate(Duration::from_secs(10));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    let (from, to) = (node.data.join("wal/shard-0"), node.data.join("wal/shard-1"));
    let moved = node.data.join("shard-1-own");
    std::fs::rename(&to, &moved).expect("set shard 1's own directory aside");
    copy_tree(&from, &to);
    for extra in [&[][..], &["--recover-skip-damaged"][..]] {
        let (status, log) = node.run_to_exit(&[&flags[..], extra].concat(), &dir);
        assert!(status.is_some_and(|s| !s.success()), "refused {extra:?}: {status:?}\n{log}");
        assert!(log.contains("this segment's header says it is segment"), "{log}");
        assert!(log.contains("of shard 0, not segment") && log.contains("of shard 1"), "{log}");
        assert!(log.contains("does not skip it, its jobs would be delivered twice"), "{log}");
    }
    std::fs::remove_dir_all(&to).expect("remove the copy");
    std::fs::rename(&moved, &to).expect("put shard 1's own back");
    let _router = node.start(&flags);
    assert_eq!(drain(&node.text(), "kept"), (0..10).map(|i| format!("job-{i:04}")).collect::<Vec<_>>());
}
