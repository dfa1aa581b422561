//! emq-worker and the library Worker against the real router: every job
//! exactly once, no loss when a worker is killed, exact slot accounting
//! across worker restarts.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use emq::client::emqp::{Client, Outcome};
use emq::client::worker::{Worker, WorkerConfig};

use crate::emqp_router::{admin, config, eventually, Watchdog};

/// Kills the child (SIGKILL) when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("emq-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A job script that appends `<payload>\n` to `$OUT` in one write, after
/// `$DELAY` seconds.
fn script(dir: &Path) -> PathBuf {
    let path = dir.join("job.sh");
    std::fs::write(&path, "#!/bin/sh\np=$(cat)\nsleep \"${DELAY:-0}\"\nprintf '%s\\n' \"$p\" >> \"$OUT\"\necho ok\n")
        .unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path
}

fn emq_worker(backend: &str, script: &Path, out: &Path, delay: &str) -> Killed {
    let child = Command::new(env!("CARGO_BIN_EXE_emq-worker"))
        .args(["-B", backend, "-Q", "default", "-J", "4", "--stats-interval", "0s", "--"])
        .arg(script)
        .env("OUT", out)
        .env("DELAY", delay)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("emq-worker starts");
    Killed(child)
}

fn runs(out: &Path) -> HashMap<String, usize> {
    let mut m = HashMap::new();
    for line in std::fs::read_to_string(out).unwrap_or_default().lines() {
        *m.entry(line.to_string()).or_default() += 1;
    }
    m
}

fn send_jobs(frontend: &str, ids: std::ops::Range<usize>) {
    let mut c = Client::connect(frontend).unwrap().with_timeout(Duration::from_secs(5));
    for i in ids {
        let outcome = c.request("default", "", format!("job-{i}").as_bytes()).unwrap();
        assert!(matches!(outcome, Outcome::Accepted { .. }), "job-{i}: {outcome:?}");
    }
}

#[test]
fn emq_worker_runs_1000_jobs_exactly_once() {
    let _w = Watchdog::new("emq_worker_1000", 240);
    let h = emq::router::start(config(1, |_| {})).unwrap();
    let dir = temp_dir("worker-1000");
    let out = dir.join("runs.txt");
    let _worker = emq_worker(&h.endpoints.backend, &script(&dir), &out, "0");
    send_jobs(&h.endpoints.frontend, 0..1000);
    let end = Instant::now() + Duration::from_secs(200);
    while runs(&out).len() < 1000 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(100));
    }
    let r = runs(&out);
    assert_eq!(r.len(), 1000, "every job ran");
    assert!(r.values().all(|&n| n == 1), "each exactly once");
    eventually(10, "all completed", || h.counters().completed_jobs.load(std::sync::atomic::Ordering::Relaxed) == 1000);
}

#[test]
fn killing_emq_worker_mid_run_loses_no_job() {
    let _w = Watchdog::new("emq_worker_kill", 120);
    let h = emq::router::start(config(2, |r| {
        r.heartbeat_interval = Some("300ms".into());
        r.heartbeat_timeout = Some("1s".into());
    }))
    .unwrap();
    let dir = temp_dir("worker-kill");
    let out = dir.join("runs.txt");
    let job = script(&dir);
    let mut first = emq_worker(&h.endpoints.backend, &job, &out, "0.3");
    send_jobs(&h.endpoints.frontend, 0..40);
    eventually(30, "some jobs done", || runs(&out).len() >= 5);
    first.0.kill().unwrap();
    let _ = first.0.wait();
    let _second = emq_worker(&h.endpoints.backend, &job, &out, "0");
    // A job process orphaned by the kill may have read a cut payload and
    // written a junk line: look for every job id, not for 40 lines.
    eventually(60, "all 40 jobs ran", || {
        let r = runs(&out);
        (0..40).all(|i| r.contains_key(&format!("job-{i}")))
    });
    // The killed worker's in-flight jobs come back when it expires, and run
    // again (at-least-once: its orphaned job processes may have finished them).
    eventually(30, "in-flight jobs requeued", || {
        h.counters().requeued_jobs.load(std::sync::atomic::Ordering::Relaxed) >= 1
    });
    eventually(30, "requeued jobs ran", || {
        let s = admin(&h, "STATUS");
        s["waiting_messages_by_queue"] == serde_json::json!({})
            && s["inflight_messages_by_queue"] == serde_json::json!({})
    });
}

fn total_slots(h: &emq::router::RouterHandle) -> i64 {
    let w = admin(h, "ROUTER_SHOW_WORKERS");
    w["connected_workers"].as_object().unwrap().values().map(|v| v["available_slots"].as_i64().unwrap()).sum()
}

#[test]
fn restarted_library_worker_never_inflates_slots() {
    let _w = Watchdog::new("worker_restart_slots", 60);
    let h = emq::router::start(config(1, |_| {})).unwrap();
    let start = || {
        let cfg = WorkerConfig::new(&h.endpoints.backend).queues(vec![(10, "default".into())]).concurrency(3);
        Worker::start(cfg, |job| {
            if job.body == b"slow" {
                std::thread::sleep(Duration::from_millis(300));
            }
            Ok(b"null".to_vec())
        })
        .unwrap()
    };
    for round in 0..3 {
        let w = start();
        eventually(10, "3 slots", || total_slots(&h) == 3);
        send_jobs(&h.endpoints.frontend, round * 10..round * 10 + 2);
        let mut c = Client::connect(&h.endpoints.frontend).unwrap();
        c.send_request("default", "", b"slow").unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert!(total_slots(&h) <= 3, "round {round}: {}", admin(&h, "ROUTER_SHOW_WORKERS"));
        w.shutdown().unwrap();
        eventually(10, "worker gone", || total_slots(&h) == 0);
    }
    let status = admin(&h, "STATUS");
    assert_eq!(status["waiting_messages_by_queue"], serde_json::json!({}), "{status}");
}
