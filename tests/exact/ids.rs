//! Point 1: broker-assigned job ids. Client msgids are not unique (two
//! clients may use one); two accepted jobs with one msgid on one worker
//! must never shadow each other.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::common::admin::admin;
use crate::emqp_router::{config, eventually, Peer, Watchdog};

#[test]
fn two_jobs_with_one_msgid_on_one_worker_both_come_back_when_it_dies() {
    let _w = Watchdog::new("two_jobs_with_one_msgid", 60);
    for shards in [1, 3] {
        let h = emq::router::start(config(shards, |r| {
            r.heartbeat_interval = Some("200ms".into());
            r.heartbeat_timeout = Some("800ms".into());
        }))
        .expect("router starts");
        let w1 = Peer::new(&h.endpoints.backend, b"dup-w1");
        w1.inform_worker(r#"[[10, "default"]]"#);
        w1.ready(2);
        super::wait_slots(&h, b"dup-w1", 2);
        // Two clients: one client sending a msgid again within 10 minutes
        // is a duplicate and makes no job (docs/failover.md "Duplicates");
        // two clients may share one. The first is accepted before the
        // second is sent, so the jobs' order is known.
        let c = Peer::new(&h.endpoints.frontend, b"dup-client");
        let c2 = Peer::new(&h.endpoints.frontend, b"dup-client-2");
        c.request("same-msgid", "default", "", "first");
        assert_eq!(c.expect("REPLY")[4], b"same-msgid");
        c2.request("same-msgid", "default", "", "second");
        assert_eq!(c2.expect("REPLY")[4], b"same-msgid");
        let got: Vec<Vec<u8>> = (0..2).map(|_| w1.expect("REQUEST")[6].clone()).collect();
        assert_eq!(got, [b"first".to_vec(), b"second".to_vec()], "{shards} shards");
        let status = admin(&h, "STATUS");
        assert_eq!(status["inflight_messages_by_queue"]["default"], 2, "both in flight: {status}");

        // w1 dies (goes silent); w2 registers and keeps heartbeating.
        let w2 = Peer::new(&h.endpoints.backend, b"dup-w2");
        w2.inform_worker(r#"[[10, "default"]]"#);
        w2.ready(2);
        let mut back = Vec::new();
        let end = Instant::now() + Duration::from_secs(10);
        while back.len() < 2 && Instant::now() < end {
            w2.send(&[b"", b"eMQP/1.0", b"HEARTBEAT", b"hb", b"0"]);
            if let Some(f) = w2.recv_within(100) {
                if f[2] == b"REQUEST" {
                    assert_eq!(f[3], b"same-msgid", "the worker still sees the client's msgid");
                    back.push(f[6].clone());
                }
            }
        }
        assert_eq!(back, [b"first".to_vec(), b"second".to_vec()], "both requeued, in order ({shards} shards)");
        assert_eq!(h.counters().requeued_jobs.load(Ordering::Relaxed), 2);

        // One job-result REPLY completes the oldest; the second completes the other.
        w2.job_reply(b"same-msgid");
        eventually(5, "one completed", || h.counters().completed_jobs.load(Ordering::Relaxed) == 1);
        let status = admin(&h, "STATUS");
        assert_eq!(status["inflight_messages_by_queue"]["default"], 1, "{status}");
        w2.job_reply(b"same-msgid");
        eventually(5, "both completed", || h.counters().completed_jobs.load(Ordering::Relaxed) == 2);
        // A third REPLY completes nothing. Barrier: a READY sent after it on
        // the same connection is handled after it, and a job dispatched on
        // that READY shows it has been.
        w2.job_reply(b"same-msgid");
        w2.ready(1);
        c.request("barrier", "default", "", "barrier");
        assert_eq!(w2.expect("REQUEST")[3], b"barrier");
        assert_eq!(h.counters().completed_jobs.load(Ordering::Relaxed), 2, "a third REPLY completes nothing");
    }
}
