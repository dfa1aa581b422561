//! The text protocol front end (text-protocol.md): a fixed pool of I/O
//! threads (`text_threads`, default one per two cores), each a readiness loop
//! over many non-blocking connections (`io.rs`); the first `text_acceptors`
//! of them also accept and hand connections out round-robin (`accept.rs`).
//!
//! A connection is a small struct (`conn.rs`: its buffers, its offer, its
//! commands awaiting answers), one descriptor, no thread. Commands parsed in
//! one loop turn are grouped per shard into one
//! [`crate::broker::inbox::ShardMsg::Text`]; each shard answers a batch with
//! one message per I/O thread (its [`crate::broker::text_port::TextPort`], whose
//! sender wakes the thread). Replies are written in each connection's
//! command order, one write per connection per turn. No channel, thread or
//! timer per command: a command waits for its shard however long the shard
//! takes, so its reply is always what the shard did.
//!
//! A second listener, `text_tls`, serves the same protocol over TLS in the
//! same threads (`tls_link.rs`); with `text_auth_tokens_file` every
//! connection must send `AUTH <token>` first ([`auth`]).
//!
//! Connection counters for STATUS are in [`TextStats`]. The router starts
//! the server over its shards (src/router); tests start it over shards of
//! their own ([`crate::router::Shards`]).

mod accept;
pub mod auth;
mod conn;
mod io;
mod stats;
mod tls_link;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::Sender;
use mio::net::{TcpListener, TcpStream};
use mio::unix::SourceFd;
use mio::{Interest, Poll};

pub use stats::{TextStats, TextStatsSnapshot};

use crate::broker::inbox::ShardMsg;
use crate::broker::text_port::TextPort;
use crate::config::TextConfig;
use crate::ids::ConnId;
use crate::wake::Wake;
use io::{IoParts, IoThread, Round, LISTENER, LISTENER_TLS, WAKE};

/// Where an acceptor hands a connection (and whether it came from the TLS
/// listener) to an I/O thread.
struct Inbox {
    tx: Sender<(TcpStream, bool)>,
    wake: Arc<Wake>,
}

impl Inbox {
    fn hand(&self, stream: TcpStream, tls: bool) {
        if self.tx.send((stream, tls)).is_ok() {
            self.wake.wake();
        }
    }
}

/// State shared by the I/O threads.
struct Shared {
    shards: Arc<[Sender<ShardMsg>]>,
    /// Messages handed to each shard and not yet taken, shared with the
    /// eMQP I/O thread (`shard_inbox_messages`); text commands count too.
    inbox_load: Arc<[AtomicUsize]>,
    stats: Arc<TextStats>,
    config: TextConfig,
    /// The TLS configuration of the `text_tls` listener, if any.
    tls: Option<Arc<rustls::ServerConfig>>,
    /// The accepted tokens, when every connection must authenticate.
    tokens: Option<Arc<auth::Tokens>>,
    /// Every I/O thread's inbox, by index.
    inboxes: Vec<Inbox>,
    next_conn: AtomicU64,
    next_thread: AtomicUsize,
    stopping: AtomicBool,
    /// By I/O thread: whether it has connections paused for the input
    /// budget, to be woken when the total falls below it.
    budget_waiting: Vec<AtomicBool>,
    /// The [`ConnId`] of the connection holding the lead of the input
    /// budget (0: none; ids start at 1 << 24).
    lead: AtomicU64,
}

/// The input budget (`text_max_buffered_bytes`, README "The text
/// protocol"): bytes held for connections that are not commands yet,
/// counted in [`TextStats::buffered_bytes`] by every I/O thread.
///
/// The rule: the budget less one longest line (`text_max_line_bytes` + 1)
/// is for lines in progress, the rest is kept for one line at a time to
/// finish. Below the first part (the budget is not *spent*) a connection is
/// read as usual (one read, up to [`crate::limits::TEXT_READ_BUF_BYTES`]).
/// Once it is spent a connection is read only through the end of its next
/// line, if that end is in its socket within one read: the read completes a
/// line, so the connection holds nothing after it, and a client of short
/// complete lines is never held up by others' partial lines. A connection
/// whose next line is not complete may take the *lead*, if no connection
/// holds it: it is then read through the end of that line, whatever the
/// total (the kept part is for it), and gives the lead up when the line
/// ends (or is cut as too long, or the connection closes). Otherwise it
/// waits unread (paused: TCP makes its client wait) until the total falls
/// below the first part or the lead is free, or until its line times out
/// (`text_line_timeout`, whose clock starts when the waiting line's first
/// byte is seen). So the total passes the budget by at most one read per
/// I/O thread; lines in progress that together spend it cannot wait on
/// each other for ever (one of them leads and finishes); and every byte
/// held belongs to a line that completes or is closed within the line
/// timeout. A command held back behind an unanswered ASK counts too
/// ([`conn::Conn::input_bytes`]); while the budget is spent a connection
/// whose ASK is unanswered is not read (a line would only be held back;
/// the answer serves it again), so such commands stay within the budget
/// and free themselves when the ASK is answered (at most
/// `text_max_ask_wait`).
impl Shared {
    /// Where the budget is spent: the budget less one longest line (kept
    /// for the lead), in bytes.
    fn budget_soft_limit(&self) -> u64 {
        (self.config.max_buffered_bytes as u64).saturating_sub(self.config.max_line_bytes as u64 + 1)
    }

    /// Whether the budget is spent: connections are read only through the
    /// end of their next line, or as the lead.
    fn budget_spent(&self) -> bool {
        self.stats.buffered_bytes.load(Ordering::SeqCst) >= self.budget_soft_limit()
    }

    /// A connection now holds `now` bytes of input instead of `was`. A
    /// fall of the total below the spent mark wakes the I/O threads with
    /// paused connections (their own turn, else the next wake-up, retries
    /// them). One atomic add or subtract, only when the figure changed.
    fn charge(&self, was: usize, now: usize) {
        let gauge = &self.stats.buffered_bytes;
        if now > was {
            let total = gauge.fetch_add((now - was) as u64, Ordering::SeqCst) + (now - was) as u64;
            self.stats.buffered_bytes_peak.fetch_max(total, Ordering::Relaxed);
        } else if now < was {
            let freed = (was - now) as u64;
            let before = gauge.fetch_sub(freed, Ordering::SeqCst);
            let soft = self.budget_soft_limit();
            if before >= soft && before - freed < soft {
                self.wake_waiting();
            }
        }
    }

    /// Whether no connection holds the lead.
    fn lead_free(&self) -> bool {
        self.lead.load(Ordering::SeqCst) == 0
    }

    /// Connection `id` takes the lead if no connection holds it.
    fn take_lead(&self, id: ConnId) -> bool {
        self.lead.compare_exchange(0, id.0, Ordering::SeqCst, Ordering::SeqCst).is_ok()
    }

    /// The lead's line ended: the lead is free, and the I/O threads with
    /// paused connections are woken to take it.
    fn end_lead(&self) {
        self.lead.store(0, Ordering::SeqCst);
        self.wake_waiting();
    }

    /// Wakes the I/O threads that have connections paused for the budget.
    fn wake_waiting(&self) {
        for (waiting, inbox) in self.budget_waiting.iter().zip(&self.inboxes) {
            if waiting.load(Ordering::SeqCst) {
                inbox.wake.wake();
            }
        }
    }
}

/// What protects a text server besides its limits: a TLS listener and
/// the tokens every connection must present (docs/security.md "Text
/// protocol: TLS and tokens"). The default has neither.
#[derive(Debug, Default, Clone)]
pub struct TextSecurity {
    /// The TLS listener's address and configuration.
    pub tls: Option<(SocketAddr, crate::tls::ServerTls)>,
    /// When set, every connection must send `AUTH <token>` first.
    pub tokens: Option<Arc<auth::Tokens>>,
}

impl TextSecurity {
    /// The TLS listener and tokens `config` names, their files read.
    ///
    /// # Errors
    /// A file cannot be read or used: the setting, and one line naming the
    /// file.
    pub fn from_config(config: &TextConfig) -> Result<TextSecurity, (&'static str, String)> {
        let tls = match (config.tls_addr, &config.tls_cert_file, &config.tls_key_file) {
            (Some(addr), Some(cert), Some(key)) => {
                let tls = crate::tls::ServerTls::from_files(cert, key, config.tls_client_ca_file.as_deref())
                    .map_err(|e| ("text_tls", e.to_string()))?;
                Some((addr, tls))
            }
            (Some(_), _, _) => {
                return Err(("text_tls", "a TLS listener needs text_tls_cert_file and text_tls_key_file".into()))
            }
            (None, _, _) => None,
        };
        let tokens = match &config.auth_tokens_file {
            Some(path) => {
                Some(Arc::new(auth::Tokens::load(path).map_err(|e| ("text_auth_tokens_file", e.to_string()))?))
            }
            None => None,
        };
        Ok(TextSecurity { tls, tokens })
    }
}

/// A running text protocol server. Dropping it shuts it down.
pub struct TextServer {
    shared: Arc<Shared>,
    local_addr: SocketAddr,
    tls_addr: Option<SocketAddr>,
    threads: Vec<JoinHandle<()>>,
}

impl TextServer {
    /// Binds `addr` (and the TLS listener of `security`; port 0 picks a free
    /// port) and starts `config.threads`
    /// I/O threads (`emq-text-N`) over the shards behind `shards`, adding
    /// each batch's commands to the shard's `inbox_load`. Reads
    /// the descriptor limit for the reserve (the router raises it first,
    /// [`crate::fds::raise_nofile_limit`]).
    ///
    /// # Errors
    /// Binding, the poll or eventfd set-up, or thread creation failed.
    pub fn start(
        addr: SocketAddr,
        config: TextConfig,
        shards: Arc<[Sender<ShardMsg>]>,
        inbox_load: Arc<[AtomicUsize]>,
        stats: Arc<TextStats>,
        security: TextSecurity,
    ) -> std::io::Result<TextServer> {
        let listener = accept::bind(addr)?;
        let local_addr = listener.local_addr()?;
        let tls_listener = match &security.tls {
            Some((tls_addr, _)) => Some(accept::bind(*tls_addr)?),
            None => None,
        };
        let tls_addr = tls_listener.as_ref().map(|l| l.local_addr()).transpose()?;
        stats.fd_limit.store(crate::fds::nofile_limit()?, Ordering::Relaxed);
        let threads = config.threads.max(1);
        let acceptors = config.acceptors.clamp(1, threads);
        let mut parts = Vec::new();
        let mut inboxes = Vec::new();
        for index in 0..threads {
            let poll = Poll::new()?;
            let wake = Arc::new(Wake::new()?);
            poll.registry().register(&mut SourceFd(&wake.fd()), WAKE, Interest::READABLE)?;
            let mut acceptors_here = Vec::new();
            if index < acceptors {
                let mut acceptor = accept::Acceptor::new(TcpListener::from_std(listener.try_clone()?), index, false);
                poll.registry().register(acceptor.listener(), LISTENER, Interest::READABLE)?;
                acceptors_here.push(acceptor);
                if let Some(tls_listener) = &tls_listener {
                    let mut acceptor =
                        accept::Acceptor::new(TcpListener::from_std(tls_listener.try_clone()?), index, true);
                    poll.registry().register(acceptor.listener(), LISTENER_TLS, Interest::READABLE)?;
                    acceptors_here.push(acceptor);
                }
            }
            let (conns_tx, conns_rx) = crossbeam_channel::unbounded();
            let (replies_tx, replies_rx) = crossbeam_channel::unbounded();
            let port = TextPort { id: index as u64, tx: replies_tx, wake: Some(wake.clone()) };
            inboxes.push(Inbox { tx: conns_tx, wake: wake.clone() });
            parts.push(IoParts { poll, wake, conns_rx, port, replies_rx, acceptors: acceptors_here });
        }
        drop(listener);
        drop(tls_listener);
        let shared = Arc::new(Shared {
            shards,
            inbox_load,
            stats,
            config,
            tls: security.tls.as_ref().map(|(_, tls)| tls.config()),
            tokens: security.tokens,
            inboxes,
            next_conn: AtomicU64::new(1),
            next_thread: AtomicUsize::new(0),
            stopping: AtomicBool::new(false),
            budget_waiting: (0..threads).map(|_| AtomicBool::new(false)).collect(),
            lead: AtomicU64::new(0),
        });
        let mut server = TextServer { shared, local_addr, tls_addr, threads: Vec::new() };
        for (index, parts) in parts.into_iter().enumerate() {
            let thread = IoThread::new(server.shared.clone(), parts);
            let handle = std::thread::Builder::new().name(format!("emq-text-{index}")).spawn(move || thread.run())?;
            server.threads.push(handle);
        }
        tracing::info!(addr = %local_addr, threads, acceptors, "text protocol listening");
        if let Some(tls_addr) = tls_addr {
            tracing::info!(addr = %tls_addr, "text protocol listening over TLS");
        }
        if let Some(tokens) = &server.shared.tokens {
            tracing::info!(tokens = tokens.len(), "text connections must send AUTH <token> first");
        }
        Ok(server)
    }

    /// The bound address (with the real port when started on port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The TLS listener's bound address, if there is one.
    pub fn tls_addr(&self) -> Option<SocketAddr> {
        self.tls_addr
    }

    /// The live counters.
    pub fn stats(&self) -> &Arc<TextStats> {
        &self.shared.stats
    }

    /// Stops accepting, closes every connection (held offers go back to the
    /// front of their queues, long polls are cancelled) and waits for the
    /// I/O threads, each of which waits up to
    /// [`crate::limits::TEXT_SHUTDOWN_WAIT`] for the shards' last answers.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if self.shared.stopping.swap(true, Ordering::AcqRel) {
            return;
        }
        for inbox in &self.shared.inboxes {
            inbox.wake.wake();
        }
        for handle in self.threads.drain(..) {
            let _ = handle.join();
        }
    }
}

impl Drop for TextServer {
    fn drop(&mut self) {
        self.stop();
    }
}
