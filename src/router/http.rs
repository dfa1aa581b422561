//! The router's HTTP server (`metrics`, default `127.0.0.1:47296`): `GET
//! /metrics` in the Prometheus text format ([`super::prometheus`]) and
//! `GET /` the status page ([`super::status_page`]). Read-only: every
//! other path is 404, every other method 405.
//!
//! `tiny_http` accepts and parses on its own threads; this server answers
//! the requests one at a time on one thread (`emq-http`), each from a fresh
//! [`Scrape`], off the hot path like the admin thread. Requests are
//! counted in the broker counters (`http_requests`, `http_refused`).

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::thread::JoinHandle;

use tiny_http::{Header, Method, Request, Response, Server};

use super::scrape::Sources;
use super::status_page::Rates;
use super::StartError;
use crate::metrics::counters::Counters;

/// The running HTTP server.
pub struct HttpServer {
    server: Arc<Server>,
    thread: JoinHandle<()>,
    addr: SocketAddr,
}

impl HttpServer {
    /// Binds `addr` and serves from `sources` on thread `emq-http`, showing
    /// at most `max_queues` queues by name.
    ///
    /// # Errors
    /// [`StartError::Io`] when the address cannot be bound or the thread
    /// not spawned.
    pub fn start(addr: SocketAddr, sources: Sources, max_queues: usize) -> Result<HttpServer, StartError> {
        let what = || format!("metrics listener {addr}");
        let listener = TcpListener::bind(addr).map_err(|source| StartError::Io { what: what(), source })?;
        let addr = listener.local_addr().map_err(|source| StartError::Io { what: what(), source })?;
        let server = Server::from_listener(listener, None)
            .map_err(|e| StartError::Io { what: what(), source: std::io::Error::other(e.to_string()) })?;
        let server = Arc::new(server);
        let serving = server.clone();
        let thread = super::spawn("emq-http".into(), move || {
            let mut rates = Rates::default();
            for req in serving.incoming_requests() {
                answer(req, &sources, max_queues, &mut rates);
            }
        })?;
        tracing::info!(%addr, "metrics and status page served");
        Ok(HttpServer { server, thread, addr })
    }

    /// The bound address (port 0 resolved).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving and waits for the thread.
    pub fn shutdown(self) {
        self.server.unblock();
        let _ = self.thread.join();
    }
}

fn header(name: &str, value: &str) -> Option<Header> {
    Header::from_bytes(name.as_bytes(), value.as_bytes()).ok()
}

fn answer(req: Request, sources: &Sources, max_queues: usize, rates: &mut Rates) {
    let counters = &sources.broker.ctx.counters;
    Counters::bump(&counters.http_requests);
    let path = req.url().split('?').next().unwrap_or("").to_string();
    let (status, body, content_type) = match (req.method(), path.as_str()) {
        (Method::Get | Method::Head, "/metrics") => {
            (200, super::prometheus::render(sources.read(max_queues)), super::prometheus::CONTENT_TYPE)
        }
        (Method::Get | Method::Head, "/" | "/index.html") => {
            (200, super::status_page::render(&sources.read(max_queues), rates), "text/html; charset=utf-8")
        }
        (Method::Get | Method::Head, _) => {
            Counters::bump(&counters.http_refused);
            (404, "not found: try /metrics or /\n".to_string(), "text/plain; charset=utf-8")
        }
        _ => {
            Counters::bump(&counters.http_refused);
            (405, "read-only: GET only\n".to_string(), "text/plain; charset=utf-8")
        }
    };
    let mut response = Response::from_string(body).with_status_code(status);
    if let Some(h) = header("Content-Type", content_type) {
        response = response.with_header(h);
    }
    if let Some(h) = header("Cache-Control", "no-store") {
        response = response.with_header(h);
    }
    if let Err(e) = req.respond(response) {
        tracing::debug!(error = %e, %path, "HTTP answer not sent");
    }
}
