//! Starting and stopping the whole router: sockets, I/O thread, shards,
//! admin thread, text front end, and the drain on shutdown.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use super::admin::{self, collect_snapshots, ExtraStatus};
use super::egress::ZmqOutbox;
use super::io_thread::{IoThread, StopReason};
use crate::broker::msg::ShardMsg;
use crate::broker::shard::{Shard, ShardContext};
use crate::broker::snapshot::ShardSnapshot;
use crate::broker::types::QueueName;
use crate::config::RouterConfig;
use crate::metrics::counters::Counters;
use crate::metrics::latency::LatencyStore;
use crate::metrics::reporter;
use crate::text::shard_backend::ShardBackend;
use crate::text::{TextServer, TextStats};
use parking_lot::Mutex;

const EGRESS_ENDPOINT: &str = "inproc://emq-egress";

/// Why the router could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A ZeroMQ socket could not be created, configured or bound.
    #[error("{what}: {source}")]
    Zmq {
        /// What was being done (names the address).
        what: String,
        /// The ZeroMQ error.
        source: zmq::Error,
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

fn zerr(what: impl Into<String>) -> impl FnOnce(zmq::Error) -> StartError {
    let what = what.into();
    move |source| StartError::Zmq { what, source }
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
}

/// A running router. Dropping it shuts the router down and waits.
pub struct RouterHandle {
    stop_tx: Sender<StopReason>,
    control: Option<JoinHandle<()>>,
    ctx: ShardContext,
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
        collect_snapshots(&self.ctx.shards)
    }

    /// A cloneable handle that can only request the shutdown (for signal
    /// handlers and other threads).
    pub fn stop_handle(&self) -> StopHandle {
        StopHandle { stop_tx: self.stop_tx.clone() }
    }

    /// The broker-wide counters.
    pub fn counters(&self) -> &Counters {
        &self.ctx.counters
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

fn router_socket(ctx: &zmq::Context, addr: &str, hwm: i32, name: &str) -> Result<(zmq::Socket, String), StartError> {
    let s = ctx.socket(zmq::ROUTER).map_err(zerr(format!("{name} socket")))?;
    s.set_router_mandatory(true).map_err(zerr("ROUTER_MANDATORY"))?;
    s.set_sndhwm(hwm).map_err(zerr("SNDHWM"))?;
    s.set_rcvhwm(hwm).map_err(zerr("RCVHWM"))?;
    s.set_linger(200).map_err(zerr("LINGER"))?;
    s.bind(addr).map_err(zerr(format!("bind {name} {addr}")))?;
    let bound = s.get_last_endpoint().ok().and_then(|e| e.ok()).unwrap_or_else(|| addr.to_string());
    Ok((s, bound))
}

fn spawn(name: String, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, StartError> {
    std::thread::Builder::new().name(name.clone()).spawn(f).map_err(|source| StartError::Io { what: name, source })
}

/// Cores to pin to, when there are strictly more cores than pinned threads
/// (one spare for everything else); `None` on small machines (DESIGN).
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

/// Starts a router on `config`. Returns once every socket is bound and
/// every thread runs.
///
/// # Errors
/// [`StartError`] naming the address or thread that failed (e.g. a port in use).
pub fn start(config: RouterConfig) -> Result<RouterHandle, StartError> {
    start_with(config, Arc::new(Vec::new))
}

/// Starts the text front end over the shards, if configured.
fn start_text(config: &RouterConfig, ctx: &ShardContext) -> Result<Option<TextServer>, StartError> {
    let Some(addr) = config.text_addr else { return Ok(None) };
    let backend = ShardBackend::new(ctx.shards.clone(), config.text.offer_timeout, ctx.draining.clone());
    let stats = Arc::new(TextStats::default());
    TextServer::start(addr, config.text.clone(), Arc::new(backend), stats)
        .map(Some)
        .map_err(|source| StartError::Io { what: format!("text listener {addr}"), source })
}

/// The text front end's figures for STATUS.
fn text_status(stats: &TextStats) -> serde_json::Value {
    let s = stats.snapshot();
    serde_json::json!({
        "connections_open": s.connections_open,
        "connections_total": s.connections_total,
        "offers_held": s.offers_held,
        "offers_returned_disconnect": s.offers_returned_disconnect,
        "offers_returned_timeout": s.offers_returned_timeout,
        "offers_rewritten": s.offers_rewritten,
        "idle_closed": s.idle_closed,
        "errors_by_code": s.errors.iter().map(|(k, v)| (k.to_string(), serde_json::json!(v))).collect::<serde_json::Map<_, _>>(),
    })
}

/// [`start`] with extra STATUS figures (the text front end, latency).
///
/// # Errors
/// As [`start`].
pub fn start_with(config: RouterConfig, extra: ExtraStatus) -> Result<RouterHandle, StartError> {
    let config = Arc::new(config);
    let zctx = zmq::Context::new();
    let hwm = config.zmq_hwm;
    let (frontend, fe) = router_socket(&zctx, &config.frontend_addr, hwm, "frontend")?;
    let (backend, be) = router_socket(&zctx, &config.backend_addr, hwm, "backend")?;
    let (admin_sock, ad) = router_socket(&zctx, &config.admin_addr, hwm, "admin")?;
    let egress = zctx.socket(zmq::PULL).map_err(zerr("egress socket"))?;
    egress.set_rcvhwm(0).map_err(zerr("egress RCVHWM"))?;
    egress.bind(EGRESS_ENDPOINT).map_err(zerr("bind egress"))?;

    let (txs, rxs): (Vec<Sender<ShardMsg>>, Vec<Receiver<ShardMsg>>) =
        (0..config.shards).map(|_| crossbeam_channel::unbounded()).unzip();
    let ctx = ShardContext {
        config: config.clone(),
        shards: txs.into(),
        counters: Arc::new(Counters::default()),
        next_key: Arc::new(AtomicU64::new(1)),
        draining: Arc::new(AtomicBool::new(false)),
        started: Instant::now(),
    };
    let text = start_text(&config, &ctx)?;
    let text_addr = text.as_ref().map(|t| t.local_addr());
    let extra: ExtraStatus = match text.as_ref().map(|t| t.stats().clone()) {
        Some(stats) => Arc::new(move || {
            let mut v = extra();
            v.push(("text", text_status(&stats)));
            v
        }),
        None => extra,
    };
    let plan = pin_plan(&config);
    let mut shard_threads = Vec::new();
    for (i, rx) in rxs.into_iter().enumerate() {
        let out = ZmqOutbox::connect(&zctx, EGRESS_ENDPOINT).map_err(zerr("shard egress"))?;
        let shard = Shard::new(i, ctx.clone(), Box::new(out));
        let plan = plan.clone();
        shard_threads.push(spawn(format!("emq-shard-{i}"), move || {
            pin(&plan, i + 1);
            shard.run(rx)
        })?);
    }
    let (admin_tx, admin_rx) = crossbeam_channel::unbounded();
    let admin_out = ZmqOutbox::connect(&zctx, EGRESS_ENDPOINT).map_err(zerr("admin egress"))?;
    let admin_ctx = ctx.clone();
    let latency = Arc::new(Mutex::new(LatencyStore::default()));
    let admin_latency = latency.clone();
    let admin_thread =
        spawn("emq-admin".into(), move || admin::run(admin_rx, admin_out, admin_ctx, extra, admin_latency))?;
    let (reporter_stop, reporter_rx) = crossbeam_channel::bounded::<()>(1);
    let (rep_shards, rep_cfg) = (ctx.shards.clone(), config.latency.clone());
    let reporter = spawn("emq-latency".into(), move || reporter::run(rep_shards, latency, rep_cfg, reporter_rx))?;

    let (stop_tx, stop_rx) = crossbeam_channel::unbounded();
    let io = IoThread {
        frontend,
        backend,
        admin: admin_sock,
        egress,
        shards: ctx.shards.clone(),
        admin_tx,
        stop_tx: stop_tx.clone(),
        counters: ctx.counters.clone(),
        default_queues: config.default_queues.iter().map(|(w, q)| (*w, QueueName::named(q))).collect(),
    };
    let io_plan = plan.clone();
    let io_thread = spawn("emq-io-0".into(), move || {
        pin(&io_plan, 0);
        io.run()
    })?;
    let exit_out = ZmqOutbox::connect(&zctx, EGRESS_ENDPOINT).map_err(zerr("control egress"))?;
    let control_ctx = ctx.clone();
    let threads = Threads {
        shards: shard_threads,
        io: io_thread,
        admin: admin_thread,
        reporter,
        reporter_stop,
        text,
        exit_out,
        zctx,
    };
    let control = spawn("emq-control".into(), move || control(stop_rx, control_ctx, threads))?;
    tracing::info!(frontend = %fe, backend = %be, admin = %ad, shards = config.shards, "emq-router started");
    Ok(RouterHandle {
        stop_tx,
        control: Some(control),
        ctx,
        endpoints: Endpoints { frontend: fe, backend: be, admin: ad, text: text_addr },
    })
}

struct Threads {
    shards: Vec<JoinHandle<()>>,
    io: JoinHandle<()>,
    admin: JoinHandle<()>,
    reporter: JoinHandle<()>,
    reporter_stop: Sender<()>,
    text: Option<TextServer>,
    exit_out: ZmqOutbox,
    zctx: zmq::Context,
}

/// Waits for a stop request, drains, then stops every thread in order.
fn control(stop_rx: Receiver<StopReason>, ctx: ShardContext, threads: Threads) {
    let reason = stop_rx.recv().unwrap_or(StopReason::Requested);
    tracing::info!(?reason, "draining: new work is refused");
    ctx.draining.store(true, Ordering::Release);
    drain(&ctx);
    if let Some(text) = threads.text {
        text.shutdown();
    }
    drop(threads.reporter_stop);
    let _ = threads.reporter.join();
    for tx in ctx.shards.iter() {
        let _ = tx.send(ShardMsg::Shutdown);
    }
    for t in threads.shards {
        let _ = t.join();
    }
    threads.exit_out.send_exit();
    let _ = threads.io.join();
    drop(ctx);
    let _ = threads.admin.join();
    drop(threads.exit_out);
    drop(threads.zctx);
    tracing::info!("emq-router stopped");
}

/// Waits until nothing is queued, offered or in flight, or the drain timeout.
fn drain(ctx: &ShardContext) {
    let deadline = Instant::now() + ctx.config.drain_timeout;
    let mut zeros = 0;
    loop {
        let pending: usize = collect_snapshots(&ctx.shards).iter().map(|s| s.pending()).sum();
        // Two empty readings in a row: a job moving between shards (a
        // message in a channel) is in no snapshot for a moment.
        zeros = if pending == 0 { zeros + 1 } else { 0 };
        if zeros == 2 {
            tracing::info!("drained: nothing queued or in flight");
            return;
        }
        if Instant::now() >= deadline {
            tracing::warn!(pending, "drain timeout: these jobs remain (listed below)");
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
