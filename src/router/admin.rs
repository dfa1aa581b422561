//! The admin thread: answers every admin command ([`AdminWord`]; EventMQ
//! 0.3.13's JSON shapes plus emq's keys, docs/emqp.md "Admin") by asking
//! the shards it needs and merging their answers: STATUS,
//! ROUTER_SHOW_WORKERS, ROUTER_SHOW_SCHEDULERS and LATENCY from every
//! shard's snapshot, the dead-set commands in `dead_admin.rs`. It runs off
//! the hot path, so a slow query never delays a job.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crossbeam_channel::Receiver;
use parking_lot::Mutex;
use serde_json::{json, Value};

use super::dead_admin::{self, Refusal};
use super::Broker;
use crate::broker::egress::{Dest, OnFail, OutMsg, Outgoing};
use crate::broker::snapshot::{schedulers_json, status_json, workers_json};
use crate::metrics::latency::LatencyStore;
use crate::protocol::emqp::{AdminWord, Command, Message};
use crate::zmq_io::egress::EgressTx;
use crate::zmq_io::io_thread::AdminRequest;

/// Extra STATUS figures from outside the shards (the text front end),
/// each a JSON value under its own key in STATUS's `emq` object.
pub type ExtraStatus = Arc<dyn Fn() -> Vec<(&'static str, Value)> + Send + Sync>;

/// Runs the admin thread until `rx` closes: each command's answer (a
/// REPLY whose frame 4 is JSON) or refusal (`ERROR BAD_REQUEST <why>`,
/// frame 4 the command's msgid) goes back to its peer.
pub fn run(
    rx: Receiver<AdminRequest>,
    egress: EgressTx,
    broker: Broker,
    extra: ExtraStatus,
    latency: Arc<Mutex<LatencyStore>>,
    curve: Option<Arc<super::curve::CurveShared>>,
) {
    for req in rx {
        let answered = match req.word {
            AdminWord::ReloadKeys => reload_keys(curve.as_deref(), &egress, &req.args),
            word => answer(&broker, &extra, &latency, word, &req.args),
        };
        let command = match answered {
            Ok(body) => Command::Reply { body: body.to_string().into_bytes() },
            Err(why) => Command::Error {
                refers_to: req.msgid.0.to_vec(),
                code: b"BAD_REQUEST".to_vec(),
                text: why.into_bytes(),
            },
        };
        let msg = OutMsg::Frames(Message::new(command).encode());
        egress.send(Outgoing { dest: Dest::Admin, peer: req.peer, msg, on_fail: OnFail::Count });
    }
}

/// The answer to admin command `word` with its argument frames `args`
/// (docs/emqp.md "Admin"): one arm per [`AdminWord`], each asking the
/// shards it needs and merging what they say.
///
/// # Errors
/// A [`Refusal`] saying what is wrong with the arguments.
fn answer(
    broker: &Broker,
    extra: &ExtraStatus,
    latency: &Mutex<LatencyStore>,
    word: AdminWord,
    args: &[Vec<u8>],
) -> Result<Value, Refusal> {
    let arg = |i: usize| args.get(i).map_or(&[][..], Vec::as_slice);
    let uptime = || broker.ctx.started.elapsed().as_secs_f64();
    Ok(match word {
        AdminWord::Status => {
            super::reporter::collect(broker, latency);
            let end_to_end = latency.lock().end_to_end_ms();
            let snaps = broker.snapshots();
            let asks_waiting: usize = snaps.iter().map(|s| s.asks_waiting).sum();
            status_json(&snaps, &end_to_end, status_extras(broker, extra, asks_waiting))
        }
        AdminWord::ShowWorkers => workers_json(&broker.snapshots(), uptime()),
        AdminWord::ShowSchedulers => schedulers_json(&broker.snapshots(), uptime()),
        AdminWord::Latency => {
            super::reporter::collect(broker, latency);
            latency.lock().to_json()
        }
        AdminWord::DeadList => dead_admin::list(broker, arg(0))?,
        AdminWord::DeadShow => dead_admin::show(broker, arg(0))?,
        AdminWord::DeadRetry => dead_admin::retry_or_delete(broker, true, arg(0), arg(1))?,
        AdminWord::DeadDelete => dead_admin::retry_or_delete(broker, false, arg(0), arg(1))?,
        AdminWord::ReloadKeys => return Err("RELOAD_KEYS is answered by reload_keys".into()),
    })
}

/// `RELOAD_KEYS [DISCONNECT]` ([`super::curve::reload`]).
fn reload_keys(
    curve: Option<&super::curve::CurveShared>,
    egress: &EgressTx,
    args: &[Vec<u8>],
) -> Result<Value, Refusal> {
    let disconnect = match args.first().map(Vec::as_slice) {
        None | Some(b"") => false,
        Some(b"DISCONNECT") => true,
        Some(other) => {
            let other = crate::printable::printable(&String::from_utf8_lossy(other));
            return Err(format!("RELOAD_KEYS takes DISCONNECT or nothing, not {other:?}"));
        }
    };
    let curve = curve.ok_or("no CURVE endpoint is configured")?;
    super::curve::reload(curve, egress, disconnect)
}

/// STATUS's `emq` object: version, shards, uptime, drain state, counters,
/// long-poll ASKs waiting now (all shards), queues and workers held now,
/// and the extra figures.
fn status_extras(broker: &Broker, extra: &ExtraStatus, asks_waiting: usize) -> Value {
    let ctx = &broker.ctx;
    let mut m = serde_json::Map::new();
    m.insert("version".into(), json!(env!("CARGO_PKG_VERSION")));
    m.insert("shards".into(), json!(ctx.shards));
    m.insert("uptime_secs".into(), json!(ctx.started.elapsed().as_secs()));
    m.insert("draining".into(), json!(ctx.draining.load(Ordering::Acquire)));
    m.insert("counters".into(), ctx.counters.to_json());
    m.insert("asks_waiting".into(), json!(asks_waiting));
    m.insert("queues".into(), json!(ctx.queue_count.load(Ordering::Relaxed)));
    m.insert("workers".into(), json!(ctx.worker_count.load(Ordering::Relaxed)));
    for (k, v) in extra() {
        m.insert(k.into(), v);
    }
    Value::Object(m)
}
