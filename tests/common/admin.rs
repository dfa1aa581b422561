//! The tests' one admin client: the library's [`AdminClient`] (what
//! emq-cli uses: a DEALER with a fresh uuid identity per connection sends
//! `["", "eMQP/1.0", <COMMAND>, "admin:<uuid>", <args>…]` and reads the
//! REPLY's JSON), for emq's router, EventMQ's router and emq-scheduler's
//! admin socket alike.

use std::time::Duration;

use emq::client::admin::AdminClient;
use emq::protocol::emqp::AdminWord;
use emq::router::RouterHandle;
use serde_json::Value;

/// How long one admin request waits for its REPLY.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// Sends admin `command` (`STATUS`, `ROUTER_SHOW_WORKERS`, the scheduler's
/// `SCHEDULES`…) without arguments to `addr` and returns the REPLY's JSON.
/// Errors: no REPLY within [`REPLY_TIMEOUT`], a refusal, or a body that is
/// not JSON.
pub fn request(addr: &str, command: &str) -> Result<Value, String> {
    let mut client = AdminClient::connect(addr).map_err(|e| e.to_string())?.with_timeout(REPLY_TIMEOUT);
    client.query(command.as_bytes()).map_err(|e| format!("admin {command}: {e}"))
}

/// Sends admin command `word` with argument frames `args` to `addr`.
/// Errors as [`request`].
pub fn call(addr: &str, word: AdminWord, args: &[&[u8]]) -> Result<Value, String> {
    let mut client = AdminClient::connect(addr).map_err(|e| e.to_string())?.with_timeout(REPLY_TIMEOUT);
    client.call(word, args).map_err(|e| format!("admin {}: {e}", word.word()))
}

/// [`request`] to the router `h` runs in this process; panics when it
/// does not answer.
pub fn admin(h: &RouterHandle, command: &str) -> Value {
    request(&h.endpoints.admin, command).unwrap_or_else(|e| panic!("{e}"))
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
