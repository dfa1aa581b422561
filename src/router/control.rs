//! The control thread: waits for a stop request, drains, then stops every
//! thread in order (text front end, HTTP server, reporter, shards, I/O thread, admin).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use super::{Broker, Shards};
use crate::joblog::{FaultKind, LogState, LogStatus};
use crate::text::TextServer;
use crate::zmq_io::egress::EgressTx;
use crate::zmq_io::io_thread::StopReason;

/// Every thread the control thread stops, in the order it stops them.
pub(super) struct Threads {
    pub text: Option<TextServer>,
    pub http: Option<super::http::HttpServer>,
    pub reporter: JoinHandle<()>,
    pub reporter_stop: Sender<()>,
    pub shards: Shards,
    pub io: JoinHandle<()>,
    pub exit: EgressTx,
    pub admin: JoinHandle<()>,
    pub zctx: zmq::Context,
    /// The logs' store (the locked data directory, or the NATS thread and
    /// the router name's lease), released once every shard has stopped.
    pub log_store: super::LogStore,
    /// The ZAP handler and the CURVE handshake monitor, stopped once the
    /// I/O thread has closed the server sockets.
    pub curve: Option<super::curve::CurveRuntime>,
    /// The replicated logs, looked at every [`FENCE_CHECK`] while the
    /// router runs: once one is fenced (another router took the name) the
    /// frontend and backend are unbound (empty: not replicated).
    pub fence_watch: Vec<Arc<dyn LogStatus>>,
}

/// How often the control thread looks for a fence.
const FENCE_CHECK: Duration = Duration::from_millis(200);

/// Whether one of `logs` is fenced or lost its name.
fn fenced(logs: &[Arc<dyn LogStatus>]) -> bool {
    logs.iter().any(|l| matches!(l.figures().state, LogState::Faulty(FaultKind::Fenced | FaultKind::Taken)))
}

/// Waits for a stop request, drains, then stops every thread in order.
/// Meanwhile, once a replicated log is fenced, has the I/O thread unbind
/// the frontend and backend: clients and workers that list several routers
/// of the name then talk to the new owner only (a fenced router bound
/// there kept a worker's DEALER alternating between the two, registering
/// again and again, issue 30).
pub(super) fn run(stop_rx: Receiver<StopReason>, broker: Broker, threads: Threads) {
    let mut unbound = threads.fence_watch.is_empty();
    let reason = loop {
        if unbound {
            break stop_rx.recv().unwrap_or(StopReason::Requested);
        }
        match stop_rx.recv_timeout(FENCE_CHECK) {
            Ok(reason) => break reason,
            Err(RecvTimeoutError::Disconnected) => break StopReason::Requested,
            Err(RecvTimeoutError::Timeout) if fenced(&threads.fence_watch) => {
                threads.exit.send_unbind_peers();
                unbound = true;
            }
            Err(RecvTimeoutError::Timeout) => {}
        }
    };
    tracing::info!(?reason, "draining: new work is refused");
    broker.ctx.draining.store(true, Ordering::Release);
    drain(&broker);
    if let Some(text) = threads.text {
        text.shutdown();
    }
    if let Some(http) = threads.http {
        http.shutdown();
    }
    drop(threads.reporter_stop);
    let _ = threads.reporter.join();
    threads.shards.stop();
    threads.exit.send_exit();
    let _ = threads.io.join();
    if let Some(curve) = threads.curve {
        curve.stop();
    }
    drop(broker);
    let _ = threads.admin.join();
    drop(threads.exit);
    drop(threads.zctx);
    if let super::LogStore::Nats(store) = threads.log_store {
        store.close();
    } else {
        drop(threads.log_store);
    }
    tracing::info!("emq-router stopped");
}

/// Waits until nothing is queued, offered or in flight, or the drain timeout.
/// A shard too busy to answer within [`crate::limits::SHARD_ANSWER_TIMEOUT`]
/// counts as not drained (it may hold anything).
///
/// Warns only when something remains: at the timeout, an empty reading
/// gets its confirming second one (one [`crate::limits::DRAIN_POLL_INTERVAL`]
/// later) first, so an empty router stopped with `drain_timeout = "0s"`
/// logs "drained", not a timeout with `pending=0`.
fn drain(broker: &Broker) {
    let deadline = Instant::now() + broker.ctx.config.drain_timeout;
    let mut zeros = 0;
    loop {
        let asked = broker.snapshots_asked();
        let pending: usize = asked.answers.iter().map(|s| s.pending()).sum();
        // Two empty readings in a row from every shard: a job moving
        // between shards (a message in a channel) is in no snapshot for a
        // moment.
        zeros = if pending == 0 && asked.missing == 0 { zeros + 1 } else { 0 };
        if zeros == 2 {
            tracing::info!("drained: nothing queued or in flight");
            return;
        }
        if Instant::now() >= deadline && zeros == 0 {
            tracing::warn!(
                pending,
                shards_not_answering = asked.missing,
                "drain timeout: jobs remain (each shard logs them: kept in the write-ahead log, or listed with durability \"memory\")"
            );
            return;
        }
        std::thread::sleep(crate::limits::DRAIN_POLL_INTERVAL);
    }
}
