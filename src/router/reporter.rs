//! The latency reporter thread: every interval it collects the shards'
//! histograms, logs one line per queue and, if configured, writes `.hgrm`
//! files. The admin `LATENCY` command uses [`collect`] too.

use std::sync::Arc;

use crossbeam_channel::{Receiver, RecvTimeoutError};
use parking_lot::Mutex;

use super::Broker;
use crate::broker::admin::{AdminAnswer, AdminOp};
use crate::broker::snapshot::round_ms;
use crate::config::LatencyConfig;
use crate::metrics::latency::{write_interval_files, Kind, LatencyStore};

/// Asks every shard for its histograms and merges them into `store`.
/// Shards that do not answer within [`crate::limits::SHARD_ANSWER_TIMEOUT`] are
/// skipped (and logged).
pub fn collect(broker: &Broker, store: &Mutex<LatencyStore>) {
    let taken = broker.ask_all(&AdminOp::LatencyTake).keep(|a| match a {
        AdminAnswer::Latency(t) => Some(*t),
        _ => None,
    });
    let mut store = store.lock();
    for t in taken.answers {
        store.merge(t);
    }
}

/// Runs until `stop` is closed or sends.
pub fn run(broker: Broker, store: Arc<Mutex<LatencyStore>>, cfg: LatencyConfig, stop: Receiver<()>) {
    let Some(every) = cfg.report_interval else {
        let _ = stop.recv();
        return;
    };
    loop {
        match stop.recv_timeout(every) {
            Err(RecvTimeoutError::Timeout) => {}
            _ => return,
        }
        collect(&broker, &store);
        let interval = store.lock().take_interval();
        for ((queue, kind), h) in &interval {
            if *kind == Kind::EndToEnd {
                let ms = |q: f64| round_ms(h.value_at_quantile(q) as f64 / 1000.0);
                tracing::info!(%queue, jobs = h.len(), p50_ms = ms(0.5), p99_ms = ms(0.99), max_ms = ms(1.0), "latency (end to end, last interval)");
            }
            if *kind == Kind::WalSync {
                let us = |q: f64| h.value_at_quantile(q);
                tracing::info!(shard = %queue, syncs = h.len(), p50_us = us(0.5), p99_us = us(0.99), max_us = us(1.0), "log sync time (last interval)");
            }
        }
        if let Some(dir) = &cfg.hgrm_dir {
            if let Err(e) = write_interval_files(dir, &interval) {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot write .hgrm files");
            }
        }
    }
}
