//! Point 2: identities. The router's frontend and backend set
//! `ROUTER_HANDOVER`, so the newest connection with an identity takes it
//! over and the old connection's pipe is dropped: a peer that reconnects
//! under a fixed identity is served at once, and the router's memory stays
//! flat however often it does.

use std::time::{Duration, Instant};

use crate::common::proc::TestDir;
use crate::common::router::{Router, RouterKind};
use crate::common::watchdog;
use crate::emqp_router::Peer;

/// How long one REQUEST may wait for its acceptance REPLY before it counts
/// as unanswered (generous: the machine is shared).
const ANSWER_WAIT: Duration = Duration::from_secs(2);

/// Resident set size of `pid` in KiB (`VmRSS` in /proc/<pid>/status).
pub fn rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// One REQUEST on a fresh DEALER with identity `id`; true when its
/// acceptance REPLY came back within [`ANSWER_WAIT`].
fn request_once(ctx: &zmq::Context, endpoint: &str, id: &[u8], msgid: &str) -> bool {
    let s = ctx.socket(zmq::DEALER).expect("socket");
    s.set_identity(id).expect("identity");
    s.set_linger(0).expect("linger");
    s.connect(endpoint).expect("connect");
    let frames: [&[u8]; 7] = [b"", b"eMQP/1.0", b"REQUEST", msgid.as_bytes(), b"default", b"", b"job"];
    s.send_multipart(frames, 0).expect("send");
    let end = Instant::now() + ANSWER_WAIT;
    while let Some(left) = end.checked_duration_since(Instant::now()) {
        if s.poll(zmq::POLLIN, left.as_millis() as i64).unwrap_or(0) == 0 {
            return false;
        }
        let Ok(f) = s.recv_multipart(0) else { return false };
        if f.get(2).map(Vec::as_slice) == Some(b"REPLY") && f.get(4).map(Vec::as_slice) == Some(msgid.as_bytes()) {
            return true;
        }
    }
    false
}

#[test]
fn thousands_of_reconnects_of_one_client_identity_are_all_answered_and_memory_stays_flat() {
    const RECONNECTS: usize = 3_000;
    const WARM: usize = 1_000;
    let _w = watchdog::start("thousands_of_reconnects", Duration::from_secs(240));
    let dir = TestDir::new("handover-clients");
    let router = Router::start_kind(&dir, RouterKind::Rust(crate::common::router::rust_router_bin()));
    let pid = router.child.pid();
    // A worker that completes every job (the warm-up's), so the queue
    // stays empty and the only thing that could grow is per-connection
    // state.
    let w = Peer::new(&router.backend, b"handover-worker");
    w.inform_worker(r#"[[10, "default"]]"#);
    w.ready(1);
    let ctx = zmq::Context::new();
    let (mut lost, mut rss_warm) = (Vec::new(), 0);
    let t0 = Instant::now();
    for i in 0..RECONNECTS {
        // Past the warm-up each msgid is one of the warm-up's again: a
        // duplicate (docs/failover.md "Duplicates"), answered with its
        // acceptance and making no job, so the router's duplicate window
        // (about 150 bytes per key, kept 10 minutes: 2,000 new keys would
        // look like a leak of 0.14 KiB per reconnect) stays as it was
        // after the warm-up and what is measured is the connections' own
        // state.
        let msgid = format!("churn-{}", i % WARM);
        if !request_once(&ctx, &router.frontend, b"fixed-client-identity", &msgid) {
            lost.push(i);
        }
        // The worker takes the job, completes it and frees its slot.
        while let Some(f) = w.recv_within(0) {
            if f[2] == b"REQUEST" {
                w.job_reply(&f[3]);
                w.ready(1);
            }
        }
        if i == WARM - 1 {
            rss_warm = rss_kib(pid);
        }
    }
    let rss_end = rss_kib(pid);
    let growth = rss_end.saturating_sub(rss_warm);
    let measured = (RECONNECTS - WARM) as f64;
    eprintln!(
        "{RECONNECTS} reconnects of one identity in {:?}: {} unanswered; router RSS {rss_warm} KiB after {WARM}, \
         {rss_end} KiB at the end (+{growth} KiB, {:.2} KiB per reconnect)",
        t0.elapsed(),
        lost.len(),
        growth as f64 / measured
    );
    assert!(lost.is_empty(), "{} REQUESTs unanswered, e.g. {:?}", lost.len(), &lost[..lost.len().min(10)]);
    // Measured alone: +44 KiB from reconnect 100 to 1,000. The first 1,000
    // are warm-up: how high the heap climbs during them follows the
    // machine's load (+592 KiB over 100..1,000 once in a CI run beside
    // other tests, +350-620 KiB with the disk busy), a high-water mark
    // reached once. A leak grows on: ~0.13 KiB per reconnect (a pipe's or
    // an identity's bookkeeping kept) passes 256 KiB over the next 2,000.
    assert!(growth < 256, "router RSS grew {growth} KiB over {measured} reconnects after the warm-up");
}

#[test]
fn a_worker_reconnecting_under_its_identity_while_the_old_connection_is_open_takes_over() {
    let _w = watchdog::start("worker_handover", Duration::from_secs(60));
    for shards in [1, 3] {
        let h = emq::router::start(crate::emqp_router::config(shards, |_| {})).expect("router starts");
        let (old, c) = super::worker_holding(&h, b"handover-w", b"handover-c", "j1");
        // The old connection stays open (half-open, as far as the router
        // can tell); a new one comes with the same identity and re-INFORMs.
        let new = Peer::new(&h.endpoints.backend, b"handover-w");
        new.inform_worker(r#"[[10, "default"]]"#);
        new.ready(2);
        assert_eq!(new.expect("REQUEST")[3], b"j1", "the job in flight on the replaced registration comes back");
        c.request("j2", "default", "", "two");
        assert_eq!(new.expect("REQUEST")[3], b"j2");
        old.expect_none("REQUEST", 300);
        assert_eq!(h.counters().requeued_jobs.load(std::sync::atomic::Ordering::Relaxed), 1, "{shards} shards");
    }
}
