//! The text protocol over real TCP: the server (over dispatcher shards of
//! its own, without the rest of the router) and the Rust client (against a
//! scripted fake server and the real one).

mod client;
mod server;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use emq::config::{RouterConfig, TextConfig};
use emq::router::Shards;
use emq::text::{TextServer, TextStats};

pub use crate::common::watchdog::Watchdog as TextWatchdog;

/// Starts a per-test time bomb.
pub fn text_watchdog(secs: u64) -> TextWatchdog {
    TextWatchdog::new("text test", secs)
}

/// The shards behind a [`TextFixture`]'s server, seen as the tests need
/// them: what happened to offers, what waits in a queue, the drain flag.
pub struct Backend {
    shards: Option<Shards>,
}

/// What happened to offers, from the shards' counters.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Tasks accepted with ACK.
    pub acked: u64,
    /// Tasks declined with DCL.
    pub declined: u64,
    /// Tasks deleted with DEL.
    pub deleted: u64,
    /// Offers returned because their connection ended (END, close).
    pub released: u64,
    /// Offers returned by their timeout.
    pub timed_out: u64,
}

impl Backend {
    fn broker(&self) -> &emq::router::Broker {
        &self.shards.as_ref().expect("shards run until the fixture is dropped").broker
    }

    /// The counters so far.
    pub fn counts(&self) -> Counts {
        let c = &self.broker().ctx.counters;
        Counts {
            acked: c.text_acked.load(Relaxed),
            declined: c.text_declined.load(Relaxed),
            deleted: c.text_deleted.load(Relaxed),
            released: c.text_returned_disconnect.load(Relaxed),
            timed_out: c.text_returned_timeout.load(Relaxed),
        }
    }

    /// The waiting tasks of `queue`, front first.
    pub fn queue(&self, queue: &str) -> Vec<Vec<u8>> {
        self.broker().waiting(queue)
    }

    /// Starts or stops draining: SCHED is refused with `SHUTTING_DOWN`.
    pub fn set_shutting_down(&self, on: bool) {
        self.broker().ctx.draining.store(on, std::sync::atomic::Ordering::Release);
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        if let Some(shards) = self.shards.take() {
            shards.stop();
        }
    }
}

/// A server on a fresh port over two shards of its own.
pub struct TextFixture {
    pub server: TextServer,
    pub backend: Backend,
    pub stats: Arc<TextStats>,
}

/// Default text limits with the given changes.
pub fn text_config(edit: impl FnOnce(&mut TextConfig)) -> TextConfig {
    let mut c = RouterConfig::default().text;
    // Two I/O threads whatever the core count (the default on 2 cores is
    // one), so connections and shard answers cross threads here too.
    c.threads = 2;
    edit(&mut c);
    c
}

impl TextFixture {
    pub fn start(config: TextConfig, max_queue_len: usize) -> TextFixture {
        let router = RouterConfig { shards: 2, max_queue_len, text: config.clone(), ..RouterConfig::default() };
        let shards = Shards::start_alone(router).unwrap();
        let stats = Arc::new(TextStats::default());
        let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let server = TextServer::start(
            addr,
            config,
            shards.broker.shards.clone(),
            shards.broker.ctx.inbox_load.clone(),
            stats.clone(),
            Default::default(),
        )
        .unwrap();
        TextFixture { server, backend: Backend { shards: Some(shards) }, stats }
    }

    pub fn default() -> TextFixture {
        TextFixture::start(text_config(|_| {}), 1_000_000)
    }

    pub fn connect(&self) -> TextConn {
        TextConn::connect(self.server.local_addr())
    }
}

/// A raw connection with send/expect helpers (exact bytes).
pub struct TextConn {
    pub reader: BufReader<TcpStream>,
    pub writer: TcpStream,
}

impl TextConn {
    pub fn connect(addr: SocketAddr) -> TextConn {
        let writer = TcpStream::connect(addr).unwrap();
        writer.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        writer.set_nodelay(true).unwrap();
        TextConn { reader: BufReader::new(writer.try_clone().unwrap()), writer }
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.writer.write_all(bytes).unwrap();
    }

    /// Reads one line (with its LF).
    pub fn line(&mut self) -> Vec<u8> {
        let mut line = Vec::new();
        self.reader.read_until(b'\n', &mut line).unwrap();
        line
    }

    pub fn expect(&mut self, want: &[u8]) {
        let got = self.line();
        assert_eq!(got.escape_ascii().to_string(), want.escape_ascii().to_string());
    }

    /// Expects an `ERR <code> …` line.
    pub fn expect_err(&mut self, code: &str) {
        let got = self.line();
        let prefix = format!("ERR {code} ");
        assert!(got.starts_with(prefix.as_bytes()) && got.ends_with(b"\n"), "{:?}", got.escape_ascii().to_string());
    }

    /// Expects the server to close the connection with nothing more sent.
    pub fn expect_closed(&mut self) {
        let mut rest = Vec::new();
        match self.reader.read_to_end(&mut rest) {
            Ok(_) => assert!(rest.is_empty(), "unexpected bytes {:?}", rest.escape_ascii().to_string()),
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
        }
    }
}

/// The spec's example session, as a client sends it...
pub const EXAMPLE_IN: &[u8] = b"SCHED { email: \"test@test.de\", message: \"test message\" }@EMAILSERVICE\n\
ASK EMAILSERVICE\nACK\nASK EMAILSERVICE\nACK\nEND\n";
/// ...and exactly what the server answers.
pub const EXAMPLE_OUT: &[u8] = b"WANT? { email: \"test@test.de\", message: \"test message\" }\nNOPE\n\
ERR NO_TASK no task is offered on this connection\n";

/// Sends the spec's example session whole (or one byte per write) and
/// checks the server's answers byte for byte, up to the close after END.
pub fn spec_example(mut c: TextConn, one_byte: bool) {
    if one_byte {
        for b in EXAMPLE_IN {
            c.send(std::slice::from_ref(b));
        }
    } else {
        c.send(EXAMPLE_IN);
    }
    let mut all = Vec::new();
    c.reader.read_to_end(&mut all).unwrap();
    assert_eq!(all.escape_ascii().to_string(), EXAMPLE_OUT.escape_ascii().to_string());
}

/// Sends `n` `SCHED task-<i>@bulk` lines in one write, then (from another
/// thread, also in one write) `n` × `ASK bulk` + `ACK` and a last `ASK bulk`;
/// checks every task comes back exactly once, in order, then `NOPE`.
pub fn pipelined_sched_then_ask_ack(mut c: TextConn, n: usize) {
    let mut burst = Vec::new();
    for i in 0..n {
        burst.extend_from_slice(format!("SCHED task-{i}@bulk\n").as_bytes());
    }
    let start = Instant::now();
    c.send(&burst);
    let mut writer = c.writer.try_clone().unwrap();
    let asker = std::thread::spawn(move || {
        let mut asks = b"ASK bulk\nACK\n".repeat(n);
        asks.extend_from_slice(b"ASK bulk\n");
        std::io::Write::write_all(&mut writer, &asks).unwrap();
    });
    for i in 0..n {
        let line = c.line();
        assert_eq!(line, format!("WANT? task-{i}\n").as_bytes());
    }
    c.expect(b"NOPE\n");
    asker.join().unwrap();
    // A figure for reports, not an assertion.
    println!("{n} SCHED + {n} ASK/ACK pipelined: {:.3} s", start.elapsed().as_secs_f64());
}

/// Polls `cond` every 5 ms until it holds, or panics after 5 s.
pub fn text_wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}
