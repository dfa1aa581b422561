//! The router as a whole: builds the sockets, channels and threads, starts
//! them, and stops them on request (DISCONNECT, a signal, [`RouterHandle`]).
//!
//! Threads (README, "How it works"): one I/O thread
//! ([`crate::zmq_io`]) owning the ROUTER sockets; N dispatcher shards
//! ([`crate::broker::shard`]); the text front end ([`crate::text`]); the
//! admin thread ([`admin`]); the latency reporter ([`reporter`]); and the
//! control thread (`control.rs`), which drains and stops the rest.

pub mod admin;
pub mod ask;
mod control;
pub mod curve;
mod dead_admin;
pub mod http;
pub mod http_auth;
pub mod outbox;
pub mod prometheus;
pub mod release;
pub mod reporter;
pub mod scrape;
mod standby_admin;
pub mod status_page;

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;

use crate::broker::inbox::ShardMsg;
use crate::broker::shard::{Shard, ShardContext};
use crate::broker::snapshot::ShardSnapshot;
use crate::config::RouterConfig;
use crate::fds;
use crate::ids::QueueName;
use crate::metrics::counters::Counters;
use crate::metrics::latency::LatencyStore;
use crate::text::{TextSecurity, TextServer, TextStats};
use crate::zmq_error::ZmqError;
use crate::zmq_io::egress::{self, EgressRx, EgressTx};
use crate::zmq_io::io_thread::{IoLimits, IoThread, StopReason};
use crate::zmq_io::sockets::router_socket;
use admin::ExtraStatus;
use outbox::ShardOutbox;
use release::Releaser;

/// Why the router could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A ZeroMQ socket could not be created, configured or bound.
    #[error(transparent)]
    Zmq(#[from] ZmqError),
    /// The write-ahead log could not be opened or recovered (locked data
    /// directory, damaged log, file errors).
    #[error(transparent)]
    Wal(#[from] crate::wal::WalError),
    /// The replicated log could not be opened (no NATS server, the router
    /// name held by a live router, a stream unreadable).
    #[error(transparent)]
    Js(#[from] crate::jslog::JsError),
    /// Settings that cannot work on this machine, found at start (the
    /// text front end's descriptor reserve against the descriptor limit).
    #[error("setting {name}: {why}")]
    Setting {
        /// The setting's name as in the file.
        name: &'static str,
        /// What is wrong.
        why: String,
    },
    /// A thread could not be spawned, or the text listener not bound.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
}

/// The shards as the router's other threads see them: their shared context
/// and their channels.
#[derive(Clone)]
pub struct Broker {
    /// What every shard shares.
    pub ctx: ShardContext,
    /// Every shard's channel, by index.
    pub shards: Arc<[Sender<ShardMsg>]>,
}

/// The dispatcher shards on their threads (`emq-shard-N`): the broker
/// without its front ends. The router starts them with the rest; tests of
/// the text front end start them alone ([`Shards::start_alone`]).
pub struct Shards {
    /// Their context and channels.
    pub broker: Broker,
    threads: Vec<JoinHandle<()>>,
    /// The egress of shards started alone (nobody sends their frames).
    _egress: Option<EgressRx>,
}

impl Shards {
    /// Starts `config.shards` shards whose frames for ZeroMQ peers go to
    /// `egress`, each pinned to core `i + 1` of `plan` when given. Shard `i`
    /// takes its write-ahead log and recovered jobs from `logs[i]` when
    /// there is one (none: the shard keeps no log).
    ///
    /// # Errors
    /// [`StartError::Io`] when a thread cannot be spawned.
    pub fn start(
        config: Arc<RouterConfig>,
        egress: &EgressTx,
        plan: Option<Vec<core_affinity::CoreId>>,
        started: Instant,
        logs: &mut [Option<LogStart>],
    ) -> Result<Shards, StartError> {
        let (txs, rxs): (Vec<Sender<ShardMsg>>, Vec<Receiver<ShardMsg>>) =
            (0..config.shards).map(|_| crossbeam_channel::unbounded()).unzip();
        let mut ctx = ShardContext::new(config.clone(), config.shards, started);
        // A standby reaches this only once it owns the name.
        ctx.serving_since = Instant::now();
        let broker = Broker { ctx, shards: txs.into() };
        let mut threads = Vec::new();
        for (i, rx) in rxs.into_iter().enumerate() {
            let mut shard = Shard::new(i, broker.ctx.clone(), started);
            if let Some(start) = logs.get_mut(i).and_then(Option::take) {
                shard.attach_log(start.log, start.recovered);
            }
            let wal = &config.wal;
            let own_thread = match wal.durability {
                crate::config::Durability::Sync => wal.sync_thread,
                crate::config::Durability::Replicated => true,
                _ => false,
            };
            let releaser = if own_thread {
                Releaser::thread(i, shard.log().durable())
                    .map_err(|source| StartError::Io { what: format!("emq-sync-{i}"), source })?
            } else {
                Releaser::inline(shard.log().durable())
            };
            let durable = shard.log().durable();
            let mut out = ShardOutbox::new(i, egress.clone(), broker.shards.clone(), releaser, durable);
            let plan = plan.clone();
            threads.push(spawn(format!("emq-shard-{i}"), move || {
                pin(&plan, i + 1);
                shard.run(rx, &mut out)
            })?);
        }
        Ok(Shards { broker, threads, _egress: None })
    }

    /// Starts the shards of `config` with no ZeroMQ side: frames they would
    /// send to eMQP peers are dropped (there are none), and no write-ahead
    /// log is kept (whatever `config.wal` says). For the text front end's
    /// tests.
    ///
    /// # Errors
    /// The eventfd of the egress, or a thread, cannot be made.
    pub fn start_alone(config: RouterConfig) -> Result<Shards, StartError> {
        let (tx, rx) = egress::channel().map_err(|source| StartError::Io { what: "egress eventfd".into(), source })?;
        let mut shards = Shards::start(Arc::new(config), &tx, None, Instant::now(), &mut [])?;
        shards._egress = Some(rx);
        Ok(shards)
    }

    /// Stops every shard ([`ShardMsg::Shutdown`]) and waits for its thread.
    pub fn stop(self) {
        for tx in self.broker.shards.iter() {
            let _ = tx.send(ShardMsg::Shutdown);
        }
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// The endpoints the router actually bound (port 0 / `*` resolved).
#[derive(Debug, Clone)]
pub struct Endpoints {
    /// Frontend, e.g. `tcp://127.0.0.1:47291`.
    pub frontend: String,
    /// Backend.
    pub backend: String,
    /// Admin.
    pub admin: String,
    /// Text protocol listener, when on.
    pub text: Option<std::net::SocketAddr>,
    /// HTTP server of `/metrics` and the status page, when on.
    pub metrics: Option<std::net::SocketAddr>,
}

/// What runs once the router has stopped.
type StoppedHook = Box<dyn FnOnce() + Send>;

/// Whether the router has stopped, and what to run when it does.
#[derive(Default)]
struct Stopped {
    done: bool,
    hook: Option<StoppedHook>,
}

/// A running router. Dropping it shuts the router down and waits.
pub struct RouterHandle {
    stop_tx: Sender<StopReason>,
    control: Option<JoinHandle<()>>,
    broker: Broker,
    text_stats: Option<Arc<TextStats>>,
    stopped: Arc<Mutex<Stopped>>,
    /// The bound endpoints.
    pub endpoints: Endpoints,
}

impl RouterHandle {
    /// Starts the shutdown (drain, KBYE, exit) without waiting for it.
    pub fn shutdown(&self) {
        let _ = self.stop_tx.send(StopReason::Requested);
    }

    /// Waits until the router has stopped (after DISCONNECT or [`shutdown`](Self::shutdown)).
    pub fn wait(mut self) {
        if let Some(c) = self.control.take() {
            let _ = c.join();
        }
    }

    /// A snapshot of every shard (for tests and tools).
    pub fn snapshots(&self) -> Vec<ShardSnapshot> {
        self.broker.snapshots()
    }

    /// A cloneable handle that can only request the shutdown (for signal
    /// handlers and other threads).
    pub fn stop_handle(&self) -> StopHandle {
        StopHandle { stop_tx: self.stop_tx.clone() }
    }

    /// The broker-wide counters.
    pub fn counters(&self) -> &Counters {
        &self.broker.ctx.counters
    }

    /// The shards' context and channels (for tests and tools).
    pub fn broker(&self) -> &Broker {
        &self.broker
    }

    /// The text front end's counters, when it is on.
    pub fn text_stats(&self) -> Option<&Arc<TextStats>> {
        self.text_stats.as_ref()
    }

    /// Runs `f` once the router has stopped, on the thread that stopped it
    /// (at once when it already has). `emq-router` closes its signal
    /// iterator this way when a DISCONNECT stops the router.
    pub fn on_stopped(&self, f: impl FnOnce() + Send + 'static) {
        let mut stopped = self.stopped.lock();
        if stopped.done {
            drop(stopped);
            f();
        } else {
            stopped.hook = Some(Box::new(f));
        }
    }
}

impl Drop for RouterHandle {
    fn drop(&mut self) {
        if let Some(c) = self.control.take() {
            self.shutdown();
            let _ = c.join();
        }
    }
}

/// Requests the router's shutdown from anywhere.
#[derive(Clone)]
pub struct StopHandle {
    stop_tx: Sender<StopReason>,
}

impl StopHandle {
    /// Starts the shutdown without waiting for it.
    pub fn shutdown(&self) {
        let _ = self.stop_tx.send(StopReason::Requested);
    }
}

fn spawn(name: String, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, StartError> {
    std::thread::Builder::new().name(name.clone()).spawn(f).map_err(|source| StartError::Io { what: name, source })
}

/// Cores to pin to, when there are strictly more cores than pinned threads
/// (one spare for everything else); `None` on small machines.
fn pin_plan(config: &RouterConfig) -> Option<Vec<core_affinity::CoreId>> {
    let cores = core_affinity::get_core_ids()?;
    let needed = config.shards + 1;
    if !config.pin_threads || cores.len() <= needed {
        tracing::info!(cores = cores.len(), threads = needed, "threads not pinned (not enough cores, or disabled)");
        return None;
    }
    Some(cores)
}

fn pin(plan: &Option<Vec<core_affinity::CoreId>>, slot: usize) {
    if let Some(core) = plan.as_ref().and_then(|c| c.get(slot)) {
        if !core_affinity::set_for_current(*core) {
            tracing::warn!(core = core.id, "could not pin thread");
        }
    }
}

/// Starts a router on `config`. Returns once the write-ahead log is
/// recovered, every socket is bound and every thread runs.
///
/// # Errors
/// [`StartError`] naming the address or thread that failed (e.g. a port in
/// use), or why the log cannot be opened.
pub fn start(config: RouterConfig) -> Result<RouterHandle, StartError> {
    start_with(config, Arc::new(Vec::new))
}

/// One shard's job log and what it recovered.
pub struct LogStart {
    /// The log.
    pub log: Box<dyn crate::joblog::JobLog>,
    /// What it holds: facts, no policy applied.
    pub recovered: crate::joblog::Recovered,
}

impl LogStart {
    fn of(log: impl crate::joblog::JobLog + 'static, recovered: crate::joblog::Recovered) -> Option<LogStart> {
        Some(LogStart { log: Box::new(log), recovered })
    }
}

/// What keeps the logs' store for the router's life: the locked data
/// directory (local logs) or the NATS thread and the router name's lease
/// (replicated), released once every shard has stopped.
pub(crate) enum LogStore {
    /// `memory`: nothing.
    None,
    /// `sync`, `async`.
    Dir(#[allow(dead_code)] Arc<crate::wal::dir::DataDir>),
    /// `replicated`.
    Nats(Box<crate::jslog::Store>),
}

/// What [`open_logs`] opened.
struct OpenedLogs {
    /// Each shard's log (none with `memory`).
    starts: Vec<Option<LogStart>>,
    /// What keeps their store.
    store: LogStore,
    /// The NATS server connected to (replicated), for STATUS.
    server: Option<serde_json::Value>,
}

/// Every shard's job log, opened and recovered, with what keeps their
/// store and their figures (none for `durability = "memory"`).
///
/// `config.wal.skip_damaged` (`--recover-skip-damaged`) decides whether damage
/// in the middle of a local log stops the start.
fn open_logs(
    config: &RouterConfig,
    started: Instant,
    own: &Arc<crate::jslog::ownership::Ownership>,
) -> Result<OpenedLogs, StartError> {
    use crate::config::Durability;
    match config.wal.durability {
        Durability::Memory => Ok(OpenedLogs { starts: Vec::new(), store: LogStore::None, server: None }),
        Durability::Replicated => {
            let opened = crate::jslog::open(config, started, started, own.clone())?;
            let server = serde_json::json!(opened.server);
            let starts = opened.shards.into_iter().map(|s| LogStart::of(s.log, s.recovered)).collect();
            Ok(OpenedLogs { starts, store: LogStore::Nats(Box::new(opened.store)), server: Some(server) })
        }
        Durability::Sync | Durability::Async => {
            let skip = config.wal.skip_damaged;
            let opened = crate::wal::open(&config.wal, config.shards, skip, started, started)?;
            let starts = opened.shards.into_iter().map(|s| LogStart::of(s.log, s.recovered)).collect();
            Ok(OpenedLogs { starts, store: LogStore::Dir(opened.dir), server: None })
        }
    }
}

/// STATUS's `wal` figures: the durability, the data directory and the
/// free space limit (local logs) or the NATS cluster (replicated), and
/// each shard's log.
fn wal_status(
    config: &RouterConfig,
    logs: &[Arc<dyn crate::joblog::LogStatus>],
    started_on: &Option<serde_json::Value>,
    bridge: &Option<(Arc<crate::jslog::bridge::BridgeStats>, async_nats::Client)>,
    own: &crate::jslog::ownership::Ownership,
) -> serde_json::Value {
    use crate::config::Durability;
    let local = matches!(config.wal.durability, Durability::Sync | Durability::Async);
    let replicated = config.wal.durability == Durability::Replicated;
    let nats = replicated.then(|| {
        let n = &config.nats;
        let get = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        let connected = bridge.as_ref().map(|(_, c)| c.connection_state() == async_nats::connection::State::Connected);
        let server = bridge.as_ref().map(|(_, c)| {
            let i = c.server_info();
            format!("{} ({}:{}, nats-server {})", i.server_name, i.host, i.port, i.version)
        });
        // Owner until the store fences it or another router takes the name.
        let lost = logs.iter().any(|l| {
            matches!(
                l.figures().state,
                crate::joblog::LogState::Faulty(crate::joblog::FaultKind::Fenced | crate::joblog::FaultKind::Taken)
            )
        });
        if lost {
            own.fenced(None);
        }
        serde_json::json!({
            "role": own.role().as_str(),
            "ownership": own.to_json(),
            "other_routers": own.peers().to_json(),
            "standby": n.standby,
            "router_name": n.router_name,
            "urls": n.urls,
            "connected": connected,
            "connected_to": if connected == Some(true) { server } else { None },
            "first_server": started_on,
            "replicas": n.replicas,
            "publishes_in_flight": bridge.as_ref().map(|(b, _)| b.in_flight.load(std::sync::atomic::Ordering::Relaxed)),
            "retries": bridge.as_ref().map(|(b, _)| get(&b.retries)),
            "purge_errors": bridge.as_ref().map(|(b, _)| get(&b.purge_errors)),
        })
    });
    serde_json::json!({
        "durability": config.wal.durability.as_str(),
        "data_dir": local.then(|| config.wal.data_dir().display().to_string()),
        "disk_free_limit": local.then_some(config.wal.disk_free_limit),
        "nats": nats,
        "shards": logs.iter().enumerate().map(|(i, s)| s.to_json(i)).collect::<Vec<_>>(),
    })
}

/// Raises the soft descriptor limit to the hard one: every eMQP and text
/// connection is a descriptor, and when they run out no listener accepts,
/// the admin socket's included (libzmq's pause a while and try again).
/// Returns the limit in force.
fn raise_descriptor_limit() -> std::io::Result<u64> {
    fds::raise_nofile_limit().or_else(|e| {
        tracing::warn!(error = %e, "cannot raise the descriptor limit");
        fds::nofile_limit()
    })
}

/// Starts the text front end over the shards, if configured, after
/// checking that `text_reserved_fds` leaves room for text connections
/// under the descriptor `limit` ([`fds::check_text_reserve`]: none is an
/// error, fewer than `text_max_connections` a warning). Runs after the
/// eMQP sockets and the shards have opened their descriptors, so the count
/// is the router's own.
fn start_text(
    config: &RouterConfig,
    broker: &Broker,
    limit: std::io::Result<u64>,
) -> Result<Option<TextServer>, StartError> {
    let Some(addr) = config.text_addr else { return Ok(None) };
    let room = limit.and_then(|limit| {
        Ok(fds::check_text_reserve(
            config.text.reserved_fds,
            config.text.max_connections,
            limit,
            fds::lowest_free(limit)?,
        ))
    });
    match room {
        Ok(Ok(None)) => {}
        Ok(Ok(Some(warning))) => tracing::warn!("{warning}"),
        Ok(Err(why)) => return Err(StartError::Setting { name: "text_reserved_fds", why }),
        Err(e) => tracing::warn!(error = %e, "cannot count the descriptors open: text_reserved_fds not checked"),
    }
    let security = TextSecurity::from_config(&config.text).map_err(|(name, why)| StartError::Setting { name, why })?;
    let stats = Arc::new(TextStats::default());
    TextServer::start(addr, config.text.clone(), broker.shards.clone(), broker.ctx.inbox_load.clone(), stats, security)
        .map(Some)
        .map_err(|source| StartError::Io { what: format!("text listener {addr}"), source })
}

/// The text front end's figures for STATUS: the connections' own, and the
/// shards' counts of offers returned.
fn text_status(stats: &TextStats, counters: &Counters) -> serde_json::Value {
    let s = stats.snapshot();
    let count = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    serde_json::json!({
        "connections_open": s.connections_open,
        "connections_total": s.connections_total,
        "offers_held": s.offers_held,
        "offers_returned_disconnect": count(&counters.text_returned_disconnect),
        "offers_returned_timeout": count(&counters.text_returned_timeout),
        "offers_rewritten": s.offers_rewritten,
        "offers_dead_lettered": count(&counters.text_dead_lettered),
        "ask_waits_expired": count(&counters.text_ask_waits_expired),
        "line_timeout_closed": s.line_timeout_closed,
        "slow_reader_closed": s.slow_reader_closed,
        "buffered_bytes": s.buffered_bytes,
        "buffered_bytes_peak": s.buffered_bytes_peak,
        "reads_paused": s.reads_paused,
        "refused_fds": s.refused_fds,
        "accept_errors": s.accept_errors,
        "fd_limit": s.fd_limit,
        "tls_connections_total": s.tls_connections_total,
        "tls_handshakes": s.tls_handshakes,
        "tls_handshake_failures": s.tls_handshake_failures,
        "auth_ok": s.auth_ok,
        "auth_failed": s.auth_failed,
        "auth_noauth": s.auth_noauth,
        "barriers": s.barriers,
        "errors_by_code": s.errors.iter().map(|(k, v)| (k.to_string(), serde_json::json!(v))).collect::<serde_json::Map<_, _>>(),
    })
}

/// [`start`] with extra STATUS figures (each a key of STATUS's `emq` object).
///
/// # Errors
/// As [`start`].
pub fn start_with(config: RouterConfig, extra: ExtraStatus) -> Result<RouterHandle, StartError> {
    let config = Arc::new(config);
    let started = Instant::now();
    let zctx = zmq::Context::new();
    let hwm = config.zmq_hwm;
    // A message over about twice the message limit (every frame counted,
    // 64 bytes a frame more) makes libzmq drop the peer; messages between
    // the two get ERROR TOO_BIG from the I/O thread.
    let max_msg = crate::limits::zmq_max_msg_size(config.max_message_bytes);
    let own = Arc::new(crate::jslog::ownership::Ownership::default());
    // A standby answers admin while it waits and replays (standby_admin.rs).
    let standby = if config.wal.durability == crate::config::Durability::Replicated && config.nats.standby {
        let (sock, ad) = router_socket(&zctx, &config.admin_addr, hwm, max_msg, "admin")?;
        tracing::info!(admin = %ad, router_name = %config.nats.router_name, "standby: admin bound; STATUS says who owns the name");
        Some((standby_admin::start(sock, own.clone(), config.nats.router_name.clone())?, ad))
    } else {
        None
    };
    let opened = open_logs(&config, started, &own);
    let admin_early = standby.and_then(|(s, ad)| s.finish().map(|sock| (sock, ad)));
    let OpenedLogs { mut starts, store: log_store, server: store_server } = opened?;
    let bridge_stats = match &log_store {
        LogStore::Nats(s) => Some((s.bridge().stats.clone(), s.bridge().client().clone())),
        _ => None,
    };
    // The ZAP handler is bound before any CURVE endpoint.
    let mut curve_rt = curve::prepare(&config.curve, &zctx)?;
    let (mut frontend, fe) = router_socket(&zctx, &config.frontend_addr, hwm, max_msg, "frontend")?;
    let (mut backend, be) = router_socket(&zctx, &config.backend_addr, hwm, max_msg, "backend")?;
    let (mut admin_sock, ad) = match admin_early {
        Some(early) => early,
        None => router_socket(&zctx, &config.admin_addr, hwm, max_msg, "admin")?,
    };
    let mut curve_bound = Vec::new();
    if let Some((rt, secret)) = curve_rt.as_mut() {
        let sockets = [&mut frontend, &mut backend, &mut admin_sock];
        curve_bound = curve::bind_all(rt, secret, &config.curve, &zctx, sockets)?;
    }
    let curve_rt = curve_rt.map(|(rt, _)| rt);
    let curve_shared = curve_rt.as_ref().map(|rt| rt.shared.clone());
    // Once the addresses are known good (a bind error is the only line).
    let fd_limit = raise_descriptor_limit();
    let (egress_tx, egress_rx) =
        egress::channel().map_err(|source| StartError::Io { what: "egress eventfd".into(), source })?;

    let log_stats: Vec<Arc<dyn crate::joblog::LogStatus>> = starts.iter().flatten().map(|s| s.log.status()).collect();
    let plan = pin_plan(&config);
    let shards = Shards::start(config.clone(), &egress_tx, plan.clone(), started, &mut starts)?;
    let broker = shards.broker.clone();
    let text = match start_text(&config, &broker, fd_limit) {
        Ok(text) => text,
        Err(e) => {
            shards.stop();
            return Err(e);
        }
    };
    let text_addr = text.as_ref().map(|t| t.local_addr());
    let text_stats = text.as_ref().map(|t| t.stats().clone());
    let (wal_config, inner_extra, wal_logs, wal_own) = (config.clone(), extra, log_stats.clone(), own.clone());
    let extra: ExtraStatus = Arc::new(move || {
        let mut v = inner_extra();
        v.push(("router_name", serde_json::json!(wal_config.nats.router_name)));
        v.push(("wal", wal_status(&wal_config, &wal_logs, &store_server, &bridge_stats, &wal_own)));
        v
    });
    let extra: ExtraStatus = match curve_shared.clone() {
        Some(shared) => Arc::new(move || {
            let mut v = extra();
            v.push(("curve", curve::status_json(&shared)));
            v
        }),
        None => extra,
    };
    let extra: ExtraStatus = match text_stats.clone() {
        Some(stats) => {
            let counters = broker.ctx.counters.clone();
            Arc::new(move || {
                let mut v = extra();
                v.push(("text", text_status(&stats, &counters)));
                v
            })
        }
        None => extra,
    };
    let (admin_tx, admin_rx) = crossbeam_channel::unbounded();
    let latency = Arc::new(Mutex::new(LatencyStore::default()));
    let (admin_egress, admin_broker, admin_latency) = (egress_tx.clone(), broker.clone(), latency.clone());
    let admin_curve = curve_shared.clone();
    let admin_thread = spawn("emq-admin".into(), move || {
        admin::run(admin_rx, admin_egress, admin_broker, extra, admin_latency, admin_curve)
    })?;
    let http = match config.metrics_addr {
        Some(addr) => {
            let sources = scrape::Sources {
                broker: broker.clone(),
                latency: latency.clone(),
                text: text_stats.clone(),
                logs: log_stats.clone(),
                disk_free_limit: matches!(
                    config.wal.durability,
                    crate::config::Durability::Sync | crate::config::Durability::Async
                )
                .then_some(config.wal.disk_free_limit),
                ownership: (config.wal.durability == crate::config::Durability::Replicated).then(|| own.clone()),
                curve: curve_shared.clone(),
                router_name: config.nats.router_name.to_string(),
            };
            let limits = http::HttpLimits {
                max_connections: config.metrics_max_connections,
                head_timeout: config.metrics_head_timeout,
                request_timeout: config.metrics_request_timeout,
                max_queues: config.metrics_max_queues,
            };
            let security = http::HttpSecurity {
                basic_auth_file: config.metrics_basic_auth_file.clone(),
                tls_files: config.metrics_tls_cert_file.clone().zip(config.metrics_tls_key_file.clone()),
                tls_client_ca_file: config.metrics_tls_client_ca_file.clone(),
            };
            Some(http::HttpServer::start(addr, sources, limits, security)?)
        }
        None => None,
    };
    let metrics_addr = http.as_ref().map(|h| h.local_addr());
    let (reporter_stop, reporter_rx) = crossbeam_channel::bounded::<()>(1);
    let (rep_broker, rep_cfg) = (broker.clone(), config.latency.clone());
    let reporter = spawn("emq-latency".into(), move || reporter::run(rep_broker, latency, rep_cfg, reporter_rx))?;

    let (stop_tx, stop_rx) = crossbeam_channel::unbounded();
    let io = IoThread {
        frontend,
        backend,
        admin: admin_sock,
        egress: egress_rx,
        shards: broker.shards.clone(),
        admin_tx,
        stop_tx: stop_tx.clone(),
        counters: broker.ctx.counters.clone(),
        default_queues: config.default_queues.iter().map(|(w, q)| (*w, QueueName::named(q))).collect(),
        inbox_load: broker.ctx.inbox_load.clone(),
        job_bytes: broker.ctx.job_bytes.clone(),
        in_transit_bytes: broker.ctx.in_transit_bytes.clone(),
        limits: IoLimits {
            max_message_bytes: config.max_message_bytes,
            max_queues_per_worker: config.max_queues_per_worker,
            shard_inbox_messages: config.shard_inbox_messages,
            memory_limit: broker.ctx.memory_limit,
        },
        curve: curve_rt.as_ref().map(|rt| rt.binds.clone()).unwrap_or_default(),
        peer_endpoints: [fe.clone(), be.clone()],
    };
    let io_plan = plan.clone();
    let io_thread = spawn("emq-io-0".into(), move || {
        pin(&io_plan, 0);
        io.run()
    })?;
    let stopped = Arc::new(Mutex::new(Stopped::default()));
    let threads = control::Threads {
        text,
        http,
        reporter,
        reporter_stop,
        shards,
        io: io_thread,
        exit: egress_tx,
        admin: admin_thread,
        zctx,
        log_store,
        curve: curve_rt,
        // A replicated router's logs, watched for a fence.
        fence_watch: if config.wal.durability == crate::config::Durability::Replicated {
            log_stats.clone()
        } else {
            Vec::new()
        },
    };
    let control_broker = broker.clone();
    let control_stopped = stopped.clone();
    let control = spawn("emq-control".into(), move || {
        control::run(stop_rx, control_broker, threads);
        let hook = {
            let mut s = control_stopped.lock();
            s.done = true;
            s.hook.take()
        };
        if let Some(hook) = hook {
            hook();
        }
    })?;
    own.serving();
    if config.wal.durability == crate::config::Durability::Replicated {
        let view = own.to_json();
        tracing::info!(
            router_name = %config.nats.router_name,
            ownership = "owner",
            replay_ms = view["replay"]["took_ms"].as_u64().unwrap_or(0),
            "serving: this router owns its name"
        );
    }
    for (domain, endpoint) in &curve_bound {
        tracing::info!(socket = domain, %endpoint, "CURVE endpoint bound");
    }
    tracing::info!(frontend = %fe, backend = %be, admin = %ad, shards = config.shards, "emq-router started");
    Ok(RouterHandle {
        stop_tx,
        control: Some(control),
        broker,
        text_stats,
        stopped,
        endpoints: Endpoints { frontend: fe, backend: be, admin: ad, text: text_addr, metrics: metrics_addr },
    })
}
