//! The `emq-scheduler` binary against a fake router (a raw zmq ROUTER in the
//! test): registration, heartbeats, SCHEDULE → REQUEST byte-exact, ERROR on
//! malformed messages, UNSCHEDULE, the admin socket, KBYE on SIGTERM, restart
//! after kill -9 with the same data directory, a log that cannot be written.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::scheduler::BODY_1_2;

type Frames = Vec<Vec<u8>>;
/// A malformed message case: msgid, D-frames, expected ERROR code.
type BadCase<'a> = (&'a [u8], Vec<&'a [u8]>, &'a [u8]);

pub use crate::common::watchdog::start as watchdog;

/// An `emq-scheduler` child process, killed (by PID) on drop.
struct Scheduler {
    child: Child,
    log: std::path::PathBuf,
}

impl Scheduler {
    fn start(router: &str, admin_port: u16, data_dir: &Path, log: &Path) -> Scheduler {
        Scheduler::start_logging_to(router, admin_port, data_dir, std::fs::File::create(log).unwrap().into(), log)
    }

    /// Like [`Scheduler::start`], its stderr (debug log) going to `stderr`
    /// (`log` is only named).
    fn start_logging_to(router: &str, admin_port: u16, data_dir: &Path, stderr: Stdio, log: &Path) -> Scheduler {
        let child = Command::new(env!("CARGO_BIN_EXE_emq-scheduler"))
            .args(["--router-addr", router, "--admin-addr", &format!("tcp://127.0.0.1:{admin_port}")])
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--heartbeat-interval", "300ms", "--inform-retry", "400ms", "--router-timeout", "20s"])
            .env("RUST_LOG", "debug")
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap();
        Scheduler { child, log: log.to_path_buf() }
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's PID.
        let rc = unsafe { libc_kill(self.child.id() as i32, sig) };
        assert_eq!(rc, 0);
    }

    fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let end = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < end, "scheduler did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- scheduler log ---\n{}", std::fs::read_to_string(&self.log).unwrap_or_default());
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A raw ROUTER socket standing in for emq-router's frontend.
struct FakeRouter {
    sock: zmq::Socket,
    endpoint: String,
    _ctx: zmq::Context,
}

impl FakeRouter {
    fn bind() -> FakeRouter {
        let ctx = zmq::Context::new();
        let sock = ctx.socket(zmq::ROUTER).unwrap();
        sock.set_linger(0).unwrap();
        sock.bind("tcp://127.0.0.1:*").unwrap();
        let endpoint = sock.get_last_endpoint().unwrap().unwrap();
        FakeRouter { sock, endpoint, _ctx: ctx }
    }

    fn recv(&self, limit: Duration) -> Option<Frames> {
        let ms = limit.as_millis() as i64;
        (self.sock.poll(zmq::POLLIN, ms).unwrap() > 0).then(|| self.sock.recv_multipart(0).unwrap())
    }

    /// The next message whose command (R3) is `cmd`, skipping others.
    fn expect(&self, cmd: &str, limit: Duration) -> Frames {
        let end = Instant::now() + limit;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let f = self.recv(left).unwrap_or_else(|| panic!("no {cmd} within {limit:?}"));
            if f[3] == cmd.as_bytes() {
                return f;
            }
        }
    }

    /// All messages with command `cmd` in the next `window`.
    fn collect(&self, cmd: &str, window: Duration) -> Vec<Frames> {
        let end = Instant::now() + window;
        let mut out = Vec::new();
        while let Some(f) = self.recv(end.saturating_duration_since(Instant::now())) {
            if f[3] == cmd.as_bytes() {
                out.push(f);
            }
        }
        out
    }

    fn send(&self, id: &[u8], dframes: &[&[u8]]) {
        let mut frames: Vec<&[u8]> = vec![id];
        frames.extend_from_slice(dframes);
        self.sock.send_multipart(frames, 0).unwrap();
    }

    /// Waits for INFORM (checking its exact frames) and ACKs it.
    fn register(&self) -> Vec<u8> {
        let inform = self.expect("INFORM", Duration::from_secs(5));
        assert_eq!(inform.len(), 8, "D6: the scheduler's name (emq extension)");
        assert_eq!(&inform[1..4], &[b"".to_vec(), b"eMQP/1.0".to_vec(), b"INFORM".to_vec()]);
        assert_eq!((inform[0].len(), inform[4].len()), (36, 36), "uuid4 identity and msgid");
        assert_eq!(&inform[5..7], &[b"".to_vec(), b"scheduler".to_vec()]);
        assert_eq!(inform[7].len(), 36, "a uuid4 name made at first start");
        let id = inform[0].clone();
        self.send(&id, &[b"", b"eMQP/1.0", b"ACK", b"ack-1", &inform[4]]);
        id
    }
}

fn schedule_frames<'a>(
    cmd: &'a [u8],
    msgid: &'a [u8],
    interval: &'a [u8],
    body: &'a [u8],
    cron: &'a [u8],
) -> Vec<&'a [u8]> {
    vec![b"", b"eMQP/1.0", cmd, msgid, b"default", b"guarantee", interval, body, cron]
}

fn assert_request(f: &Frames, queue: &str, body: &str) {
    assert_eq!(f.len(), 8, "REQUEST has 8 R-frames");
    assert_eq!(&f[1..4], &[b"".to_vec(), b"eMQP/1.0".to_vec(), b"REQUEST".to_vec()]);
    assert_eq!(f[4].len(), 36, "fresh uuid4 msgid");
    assert_eq!(&f[5..], &[queue.as_bytes().to_vec(), b"reply-requested".to_vec(), body.as_bytes().to_vec()]);
}

fn admin_schedules(port: u16) -> serde_json::Value {
    let ctx = zmq::Context::new();
    let s = ctx.socket(zmq::DEALER).unwrap();
    s.set_linger(0).unwrap();
    s.connect(&format!("tcp://127.0.0.1:{port}")).unwrap();
    s.send_multipart([&b""[..], b"eMQP/1.0", b"SCHEDULES", b"admin:1"], 0).unwrap();
    assert!(s.poll(zmq::POLLIN, 5000).unwrap() > 0, "no SCHEDULES reply");
    let reply = s.recv_multipart(0).unwrap();
    assert_eq!(&reply[..3], &[b"".to_vec(), b"eMQP/1.0".to_vec(), b"REPLY".to_vec()]);
    serde_json::from_slice(&reply[4]).unwrap()
}

#[test]
fn scheduler_end_to_end_with_fake_router() {
    let _w = watchdog("scheduler_end_to_end_with_fake_router", Duration::from_secs(60));
    let dir = tempfile::tempdir().unwrap();
    let router = FakeRouter::bind();
    let admin_port = free_port();
    let mut sched = Scheduler::start(&router.endpoint, admin_port, &dir.path().join("data"), &dir.path().join("log"));
    // The first INFORM goes unanswered: it must be re-sent (J18).
    let first = router.expect("INFORM", Duration::from_secs(5));
    let id = router.register();
    assert_eq!(first[0], id, "re-sent on the same connection");
    let hb = router.expect("HEARTBEAT", Duration::from_secs(3));
    assert_eq!((hb.len(), hb[0].as_slice()), (6, id.as_slice()));

    let body = BODY_1_2.as_bytes();
    let t0 = Instant::now();
    router.send(&id, &schedule_frames(b"SCHEDULE", b"c1c2c3c4-d5d6-4e7e-8f8f-909192939495", b"1", body, b""));
    let haste = router.expect("REQUEST", Duration::from_secs(2));
    assert_request(&haste, "default", BODY_1_2);
    let next = router.expect("REQUEST", Duration::from_secs(3));
    assert_request(&next, "default", BODY_1_2);
    assert_ne!(haste[4], next[4], "fresh msgid per firing");
    assert!(t0.elapsed() >= Duration::from_millis(990), "second run after one interval: {:?}", t0.elapsed());

    // Malformed messages: ERROR each, and the job keeps firing.
    let bad_body = br#"["run", {"path": "m", "callable": "f"}]"#;
    let cases: Vec<BadCase> = vec![
        (b"m-short", schedule_frames(b"SCHEDULE", b"m-short", b"1", body, b"")[..8].to_vec(), b"BAD_FRAMES"),
        (b"m-int", schedule_frames(b"SCHEDULE", b"m-int", b"soon", body, b""), b"BAD_INTERVAL"),
        (b"m-zero", schedule_frames(b"SCHEDULE", b"m-zero", b"0", body, b""), b"BAD_INTERVAL"),
        (b"m-cron", schedule_frames(b"SCHEDULE", b"m-cron", b"-1", body, b"every day"), b"BAD_CRON"),
        (b"m-body", schedule_frames(b"SCHEDULE", b"m-body", b"5", bad_body, b""), b"BAD_BODY"),
        (b"m-utf8", schedule_frames(b"SCHEDULE", b"m-utf8", b"5", b"[\xff]", b""), b"BAD_ENCODING"),
        (b"m-unsched", schedule_frames(b"UNSCHEDULE", b"m-unsched", b"-1", b"nope", b""), b"BAD_BODY"),
    ];
    for (msgid, frames, code) in &cases {
        router.send(&id, frames);
        let err = router.expect("ERROR", Duration::from_secs(3));
        assert_eq!(err.len(), 8);
        assert_eq!((&err[5][..], &err[6][..]), (&msgid[..], &code[..]), "{}", String::from_utf8_lossy(&err[7]));
    }
    assert_request(&router.expect("REQUEST", Duration::from_secs(3)), "default", BODY_1_2);

    // A repeated identical SCHEDULE: no extra haste run.
    router.send(&id, &schedule_frames(b"SCHEDULE", b"again", b"1", body, b""));
    let listed = admin_schedules(admin_port);
    assert_eq!(listed.as_array().unwrap().len(), 1);
    assert_eq!(listed[0]["key"], "9e1e59012f7f704b21daedd11ff7b4900b19e107");
    assert_eq!((listed[0]["kind"].as_str(), listed[0]["interval_secs"].as_u64()), (Some("interval"), Some(1)));
    assert!(listed[0]["next_fire"].as_str().unwrap().ends_with('Z'));
    let in_2s = router.collect("REQUEST", Duration::from_millis(2200));
    assert!((1..=3).contains(&in_2s.len()), "about one per second, got {}", in_2s.len());

    // UNSCHEDULE without D8 stops it.
    let mut unsched = schedule_frames(b"UNSCHEDULE", b"u-1", b"-1", body, b"");
    unsched.pop();
    router.send(&id, &unsched);
    let end = Instant::now() + Duration::from_secs(5);
    while !admin_schedules(admin_port).as_array().unwrap().is_empty() {
        assert!(Instant::now() < end, "UNSCHEDULE not applied");
    }
    router.collect("REQUEST", Duration::from_millis(200));
    assert!(router.collect("REQUEST", Duration::from_millis(2500)).is_empty());

    sched.signal(15);
    let kbye = router.expect("KBYE", Duration::from_secs(5));
    assert_eq!((kbye.len(), kbye[0].as_slice(), kbye[3].as_slice()), (5, id.as_slice(), &b"KBYE"[..]));
    assert!(sched.wait_exit(Duration::from_secs(5)).success());
}

#[test]
fn scheduler_with_its_log_pipe_closed_still_fires_and_stops_at_sigterm() {
    let _w = watchdog("scheduler_log_pipe_closed", Duration::from_secs(60));
    let dir = tempfile::tempdir().unwrap();
    let router = FakeRouter::bind();
    let pipe = crate::common::proc::closed_pipe().into();
    let log = dir.path().join("log (a closed pipe)");
    let mut sched = Scheduler::start_logging_to(&router.endpoint, free_port(), &dir.path().join("data"), pipe, &log);
    let id = router.register();
    router.send(&id, &schedule_frames(b"SCHEDULE", b"s-1", b"1", BODY_1_2.as_bytes(), b""));
    // The haste run, then one a second later: the log lines of both lost.
    assert_request(&router.expect("REQUEST", Duration::from_secs(3)), "default", BODY_1_2);
    assert_request(&router.expect("REQUEST", Duration::from_secs(3)), "default", BODY_1_2);
    sched.signal(15);
    router.expect("KBYE", Duration::from_secs(5));
    assert_eq!(sched.wait_exit(Duration::from_secs(5)).code(), Some(0));
}

#[test]
fn scheduler_restores_after_kill_9_and_sigterm() {
    let _w = watchdog("scheduler_restores_after_kill_9_and_sigterm", Duration::from_secs(60));
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let router = FakeRouter::bind();
    let admin_port = free_port();
    let mut sched = Scheduler::start(&router.endpoint, admin_port, &data, &dir.path().join("log1"));
    let id = router.register();
    let body = BODY_1_2.as_bytes();
    router.send(&id, &schedule_frames(b"SCHEDULE", b"s-1", b"1", body, b""));
    let cron_body = BODY_1_2.replace("[1, 2]", "[3]");
    let mut cron = schedule_frames(b"SCHEDULE", b"s-2", b"-1", cron_body.as_bytes(), b"0 0 1 1 *");
    cron[4] = b"email";
    cron[5] = b"nohaste";
    router.send(&id, &cron);
    router.expect("REQUEST", Duration::from_secs(3));
    assert_eq!(admin_schedules(admin_port).as_array().unwrap().len(), 2);

    sched.child.kill().unwrap(); // SIGKILL
    sched.wait_exit(Duration::from_secs(5));
    drop(sched);
    router.collect("REQUEST", Duration::from_millis(100));

    for (round, log) in [(1, "log2"), (2, "log3")] {
        let mut sched = Scheduler::start(&router.endpoint, admin_port, &data, &dir.path().join(log));
        let new_id = router.register();
        assert_ne!(new_id, id);
        // Restored without haste: the interval job fires about 1 s after the restart.
        let req = router.expect("REQUEST", Duration::from_secs(4));
        assert_eq!(req[0], new_id);
        assert_request(&req, "default", BODY_1_2);
        let listed = admin_schedules(admin_port);
        let rows = listed.as_array().unwrap();
        assert_eq!(rows.len(), 2, "round {round}: {listed}");
        let cron_row = rows.iter().find(|r| r["kind"] == "cron").unwrap();
        assert_eq!((cron_row["queue"].as_str(), cron_row["cron"].as_str()), (Some("email"), Some("0 0 1 1 *")));
        sched.signal(15);
        router.expect("KBYE", Duration::from_secs(5));
        assert!(sched.wait_exit(Duration::from_secs(5)).success());
    }
}

#[test]
fn scheduler_reconnects_under_new_identity_when_router_is_silent() {
    let _w = watchdog("scheduler_reconnects_under_new_identity_when_router_is_silent", Duration::from_secs(30));
    let dir = tempfile::tempdir().unwrap();
    let router = FakeRouter::bind();
    let child = Command::new(env!("CARGO_BIN_EXE_emq-scheduler"))
        .args(["--router-addr", &router.endpoint, "--admin-addr", "off", "--router-timeout", "1500ms"])
        .args(["--heartbeat-interval", "300ms"])
        .arg("--data-dir")
        .arg(dir.path())
        .stderr(std::fs::File::create(dir.path().join("log")).unwrap())
        .spawn()
        .unwrap();
    let _sched = Scheduler { child, log: dir.path().join("log") };
    let first = router.register();
    let t0 = Instant::now();
    // No heartbeats from this router: after ~1.5 s the scheduler re-INFORMs as someone else.
    let second = router.expect("INFORM", Duration::from_secs(5));
    assert_ne!(second[0], first);
    assert!(t0.elapsed() >= Duration::from_millis(1000), "reconnected too early: {:?}", t0.elapsed());
}

/// A `redis-server` child on a free port, killed by PID on drop.
struct RedisServer {
    child: Child,
    url: String,
}

impl RedisServer {
    fn start() -> Option<RedisServer> {
        let port = free_port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .ok()?;
        let url = format!("redis://127.0.0.1:{port}/0");
        let server = RedisServer { child, url };
        let client = redis::Client::open(server.url.as_str()).unwrap();
        let end = Instant::now() + Duration::from_secs(5);
        while client.get_connection().is_err() {
            assert!(Instant::now() < end, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(server)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn scheduler_redis_store_uses_eventmq_layout() {
    let _w = watchdog("scheduler_redis_store_uses_eventmq_layout", Duration::from_secs(60));
    let Some(redis_server) = RedisServer::start() else {
        panic!("this test needs Debian's redis-server on PATH (`apt-get install redis-server`; .ci/run installs it)");
    };
    let mut con = redis::Client::open(redis_server.url.as_str()).unwrap().get_connection().unwrap();
    // A record written by a Python scheduler (spec V21 layout) for another job.
    let py_body = BODY_1_2.replace("[1, 2]", "[7]");
    let py_key = emq::scheduler::key::key_body(py_body.as_bytes()).unwrap().key;
    let py_value = emq::scheduler::redis_store::encode_record(&emq::scheduler::store::Stored {
        record: ["email".into(), "guarantee".into(), "30".into(), py_body, String::new()],
        runs_left: None,
        next_fire: None,
    });
    let _: () = redis::cmd("SET").arg(py_key.as_str()).arg(&py_value).query(&mut con).unwrap();
    let _: () = redis::cmd("LPUSH").arg("interval_jobs").arg(py_key.as_str()).query(&mut con).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let router = FakeRouter::bind();
    let admin_port = free_port();
    let start = |log: &str| {
        let child = Command::new(env!("CARGO_BIN_EXE_emq-scheduler"))
            .args(["--router-addr", &router.endpoint, "--admin-addr", &format!("tcp://127.0.0.1:{admin_port}")])
            .args(["--redis", &redis_server.url])
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .stderr(std::fs::File::create(dir.path().join(log)).unwrap())
            .spawn()
            .unwrap();
        Scheduler { child, log: dir.path().join(log) }
    };
    let mut sched = start("log1");
    let id = router.register();
    router.send(&id, &schedule_frames(b"SCHEDULE", b"s-1", b"60", BODY_1_2.as_bytes(), b""));
    router.expect("REQUEST", Duration::from_secs(3));
    let key = "9e1e59012f7f704b21daedd11ff7b4900b19e107";
    let v21 = r#"["default", "guarantee", "60", "[\"run\", {\"callable\": \"add\", \"path\": \"jobs_mod\", \"args\": [1, 2], \"kwargs\": {}, \"class_args\": [], \"class_kwargs\": {}}]", ""]"#;
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let value: Option<String> = redis::cmd("GET").arg(key).query(&mut con).unwrap();
        if value.as_deref() == Some(v21) {
            break;
        }
        assert!(Instant::now() < end, "record not written: {value:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let listed: Vec<String> = redis::cmd("LRANGE").arg("interval_jobs").arg(0).arg(-1).query(&mut con).unwrap();
    assert_eq!(listed, vec![key.to_string(), py_key.to_string()]);
    sched.child.kill().unwrap();
    sched.wait_exit(Duration::from_secs(5));
    drop(sched);

    let mut sched = start("log2");
    let id = router.register();
    let rows = admin_schedules(admin_port);
    let mut keys: Vec<&str> = rows.as_array().unwrap().iter().map(|r| r["key"].as_str().unwrap()).collect();
    keys.sort();
    let mut want = vec![key, py_key.as_str()];
    want.sort();
    assert_eq!(keys, want);
    router.send(&id, &schedule_frames(b"UNSCHEDULE", b"u-1", b"-1", BODY_1_2.as_bytes(), b""));
    let end = Instant::now() + Duration::from_secs(5);
    while admin_schedules(admin_port).as_array().unwrap().len() != 1 {
        assert!(Instant::now() < end, "UNSCHEDULE not applied");
    }
    let exists: i64 = redis::cmd("EXISTS").arg(key).query(&mut con).unwrap();
    let listed: Vec<String> = redis::cmd("LRANGE").arg("interval_jobs").arg(0).arg(-1).query(&mut con).unwrap();
    assert_eq!((exists, listed), (0, vec![py_key.to_string()]));
    sched.signal(15);
    assert!(sched.wait_exit(Duration::from_secs(5)).success());
}

/// utime + stime of `pid` in clock ticks (/proc/<pid>/stat fields 14 and 15).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after.split(' ').collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// Measurement, not an assertion: idle CPU of a scheduler holding 10,000
/// schedules. Run with `cargo test --test tests scheduler_idle_cpu -- --ignored --nocapture`.
#[test]
#[ignore = "30 s measurement; run by hand"]
fn scheduler_idle_cpu_10k() {
    let _w = watchdog("scheduler_idle_cpu_10k", Duration::from_secs(120));
    let dir = tempfile::tempdir().unwrap();
    let router = FakeRouter::bind();
    let admin_port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_emq-scheduler"))
        .args(["--router-addr", &router.endpoint, "--admin-addr", &format!("tcp://127.0.0.1:{admin_port}")])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let sched = Scheduler { child, log: dir.path().join("none") };
    let id = router.register();
    let t0 = Instant::now();
    for i in 0..10_000 {
        let body = BODY_1_2.replace("[1, 2]", &format!("[{i}]"));
        let interval = (3600 + i).to_string();
        let mut f = schedule_frames(b"SCHEDULE", b"m", interval.as_bytes(), body.as_bytes(), b"");
        f[5] = b"nohaste";
        router.send(&id, &f);
        // Pace the sends: a ROUTER drops messages past its high-water mark.
        if i % 500 == 499 {
            while admin_schedules(admin_port).as_array().unwrap().len() <= i as usize {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    assert_eq!(admin_schedules(admin_port).as_array().unwrap().len(), 10_000);
    println!("10,000 SCHEDULEs stored in {:?}", t0.elapsed());
    let pid = sched.child.id();
    let before = cpu_ticks(pid);
    let t1 = Instant::now();
    while t1.elapsed() < Duration::from_secs(30) {
        router.send(&id, &[b"", b"eMQP/1.0", b"HEARTBEAT", b"hb", b"0"]);
        router.collect("HEARTBEAT", Duration::from_secs(3));
    }
    let ticks = cpu_ticks(pid) - before;
    let secs = t1.elapsed().as_secs_f64();
    println!("idle CPU over {secs:.1} s: {ticks} ticks (1 tick = 10 ms) = {:.3}% of one core", ticks as f64 / secs);
    assert!(cpu_ticks(pid) >= before);
}
