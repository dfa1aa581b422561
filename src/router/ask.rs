//! Asking every shard for something (a snapshot, its histograms) and
//! collecting the answers within a deadline: the admin thread, the latency
//! reporter and the drain all use this one helper.

use std::time::{Duration, Instant};

use crossbeam_channel::Sender;

use crate::broker::inbox::ShardMsg;

/// What the shards answered.
#[derive(Debug)]
pub struct Answers<T> {
    /// One answer per shard that answered in time (in arrival order).
    pub answers: Vec<T>,
    /// Shards that did not answer within the timeout (or are gone).
    pub missing: usize,
}

/// Sends `ask(reply)` to every shard and waits up to `timeout` for all the
/// answers. Shards that do not answer in time are counted in
/// [`Answers::missing`] and logged.
pub fn ask_shards<T>(
    shards: &[Sender<ShardMsg>],
    timeout: Duration,
    ask: impl Fn(Sender<T>) -> ShardMsg,
) -> Answers<T> {
    let (tx, rx) = crossbeam_channel::bounded(shards.len());
    let asked = shards.iter().filter(|s| s.send(ask(tx.clone())).is_ok()).count();
    let deadline = Instant::now() + timeout;
    let mut answers = Vec::with_capacity(asked);
    while answers.len() < asked {
        match rx.recv_deadline(deadline) {
            Ok(a) => answers.push(a),
            Err(_) => break,
        }
    }
    let missing = shards.len() - answers.len();
    if missing > 0 {
        tracing::warn!(answered = answers.len(), shards = shards.len(), "shards did not answer in time");
    }
    Answers { answers, missing }
}
