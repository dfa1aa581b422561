//! The baseline: a zero-logic eMQP forwarder (ROUTER in, ROUTER out). It
//! ACKs INFORM, keeps a FIFO of READY credits, and forwards each client
//! REQUEST unchanged to the worker owning the oldest credit. No queues, no
//! acceptance REPLY, no heartbeats, no headers touched: the cost of ZeroMQ
//! itself on this machine, measured with the same load as the target.
//! Like the classic ZeroMQ load-balancing broker, it reads the frontend only
//! while it holds a credit, so waiting jobs stay in ZeroMQ's pipes.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::emqp::Target;
use super::BenchError;
use crate::protocol::emqp::{new_msgid, VERSION};
use crate::zmq_error::ZmqError;

/// A running forwarder; dropping it stops the thread.
pub struct Forwarder {
    /// Where to point clients and workers.
    pub target: Target,
    /// REQUESTs forwarded so far.
    pub forwarded: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

fn bound(ctx: &zmq::Context, what: &str, addr: &str) -> Result<(zmq::Socket, String), BenchError> {
    let s = ctx.socket(zmq::ROUTER).map_err(ZmqError::at(format!("{what} socket")))?;
    s.set_linger(crate::limits::BENCH_LINGER_MS).map_err(ZmqError::at("LINGER"))?;
    s.set_sndhwm(crate::limits::ZMQ_HWM).map_err(ZmqError::at("SNDHWM"))?;
    s.set_rcvhwm(crate::limits::ZMQ_HWM).map_err(ZmqError::at("RCVHWM"))?;
    s.bind(addr).map_err(ZmqError::at(format!("bind {what} {addr}")))?;
    let ep =
        s.get_last_endpoint().ok().and_then(Result::ok).ok_or_else(|| BenchError::Invalid("no endpoint".into()))?;
    Ok((s, ep))
}

impl Forwarder {
    /// Binds both sockets on fresh loopback ports and starts the thread.
    ///
    /// # Errors
    /// [`BenchError::Zmq`] when a socket cannot be made or bound.
    pub fn start() -> Result<Forwarder, BenchError> {
        Forwarder::start_on("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
    }

    /// Binds the frontend and backend to the given ZeroMQ endpoints (`*` as
    /// the port picks a free one) and starts the thread.
    ///
    /// # Errors
    /// [`BenchError::Zmq`] when a socket cannot be made or bound.
    pub fn start_on(frontend_addr: &str, backend_addr: &str) -> Result<Forwarder, BenchError> {
        let ctx = zmq::Context::new();
        let (frontend, fe) = bound(&ctx, "frontend", frontend_addr)?;
        let (backend, be) = bound(&ctx, "backend", backend_addr)?;
        let stop = Arc::new(AtomicBool::new(false));
        let forwarded = Arc::new(AtomicU64::new(0));
        let (s, f) = (stop.clone(), forwarded.clone());
        let thread = std::thread::Builder::new()
            .name("bench-baseline".into())
            .spawn(move || {
                let _ctx = ctx;
                if let Err(e) = forward(&frontend, &backend, &s, &f) {
                    tracing::warn!("baseline forwarder stopped: {e}");
                }
            })
            .map_err(|e| BenchError::Io { what: "spawn forwarder".into(), source: e })?;
        Ok(Forwarder { target: Target { frontend: fe, backend: be }, forwarded, stop, thread: Some(thread) })
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn forward(fe: &zmq::Socket, be: &zmq::Socket, stop: &AtomicBool, n: &AtomicU64) -> Result<(), zmq::Error> {
    let mut credits: VecDeque<Vec<u8>> = VecDeque::new();
    while !stop.load(Ordering::Acquire) {
        let mut items = [be.as_poll_item(zmq::POLLIN), fe.as_poll_item(zmq::POLLIN)];
        let polled = if credits.is_empty() { &mut items[..1] } else { &mut items[..] };
        if zmq::poll(polled, 100)? == 0 {
            continue;
        }
        while let Ok(f) = be.recv_multipart(zmq::DONTWAIT) {
            match f.get(3).map(Vec::as_slice) {
                Some(b"READY") => credits.push_back(f[0].clone()),
                Some(b"INFORM") if f.len() > 4 => {
                    be.send_multipart([&f[0][..], b"", VERSION, b"ACK", &new_msgid(), &f[4]].iter(), 0)?
                }
                _ => {}
            }
        }
        while !credits.is_empty() {
            let Ok(mut f) = fe.recv_multipart(zmq::DONTWAIT) else { break };
            if f.get(3).map(Vec::as_slice) != Some(b"REQUEST") {
                continue;
            }
            if let Some(w) = credits.pop_front() {
                f[0] = w;
                be.send_multipart(f.iter(), 0)?;
                n.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    Ok(())
}
