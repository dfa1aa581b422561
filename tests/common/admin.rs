//! A raw eMQP admin client (what emq-cli sends, docs/emqp.md "Admin"): a DEALER with a
//! UTF-8 uuid identity sends `["", "eMQP/1.0", <CMD>, "admin:<uuid>"]` and
//! reads the `["", "eMQP/1.0", "REPLY", <id>, <JSON>]` answer.

use std::time::{Duration, Instant};

use serde_json::Value;

/// How long one admin request waits for its REPLY.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// Sends admin `command` (`STATUS`, `ROUTER_SHOW_WORKERS`,
/// `ROUTER_SHOW_SCHEDULERS`) to `addr` and returns the REPLY's JSON.
/// Errors: no REPLY within [`REPLY_TIMEOUT`], or a body that is not JSON.
pub fn request(addr: &str, command: &str) -> Result<Value, String> {
    let ctx = zmq::Context::new();
    let sock = ctx.socket(zmq::DEALER).map_err(|e| e.to_string())?;
    let id = uuid::Uuid::new_v4().to_string();
    sock.set_identity(id.as_bytes()).map_err(|e| e.to_string())?;
    sock.set_linger(0).map_err(|e| e.to_string())?;
    sock.connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
    let msgid = format!("admin:{}", uuid::Uuid::new_v4());
    let frames: [&[u8]; 4] = [b"", b"eMQP/1.0", command.as_bytes(), msgid.as_bytes()];
    sock.send_multipart(frames, 0).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + REPLY_TIMEOUT;
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        if sock.poll(zmq::POLLIN, left.as_millis() as i64).map_err(|e| e.to_string())? == 0 {
            break;
        }
        let msg = sock.recv_multipart(0).map_err(|e| e.to_string())?;
        if msg.len() >= 5 && msg[2] == b"REPLY" {
            return serde_json::from_slice(&msg[4]).map_err(|e| {
                format!("{command} REPLY body is not JSON ({e}): {:?}", String::from_utf8_lossy(&msg[4]))
            });
        }
    }
    Err(format!("no REPLY to admin {command} from {addr} within {REPLY_TIMEOUT:?}"))
}

/// A worker as ROUTER_SHOW_WORKERS lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct Worker {
    /// The worker's socket identity (uuid text).
    pub id: String,
    /// Its INFORM queue list, `[[weight, name], ...]`.
    pub queues: Value,
    /// READY credit the router holds for it.
    pub available_slots: i64,
}

/// The workers `ROUTER_SHOW_WORKERS` lists (`connected_workers`).
pub fn workers(addr: &str) -> Result<Vec<Worker>, String> {
    let reply = request(addr, "ROUTER_SHOW_WORKERS")?;
    let map = reply
        .get("connected_workers")
        .and_then(Value::as_object)
        .ok_or_else(|| format!("ROUTER_SHOW_WORKERS reply has no connected_workers object: {reply}"))?;
    Ok(map
        .iter()
        .map(|(id, w)| Worker {
            id: id.clone(),
            queues: w.get("queues").cloned().unwrap_or(Value::Null),
            available_slots: w.get("available_slots").and_then(Value::as_i64).unwrap_or(-1),
        })
        .collect())
}

/// The worker whose queue list is `queues` (a JSON text such as
/// `[[10,"default"]]`), if exactly one is listed.
pub fn worker_serving(workers: &[Worker], queues: &str) -> Option<Worker> {
    let want: Value = serde_json::from_str(queues).ok()?;
    let mut found = workers.iter().filter(|w| w.queues == want);
    match (found.next(), found.next()) {
        (Some(w), None) => Some(w.clone()),
        _ => None,
    }
}
