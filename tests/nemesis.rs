//! The nemesis, short schedule (issue 30): `loadtest/nemesis.sh --schedule
//! short` under a time limit, asserting the checker's verdict.
//!
//! The harness (docs/nemesis.md) puts three nats-servers, an owner router
//! and a standby router of one name (`durability = "replicated"`), a
//! producer and an emq-worker each in a network namespace on a bridge,
//! and runs every fault kind once (kill -9 of each process, SIGSTOP,
//! partitions, the owner cut off from the NATS majority, the producer
//! cut off from the owner, a one-way cut, 5 % packet loss, 100-400 ms of
//! delay through its proxy), then drains and checks the history.
//!
//! Asserted: the harness's exit status is 0; `verdict.json` says pass with
//! 0 acknowledged jobs lost, 0 executed jobs never sent, 0 acknowledgements
//! by a fenced router after its fence, no duplicate outside a fault's
//! window, every fault recovered; `leftovers.json` is empty and no
//! namespace or link named with the run's id exists afterwards. About 2-3
//! minutes; the seed is `EMQ_NEMESIS_SEED` (default 30) and printed.
//!
//! Needs root and network namespaces (and iptables, nats-server, the
//! Python venv with pyzmq): elsewhere it prints one line why it skips;
//! under CI (`CI=true`, root) it must not skip and fails instead.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::common::proc::{Child, TestDir};
use crate::common::{nats, python, wait, watchdog};

/// The harness's own limit; past it the test stops it (SIGTERM: it tears
/// down) and fails, well before the watchdog's SIGKILL.
const RUN_LIMIT: Duration = Duration::from_secs(600);

/// How long the harness may take to tear down after SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(90);

/// Why this machine cannot run the nemesis, if it cannot.
fn cannot_run() -> Option<String> {
    // SAFETY: plain syscall without arguments.
    if unsafe { libc::geteuid() } != 0 {
        return Some("it needs root (network namespaces, iptables)".into());
    }
    if Command::new("iptables").arg("--version").output().map_or(true, |o| !o.status.success()) {
        return Some("no iptables (apt-get install iptables; .ci/run installs it)".into());
    }
    let probe = format!("emqprobe{}", std::process::id());
    let made = Command::new("ip").args(["netns", "add", &probe]).output();
    let _ = Command::new("ip").args(["netns", "del", &probe]).output();
    match made {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!("`ip netns add` is refused here: {}", String::from_utf8_lossy(&o.stderr).trim())),
        Err(e) => Some(format!("cannot run `ip`: {e}")),
    }
}

/// The harness, stopped with SIGTERM (so that it tears down) when dropped.
struct Harness(Child);

impl Drop for Harness {
    fn drop(&mut self) {
        if self.0.is_alive() {
            self.0.terminate(STOP_GRACE);
        }
    }
}

#[test]
fn nemesis_short_schedule_loses_nothing_acknowledged() {
    const TEST: &str = "nemesis_short_schedule_loses_nothing_acknowledged";
    if let Some(why) = cannot_run() {
        assert!(std::env::var("CI").map_or(true, |v| v != "true"), "{TEST} must run under CI (root): {why}");
        eprintln!("skipped: {TEST}: {why}");
        return;
    }
    let Some(nats_bin) = nats::server_or_skip(TEST) else { return };
    let _dog = watchdog::start(TEST, RUN_LIMIT + STOP_GRACE + Duration::from_secs(60));
    let venv = python::venv();
    let _one_cluster = nats::exclusive();
    let dir = TestDir::new("nemesis");
    let out = dir.join("results");
    let bin_dir = PathBuf::from(env!("CARGO_BIN_EXE_emq-router")).parent().map(PathBuf::from).unwrap_or_default();
    let seed = std::env::var("EMQ_NEMESIS_SEED").unwrap_or_else(|_| "30".into());
    eprintln!("{TEST}: seed {seed}, results in {}", out.display());
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut cmd = Command::new("bash");
    cmd.arg(root.join("loadtest/nemesis.sh"))
        .args(["--schedule", "short", "--seed", &seed, "--out"])
        .arg(&out)
        .env("EMQ_BIN_DIR", &bin_dir)
        .env("EMQ_NATS_SERVER", &nats_bin)
        .env("EMQ_BENCH_PYTHON", venv.join("bin").join("python"))
        .current_dir(&root);
    let mut harness = Harness(Child::spawn("nemesis.sh", &mut cmd, &dir.join("nemesis.log")));
    let finished = wait::until(RUN_LIMIT, || !harness.0.is_alive());
    if !finished {
        harness.0.terminate(STOP_GRACE);
        panic!("the nemesis did not finish in {RUN_LIMIT:?}\n{}", harness.0.log_tail(40));
    }
    let status = harness.0.exit_status();
    let log = harness.0.log_tail(60);
    let verdict: serde_json::Value = std::fs::read(out.join("verdict.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_else(|| panic!("no verdict.json in {}\n{log}", out.display()));
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap_or_default();
    eprintln!("{summary}");
    assert_eq!(verdict["lost"], 0, "acknowledged jobs lost: {}\n{log}", verdict["lost_msgids"]);
    assert_eq!(verdict["phantom"], 0, "executed, never sent: {}", verdict["phantom_msgids"]);
    assert_eq!(verdict["fenced_acks"], 0, "acks by a fenced router: {}", verdict["fenced_ack_examples"]);
    assert_eq!(verdict["unexplained_duplicates"], 0, "duplicates: {}", verdict["unexplained_examples"]);
    assert_eq!(verdict["unrecovered_faults"], serde_json::json!([]), "faults without recovery\n{log}");
    assert_eq!(verdict["leftovers"], serde_json::json!([]), "left behind by the teardown");
    assert!(verdict["acked"].as_u64().unwrap_or(0) > 1000, "too few acknowledged jobs: {}", verdict["acked"]);
    assert_eq!(verdict["faults"].as_u64(), Some(14), "every fault kind once: {}", verdict["fault_kinds"]);
    assert_eq!(verdict["pass"], true, "{verdict}");
    assert_eq!(status.and_then(|s| s.code()), Some(0), "nemesis.sh exit status\n{log}");
    // nothing of the run left, checked here too
    let run: serde_json::Value = std::fs::read(out.join("run.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_else(|| panic!("no run.json"));
    let id = run["id"].as_str().unwrap_or("none").to_string();
    let netns = Command::new("ip").args(["netns", "list"]).output().map(|o| o.stdout).unwrap_or_default();
    let links = Command::new("ip").args(["-o", "link", "show"]).output().map(|o| o.stdout).unwrap_or_default();
    let prefix = format!("{id}-");
    assert!(!String::from_utf8_lossy(&netns).contains(&prefix), "a namespace of run {id} is left");
    assert!(!String::from_utf8_lossy(&links).contains(&prefix), "a link of run {id} is left");
}
