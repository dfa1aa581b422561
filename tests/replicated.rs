//! Acceptance tests of `durability = "replicated"` (issue 27): `emq-router`
//! as a process, its job log on a real 3-node NATS JetStream cluster
//! (`tests/common/nats.rs`, R3, `sync_interval: always`), over real sockets
//! on fresh ports:
//!
//! * [`loss`]: the router's machine lost while jobs flow (`kill -9`, its
//!   data directory deleted); a new router with the same name on other
//!   ports delivers every acknowledged job, again only those in flight;
//! * a second live router with the same name is refused at start, naming
//!   the holder, and the first serves on;
//! * [`compaction`]: 50,000 jobs accepted and completed; the stream falls
//!   within the documented bound, and STATUS agrees with the server;
//! * a clean stop and start keeps each queue's order and the dead set;
//! * a new shard count rewrites the log into generation 2 streams and
//!   deletes the old ones;
//! * [`start`]: faults of a router's start these tests found, and a start
//!   that fails after taking the name (a stream the layout names deleted
//!   by hand) frees the name at once.
//!
//! Routers run with `--nats-lease 3s` ([`LEASE`]) unless a test says
//! otherwise, so a killed
//! router's name is free again within seconds. Each test starts its own
//! cluster (one at a time, the harness's lock) and router name. Without a
//! nats-server a test says so in one line and skips; under CI it fails.

mod compaction;
mod loss;
mod start;

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use emq::client::emqp::{Client, Outcome};
use serde_json::{json, Value};

use crate::common::nats::{self, Cluster, NODES};
use crate::common::ports::free_port;
use crate::common::proc::{Child, TestDir};
use crate::common::wait;
use crate::common::watchdog::Watchdog;
use crate::durability::{drain, read_line, sched, text_conn, Node};
use crate::retries::cli_json;

/// `--nats-lease` of every router here: a killed router's name is free
/// again at most this long after its last renewal (every third of it).
const LEASE: Duration = Duration::from_secs(3);

/// How long the cluster's nodes may take to agree on what `/jsz` shows
/// (a follower applies a purge or a deletion a little after the leader).
const JSZ_SETTLE: Duration = Duration::from_secs(20);

/// A per-queue setting that sends a task to the dead set at its first
/// setback (see [`bury`]).
const DOOMED: &str = r#"{"doomed": {"max_retries": 0}}"#;

/// What a test holds, dropped in this order: the cluster (its servers
/// killed, stores removed), the test dir (kept when the test failed), the
/// watchdog. Routers are the test's locals, dropped (killed) before.
pub(crate) struct Setup {
    pub(crate) cluster: Cluster,
    pub(crate) dir: TestDir,
    /// The router name of this test (unique: the test and the pid).
    pub(crate) name: String,
    _watchdog: Watchdog,
}

/// A formed cluster, a router name and the watchdog (`limit_secs`) for
/// `test`; `None` after one line when there is no nats-server (not under
/// CI). The watchdog is armed once the cluster is ready: the wait for the
/// cluster lock (other tests' clusters) is not the test's time.
/// [`Cluster::start`] bounds its own start.
pub(crate) fn setup(test: &str, limit_secs: u64) -> Option<Setup> {
    let bin = nats::server_or_skip(test)?;
    let dir = TestDir::new(test);
    let started = Instant::now();
    let cluster = Cluster::start(&bin, &dir);
    let watchdog = Watchdog::new(test, limit_secs);
    eprintln!("{test}: 3-node nats cluster ready in {:?} (the lock's wait included)", started.elapsed());
    let name = format!("{test}-{}", std::process::id());
    Some(Setup { cluster, dir, name, _watchdog: watchdog })
}

impl Setup {
    /// A router on fresh ports: data directory `<label>-data`, output in
    /// `<label>.log`, both in the test dir.
    pub(crate) fn node(&self, label: &str) -> Node {
        Node {
            ports: [free_port(), free_port(), free_port(), free_port()],
            data: self.dir.join(&format!("{label}-data")),
            log: self.dir.join(&format!("{label}.log")),
            metrics: None,
        }
    }

    /// The flags of a replicated router with this test's name on the
    /// cluster and a lease of [`LEASE`] (unless `extra` names another),
    /// then `extra`.
    pub(crate) fn flags(&self, extra: &[&str]) -> Vec<String> {
        let mut flags: Vec<String> = ["--durability", "replicated", "--nats-urls"].map(String::from).to_vec();
        flags.push(self.cluster.urls().join(","));
        flags.extend(["--router-name".to_string(), self.name.clone()]);
        if !extra.contains(&"--nats-lease") {
            flags.extend(["--nats-lease".to_string(), format!("{}s", LEASE.as_secs())]);
        }
        flags.extend(extra.iter().map(|f| f.to_string()));
        flags
    }

    /// Starts `node` with [`Setup::flags`]`(extra)`; returns once every
    /// port listens (a router whose name is still held waits for it first).
    pub(crate) fn start(&self, node: &Node, extra: &[&str]) -> Child {
        let flags = self.flags(extra);
        node.start(&flags.iter().map(String::as_str).collect::<Vec<_>>())
    }

    /// The name of shard `shard`'s stream in generation `gen`.
    pub(crate) fn stream(&self, gen: u32, shard: usize) -> String {
        format!("EMQ_{}_{gen}_{shard}", self.name)
    }

    /// This name's streams as node `i` reports them (`/jsz`): name → state
    /// (`messages`, `bytes`, `first_seq`, `last_seq`, …).
    pub(crate) fn streams_on(&self, i: usize) -> Result<BTreeMap<String, Value>, String> {
        let jsz = self.cluster.monitor(i, "/jsz?accounts=true&streams=true")?;
        let accounts = jsz["account_details"].as_array().ok_or_else(|| format!("no account_details in {jsz}"))?;
        let prefix = format!("EMQ_{}_", self.name);
        Ok(accounts
            .iter()
            .filter_map(|a| a["stream_detail"].as_array())
            .flatten()
            .filter_map(|s| Some((s["name"].as_str()?.to_string(), s["state"].clone())))
            .filter(|(name, _)| name.starts_with(&prefix))
            .collect())
    }

    /// Waits until every node reports exactly the streams `want` of this
    /// name; then their states as node 0 reports them.
    pub(crate) fn wait_streams(&self, want: &[String]) -> BTreeMap<String, Value> {
        let found = wait::until_ok(JSZ_SETTLE, || {
            let mut first = None;
            for i in 0..NODES {
                let on = self.streams_on(i)?;
                let names: Vec<&String> = on.keys().collect();
                if names != want.iter().collect::<Vec<_>>() {
                    return Err(format!("{} has streams {names:?}, want {want:?}", self.cluster.nodes[i].name));
                }
                first.get_or_insert(on);
            }
            first.ok_or_else(|| "no node".to_string())
        });
        found.unwrap_or_else(|why| panic!("{why}\n{}", self.cluster.log_tails(10)))
    }
}

/// Sends the tasks `<queue>-<i:02>` for `i` in `0..n` to every queue of
/// `queues`, interleaved (one of each queue, then the next), over one
/// text connection, and waits for a later answer (all stored).
fn sched_interleaved(text: &str, queues: &[&str], n: usize) {
    let (mut w, mut r) = text_conn(text).expect("a text connection");
    let mut out = String::new();
    for i in 0..n {
        for q in queues {
            out += &format!("SCHED {q}-{i:02}@{q}\n");
        }
    }
    out += "ASK probe\n";
    w.write_all(out.as_bytes()).expect("write the SCHEDs");
    assert_eq!(read_line(&mut r, &AtomicBool::new(false)).as_deref(), Some("NOPE"), "every SCHED stored");
}

/// The tasks `<queue>-<i:02>` of [`sched_interleaved`].
fn tasks(queue: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{queue}-{i:02}")).collect()
}

/// Puts one task, `job-0000`, in the dead set of `doomed` (a queue with
/// `max_retries` 0, [`DOOMED`]): it is offered to a text consumer whose
/// connection then closes, a setback past its retries. Returns the dead
/// set as `emq-cli dead list --json` shows it.
fn bury(node: &Node) -> Value {
    sched(&node.text(), "doomed", 1);
    {
        let (mut w, mut r) = text_conn(&node.text()).expect("a text connection");
        w.write_all(b"ASK doomed\n").expect("write ASK");
        assert_eq!(read_line(&mut r, &AtomicBool::new(false)).as_deref(), Some("WANT? job-0000"));
    }
    let admin = node.admin();
    let dead = wait::until_ok(Duration::from_secs(10), || {
        let listed = cli_json(&admin, &["dead", "list"]);
        if listed["total"] == 1 {
            Ok(listed)
        } else {
            Err(format!("dead list: {listed}"))
        }
    });
    dead.expect("the task in the dead set")
}

/// Every shard's log figures (STATUS `emq.wal.shards`).
fn wal_shards(status: &Value) -> Vec<Value> {
    status["emq"]["wal"]["shards"].as_array().cloned().unwrap_or_else(|| panic!("no emq.wal.shards in {status}"))
}

/// The sum of `key` over every shard's log figures.
fn wal_sum(status: &Value, key: &str) -> u64 {
    wal_shards(status).iter().map(|s| s[key].as_u64().unwrap_or_else(|| panic!("no {key} in {s}"))).sum()
}

/// How often `needle` occurs in the router's output so far.
fn log_count(node: &Node, needle: &str) -> usize {
    std::fs::read_to_string(&node.log).unwrap_or_default().matches(needle).count()
}

#[test]
fn replicated_a_second_router_with_the_name_is_refused_and_the_first_serves_on() {
    let test = "second";
    let Some(s) = setup(test, 120) else { return };
    let first = s.node("first");
    let router = s.start(&first, &[]);
    sched(&first.text(), "q", 5);

    let second = s.node("second");
    let flags = s.flags(&[]);
    let started = Instant::now();
    let (status, log) = second.run_to_exit(&flags.iter().map(String::as_str).collect::<Vec<_>>(), &s.dir);
    let took = started.elapsed();
    eprintln!("{test}: the second router exited after {took:?}: {status:?}");
    assert!(status.is_some_and(|st| !st.success()), "the second router must exit non-zero: {status:?}\n{log}");
    let refused = format!("router name {:?} is held by a live emq-router", s.name);
    assert!(log.contains(&refused), "{refused}\n{log}");
    // The holder as it describes itself: the first router's pid and address.
    let holder = format!(r#""pid":{}"#, router.pid());
    assert!(log.contains(&holder) && log.contains(&first.frontend()), "names the holder ({holder}): {log}");
    // Refused once it saw the holder renew (every third of the lease), not
    // after watching the name for the whole of twice the lease.
    assert!(took < 2 * LEASE, "refused after {took:?}");

    // The first serves on: its tasks, new ones, and its log is still its own.
    assert_eq!(drain(&first.text(), "q"), (0..5).map(|i| format!("job-{i:04}")).collect::<Vec<_>>());
    sched(&first.text(), "q", 3);
    assert_eq!(drain(&first.text(), "q").len(), 3);
    let status = first.status();
    assert_eq!(wal_shards(&status)[0]["state"], "ok", "{status}");
    assert_eq!(log_count(&first, "another router took this router's name"), 0);
}

#[test]
fn replicated_a_clean_restart_keeps_both_protocols_queues_in_order_and_the_dead_set() {
    let test = "restart";
    let Some(s) = setup(test, 120) else { return };
    let node = s.node("router");
    let extra = ["--queues", DOOMED];
    let mut router = s.start(&node, &extra);
    // 20 text tasks to qa and 20 eMQP jobs to default, interleaved (no
    // worker serves any queue: eMQP jobs go to default then).
    let (mut w, mut r) = text_conn(&node.text()).expect("a text connection");
    let mut client = Client::connect(&node.frontend()).expect("a client").with_timeout(Duration::from_secs(5));
    for i in 0..20 {
        w.write_all(format!("SCHED qa-{i:02}@qa\n").as_bytes()).expect("write SCHED");
        let outcome = client.request("default", "", format!("default-{i:02}").as_bytes());
        assert!(matches!(outcome, Ok(Outcome::Accepted { .. })), "default-{i:02}: {outcome:?}");
    }
    w.write_all(b"ASK probe\n").expect("write ASK");
    assert_eq!(read_line(&mut r, &AtomicBool::new(false)).as_deref(), Some("NOPE"));
    let dead = bury(&node);
    assert_eq!(dead["jobs"][0]["reason"], "text_returned", "{dead}");

    let status = router.terminate(Duration::from_secs(10));
    assert!(status.is_some_and(|st| st.success()), "a clean stop: {status:?}\n{}", router.log_tail(20));
    let _router = s.start(&node, &extra);
    // The clean stop freed the name: no wait for the lease.
    assert_eq!(log_count(&node, "the router name is held"), 0, "{}", _router.log_tail(20));
    let status = node.status();
    assert_eq!(status["waiting_messages_by_queue"], json!({"default": 20, "qa": 20}), "{status}");
    assert_eq!(status["dead_messages_by_queue"], json!({"doomed": 1}), "{status}");
    assert_eq!(wal_sum(&status, "jobs_recovered"), 41, "{status}");
    assert_eq!(cli_json(&node.admin(), &["dead", "list"]), dead, "the dead set as it was");
    assert_eq!(drain(&node.text(), "qa"), tasks("qa", 20));
    assert_eq!(drain(&node.text(), "default"), tasks("default", 20));
    // The dead task is whole: retried, it is offered again.
    let id = dead["jobs"][0]["id"].as_str().expect("an id");
    cli_json(&node.admin(), &["dead", "retry", id]);
    assert_eq!(drain(&node.text(), "doomed"), ["job-0000"]);
}

#[test]
fn replicated_a_new_shard_count_rewrites_the_log_into_new_streams_and_deletes_the_old() {
    let test = "shards";
    let Some(s) = setup(test, 150) else { return };
    let node = s.node("router");
    let queues = ["q0", "q1", "q2", "q3", "q4", "q5", "q6", "q7"];
    let mut router = s.start(&node, &["--shards", "1", "--queues", DOOMED]);
    sched_interleaved(&node.text(), &queues, 10);
    let dead = bury(&node);
    let old = s.wait_streams(&[s.stream(1, 0)]);
    assert!(old[&s.stream(1, 0)]["messages"].as_u64().is_some_and(|n| n > 0), "{old:?}");
    let status = router.terminate(Duration::from_secs(10));
    assert!(status.is_some_and(|st| st.success()), "a clean stop: {status:?}");

    let mut router = s.start(&node, &["--shards", "3", "--queues", DOOMED]);
    assert_eq!(log_count(&node, "rewriting it into new streams"), 1, "{}", router.log_tail(20));
    let new: Vec<String> = (0..3).map(|i| s.stream(2, i)).collect();
    s.wait_streams(&new);
    let status = node.status();
    let waiting: serde_json::Map<String, Value> = queues.iter().map(|q| (q.to_string(), json!(10))).collect();
    assert_eq!(status["waiting_messages_by_queue"], Value::Object(waiting), "{status}");
    assert_eq!(status["dead_messages_by_queue"], json!({"doomed": 1}), "{status}");
    let shards = wal_shards(&status);
    let streams: Vec<&str> = shards.iter().filter_map(|sh| sh["stream"].as_str()).collect();
    assert_eq!(streams, new, "{status}");
    assert_eq!(wal_sum(&status, "jobs_recovered"), 81, "{status}");
    let holding = shards.iter().filter(|sh| sh["live_jobs"].as_u64().is_some_and(|n| n > 0)).count();
    assert!(holding >= 2, "the queues spread over the new shards: {status}");
    // The dead job under a new id (ids are per layout), as it was otherwise.
    let relaid = cli_json(&node.admin(), &["dead", "list"]);
    let without_id = |v: &Value| {
        let mut job = v["jobs"][0].clone();
        job.as_object_mut().map(|j| j.remove("id"));
        job
    };
    assert_eq!(without_id(&relaid), without_id(&dead), "{relaid}");
    for q in queues {
        assert_eq!(drain(&node.text(), q), tasks(q, 10));
    }

    // Started again with 3 shards: generation 2 stays, nothing comes back.
    let status = router.terminate(Duration::from_secs(10));
    assert!(status.is_some_and(|st| st.success()), "a clean stop: {status:?}");
    let _router = s.start(&node, &["--shards", "3", "--queues", DOOMED]);
    assert_eq!(log_count(&node, "rewriting it into new streams"), 1);
    let status = node.status();
    assert_eq!(status["waiting_messages_by_queue"], json!({}), "{status}");
    assert_eq!(status["dead_messages_by_queue"], json!({"doomed": 1}), "{status}");
    s.wait_streams(&new);
}
