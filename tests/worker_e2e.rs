//! emq-worker and the library Worker against the real router: every job
//! exactly once, no loss when a worker is killed, exact slot accounting
//! across worker restarts; emq-worker's drain at SIGTERM and SIGHUP, and
//! with a log that cannot be written.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use emq::client::emqp::{Client, Outcome};
use emq::client::worker::{DrainTimeoutHook, Worker, WorkerConfig};

use crate::common::admin::admin;
use crate::common::proc::{self, TestDir};
use crate::emqp_router::{config, eventually, Watchdog};

/// Kills the child (SIGKILL) when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
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
    let dir = TestDir::new("worker-1000");
    let out = dir.join("runs.txt");
    let _worker = emq_worker(&h.endpoints.backend, &script(&dir.path), &out, "0");
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
    let dir = TestDir::new("worker-kill");
    let out = dir.join("runs.txt");
    let job = script(&dir.path);
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

/// A ZeroMQ ROUTER playing the router's backend for one `emq-worker`, so
/// that a test sees the worker's exact REPLYs.
struct FakeRouter {
    _ctx: zmq::Context,
    sock: zmq::Socket,
    endpoint: String,
    worker: Vec<u8>,
}

impl FakeRouter {
    fn new() -> FakeRouter {
        let ctx = zmq::Context::new();
        let sock = ctx.socket(zmq::ROUTER).unwrap();
        sock.set_rcvtimeo(200).unwrap();
        sock.set_linger(0).unwrap();
        sock.bind("tcp://127.0.0.1:*").unwrap();
        let endpoint = sock.get_last_endpoint().unwrap().unwrap();
        FakeRouter { _ctx: ctx, sock, endpoint, worker: Vec::new() }
    }

    /// The next message with command `word` within `secs`, skipping
    /// HEARTBEATs and READYs: `[identity, "", "eMQP/1.0", word, msgid, …]`.
    fn expect(&self, word: &[u8], secs: u64) -> Vec<Vec<u8>> {
        let end = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < end {
            let Ok(frames) = self.sock.recv_multipart(0) else { continue };
            if frames[3] == word {
                return frames;
            }
            assert!(frames[3] == b"HEARTBEAT" || frames[3] == b"READY", "unexpected {frames:?}");
        }
        panic!("no {} within {secs} s", String::from_utf8_lossy(word));
    }

    /// Waits for the worker's INFORM and ACKs it.
    fn register(&mut self) {
        let inform = self.expect(b"INFORM", 10);
        self.worker = inform[0].clone();
        self.sock.send_multipart([&self.worker[..], b"", b"eMQP/1.0", b"ACK", b"ack-1", &inform[4]], 0).unwrap();
    }

    fn send_job(&self, msgid: &str, body: &[u8]) {
        self.send_job_with(msgid, b"reply-requested", body)
    }

    fn send_job_with(&self, msgid: &str, headers: &[u8], body: &[u8]) {
        let frames: [&[u8]; 8] = [&self.worker, b"", b"eMQP/1.0", b"REQUEST", msgid.as_bytes(), b"q", headers, body];
        self.sock.send_multipart(frames, 0).unwrap();
    }

    /// The next job-result REPLY: (request msgid, result, marked failed).
    fn reply(&self, secs: u64) -> (String, Vec<u8>, bool) {
        let r = self.expect(b"REPLY", secs);
        let failed = match r.get(7) {
            None => false,
            Some(f) if f == b"failed" => true,
            Some(f) => panic!("frame 6 {f:?}"),
        };
        assert!(r.len() <= 8, "{r:?}");
        (String::from_utf8(r[6].clone()).unwrap(), r[5].clone(), failed)
    }
}

/// `emq-worker` serving `fake`, running `script` with `DIR` set to `dir`.
fn worker_for(fake: &FakeRouter, dir: &TestDir, script: &Path, flags: &[&str]) -> proc::Child {
    proc::Child::spawn("emq-worker", &mut worker_cmd(fake, dir, script, flags), &dir.join("worker.log"))
}

/// The command [`worker_for`] starts.
fn worker_cmd(fake: &FakeRouter, dir: &TestDir, script: &Path, flags: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_emq-worker"));
    cmd.args(["-B", &fake.endpoint, "-Q", "q", "--silence-timeout", "60s", "--stats-interval", "0s"])
        .args(flags)
        .arg("--")
        .arg(script)
        .env("DIR", &dir.path);
    cmd
}

fn write_script(dir: &TestDir, body: &str) -> PathBuf {
    let path = dir.join("job.sh");
    std::fs::write(&path, format!("#!/bin/sh\n{body}")).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path
}

/// Process ids a job script wrote to `<dir>/<name>.pid`, waited for.
fn pid_file(dir: &TestDir, name: &str) -> i32 {
    let mut pid = None;
    eventually(10, "pid file", || {
        pid = std::fs::read_to_string(dir.join(&format!("{name}.pid"))).ok().and_then(|s| s.trim().parse().ok());
        pid.is_some()
    });
    pid.unwrap_or_default()
}

/// Whether `pid` has ended (gone, or a zombie waiting for its reaper).
fn ended(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

/// SIGKILLs processes a job script started (by PID, and the process group
/// of one that leads its own) when dropped, so that a failing test leaves
/// none behind.
struct Reap(Vec<i32>);

impl Drop for Reap {
    fn drop(&mut self) {
        for &pid in &self.0 {
            if !ended(pid) {
                // SAFETY: getpgid(2) and kill(2) on a process this test's job
                // script started (a job command leads its own group).
                unsafe {
                    if libc::getpgid(pid) == pid {
                        libc::kill(-pid, libc::SIGKILL);
                    }
                    libc::kill(pid, libc::SIGKILL);
                }
            }
        }
    }
}

#[test]
fn emq_worker_takes_timeout_0_as_no_limit_and_a_missing_header_as_its_timeout() {
    let _w = Watchdog::new("emq_worker_timeout_0", 30);
    let dir = TestDir::new("worker-timeout-0");
    let script = write_script(&dir, "sleep 2\necho done\n");
    let mut fake = FakeRouter::new();
    let _worker = worker_for(&fake, &dir, &script, &["-J", "3", "--timeout", "1s"]);
    fake.register();
    fake.send_job_with("no-limit", b"reply-requested,timeout:0", b"");
    fake.send_job_with("own-limit", b"reply-requested,timeout:5", b"");
    fake.send_job("default-limit", b"");
    let mut replies = vec![fake.reply(10), fake.reply(10), fake.reply(10)];
    replies.sort();
    let (timed_out, done) = (br#"{"value": "TimeoutError"}"#.to_vec(), br#"{"value": "done\n"}"#.to_vec());
    assert_eq!(
        replies,
        [
            ("default-limit".into(), timed_out, true),
            ("no-limit".into(), done.clone(), false),
            ("own-limit".into(), done, false)
        ]
    );
}

#[test]
fn emq_worker_timeout_covers_a_background_child_holding_stdout() {
    let _w = Watchdog::new("emq_worker_timeout_bg_child", 30);
    let dir = TestDir::new("worker-timeout-bg");
    // The command prints and exits at once, but leaves a child holding its
    // stdout for 30 s: in its process group (`bg`) or in a session of its own
    // (`setsid`, out of the group's reach).
    let script = write_script(
        &dir,
        "kind=$(cat)\n\
         case $kind in\n\
         bg) sleep 30 & echo $! > \"$DIR/bg.pid\" ;;\n\
         setsid) setsid sleep 30 & echo $! > \"$DIR/setsid.pid\" ;;\n\
         esac\n\
         echo parent-done\n",
    );
    let mut fake = FakeRouter::new();
    let _worker = worker_for(&fake, &dir, &script, &["-J", "2", "--timeout", "2s"]);
    fake.register();
    let start = Instant::now();
    fake.send_job("job-bg", b"bg");
    fake.send_job("job-setsid", b"setsid");
    let reap = Reap(vec![pid_file(&dir, "bg"), pid_file(&dir, "setsid")]);
    let mut replies = vec![fake.reply(10), fake.reply(10)];
    let took = start.elapsed();
    replies.sort();
    let timed_out = br#"{"value": "TimeoutError"}"#.to_vec();
    assert_eq!(replies, [("job-bg".into(), timed_out.clone(), true), ("job-setsid".into(), timed_out, true)]);
    assert!(took >= Duration::from_millis(1900) && took < Duration::from_secs(5), "{took:?}");
    // The child in the job's process group was killed with it.
    eventually(5, "background child killed", || ended(reap.0[0]));
}

#[test]
fn emq_worker_kills_running_commands_at_its_drain_timeout_and_reports_them_failed() {
    drain_kill_at(libc::SIGTERM);
}

/// SIGHUP (the terminal or ssh session closed) stops the worker as SIGTERM
/// does: KBYE, the drain, the running commands' process groups stopped and
/// their jobs reported failed, exit status 0.
#[test]
fn emq_worker_drains_at_sighup_as_at_sigterm() {
    drain_kill_at(libc::SIGHUP);
}

/// An `emq-worker` with two running jobs given `signal`: KBYE, then at its
/// drain timeout (1 s) both commands' groups get SIGTERM and a stubborn one
/// SIGKILL 2 s later; both jobs reported failed; the worker exits 0.
fn drain_kill_at(signal: i32) {
    let _w = Watchdog::new(&format!("emq_worker_drain_kill_{signal}"), 30);
    let dir = TestDir::new(&format!("worker-drain-kill-{signal}"));
    // `plain` dies of SIGTERM; `stubborn` ignores it (and so does its
    // sleep) and needs the SIGKILL 2 s later.
    let script = write_script(
        &dir,
        "kind=$(cat)\n\
         echo $$ > \"$DIR/$kind.pid\"\n\
         if [ \"$kind\" = stubborn ]; then trap '' TERM; fi\n\
         sleep 30\n\
         echo finished\n",
    );
    let mut fake = FakeRouter::new();
    let mut worker = worker_for(&fake, &dir, &script, &["-J", "2", "--drain-timeout", "1s"]);
    fake.register();
    fake.send_job("job-plain", b"plain");
    fake.send_job("job-stubborn", b"stubborn");
    let reap = Reap(vec![pid_file(&dir, "plain"), pid_file(&dir, "stubborn")]);
    let start = Instant::now();
    worker.signal(signal);
    fake.expect(b"KBYE", 5);
    // At the drain timeout (1 s) both groups get SIGTERM: `plain` ends at once.
    let plain = fake.reply(5);
    let plain_at = start.elapsed();
    let text = br#"{"value": "stopped at the worker's drain timeout: signal: 15 (SIGTERM)"}"#;
    assert_eq!(plain, ("job-plain".into(), text.to_vec(), true));
    assert!(plain_at >= Duration::from_millis(900) && plain_at < Duration::from_millis(2500), "{plain_at:?}");
    // 2 s later, SIGKILL for `stubborn`.
    let stubborn = fake.reply(5);
    let stubborn_at = start.elapsed();
    let text = br#"{"value": "stopped at the worker's drain timeout: signal: 9 (SIGKILL)"}"#;
    assert_eq!(stubborn, ("job-stubborn".into(), text.to_vec(), true));
    assert!(stubborn_at >= Duration::from_millis(2900) && stubborn_at < Duration::from_millis(4500), "{stubborn_at:?}");
    eventually(5, "worker exited", || !worker.is_alive());
    assert_eq!(worker.exit_status().and_then(|s| s.code()), Some(0));
    assert!(reap.0.iter().all(|&pid| ended(pid)), "a command outlived its worker");
    let log = worker.log_text();
    let summary = "emq-worker: jobs ok=0 failed=2 timed_out=0 abandoned=0;";
    assert!(log.contains(summary), "{}", worker.log_tail(20));
}

#[test]
fn emq_worker_with_its_log_pipe_closed_finishes_a_job_and_exits_0_at_sigterm() {
    let _w = Watchdog::new("emq_worker_log_pipe_closed", 30);
    let dir = TestDir::new("worker-log-pipe-closed");
    let script = write_script(&dir, "cat\n");
    let mut fake = FakeRouter::new();
    let mut cmd = worker_cmd(&fake, &dir, &script, &["--log", "debug"]);
    let pipe = proc::closed_pipe();
    cmd.stdout(pipe.try_clone().unwrap()).stderr(pipe);
    let mut worker = proc::Child::spawn_keeping_output("emq-worker", &mut cmd, &dir.join("worker.log"));
    fake.register();
    fake.send_job("job-1", b"done");
    assert_eq!(fake.reply(10), ("job-1".into(), br#"{"value": "done"}"#.to_vec(), false));
    worker.signal(libc::SIGTERM);
    fake.expect(b"KBYE", 5);
    // Its summary line at exit is lost too, and changes nothing.
    eventually(10, "worker exited", || !worker.is_alive());
    assert_eq!(worker.exit_status().and_then(|s| s.code()), Some(0));
}

#[test]
fn library_worker_reports_jobs_still_running_at_its_drain_timeout_failed() {
    let _w = Watchdog::new("worker_drain_abandon", 20);
    let fake_ctx = zmq::Context::new();
    let router = fake_ctx.socket(zmq::ROUTER).unwrap();
    router.set_rcvtimeo(5000).unwrap();
    router.set_linger(0).unwrap();
    router.bind("tcp://127.0.0.1:*").unwrap();
    let endpoint = router.get_last_endpoint().unwrap().unwrap();
    let over = WorkerConfig::new(&endpoint).concurrency(1025);
    let refused = Worker::start(over, |_| Ok(Vec::new())).err().map(|e| e.to_string());
    assert_eq!(refused.as_deref(), Some("worker config: concurrency 1025 is over the limit of 1024 jobs at once"));

    let (release_tx, release_rx) = crossbeam_channel::bounded::<()>(0);
    let mut config = WorkerConfig::new(&endpoint).concurrency(1);
    config.drain_timeout = Duration::from_millis(300);
    // A hook that was to stop the job (emq-worker kills its command here);
    // the handler ends only when the test lets it.
    config.on_drain_timeout = Some(DrainTimeoutHook(std::sync::Arc::new(|| {})));
    config.abandon_wait = Duration::ZERO;
    let worker = Worker::start(config, move |_| {
        let _ = release_rx.recv_timeout(Duration::from_secs(10));
        Ok(b"late".to_vec())
    })
    .unwrap();
    let inform = router.recv_multipart(0).unwrap();
    let id = inform[0].clone();
    router.send_multipart([&id[..], b"", b"eMQP/1.0", b"ACK", b"ack-1", &inform[4]], 0).unwrap();
    assert_eq!(router.recv_multipart(0).unwrap()[3], b"READY");
    router
        .send_multipart([&id[..], b"", b"eMQP/1.0", b"REQUEST", b"job-1", b"q", b"reply-requested", b"x"], 0)
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let start = Instant::now();
    let stats = std::thread::spawn(move || worker.shutdown());
    assert_eq!(router.recv_multipart(0).unwrap()[3], b"KBYE");
    let reply = router.recv_multipart(0).unwrap();
    let took = start.elapsed();
    let text = br#"{"value": "worker stopped: job abandoned at its drain timeout"}"#;
    assert_eq!(
        (&reply[3][..], &reply[5][..], &reply[6][..], reply.get(7)),
        (&b"REPLY"[..], &text[..], &b"job-1"[..], Some(&b"failed".to_vec()))
    );
    assert!(took >= Duration::from_millis(250) && took < Duration::from_secs(2), "{took:?}");
    let stats = stats.join().unwrap().unwrap();
    assert_eq!((stats.succeeded, stats.failed, stats.abandoned, stats.replies_sent), (0, 0, 1, 1));
    drop(release_tx);

    // Without a hook nothing stopped the handler: no failed REPLY (the
    // router would run the job again beside it); it holds the job for its
    // kbye_grace as before.
    let (release_tx, release_rx) = crossbeam_channel::bounded::<()>(0);
    let mut config = WorkerConfig::new(&endpoint).concurrency(1);
    config.drain_timeout = Duration::from_millis(300);
    let worker = Worker::start(config, move |_| {
        let _ = release_rx.recv_timeout(Duration::from_secs(10));
        Ok(b"late".to_vec())
    })
    .unwrap();
    let inform = loop {
        let m = router.recv_multipart(0).unwrap();
        if m[3] == b"INFORM" {
            break m;
        }
    };
    let id = inform[0].clone();
    router.send_multipart([&id[..], b"", b"eMQP/1.0", b"ACK", b"ack-2", &inform[4]], 0).unwrap();
    assert_eq!(router.recv_multipart(0).unwrap()[3], b"READY");
    router
        .send_multipart([&id[..], b"", b"eMQP/1.0", b"REQUEST", b"job-2", b"q", b"reply-requested", b"x"], 0)
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let stats = std::thread::spawn(move || worker.shutdown());
    assert_eq!(router.recv_multipart(0).unwrap()[3], b"KBYE");
    router.set_rcvtimeo(1000).unwrap();
    let after: Vec<Vec<u8>> = std::iter::from_fn(|| router.recv_multipart(0).ok()).map(|m| m[3].clone()).collect();
    assert!(!after.iter().any(|c| c == b"REPLY"), "no REPLY without a hook: {after:?}");
    let stats = stats.join().unwrap().unwrap();
    assert_eq!((stats.abandoned, stats.replies_sent), (1, 0));
    drop(release_tx);
}

#[test]
fn emq_worker_refuses_concurrency_over_its_limit() {
    let _w = Watchdog::new("emq_worker_max_concurrency", 30);
    let dir = TestDir::new("worker-max-j");
    for j in ["1025", "100000"] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_emq-worker"));
        cmd.args(["-B", "tcp://127.0.0.1:1", "-J", j, "--", "cat"]);
        let (status, out, err) = proc::run("emq-worker", &mut cmd, &dir.path, Duration::from_secs(10));
        assert_eq!(status.and_then(|s| s.code()), Some(1), "-J {j}: {err}");
        let why =
            "emq-worker: setting concurrency: must be at most 1024 (each job is a thread; run more workers for more)\n";
        assert_eq!((out.as_str(), err.as_str()), ("", why), "-J {j}");
    }
}

#[test]
fn emq_worker_output_over_its_cap_fails_the_job_and_a_reply_never_outgrows_the_router() {
    let _w = Watchdog::new("emq_worker_output_cap", 60);
    let dir = TestDir::new("worker-output-cap");
    // The body is `<count> <char>`: the command prints that many of that byte.
    let script = write_script(&dir, "read -r n c\nhead -c \"$n\" /dev/zero | tr '\\0' \"$c\"\n");
    let mut fake = FakeRouter::new();
    let _worker = worker_for(&fake, &dir, &script, &["-J", "1", "--timeout", "30s"]);
    fake.register();
    let cap = emq::limits::WORKER_MAX_OUTPUT_BYTES;
    assert_eq!(cap, 15 << 20);

    // Exactly the cap: the result, as it is.
    fake.send_job("job-at-cap", format!("{cap} x").as_bytes());
    let (id, result, failed) = fake.reply(20);
    assert_eq!((id.as_str(), failed, result.len()), ("job-at-cap", false, cap + 13));
    assert!(result.starts_with(br#"{"value": "xxx"#) && result.ends_with(br#"xx"}"#));

    // One byte more: the command is killed and the job fails, saying why.
    fake.send_job("job-over-cap", format!("{} x", cap + 1).as_bytes());
    let text = br#"{"value": "output over 15728640 bytes: job killed"}"#;
    assert_eq!(fake.reply(20), ("job-over-cap".into(), text.to_vec(), true));

    // 3 MiB of control bytes is 18 MiB of JSON (`\u0001` each): over the
    // worker's REPLY limit, so a short failed REPLY goes instead.
    fake.send_job("job-escaped", format!("{} \\001", 3 << 20).as_bytes());
    let size = "eMQP/1.0REPLY".len() + 36 + 6 * (3 << 20) + 13 + "job-escaped".len();
    let text = format!(
        r#"{{"value": "job result too big: its REPLY would be {size} bytes, over the worker's limit of {}"}}"#,
        emq::limits::WORKER_MAX_REPLY_BYTES
    );
    assert_eq!(fake.reply(20), ("job-escaped".into(), text.into_bytes(), true));
}

#[test]
fn emq_worker_max_reply_bytes_sets_its_reply_limit_exactly() {
    let _w = Watchdog::new("emq_worker_max_reply_bytes", 60);
    let dir = TestDir::new("worker-max-reply");
    let script = write_script(&dir, "read -r n c\nhead -c \"$n\" /dev/zero | tr '\\0' \"$c\"\n");
    let mut fake = FakeRouter::new();
    let _worker = worker_for(&fake, &dir, &script, &["-J", "1", "--max-reply-bytes", "2000"]);
    fake.register();
    // A REPLY's frames: "", "eMQP/1.0", "REPLY", a 36-byte msgid, the result
    // (`{"value": "…"}`, 13 bytes more than the output) and the request's
    // msgid: 1,932 bytes of output from "job-at" make exactly 2,000.
    fake.send_job("job-at", b"1932 x");
    let (id, result, failed) = fake.reply(20);
    assert_eq!((id.as_str(), failed, result.len()), ("job-at", false, 1932 + 13));
    // One byte more: a failed REPLY naming the size and the limit.
    fake.send_job("job-ov", b"1933 x");
    let text = br#"{"value": "job result too big: its REPLY would be 2001 bytes, over the worker's limit of 2000"}"#;
    assert_eq!(fake.reply(20), ("job-ov".into(), text.to_vec(), true));
}

#[test]
fn emq_worker_matched_to_a_router_with_a_low_max_message_bytes_reports_a_large_result_failed() {
    let _w = Watchdog::new("emq_worker_matched_reply_limit", 60);
    // ZeroMQ drops a REPLY over twice max_message_bytes and 4 KiB (20 KiB
    // here, every frame but the last counted 64 bytes more) with the
    // connection: a 24,000-byte result would never arrive. The worker
    // matched to the router sends a failed REPLY instead, at once.
    let h = emq::router::start(config(1, |r| r.max_message_bytes = Some(8192))).unwrap();
    let dir = TestDir::new("worker-matched-reply");
    let script = write_script(&dir, "read -r n c\nhead -c \"$n\" /dev/zero | tr '\\0' \"$c\"\n");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_emq-worker"));
    cmd.args(["-B", &h.endpoints.backend, "-Q", "default", "--stats-interval", "0s", "--", script.to_str().unwrap()])
        .env("EMQ_WORKER_MAX_REPLY_BYTES", (8192 - 1024).to_string());
    let _worker = proc::Child::spawn("emq-worker", &mut cmd, &dir.join("worker.log"));
    let mut c = Client::connect(&h.endpoints.frontend).unwrap().with_timeout(Duration::from_secs(5));
    let outcome = c.request("default", "retry:0", b"24000 x").unwrap();
    assert!(matches!(outcome, Outcome::Accepted { .. }), "{outcome:?}");
    let counters = h.counters();
    let n = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    eventually(20, "the failed REPLY ends the job", || n(&counters.dead_lettered) == 1);
    assert_eq!((n(&counters.completed_jobs), n(&counters.rejected_too_big)), (1, 0));
}
