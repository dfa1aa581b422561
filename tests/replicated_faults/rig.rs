//! The router under test with `durability = "replicated"` on a
//! [`Cluster`]: fixed fresh ports (so it can be stopped and started again
//! as the same router), its STATUS and `emq-cli status --json`, the
//! stream of its one shard read back and decoded, and servers paused with
//! SIGSTOP (resumed on drop, before the cluster kills them).

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use futures_util::StreamExt;

use crate::common::nats::{self, Cluster};
use crate::common::proc::{self, Child, TestDir};
use crate::common::wait;

/// How long one admin answer may take, also during a fault.
pub const ADMIN_TIMEOUT: Duration = Duration::from_secs(5);

/// An `emq-router` with `durability = "replicated"`, one shard: the
/// durability tests' router ([`crate::durability::Node`]: fresh fixed
/// ports, started and waited for) with the replicated flags.
pub struct Node {
    router: crate::durability::Node,
    /// Its `router_name`.
    pub name: String,
    flags: Vec<String>,
}

impl Node {
    /// A router named `name` on the NATS servers `urls`, with `extra`
    /// flags, logging to `<dir>/router.log`.
    pub fn new(dir: &TestDir, urls: Vec<String>, name: &str, extra: &[&str]) -> Node {
        let router = crate::durability::Node::with_data(dir, dir.join(&format!("router-data-{name}")));
        let mut flags: Vec<String> = ["--shards", "1", "--durability", "replicated", "--router-name", name]
            .into_iter()
            .map(String::from)
            .collect();
        flags.extend(["--nats-urls".to_string(), urls.join(",")]);
        flags.extend(extra.iter().map(|s| s.to_string()));
        Node { router, name: name.to_string(), flags }
    }

    /// The same router (name and flags) started on another machine:
    /// fresh ports, an empty data directory of its own, its output in
    /// `router-<label>.log`.
    pub fn elsewhere(&self, dir: &TestDir, label: &str) -> Node {
        let data = dir.join(&format!("router-data-{}-{label}", self.name));
        let mut router = crate::durability::Node::with_data(dir, data);
        router.log = dir.join(&format!("router-{label}.log"));
        Node { router, name: self.name.clone(), flags: self.flags.clone() }
    }

    /// This router logging to `router-<label>.log` (several router names
    /// in one test).
    pub fn logging_to(mut self, dir: &TestDir, label: &str) -> Node {
        self.router.log = dir.join(&format!("router-{label}.log"));
        self
    }

    fn flags(&self) -> Vec<&str> {
        self.flags.iter().map(String::as_str).collect()
    }

    /// eMQP frontend.
    pub fn frontend(&self) -> String {
        self.router.frontend()
    }

    /// eMQP backend.
    pub fn backend(&self) -> String {
        self.router.backend()
    }

    /// Admin socket.
    pub fn admin(&self) -> String {
        self.router.admin()
    }

    /// Text protocol.
    pub fn text(&self) -> String {
        self.router.text()
    }

    /// Its one shard's stream (generation 1: the name's first layout).
    pub fn stream(&self) -> String {
        format!("EMQ_{}_1_0", self.name)
    }

    /// The router's command line.
    pub fn command(&self) -> Command {
        self.router.command(&self.flags())
    }

    /// Starts the router and waits until every port listens.
    pub fn start(&self) -> Child {
        self.router.start(&self.flags())
    }

    /// This router with its HTTP server on (`/metrics`, the status page)
    /// on a fresh port, logging to `<dir>/router-<name>.log`.
    pub fn with_metrics(mut self, dir: &TestDir) -> Node {
        self.router.metrics = Some(crate::common::ports::free_port());
        self.router.log = dir.join(&format!("router-{}.log", self.name));
        self
    }

    /// Its HTTP server, `127.0.0.1:P` (after [`Node::with_metrics`]).
    pub fn metrics(&self) -> Option<String> {
        self.router.metrics.map(|p| format!("127.0.0.1:{p}"))
    }

    /// This router with `extra` flags too.
    pub fn with_flags(mut self, extra: &[&str]) -> Node {
        self.flags.extend(extra.iter().map(|s| s.to_string()));
        self
    }

    /// Starts the router without waiting: a standby binds its ports only
    /// once it holds the name ([`Node::wait_listening`]).
    pub fn spawn(&self) -> Child {
        Child::spawn("router", &mut self.command(), &self.router.log)
    }

    /// Waits up to `within` until every port of the router `child` listens;
    /// `false` when it did not or the router exited.
    pub fn wait_listening(&self, child: &mut Child, within: Duration) -> bool {
        use crate::common::ports::is_listening;
        wait::until(within, || !child.is_alive() || self.router.ports.iter().all(|&p| is_listening(p)))
            && child.is_alive()
    }

    /// STATUS as JSON; `Err` when no answer came within [`ADMIN_TIMEOUT`].
    pub fn status(&self) -> Result<serde_json::Value, String> {
        let ctx = zmq::Context::new();
        let sock = super::load::dealer(&ctx, &self.admin());
        sock.send_multipart([&b""[..], b"eMQP/1.0", b"STATUS", b"s1"], 0).map_err(|e| e.to_string())?;
        let f = super::load::recv_within(&sock, ADMIN_TIMEOUT.as_millis() as i64)
            .ok_or_else(|| format!("no STATUS answer within {ADMIN_TIMEOUT:?}"))?;
        let body = f.get(4).ok_or_else(|| format!("a STATUS answer of {} frames", f.len()))?;
        serde_json::from_slice(body).map_err(|e| format!("STATUS is not JSON: {e}"))
    }

    /// Shard 0's log as STATUS shows it (`emq.wal.shards[0]`).
    pub fn log_status(&self) -> Result<serde_json::Value, String> {
        let s = self.status()?;
        let shard = &s["emq"]["wal"]["shards"][0];
        if shard.is_null() {
            return Err(format!("no emq.wal.shards[0] in {s}"));
        }
        Ok(shard.clone())
    }

    /// `emq-cli status --json` against this router: its JSON and how long
    /// it took; panics when it fails or does not end within 10 s.
    pub fn cli_status(&self, dir: &TestDir) -> (serde_json::Value, Duration) {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_emq-cli"));
        cmd.args(["--admin", &self.admin(), "status", "--json"]);
        let t0 = Instant::now();
        let (status, out, err) = proc::run("emq-cli-status", &mut cmd, &dir.path, Duration::from_secs(10));
        let took = t0.elapsed();
        assert!(status.is_some_and(|s| s.success()), "emq-cli status --json: {status:?}\n{out}\n{err}");
        let json =
            serde_json::from_str(&out).unwrap_or_else(|e| panic!("emq-cli status --json printed no JSON ({e}): {out}"));
        (json, took)
    }
}

/// Waits up to `timeout` until shard 0's log state (STATUS) is `state`;
/// its STATUS entry then, or the last one seen.
pub fn wait_log_state(node: &Node, state: &str, timeout: Duration) -> Result<serde_json::Value, String> {
    wait::until_ok(timeout, || {
        let shard = node.log_status()?;
        if shard["state"] == state {
            Ok(shard)
        } else {
            Err(format!("shard 0's log: {shard}"))
        }
    })
}

/// A client knowing every node of `urls` and its JetStream context.
pub async fn connect(urls: &[String]) -> Result<jetstream::Context, String> {
    let client = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(2))
        .connect(urls)
        .await
        .map_err(|e| format!("connect to {urls:?}: {e}"))?;
    Ok(jetstream::ContextBuilder::new().timeout(Duration::from_secs(2)).build(client))
}

/// Makes stream `name` refuse purges (`deny_purge`), so that it keeps
/// every record the router stores: the router's purges of done records
/// fail (counted, logged, tried again later), and nothing else changes.
pub async fn deny_purge(js: &jetstream::Context, name: &str) -> Result<(), String> {
    nats::until_ok_async(ASK_FOR, || async {
        let mut stream = js.get_stream(name).await.map_err(|e| format!("stream {name}: {e}"))?;
        let mut config = stream.info().await.map_err(|e| format!("stream {name} info: {e}"))?.config.clone();
        config.deny_purge = true;
        js.update_stream(config).await.map(|_| ()).map_err(|e| format!("deny_purge on {name}: {e}"))
    })
    .await
}

/// The leader of stream `name` as its leader reports it.
/// Asked again for up to [`ASK_FOR`] while the request fails (the stream
/// electing a leader, or a loaded machine letting a request time out).
pub async fn stream_leader(js: &jetstream::Context, name: &str) -> Result<String, String> {
    nats::until_ok_async(ASK_FOR, || async {
        let stream = tokio::time::timeout(Duration::from_secs(4), js.get_stream(name))
            .await
            .map_err(|_| format!("stream {name}: no answer in 4 s"))?
            .map_err(|e| format!("stream {name}: {e}"))?;
        let cluster = stream.cached_info().cluster.clone().ok_or("no cluster info")?;
        cluster.leader.ok_or_else(|| format!("stream {name} has no leader"))
    })
    .await
}

/// How long the rig asks the cluster again about a stream.
const ASK_FOR: Duration = Duration::from_secs(15);

/// Asks stream `name`'s leader to step down in favour of node `to`
/// (`$JS.API.STREAM.LEADER.STEPDOWN`, preferred placement).
pub async fn step_down(js: &jetstream::Context, name: &str, to: &str) -> Result<(), String> {
    let request = serde_json::json!({"placement": {"preferred": to}});
    let answer: serde_json::Value = js
        .request(format!("STREAM.LEADER.STEPDOWN.{name}"), &request)
        .await
        .map_err(|e| format!("stepdown of {name}: {e}"))?;
    if answer["success"] == true {
        Ok(())
    } else {
        Err(format!("stepdown of {name}: {answer}"))
    }
}

/// What one shard's stream holds, decoded.
#[derive(Debug, Default)]
pub struct StreamContents {
    /// Messages.
    pub messages: u64,
    /// `Accepted` records by the job's body: how many.
    pub accepted: BTreeMap<String, usize>,
    /// `Done` records.
    pub done: usize,
    /// The stream's first sequence (1: nothing was ever purged).
    pub first_sequence: u64,
}

/// Reads stream `name` whole and decodes every message (the emq header,
/// then records as the local log writes them; every batch here is one
/// message: it is asserted).
pub async fn read_stream(js: &jetstream::Context, name: &str) -> Result<StreamContents, String> {
    let mut stream = js.get_stream(name).await.map_err(|e| format!("stream {name}: {e}"))?;
    let state = stream.info().await.map_err(|e| format!("stream {name} info: {e}"))?.state.clone();
    let mut out = StreamContents { first_sequence: state.first_sequence, ..Default::default() };
    if state.messages == 0 {
        return Ok(out);
    }
    let consumer = stream
        .create_consumer(jetstream::consumer::pull::OrderedConfig::default())
        .await
        .map_err(|e| format!("an ordered consumer on {name}: {e}"))?;
    let mut msgs = consumer.messages().await.map_err(|e| e.to_string())?;
    loop {
        let m = match tokio::time::timeout(Duration::from_secs(5), msgs.next()).await {
            Ok(Some(Ok(m))) => m,
            Ok(Some(Err(e))) => return Err(format!("reading {name}: {e}")),
            Ok(None) => return Err(format!("{name} ended before sequence {}", state.last_sequence)),
            Err(_) => return Err(format!("{name}: no message for 5 s before sequence {}", state.last_sequence)),
        };
        let seq = m.info().map_err(|e| e.to_string())?.stream_sequence;
        if m.headers.as_ref().is_some_and(|h| h.get(emq::jslog::message::FENCE_HEADER).is_some()) {
            // A router's marker (docs/replicated.md, "Failover").
            if seq >= state.last_sequence {
                return Ok(out);
            }
            continue;
        }
        out.messages += 1;
        decode(&m.payload, &mut out).map_err(|why| format!("{name} sequence {seq}: {why}"))?;
        if seq >= state.last_sequence {
            return Ok(out);
        }
    }
}

/// Adds one message's records to `out`.
fn decode(payload: &[u8], out: &mut StreamContents) -> Result<(), String> {
    use emq::wal::record::{decode, Record};
    let (header, mut records) = emq::jslog::message::Header::decode(payload)?;
    if header.parts != 1 {
        return Err(format!("a batch in {} parts (this test expects whole batches): {header:?}", header.parts));
    }
    while !records.is_empty() {
        let (record, len) = decode(records).map_err(|e| e.to_string())?;
        match record {
            Record::Accepted { frames, .. } => {
                let frames = emq::job::JobFrames::from_bytes(frames).map_err(|e| e.to_string())?;
                let body = String::from_utf8_lossy(frames.body()).into_owned();
                *out.accepted.entry(body).or_default() += 1;
            }
            Record::Done { .. } => out.done += 1,
            _ => {}
        }
        records = &records[len..];
    }
    Ok(())
}

/// Servers paused with SIGSTOP; SIGCONT on [`Paused::resume`] or drop (so
/// a failing test leaves none stopped before the cluster kills them).
pub struct Paused {
    pids: Vec<i32>,
}

impl Paused {
    /// SIGSTOPs nodes `nodes` of `cluster`.
    pub fn stop(cluster: &mut Cluster, nodes: &[usize]) -> Paused {
        let pids: Vec<i32> = nodes.iter().map(|&i| cluster.pid(i).expect("the node runs")).collect();
        for &pid in &pids {
            // SAFETY: plain syscall on a child of this test.
            assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0, "SIGSTOP {pid}");
        }
        Paused { pids }
    }

    /// SIGCONTs them.
    pub fn resume(mut self) {
        self.cont();
    }

    fn cont(&mut self) {
        for pid in self.pids.drain(..) {
            // SAFETY: plain syscall on a child of this test.
            unsafe { libc::kill(pid, libc::SIGCONT) };
        }
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        self.cont();
    }
}
