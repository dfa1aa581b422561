//! The load of the fault tests: numbered producers on both protocols that
//! keep sending through a fault and one-slot consumers, writing into the
//! [`Ledger`] (what acknowledged and refused mean is said there).
//!
//! * Producers never wait for a fault to end: a client whose oldest
//!   unanswered job is older than [`STUCK`] gets no more jobs, and a fresh
//!   one (a new DEALER, a new TCP connection) takes the next. A stalled log
//!   keeps a client's later answers behind its held acceptances (answers
//!   keep their order while the log is not faulty), so only a fresh client
//!   shows how soon new jobs are refused.
//! * Consumers take one job at a time (an eMQP worker with one slot that
//!   heartbeats every second; a text client `ASK <q> 200`, then `ACK`).

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::ledger::{lock, Answer, Delivery, Sent, Shared};

/// A client whose oldest unanswered job is older than this takes no more.
pub const STUCK: Duration = Duration::from_millis(300);

/// Most clients a producer opens (each job outstanding keeps its client).
const MAX_CLIENTS: usize = 300;

/// A DEALER with a fresh identity, connected to `endpoint`.
pub fn dealer(ctx: &zmq::Context, endpoint: &str) -> zmq::Socket {
    let s = ctx.socket(zmq::DEALER).expect("a DEALER socket");
    s.set_linger(0).expect("linger 0");
    s.set_identity(uuid::Uuid::new_v4().to_string().as_bytes()).expect("identity");
    s.connect(endpoint).expect("connect the DEALER");
    s
}

/// The next message on `s` within `ms`, if any.
pub fn recv_within(s: &zmq::Socket, ms: i64) -> Option<Vec<Vec<u8>>> {
    let mut items = [s.as_poll_item(zmq::POLLIN)];
    zmq::poll(&mut items, ms).ok()?;
    if items[0].is_readable() {
        s.recv_multipart(zmq::DONTWAIT).ok()
    } else {
        None
    }
}

/// A REQUEST of `body` (also its msgid) to `queue`.
fn request(s: &zmq::Socket, queue: &str, body: &str) -> bool {
    let frames: [&[u8]; 7] = [b"", b"eMQP/1.0", b"REQUEST", body.as_bytes(), queue.as_bytes(), b"", body.as_bytes()];
    s.send_multipart(frames, zmq::DONTWAIT).is_ok()
}

/// What a producer sends: `<prefix>-<n>` to `queue`, one every `pace`.
#[derive(Debug, Clone)]
pub struct Flow {
    /// Bodies are `<prefix>-<8 digits>`.
    pub prefix: String,
    /// The queue.
    pub queue: String,
    /// Time between two sends.
    pub pace: Duration,
    /// Set: no more sends (answers are still read until the stop).
    pub quiet: Arc<AtomicBool>,
}

impl Flow {
    fn body(&self, n: u64) -> String {
        format!("{}-{n:08}", self.prefix)
    }
}

/// Sends paced jobs until `stop` (see [`Flow`]); see the module docs for
/// when a send time comes.
struct Pacer {
    next: Instant,
    pace: Duration,
}

impl Pacer {
    fn new(pace: Duration) -> Pacer {
        Pacer { next: Instant::now(), pace }
    }

    /// Whether a job is due now (and books the next one); never once
    /// `quiet` is set.
    fn due(&mut self, quiet: &AtomicBool) -> bool {
        let now = Instant::now();
        if now < self.next || quiet.load(Ordering::Relaxed) {
            return false;
        }
        // Behind by more than a few sends (a descheduled thread): no burst.
        self.next = (self.next + self.pace).max(now - self.pace * 4);
        true
    }

    /// How long until the next send, at most `cap`.
    fn wait(&self, cap: Duration) -> Duration {
        self.next.saturating_duration_since(Instant::now()).min(cap)
    }
}

/// A producer's client: one connection and the jobs it sent that await
/// their answers.
trait Client: Sized {
    /// Whether it may take the next job now: its oldest unanswered job is
    /// younger than [`STUCK`].
    fn free(&self, now: Instant) -> bool;
    /// Sends `body` to `queue` (recorded as unanswered); `false` when it
    /// could not.
    fn send(&mut self, queue: &str, body: &str, now: Instant) -> bool;
    /// Waits up to `wait` for answers on any of `clients` and records them.
    fn poll(clients: &mut [Self], wait: Duration, ledger: &Shared);
}

/// Sends the jobs of `flow`, each to a free client (one made by `open`
/// when none is free), and reads the answers, until `stop`.
fn produce<C: Client>(flow: Flow, ledger: Shared, stop: Arc<AtomicBool>, mut open: impl FnMut() -> Option<C>) {
    let mut clients: Vec<C> = Vec::new();
    let mut pacer = Pacer::new(flow.pace);
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if pacer.due(&flow.quiet) {
            let at = match clients.iter().position(|c| c.free(now)) {
                Some(i) => Some(i),
                None if clients.len() < MAX_CLIENTS => open().map(|c| {
                    clients.push(c);
                    clients.len() - 1
                }),
                None => None,
            };
            if let Some(i) = at {
                let body = flow.body(n);
                n += 1;
                lock(&ledger).jobs.insert(body.clone(), Sent { at: Instant::now(), answer: None });
                if !clients[i].send(&flow.queue, &body, now) {
                    lock(&ledger).oddities.push(format!("{body}: could not be sent"));
                }
            }
        }
        C::poll(&mut clients, pacer.wait(Duration::from_millis(20)), &ledger);
    }
}

/// One DEALER and its unanswered jobs in send order.
struct EmqpClient {
    socket: zmq::Socket,
    open: VecDeque<(String, Instant)>,
}

impl Client for EmqpClient {
    fn free(&self, now: Instant) -> bool {
        self.open.front().is_none_or(|(_, at)| now - *at < STUCK)
    }

    fn send(&mut self, queue: &str, body: &str, now: Instant) -> bool {
        self.open.push_back((body.to_string(), now));
        request(&self.socket, queue, body)
    }

    fn poll(clients: &mut [Self], wait: Duration, ledger: &Shared) {
        let mut items: Vec<zmq::PollItem> = clients.iter().map(|c| c.socket.as_poll_item(zmq::POLLIN)).collect();
        if items.is_empty() {
            std::thread::sleep(wait);
            return;
        }
        if zmq::poll(&mut items, wait.as_millis() as i64).is_err() {
            return;
        }
        let readable: Vec<bool> = items.iter().map(|i| i.is_readable()).collect();
        drop(items);
        for (client, _) in clients.iter_mut().zip(readable).filter(|(_, r)| *r) {
            while let Ok(f) = client.socket.recv_multipart(zmq::DONTWAIT) {
                emqp_answer(&f, client, ledger);
            }
        }
    }
}

/// eMQP producer: paced REQUESTs of `flow` to `frontend` (module docs).
pub fn emqp_producer(frontend: String, flow: Flow, ledger: Shared, stop: Arc<AtomicBool>) {
    let ctx = zmq::Context::new();
    produce(flow, ledger, stop, || Some(EmqpClient { socket: dealer(&ctx, &frontend), open: VecDeque::new() }));
}

/// Records one frontend message for `client`'s jobs.
fn emqp_answer(f: &[Vec<u8>], client: &mut EmqpClient, ledger: &Shared) {
    let text = |i: usize| f.get(i).map(|b| String::from_utf8_lossy(b).into_owned()).unwrap_or_default();
    let answer = match f.get(2).map(Vec::as_slice) {
        Some(b"REPLY") if f.len() == 5 => Answer::Acked,
        Some(b"ERROR") if f.len() >= 6 => Answer::Refused { code: text(5), text: text(6) },
        _ => {
            lock(ledger).oddities.push(format!(
                "eMQP producer got {:?}",
                f.iter().map(|b| String::from_utf8_lossy(b)).collect::<Vec<_>>()
            ));
            return;
        }
    };
    let body = text(4);
    client.open.retain(|(b, _)| *b != body);
    lock(ledger).answer(&body, answer);
}

/// An `ERR` line's code and the text after it.
type ErrLine = (String, String);

/// One text connection and its unanswered SCHEDs in send order, each with
/// the `ERR` seen for it so far.
struct TextClient {
    stream: TcpStream,
    buf: Vec<u8>,
    open: VecDeque<(String, Instant, Option<ErrLine>)>,
    closed: bool,
}

impl Client for TextClient {
    fn free(&self, now: Instant) -> bool {
        !self.closed && self.open.front().is_none_or(|(_, at, _)| now - *at < STUCK)
    }

    fn send(&mut self, queue: &str, body: &str, now: Instant) -> bool {
        self.open.push_back((body.to_string(), now, None));
        let sent = self.write(format!("SCHED {body}@{queue}\nASK probe\n").as_bytes());
        self.closed |= !sent;
        sent
    }

    fn poll(clients: &mut [Self], wait: Duration, ledger: &Shared) {
        let mut fds: Vec<libc::pollfd> = clients
            .iter()
            // A closed one is left out (poll skips a negative fd).
            .map(|c| libc::pollfd {
                fd: if c.closed { -1 } else { c.stream.as_raw_fd() },
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `fds` is a valid array of pollfd for its length.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, wait.as_millis() as i32) };
        if ready <= 0 {
            return;
        }
        for (client, fd) in clients.iter_mut().zip(&fds) {
            if fd.revents != 0 && !client.closed {
                client.read(ledger);
            }
        }
    }
}

impl TextClient {
    fn connect(addr: &str) -> Option<TextClient> {
        let stream = TcpStream::connect(addr).ok()?;
        stream.set_nodelay(true).ok()?;
        stream.set_nonblocking(true).ok()?;
        Some(TextClient { stream, buf: Vec::new(), open: VecDeque::new(), closed: false })
    }

    /// Writes `bytes` whole (the socket is non-blocking; these writes are
    /// small and the router reads, so a wait here is short).
    fn write(&mut self, bytes: &[u8]) -> bool {
        let mut at = 0;
        let deadline = Instant::now() + Duration::from_secs(5);
        while at < bytes.len() && Instant::now() < deadline {
            match self.stream.write(&bytes[at..]) {
                Ok(n) => at += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(1)),
                Err(_) => break,
            }
        }
        at == bytes.len()
    }

    /// Reads what arrived; each whole line is answered into `ledger`.
    fn read(&mut self, ledger: &Shared) {
        let mut chunk = [0u8; 4096];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => {
                    self.closed = true;
                    break;
                }
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(_) => {
                    self.closed = true;
                    break;
                }
            }
        }
        while let Some(end) = self.buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line).trim_end().to_string();
            self.line(&line, ledger);
        }
    }

    fn line(&mut self, line: &str, ledger: &Shared) {
        match (line, self.open.front_mut()) {
            ("NOPE", Some(_)) => {
                let Some((body, _, err)) = self.open.pop_front() else { return };
                let answer = match err {
                    Some((code, text)) => Answer::Refused { code, text },
                    None => Answer::Acked,
                };
                lock(ledger).answer(&body, answer);
            }
            (l, Some((_, _, err @ None))) if l.starts_with("ERR ") => {
                let mut words = l.splitn(3, ' ').skip(1);
                let code = words.next().unwrap_or_default().to_string();
                *err = Some((code, words.next().unwrap_or_default().to_string()));
            }
            (l, front) => lock(ledger).oddities.push(format!("text producer got {l:?} (waiting for {front:?})")),
        }
    }
}

/// Text producer: paced `SCHED <body>@<queue>` + `ASK probe` pairs of
/// `flow` to `addr` (module docs).
pub fn text_producer(addr: String, flow: Flow, ledger: Shared, stop: Arc<AtomicBool>) {
    produce(flow, ledger, stop, || TextClient::connect(&addr));
}

/// When an [`emqp_worker`] takes jobs: it registers at once, and says
/// READY only once `go` is set (until then a REQUEST to its queue waits
/// there: eMQP puts a job for a queue no worker serves on `default`).
#[derive(Debug, Default)]
pub struct Gate {
    /// Set: the worker says READY.
    pub go: AtomicBool,
    /// Set by the worker once the router acknowledged its INFORM.
    pub informed: AtomicBool,
}

impl Gate {
    /// A gate already open.
    pub fn open() -> Arc<Gate> {
        let g = Gate::default();
        g.go.store(true, Ordering::Relaxed);
        Arc::new(g)
    }
}

/// An eMQP worker with one slot on `queues` (an INFORM queue list such as
/// `[[10, "default"]]`), READY once `gate` opens: records each job,
/// answers it, READY again; heartbeats every second.
pub fn emqp_worker(
    backend: String,
    name: String,
    queues: String,
    gate: Arc<Gate>,
    ledger: Shared,
    stop: Arc<AtomicBool>,
) {
    let ctx = zmq::Context::new();
    let s = dealer(&ctx, &backend);
    let inform: [&[u8]; 6] = [b"", b"eMQP/1.0", b"INFORM", b"inform-1", queues.as_bytes(), b"worker"];
    if s.send_multipart(inform, 0).is_err() {
        return;
    }
    let ready = || s.send_multipart([&b""[..], b"eMQP/1.0", b"READY", b"r"], 0).is_ok();
    let (mut beat, mut readied) = (Instant::now(), false);
    while !stop.load(Ordering::Relaxed) {
        if beat.elapsed() >= Duration::from_secs(1) {
            let _ = s.send_multipart([&b""[..], b"eMQP/1.0", b"HEARTBEAT", b"hb", b"0"], 0);
            beat = Instant::now();
        }
        if !readied && gate.informed.load(Ordering::Relaxed) && gate.go.load(Ordering::Relaxed) {
            readied = ready();
        }
        let Some(f) = recv_within(&s, 50) else { continue };
        match f.get(2).map(Vec::as_slice) {
            Some(b"ACK") => gate.informed.store(true, Ordering::Relaxed),
            Some(b"REQUEST") if f.len() >= 7 => {
                let body = String::from_utf8_lossy(&f[6]).into_owned();
                lock(&ledger).deliveries.push(Delivery { consumer: name.clone(), body });
                let reply: [&[u8]; 6] = [b"", b"eMQP/1.0", b"REPLY", b"rep", b"{\"value\": null}", &f[3]];
                let _ = s.send_multipart(reply, 0);
                ready();
            }
            // KBYE: the router stops (a test's clean restart).
            Some(b"HEARTBEAT" | b"KBYE") => {}
            _ => lock(&ledger).oddities.push(format!("worker {name} got {:?}", String::from_utf8_lossy(&f.concat()))),
        }
    }
}

/// A text consumer of `queue`: `ASK <queue> 200`, records the task, `ACK`.
pub fn text_consumer(addr: String, name: String, queue: String, ledger: Shared, stop: Arc<AtomicBool>) {
    let Ok(s) = TcpStream::connect(&addr) else {
        lock(&ledger).oddities.push(format!("consumer {name}: cannot connect to {addr}"));
        return;
    };
    let _ = s.set_nodelay(true);
    let _ = s.set_read_timeout(Some(Duration::from_millis(100)));
    let (mut w, mut r) = match s.try_clone() {
        Ok(r) => (s, std::io::BufReader::new(r)),
        Err(_) => return,
    };
    let ask = format!("ASK {queue} 200\n");
    while !stop.load(Ordering::Relaxed) {
        if w.write_all(ask.as_bytes()).is_err() {
            return;
        }
        let Some(line) = read_line(&mut r, &stop) else { return };
        if let Some(body) = line.strip_prefix("WANT? ") {
            lock(&ledger).deliveries.push(Delivery { consumer: name.clone(), body: body.into() });
            if w.write_all(b"ACK\n").is_err() {
                return;
            }
        } else if line != "NOPE" {
            lock(&ledger).oddities.push(format!("consumer {name} got {line:?}"));
        }
    }
}

pub(crate) use crate::durability::read_line;

/// Threads that run until [`Threads::stop`].
#[derive(Default)]
pub struct Threads {
    stop: Arc<AtomicBool>,
    handles: Vec<JoinHandle<()>>,
}

impl Threads {
    /// Runs `f` with this group's stop flag on a new thread.
    pub fn spawn(&mut self, f: impl FnOnce(Arc<AtomicBool>) + Send + 'static) {
        let stop = self.stop.clone();
        self.handles.push(std::thread::spawn(move || f(stop)));
    }

    /// Stops and joins every thread (a panic in one is raised here).
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for h in std::mem::take(&mut self.handles) {
            if let Err(e) = h.join() {
                std::panic::resume_unwind(e);
            }
        }
    }
}

impl Drop for Threads {
    /// A test that panicked stops its threads too (they would run on).
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for h in std::mem::take(&mut self.handles) {
            let _ = h.join();
        }
    }
}
