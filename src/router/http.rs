//! The router's HTTP server (`metrics`, default `127.0.0.1:47296`): `GET
//! /metrics` in the Prometheus text format ([`super::prometheus`]) and
//! `GET /` the status page ([`super::status_page`]). Read-only: every
//! other path is 404, every other method 405.
//!
//! One thread (`emq-http`) accepts, reads and answers every connection
//! with non-blocking sockets in one `mio` poll, each answer from a fresh
//! [`Scrape`](super::scrape::Scrape), off the hot path like the admin
//! thread. Every connection is bounded (README "Limits"):
//!
//! * at most `metrics_max_connections` ([`limits::METRICS_MAX_CONNECTIONS`])
//!   at once; one past it takes the slot of an open connection, which is
//!   closed (`http_connections_evicted`): among the connections of the
//!   address that holds the most, one whose answer is sent (lingering),
//!   else the one that has waited longest for its request head (told
//!   `503`), else the one that has longest not read its answer. So slow or
//!   idle clients (a slowloris) holding every slot cannot keep a scraper
//!   out: its connection, which sends its head at once, is answered as it
//!   is read, and more newer connections than there are slots would have to
//!   arrive before that for it to lose its own;
//! * one request per connection (`Connection: close`), its head at most
//!   [`limits::HTTP_MAX_HEAD_BYTES`] (else `431`) and complete within
//!   `metrics_head_timeout` ([`limits::METRICS_HEAD_TIMEOUT`]) of the
//!   accept (else `408`; `http_timed_out`);
//! * an HTTP/1.1 request without exactly one `Host` field is `400` (RFC
//!   9112 §3.2), and a refused `HEAD` gets no body either;
//! * a request with a body (`Content-Length` above 0, any
//!   `Transfer-Encoding`) is answered `413` without reading the body: the
//!   server takes no input but the head, so no memory or time depends on a
//!   length the client declares;
//! * the whole exchange ends `metrics_request_timeout`
//!   ([`limits::METRICS_REQUEST_TIMEOUT`]) after the accept (`408` when the
//!   head is not complete; `http_timed_out`);
//! * after its answer a connection is half-closed and what the client
//!   still sends is discarded, for at most [`limits::HTTP_LINGER`] and
//!   [`limits::HTTP_LINGER_BYTES`], so the client reads the answer before
//!   the close.
//!
//! Optionally (docs/security.md "HTTP: TLS and passwords"): every request
//! needs a password of `metrics_basic_auth_file` ([`super::http_auth`];
//! `401`, or `429` past the failure budget), checked before routing; and
//! the listener speaks TLS only (`metrics_tls_cert_file`, [`ServerTls`]),
//! rustls driven on the same non-blocking sockets (`read_tls`,
//! `process_new_packets`, `reader`, `writer`, `write_tls`, as rustls's
//! `tlsserver-mio` example), the handshake bounded by the head deadline, a
//! failed one counted in `http_tls_failures`, a plain-HTTP request answered
//! a plain `400`.
//!
//! The request head is parsed by `httparse` (hyper's parser); what is
//! ours is the bounded connection handling around it. It replaces
//! `tiny_http` (0.12), which could not be bounded: it spawns a
//! thread per connection with no limit and no read timeout, reads a header
//! line with no length limit, and when a request is answered or dropped
//! drains its declared `Content-Length` into one buffer of that size
//! (`EqualReader::drop`), so one `Content-Length: 99999999999` aborted the
//! router. Requests are counted in the broker counters (`http_requests`,
//! `http_refused`).

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};

use super::http_auth::{BasicAuth, Verdict};
use super::scrape::Sources;
use super::status_page::Rates;
use super::StartError;
use crate::limits;
use crate::metrics::counters::Counters;
use crate::tls::ServerTls;

const LISTENER: Token = Token(usize::MAX - 1);
const WAKER: Token = Token(usize::MAX - 2);
/// How often deadlines are checked (a sweep over the open connections).
const SWEEP: Duration = Duration::from_millis(100);
/// Connections accepted per loop turn before the open ones are served.
const ACCEPT_BATCH: usize = 64;
/// After an `accept` failure (out of descriptors), the next try.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// The limits of the HTTP server (README "Limits", docs/configuration.md).
#[derive(Debug, Clone, Copy)]
pub struct HttpLimits {
    /// Most connections open at once (`metrics_max_connections`).
    pub max_connections: usize,
    /// Accept to the end of the request head at the latest
    /// (`metrics_head_timeout`).
    pub head_timeout: Duration,
    /// Accept to close at the latest (`metrics_request_timeout`).
    pub request_timeout: Duration,
    /// Most queues shown by name (`metrics_max_queues`).
    pub max_queues: usize,
}

/// Who may use the HTTP server (docs/security.md "HTTP: TLS and
/// passwords").
#[derive(Debug, Clone, Default)]
pub struct HttpSecurity {
    /// `metrics_basic_auth_file`: every request needs a listed user and
    /// password ([`super::http_auth`]).
    pub basic_auth_file: Option<PathBuf>,
    /// `metrics_tls_cert_file` and `metrics_tls_key_file`: the listener
    /// speaks TLS only, with this certificate chain and key (PEM).
    pub tls_files: Option<(PathBuf, PathBuf)>,
    /// `metrics_tls_client_ca_file`: clients must present a certificate
    /// issued by one of these CAs (PEM; with `tls_files` only).
    pub tls_client_ca_file: Option<PathBuf>,
}

/// The running HTTP server.
pub struct HttpServer {
    stop: Arc<AtomicBool>,
    waker: Arc<Waker>,
    thread: JoinHandle<()>,
    addr: SocketAddr,
}

impl HttpServer {
    /// Binds `addr` and serves from `sources` on thread `emq-http` within
    /// `limits`, to the clients `security` admits.
    ///
    /// # Errors
    /// [`StartError::Setting`] when `metrics_basic_auth_file` cannot be
    /// read or has a bad line; [`StartError::Io`] when the address cannot
    /// be bound, the poll not made or the thread not spawned.
    pub fn start(
        addr: SocketAddr,
        sources: Sources,
        limits: HttpLimits,
        security: HttpSecurity,
    ) -> Result<HttpServer, StartError> {
        let auth = match &security.basic_auth_file {
            Some(path) => Some(
                BasicAuth::load(path, Instant::now())
                    .map_err(|why| StartError::Setting { name: "metrics_basic_auth_file", why })?,
            ),
            None => None,
        };
        let users = auth.as_ref().map_or(0, BasicAuth::users);
        let tls = match &security.tls_files {
            Some((cert, key)) => Some(
                ServerTls::from_files(cert, key, security.tls_client_ca_file.as_deref())
                    .map_err(|e| StartError::Setting { name: "metrics_tls_cert_file", why: e.to_string() })?,
            ),
            None => None,
        };
        let scheme = if tls.is_some() { "https" } else { "http" };
        let what = || format!("metrics listener {addr}");
        let io_err = |source| StartError::Io { what: what(), source };
        let listener = std::net::TcpListener::bind(addr).map_err(io_err)?;
        let addr = listener.local_addr().map_err(io_err)?;
        listener.set_nonblocking(true).map_err(io_err)?;
        let mut listener = TcpListener::from_std(listener);
        let poll = Poll::new().map_err(io_err)?;
        poll.registry().register(&mut listener, LISTENER, Interest::READABLE).map_err(io_err)?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER).map_err(io_err)?);
        let stop = Arc::new(AtomicBool::new(false));
        let server = Server {
            poll,
            listener,
            conns: Vec::new(),
            free: Vec::new(),
            open: 0,
            per_address: HashMap::new(),
            admitted: 0,
            limits,
            sources,
            rates: Rates::default(),
            stop: stop.clone(),
            accept_ready: true,
            accept_retry: None,
            accept_next_log: None,
            accept_unlogged: 0,
            auth,
            tls,
        };
        let thread = super::spawn("emq-http".into(), move || server.run())?;
        tracing::info!(%addr, scheme, max_connections = limits.max_connections, basic_auth_users = users,
            client_certificates = security.tls_client_ca_file.is_some(), "metrics and status page served");
        Ok(HttpServer { stop, waker, thread, addr })
    }

    /// The bound address (port 0 resolved).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving (open connections are closed) and waits for the
    /// thread.
    pub fn shutdown(self) {
        self.stop.store(true, Ordering::Release);
        if let Err(e) = self.waker.wake() {
            tracing::warn!(error = %e, "HTTP server not woken; it stops within its next sweep");
        }
        let _ = self.thread.join();
    }
}

/// Where a connection is in its one exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Reading the request head.
    Head,
    /// Writing the answer.
    Answer,
    /// Answer sent and the write side shut: discarding what still comes.
    Linger,
}

impl Phase {
    /// Which connections give up their slot first to a new one (lowest
    /// first): one answered loses nothing (its answer is with the kernel),
    /// one without a complete request loses a request it is slow to send,
    /// one being answered loses what it has not read.
    fn eviction_rank(self) -> u8 {
        match self {
            Phase::Linger => 0,
            Phase::Head => 1,
            Phase::Answer => 2,
        }
    }
}

struct Conn {
    stream: TcpStream,
    /// The client's address (connections are counted per address).
    peer: IpAddr,
    /// The order it was admitted in: among equals, the oldest gives up its
    /// slot first.
    seq: u64,
    phase: Phase,
    /// The request head so far (at most [`limits::HTTP_MAX_HEAD_BYTES`]).
    head: Vec<u8>,
    /// `head[..scanned]` holds no end of the head.
    scanned: usize,
    /// Empty lines read before the request line (RFC 9112 §2.2): skipped,
    /// but counted toward [`limits::HTTP_MAX_HEAD_BYTES`], so that a
    /// stream of them ends in 431 like any over-long head.
    skipped: usize,
    /// The answer, written from `sent`.
    out: Vec<u8>,
    sent: usize,
    /// The request head must be complete by this instant, else `408`.
    head_deadline: Instant,
    /// The connection is closed at this instant at the latest.
    deadline: Instant,
    /// Bytes still to discard while lingering.
    linger_left: usize,
    /// The TLS session on a TLS listener (`metrics_tls_cert_file`).
    tls: Option<Box<rustls::ServerConnection>>,
    /// Some bytes came from the client (a TLS connection's first byte is
    /// looked at for a plain-HTTP request).
    got_bytes: bool,
    /// A plain-HTTP request came on the TLS listener: it is answered
    /// [`PLAIN_ON_TLS`] in plain text.
    plain_on_tls: bool,
    /// The TLS `close_notify` of the answer's end is queued.
    close_notified: bool,
    /// Why the TLS session failed, when it did (counted at the close in
    /// `http_tls_failures`).
    tls_failed: Option<String>,
}

/// A plain-HTTP request on the TLS listener gets this answer in plain text
/// (as Go's `net/http` does), then the connection closes.
const PLAIN_ON_TLS: &[u8] =
    b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n\
      this port speaks HTTPS (TLS): use https://\n";

impl Conn {
    /// Reads plaintext into `buf` as `TcpStream::read` does (`Ok(0)`: the
    /// client closed; `WouldBlock`: nothing yet); on a TLS connection it
    /// first reads and decrypts what the socket holds, sending the
    /// handshake's answers. A TLS failure is an `InvalidData` error with
    /// `tls_failed` set (the alert is sent, best effort).
    fn read_plain(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let Some(tls) = self.tls.as_mut() else { return self.stream.read(buf) };
        if !self.got_bytes {
            let mut first = [0u8; 1];
            match self.stream.peek(&mut first) {
                Ok(0) => return Ok(0),
                Ok(_) if first[0].is_ascii_uppercase() => {
                    // "GET /metrics ...": a TLS record starts with 0x16.
                    // Answered as a plain connection ([`Server::step`]).
                    self.plain_on_tls = true;
                    self.tls_failed = Some("a plain-HTTP request on the TLS listener".into());
                    return Err(io::ErrorKind::InvalidData.into());
                }
                Ok(_) => self.got_bytes = true,
                Err(e) => return Err(e),
            }
        }
        loop {
            flush_tls(tls, &mut self.stream)?;
            match tls.reader().read(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                done => return done,
            }
            if tls.read_tls(&mut self.stream)? == 0 {
                return Ok(0);
            }
            if let Err(e) = tls.process_new_packets() {
                // Send the alert that tells the client why (best effort).
                let _ = flush_tls(tls, &mut self.stream);
                self.tls_failed = Some(e.to_string());
                return Err(io::ErrorKind::InvalidData.into());
            }
        }
    }

    /// Writes `out[sent..]` (through the TLS session on a TLS connection):
    /// `Ok(true)` when all of it and every TLS record is with the kernel,
    /// `Ok(false)` when the socket is full, `Err(())` when the client is
    /// gone.
    fn send(&mut self) -> Result<bool, ()> {
        loop {
            match self.tls.as_mut() {
                Some(tls) => {
                    match flush_tls(tls, &mut self.stream) {
                        Ok(()) => {}
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                        Err(_) => return Err(()),
                    }
                    if self.sent == self.out.len() {
                        return Ok(true);
                    }
                    match tls.writer().write(&self.out[self.sent..]) {
                        Ok(0) | Err(_) => return Err(()),
                        Ok(n) => self.sent += n,
                    }
                }
                None => {
                    if self.sent == self.out.len() {
                        return Ok(true);
                    }
                    match self.stream.write(&self.out[self.sent..]) {
                        Ok(0) => return Err(()),
                        Ok(n) => self.sent += n,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(_) => return Err(()),
                    }
                }
            }
        }
    }

    /// Sends `answer` if the socket takes it at once (a refusal before the
    /// close; never blocking). On a TLS connection only once the handshake
    /// is done: before, there is no way to say it.
    fn answer_best_effort(&mut self, answer: &[u8]) {
        match self.tls.as_mut() {
            None => {
                let _ = self.stream.write(answer);
            }
            Some(tls) if !tls.is_handshaking() => {
                let _ = tls.writer().write_all(answer);
                tls.send_close_notify();
                let _ = flush_tls(tls, &mut self.stream);
            }
            Some(_) => {}
        }
    }
}

/// Writes what the TLS session has queued to `stream` (`WouldBlock` when
/// the socket is full).
fn flush_tls(tls: &mut rustls::ServerConnection, stream: &mut TcpStream) -> io::Result<()> {
    while tls.wants_write() {
        match tls.write_tls(stream) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

struct Server {
    poll: Poll,
    listener: TcpListener,
    /// Connections by token; `None` slots are listed in `free`.
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    open: usize,
    /// Open connections per client address.
    per_address: HashMap<IpAddr, usize>,
    /// Connections admitted so far (the next one's `seq`).
    admitted: u64,
    limits: HttpLimits,
    sources: Sources,
    rates: Rates,
    stop: Arc<AtomicBool>,
    /// The listener may hold connections not accepted yet.
    accept_ready: bool,
    accept_retry: Option<Instant>,
    accept_next_log: Option<Instant>,
    accept_unlogged: u64,
    /// `metrics_basic_auth_file`'s users, when it is set.
    auth: Option<BasicAuth>,
    /// The TLS configuration, when the listener speaks TLS.
    tls: Option<ServerTls>,
}

/// What the server does with one connection after an event.
enum Next {
    Keep,
    Close,
}

impl Server {
    fn counters(&self) -> &Counters {
        &self.sources.broker.ctx.counters
    }

    fn run(mut self) {
        let mut events = Events::with_capacity(256);
        let mut next_sweep = Instant::now() + SWEEP;
        while !self.stop.load(Ordering::Acquire) {
            let now = Instant::now();
            let timeout = if self.accept_ready {
                Duration::ZERO
            } else {
                let mut wake = next_sweep;
                if let Some(at) = self.accept_retry {
                    wake = wake.min(at);
                }
                wake.saturating_duration_since(now)
            };
            if let Err(e) = self.poll.poll(&mut events, Some(timeout)) {
                if e.kind() != io::ErrorKind::Interrupted {
                    crate::log_limited!(warn, error = %e, "HTTP poll failed");
                    std::thread::sleep(SWEEP);
                }
                continue;
            }
            for event in events.iter() {
                match event.token() {
                    WAKER => {}
                    LISTENER => self.accept_ready = true,
                    Token(slot) => self.drive(slot),
                }
            }
            let now = Instant::now();
            if self.accept_retry.is_some_and(|at| at <= now) {
                self.accept_retry = None;
                self.accept_ready = true;
            }
            if self.accept_ready {
                self.accept(now);
            }
            if now >= next_sweep {
                self.sweep(now);
                next_sweep = now + SWEEP;
            }
        }
        for slot in 0..self.conns.len() {
            self.close(slot);
        }
    }

    /// Accepts up to [`ACCEPT_BATCH`] connections, each admitted: at the
    /// limit, in the slot of one that gives it up ([`Server::evict`]).
    fn accept(&mut self, now: Instant) {
        for _ in 0..ACCEPT_BATCH {
            match self.listener.accept() {
                Ok((stream, peer)) => {
                    if self.open >= self.limits.max_connections {
                        self.evict();
                    }
                    self.admit(stream, peer.ip(), now);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.accept_ready = false;
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // Out of descriptors, most likely: the connection stays
                    // in the backlog; try again a little later.
                    if self.accept_next_log.is_none_or(|at| now >= at) {
                        tracing::warn!(error = %e, not_logged = self.accept_unlogged, "HTTP accept failed");
                        self.accept_unlogged = 0;
                        self.accept_next_log = Some(now + Duration::from_secs(1));
                    } else {
                        self.accept_unlogged += 1;
                    }
                    self.accept_ready = false;
                    self.accept_retry = Some(now + ACCEPT_RETRY);
                    return;
                }
            }
        }
    }

    /// Closes one open connection to make room for a new one: of the
    /// address that holds the most connections (one address cannot push
    /// out another's scrape), the one [`Phase::eviction_rank`] ranks first,
    /// the oldest among equals. One still sending its request head is told
    /// `503` first (best effort, never blocking).
    fn evict(&mut self) {
        let Some(busiest) = self.per_address.iter().max_by_key(|(_, n)| **n).map(|(addr, _)| *addr) else { return };
        let victim = self
            .conns
            .iter()
            .enumerate()
            .filter_map(|(slot, c)| c.as_ref().filter(|c| c.peer == busiest).map(|c| (slot, c)))
            .min_by_key(|(_, c)| (c.phase.eviction_rank(), c.seq))
            .map(|(slot, _)| slot);
        let Some(slot) = victim else { return };
        Counters::bump(&self.counters().http_connections_evicted);
        crate::log_limited!(
            warn,
            max = self.limits.max_connections,
            peer = %busiest,
            "HTTP connection closed to make room for a new one: metrics_max_connections open"
        );
        if let Some(conn) = self.conns[slot].as_mut().filter(|c| c.phase == Phase::Head) {
            // Take what the request already sent (so the close is not a
            // reset), answer, close.
            let mut buf = [0u8; limits::HTTP_READ_CHUNK_BYTES];
            let _ = conn.read_plain(&mut buf);
            let body = format!(
                "closed to make room for a newer connection: request head not complete and {} HTTP connections \
                 open (metrics_max_connections)\n",
                self.limits.max_connections
            );
            let answer = response(503, "text/plain; charset=utf-8", body.as_bytes(), false, &[("Retry-After", "1")]);
            conn.answer_best_effort(&answer);
            let _ = conn.stream.shutdown(Shutdown::Both);
        }
        self.close(slot);
    }

    fn admit(&mut self, mut stream: TcpStream, peer: IpAddr, now: Instant) {
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                self.conns.push(None);
                self.conns.len() - 1
            }
        };
        if let Err(e) = self.poll.registry().register(&mut stream, Token(slot), Interest::READABLE | Interest::WRITABLE)
        {
            crate::log_limited!(warn, error = %e, "HTTP connection not registered; closed");
            self.free.push(slot);
            return;
        }
        let _ = stream.set_nodelay(true);
        let tls = match &self.tls {
            None => None,
            Some(tls) => match rustls::ServerConnection::new(tls.config()) {
                Ok(c) => Some(Box::new(c)),
                Err(e) => {
                    Counters::bump(&self.counters().http_tls_failures);
                    crate::log_limited!(warn, error = %e, "HTTP TLS session not made; connection closed");
                    let _ = self.poll.registry().deregister(&mut stream);
                    self.free.push(slot);
                    return;
                }
            },
        };
        self.admitted += 1;
        self.conns[slot] = Some(Conn {
            stream,
            peer,
            seq: self.admitted,
            phase: Phase::Head,
            head: Vec::new(),
            scanned: 0,
            skipped: 0,
            out: Vec::new(),
            sent: 0,
            head_deadline: now + self.limits.head_timeout.min(self.limits.request_timeout),
            deadline: now + self.limits.request_timeout,
            linger_left: limits::HTTP_LINGER_BYTES,
            tls,
            got_bytes: false,
            plain_on_tls: false,
            close_notified: false,
            tls_failed: None,
        });
        self.open += 1;
        *self.per_address.entry(peer).or_default() += 1;
        // Its request may be there already (edge-triggered poll).
        self.drive(slot);
    }

    fn close(&mut self, slot: usize) {
        if let Some(mut conn) = self.conns.get_mut(slot).and_then(Option::take) {
            let _ = self.poll.registry().deregister(&mut conn.stream);
            self.free.push(slot);
            self.open -= 1;
            if let Some(n) = self.per_address.get_mut(&conn.peer) {
                *n -= 1;
                if *n == 0 {
                    self.per_address.remove(&conn.peer);
                }
            }
        }
    }

    /// Closes the connections past their deadline: a request head not
    /// complete by its `head_deadline`, any connection by its `deadline`.
    fn sweep(&mut self, now: Instant) {
        let counters = self.sources.broker.ctx.counters.clone();
        for slot in 0..self.conns.len() {
            let Some(conn) = self.conns[slot].as_mut() else { continue };
            let due = if conn.phase == Phase::Head { conn.head_deadline.min(conn.deadline) } else { conn.deadline };
            if due > now {
                continue;
            }
            match conn.phase {
                Phase::Head => {
                    let secs = self.limits.head_timeout.min(self.limits.request_timeout).as_secs_f64();
                    let body = format!("request head not complete within {secs} s\n");
                    let answer = response(408, "text/plain; charset=utf-8", body.as_bytes(), false, &[]);
                    // Best effort: the socket's buffer is empty, so it fits.
                    conn.answer_best_effort(&answer);
                    Counters::bump(&counters.http_timed_out);
                }
                Phase::Answer => Counters::bump(&counters.http_timed_out),
                Phase::Linger => {}
            }
            self.close(slot);
        }
    }

    /// Counts and logs a TLS session that failed on `conn` (a plain-HTTP
    /// client, a client that does not trust the certificate, no or a bad
    /// client certificate).
    fn tls_refused(&self, conn: &mut Conn) {
        if let Some(why) = conn.tls_failed.take() {
            Counters::bump(&self.counters().http_tls_failures);
            crate::log_limited!(info, peer = %conn.peer, error = %why, "HTTP TLS connection refused");
        }
    }

    /// Moves connection `slot` on as far as its socket allows.
    fn drive(&mut self, slot: usize) {
        let Some(mut conn) = self.conns.get_mut(slot).and_then(Option::take) else { return };
        let next = self.step(&mut conn);
        self.conns[slot] = Some(conn);
        if let Next::Close = next {
            self.close(slot);
        }
    }

    fn step(&mut self, conn: &mut Conn) -> Next {
        loop {
            match conn.phase {
                Phase::Head => match read_head(conn) {
                    Ok(None) => return Next::Keep,
                    Ok(Some(end)) => {
                        conn.out = self.answer(&conn.head[..end], end);
                        conn.head = Vec::new();
                        conn.phase = Phase::Answer;
                    }
                    Err(()) => {
                        self.tls_refused(conn);
                        if !conn.plain_on_tls {
                            return Next::Close;
                        }
                        // Told in plain text, then half-closed and lingering
                        // (its request is discarded), as any answer.
                        conn.tls = None;
                        conn.out = PLAIN_ON_TLS.to_vec();
                        conn.phase = Phase::Answer;
                    }
                },
                Phase::Answer => {
                    match conn.send() {
                        Ok(true) => {}
                        Ok(false) => return Next::Keep,
                        Err(()) => return Next::Close,
                    }
                    if let Some(tls) = conn.tls.as_mut().filter(|_| !conn.close_notified) {
                        // The answer's end, then the TCP half-close.
                        tls.send_close_notify();
                        conn.close_notified = true;
                        continue;
                    }
                    conn.out = Vec::new();
                    if conn.stream.shutdown(Shutdown::Write).is_err() {
                        return Next::Close;
                    }
                    conn.phase = Phase::Linger;
                    conn.deadline = conn.deadline.min(Instant::now() + limits::HTTP_LINGER);
                }
                Phase::Linger => {
                    let mut buf = [0u8; limits::HTTP_READ_CHUNK_BYTES];
                    loop {
                        match conn.stream.read(&mut buf) {
                            Ok(0) => return Next::Close,
                            Ok(n) if n >= conn.linger_left => return Next::Close,
                            Ok(n) => conn.linger_left -= n,
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Next::Keep,
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                            Err(_) => return Next::Close,
                        }
                    }
                }
            }
        }
    }

    /// How the server admits clients, for the status page (`None`: open).
    fn access(&self) -> Option<String> {
        let mut ways = Vec::new();
        match &self.tls {
            Some(tls) if tls.requires_client_cert() => ways.push("TLS with client certificates".to_string()),
            Some(_) => ways.push("TLS".to_string()),
            None => {}
        }
        if let Some(auth) = &self.auth {
            ways.push(format!("Basic auth ({} user(s))", auth.users()));
        }
        (!ways.is_empty()).then(|| ways.join(", "))
    }

    /// The whole answer to the request head `head` (`end` bytes with its
    /// empty line; a 431 when `end` is 0), counted.
    fn answer(&mut self, head: &[u8], end: usize) -> Vec<u8> {
        let counters = &self.sources.broker.ctx.counters;
        Counters::bump(&counters.http_requests);
        let request = if end == 0 { Err(Refusal::HEAD_TOO_LARGE) } else { parse_head(head) };
        let text = "text/plain; charset=utf-8";
        let (status, body, content_type, head_only, extra): (u16, Vec<u8>, &str, bool, Headers) = match request {
            // A refused HEAD still gets no body (RFC 9110 §9.3.2).
            Err(refusal) => {
                (refusal.status, refusal.body.as_bytes().to_vec(), text, head.starts_with(b"HEAD "), refusal.headers)
            }
            Ok(req) => {
                let head_only = req.method == "HEAD";
                let path = req.target.split('?').next().unwrap_or("");
                let verdict = match self.auth.as_mut() {
                    Some(auth) => auth.check(req.authorization, counters, Instant::now()),
                    None => Verdict::Allowed,
                };
                match (verdict, req.method, path) {
                    (Verdict::Missing | Verdict::Denied, ..) => {
                        (401, b"authentication required (Basic)\n".to_vec(), text, head_only, UNAUTHORIZED)
                    }
                    (Verdict::Throttled, ..) => (
                        429,
                        b"too many failed password checks; try again in a second\n".to_vec(),
                        text,
                        head_only,
                        &[("Retry-After", "1")],
                    ),
                    (Verdict::Allowed, method, path) => match (method, path) {
                        ("GET" | "HEAD", "/metrics") => {
                            let body = super::prometheus::render(self.sources.read(self.limits.max_queues));
                            (200, body.into_bytes(), super::prometheus::CONTENT_TYPE, head_only, &[])
                        }
                        ("GET" | "HEAD", "/" | "/index.html") => {
                            let mut scrape = self.sources.read(self.limits.max_queues);
                            scrape.http_access = self.access();
                            let body = super::status_page::render(&scrape, &mut self.rates);
                            (200, body.into_bytes(), "text/html; charset=utf-8", head_only, &[])
                        }
                        ("GET" | "HEAD", _) => (404, b"not found: try /metrics or /\n".to_vec(), text, head_only, &[]),
                        _ => (405, b"read-only: GET and HEAD only\n".to_vec(), text, false, &[("Allow", "GET, HEAD")]),
                    },
                }
            }
        };
        if status != 200 {
            Counters::bump(&counters.http_refused);
            crate::log_limited!(debug, status, "HTTP request refused");
        }
        response(status, content_type, &body, head_only, extra)
    }
}

/// Reads what the socket holds into `conn.head`: `Ok(Some(end))` once the
/// head is complete (`end` bytes, with its empty line; `Some(0)`: over
/// [`limits::HTTP_MAX_HEAD_BYTES`]), `Ok(None)` to wait for more,
/// `Err(())` when the client is gone.
fn read_head(conn: &mut Conn) -> Result<Option<usize>, ()> {
    let mut buf = [0u8; limits::HTTP_READ_CHUNK_BYTES];
    loop {
        let n = match conn.read_plain(&mut buf) {
            Ok(0) => return Err(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return Err(()),
        };
        let mut got = &buf[..n];
        if conn.head.is_empty() {
            // Empty lines before the request line are ignored (RFC 9112 §2.2).
            let skip = got.iter().take_while(|&&b| b == b'\r' || b == b'\n').count();
            got = &got[skip..];
            conn.skipped += skip;
            if conn.skipped >= limits::HTTP_MAX_HEAD_BYTES {
                return Ok(Some(0));
            }
        }
        let room = limits::HTTP_MAX_HEAD_BYTES.saturating_sub(conn.head.len() + conn.skipped);
        conn.head.extend_from_slice(&got[..got.len().min(room)]);
        if let Some(end) = head_end(&conn.head, conn.scanned) {
            return Ok(Some(end));
        }
        conn.scanned = conn.head.len().saturating_sub(2);
        if conn.head.len() + conn.skipped >= limits::HTTP_MAX_HEAD_BYTES {
            return Ok(Some(0));
        }
    }
}

/// The length of the head in `buf` up to and with its empty line (`LF LF`
/// or `LF CR LF`), searching from `from`.
fn head_end(buf: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    while let Some(at) = memchr::memchr(b'\n', &buf[i..]) {
        let lf = i + at;
        match (buf.get(lf + 1), buf.get(lf + 2)) {
            (Some(b'\n'), _) => return Some(lf + 2),
            (Some(b'\r'), Some(b'\n')) => return Some(lf + 3),
            _ => i = lf + 1,
        }
    }
    None
}

/// A request the server can answer.
#[derive(Debug, PartialEq, Eq)]
struct Request<'a> {
    method: &'a str,
    target: &'a str,
    /// The `Authorization` field's value, if any (never logged).
    authorization: Option<&'a [u8]>,
}

/// Extra headers of an answer: `(name, value)`.
type Headers = &'static [(&'static str, &'static str)];

/// The challenge of a `401` (RFC 7617), realm `emq`.
const UNAUTHORIZED: Headers = &[("WWW-Authenticate", "Basic realm=\"emq\"")];

/// A request refused before routing: status, body, extra headers.
#[derive(Debug, PartialEq, Eq)]
struct Refusal {
    status: u16,
    body: &'static str,
    headers: Headers,
}

impl Refusal {
    const BAD: Refusal = Refusal { status: 400, body: "malformed request\n", headers: &[] };
    const HOST: Refusal = Refusal {
        status: 400,
        body: "an HTTP/1.1 request needs one Host field (RFC 9112 section 3.2)\n",
        headers: &[],
    };
    const VERSION: Refusal = Refusal { status: 505, body: "HTTP/1.0 and HTTP/1.1 only\n", headers: &[] };
    const BODY: Refusal = Refusal {
        status: 413,
        body: "a request body is refused (not read): the server is read-only, GET and HEAD without a body\n",
        headers: &[],
    };
    const HEAD_TOO_LARGE: Refusal =
        Refusal { status: 431, body: "request head over 8192 bytes (limits::HTTP_MAX_HEAD_BYTES)\n", headers: &[] };
}

/// Most header fields in a request head (httparse needs a fixed table);
/// more get 431, as a head over [`limits::HTTP_MAX_HEAD_BYTES`] does.
const MAX_HEADERS: usize = 64;

/// Parses a complete request head (with its empty line) with `httparse`
/// (the request line and header grammar of RFC 9112; obsolete line
/// folding and stray spaces are errors). A body announced (`Content-Length`
/// above 0, or any `Transfer-Encoding`) is refused with 413 whatever the
/// method: the server never reads one, and never converts the length to a
/// number.
fn parse_head(head: &[u8]) -> Result<Request<'_>, Refusal> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err(Refusal::BAD),
        // httparse takes HTTP/1.0 and HTTP/1.1; another HTTP version is
        // 505, anything else in its place a malformed request.
        Err(httparse::Error::Version) if http_version_named(head) => return Err(Refusal::VERSION),
        Err(httparse::Error::TooManyHeaders) => return Err(Refusal::HEAD_TOO_LARGE),
        Err(_) => return Err(Refusal::BAD),
    }
    let (Some(method), Some(target)) = (req.method, req.path) else { return Err(Refusal::BAD) };
    let mut body = false;
    let mut hosts = 0;
    let mut authorization = None;
    for header in req.headers.iter() {
        if header.name.eq_ignore_ascii_case("host") {
            hosts += 1;
        } else if header.name.eq_ignore_ascii_case("authorization") {
            if authorization.replace(header.value).is_some() {
                return Err(Refusal::BAD);
            }
        } else if header.name.eq_ignore_ascii_case("transfer-encoding") {
            body = true;
        } else if header.name.eq_ignore_ascii_case("content-length") {
            // A list of equal lengths is allowed (RFC 9110 §8.6); only
            // whether one is above 0 matters, so no number is parsed.
            for length in header.value.split(|&b| b == b',').map(trim) {
                if length.is_empty() || !length.iter().all(u8::is_ascii_digit) {
                    return Err(Refusal::BAD);
                }
                body |= length.iter().any(|&b| b != b'0');
            }
        }
    }
    if body {
        return Err(Refusal::BODY);
    }
    // HTTP/1.1 needs exactly one Host field (RFC 9112 §3.2); HTTP/1.0 none.
    if (req.version == Some(1) && hosts == 0) || hosts > 1 {
        return Err(Refusal::HOST);
    }
    Ok(Request { method, target, authorization })
}

/// Whether the request line ends in `HTTP/<digit>.<digit>`.
fn http_version_named(head: &[u8]) -> bool {
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    matches!(line.rsplit(|&b| b == b' ').next(), Some([b'H', b'T', b'T', b'P', b'/', major, b'.', minor]) if major.is_ascii_digit() && minor.is_ascii_digit())
}

fn trim(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Content Too Large",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "",
    }
}

/// An HTTP/1.1 answer that closes the connection; `head_only` (HEAD) leaves
/// the body out but keeps its length.
fn response(status: u16, content_type: &str, body: &[u8], head_only: bool, extra: &[(&str, &str)]) -> Vec<u8> {
    let date = chrono::Utc::now().format("%a, %d %b %Y %H:%M:%S GMT");
    let mut out = format!(
        "HTTP/1.1 {status} {}\r\nDate: {date}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Cache-Control: no-store\r\nConnection: close\r\n",
        reason(status),
        body.len()
    )
    .into_bytes();
    for (name, value) in extra {
        out.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    if !head_only {
        out.extend_from_slice(body);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<(String, String), u16> {
        let end = head_end(s.as_bytes(), 0).expect("a complete head");
        parse_head(&s.as_bytes()[..end]).map(|r| (r.method.into(), r.target.into())).map_err(|r| r.status)
    }

    #[test]
    fn heads_end_at_the_first_empty_line() {
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: x\r\n\r\nrest", 0), Some(27));
        assert_eq!(head_end(b"GET / HTTP/1.1\nHost: x\n\nrest", 0), Some(24));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: x\r\n", 0), None);
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: x\r\n\r", 0), None);
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 24), Some(27), "from a rescanned tail");
    }

    #[test]
    fn gets_and_heads_parse() {
        assert_eq!(parse("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"), Ok(("GET".into(), "/metrics".into())));
        assert_eq!(parse("HEAD /?a=b HTTP/1.0\r\n\r\n"), Ok(("HEAD".into(), "/?a=b".into())));
        assert_eq!(parse("GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"), Ok(("GET".into(), "/".into())));
        assert_eq!(
            parse("GET / HTTP/1.1\r\nhost: x\r\nContent-Length: 000, 0\r\n\r\n"),
            Ok(("GET".into(), "/".into()))
        );
        assert_eq!(parse("POST / HTTP/1.1\r\nHost: x\r\n\r\n"), Ok(("POST".into(), "/".into())), "405 when routed");
        assert_eq!(parse("GET / HTTP/1.0\r\n\r\n"), Ok(("GET".into(), "/".into())), "HTTP/1.0 needs no Host");
    }

    #[test]
    fn any_body_is_refused_without_reading_its_length() {
        for head in [
            "GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n",
            "GET / HTTP/1.1\r\nContent-Length: 99999999999999999999999999999999999999\r\n\r\n",
            "POST / HTTP/1.1\r\ncontent-length:1\r\n\r\n",
            "GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            "GET / HTTP/1.1\r\nTRANSFER-ENCODING: gzip, chunked\r\n\r\n",
            "GET / HTTP/1.1\r\nContent-Length: 0\r\nContent-Length: 5\r\n\r\n",
        ] {
            assert_eq!(parse(head), Err(413), "{head:?}");
        }
    }

    #[test]
    fn malformed_heads_are_bad_requests() {
        for head in [
            "GET /\r\n\r\n",
            "GET  / HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1 x\r\n\r\n",
            "GET / HTTX/1.1\r\n\r\n",
            "G(T / HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\nno colon\r\n\r\n",
            "GET / HTTP/1.1\r\nHost : x\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n",
            "GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
            "GET / HTTP/1.1\r\nContent-Length: 1e3\r\n\r\n",
            "GET / HTTP/1.1\r\nContent-Length:\r\n\r\n",
            "GET / HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            "GET / HTTP/1.0\r\nHost: a\r\nhost: a\r\n\r\n",
        ] {
            assert_eq!(parse(head), Err(400), "{head:?}");
        }
        assert_eq!(parse("GET / HTTP/2.0\r\n\r\n"), Err(505));
        assert_eq!(parse_head(b"\xff / HTTP/1.1\r\n\r\n").map_err(|r| r.status), Err(400));
    }

    #[test]
    fn answers_close_and_head_keeps_the_length() {
        let get = String::from_utf8(response(200, "text/plain", b"hello", false, &[])).unwrap();
        assert!(get.starts_with("HTTP/1.1 200 OK\r\n"), "{get}");
        assert!(get.contains("\r\nContent-Length: 5\r\n") && get.contains("\r\nConnection: close\r\n"), "{get}");
        assert!(get.ends_with("\r\n\r\nhello"), "{get}");
        let head = String::from_utf8(response(405, "text/plain", b"hello", true, &[("Allow", "GET, HEAD")])).unwrap();
        assert!(head.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"), "{head}");
        assert!(head.contains("\r\nAllow: GET, HEAD\r\n") && head.ends_with("\r\n\r\n"), "{head}");
    }
}
