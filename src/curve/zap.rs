//! The ZAP handler (ZeroMQ RFC 27): decides which CURVE clients a
//! process's CURVE-server endpoints accept.
//!
//! One per `zmq::Context` that owns CURVE-server sockets: a thread with a
//! ROUTER socket bound to `inproc://zeromq.zap.01` in that context. It must
//! be bound **before** any CURVE bind, and closed after the server sockets
//! at shutdown. Each CURVE endpoint is bound with a ZAP domain
//! ([`super::bind_curve`]) naming its allow-list, and with
//! `ZMQ_ZAP_ENFORCE_DOMAIN`: if this handler is not running (never started,
//! or its thread died), libzmq refuses every CURVE peer instead of
//! accepting any client that knows the server key (libzmq 4.3.4's default,
//! `curve_server.cpp`).
//!
//! Answers (RFC 27): `200 OK` with user id = the key file's stem;
//! `400 unknown key` (the domain's allow-list lacks the key), `400 unknown
//! domain`, `400 mechanism not allowed` (anything but CURVE); `500 bad
//! request` to a request it cannot read but can answer (a malformed one
//! without a request id is dropped). It counts requests by domain and
//! status ([`ZapState::counts`]) and logs refusals with the peer's address,
//! at most one line a second per domain, saying how many were suppressed.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

use super::Key;
use crate::zmq_error::ZmqError;

/// The endpoint libzmq sends ZAP requests to (RFC 27).
pub const ZAP_ENDPOINT: &str = "inproc://zeromq.zap.01";

/// How often the handler thread looks at its stop flag.
const STOP_POLL: Duration = Duration::from_millis(100);

/// Most frames of a ZAP request read (the routing id, the delimiter, six
/// fields and CURVE's one credential make 9); a longer one is answered 500.
const MAX_REQUEST_FRAMES: usize = 16;

/// The label counted for a domain the handler does not serve.
pub const OTHER_DOMAIN: &str = "_other";

/// An allow-list: public key → user id.
pub type AllowList = HashMap<Key, String>;

/// Per-domain log limiter: last line written and lines suppressed since.
#[derive(Default)]
struct Limiter {
    last: Option<Instant>,
    suppressed: u64,
}

/// What the handler thread and the rest of the program share: the
/// allow-lists (replaced whole by [`ZapState::set_domain`], so a reload
/// takes effect at the next handshake without a restart) and the counts.
#[derive(Default)]
pub struct ZapState {
    domains: RwLock<HashMap<String, Arc<AllowList>>>,
    /// Requests by (domain, status); the domains counted are the served
    /// ones and [`OTHER_DOMAIN`], so the map stays small.
    counts: Mutex<BTreeMap<(String, u16), u64>>,
    limiters: Mutex<HashMap<String, Limiter>>,
    alive: AtomicBool,
}

impl ZapState {
    /// Replaces `domain`'s allow-list (adds the domain if new).
    pub fn set_domain(&self, domain: &str, keys: AllowList) {
        self.domains.write().insert(domain.to_string(), Arc::new(keys));
    }

    /// Keys in `domain`'s allow-list (`None`: not served).
    pub fn key_count(&self, domain: &str) -> Option<usize> {
        self.domains.read().get(domain).map(|k| k.len())
    }

    /// Requests answered, as `(domain, status, count)`, sorted.
    pub fn counts(&self) -> Vec<(String, u16, u64)> {
        self.counts.lock().iter().map(|((d, s), n)| (d.clone(), *s, *n)).collect()
    }

    /// Whether the handler thread is running.
    pub fn alive(&self) -> bool {
        self.alive.load(Ordering::Relaxed)
    }

    /// The answer to one request's fields: `(status, text, user id)`.
    fn decide(&self, domain: &str, mechanism: &[u8], credentials: &[Vec<u8>]) -> (u16, &'static str, String) {
        let domains = self.domains.read();
        let Some(keys) = domains.get(domain) else { return (400, "unknown domain", String::new()) };
        if mechanism != b"CURVE" {
            return (400, "mechanism not allowed", String::new());
        }
        let key: Option<&Key> = credentials.first().and_then(|c| c.as_slice().try_into().ok());
        match key.and_then(|k| keys.get(k)) {
            Some(user) => (200, "OK", user.clone()),
            None => (400, "unknown key", String::new()),
        }
    }

    fn count(&self, domain: &str, status: u16) {
        let label = if self.domains.read().contains_key(domain) { domain } else { OTHER_DOMAIN };
        *self.counts.lock().entry((label.to_string(), status)).or_default() += 1;
    }

    /// Logs a refusal, at most once a second per domain.
    fn log_refusal(&self, domain: &str, address: &str, status: u16, why: &str) {
        let label = if self.domains.read().contains_key(domain) { domain } else { OTHER_DOMAIN };
        let mut limiters = self.limiters.lock();
        let l = limiters.entry(label.to_string()).or_default();
        let now = Instant::now();
        if l.last.is_some_and(|t| now.duration_since(t) < Duration::from_secs(1)) {
            l.suppressed += 1;
            return;
        }
        let suppressed = std::mem::take(&mut l.suppressed);
        l.last = Some(now);
        tracing::warn!(domain = label, peer = %address, status, why, suppressed, "CURVE peer refused by ZAP");
    }
}

/// A running ZAP handler; [`ZapHandler::stop`] closes it.
pub struct ZapHandler {
    state: Arc<ZapState>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ZapHandler {
    /// Binds [`ZAP_ENDPOINT`] in `ctx` (before this returns, so CURVE
    /// binds after it are covered) and starts the thread serving
    /// `domains`, each with its allow-list.
    ///
    /// # Errors
    /// [`ZmqError`] when the socket cannot be made or bound (e.g. another
    /// handler already runs in the context: `EADDRINUSE`), or the thread
    /// cannot be spawned (reported as `EMFILE`).
    pub fn start(ctx: &zmq::Context, domains: Vec<(String, AllowList)>) -> Result<ZapHandler, ZmqError> {
        let socket = ctx.socket(zmq::ROUTER).map_err(ZmqError::at("ZAP handler socket"))?;
        socket.set_linger(0).map_err(ZmqError::at("ZAP handler LINGER"))?;
        socket.bind(ZAP_ENDPOINT).map_err(ZmqError::at(format!("bind ZAP handler {ZAP_ENDPOINT}")))?;
        let state = Arc::new(ZapState::default());
        for (d, keys) in domains {
            state.set_domain(&d, keys);
        }
        state.alive.store(true, Ordering::Relaxed);
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sp) = (state.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("emq-zap".into())
            .spawn(move || {
                serve(&socket, &st, &sp);
                st.alive.store(false, Ordering::Relaxed);
            })
            .map_err(|_| ZmqError::new("spawn the ZAP handler thread", zmq::Error::EMFILE))?;
        Ok(ZapHandler { state, stop, thread: Some(thread) })
    }

    /// The shared allow-lists and counts.
    pub fn state(&self) -> Arc<ZapState> {
        self.state.clone()
    }

    /// Stops the thread and closes its socket (call it after the CURVE
    /// server sockets are closed).
    pub fn stop(mut self) {
        self.stop_thread();
    }

    fn stop_thread(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::error!("the ZAP handler thread panicked; CURVE peers were refused since");
            }
        }
    }
}

impl Drop for ZapHandler {
    fn drop(&mut self) {
        self.stop_thread();
    }
}

/// The handler loop: until `stop`, answers every request.
fn serve(socket: &zmq::Socket, state: &ZapState, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        let mut items = [socket.as_poll_item(zmq::POLLIN)];
        match zmq::poll(&mut items, STOP_POLL.as_millis() as i64) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(zmq::Error::ETERM) => return,
            Err(e) => {
                tracing::error!(error = %e, "ZAP handler poll failed");
                std::thread::sleep(STOP_POLL);
                continue;
            }
        }
        while let Some(frames) = recv_bounded(socket) {
            if let Some(reply) = answer(state, &frames) {
                if let Err(e) = socket.send_multipart(reply, zmq::DONTWAIT) {
                    tracing::warn!(error = %e, "ZAP reply not sent");
                }
            }
        }
    }
}

/// One request's frames, at most [`MAX_REQUEST_FRAMES`] kept (the rest
/// read and dropped, the request marked over-long by an empty extra
/// frame); `None` when nothing is waiting.
fn recv_bounded(socket: &zmq::Socket) -> Option<Vec<Vec<u8>>> {
    let mut frames = Vec::new();
    loop {
        let part = match socket.recv_bytes(if frames.is_empty() { zmq::DONTWAIT } else { 0 }) {
            Ok(p) => p,
            Err(_) => return (!frames.is_empty()).then_some(frames),
        };
        if frames.len() <= MAX_REQUEST_FRAMES {
            frames.push(part);
        }
        if !socket.get_rcvmore().unwrap_or(false) {
            return Some(frames);
        }
    }
}

/// The reply to one request as the ROUTER received it (routing id,
/// empty delimiter, then RFC 27's frames); `None`: dropped (it cannot be
/// answered: no routing id, no delimiter or no request id).
fn answer(state: &ZapState, frames: &[Vec<u8>]) -> Option<Vec<Vec<u8>>> {
    let (id, rest) = frames.split_first()?;
    let (delim, req) = rest.split_first()?;
    if !delim.is_empty() {
        return None;
    }
    let request_id = req.get(1)?.clone();
    let text = |i: usize| req.get(i).map(|f| String::from_utf8_lossy(f).into_owned()).unwrap_or_default();
    let (domain, address) = (text(2), text(3));
    let (status, why, user) = if req.len() < 6 || req.len() > MAX_REQUEST_FRAMES - 2 || req[0] != b"1.0" {
        (500, "bad request", String::new())
    } else {
        state.decide(&domain, &req[5], &req[6..])
    };
    state.count(&domain, status);
    if status != 200 {
        state.log_refusal(&domain, &address, status, why);
    }
    Some(vec![
        id.clone(),
        Vec::new(),
        b"1.0".to_vec(),
        request_id,
        status.to_string().into_bytes(),
        why.as_bytes().to_vec(),
        user.into_bytes(),
        Vec::new(),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(domain: &str, mechanism: &str, cred: &[u8]) -> Vec<Vec<u8>> {
        [&b"peer"[..], b"", b"1.0", b"7", domain.as_bytes(), b"127.0.0.1", b"", mechanism.as_bytes(), cred]
            .iter()
            .map(|f| f.to_vec())
            .collect()
    }

    #[test]
    fn answers_by_domain_key_and_mechanism() {
        let state = ZapState::default();
        state.set_domain("backend", HashMap::from([([1u8; 32], "w1".to_string())]));
        let status = |r: Option<Vec<Vec<u8>>>| {
            let r = r.expect("answered");
            (String::from_utf8(r[4].clone()).unwrap(), String::from_utf8(r[5].clone()).unwrap(), r[6].clone())
        };
        assert_eq!(
            status(answer(&state, &request("backend", "CURVE", &[1; 32]))),
            ("200".into(), "OK".into(), b"w1".to_vec())
        );
        assert_eq!(status(answer(&state, &request("backend", "CURVE", &[2; 32]))).1, "unknown key");
        assert_eq!(status(answer(&state, &request("backend", "CURVE", b"short"))).1, "unknown key");
        assert_eq!(status(answer(&state, &request("admin", "CURVE", &[1; 32]))).1, "unknown domain");
        assert_eq!(status(answer(&state, &request("backend", "PLAIN", b"x"))).1, "mechanism not allowed");
        // Hostile shapes: never a panic; answered 500 when it can be.
        assert!(answer(&state, &[]).is_none());
        assert!(answer(&state, &[b"id".to_vec()]).is_none());
        assert!(answer(&state, &[b"id".to_vec(), b"x".to_vec(), b"1.0".to_vec(), b"1".to_vec()]).is_none());
        assert_eq!(status(answer(&state, &[b"id".to_vec(), vec![], b"1.0".to_vec(), b"1".to_vec()])).0, "500");
        let mut bad_version = request("backend", "CURVE", &[1; 32]);
        bad_version[2] = b"2.0".to_vec();
        assert_eq!(status(answer(&state, &bad_version)).0, "500");
        let counts = state.counts();
        assert!(counts.contains(&("backend".into(), 200, 1)), "{counts:?}");
        assert!(counts.contains(&("backend".into(), 400, 3)), "{counts:?}");
        assert!(counts.contains(&(OTHER_DOMAIN.into(), 400, 1)), "{counts:?}");
    }
}
