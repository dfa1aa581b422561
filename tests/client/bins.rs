//! The binaries: emq-worker running a shell script, emq-pubsub forwarding
//! PUBLISH to a SUB socket, emq-cli against nothing.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{count, free_port, watchdog, ChildGuard, RawRouter};

const V: &[u8] = b"eMQP/1.0";
const S: Duration = Duration::from_secs(5);

const SCRIPT: &str = r#"#!/bin/sh
payload=$(cat)
if [ "$payload" = "sleep" ]; then
  sleep 30 &
  echo $! > "$PIDFILE"
  wait
fi
if [ "$payload" = "fail" ]; then exit 3; fi
printf 'out:%s q=%s' "$payload" "$EMQ_QUEUE"
"#;

fn sigterm(child: &std::process::Child) {
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
}

fn wait_exit(child: &mut std::process::Child, within: Duration) -> std::process::ExitStatus {
    let end = Instant::now() + within;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(Instant::now() < end, "process did not exit within {within:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether `pid` is gone or a zombie (killed, not yet reaped by init) within `within`.
fn dead_within(pid: i32, within: Duration) -> bool {
    let end = Instant::now() + within;
    while Instant::now() < end {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => return true,
            Ok(stat) if stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')) => return true,
            Ok(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    false
}

#[test]
fn emq_worker_runs_a_script_per_job() {
    let _w = watchdog(40);
    let dir = std::env::temp_dir().join(format!("emq-worker-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("job.sh");
    std::fs::write(&script, SCRIPT).unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let pidfile = dir.join("sleep.pid");
    let router = RawRouter::bind();
    let child = Command::new(env!("CARGO_BIN_EXE_emq-worker"))
        .args(["--queue", "email:10", "--queue", "default", "-J", "2", "--timeout", "1s", "--backend"])
        .arg(&router.endpoint)
        .args(["--stats-interval", "0s", "--"])
        .arg(&script)
        .env("PIDFILE", &pidfile)
        .env("RUST_LOG", "warn")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = ChildGuard(child);
    let f = router.recv_skip_hb(S).expect("INFORM");
    assert_eq!((f[3].as_slice(), f[5].as_slice()), (&b"INFORM"[..], &br#"[[10, "email"], [10, "default"]]"#[..]));
    let id = f[0].clone();
    router.send(&id, &[b"", V, b"ACK", b"a", &f[4]]);
    let msgs = router.collect(Duration::from_millis(300), Some(&id));
    assert_eq!(count(&msgs, &id, b"READY"), 2);
    // A text-protocol task: empty headers plus the broker-added reply-requested.
    router.send(&id, &[b"", V, b"REQUEST", b"job-ok", b"email", b"reply-requested", b"hello"]);
    router.send(&id, &[b"", V, b"REQUEST", b"job-slow", b"email", b"reply-requested", b"sleep"]);
    let msgs = router.collect(Duration::from_millis(2500), Some(&id));
    let replies: Vec<_> = msgs.iter().filter(|m| m[3] == b"REPLY").map(|m| (m[6].clone(), m[5].clone())).collect();
    assert!(replies.contains(&(b"job-ok".to_vec(), br#"{"value": "out:hello q=email"}"#.to_vec())), "{replies:?}");
    assert!(replies.contains(&(b"job-slow".to_vec(), br#"{"value": "TimeoutError"}"#.to_vec())), "{replies:?}");
    assert_eq!(count(&msgs, &id, b"READY"), 2);
    let sleeper: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
    assert!(dead_within(sleeper, S), "the timed-out job's process group was killed");
    router.send(&id, &[b"", V, b"REQUEST", b"job-fail", b"default", b"reply-requested", b"fail"]);
    let reply = router.recv_skip_hb(S).unwrap();
    assert_eq!(reply[5], br#"{"value": "command failed: exit status: 3"}"#);
    assert_eq!(reply.get(7).map(Vec::as_slice), Some(&b"failed"[..]), "a failed job's REPLY says so");
    sigterm(&child.0);
    assert_eq!(router.recv_skip_hb(S).unwrap()[3], b"READY");
    assert_eq!(router.recv_skip_hb(S).unwrap()[3], b"KBYE");
    assert!(wait_exit(&mut child.0, S).success());
    let mut err = String::new();
    child.0.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(err.contains("jobs ok=1 failed=1 timed_out=1"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Starts emq-pubsub on free loopback ports with `extra` flags; gives the
/// process and its (incoming, outgoing) endpoints from its first line.
fn start_pubsub(extra: &[&str]) -> (ChildGuard, String, String) {
    let child = Command::new(env!("CARGO_BIN_EXE_emq-pubsub"))
        .args(["--pubsub-in", "tcp://127.0.0.1:*", "--pubsub-out", "tcp://127.0.0.1:*"])
        .args(extra)
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = ChildGuard(child);
    let mut line = String::new();
    BufReader::new(child.0.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let parts: Vec<&str> = line.trim().split(' ').collect();
    let endpoint = |i: usize, prefix: &str| parts[i].strip_prefix(prefix).unwrap().to_string();
    let (in_ep, out_ep) = (endpoint(1, "in="), endpoint(2, "out="));
    (child, in_ep, out_ep)
}

#[test]
fn emq_pubsub_forwards_and_survives_garbage() {
    let _w = watchdog(30);
    let (mut child, in_ep, out_ep) = start_pubsub(&[]);
    let (in_ep, out_ep) = (in_ep.as_str(), out_ep.as_str());
    let ctx = zmq::Context::new();
    let sub = ctx.socket(zmq::SUB).unwrap();
    sub.set_linger(0).unwrap();
    sub.set_subscribe(b"").unwrap();
    sub.set_rcvtimeo(100).unwrap();
    sub.connect(out_ep).unwrap();
    let publisher = ctx.socket(zmq::DEALER).unwrap();
    publisher.set_linger(0).unwrap();
    publisher.connect(in_ep).unwrap();
    let publish =
        |topic: &[u8], msg: &[u8]| publisher.send_multipart([b"" as &[u8], V, b"PUBLISH", b"m", topic, msg], 0);
    // Slow joiner: publish until the subscription is live.
    let got = (0..50).find_map(|_| {
        publish(b"topic", br#"["update", "1"]"#).unwrap();
        sub.recv_multipart(0).ok()
    });
    assert_eq!(got, Some(vec![b"topic".to_vec(), br#"["update", "1"]"#.to_vec()]));
    while sub.recv_multipart(0).is_ok() {}
    for garbage in [vec![b"".to_vec()], vec![b"\xff".to_vec(), b"x".to_vec()]] {
        publisher.send_multipart(garbage, 0).unwrap();
    }
    publisher.send_multipart([b"" as &[u8], V, b"PUBLISH", b"m", b"only-topic"], 0).unwrap();
    publisher.send_multipart([b"" as &[u8], V, b"REQUEST", b"m", b"q", b"h", b"b"], 0).unwrap();
    publish(b"after", b"still alive").unwrap();
    sub.set_rcvtimeo(5000).unwrap();
    assert_eq!(sub.recv_multipart(0).unwrap(), vec![b"after".to_vec(), b"still alive".to_vec()]);
    assert!(child.0.try_wait().unwrap().is_none());
    sigterm(&child.0);
    assert!(wait_exit(&mut child.0, S).success());
    let mut err = String::new();
    child.0.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(err.contains("dropped 4 malformed and 0 too big"), "{err}");
}

/// Resident memory of `pid`, KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn emq_pubsub_bounds_a_stalled_subscriber_and_drops_a_publish_over_its_size_limit() {
    let _w = watchdog(60);
    let (mut child, in_ep, out_ep) = start_pubsub(&["--pubsub-hwm", "10", "--pubsub-max-message-bytes", "8192"]);
    let (in_ep, out_ep) = (in_ep.as_str(), out_ep.as_str());
    let ctx = zmq::Context::new();
    let sub = ctx.socket(zmq::SUB).unwrap();
    sub.set_linger(0).unwrap();
    sub.set_subscribe(b"").unwrap();
    sub.set_rcvtimeo(100).unwrap();
    sub.connect(out_ep).unwrap();
    // A subscriber that never reads, buffering one message on its side.
    let stalled = ctx.socket(zmq::SUB).unwrap();
    stalled.set_linger(0).unwrap();
    stalled.set_rcvhwm(1).unwrap();
    stalled.set_rcvbuf(4096).unwrap();
    stalled.set_subscribe(b"").unwrap();
    stalled.connect(out_ep).unwrap();
    let publisher = ctx.socket(zmq::DEALER).unwrap();
    publisher.set_linger(0).unwrap();
    publisher.connect(in_ep).unwrap();
    let publish =
        |topic: &[u8], msg: &[u8]| publisher.send_multipart([b"" as &[u8], V, b"PUBLISH", b"m", topic, msg], 0);
    let got = (0..50).find_map(|_| {
        publish(b"t", b"hello").unwrap();
        sub.recv_multipart(0).ok()
    });
    assert_eq!(got, Some(vec![b"t".to_vec(), b"hello".to_vec()]));
    std::thread::sleep(Duration::from_millis(200)); // the stalled subscription is live too
    let before = rss_kib(child.0.id());
    // 40 MB published; the reading subscriber keeps up, the stalled one
    // holds at most 10 messages of the device's memory.
    let body = vec![b'x'; 8000];
    for i in 0..5000u32 {
        publish(b"t", &body).unwrap();
        if i % 50 == 0 {
            while sub.recv_multipart(zmq::DONTWAIT).is_ok() {}
        }
    }
    // Drained (the device drops what a subscriber 10 behind misses).
    sub.set_rcvtimeo(300).unwrap();
    while sub.recv_multipart(0).is_ok() {}
    publish(b"big", &vec![b'y'; 9000]).unwrap(); // over 8192: dropped
    publish(b"last", b"small").unwrap();
    sub.set_rcvtimeo(5000).unwrap();
    let last = sub.recv_multipart(0).ok();
    assert_eq!(last, Some(vec![b"last".to_vec(), b"small".to_vec()]), "the big one dropped, the next delivered");
    let grown = rss_kib(child.0.id()).saturating_sub(before);
    assert!(grown < 12 * 1024, "the device grew {grown} KiB for a stalled subscriber (40 MB published)");
    sigterm(&child.0);
    assert!(wait_exit(&mut child.0, S).success());
    let mut err = String::new();
    child.0.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(err.contains("dropped 0 malformed and 1 too big"), "{err}");
    drop(stalled);
}

#[test]
fn emq_cli_fails_fast_when_nothing_listens() {
    let _w = watchdog(30);
    let addr = format!("tcp://127.0.0.1:{}", free_port());
    for args in [vec!["status"], vec!["request", "q", "body"], vec!["publish", "t", "m"]] {
        let started = Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_emq-cli"))
            .args(["--admin", &addr, "--frontend", &addr, "--pubsub-in", &addr, "--timeout", "500ms"])
            .args(&args)
            .output()
            .unwrap();
        assert!(started.elapsed() < Duration::from_secs(5), "{args:?} took {:?}", started.elapsed());
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with("emq-cli: ") && err.contains("unreachable"), "{err}");
        assert!(out.stdout.is_empty());
    }
}
