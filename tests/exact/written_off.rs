//! Point 3: tell written-off peers. A worker the router does not know
//! (expired, forgotten after KBYE, or never registered) is answered with
//! DISCONNECT and registers again at once: raw peers, `emq-worker` and the
//! real Python jobmanager get jobs within one heartbeat interval of
//! resuming from a pause past the timeout. A scheduler the router has
//! expired is re-admitted on its next HEARTBEAT (the real Python scheduler
//! dies on DISCONNECT), and `emq-scheduler` counts only router HEARTBEATs
//! as the router being alive.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::admin::admin;
use crate::common::interop::{begin, wait_schedulers, Setup};
use crate::common::proc::{Child, TestDir};
use crate::common::{admin as raw_admin, jobs, python, wait};
use crate::emqp_router::{config, eventually, Peer, Watchdog};

/// Stops or continues process `pid` (SIGSTOP / SIGCONT), as a long GC or a
/// debugger would.
fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) on a child this test started.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "kill({pid}, {sig})");
}

fn worker_count(h: &emq::router::RouterHandle) -> usize {
    admin(h, "ROUTER_SHOW_WORKERS")["connected_workers"].as_object().map_or(0, |m| m.len())
}

#[test]
fn a_raw_worker_written_off_is_told_disconnect_and_gets_its_job_back_after_re_informing() {
    let _w = Watchdog::new("raw_worker_written_off", 60);
    for shards in [1, 3] {
        let h = emq::router::start(config(shards, |r| {
            r.heartbeat_interval = Some("1s".into());
            r.heartbeat_timeout = Some("2s".into());
        }))
        .expect("router starts");
        let (w, _c) = super::worker_holding(&h, b"paused-raw", b"paused-client", "held");
        // Paused past the timeout: the router expires it and requeues "held".
        eventually(10, "worker expired", || worker_count(&h) == 0);
        let resumed = Instant::now();
        w.send(&[b"", b"eMQP/1.0", b"HEARTBEAT", b"hb-1", b"0"]);
        let told = w.expect("DISCONNECT");
        assert_eq!(told.len(), 4, "DISCONNECT has no body: {told:?}");
        w.inform_worker(r#"[[10, "default"]]"#);
        w.ready(1);
        assert_eq!(w.expect("REQUEST")[3], b"held");
        let took = resumed.elapsed();
        eprintln!("raw worker ({shards} shards): job again {took:?} after resuming");
        assert!(took < Duration::from_secs(1), "job again only {took:?} after resuming");

        // KBYE'd and forgotten (holding nothing): its next READY is answered
        // too; a KBYE is not.
        w.job_reply(b"held");
        w.send(&[b"", b"eMQP/1.0", b"KBYE", b"bye"]);
        eventually(10, "forgotten after KBYE", || worker_count(&h) == 0);
        w.send(&[b"", b"eMQP/1.0", b"KBYE", b"bye-again"]);
        w.expect_none("DISCONNECT", 300);
        w.ready(1);
        w.expect("DISCONNECT");
        // A peer that never registered: READY and a job REPLY are answered.
        let stranger = Peer::new(&h.endpoints.backend, b"stranger");
        stranger.ready(1);
        stranger.expect("DISCONNECT");
        stranger.job_reply(b"nothing");
        stranger.expect("DISCONNECT");
        let counters = &admin(&h, "STATUS")["emq"]["counters"];
        assert_eq!(counters["disconnects_to_unknown_workers"], 4, "{counters}");
    }
}

/// A job script for `emq-worker`: appends its payload and a newline to `$OUT`.
fn job_script(dir: &TestDir) -> std::path::PathBuf {
    let path = dir.join("job.sh");
    std::fs::write(&path, "#!/bin/sh\np=$(cat)\nprintf '%s\\n' \"$p\" >> \"$OUT\"\necho ok\n").expect("write script");
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    path
}

fn lines(out: &Path) -> Vec<String> {
    std::fs::read_to_string(out).unwrap_or_default().lines().map(String::from).collect()
}

#[test]
fn emq_worker_paused_past_its_timeout_registers_again_when_told() {
    let _w = Watchdog::new("emq_worker_paused", 90);
    // emq-worker heartbeats every 3 s: the router's timeout must exceed that.
    let h = emq::router::start(config(1, |r| {
        r.heartbeat_interval = Some("1s".into());
        r.heartbeat_timeout = Some("4s".into());
    }))
    .expect("router starts");
    let dir = TestDir::new("exact-emq-worker-paused");
    let out = dir.join("out.txt");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_emq-worker"));
    cmd.args(["-B", &h.endpoints.backend, "-Q", "default", "-J", "1", "--stats-interval", "0s", "--"])
        .arg(job_script(&dir))
        .env("OUT", &out)
        .env("RUST_LOG", "info");
    let worker = Child::spawn("emq-worker", &mut cmd, &dir.join("worker.log"));
    eventually(20, "emq-worker registered with 1 slot", || {
        admin(&h, "ROUTER_SHOW_WORKERS")["connected_workers"]
            .as_object()
            .is_some_and(|m| m.values().any(|w| w["available_slots"] == 1))
    });
    signal(worker.pid(), libc::SIGSTOP);
    eventually(20, "paused worker expired", || worker_count(&h) == 0);
    let c = emq::client::emqp::Client::connect(&h.endpoints.frontend).expect("client");
    let mut c = c.with_timeout(Duration::from_secs(5));
    let resumed = Instant::now();
    signal(worker.pid(), libc::SIGCONT);
    c.request("default", "", b"after-pause").expect("request accepted");
    let ran = wait::until(Duration::from_secs(15), || lines(&out).contains(&"after-pause".to_string()));
    let took = resumed.elapsed();
    assert!(ran, "the job never ran after the worker resumed\n{}", worker.log_tail(30));
    eprintln!("emq-worker: job ran {took:?} after SIGCONT");
    assert!(took < Duration::from_secs(3), "job ran {took:?} after resuming (one heartbeat interval: 3 s)");
    assert!(worker.log_text().contains("registering again"), "{}", worker.log_tail(30));
}

/// The Python body of `emq_interop_jobs.record(out, tag)`.
fn record_body(out: &Path, tag: &str) -> String {
    let call = emq::client::body::PythonCall::new("emq_interop_jobs", "record")
        .args(vec![out.to_string_lossy().into_owned().into(), tag.into()]);
    String::from_utf8(call.body()).expect("utf-8 body")
}

#[test]
fn interop_python_jobmanager_paused_past_its_timeout_gets_jobs_within_a_heartbeat_interval() {
    let _turn = begin("interop_paused_jobmanager", Duration::from_secs(180));
    let setup = Setup::start("exact-paused-jm", &[("P", r#"[[10,"default"]]"#)], 1);
    let pid = setup.jobmanagers[0].pid();
    let before = raw_admin::workers(&setup.router.admin).expect("workers");
    signal(pid, libc::SIGSTOP);
    let expired =
        wait::until(Duration::from_secs(30), || raw_admin::workers(&setup.router.admin).is_ok_and(|w| w.is_empty()));
    assert!(expired, "the paused jobmanager was not expired\n{}", setup.logs());
    let out = setup.dir.join("jobs.txt");
    let c = Peer::new(&setup.router.frontend, b"paused-jm-client");
    let resumed = Instant::now();
    signal(pid, libc::SIGCONT);
    c.request("after-pause", "default", "", &record_body(&out, "after-pause"));
    let ran =
        wait::until(Duration::from_secs(30), || !jobs::of_tag(&jobs::read(&out), "run", "after-pause").is_empty());
    let took = resumed.elapsed();
    assert!(ran, "the job never ran after the jobmanager resumed\n{}", setup.logs());
    let after = raw_admin::workers(&setup.router.admin).expect("workers");
    eprintln!(
        "Python jobmanager paused past the timeout: job ran {took:?} after SIGCONT (registered again as {:?}, \
         was {:?})",
        after.iter().map(|w| &w.id).collect::<Vec<_>>(),
        before.iter().map(|w| &w.id).collect::<Vec<_>>()
    );
    assert!(took < emq::limits::HEARTBEAT_INTERVAL, "job ran {took:?} after resuming\n{}", setup.logs());
}

#[test]
fn interop_python_scheduler_paused_past_its_timeout_is_registered_again_within_a_heartbeat_timeout() {
    let _turn = begin("interop_paused_scheduler", Duration::from_secs(180));
    let dir = TestDir::new("exact-paused-py-sched");
    let router = crate::common::router::Router::start(&dir);
    let sched = python::start_scheduler(&dir, &router.frontend);
    let ids = |m: &serde_json::Map<String, serde_json::Value>| m.keys().cloned().collect::<Vec<_>>();
    let first = wait_schedulers(&router.admin, 1).unwrap_or_else(|why| panic!("{why}\n{}", sched.log_tail(30)));
    signal(sched.pid(), libc::SIGSTOP);
    wait_schedulers(&router.admin, 0).unwrap_or_else(|why| panic!("not expired: {why}"));
    let resumed = Instant::now();
    signal(sched.pid(), libc::SIGCONT);
    let again = wait_schedulers(&router.admin, 1).unwrap_or_else(|why| panic!("{why}\n{}", sched.log_tail(30)));
    let took = resumed.elapsed();
    eprintln!("Python scheduler paused past the timeout: registered again {took:?} after SIGCONT");
    assert_eq!(ids(&again), ids(&first), "re-admitted under its identity");
    assert!(took < emq::limits::HEARTBEAT_TIMEOUT, "registered again only {took:?} after resuming");
    assert!(sched.log_text().contains("Received ACK"), "{}", sched.log_tail(20));
}

#[test]
fn emq_scheduler_paused_past_its_timeout_is_registered_again_within_a_heartbeat_timeout() {
    let _w = Watchdog::new("emq_scheduler_paused", 60);
    let h = emq::router::start(config(1, |r| {
        r.heartbeat_interval = Some("300ms".into());
        r.heartbeat_timeout = Some("1s".into());
    }))
    .expect("router starts");
    let dir = TestDir::new("exact-paused-rs-sched");
    let mut cmd = super::scheduler_cmd(&h.endpoints.frontend, "off", &dir.join("data"), "30s");
    let sched = Child::spawn("emq-scheduler", &mut cmd, &dir.join("scheduler.log"));
    let listed = || admin(&h, "ROUTER_SHOW_SCHEDULERS")["connected_schedulers"].clone();
    eventually(20, "registered", || listed().as_object().is_some_and(|m| m.len() == 1));
    let first = listed();
    signal(sched.pid(), libc::SIGSTOP);
    eventually(20, "expired", || listed().as_object().is_some_and(|m| m.is_empty()));
    let resumed = Instant::now();
    signal(sched.pid(), libc::SIGCONT);
    eventually(20, "registered again", || listed().as_object().is_some_and(|m| m.len() == 1));
    let took = resumed.elapsed();
    eprintln!("emq-scheduler paused past the timeout: registered again {took:?} after SIGCONT");
    assert_eq!(
        listed().as_object().map(|m| m.keys().collect::<Vec<_>>()),
        first.as_object().map(|m| m.keys().collect())
    );
    assert!(took < Duration::from_secs(1), "registered again only {took:?} after resuming");
}

#[test]
fn emq_scheduler_counts_only_router_heartbeats_as_the_router_being_alive() {
    let _w = Watchdog::new("emq_scheduler_symmetric_liveness", 60);
    let ctx = zmq::Context::new();
    let router = ctx.socket(zmq::ROUTER).expect("socket");
    router.set_linger(0).expect("linger");
    router.bind("tcp://127.0.0.1:*").expect("bind");
    let endpoint = router.get_last_endpoint().expect("endpoint").expect("utf-8");
    let dir = TestDir::new("exact-rs-sched-liveness");
    let mut cmd = super::scheduler_cmd(&endpoint, "off", &dir.join("data"), "1500ms");
    let sched = Child::spawn("emq-scheduler", &mut cmd, &dir.join("scheduler.log"));
    let recv = |ms: i64| -> Option<Vec<Vec<u8>>> {
        (router.poll(zmq::POLLIN, ms).unwrap_or(0) > 0).then(|| router.recv_multipart(0).expect("recv"))
    };
    let inform = std::iter::from_fn(|| recv(5000)).find(|f| f[3] == b"INFORM").expect("INFORM");
    let id = inform[0].clone();
    router.send_multipart([&id[..], b"", b"eMQP/1.0", b"ACK", b"ack", &inform[4]], 0).expect("ACK");
    let body = crate::scheduler::BODY_1_2.as_bytes();
    let frames: [&[u8]; 10] = [&id, b"", b"eMQP/1.0", b"SCHEDULE", b"s1", b"default", b"guarantee", b"1", body, b""];
    router.send_multipart(frames, 0).expect("SCHEDULE");
    // Acknowledge every REQUEST, never HEARTBEAT: the scheduler must still
    // decide the router has forgotten it and register again.
    let t0 = Instant::now();
    let again = loop {
        let f = recv(5000).unwrap_or_else(|| panic!("scheduler went quiet\n{}", sched.log_tail(20)));
        match f[3].as_slice() {
            b"REQUEST" => {
                router.send_multipart([&f[0][..], b"", b"eMQP/1.0", b"REPLY", b"r", &f[4]], 0).expect("REPLY");
            }
            b"INFORM" if f[0] != id => break f,
            _ => {}
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "never re-registered\n{}", sched.log_tail(20));
    };
    assert_eq!(again[6], b"scheduler");
    assert!(t0.elapsed() >= Duration::from_millis(1000), "re-registered too early: {:?}", t0.elapsed());
}
