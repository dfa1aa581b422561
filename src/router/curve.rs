//! The router's CURVE endpoints (settings `frontend_curve`,
//! `backend_curve`, `admin_curve`; docs/security.md "CURVE"): start-up
//! (ZAP handler first, then a second, CURVE bind on each ROUTER socket),
//! the handshake monitor, `RELOAD_KEYS`, and the figures for STATUS,
//! `/metrics` and the status page.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::StartError;
use crate::config::CurveServerConfig;
use crate::curve::handshakes::{HandshakeMonitor, SocketHandshakes};
use crate::curve::zap::{ZapHandler, ZapState};
use crate::curve::{self, Key};
use crate::protocol::emqp::Socket;
use crate::zmq_io::curve_binds::CurveBind;
use crate::zmq_io::egress::{Egress, EgressTx};

/// Test hook (tests only; never set it in production): with
/// `EMQ_TEST_NO_ZAP=1` the router starts its CURVE endpoints without a ZAP
/// handler, so that tests can see every CURVE peer refused
/// (`ZMQ_ZAP_ENFORCE_DOMAIN`: fail closed). It logs a warning.
pub const TEST_NO_ZAP_ENV: &str = "EMQ_TEST_NO_ZAP";

/// How long `RELOAD_KEYS DISCONNECT` waits for the I/O thread to rebind.
const REBIND_WAIT: Duration = Duration::from_secs(5);

/// What the admin thread, STATUS and `/metrics` share about CURVE.
pub struct CurveShared {
    /// The ZAP handler's allow-lists and counts (`None`: started without
    /// one, [`TEST_NO_ZAP_ENV`]).
    pub zap: Option<Arc<ZapState>>,
    /// Each served domain's allow-list directory.
    pub dirs: Vec<(&'static str, PathBuf)>,
    /// Handshake counts per socket with a CURVE endpoint.
    pub handshakes: Vec<Arc<SocketHandshakes>>,
    /// `RELOAD_KEYS` commands that succeeded.
    pub reloads: AtomicU64,
}

/// The CURVE counters at one moment, for `/metrics` and the status page
/// ([`super::scrape::Scrape::curve`]).
#[derive(Debug, Clone, Default)]
pub struct CurveFigures {
    /// Per socket with a CURVE endpoint (`frontend`, `backend`, `admin`):
    /// its handshakes by outcome (`ok`, `unknown_key`,
    /// `bad_server_key_or_protocol`, `mechanism_mismatch`, `no_detail`).
    pub handshakes: Vec<(&'static str, Vec<(&'static str, u64)>)>,
    /// ZAP requests answered, as `(domain, status, count)`.
    pub zap: Vec<(String, u16, u64)>,
    /// `RELOAD_KEYS` commands that succeeded.
    pub reloads: u64,
}

impl CurveShared {
    /// The counters now.
    pub fn figures(&self) -> CurveFigures {
        CurveFigures {
            handshakes: self.handshakes.iter().map(|h| (h.socket, h.to_pairs())).collect(),
            zap: self.zap.as_ref().map(|z| z.counts()).unwrap_or_default(),
            reloads: self.reloads.load(Ordering::Relaxed),
        }
    }
}

/// Started CURVE machinery, stopped by [`CurveRuntime::stop`] after the
/// I/O thread (which owns the server sockets) has closed them.
pub struct CurveRuntime {
    zap: Option<ZapHandler>,
    monitor: Option<HandshakeMonitor>,
    /// The shared figures.
    pub shared: Arc<CurveShared>,
    /// The endpoints, for the I/O thread.
    pub binds: Vec<CurveBind>,
}

impl CurveRuntime {
    /// Stops the monitor thread, then the ZAP handler.
    pub fn stop(self) {
        if let Some(m) = self.monitor {
            m.stop();
        }
        if let Some(z) = self.zap {
            z.stop();
        }
    }
}

/// The socket, address, domain and allow-list setting of each configured
/// CURVE endpoint.
fn endpoints(c: &CurveServerConfig) -> Vec<(Socket, &str, &'static str, Option<&PathBuf>)> {
    [
        (Socket::Frontend, c.frontend.as_deref(), "frontend", c.clients_dir.as_ref()),
        (Socket::Backend, c.backend.as_deref(), "backend", c.workers_dir.as_ref()),
        (Socket::Admin, c.admin.as_deref(), "admin", c.admins_dir.as_ref()),
    ]
    .into_iter()
    .filter_map(|(s, a, d, dir)| a.map(|a| (s, a, d, dir)))
    .collect()
}

/// Reads the keys and starts the ZAP handler in `ctx` (before any CURVE
/// bind); `None` when no CURVE endpoint is configured.
///
/// # Errors
/// [`StartError::Setting`] for a key file or directory that cannot be
/// used (one line naming the file), [`StartError::Zmq`].
pub fn prepare(c: &CurveServerConfig, ctx: &zmq::Context) -> Result<Option<(CurveRuntime, Key)>, StartError> {
    let eps = endpoints(c);
    if eps.is_empty() {
        return Ok(None);
    }
    crate::config::check_curve_settings(c).map_err(|(name, why)| StartError::Setting { name, why })?;
    let key_file = c.secret_key_file.clone().unwrap_or_default();
    let pair = curve::read_secret_key_file(&key_file)
        .map_err(|e| StartError::Setting { name: "curve_secret_key_file", why: e.to_string() })?;
    let mut dirs = Vec::new();
    let mut lists = Vec::new();
    for (_, _, domain, dir) in &eps {
        let dir = dir.cloned().unwrap_or_default();
        let keys = curve::read_allow_list(&dir)
            .map_err(|e| StartError::Setting { name: dir_setting(domain), why: e.to_string() })?;
        tracing::info!(domain, dir = %dir.display(), keys = keys.len(), "CURVE allow-list read");
        lists.push((domain.to_string(), keys));
        dirs.push((*domain, dir));
    }
    let zap = if std::env::var(TEST_NO_ZAP_ENV).is_ok_and(|v| v == "1") {
        tracing::warn!("{TEST_NO_ZAP_ENV}=1: no ZAP handler (a test hook): every CURVE peer is refused");
        None
    } else {
        Some(ZapHandler::start(ctx, lists)?)
    };
    let shared = Arc::new(CurveShared {
        zap: zap.as_ref().map(ZapHandler::state),
        dirs,
        handshakes: Vec::new(),
        reloads: AtomicU64::new(0),
    });
    Ok(Some((CurveRuntime { zap, monitor: None, shared, binds: Vec::new() }, pair.secret)))
}

/// The allow-list setting of a domain.
fn dir_setting(domain: &str) -> &'static str {
    match domain {
        "frontend" => "curve_clients_dir",
        "backend" => "curve_workers_dir",
        _ => "curve_admins_dir",
    }
}

/// Binds each configured CURVE endpoint on its socket (after the plain
/// binds) and starts the handshake monitor on those sockets.
///
/// # Errors
/// [`StartError::Zmq`] naming the address or option.
pub fn bind_all(
    rt: &mut CurveRuntime,
    secret: &Key,
    c: &CurveServerConfig,
    ctx: &zmq::Context,
    sockets: [&mut zmq::Socket; 3],
) -> Result<Vec<(&'static str, String)>, StartError> {
    let [frontend, backend, admin] = sockets;
    let mut handshakes = Vec::new();
    let mut bound = Vec::new();
    for (which, addr, domain, _) in endpoints(c) {
        let socket: &mut zmq::Socket = match which {
            Socket::Frontend => frontend,
            Socket::Backend => backend,
            _ => admin,
        };
        let endpoint = curve::bind_curve(socket, addr, secret, domain)?;
        handshakes.push((which, Arc::new(SocketHandshakes::new(domain, endpoint.clone()))));
        rt.binds.push(CurveBind { socket: which, endpoint: endpoint.clone(), secret: *secret, domain });
        bound.push((domain, endpoint));
    }
    let watched: Vec<(&zmq::Socket, Arc<SocketHandshakes>)> = handshakes
        .iter()
        .map(|(which, h)| {
            let s: &zmq::Socket = match which {
                Socket::Frontend => frontend,
                Socket::Backend => backend,
                _ => admin,
            };
            (s, h.clone())
        })
        .collect();
    rt.monitor = Some(HandshakeMonitor::start(ctx, watched)?);
    let shared = Arc::get_mut(&mut rt.shared).ok_or_else(|| StartError::Setting {
        name: "curve",
        why: "internal: CURVE figures shared before the endpoints were bound".into(),
    })?;
    shared.handshakes = handshakes.into_iter().map(|(_, h)| h).collect();
    Ok(bound)
}

/// `RELOAD_KEYS [DISCONNECT]`: rescans every allow-list directory and
/// replaces the ZAP handler's lists (new handshakes use them; connections
/// already up stay). With `disconnect`, the I/O thread then unbinds and
/// rebinds every CURVE endpoint: libzmq closes the connections accepted
/// on it, so every peer there reconnects and goes through ZAP again
/// (peers whose key was removed are refused).
///
/// A directory that cannot be read leaves every list as it was.
///
/// # Errors
/// A one-line reason (a bad file, no ZAP handler, the rebind failed).
pub fn reload(shared: &CurveShared, egress: &EgressTx, disconnect: bool) -> Result<Value, String> {
    let zap = shared.zap.as_ref().ok_or("no ZAP handler runs (test hook): nothing to reload")?;
    let mut lists = Vec::new();
    for (domain, dir) in &shared.dirs {
        let keys = curve::read_allow_list(dir).map_err(|e| format!("{}: {e}; no list changed", dir_setting(domain)))?;
        lists.push((*domain, keys));
    }
    let mut keys = serde_json::Map::new();
    for (domain, list) in lists {
        keys.insert(domain.into(), json!(list.len()));
        zap.set_domain(domain, list);
    }
    shared.reloads.fetch_add(1, Ordering::Relaxed);
    let mut rebound = 0;
    if disconnect {
        let (tx, rx) = crossbeam_channel::bounded(1);
        egress.send_control(Egress::RebindCurve(tx));
        rebound = match rx.recv_timeout(REBIND_WAIT) {
            Ok(result) => result?,
            Err(_) => return Err("keys reloaded, but the I/O thread did not rebind within 5 s".into()),
        };
    }
    tracing::info!(?keys, disconnect, rebound, "CURVE allow-lists reloaded");
    Ok(json!({"reloaded": true, "keys": keys, "disconnected": disconnect, "endpoints_rebound": rebound}))
}

/// STATUS's `curve` object: per socket its endpoint and handshake counts,
/// ZAP requests by domain and status ([`crate::curve::report::counts_json`]),
/// whether the ZAP handler runs, keys per domain, reloads.
pub fn status_json(shared: &CurveShared) -> Value {
    let mut v = crate::curve::report::counts_json(&shared.handshakes, shared.zap.as_deref());
    let mut keys = serde_json::Map::new();
    if let Some(z) = &shared.zap {
        for (domain, _) in &shared.dirs {
            keys.insert(domain.to_string(), json!(z.key_count(domain).unwrap_or(0)));
        }
    }
    v["zap_running"] = json!(shared.zap.as_ref().is_some_and(|z| z.alive()));
    v["keys"] = Value::Object(keys);
    v["reloads"] = json!(shared.reloads.load(Ordering::Relaxed));
    v
}
