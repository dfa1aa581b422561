//! The egress path: shards and the admin thread hand typed [`Outgoing`]
//! messages to the I/O thread over one crossbeam channel and wake it with a
//! [`Wake`] that is part of its `zmq::poll` (a ZeroMQ socket lives on
//! one thread). Nothing is encoded or decoded in between.

use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};

use crate::broker::egress::Outgoing;
use crate::wake::Wake;

/// What the I/O thread is handed.
#[derive(Debug)]
pub enum Egress {
    /// Messages to send, in order (one channel operation per producer batch).
    Send(Vec<Outgoing>),
    /// Exit once everything handed over before has been sent.
    Exit,
    /// Unbind and rebind the CURVE endpoints (`RELOAD_KEYS DISCONNECT`);
    /// the result (endpoints rebound, or why not) goes back on the sender.
    RebindCurve(Sender<Result<usize, String>>),
    /// Unbind every frontend and backend endpoint (plain and CURVE), which
    /// also drops the connections made through them: a fenced router
    /// (another took its name) must stop attracting clients and workers
    /// that list both routers (docs/replicated.md, "Failover"). Admin stays.
    UnbindPeers,
}

/// The sending side, one clone per producer thread.
#[derive(Debug, Clone)]
pub struct EgressTx {
    tx: Sender<Egress>,
    wake: Arc<Wake>,
}

/// The I/O thread's side.
#[derive(Debug)]
pub struct EgressRx {
    rx: Receiver<Egress>,
    wake: Arc<Wake>,
}

/// A connected pair.
///
/// # Errors
/// The OS error of creating the eventfd.
pub fn channel() -> std::io::Result<(EgressTx, EgressRx)> {
    let wake = Arc::new(Wake::new()?);
    let (tx, rx) = crossbeam_channel::unbounded();
    Ok((EgressTx { tx, wake: wake.clone() }, EgressRx { rx, wake }))
}

impl EgressTx {
    /// Hands a batch over and wakes the I/O thread if it sleeps. Never blocks.
    pub fn send_batch(&self, batch: Vec<Outgoing>) {
        if batch.is_empty() {
            return;
        }
        if self.tx.send(Egress::Send(batch)).is_err() {
            tracing::error!("the I/O thread is gone; outgoing messages dropped");
        }
        self.wake.wake();
    }

    /// Hands a control message over (not a send) and wakes the I/O thread.
    pub fn send_control(&self, e: Egress) {
        if self.tx.send(e).is_err() {
            tracing::error!("the I/O thread is gone; control message dropped");
        }
        self.wake.wake();
    }

    /// Hands one message over (see [`EgressTx::send_batch`]).
    pub fn send(&self, out: Outgoing) {
        self.send_batch(vec![out]);
    }

    /// Asks the I/O thread to exit once it has sent what came before.
    pub fn send_exit(&self) {
        let _ = self.tx.send(Egress::Exit);
        self.wake.wake();
    }

    /// Asks the I/O thread to unbind its frontend and backend
    /// ([`Egress::UnbindPeers`]).
    pub fn send_unbind_peers(&self) {
        let _ = self.tx.send(Egress::UnbindPeers);
        self.wake.wake();
    }
}

impl EgressRx {
    /// The descriptor the I/O thread polls.
    pub fn fd(&self) -> std::os::fd::RawFd {
        self.wake.fd()
    }

    /// The next message, if one is waiting.
    pub fn try_recv(&self) -> Option<Egress> {
        self.rx.try_recv().ok()
    }

    /// Arms the wake-up before blocking. Returns `false` when a message
    /// arrived meanwhile (then do not block: the waker is disarmed again).
    pub fn arm(&self) -> bool {
        self.wake.arm();
        if self.rx.is_empty() {
            return true;
        }
        self.wake.disarm();
        false
    }

    /// After the poll returned: disarms and clears the wake-up.
    pub fn disarm(&self) {
        self.wake.disarm();
    }
}
