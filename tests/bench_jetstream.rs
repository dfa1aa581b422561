//! `emq-bench jetstream`, the raw JetStream per-message baseline (issue 27),
//! run as a process against a real 3-node nats-server cluster
//! (tests/common/nats.rs): exact counts in its output, in both modes, and
//! the stream it made gone afterwards; and exit status 2 with one line when
//! no server answers. No timing assertions.
//!
//! Without a nats-server the cluster test says so in one line and skips;
//! under CI it fails (`.ci/run` installs it with `tests/nats/setup.sh`).

use std::process::Command;
use std::time::Duration;

use crate::common::nats::{self, Cluster, NODES};
use crate::common::ports::free_port;
use crate::common::proc::{self, TestDir};
use crate::common::watchdog::Watchdog;

/// How long one `emq-bench jetstream` of 2,000 jobs may take (a fraction of
/// a second on an idle machine; CI shares two cores).
const RUN_BOUND: Duration = Duration::from_secs(90);

/// Runs `emq-bench jetstream ARGS --no-progress --out DIR --name NAME`;
/// (exit code, stdout, stderr).
fn bench(dir: &TestDir, name: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let out = dir.path.to_string_lossy().into_owned();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_emq-bench"));
    cmd.arg("jetstream").args(args).args(["--no-progress", "--out", &out, "--name", name]);
    let (status, stdout, stderr) = proc::run(name, &mut cmd, &dir.path, RUN_BOUND);
    (status.and_then(|s| s.code()), stdout, stderr)
}

/// The `jetstream: {…}` line of the output, parsed.
fn figures(stdout: &str) -> serde_json::Value {
    let line = stdout.lines().find_map(|l| l.strip_prefix("jetstream: "));
    let line = line.unwrap_or_else(|| panic!("no `jetstream: ` line in\n{stdout}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
}

/// Streams named `name` on node `i` (its `/jsz` stream details).
fn streams_named(cluster: &Cluster, i: usize, name: &str) -> usize {
    let jsz = cluster.monitor(i, "/jsz?accounts=true&streams=true").expect("/jsz");
    let accounts = jsz["account_details"].as_array().into_iter().flatten();
    accounts.filter_map(|a| a["stream_detail"].as_array()).flatten().filter(|s| s["name"] == name).count()
}

/// One run of 2,000 jobs: every count exact, in the line, the table and the
/// JSON record; the stream gone from every node. Returns the figures.
fn run_and_check(cluster: &mut Cluster, dir: &TestDir, name: &str, extra: &[&str]) -> serde_json::Value {
    let urls = cluster.urls().join(",");
    let pids: Vec<String> = (0..NODES).map(|i| cluster.pid(i).expect("every node runs").to_string()).collect();
    let pids = pids.join(",");
    let mut args = vec!["--nats-url", &urls, "--jobs", "2000", "--server-pids", &pids];
    args.extend_from_slice(extra);
    let (code, stdout, stderr) = bench(dir, name, &args);
    assert_eq!(code, Some(0), "emq-bench jetstream {args:?}\n{stdout}\n{stderr}\n{}", cluster.log_tails(20));
    let f = figures(&stdout);
    for (key, want) in [("jobs", 2000), ("published", 2000), ("consumed", 2000), ("lost", 0), ("left_in_stream", 0)] {
        assert_eq!(f[key], want, "{key} in {f}");
    }
    assert_eq!(f["foreign"], 0, "{f}");
    assert_eq!(f["puback_us"]["count"], 2000, "every PubAck timed: {f}");
    for key in
        ["jobs_per_s", "publish_msgs_per_s", "consume_msgs_per_s", "client_cpu_us_per_job", "server_cpu_us_per_job"]
    {
        assert!(f[key].as_f64().is_some_and(|v| v >= 0.0), "{key} in {f}");
    }
    let row = stdout.lines().find(|l| l.starts_with("jetstream ")).unwrap_or_else(|| panic!("no table row\n{stdout}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[..4], ["jetstream", "2000", "2000", "0"], "target, sent, recvd, lost: {row}");
    let record = std::fs::read(dir.join(&format!("{name}.json"))).expect("the JSON record written");
    let record: serde_json::Value = serde_json::from_slice(&record).expect("the JSON record parses");
    assert_eq!(record["mode"], "jetstream");
    let r = &record["results"][0];
    for (key, want) in [("sent", 2000), ("received", 2000), ("lost", 0), ("accepted", 2000)] {
        assert_eq!(r[key], want, "{key} in {r}");
    }
    let stream = f["stream"].as_str().unwrap_or_else(|| panic!("no stream name in {f}")).to_string();
    for i in 0..NODES {
        assert_eq!(streams_named(cluster, i, &stream), 0, "{stream} still on {}", cluster.nodes[i].name);
    }
    f
}

#[test]
fn bench_jetstream_counts_every_job_through_a_3_node_cluster_and_deletes_its_stream() {
    let test = "bench_jetstream";
    let _watchdog = Watchdog::new(test, 300);
    let Some(bin) = nats::server_or_skip(test) else { return };
    let dir = TestDir::new(test);
    let mut cluster = Cluster::start(&bin, &dir);

    // The default: consumed while published, on a stream named for the run.
    let f = run_and_check(&mut cluster, &dir, "concurrent", &[]);
    assert_eq!(f["mode"], "concurrent");
    assert_eq!(f["delivery_us"]["count"], 2000, "every delivery timed: {f}");
    assert!(f["stream"].as_str().is_some_and(|s| s.starts_with("emqbench_")), "{f}");

    // Consumed after the last PubAck, on a stream named here.
    let stream = format!("emqbench_test_{}", std::process::id());
    let f = run_and_check(&mut cluster, &dir, "sequential", &["--concurrent", "false", "--stream", &stream]);
    assert_eq!((f["mode"].as_str(), f["stream"].as_str()), (Some("sequential"), Some(stream.as_str())));
    for key in ["server_cpu_us_per_job_publish", "server_cpu_us_per_job_consume"] {
        assert!(f[key].is_number(), "{key} in {f}");
    }
}

#[test]
fn bench_jetstream_exits_2_with_one_line_when_no_server_answers() {
    let test = "bench_jetstream_unreachable";
    let _watchdog = Watchdog::new(test, 60);
    let dir = TestDir::new(test);
    let url = format!("nats://127.0.0.1:{}", free_port());
    let (code, stdout, stderr) = bench(&dir, "unreachable", &["--nats-url", &url, "--jobs", "10"]);
    assert_eq!(code, Some(2), "{stdout}\n{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].starts_with(&format!("emq-bench: connect to {url}: ")), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
