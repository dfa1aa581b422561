//! CURVE for the other peers (docs/security.md "CURVE" and "Python EventMQ
//! peers"): the unchanged Python EventMQ 0.3.13 jobmanager and client under
//! `scripts/emq-curve-launch.py`; what an observer on the wire sees of eMQP
//! with and without CURVE (a recording relay, `common::relay`);
//! emq-scheduler as a CURVE client of the router and with a CURVE admin
//! endpoint; emq-pubsub's CURVE endpoints. Keys are made at test time.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use emq::client::admin::AdminClient;
use emq::client::emqp::{Client, ClientError, Outcome, Publisher, Schedule, ScheduleAnswer};

use emq::curve::{connect_curve, read_public_key_file, read_secret_key_file, write_key_pair, ClientCurve};
use serde_json::Value;

use crate::common::admin::{request, workers};
use crate::common::interop::{begin, wait_schedulers, REGISTER_TIMEOUT};
use crate::common::ports::{free_port, is_listening, zmq_endpoint};
use crate::common::proc::{Child, TestDir};
use crate::common::refusals;
use crate::common::relay::Relay;
use crate::common::router::{rust_router_bin, Router, RouterKind};
use crate::common::{jobs, python, wait, watchdog};

/// A Rust router with `frontend_curve` and `backend_curve` and the test's keys.
struct CurveRouter {
    router: Router,
    frontend_curve: String,
    backend_curve: String,
    /// The router's public `.key`.
    server_key: PathBuf,
}

/// `dir/keys/NAME.key_secret` (its `.key` next to it), made with the library.
fn keygen(dir: &TestDir, name: &str) -> PathBuf {
    let d = dir.join("keys");
    std::fs::create_dir_all(&d).unwrap();
    write_key_pair(&d, name).unwrap().1
}

/// Copies the public half of `secret` into the allow-list `dir/allowed/<sub>`.
fn allow(dir: &TestDir, sub: &str, secret: &Path) {
    let public = secret.with_extension("key");
    std::fs::create_dir_all(dir.join("allowed").join(sub)).unwrap();
    std::fs::copy(&public, dir.join("allowed").join(sub).join(public.file_name().unwrap())).unwrap();
}

impl CurveRouter {
    /// Starts emq-router with CURVE endpoints next to the plain ones and
    /// the allow-lists `dir/allowed/{clients,workers}` (filled by [`allow`]
    /// before: the router reads them at start).
    fn start(dir: &TestDir) -> CurveRouter {
        let secret = keygen(dir, "router");
        for sub in ["clients", "workers"] {
            std::fs::create_dir_all(dir.join("allowed").join(sub)).unwrap();
        }
        let (fp, bp) = (free_port(), free_port());
        let (frontend_curve, backend_curve) = (zmq_endpoint(fp), zmq_endpoint(bp));
        let (key, clients, workers) = (
            secret.display().to_string(),
            dir.join("allowed/clients").display().to_string(),
            dir.join("allowed/workers").display().to_string(),
        );
        let extra = [
            "--frontend-curve",
            &frontend_curve,
            "--backend-curve",
            &backend_curve,
            "--curve-secret-key-file",
            &key,
            "--curve-clients-dir",
            &clients,
            "--curve-workers-dir",
            &workers,
        ];
        let mut router = Router::start_with(dir, RouterKind::Rust(rust_router_bin()), &extra);
        let up = wait::until(Duration::from_secs(30), || is_listening(fp) && is_listening(bp));
        assert!(up && router.child.is_alive(), "no CURVE endpoints:\n{}", router.child.log_tail(30));
        CurveRouter { router, frontend_curve, backend_curve, server_key: secret.with_extension("key") }
    }

    fn status(&self) -> Value {
        request(&self.router.admin, "STATUS").unwrap_or_else(|e| panic!("{e}\n{}", self.router.child.log_tail(30)))
    }

    /// A handshake count of the CURVE `socket` (`frontend`, `backend`).
    fn handshakes(&self, socket: &str, outcome: &str) -> u64 {
        self.status()["emq"]["curve"]["sockets"][socket]["handshakes"][outcome].as_u64().unwrap_or(0)
    }
}

/// The port of a `tcp://host:port` endpoint.
fn port_of(endpoint: &str) -> u16 {
    endpoint.rsplit(':').next().and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("no port in {endpoint}"))
}

#[test]
fn curve_python_jobmanager_and_client_under_the_launcher_run_a_job_a_stranger_gets_none() {
    let _turn = begin("curve_python_launcher", Duration::from_secs(300));
    let dir = TestDir::new("curve-python");
    let (jm_key, client_key, stranger) = (keygen(&dir, "jm"), keygen(&dir, "client"), keygen(&dir, "stranger"));
    allow(&dir, "workers", &jm_key);
    allow(&dir, "clients", &client_key);
    let r = CurveRouter::start(&dir);
    let queues = r#"[[10,"default"]]"#;

    // A jobmanager whose key is not in the allow-list: refused by ZAP.
    let mut bad =
        python::start_curve_jobmanager(&dir, (&stranger, &r.server_key), &r.backend_curve, "stranger", queues);
    let refused = wait::until(REGISTER_TIMEOUT, || r.handshakes("backend", "unknown_key") >= 1);
    assert!(refused, "no refused backend handshake: {}\n{}", r.status(), bad.log_tail(20));

    // The unchanged client (eventmq Sender + messages.defer_job) under the launcher.
    let out = dir.join("jobs.txt");
    let mut send =
        python::curve_launch_cmd(&client_key, &r.server_key, &python::interop_dir().join("emq_send_jobs.py"));
    send.args(["--frontend", &r.frontend_curve, "--count", "1", "--queues", "default", "--prefix", "cj"])
        .arg("--out")
        .arg(&out);
    let sent = python::run_script(&dir, "send-curve", &mut send);
    assert!(sent.contains("sent cj-00000-default default ") && sent.contains("total 1"), "{sent}");
    assert!(r.handshakes("frontend", "ok") >= 1, "{}", r.status());

    // The stranger gets no job: it stays queued (checked over a window: a
    // negative), and the router lists no worker.
    let queued = || r.status()["waiting_messages_by_queue"]["default"].as_u64() == Some(1);
    assert!(wait::until(Duration::from_secs(10), queued), "job not queued: {}", r.status());
    std::thread::sleep(Duration::from_secs(3));
    assert!(queued(), "the queued job left: {}", r.status());
    let listed = workers(&r.router.admin).unwrap();
    assert!(listed.is_empty(), "a refused jobmanager registered: {listed:?}");
    assert!(jobs::read(&out).is_empty(), "a job ran: {:?}", jobs::read(&out));
    assert!(bad.is_alive(), "the stranger jobmanager exited:\n{}", bad.log_tail(20));

    // The allowed jobmanager registers over CURVE and runs it once.
    let mut good = python::start_curve_jobmanager(&dir, (&jm_key, &r.server_key), &r.backend_curve, "good", queues);
    let ran = wait::until(REGISTER_TIMEOUT, || !jobs::by_tag(&jobs::read(&out), "run").is_empty());
    assert!(ran, "the job did not run: {}\n{}\n{}", r.status(), good.log_tail(20), r.router.child.log_tail(20));
    std::thread::sleep(Duration::from_secs(1));
    let runs = jobs::by_tag(&jobs::read(&out), "run");
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs["cj-00000-default"], vec!["good".to_string()], "{runs:?}");
    assert!(r.handshakes("backend", "ok") >= 1, "{}", r.status());
    good.terminate(Duration::from_secs(10));
    bad.terminate(Duration::from_secs(10));
}

/// An emq-worker on `backend` serving `queue`, CURVE when `curve` is
/// `(own .key_secret, server .key)`; its job script appends each body to
/// `dir/runs.txt`.
fn worker(dir: &TestDir, name: &str, backend: &str, queue: &str, curve: Option<(&Path, &Path)>) -> Child {
    let script = dir.join("job.sh");
    if !script.exists() {
        std::fs::write(&script, "#!/bin/sh\np=$(cat)\nprintf '%s\\n' \"$p\" >> \"$OUT\"\necho ok\n").unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_emq-worker"));
    cmd.args(["-B", backend, "-Q", queue, "--stats-interval", "0s"]).env("OUT", dir.join("runs.txt"));
    if let Some((key, server)) = curve {
        cmd.arg("--curve-key-file").arg(key).arg("--curve-server-key").arg(server);
    }
    cmd.arg("--").arg(&script);
    Child::spawn(name, &mut cmd, &dir.join(&format!("{name}.log")))
}

#[test]
fn emqp_over_curve_shows_no_plaintext_on_the_wire() {
    let _w = watchdog::start("emqp_no_plaintext", Duration::from_secs(120));
    let dir = TestDir::new("curve-wire");
    let key = keygen(&dir, "w1");
    allow(&dir, "workers", &key);
    let r = CurveRouter::start(&dir);
    let plain = Relay::start(port_of(&r.router.backend));
    let curved = Relay::start(port_of(&r.backend_curve));
    let mut client = Client::connect(&r.router.frontend).unwrap().with_timeout(Duration::from_secs(10));
    let runs = || std::fs::read_to_string(dir.join("runs.txt")).unwrap_or_default();
    // One worker at a time on `default`: the plain one, then the CURVE one.
    type Stage<'a> = (&'a str, &'a Relay, Option<(&'a Path, &'a Path)>, &'a str);
    let stages: [Stage; 2] = [
        ("w-plain", &plain, None, "BODY-MARKER-plain-7f3a"),
        ("w-curve", &curved, Some((&key, &r.server_key)), "BODY-MARKER-curve-7f3a"),
    ];
    for (name, relay, curve, body) in stages {
        let mut w = worker(&dir, name, &relay.endpoint, "default", curve);
        let outcome = client.request("default", "", body.as_bytes()).unwrap();
        assert!(matches!(outcome, Outcome::Accepted { .. }), "{name}: {outcome:?}");
        let ran = wait::until(Duration::from_secs(30), || runs().lines().any(|l| l == body));
        assert!(ran, "{body} did not run: {:?}\n{}\n{}", runs(), r.status(), w.log_tail(20));
        w.terminate(Duration::from_secs(10));
    }
    let text = runs();
    assert_eq!(text.lines().collect::<Vec<_>>(), ["BODY-MARKER-plain-7f3a", "BODY-MARKER-curve-7f3a"]);

    let words: [&[u8]; 5] = [b"BODY-MARKER", b"default", b"eMQP/1.0", b"REQUEST", b"INFORM"];
    for word in words {
        assert!(plain.saw(word), "plain backend: {:?} not on the wire", String::from_utf8_lossy(word));
        assert!(!curved.saw(word), "backend_curve: {:?} on the wire in plaintext", String::from_utf8_lossy(word));
    }
    assert!(curved.saw(b"CURVE"), "no CURVE mechanism in the greeting");
    assert!(!plain.saw(b"CURVE"), "the plain backend greeting names CURVE");
    assert_eq!((plain.connections(), curved.connections()), (1, 1));
    assert_eq!((plain.dropped(), curved.dropped()), (0, 0));
    assert!(plain.upstream().len() > 64 && curved.upstream().len() > 64);
}

/// An emq-scheduler connected to the router's `frontend_curve` as a CURVE
/// client (its key `client_key`, allowed in `allowed/clients`), its admin
/// only on CURVE at `admin` (its own key `own`, operators in `allowed/admins`).
fn curve_scheduler(dir: &TestDir, r: &CurveRouter, client_key: &Path, own: &Path, admin: &str) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_emq-scheduler"));
    cmd.args(["--frontend", &r.frontend_curve, "--scheduler-admin", "off", "--scheduler-admin-curve", admin])
        .arg("--curve-key-file")
        .arg(client_key)
        .arg("--curve-server-key")
        .arg(&r.server_key)
        .arg("--curve-secret-key-file")
        .arg(own)
        .arg("--curve-admins-dir")
        .arg(dir.join("allowed/admins"))
        .arg("--data-dir")
        .arg(dir.join("scheduler-data"));
    Child::spawn("scheduler", &mut cmd, &dir.join("scheduler.log"))
}

#[test]
fn curve_scheduler_runs_a_schedule_via_frontend_curve_and_answers_allowed_admins_only() {
    let _w = watchdog::start("curve_scheduler", Duration::from_secs(150));
    let dir = TestDir::new("curve-scheduler");
    let (client_key, own) = (keygen(&dir, "sched"), keygen(&dir, "sched-server"));
    let (admin_key, stranger) = (keygen(&dir, "admin"), keygen(&dir, "stranger"));
    allow(&dir, "clients", &client_key);
    allow(&dir, "admins", &admin_key);
    let r = CurveRouter::start(&dir);
    let admin_port = free_port();
    let admin = zmq_endpoint(admin_port);
    let mut sched = curve_scheduler(&dir, &r, &client_key, &own, &admin);
    let up = wait::until(Duration::from_secs(30), || !sched.is_alive() || is_listening(admin_port));
    assert!(up && sched.is_alive(), "scheduler did not start:\n{}", sched.log_tail(20));
    wait_schedulers(&r.router.admin, 1).unwrap_or_else(|e| panic!("{e}\n{}", sched.log_tail(20)));
    assert!(r.handshakes("frontend", "ok") >= 1, "{}", r.status());

    let mut w = worker(&dir, "w-sched", &r.router.backend, "default", None);
    let mut client = Client::connect(&r.router.frontend).unwrap().with_timeout(Duration::from_secs(10));
    let answer = client
        .schedule_confirmed(
            "default",
            &Schedule::Interval(1),
            crate::scheduler::BODY_1_2.replace("add", "curve_scheduled_job").as_bytes(),
            "",
        )
        .unwrap();
    assert!(matches!(answer, ScheduleAnswer::Accepted { .. }), "{answer:?}");
    let ran = wait::until(Duration::from_secs(30), || {
        std::fs::read_to_string(dir.join("runs.txt")).unwrap_or_default().contains("curve_scheduled_job")
    });
    assert!(ran, "the scheduled job did not run:\n{}\n{}", sched.log_tail(20), w.log_tail(20));

    let server = read_public_key_file(&own.with_extension("key")).unwrap();
    let keys = |k: &Path| ClientCurve { pair: read_secret_key_file(k).unwrap(), server_keys: vec![server] };
    let mut ok =
        AdminClient::connect_with(&admin, Some(&keys(&admin_key))).unwrap().with_timeout(Duration::from_secs(10));
    let rows = ok.query(b"SCHEDULES").unwrap();
    assert_eq!(rows.as_array().map(Vec::len), Some(1), "{rows}");
    assert_eq!((&rows[0]["queue"], &rows[0]["interval_secs"]), (&Value::from("default"), &Value::from(1)), "{rows}");
    // The four refusals, each counted in the scheduler's admin STATUS; a
    // refused operator gets no answer. The scheduler's own client key is
    // in another socket's allow-list (the router's clients).
    let status = || {
        let mut c =
            AdminClient::connect_with(&admin, Some(&keys(&admin_key))).unwrap().with_timeout(Duration::from_secs(10));
        c.query(b"STATUS").unwrap_or_else(|e| panic!("scheduler STATUS: {e}\n{}", sched.log_tail(20)))
    };
    let count = |outcome: &str| status()["curve"]["sockets"]["admin"]["handshakes"][outcome].as_u64().unwrap_or(0);
    let cases = refusals::four(&admin_key, &own.with_extension("key"), &stranger, &client_key);
    let attempt = |case: &refusals::Refusal| {
        let curve = case.key.as_deref().map(|k| ClientCurve {
            pair: read_secret_key_file(k).unwrap(),
            server_keys: vec![read_public_key_file(case.server.as_deref().unwrap()).unwrap()],
        });
        let mut c = AdminClient::connect_with(&admin, curve.as_ref()).unwrap().with_timeout(Duration::from_secs(3));
        let got = c.query(b"SCHEDULES");
        assert!(matches!(got, Err(ClientError::Unreachable { .. })), "{}: got {got:?}", case.name);
        got.is_ok()
    };
    refusals::check(&cases, attempt, count);
    let st = status();
    assert_eq!(st["curve"]["sockets"]["admin"]["endpoint"], Value::from(admin.as_str()), "{st}");
    assert!(st["curve"]["sockets"]["admin"]["handshakes"]["ok"].as_u64() >= Some(2), "{st}");
    assert!(st["curve"]["zap_requests"]["admin"]["400"].as_u64() >= Some(2), "{st}");
    // The same through emq-cli.
    let mut cli = Command::new(env!("CARGO_BIN_EXE_emq-cli"));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("EMQ_") {
            cli.env_remove(k);
        }
    }
    cli.args(["--scheduler-admin", &admin, "--json", "--timeout", "5s", "--curve-key-file"])
        .arg(&admin_key)
        .arg("--curve-server-key")
        .arg(own.with_extension("key"))
        .arg("scheduler-status");
    let (code, out, err) = crate::common::proc::run("emq-cli", &mut cli, &dir.path, Duration::from_secs(20));
    assert!(code.is_some_and(|c| c.success()), "{out}\n{err}");
    let shown: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert!(shown["curve"]["sockets"]["admin"]["handshakes"]["unknown_key"].as_u64() >= Some(2), "{shown}");
    w.terminate(Duration::from_secs(10));
    sched.terminate(Duration::from_secs(10));
}

/// A SUB socket subscribed to everything on `addr` as a CURVE client with
/// `key` and the device's public key `server`.
fn curve_subscriber(ctx: &zmq::Context, addr: &str, key: &Path, server: &Path) -> zmq::Socket {
    let sub = ctx.socket(zmq::SUB).unwrap();
    sub.set_linger(0).unwrap();
    sub.set_subscribe(b"").unwrap();
    let pair = read_secret_key_file(key).unwrap();
    connect_curve(&sub, addr, &pair, &read_public_key_file(server).unwrap()).unwrap();
    sub
}

/// An emq-pubsub with plain and CURVE endpoints (`e`: in, out, in CURVE,
/// out CURVE) and the test's keys: `publisher` and `subscriber` allowed,
/// `stranger` in no allow-list; `server` is the device's public key.
struct CurvePubSub {
    dir: TestDir,
    e: Vec<String>,
    publisher: PathBuf,
    subscriber: PathBuf,
    stranger: PathBuf,
    server: PathBuf,
    device: Child,
}

impl CurvePubSub {
    /// Starts it in a fresh `TestDir` named `name`; returns once it printed
    /// its endpoints (after every bind): no port probe, which the CURVE
    /// endpoints would count as a `no_detail` handshake.
    fn start(name: &str) -> CurvePubSub {
        let dir = TestDir::new(name);
        let own = keygen(&dir, "pubsub");
        let (publisher, subscriber, stranger) = (keygen(&dir, "pub1"), keygen(&dir, "sub1"), keygen(&dir, "stranger"));
        allow(&dir, "publishers", &publisher);
        allow(&dir, "subscribers", &subscriber);
        let e: Vec<String> = (0..4).map(|_| zmq_endpoint(free_port())).collect();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_emq-pubsub"));
        cmd.args([
            "--pubsub-in",
            &e[0],
            "--pubsub-out",
            &e[1],
            "--pubsub-in-curve",
            &e[2],
            "--pubsub-out-curve",
            &e[3],
        ])
        .arg("--curve-secret-key-file")
        .arg(&own)
        .arg("--curve-publishers-dir")
        .arg(dir.join("allowed/publishers"))
        .arg("--curve-subscribers-dir")
        .arg(dir.join("allowed/subscribers"));
        let mut device = Child::spawn("emq-pubsub", &mut cmd, &dir.join("pubsub.log"));
        let up =
            wait::until(Duration::from_secs(30), || !device.is_alive() || device.log_text().contains("emq-pubsub in="));
        assert!(up && device.is_alive(), "emq-pubsub did not start:\n{}", device.log_tail(20));
        let server = own.with_extension("key");
        CurvePubSub { dir, e, publisher, subscriber, stranger, server, device }
    }
}

#[test]
fn curve_pubsub_delivers_between_allowed_keys_and_refuses_unknown_ones() {
    let _w = watchdog::start("curve_pubsub", Duration::from_secs(90));
    let CurvePubSub { dir: _dir, e, publisher, subscriber, stranger, server, mut device } =
        CurvePubSub::start("curve-pubsub");
    let ctx = zmq::Context::new();
    let good = curve_subscriber(&ctx, &e[3], &subscriber, &server);
    let bad = curve_subscriber(&ctx, &e[3], &stranger, &server);
    let keys = |k: &Path| ClientCurve {
        pair: read_secret_key_file(k).unwrap(),
        server_keys: vec![read_public_key_file(&server).unwrap()],
    };
    // A stranger's PUBLISH never reaches the device.
    let mut intruder =
        Publisher::connect_with(&e[2], Some(&keys(&stranger))).unwrap().with_timeout(Duration::from_secs(2));
    let _ = intruder.publish(b"news", b"from-a-stranger");
    // The allowed publisher's does, to the allowed subscriber (published
    // until one arrives: a SUB joins a moment after it connects).
    let mut p = Publisher::connect_with(&e[2], Some(&keys(&publisher))).unwrap().with_timeout(Duration::from_secs(5));
    let mut got = None;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while got.is_none() && std::time::Instant::now() < deadline {
        p.publish(b"news", b"curve-hello").unwrap();
        if good.poll(zmq::POLLIN, 300).unwrap() > 0 {
            got = Some(good.recv_multipart(0).unwrap());
        }
    }
    assert_eq!(got, Some(vec![b"news".to_vec(), b"curve-hello".to_vec()]), "{}", device.log_tail(20));
    while good.poll(zmq::POLLIN, 500).unwrap() > 0 {
        let more = good.recv_multipart(0).unwrap();
        assert_eq!(more, vec![b"news".to_vec(), b"curve-hello".to_vec()], "a stranger's message was delivered");
    }
    assert_eq!(bad.poll(zmq::POLLIN, 0).unwrap(), 0, "a subscriber with an unknown key got a message");
    let log = device.log_text();
    assert!(log.contains("CURVE peer refused by ZAP"), "no refusal logged:\n{log}");
    drop((good, bad));
    device.terminate(Duration::from_secs(10));
}

/// A raw CURVE (`key`: `(own .key_secret, server .key)`) or plain ZeroMQ
/// socket of `kind` connected to `addr`, never reconnecting: a refused
/// one makes exactly one handshake.
fn once(ctx: &zmq::Context, kind: zmq::SocketType, addr: &str, key: Option<(&Path, &Path)>) -> zmq::Socket {
    let s = ctx.socket(kind).unwrap();
    s.set_linger(0).unwrap();
    s.set_reconnect_ivl(-1).unwrap();
    if kind == zmq::SUB {
        s.set_subscribe(b"").unwrap();
    }
    match key {
        Some((k, server)) => {
            connect_curve(&s, addr, &read_secret_key_file(k).unwrap(), &read_public_key_file(server).unwrap()).unwrap()
        }
        None => s.connect(addr).unwrap(),
    }
    s
}

/// `outcome=N` of `socket` (or `status=N` of a ZAP `domain`) in
/// emq-pubsub's exit line `CURVE handshakes: in ok=1 …; out …; ZAP
/// requests: publishers 200=1 400=2; …`.
fn exit_count(line: &str, socket: &str, outcome: &str) -> u64 {
    let part = line
        .split(": ")
        .flat_map(|p| p.split("; "))
        .find(|p| p.starts_with(&format!("{socket} ")))
        .unwrap_or_else(|| panic!("no {socket} in {line}"));
    let field = part.split(' ').find_map(|f| f.strip_prefix(&format!("{outcome}=")));
    field.and_then(|n| n.parse().ok()).unwrap_or(0)
}

#[test]
fn curve_pubsub_in_and_out_refuse_the_four_wrong_peers_nothing_passes_and_exit_counts_each() {
    let _w = watchdog::start("curve_pubsub_refusals", Duration::from_secs(120));
    let CurvePubSub { dir: _dir, e, publisher, subscriber, stranger, server, mut device } =
        CurvePubSub::start("curve-pubsub-refusals");
    let ctx = zmq::Context::new();
    // Out: the allowed subscriber, and the four refused ones (the other
    // socket's key is the publisher's).
    let good = once(&ctx, zmq::SUB, &e[3], Some((&subscriber, &server)));
    let out_cases = refusals::four(&subscriber, &server, &stranger, &publisher);
    let in_cases = refusals::four(&publisher, &server, &stranger, &subscriber);
    let peer = |kind, addr: &str, case: &refusals::Refusal| {
        once(&ctx, kind, addr, case.key.as_deref().map(|k| (k, case.server.as_deref().unwrap())))
    };
    let refused_subs: Vec<zmq::Socket> = out_cases.iter().map(|c| peer(zmq::SUB, &e[3], c)).collect();
    // In: each refused publisher sends a PUBLISH (queued by its DEALER
    // until a connection is up, which never comes).
    let refused_pubs: Vec<zmq::Socket> = in_cases
        .iter()
        .map(|c| {
            let d = peer(zmq::DEALER, &e[2], c);
            let body = format!("from-{}", c.name);
            let frames: [&[u8]; 6] = [b"", b"eMQP/1.0", b"PUBLISH", b"m1", b"news", body.as_bytes()];
            d.send_multipart(frames, zmq::DONTWAIT).unwrap();
            d
        })
        .collect();
    // The allowed publisher reaches the allowed subscriber (published
    // until one arrives: a SUB joins a moment after it connects).
    let keys = ClientCurve {
        pair: read_secret_key_file(&publisher).unwrap(),
        server_keys: vec![read_public_key_file(&server).unwrap()],
    };
    let mut p = Publisher::connect_with(&e[2], Some(&keys)).unwrap().with_timeout(Duration::from_secs(5));
    let mut got = None;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while got.is_none() && std::time::Instant::now() < deadline {
        p.publish(b"news", b"curve-hello").unwrap();
        if good.poll(zmq::POLLIN, 300).unwrap() > 0 {
            got = Some(good.recv_multipart(0).unwrap());
        }
    }
    assert_eq!(got, Some(vec![b"news".to_vec(), b"curve-hello".to_vec()]), "{}", device.log_tail(20));
    // Nothing of a refused publisher arrives; no refused subscriber gets
    // anything.
    while good.poll(zmq::POLLIN, 1000).unwrap() > 0 {
        let more = good.recv_multipart(0).unwrap();
        assert_eq!(more, vec![b"news".to_vec(), b"curve-hello".to_vec()], "a refused publisher's message arrived");
    }
    for (s, case) in refused_subs.iter().zip(&out_cases) {
        assert_eq!(s.poll(zmq::POLLIN, 0).unwrap(), 0, "refused subscriber ({}) got a message", case.name);
    }
    drop((good, refused_subs, refused_pubs, p));
    // The counts are only shown at exit.
    device.terminate(Duration::from_secs(10));
    let log = device.log_text();
    let line = log
        .lines()
        .find_map(|l| l.strip_prefix("emq-pubsub: CURVE handshakes: "))
        .map(|rest| format!("CURVE handshakes: {rest}"))
        .unwrap_or_else(|| panic!("no CURVE counts at exit:\n{log}"));
    // Each refused peer made one handshake (`once`); the plain one counts
    // as `mechanism_mismatch` or `no_detail` (`refusals::four`).
    for socket in ["in", "out"] {
        let want = [("unknown_key", 2), ("bad_server_key_or_protocol", 1)];
        for (outcome, n) in want {
            assert_eq!(exit_count(&line, socket, outcome), n, "{socket} {outcome}: {line}");
        }
        let plain = exit_count(&line, socket, "mechanism_mismatch") + exit_count(&line, socket, "no_detail");
        assert_eq!(plain, 1, "{socket} plain: {line}");
        assert!(exit_count(&line, socket, "ok") >= 1, "{line}");
    }
    for domain in ["publishers", "subscribers"] {
        assert_eq!(exit_count(&line, domain, "400"), 2, "{line}");
        assert!(exit_count(&line, domain, "200") >= 1, "{line}");
    }
}
