//! Compaction of the replicated log (`src/jslog/log.rs`, "Chunks and
//! purging"): 100 tasks wait in `pinned` from the start while 50,000 tasks
//! of 300 bytes go through `flow` (a pipelining text producer, two text
//! consumers; [`run`]). The log publishes far more than one chunk; compaction copies
//! the pinned tasks forward out of old chunks and the stream is purged, so
//! at the end the stream holds at most [`WAL_DISK_FACTOR`] × the live jobs'
//! record bytes + one chunk ([`NATS_CHUNK_BYTES`]) of records: the
//! documented bound. The log's own figures (`emq-cli status --json`,
//! `emq.wal.shards[]`) agree with the server's (`/jsz`): its stream bytes
//! are the server's less each message's overhead ([`msg_overhead`], known
//! to within 5 bytes a message), nothing is left unconfirmed, and the
//! server's first sequence is where the log last purged. A `kill -9` and a
//! start with the same name then finds exactly the pinned tasks, in order,
//! and none of the 50,000; once they are taken too, the stream falls below
//! one chunk.

use std::io::Write;
use std::ops::{Range, RangeInclusive};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use emq::limits::{NATS_CHUNK_BYTES, WAL_DISK_FACTOR};
use serde_json::{json, Value};

use super::{setup, wal_shards, Setup};
use crate::common::wait;
use crate::durability::{drain, read_line, sched, text_conn, Node};
use crate::retries::cli_json;

/// Tasks through `flow`.
const JOBS: usize = 50_000;
/// Bytes of each one's data.
const BODY_BYTES: usize = 300;
/// Tasks waiting in `pinned` throughout.
const PINNED: usize = 100;
/// SCHEDs per write, each group followed by one `ASK probe` (its `NOPE`
/// says the group is stored).
const GROUP: usize = 500;
/// Groups written and not yet confirmed.
const WINDOW: usize = 4;
/// Text consumers of `flow`.
const CONSUMERS: usize = 2;
/// How long the run may take (about 4 s on the 2-core development
/// machine).
const RUN_BOUND: Duration = Duration::from_secs(90);
/// How long the stream may take to shrink once the run is over (purges go
/// at most once a second per shard).
const SHRINK_BOUND: Duration = Duration::from_secs(20);
/// What the server stores of a message besides emq's records, in bytes
/// (nats-server's `fileStoreMsgSize` with headers): 22 of framing, the
/// subject (`EMQ.<name>.1.0.<epoch>`, the stream's one subject:
/// docs/replicated.md, "Failover"), 4 + the headers (`NATS/1.0\r\n`,
/// `Nats-Msg-Id: <boot>.<ticket>.<part>\r\n`, `\r\n`: 27 + the id), emq's
/// 25-byte message header and an 8-byte checksum: 86 + the subject + the
/// id. The id is a 10-digit boot, a ticket of 1 to 6 digits here and part
/// `0`: 14 to 19 bytes. The log counts records only, so the server's bytes
/// are the log's plus this per message, known to within 5 bytes a message.
fn msg_overhead(subject: &str) -> RangeInclusive<u64> {
    let fixed = 86 + subject.len() as u64;
    (fixed + 14)..=(fixed + 19)
}

/// The documented bound on the records a stream holds, for `live` bytes of
/// live jobs' records.
fn bound(live: u64) -> u64 {
    WAL_DISK_FACTOR * live + NATS_CHUNK_BYTES
}

/// Sends the tasks `<i:06>-xxx…@flow` for `i` in `tasks`, [`WINDOW`]
/// groups of [`GROUP`] in flight; returns once every one is stored.
fn produce(text: &str, tasks: Range<usize>) {
    let (mut w, mut r) = text_conn(text).expect("a text connection");
    let pad = "x".repeat(BODY_BYTES - 7);
    let never = AtomicBool::new(false);
    let groups: Vec<usize> = tasks.clone().step_by(GROUP).collect();
    let mut confirmed = 0;
    for (k, start) in groups.iter().enumerate() {
        let mut out = String::with_capacity(GROUP * (BODY_BYTES + 16));
        for i in *start..(start + GROUP).min(tasks.end) {
            out += &format!("SCHED {i:06}-{pad}@flow\n");
        }
        out += "ASK probe\n";
        w.write_all(out.as_bytes()).expect("write a group");
        while k + 1 - confirmed >= WINDOW || (k + 1 == groups.len() && confirmed < groups.len()) {
            assert_eq!(read_line(&mut r, &never).as_deref(), Some("NOPE"), "group {confirmed} stored");
            confirmed += 1;
        }
    }
}

/// Takes `flow` tasks one at a time (ASK, then ACK with the next ASK)
/// until `done` is set and the queue answers `NOPE`; the numbers it got.
fn consume(text: &str, done: &AtomicBool) -> Vec<u32> {
    let (mut w, mut r) = text_conn(text).expect("a text connection");
    let never = AtomicBool::new(false);
    let mut got = Vec::new();
    w.write_all(b"ASK flow 200\n").expect("write ASK");
    loop {
        match read_line(&mut r, &never) {
            Some(l) if l.starts_with("WANT? ") => {
                got.push(l["WANT? ".len()..][..6].parse().expect("a task number"));
                w.write_all(b"ACK\nASK flow 200\n").expect("write ACK");
            }
            Some(l) if l == "NOPE" && done.load(Ordering::Relaxed) => return got,
            Some(l) if l == "NOPE" => w.write_all(b"ASK flow 200\n").expect("write ASK"),
            other => panic!("a consumer got {other:?}"),
        }
    }
}

/// Text consumers of `flow` ([`consume`]) until [`Consumers::finish`].
struct Consumers {
    done: Arc<AtomicBool>,
    threads: Vec<JoinHandle<Vec<u32>>>,
}

impl Consumers {
    fn start(node: &Node) -> Consumers {
        let done = Arc::new(AtomicBool::new(false));
        let threads = (0..CONSUMERS)
            .map(|_| {
                let (text, done) = (node.text(), done.clone());
                std::thread::spawn(move || consume(&text, &done))
            })
            .collect();
        Consumers { done, threads }
    }

    /// Waits until only the pinned tasks wait, then stops the consumers;
    /// the tasks they took.
    fn finish(self, node: &Node) -> Vec<u32> {
        let drained = wait::until(RUN_BOUND, || {
            let status = node.status();
            status["waiting_messages_by_queue"] == json!({"pinned": PINNED})
                && status["inflight_messages_by_queue"] == json!({})
        });
        self.done.store(true, Ordering::Relaxed);
        let got = self.threads.into_iter().flat_map(|c| c.join().expect("a consumer")).collect();
        assert!(drained, "flow not drained within {RUN_BOUND:?}: {}", node.status());
        got
    }
}

/// Sends [`JOBS`] tasks through `flow` in two rounds: the first half taken
/// while it is stored, the second stored before the consumers start (so a
/// compaction pass copies a large backlog forward, and the pinned tasks'
/// chunk falls behind by the copies); checks each was taken exactly once.
fn run(node: &Node) {
    let started = Instant::now();
    let consumers = Consumers::start(node);
    produce(&node.text(), 0..JOBS / 2);
    let mut got = consumers.finish(node);
    let round = started.elapsed();
    produce(&node.text(), JOBS / 2..JOBS);
    got.extend(Consumers::start(node).finish(node));
    let took = started.elapsed();
    got.sort_unstable();
    assert_eq!(got.len(), JOBS, "every task taken once");
    assert!(got.iter().enumerate().all(|(i, &n)| n as usize == i), "every task taken once");
    eprintln!(
        "compaction: {JOBS} tasks of {BODY_BYTES} B in {took:?} ({:.0}/s; the first round {round:?})",
        JOBS as f64 / took.as_secs_f64()
    );
}

/// The figures compared at the end: the log's (STATUS) and the server's.
#[derive(Debug)]
struct Figures {
    /// [`msg_overhead`] of the stream's subject (the router's epoch).
    overhead: RangeInclusive<u64>,
    /// Shard 0's `emq.wal.shards[]` as `emq-cli status --json` shows it.
    log: Value,
    /// The stream's state as `/jsz` shows it (every node agreeing).
    server: Value,
}

impl Figures {
    fn log(&self, key: &str) -> u64 {
        self.log[key].as_u64().unwrap_or_else(|| panic!("no {key} in {}", self.log))
    }

    fn server(&self, key: &str) -> u64 {
        self.server[key].as_u64().unwrap_or_else(|| panic!("no {key} in {}", self.server))
    }

    /// Why the stream is not yet as small as it should be, if it is not:
    /// records within the bound, nothing unconfirmed, the server purged to
    /// where the log asked, and the server's bytes the log's plus the
    /// overhead of each message.
    fn settled(&self) -> Result<(), String> {
        let (log_bytes, live) = (self.log("stream_bytes"), self.log("live_bytes"));
        let (bytes, messages) = (self.server("bytes"), self.server("messages"));
        let extra = bytes.checked_sub(log_bytes).ok_or("the server holds fewer bytes than the log counts")?;
        let overhead = (self.overhead.start() * messages)..=(self.overhead.end() * messages);
        if log_bytes > bound(live) {
            Err(format!("the log counts {log_bytes} bytes held, over the bound {}", bound(live)))
        } else if self.log("unconfirmed_batches") != 0 || self.log("unconfirmed_bytes") != 0 {
            Err("batches or bytes unconfirmed".into())
        } else if self.server("first_seq") != self.log("purged_below_seq") {
            Err("the server's first sequence is not where the log purged".into())
        } else if !overhead.contains(&extra) {
            Err(format!(
                "the server holds {extra} bytes more than the log counts in {messages} messages, not {:?} a message",
                self.overhead
            ))
        } else {
            Ok(())
        }
    }
}

/// The log's figures and the stream's, once every node reports the same
/// state for it.
fn figures(s: &Setup, node: &Node) -> Result<Figures, String> {
    let stream = s.stream(1, 0);
    let mut states = Vec::new();
    for i in 0..crate::common::nats::NODES {
        let on = s.streams_on(i)?;
        states.push(on.get(&stream).cloned().ok_or_else(|| format!("no {stream} on node {i}"))?);
    }
    let key = |v: &Value| (v["messages"].clone(), v["bytes"].clone(), v["first_seq"].clone());
    if states.iter().any(|st| key(st) != key(&states[0])) {
        return Err(format!("the nodes disagree: {states:?}"));
    }
    let jsz = s.cluster.monitor(0, "/jsz?accounts=true&streams=true&config=true")?;
    let subject = jsz["account_details"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a["stream_detail"].as_array())
        .flatten()
        .find(|d| d["name"] == stream.as_str())
        .and_then(|d| d["config"]["subjects"][0].as_str())
        .ok_or_else(|| format!("no subject of {stream} in /jsz: {jsz}"))?
        .to_string();
    let status = cli_json(&node.admin(), &["status"]);
    let overhead = msg_overhead(&subject);
    Ok(Figures { overhead, log: wal_shards(&status)[0].clone(), server: states.swap_remove(0) })
}

#[test]
fn replicated_compaction_keeps_the_stream_within_its_bound_and_status_agrees_with_the_server() {
    let test = "compact";
    let Some(s) = setup(test, 180) else { return };
    let node = s.node("router");
    let mut router = s.start(&node, &["--shards", "1"]);
    sched(&node.text(), "pinned", PINNED);
    run(&node);

    let mut last = None;
    let settled = wait::until_ok(SHRINK_BOUND, || {
        let f = figures(&s, &node)?;
        let why = f.settled();
        last = Some(f);
        why
    });
    let f = last.expect("the figures read once");
    eprintln!("compaction: log {:#}\nserver {:#}", f.log, f.server);
    settled.unwrap_or_else(|why| panic!("{why}: {f:?}"));
    let (live, held) = (f.log("live_bytes"), f.log("stream_bytes"));
    assert_eq!(f.log("live_jobs"), PINNED as u64, "{f:?}");
    assert!(held <= bound(live), "the log: {held} bytes held, bound {}", bound(live));
    let framing = f.overhead.end() * f.server("messages");
    assert!(f.server("bytes") <= bound(live) + framing, "the server: {f:?}");
    assert!(f.log("published_bytes") > 3 * bound(live), "the run published far more than the bound: {f:?}");
    assert!(f.log("relocated_jobs") >= PINNED as u64, "the pinned tasks were copied forward: {f:?}");
    assert!(f.log("purges") >= 1, "{f:?}");

    // Nothing the stream still holds brings back a finished task, nor
    // lacks a waiting one.
    router.kill_group();
    let _router = s.start(&node, &["--shards", "1"]);
    let status = node.status();
    assert_eq!(status["waiting_messages_by_queue"], json!({"pinned": PINNED}), "{status}");
    assert_eq!(wal_shards(&status)[0]["jobs_recovered"], PINNED, "{status}");
    assert_eq!(drain(&node.text(), "pinned"), (0..PINNED).map(|i| format!("job-{i:04}")).collect::<Vec<_>>());

    // No live job left: the stream falls below one chunk, and the log's
    // count (rebuilt from the stream at the start) still agrees.
    let empty = wait::until_ok(SHRINK_BOUND, || {
        let f = figures(&s, &node)?;
        f.settled()?;
        match (f.log("live_jobs"), f.server("bytes")) {
            (0, bytes) if bytes < NATS_CHUNK_BYTES => Ok(f),
            (live, bytes) => Err(format!("{live} live jobs, the server holds {bytes} bytes")),
        }
    });
    let f = empty.unwrap_or_else(|why| panic!("{why}"));
    eprintln!(
        "compaction: at the end the server holds {} bytes in {} messages",
        f.server("bytes"),
        f.server("messages")
    );
}
