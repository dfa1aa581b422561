//! Retries and the dead set over real sockets (README "Retries and the
//! dead set"): a job whose `emq-worker` command keeps failing is retried
//! after growing back-offs, then kept in the dead set, where `emq-cli dead`
//! lists, shows and retries it.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use emq::client::emqp::{Client, Outcome};
use serde_json::Value;

use crate::common::admin::admin;
use crate::common::proc::TestDir;
use crate::emqp_router::{config, eventually, Peer, Watchdog};

/// A job script: appends `<unix time> <payload>` to `$OUT`, then fails
/// (exit 1) unless the file `$OK` exists.
fn script(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("flaky.sh");
    let body = "#!/bin/sh\np=$(cat)\nprintf '%s %s\\n' \"$(date +%s.%N)\" \"$p\" >> \"$OUT\"\n[ -e \"$OK\" ] || exit 1\necho ok\n";
    std::fs::write(&path, body).expect("script written");
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    path
}

/// The times (Unix seconds) of the runs recorded in `out`.
fn run_times(out: &Path) -> Vec<f64> {
    let text = std::fs::read_to_string(out).unwrap_or_default();
    text.lines().filter_map(|l| l.split(' ').next()?.parse().ok()).collect()
}

/// Runs `emq-cli --admin <admin_addr> --timeout 5s ARGS` (also used by
/// `tests/replicated.rs`).
pub(crate) fn cli(admin_addr: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_emq-cli"))
        .args(["--admin", admin_addr, "--timeout", "5s"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("emq-cli runs")
}

/// [`cli`] with `--json`: its answer, parsed (panics unless it exits 0).
pub(crate) fn cli_json(admin_addr: &str, args: &[&str]) -> Value {
    let out = cli(admin_addr, &[&["--json"], args].concat());
    assert!(out.status.success(), "emq-cli {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("emq-cli prints JSON")
}

#[test]
fn a_job_failing_three_times_waits_growing_back_offs_then_is_dead_until_retried() {
    let _w = Watchdog::new("retries_dead_set", 60);
    let dir = TestDir::new("retries");
    let (out, ok) = (dir.join("runs.txt"), dir.join("ok"));
    let cfg = config(3, |r| {
        r.max_retries = Some(2);
        r.retry_backoff = Some("1s".into());
    });
    let h = emq::router::start(cfg).expect("router starts");
    let mut worker = Command::new(env!("CARGO_BIN_EXE_emq-worker"))
        .args(["-B", &h.endpoints.backend, "-Q", "flaky", "-J", "1", "--stats-interval", "0s", "--"])
        .arg(script(&dir.path))
        .env("OUT", &out)
        .env("OK", &ok)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("emq-worker starts");
    eventually(10, "the worker registered", || admin(&h, "STATUS")["emq"]["workers"] == 1);
    let mut c = Client::connect(&h.endpoints.frontend).expect("client").with_timeout(Duration::from_secs(5));
    assert!(matches!(c.request("flaky", "", b"payload-1"), Ok(Outcome::Accepted { .. })));

    // Three runs (the first try and max_retries = 2), then the dead set.
    let admin_addr = h.endpoints.admin.clone();
    eventually(20, "the job in the dead set", || cli_json(&admin_addr, &["dead", "list"])["total"] == 1);
    let times = run_times(&out);
    assert_eq!(times.len(), 3, "three runs: {times:?}");
    let (first, second) = (times[1] - times[0], times[2] - times[1]);
    // Back-offs of 0.75-1 s and 1.5-2 s (README): each at least half of
    // its least, and the second longer than the first.
    assert!(first >= 0.375 && second >= 0.75, "waits {first:.3} s, {second:.3} s");
    assert!(second > first, "the waits grow: {first:.3} s, then {second:.3} s");
    eprintln!("back-off waits between runs: {first:.3} s, then {second:.3} s");

    let listed = cli_json(&admin_addr, &["dead", "list", "flaky"]);
    let job = &listed["jobs"][0];
    assert_eq!(
        (job["queue"].as_str(), job["reason"].as_str(), job["failures"].as_u64()),
        (Some("flaky"), Some("failed"), Some(3))
    );
    let id = job["id"].as_str().expect("an id").to_string();
    let table = cli(&admin_addr, &["dead", "list"]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.lines().nth(1).is_some_and(|l| l.starts_with(&format!("{id}  flaky  failed"))), "{table}");
    assert_eq!(table.lines().nth(2), Some("(1 dead job)"), "the total, shown however short the list: {table}");
    let shown = cli_json(&admin_addr, &["dead", "show", &id]);
    assert_eq!(shown["job"]["body"], "payload-1");
    let status = admin(&h, "STATUS");
    assert_eq!(status["dead_messages_by_queue"]["flaky"], 1);
    assert_eq!(status["retried_messages_by_queue"]["flaky"], 2);
    assert_eq!(status["failed_messages_by_queue"]["flaky"], 3);

    // Unknown ids are errors; retried, the job runs again (and succeeds).
    let unknown = cli(&admin_addr, &["dead", "retry", "0-999999"]);
    assert!(!unknown.status.success(), "an unknown id fails");
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("no dead job 0-999999"));
    // What is not an id or a queue name is refused before anything is sent
    // (a `*` would mean every dead job on the wire).
    for args in
        [&["dead", "show", "not-an-id"][..], &["dead", "delete", "*"], &["dead", "retry", "--all", "--queue", ""]]
    {
        let refused = cli(&admin_addr, args);
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success() && stderr.contains("invalid value"), "{args:?}: {stderr}");
    }
    assert_eq!(cli_json(&admin_addr, &["dead", "list"])["total"], 1, "nothing was deleted");
    std::fs::write(&ok, b"").expect("ok file");
    let retried = cli(&admin_addr, &["dead", "retry", &id]);
    assert_eq!(String::from_utf8_lossy(&retried.stdout).trim(), format!("dead job {id} put back in its queue"));
    eventually(10, "the fourth run", || run_times(&out).len() == 4);
    eventually(10, "completed", || admin(&h, "STATUS")["completed_messages_by_queue"]["flaky"] == 1);
    assert_eq!(cli_json(&admin_addr, &["dead", "list"])["total"], 0);
    assert_eq!(cli_json(&admin_addr, &["dead", "delete", "--all"])["deleted"], 0);
    let _ = worker.kill();
    let _ = worker.wait();
}

#[test]
fn a_python_jobmanagers_timeout_result_counts_as_failed_and_is_retried() {
    let _w = Watchdog::new("retries_python_timeout", 30);
    let h = emq::router::start(config(1, |r| r.retry_backoff = Some("0s".into()))).expect("router starts");
    let worker = Peer::new(&h.endpoints.backend, b"jobmanager-like");
    worker.inform_worker(r#"[[10, "q"]]"#);
    worker.ready(1);
    let client = Peer::new(&h.endpoints.frontend, b"client-timeout");
    client.request("m1", "q", "", "slow job");
    assert_eq!(worker.expect("REQUEST")[3], b"m1");
    // What EventMQ's jobmanager sends when the job ran out of time: no
    // `failed` frame, the result `{"value": "TimeoutError"}`.
    worker.send(&[b"", b"eMQP/1.0", b"REPLY", b"r1", br#"{"value": "TimeoutError"}"#, b"m1"]);
    worker.ready(1);
    assert_eq!(worker.expect("REQUEST")[3], b"m1", "tried again");
    worker.job_reply(b"m1");
    eventually(5, "completed", || admin(&h, "STATUS")["completed_messages_by_queue"]["q"] == 1);
    let status = admin(&h, "STATUS");
    assert_eq!(
        (status["failed_messages_by_queue"]["q"].as_u64(), status["retried_messages_by_queue"]["q"].as_u64()),
        (Some(1), Some(1))
    );
}

#[test]
fn retrying_and_deleting_every_dead_job_of_a_large_set_goes_in_steps_and_traffic_is_served_throughout() {
    use emq::client::text::TextClient;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let _w = Watchdog::new("retries_dead_set_steps", 90);
    // One shard: every step of the operation and the traffic below share it.
    let h = emq::router::start(config(1, |r| {
        r.max_retries = Some(0);
        r.text_addr = Some("127.0.0.1:0".into());
    }))
    .expect("router starts");
    let text = h.endpoints.text.expect("text on");
    // Three steps' worth of dead jobs in `a` and two in `b`
    // (limits::ADMIN_STEP_JOBS each): text tasks whose consumer went away
    // holding them.
    let step = emq::limits::ADMIN_STEP_JOBS;
    let (in_a, in_b) = (2 * step + 1, step + 1);
    let mut producer = TextClient::connect(text, Duration::from_secs(10)).expect("text connects");
    for i in 0..in_a + in_b {
        let queue = if i < in_a { "a" } else { "b" };
        producer.sched(format!("task {i}").as_bytes(), Some(queue)).expect("SCHED");
    }
    producer.end().expect("stored");
    for queue in std::iter::repeat_n("a", in_a).chain(std::iter::repeat_n("b", in_b)) {
        let mut consumer = TextClient::connect(text, Duration::from_secs(10)).expect("text connects");
        assert!(consumer.ask(queue).expect("ASK").is_some());
    }
    let admin_addr = h.endpoints.admin.clone();
    eventually(20, "every job in the dead set", || cli_json(&admin_addr, &["dead", "list"])["total"] == in_a + in_b);
    // A text client keeps asking while the operations run: every ASK is
    // answered.
    let stop = Arc::new(AtomicBool::new(false));
    let prober = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut c = TextClient::connect(text, Duration::from_secs(10)).expect("text connects");
            let mut answered = 0u64;
            while !stop.load(Ordering::Relaxed) {
                assert_eq!(c.ask("elsewhere").expect("ASK answered"), None);
                answered += 1;
            }
            answered
        })
    };
    let retried = cli_json(&admin_addr, &["dead", "retry", "--all", "--queue", "a"]);
    assert_eq!(retried["retried"], in_a, "{retried}");
    let status = admin(&h, "STATUS");
    assert_eq!(
        (&status["waiting_messages_by_queue"]["a"], &status["dead_messages_by_queue"]["b"]),
        (&json(in_a), &json(in_b))
    );
    let deleted = cli_json(&admin_addr, &["dead", "delete", "--all"]);
    assert_eq!(deleted["deleted"], in_b, "{deleted}");
    stop.store(true, Ordering::Relaxed);
    let answered = prober.join().expect("the prober");
    assert!(answered > 0, "the text client was answered");
    assert_eq!(cli_json(&admin_addr, &["dead", "list"])["total"], 0);
    let status = admin(&h, "STATUS");
    assert_eq!(status["dead_messages_by_queue"], serde_json::json!({}), "{status}");
    assert_eq!(status["waiting_messages_by_queue"]["a"], in_a, "retried in full, none lost");
}

fn json(n: usize) -> Value {
    serde_json::json!(n)
}
