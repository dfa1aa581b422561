//! The operations of the model-based test and their generators.

use proptest::collection::vec;
use proptest::prelude::*;

use crate::broker::text_port::TextAnswer;

/// Worker identities.
pub const WORKERS: [&str; 3] = ["w0", "w1", "w2"];
/// Queues a worker may declare.
pub const DECLARABLE: [&str; 3] = ["a", "b", "default"];
/// Queues a job may name: the declarable ones and one no worker declares.
pub const NAMED: [&str; 4] = ["a", "b", "default", "x"];
/// Weights a worker may give a queue.
pub const WEIGHTS: [i64; 3] = [0, 5, 10];
/// Text connections.
pub const CONNS: u64 = 3;
/// Client msgids `m0..m3` are reused (duplicates); larger numbers are unique.
pub const SHARED_MSGIDS: usize = 4;

/// One step of a run.
#[derive(Debug, Clone)]
pub enum Op {
    /// INFORM of `WORKERS[w]` with `(WEIGHTS[i], DECLARABLE[j])` pairs
    /// (repeated names dropped as the INFORM parser does).
    Inform { w: usize, queues: Vec<(usize, usize)> },
    /// `n` READYs.
    Ready { w: usize, n: usize },
    /// A REQUEST for `NAMED[q]` with msgid `m{msgid}` (shared below
    /// [`SHARED_MSGIDS`], else unique).
    Request { q: usize, msgid: usize },
    /// A job REPLY for a job the worker holds (the `pick`-th, modulo what it
    /// holds), or for an unknown msgid when `pick` is 4 or it holds none.
    Reply { w: usize, pick: usize },
    /// A HEARTBEAT.
    Heartbeat { w: usize },
    /// A KBYE.
    Kbye { w: usize },
    /// A failed send to the worker.
    SendFailed { w: usize, unreachable: bool },
    /// `times` times: the worker crashes holding its jobs (a failed send),
    /// comes back with the queues it had and sends one READY; the way a
    /// poison job kills worker after worker.
    Restart { w: usize, times: usize },
    /// Time passes.
    Advance { ms: u64 },
    /// `SCHED` on `NAMED[q]`.
    Sched { q: usize },
    /// `ASK NAMED[q]` (only when the connection holds no live offer).
    Ask { conn: u64, q: usize },
    /// An answer to the connection's live offer (if any).
    Answer { conn: u64, answer: TextAnswer },
    /// The connection ends holding its live offer (if any).
    Release { conn: u64 },
    /// An answer naming an offer the connection does not hold: the
    /// `pick`-th offer ever made, or another shard's id for it.
    StaleAnswer { conn: u64, pick: usize, foreign: bool },
    /// The broker starts draining.
    Drain,
}

fn answer() -> impl Strategy<Value = TextAnswer> {
    prop_oneof![Just(TextAnswer::Ack), Just(TextAnswer::Dcl), Just(TextAnswer::Del)]
}

/// An INFORM of a random worker serving 1 to 3 random queues, or rarely
/// none (an INFORM of `[]`).
fn inform() -> impl Strategy<Value = Op> {
    let queues = prop_oneof![1 => Just(Vec::new()), 9 => vec((0..WEIGHTS.len(), 0..DECLARABLE.len()), 1..=3)];
    (0..WORKERS.len(), queues).prop_map(|(w, queues)| Op::Inform { w, queues })
}

/// One operation, weighted towards job traffic.
pub fn op() -> impl Strategy<Value = Op> {
    let w = || 0..WORKERS.len();
    let conn = || 1..=CONNS;
    prop_oneof![
        25 => inform(),
        40 => (w(), 1..=3usize).prop_map(|(w, n)| Op::Ready { w, n }),
        40 => (0..NAMED.len(), 0..2 * SHARED_MSGIDS).prop_map(|(q, msgid)| Op::Request { q, msgid }),
        40 => (w(), 0..=4usize).prop_map(|(w, pick)| Op::Reply { w, pick }),
        35 => w().prop_map(|w| Op::Heartbeat { w }),
        6 => w().prop_map(|w| Op::Kbye { w }),
        6 => (w(), any::<bool>()).prop_map(|(w, unreachable)| Op::SendFailed { w, unreachable }),
        8 => (w(), 1..=7usize).prop_map(|(w, times)| Op::Restart { w, times }),
        20 => (0..=8u64).prop_map(|n| Op::Advance { ms: n * 250 }),
        3 => (5..=10u64).prop_map(|s| Op::Advance { ms: s * 1000 }),
        20 => (0..NAMED.len()).prop_map(|q| Op::Sched { q }),
        20 => (conn(), 0..NAMED.len()).prop_map(|(conn, q)| Op::Ask { conn, q }),
        20 => (conn(), answer()).prop_map(|(conn, answer)| Op::Answer { conn, answer }),
        8 => conn().prop_map(|conn| Op::Release { conn }),
        8 => (conn(), 0..8usize, any::<bool>()).prop_map(|(conn, pick, foreign)| Op::StaleAnswer { conn, pick, foreign }),
        1 => Just(Op::Drain),
    ]
}

/// A run: shards, interleaving and operations.
#[derive(Debug, Clone)]
pub struct Run {
    /// Number of shards.
    pub shards: usize,
    /// The harness's interleaving seed (`None`: lowest shard first).
    pub seed: Option<u64>,
    /// The operations.
    pub ops: Vec<Op>,
}

/// Runs of 1 to 3 shards, in order or with a seeded interleaving: 1 to 4
/// INFORMs, then up to 60 operations.
pub fn run() -> impl Strategy<Value = Run> {
    (1..=3usize, proptest::option::of(1..u64::MAX), vec(inform(), 1..=4), vec(op(), 1..60)).prop_map(
        |(shards, seed, mut ops, rest)| {
            ops.extend(rest);
            Run { shards, seed, ops }
        },
    )
}
