//! `Worker` against a raw ROUTER playing the router backend: INFORM, ACK,
//! READY count, job-result REPLY frames, heartbeats, reconnect after
//! silence, failover, malformed input, KBYE on shutdown.

use std::time::Duration;

use crossbeam_channel::{bounded, Receiver};
use emq::client::worker::{JobError, Worker, WorkerConfig};

use super::{count, free_port, watchdog, Frames, RawRouter};

const V: &[u8] = b"eMQP/1.0";
const S: Duration = Duration::from_secs(5);

/// Receives the INFORM, checks its frames, ACKs it; returns the identity.
fn accept_inform(router: &RawRouter, queues: &[u8]) -> Vec<u8> {
    let f = router.recv_skip_hb(S).expect("INFORM");
    assert_eq!(f.len(), 7, "INFORM frames: {f:?}");
    assert_eq!(&f[1..4], &[b"".to_vec(), V.to_vec(), b"INFORM".to_vec()]);
    assert_eq!(f[0].len(), 36, "uuid4 identity");
    assert_eq!((f[5].as_slice(), f[6].as_slice()), (queues, b"worker".as_slice()));
    router.send(&f[0], &[b"", V, b"ACK", b"ack-id", &f[4]]);
    f[0].clone()
}

fn fast_config(ep: &str, concurrency: usize) -> WorkerConfig {
    let mut c = WorkerConfig::new(ep).concurrency(concurrency);
    c.heartbeat_interval = Duration::from_millis(100);
    c
}

#[test]
fn inform_ready_reply_heartbeat_kbye() {
    let _w = watchdog(30);
    let router = RawRouter::bind();
    let config = fast_config(&router.endpoint, 3).queues(vec![(10, "default".into()), (5, "email".into())]);
    let worker = Worker::start(config, |job| match job.body.as_slice() {
        b"fail" => Err(JobError::Failed("kaboom".into())),
        b"slow" => Err(JobError::Timeout),
        body => Ok([b"done:".as_slice(), body].concat()),
    })
    .unwrap();
    let id = accept_inform(&router, br#"[[10, "default"], [5, "email"]]"#);
    let msgs = router.collect(Duration::from_millis(500), Some(&id));
    assert_eq!(count(&msgs, &id, b"READY"), 3, "READY count = concurrency");
    assert!(msgs.iter().filter(|m| m[3] == b"READY").all(|m| m.len() == 5 && m[1].is_empty() && m[2] == V));
    assert!(count(&msgs, &id, b"HEARTBEAT") >= 2, "heartbeats every 100 ms");
    let hb = msgs.iter().find(|m| m[3] == b"HEARTBEAT").unwrap();
    assert!(hb.len() == 6 && std::str::from_utf8(&hb[5]).unwrap().parse::<f64>().is_ok());

    router.send(&id, &[b"", V, b"REQUEST", b"req-1", b"email", b"reply-requested,timeout:30", b"hello"]);
    let reply = router.recv_skip_hb(S).unwrap();
    assert_eq!(reply.len(), 7);
    assert_eq!(&reply[1..4], &[b"".to_vec(), V.to_vec(), b"REPLY".to_vec()]);
    assert_eq!(reply[4].len(), 36);
    assert_eq!((reply[5].as_slice(), reply[6].as_slice()), (br#"{"value": "done:hello"}"#.as_slice(), &b"req-1"[..]));
    assert_eq!(router.recv_skip_hb(S).unwrap()[3], b"READY");

    // No reply-requested (whole token only): READY alone.
    router.send(&id, &[b"", V, b"REQUEST", b"req-2", b"default", b"no-reply-requested", b"x"]);
    router.send(&id, &[b"", V, b"REQUEST", b"req-3", b"default", b"reply-requested", b"fail"]);
    router.send(&id, &[b"", V, b"REQUEST", b"req-4", b"default", b"reply-requested", b"slow"]);
    let msgs = router.collect(Duration::from_millis(600), Some(&id));
    assert_eq!(count(&msgs, &id, b"READY"), 3);
    let mut replies: Vec<(Vec<u8>, Vec<u8>)> =
        msgs.iter().filter(|m| m[3] == b"REPLY").map(|m| (m[6].clone(), m[5].clone())).collect();
    replies.sort();
    assert_eq!(
        replies,
        vec![
            (b"req-3".to_vec(), br#"{"value": "kaboom"}"#.to_vec()),
            (b"req-4".to_vec(), br#"{"value": "TimeoutError"}"#.to_vec())
        ]
    );
    let stats = worker.shutdown().unwrap();
    let kbye = router.recv_skip_hb(S).expect("KBYE");
    assert_eq!((kbye[0].as_slice(), kbye.len(), kbye[3].as_slice()), (id.as_slice(), 5, &b"KBYE"[..]));
    assert_eq!((stats.succeeded, stats.failed, stats.timed_out), (2, 1, 1));
    assert_eq!((stats.ready_sent, stats.replies_sent, stats.reconnects), (7, 3, 0));
}

/// A handler that blocks until the test releases it.
fn gated() -> (crossbeam_channel::Sender<()>, Receiver<()>) {
    bounded::<()>(16)
}

#[test]
fn reconnect_after_silence_announces_only_free_slots() {
    let _w = watchdog(30);
    let router = RawRouter::bind();
    let mut config = fast_config(&router.endpoint, 2);
    config.heartbeat_timeout = Duration::from_millis(300);
    config.heartbeat_liveness = 2;
    let (release, gate) = gated();
    let worker = Worker::start(config, move |_job| {
        gate.recv_timeout(Duration::from_secs(20)).map_err(|_| JobError::Timeout)?;
        Ok(b"late".to_vec())
    })
    .unwrap();
    let id1 = accept_inform(&router, b"");
    let msgs = router.collect(Duration::from_millis(300), Some(&id1));
    assert_eq!(count(&msgs, &id1, b"READY"), 2);
    router.send(&id1, &[b"", V, b"REQUEST", b"long-job", b"default", b"reply-requested", b"x"]);
    // Silence: no heartbeats from the router. After 600 ms: a new identity INFORMs.
    let id2 = accept_inform(&router, b"");
    assert_ne!(id1, id2, "reconnect uses a fresh identity");
    let msgs = router.collect(Duration::from_millis(500), Some(&id2));
    assert_eq!(count(&msgs, &id2, b"READY"), 1, "only the free slot is announced");
    release.send(()).unwrap();
    let msgs = router.collect(Duration::from_millis(500), Some(&id2));
    assert_eq!(count(&msgs, &id2, b"READY"), 1, "the busy slot is announced when its job ends");
    assert_eq!(count(&msgs, &id2, b"REPLY") + count(&msgs, &id1, b"REPLY"), 0, "old-connection result dropped");
    let stats = worker.shutdown().unwrap();
    assert_eq!((stats.reconnects, stats.ready_sent, stats.succeeded), (1, 4, 1));
}

#[test]
fn a_dead_address_in_the_list_costs_no_reconnect() {
    let _w = watchdog(30);
    let router = RawRouter::bind();
    let dead = format!("tcp://127.0.0.1:{}", free_port());
    let mut config = fast_config(&dead, 1).failover(&router.endpoint);
    config.inform_retry = Duration::from_millis(300);
    let worker = Worker::start(config, |_job| Ok(Vec::new())).unwrap();
    let id = accept_inform(&router, b"");
    let msgs: Vec<Frames> = router.collect(Duration::from_millis(300), Some(&id));
    assert_eq!(count(&msgs, &id, b"READY"), 1);
    let stats = worker.shutdown().unwrap();
    assert_eq!(stats.reconnects, 0, "connected to both addresses at once: the INFORM went to the live one");
}

#[test]
fn malformed_messages_are_counted_not_fatal() {
    let _w = watchdog(30);
    let router = RawRouter::bind();
    let worker = Worker::start(fast_config(&router.endpoint, 1), |job| Ok(job.body)).unwrap();
    let id = accept_inform(&router, b"");
    assert_eq!(router.recv_skip_hb(S).unwrap()[3], b"READY");
    router.send(&id, &[b"", V, b"REQUEST", b"m", b"q"]); // missing headers and body
    router.send(&id, &[b"", V, b"READY", b"m"]); // not a worker-side command
    router.send(&id, &[b"\xff\xfe"]);
    router.send(&id, &[b"", V, b"REQUEST", b"ok-1", b"q", b"reply-requested", b"\xffbin"]);
    let reply = router.recv_skip_hb(S).unwrap();
    assert_eq!((reply[5].as_slice(), reply[6].as_slice()), (r#"{"value": "\ufffdbin"}"#.as_bytes(), &b"ok-1"[..]));
    let stats = worker.shutdown().unwrap();
    assert_eq!((stats.malformed, stats.succeeded), (3, 1));
}
