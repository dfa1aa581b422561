//! The admin thread: answers STATUS, ROUTER_SHOW_WORKERS,
//! ROUTER_SHOW_SCHEDULERS and LATENCY by asking every shard for a snapshot
//! and merging them (spec §3.10 shapes). It runs off the hot path, so a slow
//! query never delays a job.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};
use serde_json::{json, Value};

use super::egress::ZmqOutbox;
use crate::broker::msg::{Dest, OnFail, Outbox, Outgoing, ShardMsg};
use crate::broker::shard::ShardContext;
use crate::broker::snapshot::{schedulers_json, status_json, workers_json, ShardSnapshot};
use crate::broker::types::PeerId;
use crate::limits;
use crate::metrics::latency::LatencyStore;
use crate::metrics::reporter;
use crate::protocol::emqp::{AdminQuery, Command, Frame, Message};
use parking_lot::Mutex;

/// A query from the admin socket.
#[derive(Debug)]
pub struct AdminRequest {
    /// The emq-cli peer.
    pub peer: PeerId,
    /// Its msgid.
    pub msgid: Frame,
    /// What it asks.
    pub query: AdminQuery,
}

/// Extra STATUS figures from outside the shards (the text front end),
/// each a JSON value under its own key in STATUS's `emq` object.
pub type ExtraStatus = Arc<dyn Fn() -> Vec<(&'static str, Value)> + Send + Sync>;

/// Asks every shard for a snapshot; shards that do not answer in time are
/// left out (and logged).
pub fn collect_snapshots(shards: &[Sender<ShardMsg>]) -> Vec<ShardSnapshot> {
    let (tx, rx) = crossbeam_channel::unbounded();
    let asked = shards.iter().filter(|s| s.send(ShardMsg::Snapshot { reply: tx.clone() }).is_ok()).count();
    let deadline = Instant::now() + limits::ADMIN_SNAPSHOT_TIMEOUT;
    let mut out = Vec::with_capacity(asked);
    while out.len() < asked {
        match rx.recv_deadline(deadline) {
            Ok(s) => out.push(s),
            Err(_) => {
                tracing::warn!(answered = out.len(), asked, "shard snapshot timed out");
                break;
            }
        }
    }
    out
}

/// Runs the admin thread until `rx` closes.
pub fn run(
    rx: Receiver<AdminRequest>,
    mut out: ZmqOutbox,
    ctx: ShardContext,
    extra: ExtraStatus,
    latency: Arc<Mutex<LatencyStore>>,
) {
    for req in rx {
        let shards = collect_snapshots(&ctx.shards);
        let body = match req.query {
            AdminQuery::Status => status_json(&shards, status_extras(&ctx, &extra)),
            AdminQuery::ShowWorkers => workers_json(&shards),
            AdminQuery::ShowSchedulers => schedulers_json(&shards),
            AdminQuery::Latency => {
                reporter::collect(&ctx.shards, &latency);
                latency.lock().to_json()
            }
        };
        let frames = Message::new(Command::Reply { body: body.to_string().into_bytes() }).encode();
        out.send(Outgoing { dest: Dest::Admin, peer: req.peer, frames, on_fail: OnFail::Count });
    }
}

fn status_extras(ctx: &ShardContext, extra: &ExtraStatus) -> Value {
    let mut m = serde_json::Map::new();
    m.insert("version".into(), json!(env!("CARGO_PKG_VERSION")));
    m.insert("shards".into(), json!(ctx.shards.len()));
    m.insert("uptime_secs".into(), json!(ctx.started.elapsed().as_secs()));
    m.insert("draining".into(), json!(ctx.draining.load(Ordering::Acquire)));
    m.insert("counters".into(), ctx.counters.to_json());
    for (k, v) in extra() {
        m.insert(k.into(), v);
    }
    Value::Object(m)
}
