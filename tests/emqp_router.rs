//! emq-router over eMQP with raw ZeroMQ peers: exact frames (docs/emqp.md "Messages"),
//! each scenario with one shard and with several.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use emq::config::{RawRouterConfig, RouterConfig};
use emq::router::RouterHandle;

use crate::common::admin::admin;

type Frames = Vec<Vec<u8>>;

pub use crate::common::watchdog::Watchdog;

pub fn config(shards: usize, tweak: impl FnOnce(&mut RawRouterConfig)) -> RouterConfig {
    let mut raw = RawRouterConfig {
        frontend_addr: Some("tcp://127.0.0.1:*".into()),
        backend_addr: Some("tcp://127.0.0.1:*".into()),
        admin_addr: Some("tcp://127.0.0.1:*".into()),
        text_addr: Some("off".into()),
        metrics: Some(String::new()),
        shards: Some(shards),
        drain_timeout: Some("200ms".into()),
        data_dir: Some(crate::common::data::fresh()),
        // EventMQ's unknown-queue rule from the first second.
        queue_learn_grace: Some("0s".into()),
        ..Default::default()
    };
    tweak(&mut raw);
    raw.validate().expect("test config is valid")
}

pub fn router(shards: usize) -> RouterHandle {
    emq::router::start(config(shards, |_| {})).expect("router starts")
}

/// A DEALER peer with a fixed identity.
pub struct Peer {
    pub sock: zmq::Socket,
    _ctx: zmq::Context,
}

impl Peer {
    pub fn new(endpoint: &str, identity: &[u8]) -> Peer {
        let ctx = zmq::Context::new();
        let sock = ctx.socket(zmq::DEALER).unwrap();
        if !identity.is_empty() {
            sock.set_identity(identity).unwrap();
        }
        sock.set_linger(0).unwrap();
        sock.connect(endpoint).unwrap();
        Peer { sock, _ctx: ctx }
    }

    pub fn send(&self, frames: &[&[u8]]) {
        self.sock.send_multipart(frames.iter(), 0).unwrap();
    }

    /// Next message within `ms`, or `None`.
    pub fn recv_within(&self, ms: i64) -> Option<Frames> {
        let mut items = [self.sock.as_poll_item(zmq::POLLIN)];
        zmq::poll(&mut items, ms).unwrap();
        items[0].is_readable().then(|| self.sock.recv_multipart(0).unwrap())
    }

    /// Next message whose command (frame 2) is `cmd`, skipping heartbeats and
    /// anything else; panics after 5 s.
    pub fn expect(&self, cmd: &str) -> Frames {
        let end = Instant::now() + Duration::from_secs(5);
        while Instant::now() < end {
            if let Some(f) = self.recv_within(100) {
                if f.get(2).map(|c| c.as_slice()) == Some(cmd.as_bytes()) {
                    return f;
                }
            }
        }
        panic!("no {cmd} within 5 s");
    }

    /// Asserts no message with command `cmd` arrives within `ms`.
    pub fn expect_none(&self, cmd: &str, ms: u64) {
        let end = Instant::now() + Duration::from_millis(ms);
        while Instant::now() < end {
            if let Some(f) = self.recv_within(50) {
                assert_ne!(f.get(2).map(|c| c.as_slice()), Some(cmd.as_bytes()), "unexpected {cmd}: {f:?}");
            }
        }
    }

    /// INFORM as a worker with `queues` JSON, then wait for the ACK.
    pub fn inform_worker(&self, queues: &str) {
        self.send(&[b"", b"eMQP/1.0", b"INFORM", b"inform-1", queues.as_bytes(), b"worker"]);
        let ack = self.expect("ACK");
        assert_eq!(ack[4], b"inform-1");
    }

    pub fn ready(&self, n: usize) {
        for _ in 0..n {
            self.send(&[b"", b"eMQP/1.0", b"READY", b"r"]);
        }
    }

    pub fn request(&self, msgid: &str, queue: &str, headers: &str, body: &str) {
        self.send(&[
            b"",
            b"eMQP/1.0",
            b"REQUEST",
            msgid.as_bytes(),
            queue.as_bytes(),
            headers.as_bytes(),
            body.as_bytes(),
        ]);
    }

    pub fn job_reply(&self, request_msgid: &[u8]) {
        self.send(&[b"", b"eMQP/1.0", b"REPLY", b"rep", b"{\"value\": null}", request_msgid]);
    }
}

/// Polls `f` until true or `secs` pass.
pub fn eventually(secs: u64, what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("not reached within {secs} s: {what}");
}

const BODY: &str = r#"["run", {"callable": "add", "path": "jobs_mod", "args": [2, 3], "kwargs": {}, "class_args": [], "class_kwargs": {}}]"#;
const W: &[u8] = b"7f3c2a9e-1b4d-4c8a-9e2f-5a6b7c8d9e01";
const C: &[u8] = b"0d9e8f7a-6b5c-4d3e-8f1a-2b3c4d5e6f70";

fn each_shards(f: impl Fn(usize)) {
    for shards in [1, 3] {
        f(shards);
    }
}

#[test]
fn inform_gets_ack_then_heartbeat() {
    let _w = Watchdog::new("inform_gets_ack_then_heartbeat", 30);
    each_shards(|n| {
        let h = router(n);
        let w = Peer::new(&h.endpoints.backend, W);
        w.send(&[b"", b"eMQP/1.0", b"INFORM", b"1c0e5b3a", br#"[[10, "default"], [5, "email"]]"#, b"worker"]);
        let ack = w.recv_within(5000).expect("ACK");
        assert_eq!(&ack[..3], &[&b""[..], b"eMQP/1.0", b"ACK"]);
        assert_eq!(ack[3].len(), 36, "fresh uuid4 msgid");
        assert_eq!(ack[4], b"1c0e5b3a");
        let hb = w.recv_within(5000).expect("HEARTBEAT right after the ACK");
        assert_eq!(hb[2], b"HEARTBEAT");
        assert_eq!(hb.len(), 5);
    });
}

#[test]
fn request_dispatch_v5_v6_v7() {
    let _w = Watchdog::new("request_dispatch_v5_v6_v7", 30);
    each_shards(|n| {
        let h = router(n);
        let w = Peer::new(&h.endpoints.backend, W);
        w.inform_worker(r#"[[10, "default"], [5, "email"]]"#);
        w.ready(1);
        let c = Peer::new(&h.endpoints.frontend, C);
        std::thread::sleep(Duration::from_millis(100));
        c.request("f0e1d2c3-b4a5-4968-8776-655443322110", "email", "reply-requested,timeout:30", BODY);
        let req = w.expect("REQUEST");
        let want: Frames = [
            &b""[..],
            b"eMQP/1.0",
            b"REQUEST",
            b"f0e1d2c3-b4a5-4968-8776-655443322110",
            b"email",
            b"reply-requested,timeout:30",
            BODY.as_bytes(),
        ]
        .iter()
        .map(|f| f.to_vec())
        .collect();
        assert_eq!(req, want);
        let rep = c.expect("REPLY");
        assert_eq!(rep.len(), 5);
        assert_eq!(rep[4], b"f0e1d2c3-b4a5-4968-8776-655443322110");
    });
}

#[test]
fn queued_request_is_acked_and_dispatched_on_ready_with_reply_requested() {
    let _w = Watchdog::new("queued_request", 30);
    each_shards(|n| {
        let h = router(n);
        let w = Peer::new(&h.endpoints.backend, W);
        w.inform_worker(r#"[[10, "default"]]"#);
        let c = Peer::new(&h.endpoints.frontend, C);
        c.request("m-1", "default", "guarantee", "{}");
        assert_eq!(c.expect("REPLY")[4], b"m-1", "acceptance REPLY for a queued REQUEST");
        w.expect_none("REQUEST", 200);
        w.ready(1);
        let req = w.expect("REQUEST");
        assert_eq!(req[3], b"m-1");
        assert_eq!(req[5], b"reply-requested,guarantee", "the broker asks for the job-result REPLY");
    });
}

#[test]
fn unknown_queue_falls_back_to_default_keeping_d4() {
    let _w = Watchdog::new("unknown_queue", 30);
    each_shards(|n| {
        let h = router(n);
        let w = Peer::new(&h.endpoints.backend, W);
        w.inform_worker(r#"[[10, "default"]]"#);
        w.ready(2);
        let c = Peer::new(&h.endpoints.frontend, C);
        std::thread::sleep(Duration::from_millis(100));
        c.request("m-unknown", "no-such-queue", "", "{}");
        let req = w.expect("REQUEST");
        assert_eq!((req[3].as_slice(), req[4].as_slice()), (&b"m-unknown"[..], &b"no-such-queue"[..]));
    });
}

/// Right after a start (or a take-over), a REQUEST for a queue no worker
/// has declared yet keeps its queue for `queue_learn_grace`: the worker of
/// that queue, registering a moment later, gets it; a `default` worker
/// does not (docs/emqp.md "Unknown queues").
#[test]
fn within_the_learn_grace_an_undeclared_queue_keeps_its_job() {
    let _w = Watchdog::new("learn_grace", 30);
    let h = emq::router::start(config(1, |c| c.queue_learn_grace = Some("30s".into()))).expect("router starts");
    let d = Peer::new(&h.endpoints.backend, W);
    d.inform_worker(r#"[[10, "default"]]"#);
    d.ready(2);
    let c = Peer::new(&h.endpoints.frontend, C);
    std::thread::sleep(Duration::from_millis(100));
    c.request("m-early", "reports", "", "{}");
    c.expect("REPLY");
    d.expect_none("REQUEST", 300);
    let r = Peer::new(&h.endpoints.backend, b"worker-reports");
    r.inform_worker(r#"[[10, "reports"]]"#);
    r.ready(1);
    let req = r.expect("REQUEST");
    assert_eq!((req[3].as_slice(), req[4].as_slice()), (&b"m-early"[..], &b"reports"[..]));
}

#[test]
fn dead_worker_jobs_go_to_the_survivor() {
    let _w = Watchdog::new("dead_worker", 60);
    each_shards(|n| {
        let cfg = config(n, |r| {
            r.heartbeat_interval = Some("200ms".into());
            r.heartbeat_timeout = Some("800ms".into());
        });
        let h = emq::router::start(cfg).unwrap();
        let w1 = Peer::new(&h.endpoints.backend, b"w1");
        w1.inform_worker(r#"[[10, "default"]]"#);
        w1.ready(2);
        let c = Peer::new(&h.endpoints.frontend, C);
        std::thread::sleep(Duration::from_millis(100));
        c.request("job-a", "default", "", "a");
        c.request("job-b", "default", "", "b");
        assert_eq!(w1.expect("REQUEST")[3], b"job-a");
        assert_eq!(w1.expect("REQUEST")[3], b"job-b");
        // w1 goes silent; w2 arrives and keeps heartbeating.
        let w2 = Peer::new(&h.endpoints.backend, b"w2");
        w2.inform_worker(r#"[[10, "default"]]"#);
        w2.ready(2);
        let mut got = Vec::new();
        let end = Instant::now() + Duration::from_secs(10);
        while got.len() < 2 && Instant::now() < end {
            w2.send(&[b"", b"eMQP/1.0", b"HEARTBEAT", b"hb", b"0"]);
            if let Some(f) = w2.recv_within(100) {
                if f[2] == b"REQUEST" {
                    got.push(f[3].clone());
                }
            }
        }
        assert_eq!(got, vec![b"job-a".to_vec(), b"job-b".to_vec()], "requeued at the front, in order ({n} shards)");
        assert!(h.counters().expired_workers.load(Ordering::Relaxed) >= 1);
    });
}

#[test]
fn job_reply_completes_and_kbye_stops_new_jobs() {
    let _w = Watchdog::new("kbye", 30);
    each_shards(|n| {
        let h = router(n);
        let w = Peer::new(&h.endpoints.backend, W);
        w.inform_worker(r#"[[10, "default"]]"#);
        w.ready(3);
        let c = Peer::new(&h.endpoints.frontend, C);
        std::thread::sleep(Duration::from_millis(100));
        c.request("j1", "default", "", "1");
        let req = w.expect("REQUEST");
        let status = admin(&h, "STATUS");
        assert_eq!(status["inflight_messages_by_queue"]["default"], 1);
        w.send(&[b"", b"eMQP/1.0", b"KBYE", b"bye"]);
        std::thread::sleep(Duration::from_millis(100));
        c.request("j2", "default", "", "2");
        w.expect_none("REQUEST", 300);
        w.job_reply(&req[3]);
        eventually(5, "j1 completed", || h.counters().completed_jobs.load(Ordering::Relaxed) == 1);
        let latency = admin(&h, "LATENCY");
        assert_eq!(latency["unit"], "us");
        for kind in ["queue_wait", "service", "end_to_end"] {
            assert_eq!(latency["queues"]["default"][kind]["count"], 1, "{latency}");
        }
        eventually(10, "drained worker forgotten one heartbeat timeout after its KBYE", || {
            admin(&h, "ROUTER_SHOW_WORKERS")["connected_workers"] == serde_json::json!({})
        });
        assert_eq!(admin(&h, "STATUS")["waiting_messages_by_queue"]["default"], 1, "j2 waits for a worker");
    });
}

#[test]
fn queue_limit_gives_error_reply() {
    let _w = Watchdog::new("queue_limit", 30);
    let h = emq::router::start(config(1, |r| r.max_queue_len = Some(2))).unwrap();
    let c = Peer::new(&h.endpoints.frontend, C);
    for id in ["q1", "q2", "q3"] {
        c.request(id, "default", "", "x");
    }
    assert_eq!(c.expect("REPLY")[4], b"q1");
    assert_eq!(c.expect("REPLY")[4], b"q2");
    let err = c.expect("ERROR");
    assert_eq!((err[4].as_slice(), err[5].as_slice()), (&b"q3"[..], &b"QUEUE_FULL"[..]));
    assert_eq!(h.counters().rejected_queue_full.load(Ordering::Relaxed), 1);
}

#[test]
fn schedule_goes_to_the_owner_of_its_key_and_no_scheduler_error() {
    let _w = Watchdog::new("schedule", 30);
    each_shards(|n| {
        let h = router(n);
        let c = Peer::new(&h.endpoints.frontend, C);
        let sched = |id: &str| {
            let body = BODY.as_bytes();
            c.send(&[b"", b"eMQP/1.0", b"SCHEDULE", id.as_bytes(), b"default", b"guarantee", b"60", body, b""]);
        };
        sched("s0");
        let err = c.expect("ERROR");
        assert_eq!((err[4].as_slice(), err[5].as_slice()), (&b"s0"[..], &b"NO_SCHEDULER"[..]));
        let s1 = Peer::new(&h.endpoints.frontend, b"sched-1");
        let s2 = Peer::new(&h.endpoints.frontend, b"sched-2");
        for s in [&s1, &s2] {
            s.send(&[b"", b"eMQP/1.0", b"INFORM", b"i", b"", b"scheduler"]);
            assert_eq!(s.expect("ACK")[4], b"i");
        }
        // One schedule (one key), sent four times: always to the same scheduler.
        for id in ["a", "b", "c", "d"] {
            sched(id);
        }
        let got = |s: &Peer| -> Vec<Vec<u8>> {
            std::iter::from_fn(|| s.recv_within(300)).filter(|f| f[2] == b"SCHEDULE").map(|f| f[3].clone()).collect()
        };
        let (got1, got2) = (got(&s1), got(&s2));
        let (owner, other, ids) = if got2.is_empty() { (&s1, &s2, got1) } else { (&s2, &s1, got2) };
        assert_eq!(ids, [b"a".to_vec(), b"b".to_vec(), b"c".to_vec(), b"d".to_vec()], "all four to one scheduler");
        c.send(&[b"", b"eMQP/1.0", b"UNSCHEDULE", b"u", b"default", b"", b"-1", BODY.as_bytes(), b""]);
        let u1 = owner.expect("UNSCHEDULE");
        assert_eq!((u1.len(), u1[3].as_slice()), (9, &b"u"[..]), "forwarded verbatim to the owner");
        assert_eq!(other.expect("UNSCHEDULE")[3].len(), 36, "a copy with a fresh msgid to the other");
        let shown = admin(&h, "ROUTER_SHOW_SCHEDULERS");
        assert!(shown["connected_schedulers"]["sched-1"]["hb"].is_number());
        assert!(shown["connected_schedulers"]["sched-2"]["hb"].is_number());
    });
}

#[test]
fn admin_shapes_match_eventmq() {
    let _w = Watchdog::new("admin_shapes", 30);
    let h = router(2);
    let w = Peer::new(&h.endpoints.backend, W);
    w.inform_worker(r#"[[10, "default"], [5, "email"]]"#);
    w.ready(3);
    eventually(5, "slots", || {
        admin(&h, "ROUTER_SHOW_WORKERS")["connected_workers"][std::str::from_utf8(W).unwrap()]["available_slots"] == 3
    });
    let shown = admin(&h, "ROUTER_SHOW_WORKERS");
    let id = std::str::from_utf8(W).unwrap();
    assert_eq!(shown["connected_workers"][id]["queues"], serde_json::json!([[10, "default"], [5, "email"]]));
    assert_eq!(shown["connected_queues"]["email"], serde_json::json!([[5, id]]));
    let status = admin(&h, "STATUS");
    let keys: Vec<&str> = status.as_object().unwrap().keys().map(|k| k.as_str()).collect();
    assert_eq!(
        &keys[..6],
        [
            "inflight_messages_by_queue",
            "latency_messages_by_queue",
            "max_latency_messages_by_queue",
            "waiting_messages_by_queue",
            "processed_messages_by_queue",
            "processed_messages_by_worker"
        ]
    );
}

#[test]
fn bad_input_is_counted_and_the_broker_keeps_serving() {
    let _w = Watchdog::new("bad_input", 60);
    each_shards(|n| {
        let h = router(n);
        // A peer with no identity (libzmq's binary 5-byte id) and non-UTF-8 frames.
        let anon = Peer::new(&h.endpoints.frontend, b"");
        anon.send(&[b"\xff\xfe", b"eMQP/1.0", b"REQUEST"]);
        anon.send(&[b"", b"eMQP/1.0", b"BOGUS", b"m"]);
        let bad_id = Peer::new(&h.endpoints.backend, b"\xff\x00\xc3(");
        bad_id.send(&[b"", b"eMQP/1.0", b"DISCONNECT", b"m"]);
        bad_id.send(&[b"", b"eMQP/1.0", b"on_request", b"m", b"q", b"h", b"b"]);
        bad_id.send(&[b"", b"eMQP/1.0", b"INFORM", b"m", b"[[\"default\", 10]]", b"worker"]);
        assert_eq!(bad_id.expect("ERROR")[5], b"BAD_INFORM");
        // Frames missing: refused about its msgid too (docs/emqp.md "ERROR").
        bad_id.send(&[b"", b"eMQP/1.0", b"INFORM", b"m"]);
        assert_eq!(bad_id.expect("ERROR")[5], b"BAD_INFORM");
        bad_id.send(&[b"", b"eMQP/1.0", b"REPLY", b"m", b"{}"]);
        let adm = Peer::new(&h.endpoints.admin, b"adm");
        adm.send(&[b"", b"eMQP/1.0", b"REQUEST", b"m", b"q", b"h", b"b"]);
        adm.send(&[b"x"]);
        let mut rng = 0x2545F4914F6CDD1Du64;
        for _ in 0..300 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let frames: Vec<Vec<u8>> = (0..(rng % 9)).map(|i| rng.to_le_bytes()[..(i as usize % 8)].to_vec()).collect();
            if !frames.is_empty() {
                anon.sock.send_multipart(frames.iter(), 0).unwrap();
            }
        }
        // Still serving: a real worker and client work.
        let w = Peer::new(&h.endpoints.backend, W);
        w.inform_worker("");
        w.ready(1);
        let c = Peer::new(&h.endpoints.frontend, C);
        std::thread::sleep(Duration::from_millis(100));
        c.request("ok-1", "default", "", "x");
        assert_eq!(w.expect("REQUEST")[3], b"ok-1");
        let counters = &admin(&h, "STATUS")["emq"]["counters"];
        assert!(counters["malformed_frontend"].as_u64().unwrap() >= 2, "{counters}");
        assert!(counters["malformed_backend"].as_u64().unwrap() >= 4, "{counters}");
        assert!(counters["malformed_admin"].as_u64().unwrap() >= 2, "{counters}");
        assert_eq!(counters["rejected_inform"], 2);
    });
}

#[test]
fn admin_disconnect_acks_and_stops() {
    let _w = Watchdog::new("admin_disconnect", 30);
    let h = router(2);
    let w = Peer::new(&h.endpoints.backend, W);
    w.inform_worker(r#"[[10, "default"]]"#);
    let a = Peer::new(&h.endpoints.admin, b"admin");
    a.send(&[b"", b"eMQP/1.0", b"DISCONNECT", b"admin:9f8e"]);
    assert_eq!(a.expect("ACK")[4], b"admin:9f8e");
    w.expect("KBYE");
    h.wait();
}

#[test]
fn re_inform_replaces_the_entry() {
    let _w = Watchdog::new("re_inform", 30);
    each_shards(|n| {
        let h = router(n);
        let w = Peer::new(&h.endpoints.backend, W);
        w.inform_worker(r#"[[10, "default"], [5, "email"]]"#);
        w.ready(4);
        let id = std::str::from_utf8(W).unwrap();
        eventually(5, "4 slots", || admin(&h, "ROUTER_SHOW_WORKERS")["connected_workers"][id]["available_slots"] == 4);
        w.inform_worker(r#"[[7, "email"]]"#);
        eventually(5, "replaced", || {
            let s = admin(&h, "ROUTER_SHOW_WORKERS");
            s["connected_workers"][id]["available_slots"] == 0
                && s["connected_workers"][id]["queues"] == serde_json::json!([[7, "email"]])
                && s["connected_queues"]["email"] == serde_json::json!([[7, id]])
                && s["connected_queues"].get("default").is_none()
        });
    });
}

#[test]
fn sigterm_drains_and_logs_what_remains() {
    let _w = Watchdog::new("sigterm_drain", 60);
    let port = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let (fe, be, ad) = (port(), port(), port());
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_emq-router"))
        .args(["--frontend", &format!("tcp://127.0.0.1:{fe}")])
        .args(["--backend", &format!("tcp://127.0.0.1:{be}")])
        .args(["--admin", &format!("tcp://127.0.0.1:{ad}")])
        .args(["--text", "off", "--metrics", "", "--drain-timeout", "300ms", "--log", "info,emq::broker::shard=debug"])
        .args(["--durability", "memory"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let c = Peer::new(&format!("tcp://127.0.0.1:{fe}"), C);
    c.request("left-behind-1", "default", "", "x");
    assert_eq!(c.expect("REPLY")[4], b"left-behind-1");
    let w = Peer::new(&format!("tcp://127.0.0.1:{be}"), W);
    w.inform_worker(r#"[[10, "other"]]"#);
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    w.expect("KBYE");
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    let mut log = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut log).unwrap();
    // One summary line at warn; each job (ids and length, never the body)
    // at debug.
    assert!(log.contains("jobs left at shutdown") && log.contains("queued=1"), "{log}");
    assert!(log.contains("queued job not run") && log.contains("left-behind-1") && log.contains("bytes=1"), "{log}");
}

fn fast_heartbeats(r: &mut RawRouterConfig) {
    r.heartbeat_interval = Some("200ms".into());
    r.heartbeat_timeout = Some("800ms".into());
}

#[test]
fn a_worker_finishing_after_kbye_is_not_expired_by_the_heartbeat_timeout() {
    let _w = Watchdog::new("kbye_grace", 30);
    let h = emq::router::start(config(1, |r| {
        fast_heartbeats(r);
        r.kbye_grace = Some("20s".into());
    }))
    .unwrap();
    let w1 = Peer::new(&h.endpoints.backend, b"w1");
    w1.inform_worker(r#"[[10, "default"]]"#);
    w1.ready(1);
    let c = Peer::new(&h.endpoints.frontend, C);
    std::thread::sleep(Duration::from_millis(100));
    c.request("long-job", "default", "", "x");
    let req = w1.expect("REQUEST");
    w1.send(&[b"", b"eMQP/1.0", b"KBYE", b"bye"]);
    // A second worker that would get the job if it were requeued.
    let w2 = Peer::new(&h.endpoints.backend, b"w2");
    w2.inform_worker(r#"[[10, "default"]]"#);
    w2.ready(1);
    let end = Instant::now() + Duration::from_millis(2500);
    while Instant::now() < end {
        w2.send(&[b"", b"eMQP/1.0", b"HEARTBEAT", b"hb", b"0"]);
        if let Some(f) = w2.recv_within(100) {
            assert_ne!(f[2], b"REQUEST", "the draining worker's job was requeued while it still runs");
        }
    }
    w1.job_reply(&req[3]);
    eventually(5, "completed", || h.counters().completed_jobs.load(Ordering::Relaxed) == 1);
    assert_eq!(h.counters().requeued_jobs.load(Ordering::Relaxed), 0);
}

#[test]
fn a_job_that_kills_every_worker_is_dropped_after_max_deliveries() {
    let _w = Watchdog::new("max_deliveries", 60);
    let h = emq::router::start(config(1, fast_heartbeats)).unwrap();
    let c = Peer::new(&h.endpoints.frontend, C);
    c.request("poison", "default", "", "boom");
    assert_eq!(c.expect("REPLY")[4], b"poison");
    let deliveries = emq::limits::MAX_RETRIES as usize + 1;
    for i in 0..deliveries {
        // Each worker takes the job and dies (goes silent). It heartbeats
        // until the job comes: silent while it waits (800 ms is soon on a
        // loaded machine), it could expire with the worker before it and
        // cost the job a delivery it never got.
        let w = Peer::new(&h.endpoints.backend, format!("victim-{i}").as_bytes());
        w.inform_worker(r#"[[10, "default"]]"#);
        w.ready(1);
        let end = Instant::now() + Duration::from_secs(10);
        let job = loop {
            assert!(Instant::now() < end, "no REQUEST within 10 s (delivery {})", i + 1);
            w.send(&[b"", b"eMQP/1.0", b"HEARTBEAT", b"hb", b"0"]);
            match w.recv_within(100) {
                Some(f) if f[2] == b"REQUEST" => break f,
                _ => {}
            }
        };
        assert_eq!(job[3], b"poison", "delivery {}", i + 1);
    }
    eventually(10, "dropped", || h.counters().dead_lettered.load(Ordering::Relaxed) == 1);
    let status = admin(&h, "STATUS");
    assert_eq!(status["waiting_messages_by_queue"], serde_json::json!({}), "{status}");
}

#[test]
fn a_job_held_past_its_deadline_by_a_heartbeating_worker_runs_on_another() {
    let _w = Watchdog::new("job_deadline", 60);
    each_shards(|n| {
        let h = emq::router::start(config(n, fast_heartbeats)).unwrap();
        let stuck = Peer::new(&h.endpoints.backend, b"stuck");
        stuck.inform_worker(r#"[[10, "default"]]"#);
        stuck.ready(2);
        let c = Peer::new(&h.endpoints.frontend, C);
        std::thread::sleep(Duration::from_millis(100));
        c.request("hung", "default", "timeout:1", "x");
        assert_eq!(stuck.expect("REQUEST")[3], b"hung");
        let sent = Instant::now();
        let healthy = Peer::new(&h.endpoints.backend, b"healthy");
        healthy.inform_worker(r#"[[10, "default"]]"#);
        healthy.ready(1);
        // Both heartbeat; the stuck worker never answers.
        let mut got = None;
        let end = Instant::now() + Duration::from_secs(20);
        while got.is_none() && Instant::now() < end {
            for p in [&stuck, &healthy] {
                p.send(&[b"", b"eMQP/1.0", b"HEARTBEAT", b"hb", b"0"]);
            }
            if let Some(f) = healthy.recv_within(100) {
                if f[2] == b"REQUEST" {
                    got = Some((f[3].clone(), sent.elapsed()));
                }
            }
            while let Some(f) = stuck.recv_within(0) {
                assert_ne!(f[2], b"REQUEST", "the stuck worker got a job of the queue it owes an answer on");
            }
        }
        let (msgid, after) = got.unwrap_or_else(|| panic!("the job never reached the other worker ({n} shards)"));
        assert_eq!(msgid, b"hung");
        assert!(after >= Duration::from_secs(1), "taken back before its deadline: {after:?}");
        healthy.job_reply(b"hung");
        eventually(5, "completed by the other worker", || h.counters().completed_jobs.load(Ordering::Relaxed) == 1);
        assert_eq!(h.counters().jobs_timed_out.load(Ordering::Relaxed), 1);
        c.request("next", "default", "", "y");
        stuck.expect_none("REQUEST", 300);
        stuck.job_reply(b"hung");
        assert_eq!(stuck.expect("REQUEST")[3], b"next", "answered: it serves the queue again ({n} shards)");
        assert_eq!(h.counters().late_replies.load(Ordering::Relaxed), 1);
        assert_eq!(h.counters().completed_jobs.load(Ordering::Relaxed), 1, "the late REPLY completes nothing");
    });
}
