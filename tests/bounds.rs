//! Bounded by design, over real sockets: names from the network are
//! reclaimed and capped, byte limits refuse what is too big, oversized
//! INFORMs are refused before they cost anything, and a shard that falls
//! behind makes the I/O thread push back without losing a job
//! (docs/configuration.md, the `max_*` settings).

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::Command;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use crate::common::admin::admin;
use crate::common::ports::{free_port, is_listening, zmq_endpoint};
use crate::common::proc::{cpu_time, Child, TestDir};
use crate::common::router::rust_router_bin;
use crate::emqp_router::{eventually, router, Peer, Watchdog};
use crate::text_broker::{connect, router_with_text};

/// Resident set of process `pid` in KiB (`VmRSS`).
fn rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("process status");
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS line");
    line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).expect("VmRSS figure")
}

/// Sends `SCHED x@<prefix>N / ASK <prefix>N / ACK` for `n` names over one
/// pipelined connection and checks every ASK got its task.
fn one_job_per_name(addr: &str, prefix: &str, n: usize) {
    let stream = TcpStream::connect(addr).expect("connect text");
    stream.set_read_timeout(Some(Duration::from_secs(60))).expect("timeout");
    let mut writer = stream.try_clone().expect("clone");
    let prefix_w = prefix.to_string();
    let sender = std::thread::spawn(move || {
        let mut buf = Vec::new();
        for i in 0..n {
            buf.extend_from_slice(format!("SCHED x@{prefix_w}{i}\nASK {prefix_w}{i}\nACK\n").as_bytes());
            if buf.len() > 64 * 1024 {
                writer.write_all(&buf).expect("write");
                buf.clear();
            }
        }
        writer.write_all(&buf).expect("write");
    });
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    for i in 0..n {
        line.clear();
        reader.read_line(&mut line).expect("read");
        assert_eq!(line, "WANT? x\n", "answer to ASK {prefix}{i}");
    }
    sender.join().expect("sender");
}

#[test]
fn one_off_queue_names_are_reclaimed_and_resident_memory_returns() {
    let _w = Watchdog::new("bounds_reclaim", 240);
    let dir = TestDir::new("bounds_reclaim");
    let (fp, bp, ap, tp) = (free_port(), free_port(), free_port(), free_port());
    let admin_addr = zmq_endpoint(ap);
    let text = format!("127.0.0.1:{tp}");
    let mut cmd = Command::new(rust_router_bin());
    cmd.args(["--frontend", &zmq_endpoint(fp), "--backend", &zmq_endpoint(bp), "--admin", &admin_addr]);
    cmd.args(["--text", &text, "--queue-idle-grace", "1s", "--text-ask-grace", "1s", "--log", "warn"]);
    // Memory mode: this is about what names cost, not about the log.
    cmd.args(["--durability", "memory", "--metrics", "off"]).arg("--data-dir").arg(dir.join("router-data"));
    // glibc's mmap threshold fixed at 1 MiB: with its default moving
    // threshold, what the allocator keeps of the freed name tables varies
    // from run to run (2-15 MiB after these 100,000 names, README "Limits"),
    // which would hide a leak of up to ~150 bytes a name; fixed, 1.2-2.2 MiB
    // remain, so 8 MiB catches one of ~80 bytes a name.
    cmd.env("MALLOC_MMAP_THRESHOLD_", "1048576");
    let router = Child::spawn("router", &mut cmd, &dir.join("router.log"));
    eventually(20, "text port", || is_listening(tp));
    let queues = || crate::common::admin::request(&admin_addr, "STATUS").map(|s| s["emq"]["queues"].clone());
    // Warm up (thread stacks, allocator arenas, histograms of `default`),
    // then take the figure once the warm-up names are gone.
    one_job_per_name(&text, "warm", 2_000);
    // STATUS lists every queue: asked while 100,000 exist, its answer would
    // itself leave megabytes in the allocator. Ask only once the grace
    // (1 s) and a sweep (0.5 s) have passed, then every half second.
    let reclaimed = |what: &str| {
        std::thread::sleep(Duration::from_millis(1_600));
        let done = crate::common::wait::until(Duration::from_secs(60), || {
            let zero = queues() == Ok(serde_json::json!(0));
            if !zero {
                std::thread::sleep(Duration::from_millis(500));
            }
            zero
        });
        assert!(done, "{what} not reclaimed within 60 s");
    };
    reclaimed("warm-up names");
    let start = rss_kib(router.pid());
    one_job_per_name(&text, "q", 100_000);
    reclaimed("100,000 names");
    // The asked names' grace ends a sweep later; then the heap is trimmed.
    let settled = crate::common::wait::until(Duration::from_secs(30), || rss_kib(router.pid()) < start + 8 * 1024);
    let end = rss_kib(router.pid());
    assert!(settled, "RSS {start} KiB before, {end} KiB after 100,000 names were reclaimed (want < +8 MiB)");
    eprintln!("RSS {start} KiB before, {end} KiB after 100,000 names were reclaimed");
}

#[test]
fn max_queues_refuses_a_new_name_in_both_protocols_and_known_ones_still_work() {
    let _w = Watchdog::new("bounds_max_queues", 30);
    for shards in [1, 3] {
        let h = router_with_text(shards, |r| r.max_queues = Some(2));
        let mut c = connect(&h);
        // q1 and q2 first (on different shards the commands of one batch
        // run at the same time), then the name past the limit.
        c.send(b"SCHED a@q1\nSCHED b@q2\n");
        eventually(5, "two queues", || admin(&h, "STATUS")["emq"]["queues"] == 2);
        c.send(b"SCHED c@q3\n");
        c.expect_err("QUEUE_LIMIT");
        // A worker declaring a new name is told about it; its known queue
        // is served.
        let worker = Peer::new(&h.endpoints.backend, b"worker-mq");
        // The ACK comes from the worker's home shard and the ERROR from
        // q4's: with several shards either may arrive first.
        worker.send(&[b"", b"eMQP/1.0", b"INFORM", b"inform-1", br#"[[10, "q1"], [10, "q4"]]"#, b"worker"]);
        let (mut ack, mut err) = (None, None);
        let end = std::time::Instant::now() + Duration::from_secs(5);
        while (ack.is_none() || err.is_none()) && std::time::Instant::now() < end {
            match worker.recv_within(100) {
                Some(f) if f[2] == b"ACK" => ack = Some(f),
                Some(f) if f[2] == b"ERROR" => err = Some(f),
                _ => {}
            }
        }
        let (ack, err) = (ack.expect("ACK within 5 s"), err.expect("ERROR within 5 s"));
        assert_eq!(ack[4], b"inform-1");
        assert_eq!((err[4].as_slice(), err[5].as_slice()), (&b"inform-1"[..], &b"QUEUE_LIMIT"[..]));
        worker.ready(1);
        assert_eq!(worker.expect("REQUEST").last().map(Vec::as_slice), Some(&b"a"[..]));
        // A REQUEST for a name no worker serves goes to `default`, which is
        // always allowed (EventMQ's fallback; docs/emqp.md).
        let client = Peer::new(&h.endpoints.frontend, b"client-mq");
        client.request("m1", "q5", "", "d");
        assert_eq!(client.expect("REPLY")[4], b"m1");
        c.send(b"ASK q2\n");
        c.expect(b"WANT? b\n");
        assert_eq!(h.counters().rejected_queue_limit.load(Relaxed), 2, "{shards} shards");
    }
}

#[test]
fn a_message_over_max_message_bytes_is_refused_and_the_router_keeps_serving() {
    let _w = Watchdog::new("bounds_too_big", 30);
    let cfg = crate::emqp_router::config(1, |r| r.max_message_bytes = Some(4096));
    let h = emq::router::start(cfg).expect("router starts");
    let client = Peer::new(&h.endpoints.frontend, b"client-big");
    client.request("m1", "q", "", &"x".repeat(5000));
    let err = client.expect("ERROR");
    assert_eq!((err[4].as_slice(), err[5].as_slice()), (&b"m1"[..], &b"TOO_BIG"[..]));
    // A message over twice the limit and 4 KiB (12,288; 64 bytes a frame
    // counted on top): ZeroMQ drops the peer's connection before buffering
    // it; nothing reaches the broker.
    let huge = Peer::new(&h.endpoints.frontend, b"client-huge");
    huge.request("m2", "q", "", &"y".repeat(12_000));
    huge.expect_none("REPLY", 300);
    let worker = Peer::new(&h.endpoints.backend, b"worker-after-big");
    worker.inform_worker(r#"[[10, "q"]]"#);
    worker.ready(1);
    let ok = Peer::new(&h.endpoints.frontend, b"client-ok");
    ok.request("m3", "q", "", "small");
    assert_eq!(ok.expect("REPLY")[4], b"m3");
    let job = worker.expect("REQUEST");
    assert_eq!(job.last().map(Vec::as_slice), Some(&b"small"[..]), "only the small job ran");
    assert_eq!(h.counters().rejected_too_big.load(Relaxed), 1);
    // A job result over the limit is still an answer: the router reads its
    // msgid, never keeps the result, and the job completes (a dropped
    // answer left the job held and its worker barred from the queue).
    let result = "r".repeat(6000);
    worker.send(&[b"", b"eMQP/1.0", b"REPLY", b"reply-1", result.as_bytes(), &job[3]]);
    let done = crate::common::wait::until(Duration::from_secs(5), || h.counters().completed_jobs.load(Relaxed) == 1);
    assert!(done, "the big result completed the job");
    assert_eq!(h.counters().rejected_too_big.load(Relaxed), 1, "not refused");
}

#[test]
fn a_message_over_max_message_bytes_is_too_big_before_it_has_too_many_frames() {
    // The order of the checks: size first, then the frame count (then
    // decoding). docs/emqp.md "ERROR".
    let _w = Watchdog::new("bounds_too_big_many_frames", 30);
    let cfg = crate::emqp_router::config(1, |r| r.max_message_bytes = Some(4096));
    let h = emq::router::start(cfg).expect("router starts");
    let client = Peer::new(&h.endpoints.frontend, b"client-many");
    let error = |e: &Vec<Vec<u8>>| {
        let t = |i: usize| String::from_utf8_lossy(&e[i]).into_owned();
        (t(4), t(5), t(6))
    };
    // 100 frames of 50 bytes after the head: 5,020 bytes (ZeroMQ passes
    // it: 11,740 counted with 64 bytes for each of 105 frames, under 12,288,
    // limits::zmq_max_msg_size): TOO_BIG, whatever the count.
    let filler = [b'x'; 50];
    let mut frames: Vec<&[u8]> = vec![b"", b"eMQP/1.0", b"REQUEST", b"huge", b"q", b""];
    frames.extend(std::iter::repeat_n(&filler[..], 100));
    let bytes: usize = frames.iter().map(|f| f.len()).sum();
    assert_eq!(bytes, 5_020);
    client.send(&frames);
    let why = "the message has 5020 bytes; at most 4096 are accepted".to_string();
    assert_eq!(error(&client.expect("ERROR")), ("huge".into(), "TOO_BIG".into(), why));
    // The same frame count within the size: BAD_FRAMES.
    let mut small: Vec<&[u8]> = vec![b"", b"eMQP/1.0", b"REQUEST", b"many", b"q", b""];
    small.extend(std::iter::repeat_n(&b"x"[..], 100));
    client.send(&small);
    let why = "the message has 107 frames; at most 64 are accepted".to_string();
    assert_eq!(error(&client.expect("ERROR")), ("many".into(), "BAD_FRAMES".into(), why));
    // Exactly at the limit with too many frames is a frame-count refusal.
    let mut at: Vec<&[u8]> = vec![b"", b"eMQP/1.0", b"REQUEST", b"at", b"q", b""];
    let last = vec![b'z'; 4096 - 8 - 7 - 2 - 1 - 99 * 40];
    let forty = [b'y'; 40];
    at.extend(std::iter::repeat_n(&forty[..], 99));
    at.push(&last);
    assert_eq!(at.iter().map(|f| f.len()).sum::<usize>(), 4096);
    client.send(&at);
    assert_eq!(error(&client.expect("ERROR")).1, "BAD_FRAMES");
    let counters = &admin(&h, "STATUS")["emq"]["counters"];
    assert_eq!((counters["rejected_too_big"].as_u64(), counters["malformed_frontend"].as_u64()), (Some(1), Some(2)));
}

#[test]
fn an_inform_past_max_queues_per_worker_is_refused_before_it_is_parsed() {
    let _w = Watchdog::new("bounds_big_inform", 30);
    let h = router(1);
    let names: Vec<String> = (0..100_000).map(|i| format!("[1, \"q{i}\"]")).collect();
    let list = format!("[{}]", names.join(","));
    let big = Peer::new(&h.endpoints.backend, b"worker-big");
    big.send(&[b"", b"eMQP/1.0", b"INFORM", b"i1", list.as_bytes(), b"worker"]);
    let err = big.expect("ERROR");
    assert_eq!((err[4].as_slice(), err[5].as_slice()), (&b"i1"[..], &b"BAD_INFORM"[..]));
    // The router serves the next client at once.
    let worker = Peer::new(&h.endpoints.backend, b"worker-small");
    worker.inform_worker(r#"[[10, "q"]]"#);
    worker.ready(1);
    let client = Peer::new(&h.endpoints.frontend, b"client-after");
    client.request("m1", "q", "", "job");
    assert_eq!(client.expect("REPLY")[4], b"m1");
    worker.expect("REQUEST");
    assert_eq!(admin(&h, "STATUS")["emq"]["workers"], 1, "the refused worker is not registered");
}

#[test]
fn a_shard_inbox_of_one_message_pushes_back_and_loses_nothing() {
    let _w = Watchdog::new("bounds_backpressure", 60);
    for shards in [1, 3] {
        let cfg = crate::emqp_router::config(shards, |r| r.shard_inbox_messages = Some(1));
        let h = emq::router::start(cfg).expect("router starts");
        let worker = Peer::new(&h.endpoints.backend, b"worker-bp");
        worker.inform_worker(r#"[[10, "q"]]"#);
        let client = Peer::new(&h.endpoints.frontend, b"client-bp");
        let n = 2_000;
        for i in 0..n {
            client.request(&format!("m{i}"), "q", "", &format!("j{i}"));
        }
        for i in 0..n {
            assert_eq!(client.expect("REPLY")[4], format!("m{i}").as_bytes(), "{shards} shards");
        }
        worker.ready(n);
        for i in 0..n {
            let job = worker.expect("REQUEST");
            assert_eq!(job.last().map(Vec::as_slice), Some(format!("j{i}").as_bytes()), "{shards} shards");
        }
    }
}

#[test]
fn a_producer_pushing_past_max_memory_bytes_gets_queue_full_and_what_was_accepted_all_runs() {
    let _w = Watchdog::new("bounds_memory_push", 60);
    for shards in [1, 3] {
        // 1 MiB for every job held; 64 jobs of 32 KiB pipelined at once
        // (2 MiB): about half fit, the rest is refused, whether the I/O
        // thread (jobs in transit count) or a shard refuses it.
        let cfg = crate::emqp_router::config(shards, |r| r.max_memory_bytes = Some(1 << 20));
        let h = emq::router::start(cfg).expect("router starts");
        // Declared first (no READY yet), so the jobs wait in `q`.
        let worker = Peer::new(&h.endpoints.backend, b"worker-push");
        worker.inform_worker(r#"[[10, "q"]]"#);
        let client = Peer::new(&h.endpoints.frontend, b"client-push");
        let body = "z".repeat(32 * 1024);
        let n = 64;
        for i in 0..n {
            client.request(&format!("m{i}"), "q", "", &body);
        }
        let (mut accepted, mut refused) = (Vec::new(), 0);
        for _ in 0..n {
            let f = client.recv_within(10_000).expect("an answer for every REQUEST");
            match f[2].as_slice() {
                b"REPLY" => accepted.push(String::from_utf8(f[4].clone()).expect("msgid")),
                b"ERROR" => {
                    assert_eq!(f[5], b"QUEUE_FULL", "{shards} shards");
                    refused += 1;
                }
                other => panic!("unexpected {:?}", other.escape_ascii().to_string()),
            }
        }
        let held = accepted.len() * (body.len() + 60);
        assert!(held <= 1 << 20, "{} jobs accepted: {held} bytes over the 1 MiB limit", accepted.len());
        assert!(accepted.len() >= 16 && refused >= 16, "{} accepted, {refused} refused", accepted.len());
        assert_eq!(h.counters().rejected_queue_full.load(Relaxed), refused as u64, "{shards} shards");
        // Every accepted job runs; nothing refused does.
        worker.ready(accepted.len() + 1);
        let mut ran = Vec::new();
        for _ in 0..accepted.len() {
            let job = worker.expect("REQUEST");
            ran.push(String::from_utf8(job[3].clone()).expect("msgid"));
        }
        worker.expect_none("REQUEST", 300);
        assert_eq!(ran, accepted, "{shards} shards: the accepted jobs, in order");
    }
}

/// How a raw peer of [`stream_endless_message`] talks.
#[derive(Clone, Copy, Debug)]
enum Zmtp {
    /// ZMTP 3.0, NULL mechanism, READY with this socket type.
    V3(&'static str),
    /// ZMTP 1.0 (unversioned): an empty identity, then frames.
    V1,
}

/// Peak resident set of process `pid` in KiB (`VmHWM`).
fn peak_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("process status");
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM line");
    line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).expect("VmHWM figure")
}

/// The ZMTP 3.0 handshake by hand on `s`: greeting (NULL mechanism, as
/// client), the peer's greeting checked, READY with `socket_type`.
fn zmtp3_handshake(s: &mut TcpStream, socket_type: &str) {
    crate::common::curvezmq::zmtp3_greeting(s, "NULL");
    // READY with the property Socket-Type.
    let mut body = b"\x05READY\x0bSocket-Type".to_vec();
    body.extend_from_slice(&u32::try_from(socket_type.len()).expect("short").to_be_bytes());
    body.extend_from_slice(socket_type.as_bytes());
    let mut ready = vec![0x04, u8::try_from(body.len()).expect("short command")];
    ready.extend_from_slice(&body);
    s.write_all(&ready).expect("READY");
}

/// The router binary on fresh ports, `durability = "memory"`, logging warnings.
fn memory_router(dir: &TestDir) -> crate::common::router::Router {
    crate::common::router::Router::start_with(
        dir,
        crate::common::router::RouterKind::Rust(rust_router_bin()),
        &["--durability", "memory", "--log", "warn"],
    )
}

/// A fresh worker and client (identities `worker-after-<tag>`,
/// `client-after-<tag>`): the router still takes and dispatches a REQUEST.
fn still_serves(r: &crate::common::router::Router, tag: &str) {
    let worker = Peer::new(&r.backend, format!("worker-after-{tag}").as_bytes());
    worker.inform_worker(r#"[[10, "q"]]"#);
    worker.ready(1);
    let client = Peer::new(&r.frontend, format!("client-after-{tag}").as_bytes());
    client.request("m1", "q", "", "small");
    assert_eq!(client.expect("REPLY")[4], b"m1");
    assert_eq!(worker.expect("REQUEST").last().map(Vec::as_slice), Some(&b"small"[..]));
}

/// Connects to `endpoint` (`tcp://127.0.0.1:P`) over plain TCP, does the
/// handshake by hand (`zmtp`), then streams empty frames each flagged MORE,
/// never the last one, up to `limit` bytes: a message that never ends.
/// Returns the bytes of frames written before the peer dropped the
/// connection (a write failed, or reading after the last write met EOF or
/// a reset); panics if it did not drop it.
fn stream_endless_message(endpoint: &str, zmtp: Zmtp, limit: usize) -> usize {
    use std::io::{ErrorKind, Read};
    let addr = endpoint.strip_prefix("tcp://").expect("a tcp:// endpoint");
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    s.set_write_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let frame: &[u8] = match zmtp {
        Zmtp::V3(socket_type) => {
            zmtp3_handshake(&mut s, socket_type);
            // Flags MORE, size 0.
            &[0x01, 0x00]
        }
        Zmtp::V1 => {
            // The identity message: size 1 (the flags byte alone), flags 0.
            s.write_all(&[0x01, 0x00]).expect("identity");
            // Size 1, flags MORE.
            &[0x01, 0x01]
        }
    };
    let chunk = frame.repeat(500_000);
    let mut sent = 0;
    while sent < limit {
        match s.write_all(&chunk) {
            Ok(()) => sent += chunk.len(),
            Err(e) if matches!(e.kind(), ErrorKind::BrokenPipe | ErrorKind::ConnectionReset) => return sent,
            Err(e) => {
                panic!("{endpoint} {zmtp:?}: write after {sent} bytes: {e} (not dropped: the peer stopped reading)")
            }
        }
    }
    // Everything was written: the drop must show as EOF or a reset.
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return sent,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return sent,
            Err(e) => panic!("{endpoint} {zmtp:?}: {sent} bytes of frames sent, connection still open: {e}"),
        }
    }
}

/// Connects to `endpoint` over plain TCP as a ZMTP 3.0 DEALER and sends
/// `frames` frames of 40 bytes flagged MORE, each in its own TCP segment
/// (`TCP_NODELAY`, 1 ms apart) so that each is read on its own, the
/// message never ended; returns the connection, still open.
fn paced_unfinished_message(endpoint: &str, frames: usize) -> TcpStream {
    let addr = endpoint.strip_prefix("tcp://").expect("a tcp:// endpoint");
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_nodelay(true).expect("nodelay");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    zmtp3_handshake(&mut s, "DEALER");
    let mut frame = vec![0x01, 40];
    frame.resize(42, b'x');
    for _ in 0..frames {
        s.write_all(&frame).expect("a frame of the unfinished message");
        std::thread::sleep(Duration::from_millis(1));
    }
    s
}

#[test]
fn bounds_frames_of_an_unfinished_message_read_one_at_a_time_do_not_pin_read_buffers() {
    // libzmq's zero-copy receive let a frame of 33 bytes or more point
    // into the 8 KiB read buffer, keeping all of it (~18 KiB with its
    // counters) alive while the frame waited in the pipe: 40-byte frames
    // sent one per TCP segment cost ~190 times what ZMQ_MAXMSGSIZE counts
    // (~6 GiB per connection at the default limit). emq's libzmq copies
    // frames when a size limit is set (vendor/zeromq-src/EMQ-PATCH.md).
    let _w = Watchdog::new("bounds_paced_frames", 120);
    let dir = TestDir::new("bounds_paced_frames");
    let r = memory_router(&dir);
    let pid = r.child.pid();
    let before = rss_kib(pid);
    // 3,000 frames: 312 KB counted, ~54 MB of pinned buffers before.
    let open = paced_unfinished_message(&r.frontend, 3_000);
    let grown = rss_kib(pid).saturating_sub(before);
    eprintln!("3,000 paced frames, unfinished: the router grew {grown} KiB");
    assert!(grown < 12 * 1024, "3,000 frames of 40 bytes, unfinished, grew the router by {grown} KiB (want < 12 MiB)");
    drop(open);
    still_serves(&r, "paced");
}

/// Streams `limit` bytes of an endless message at each of `targets`,
/// checking each connection is dropped before that, then that the peak
/// resident memory of `pid` grew less than 64 MiB over its resident memory
/// before, and that it comes back within 16 MiB of it.
fn endless_messages_are_dropped(pid: i32, targets: &[(&str, Zmtp)], limit: usize) {
    let before = rss_kib(pid);
    for &(endpoint, zmtp) in targets {
        let sent = stream_endless_message(endpoint, zmtp, limit);
        assert!(sent < limit, "{endpoint} {zmtp:?}: all {limit} bytes taken before the drop");
        eprintln!("{endpoint} {zmtp:?}: dropped after {sent} bytes sent; peak {} KiB", peak_kib(pid));
    }
    let peak = peak_kib(pid);
    assert!(peak < before + 64 * 1024, "resident {before} KiB before, peak {peak} KiB (want < +64 MiB)");
    let settled = crate::common::wait::until(Duration::from_secs(10), || rss_kib(pid) < before + 16 * 1024);
    assert!(settled, "resident {before} KiB before, {} KiB after the drops (want < +16 MiB)", rss_kib(pid));
}

#[test]
fn bounds_a_message_that_never_ends_drops_its_connection_and_the_router_keeps_serving() {
    // Empty frames flagged MORE, never the last one: libzmq held every
    // frame in the pipe (the router never sees an unfinished message), ~64
    // bytes of memory per 2 bytes sent, without bound (20 MB sent took the
    // router to 620 MiB). emq's libzmq counts the whole message against
    // ZMQ_MAXMSGSIZE, 64 bytes a frame (vendor/zeromq-src/EMQ-PATCH.md):
    // at the default limits the connection is dropped after ~1 MB.
    let _w = Watchdog::new("bounds_endless_message", 120);
    let dir = TestDir::new("bounds_endless_message");
    let r = memory_router(&dir);
    let pid = r.child.pid();
    let targets = [
        (r.frontend.as_str(), Zmtp::V3("DEALER")),
        (r.backend.as_str(), Zmtp::V3("DEALER")),
        (r.admin.as_str(), Zmtp::V3("DEALER")),
        (r.frontend.as_str(), Zmtp::V1),
    ];
    endless_messages_are_dropped(pid, &targets, 20 << 20);
    still_serves(&r, "endless");
}

#[test]
fn bounds_a_message_that_never_ends_drops_its_connection_to_emq_pubsub() {
    let _w = Watchdog::new("bounds_endless_pubsub", 120);
    let dir = TestDir::new("bounds_endless_pubsub");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_emq-pubsub"));
    cmd.args(["--in", "tcp://127.0.0.1:*", "--out", "tcp://127.0.0.1:*"]).env("EMQ_LOG", "warn");
    let child = Child::spawn("emq-pubsub", &mut cmd, &dir.join("pubsub.log"));
    // Its first line names the endpoints.
    let line = crate::common::wait::until(Duration::from_secs(20), || child.log_text().contains("out="));
    assert!(line, "emq-pubsub printed no endpoints: {}", child.log_text());
    let text = child.log_text();
    let field = |name: &str| text.split_whitespace().find_map(|p| p.strip_prefix(name)).map(String::from);
    let (inp, out) = (field("in=").expect("in="), field("out=").expect("out="));
    // The PUB socket reads its subscribers' subscriptions: it is bounded too.
    endless_messages_are_dropped(child.pid(), &[(&inp, Zmtp::V3("DEALER")), (&out, Zmtp::V3("SUB"))], 20 << 20);
    let ctx = zmq::Context::new();
    let sub = ctx.socket(zmq::SUB).unwrap();
    sub.set_linger(0).unwrap();
    sub.set_subscribe(b"").unwrap();
    sub.connect(&out).unwrap();
    let publisher = Peer::new(&inp, b"publisher-after-endless");
    let mut got = None;
    for i in 0..100 {
        // A SUB joins late: the first messages may be lost.
        publisher.send(&[b"", b"eMQP/1.0", b"PUBLISH", format!("p{i}").as_bytes(), b"news", b"[1]"]);
        if sub.poll(zmq::POLLIN, 100).unwrap() > 0 {
            got = Some(sub.recv_multipart(0).unwrap());
            break;
        }
    }
    assert_eq!(got, Some(vec![b"news".to_vec(), b"[1]".to_vec()]));
}

#[test]
fn bounds_exact_a_message_of_64_frames_up_to_twice_max_message_bytes_reaches_the_router() {
    // max_message_bytes 4096: ZMQ_MAXMSGSIZE is 2 × 4096 + 64 × 64 = 12,288
    // (limits::zmq_max_msg_size), against which libzmq counts a message's
    // bytes plus 64 for every frame but the last.
    let _w = Watchdog::new("bounds_exact_64_frames", 30);
    assert_eq!(emq::limits::zmq_max_msg_size(4096), 12_288);
    let cfg = crate::emqp_router::config(1, |r| r.max_message_bytes = Some(4096));
    let h = emq::router::start(cfg).expect("router starts");
    let worker = Peer::new(&h.endpoints.backend, b"worker-64");
    worker.inform_worker(r#"[[10, "q"]]"#);
    worker.ready(2);
    let client = Peer::new(&h.endpoints.frontend, b"client-64");
    // 63 frames sent, 64 with the identity (MAX_FRAMES), of `total` bytes.
    let request = |msgid: &str, total: usize| -> Vec<Vec<u8>> {
        let mut f: Vec<Vec<u8>> =
            [&b""[..], b"eMQP/1.0", b"REQUEST", msgid.as_bytes(), b"q", b""].map(<[u8]>::to_vec).into();
        let head: usize = f.iter().map(Vec::len).sum();
        f.extend(std::iter::repeat_n(b"x".to_vec(), 56));
        f.push(vec![b'y'; total - head - 56]);
        assert_eq!((f.len(), f.iter().map(Vec::len).sum::<usize>()), (63, total));
        f
    };
    let send = |p: &Peer, f: &[Vec<u8>]| p.send(&f.iter().map(Vec::as_slice).collect::<Vec<_>>());
    // Exactly max_message_bytes: accepted, and its worker gets all 63 frames.
    send(&client, &request("at-limit", 4096));
    assert_eq!(client.expect("REPLY")[4], b"at-limit");
    let job = worker.expect("REQUEST");
    // (The router adds `reply-requested` to its headers.)
    assert_eq!((job.len(), job.iter().map(Vec::len).sum::<usize>()), (63, 4096 + b"reply-requested".len()));
    // Twice it (12,160 counted): it reaches the router, which refuses it.
    send(&client, &request("twice", 8192));
    let err = client.expect("ERROR");
    assert_eq!((err[4].as_slice(), err[5].as_slice()), (&b"twice"[..], &b"TOO_BIG"[..]));
    // 7 frames counted exactly 12,288 (12,288 - 6 × 64 bytes): refused by
    // the router; one byte more: dropped with the connection by ZeroMQ.
    let body = 12_288 - 6 * 64 - (b"eMQP/1.0REQUESTedgeq".len());
    client.request("edge", "q", "", &"e".repeat(body));
    let err = client.expect("ERROR");
    assert_eq!((err[4].as_slice(), err[5].as_slice()), (&b"edge"[..], &b"TOO_BIG"[..]));
    let over = Peer::new(&h.endpoints.frontend, b"client-over");
    over.request("over", "q", "", &"o".repeat(body + 1));
    over.expect_none("ERROR", 500);
    assert_eq!(h.counters().rejected_too_big.load(Relaxed), 2, "the one over was never read");
    // A job result up to the same bound completes its job (the result frame
    // is not held to max_message_bytes); one byte more is dropped with the
    // worker's connection, and its job stays unanswered.
    client.request("b", "q", "", "small");
    assert_eq!(client.expect("REPLY")[4], b"b");
    let job_b = worker.expect("REQUEST");
    let reply = |msgid: &[u8], extra: usize| -> Vec<Vec<u8>> {
        let head = b"eMQP/1.0".len() + b"REPLY".len() + b"rep".len() + msgid.len();
        let result = vec![b'r'; 12_288 - 5 * 64 - head + extra];
        let frames: [&[u8]; 6] = [b"", b"eMQP/1.0", b"REPLY", b"rep", &result, msgid];
        assert_eq!(frames.iter().map(|f| f.len()).sum::<usize>() + 5 * 64, 12_288 + extra);
        frames.map(<[u8]>::to_vec).into()
    };
    send(&worker, &reply(&job[3], 1));
    // Let the DEALER reconnect (what it wrote after the dropped REPLY on that
    // connection would be lost too).
    std::thread::sleep(Duration::from_millis(500));
    send(&worker, &reply(&job_b[3], 0));
    let done = crate::common::wait::until(Duration::from_secs(5), || h.counters().completed_jobs.load(Relaxed) == 1);
    assert!(done, "the result at the bound completed its job");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(h.counters().completed_jobs.load(Relaxed), 1, "the result one byte over never arrived");
}

#[test]
fn bounds_a_message_that_never_ends_drops_its_connection_to_emq_scheduler_admin() {
    // Its admin socket had no ZMQ_MAXMSGSIZE at all (10 MB of empty frames
    // took an unpatched emq-scheduler to 321 MiB, 271 MiB after the close):
    // now 132 KiB (limits::SCHEDULER_ADMIN_MAX_MESSAGE_BYTES).
    let _w = Watchdog::new("bounds_endless_scheduler_admin", 120);
    let dir = TestDir::new("bounds_endless_scheduler_admin");
    let (router_port, admin_port) = (free_port(), free_port());
    let admin_addr = zmq_endpoint(admin_port);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_emq-scheduler"));
    // No router there: the scheduler keeps trying; its admin socket serves.
    cmd.args(["--frontend", &zmq_endpoint(router_port), "--scheduler-admin", &admin_addr]);
    cmd.arg("--data-dir").arg(dir.join("scheduler-data")).env("EMQ_LOG", "warn");
    let child = Child::spawn("emq-scheduler", &mut cmd, &dir.join("scheduler.log"));
    eventually(20, "scheduler admin port", || is_listening(admin_port));
    endless_messages_are_dropped(child.pid(), &[(&admin_addr, Zmtp::V3("DEALER"))], 20 << 20);
    let peer = Peer::new(&admin_addr, b"admin-after-endless");
    peer.send(&[b"", b"eMQP/1.0", b"SCHEDULES", b"s1"]);
    let reply = peer.expect("REPLY");
    let body: serde_json::Value = serde_json::from_slice(reply.last().expect("a body")).expect("JSON");
    assert_eq!(body, serde_json::json!([]), "no schedules");
}

/// Descriptors process `pid` has open.
fn open_fds(pid: i32) -> u64 {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).expect("the process's descriptors");
    u64::try_from(fds.count()).expect("a count")
}

#[test]
fn bounds_connections_past_the_descriptor_limit_pause_accepting_without_a_busy_loop() {
    // libzmq's listener kept its listening socket polled while accept
    // failed with EMFILE: the connection waiting in the backlog made it
    // readable again at once, and the I/O thread spun (~2 s of CPU in 2 s,
    // 1.3 on two shared cores) for as long as the connections stayed open.
    // emq's patched libzmq stops polling it for 100 ms after each such
    // failure (vendor/zeromq-src/EMQ-PATCH.md).
    const LIMIT: u64 = 256;
    let _w = Watchdog::new("bounds_emfile", 120);
    let dir = TestDir::new("bounds_emfile");
    let (fp, bp, ap) = (free_port(), free_port(), free_port());
    let (frontend, backend, admin_addr) = (zmq_endpoint(fp), zmq_endpoint(bp), zmq_endpoint(ap));
    let mut cmd = Command::new(rust_router_bin());
    cmd.args(["--frontend", &frontend, "--backend", &backend, "--admin", &admin_addr, "--text", "off"]);
    cmd.args(["--metrics", "off", "--durability", "memory", "--log", "warn"]).arg("--data-dir").arg(dir.join("data"));
    crate::common::proc::limit_descriptors(&mut cmd, LIMIT, LIMIT);
    let child = Child::spawn("router", &mut cmd, &dir.join("router.log"));
    eventually(20, "eMQP ports", || [fp, bp, ap].iter().all(|&p| is_listening(p)));
    let pid = child.pid();
    // Raw TCP connections that never say anything, each one accepted a
    // descriptor of the router's, until they are all taken, and 16 more
    // that wait in the listen backlog (libzmq's is 100, so connecting
    // never waits for it).
    let to: std::net::SocketAddr = format!("127.0.0.1:{fp}").parse().expect("address");
    let mut held = Vec::new();
    let mut past_limit = 0;
    while past_limit < 16 && held.len() < 2 * LIMIT as usize {
        held.push(TcpStream::connect_timeout(&to, Duration::from_secs(2)).expect("connect"));
        if open_fds(pid) >= LIMIT {
            past_limit += 1;
        }
    }
    eventually(10, "the router's descriptors all taken", || open_fds(pid) >= LIMIT);
    std::thread::sleep(Duration::from_secs(1));
    let before = cpu_time(pid);
    std::thread::sleep(Duration::from_secs(2));
    let spent = cpu_time(pid) - before;
    eprintln!("router CPU in 2 s out of descriptors: {spent:?}");
    assert_eq!(open_fds(pid), LIMIT, "still out of descriptors at the end");
    assert!(spent < Duration::from_millis(200), "the router used {spent:?} of CPU in 2 s out of descriptors");
    // Once the connections close, the router serves again.
    drop(held);
    let status = crate::common::admin::request(&admin_addr, "STATUS").expect("STATUS answered");
    assert!(status["emq"].is_object(), "{status}");
    let r = crate::common::router::Router {
        kind: crate::common::router::RouterKind::Rust(rust_router_bin()),
        frontend,
        backend,
        admin: admin_addr,
        text: None,
        metrics: None,
        child,
    };
    still_serves(&r, "emfile");
}

/// `ZMQ_MAXMSGSIZE` of the CURVE server in [`curve_server_process`].
const CURVE_SERVER_LIMIT: i64 = 4096;
/// What makes [`curve_server_process`] serve: the server's secret key in Z85.
const CURVE_SERVER_ENV: &str = "EMQ_TEST_CURVE_SERVER_SECRET";

#[test]
#[ignore = "the CURVE server child of the bounds_curve_* tests: serves only when they start it"]
fn curve_server_process() {
    // A libzmq ROUTER as CURVE server (no ZAP handler, so any client key
    // is accepted) with ZMQ_MAXMSGSIZE 4096, echoing every message to its
    // sender; prints `endpoint=<its address>` and serves until killed.
    let Ok(secret) = std::env::var(CURVE_SERVER_ENV) else { return };
    let secret = zmq::z85_decode(&secret).expect("a Z85 secret key");
    let ctx = zmq::Context::new();
    let router = ctx.socket(zmq::ROUTER).expect("ROUTER");
    router.set_curve_server(true).expect("curve_server");
    router.set_curve_secretkey(&secret).expect("curve_secretkey");
    router.set_maxmsgsize(CURVE_SERVER_LIMIT).expect("maxmsgsize");
    router.set_linger(0).expect("linger");
    router.bind("tcp://127.0.0.1:*").expect("bind");
    println!("endpoint={}", router.get_last_endpoint().expect("endpoint").expect("UTF-8"));
    loop {
        let msg = router.recv_multipart(0).expect("recv");
        router.send_multipart(msg, 0).expect("echo");
    }
}

/// A CURVE server ([`curve_server_process`], this test binary run again)
/// on a fresh port: the child, its endpoint, and its public key.
fn curve_server(dir: &TestDir) -> (Child, String, [u8; 32]) {
    use crate::common::curvezmq::keypair;
    let (public, secret) = keypair();
    let mut cmd = Command::new(std::env::current_exe().expect("the test binary"));
    cmd.args(["--exact", "bounds::curve_server_process", "--ignored", "--nocapture", "--test-threads=1"]);
    cmd.env(CURVE_SERVER_ENV, zmq::z85_encode(&secret).expect("Z85"));
    let child = Child::spawn("curve-server", &mut cmd, &dir.join("curve-server.log"));
    let up = crate::common::wait::until(Duration::from_secs(20), || child.log_text().contains("endpoint="));
    assert!(up, "the CURVE server printed no endpoint: {}", child.log_text());
    let text = child.log_text();
    let endpoint = text.split_whitespace().find_map(|w| w.strip_prefix("endpoint=")).expect("endpoint=").to_string();
    (child, endpoint, public)
}

/// A CurveZMQ client (a DEALER to the server) connected to `endpoint`.
fn curve_client(endpoint: &str, server_key: &[u8; 32]) -> crate::common::curvezmq::CurveClient {
    let addr = endpoint.strip_prefix("tcp://").expect("a tcp:// endpoint");
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    s.set_write_timeout(Some(Duration::from_secs(10))).expect("timeout");
    crate::common::curvezmq::CurveClient::handshake(s, server_key, "DEALER")
}

/// Over the CurveZMQ connection `c`, streams MESSAGE commands whose boxes
/// hold empty frames flagged MORE, never the last one, up to `limit`
/// bytes (35 bytes a frame on the wire): a message that never ends, its
/// MORE flags seen only after decryption. Returns the bytes written before
/// the peer dropped the connection, or `Err` if it did not drop it.
fn stream_endless_curve_message(mut c: crate::common::curvezmq::CurveClient, limit: usize) -> Result<usize, String> {
    use std::io::{ErrorKind, Read};
    let mut sent = 0;
    while sent < limit {
        let chunk: Vec<u8> = (0..10_000).flat_map(|_| c.message_frame(b"", true)).collect();
        match c.stream.write_all(&chunk) {
            Ok(()) => sent += chunk.len(),
            Err(e) if matches!(e.kind(), ErrorKind::BrokenPipe | ErrorKind::ConnectionReset) => return Ok(sent),
            Err(e) => return Err(format!("write after {sent} bytes: {e} (not dropped: the peer stopped reading)")),
        }
    }
    let mut buf = [0u8; 4096];
    loop {
        match c.stream.read(&mut buf) {
            Ok(0) => return Ok(sent),
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return Ok(sent),
            Err(e) => return Err(format!("{sent} bytes of MORE frames sent, connection still open: {e}")),
        }
    }
}

/// Streams a CURVE endless message at `endpoint` (server key `server_key`,
/// process `pid`) and checks the connection is dropped before `limit`
/// bytes, that the peak resident memory of `pid` grew less than 16 MiB
/// over its resident memory before, and that it comes back within 8 MiB.
fn endless_curve_message_is_dropped(pid: i32, endpoint: &str, server_key: &[u8; 32], limit: usize) {
    let before = rss_kib(pid);
    let sent = stream_endless_curve_message(curve_client(endpoint, server_key), limit);
    let peak = peak_kib(pid);
    eprintln!("{endpoint} CURVE: {sent:?}; resident {before} KiB before, peak {peak} KiB");
    let sent = sent.unwrap_or_else(|e| panic!("{endpoint} CURVE: {e}"));
    assert!(sent < limit, "{endpoint} CURVE: all {limit} bytes taken before the drop");
    // What socket buffers took before the writes failed.
    assert!(sent < 8 << 20, "{endpoint} CURVE: {sent} bytes taken before the drop (want < 8 MiB)");
    assert!(peak < before + 16 * 1024, "resident {before} KiB before, peak {peak} KiB (want < +16 MiB)");
    let settled = crate::common::wait::until(Duration::from_secs(10), || rss_kib(pid) < before + 8 * 1024);
    assert!(settled, "resident {before} KiB before, {} KiB after the drop (want < +8 MiB)", rss_kib(pid));
}

#[test]
fn bounds_curve_complete_messages_under_the_limit_reach_a_curve_server() {
    // The positive control of the next test (the raw CurveZMQ client is
    // right): complete messages under ZMQ_MAXMSGSIZE (4096), one after the
    // other on one connection, each echoed back whole. 40 frames of 30
    // bytes count 40 × 30 + 39 × 64 = 3,696: any count carried over from
    // one message to the next would pass the limit at the second.
    let _w = Watchdog::new("bounds_curve_control", 60);
    let dir = TestDir::new("bounds_curve_control");
    let (_server, endpoint, key) = curve_server(&dir);
    let mut c = curve_client(&endpoint, &key);
    c.send(&[b"a", b"bb", b"ccc"]);
    assert_eq!(c.recv(), [b"a".to_vec(), b"bb".to_vec(), b"ccc".to_vec()]);
    for i in 0..50u8 {
        let frames: Vec<Vec<u8>> = (0..40).map(|j| vec![i ^ j; 30]).collect();
        c.send(&frames.iter().map(Vec::as_slice).collect::<Vec<_>>());
        assert_eq!(c.recv(), frames, "message {i}");
    }
    // Exactly at the limit: 2,000 + 64 + 2,032 = 4,096 passes; one byte
    // more and the connection is dropped, nothing echoed.
    let (head, at_limit) = (vec![b'h'; 2000], vec![b't'; 2032]);
    c.send(&[&head, &at_limit]);
    assert_eq!(c.recv(), [head.clone(), at_limit.clone()], "a message counting exactly 4,096");
    let mut over = curve_client(&endpoint, &key);
    over.send(&[&head, &[at_limit.as_slice(), b"x"].concat()]);
    let mut buf = [0u8; 64];
    let got = std::io::Read::read(&mut over.stream, &mut buf);
    assert!(
        matches!(got, Ok(0)) || matches!(&got, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "a message counting 4,097: {got:?} (want the connection dropped)"
    );
}

#[test]
fn bounds_curve_a_message_that_never_ends_drops_its_connection_to_a_curve_server() {
    // Under CURVE the MORE flag travels inside the box: the outer ZMTP
    // frames never carry it, so libzmq's decoders (emq patch 1) saw a
    // one-frame message in each and the count never grew; 40 MB of empty
    // MORE frames were all taken. emq's libzmq counts the decrypted frames
    // too (vendor/zeromq-src/EMQ-PATCH.md, "CURVE"): cut after ~64 frames.
    let _w = Watchdog::new("bounds_curve_endless", 120);
    let dir = TestDir::new("bounds_curve_endless");
    let (server, endpoint, key) = curve_server(&dir);
    endless_curve_message_is_dropped(server.pid(), &endpoint, &key, 40 << 20);
    // The server still serves a new connection.
    let mut c = curve_client(&endpoint, &key);
    c.send(&[b"after", b"endless"]);
    assert_eq!(c.recv(), [b"after".to_vec(), b"endless".to_vec()]);
}

#[test]
fn bounds_curve_a_message_that_never_ends_drops_its_connection_to_the_router() {
    // The router-level version of the test above, on the backend's CURVE
    // endpoint with the client's key allowed. TODO when the CURVE settings
    // land: check the flag names below against src/config/router.rs.
    use crate::common::curvezmq::{keypair, write_cert, CurveClient};
    let _w = Watchdog::new("bounds_curve_endless_router", 120);
    let dir = TestDir::new("bounds_curve_endless_router");
    let (server_pk, server_sk) = keypair();
    let (client_pk, client_sk) = keypair();
    let secret_file = dir.join("router.key_secret");
    write_cert(&secret_file, &server_pk, Some(&server_sk));
    let workers = dir.join("workers");
    std::fs::create_dir(&workers).expect("workers dir");
    write_cert(&workers.join("w1.key"), &client_pk, None);
    let curve_port = free_port();
    let curve_endpoint = zmq_endpoint(curve_port);
    let (secret_arg, workers_arg) = (secret_file.display().to_string(), workers.display().to_string());
    let r = crate::common::router::Router::start_with(
        &dir,
        crate::common::router::RouterKind::Rust(rust_router_bin()),
        &[
            "--durability",
            "memory",
            "--log",
            "warn",
            "--backend-curve",
            &curve_endpoint,
            "--curve-secret-key-file",
            &secret_arg,
            "--curve-workers-dir",
            &workers_arg,
        ],
    );
    eventually(20, "the CURVE backend port", || is_listening(curve_port));
    let pid = r.child.pid();
    let before = rss_kib(pid);
    let addr = curve_endpoint.strip_prefix("tcp://").expect("a tcp:// endpoint");
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    s.set_write_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let c = CurveClient::handshake_as(s, &server_pk, (&client_pk, &client_sk), "DEALER");
    let sent = stream_endless_curve_message(c, 40 << 20);
    let peak = peak_kib(pid);
    eprintln!("router CURVE backend: {sent:?}; resident {before} KiB before, peak {peak} KiB");
    let sent = sent.unwrap_or_else(|e| panic!("router CURVE backend: {e}"));
    assert!(sent < 40 << 20, "all 40 MiB taken before the drop");
    assert!(peak < before + 64 * 1024, "resident {before} KiB before, peak {peak} KiB (want < +64 MiB)");
    still_serves(&r, "curve-endless");
}
