//! REQUEST, admission, selection, READY credit and the unknown-queue
//! fallback (flow.rs), each on 1 and 3 shards.

use super::harness::Harness;
use super::observe::shape;
use crate::broker::egress::{Dest, OnFail};
use crate::broker::inbox::ShardMsg;
use crate::protocol::text::ErrorCode;

/// The shard counts most tests run on.
const SHARDS: [usize; 2] = [1, 3];

/// One worker `w1` serving `q` with `slots` READYs, on `shards` shards.
fn one_worker(shards: usize, slots: usize) -> Harness {
    let mut h = Harness::new(shards);
    h.inform("w1", &[(10, "q")]);
    h.ready("w1", slots);
    h.take_commands("w1");
    h
}

#[test]
fn acceptance_reply_frames_are_exact() {
    for shards in SHARDS {
        let mut h = one_worker(shards, 0);
        h.request("c1", "m1", "q", "job");
        let out = h.take_to("c1");
        assert_eq!(out.len(), 1, "{shards} shards");
        assert_eq!(shape(&out[0]), ["", "eMQP/1.0", "REPLY", "*", "m1"]);
        assert_eq!((out[0].dest, &out[0].on_fail), (Dest::Frontend, &OnFail::Count));
        assert_ne!(out[0].frames()[3], b"m1", "the REPLY has a msgid of its own");
    }
}

#[test]
fn dispatched_request_keeps_frames_and_adds_reply_requested() {
    let cases: [(&[u8], &str); 3] = [
        (b"guarantee,timeout:30", "reply-requested,guarantee,timeout:30"),
        (b"", "reply-requested"),
        (b"guarantee,reply-requested", "guarantee,reply-requested"),
    ];
    for shards in SHARDS {
        for (sent, forwarded) in cases {
            let mut h = one_worker(shards, 1);
            h.request_with("c1", "m1", "q", "job", sent, &[b"x1", b""]);
            let out = h.take_to("w1");
            assert_eq!(out.len(), 1);
            assert_eq!(shape(&out[0]), ["", "eMQP/1.0", "REQUEST", "*", "q", forwarded, "job", "x1", ""]);
            assert_eq!(out[0].frames()[3], b"m1", "frame 3 is the client's msgid");
            let key = h.key_of("w1").expect("registered");
            let home = h.shard_of("w1");
            assert_eq!((out[0].dest, &out[0].on_fail), (Dest::Backend, &OnFail::Job { home, key }));
        }
    }
}

/// Checks that `client` got exactly one ERROR for `msgid` with `code` and `text`.
fn assert_error(h: &mut Harness, client: &str, msgid: &str, code: &str, text: &str) {
    let out = h.take_to(client);
    assert_eq!(out.len(), 1, "one answer to {client}");
    assert_eq!(shape(&out[0]), ["", "eMQP/1.0", "ERROR", "*", msgid, code, text]);
    assert_eq!(out[0].dest, Dest::Frontend);
}

#[test]
fn full_queue_refuses_with_queue_full() {
    for shards in SHARDS {
        let mut h = Harness::with_config(shards, |c| c.max_queue_len = 2);
        h.inform("w1", &[(10, "q")]);
        h.request("c1", "m1", "q", "a");
        h.request("c1", "m2", "q", "b");
        assert_eq!(h.take_commands("c1"), ["REPLY", "REPLY"]);
        h.request("c1", "m3", "q", "c");
        assert_error(&mut h, "c1", "m3", "QUEUE_FULL", "queue q holds 2 jobs, its limit");
        assert_eq!(h.waiting("q"), ["a", "b"]);
        assert_eq!(h.counter(|c| &c.rejected_queue_full), 1);
        assert_eq!(h.counter(|c| &c.accepted_jobs), 2);
    }
}

#[test]
fn draining_refuses_with_shutting_down() {
    for shards in SHARDS {
        let mut h = one_worker(shards, 1);
        h.set_draining(true);
        h.request("c1", "m1", "q", "a");
        assert_error(&mut h, "c1", "m1", "SHUTTING_DOWN", ErrorCode::ShuttingDown.default_text());
        assert!(h.take_requests("w1").is_empty());
        assert_eq!(h.counter(|c| &c.rejected_shutting_down), 1);
        assert_eq!(h.counter(|c| &c.accepted_jobs), 0);
    }
}

#[test]
fn jobs_taken_back_may_exceed_the_queue_limit() {
    for shards in SHARDS {
        let mut h = Harness::with_config(shards, |c| c.max_queue_len = 1);
        h.inform("w1", &[(10, "q")]);
        h.ready("w1", 1);
        h.request("c1", "m1", "q", "a");
        h.request("c1", "m2", "q", "b");
        h.send_failed("w1", "m1", true);
        assert_eq!(h.waiting("q"), ["a", "b"], "the requeued job is stored above the limit");
    }
}

/// Workers `(id, weight, READYs)` on queue `q`, then `jobs` REQUESTs; the
/// workers the jobs went to, in order.
fn picks(shards: usize, workers: &[(&str, i64, usize)], jobs: usize) -> Vec<String> {
    let mut h = Harness::new(shards);
    for (id, weight, _) in workers {
        h.inform(id, &[(*weight, "q")]);
    }
    for (id, _, slots) in workers {
        h.ready(id, *slots);
    }
    let mut order = Vec::new();
    for n in 0..jobs {
        h.request("c1", &format!("m{n}"), "q", &format!("j{n}"));
        let got: Vec<&str> = workers.iter().map(|(id, ..)| *id).filter(|id| !h.take_requests(id).is_empty()).collect();
        order.push(got.join("+"));
    }
    order
}

#[test]
fn selection_takes_the_highest_tier_with_a_free_slot() {
    for shards in SHARDS {
        let workers = [("w1", 10, 2), ("w2", 10, 2), ("w3", 5, 2), ("w4", 0, 1)];
        let order = picks(shards, &workers, 8);
        assert_eq!(order, ["w1", "w2", "w1", "w2", "w3", "w3", "w4", ""], "{shards} shards");
    }
}

#[test]
fn selection_rotates_within_a_tier_and_skips_workers_without_slots() {
    for shards in SHARDS {
        let workers = [("w1", 5, 3), ("w2", 5, 0), ("w3", 5, 3)];
        assert_eq!(picks(shards, &workers, 5), ["w1", "w3", "w1", "w3", "w1"]);
    }
}

#[test]
fn ready_gives_credit_and_dispatch_takes_it() {
    for shards in SHARDS {
        let mut h = one_worker(shards, 3);
        assert_eq!(h.slots("w1"), 3);
        h.request("c1", "m1", "q", "a");
        assert_eq!(h.slots("w1"), 2);
        h.kbye("w1");
        h.ready("w1", 2);
        assert_eq!(h.slots("w1"), 2, "READY after KBYE gives no credit");
        h.ready("nobody", 1);
        assert_eq!(h.counter(|c| &c.unknown_worker_messages), 1);
    }
}

#[test]
fn ready_dispatches_waiting_jobs_oldest_first() {
    for shards in SHARDS {
        let mut h = one_worker(shards, 0);
        for n in 0..3 {
            h.request("c1", &format!("m{n}"), "q", &format!("j{n}"));
        }
        h.ready("w1", 2);
        let sent = h.take_bodies("w1");
        assert_eq!(sent, ["j0", "j1"]);
        assert_eq!((h.waiting("q"), h.slots("w1")), (vec!["j2".to_string()], 0));
    }
}

/// For every placement of queues `a` and `b` on the shards (and `w`'s home
/// among them, in order or interleaved), a worker serving `[(10, a), (5, b)]` with jobs waiting in
/// both takes `a`'s first on READY (EventMQ walks the INFORM order).
#[test]
fn ready_prefers_the_first_queue_in_inform_order() {
    for shards in SHARDS {
        let placements = (0..shards).flat_map(|x| (0..shards).map(move |y| (x, y)));
        for ((sa, sb), seed) in placements.flat_map(|p| [(p, None), (p, Some(7))]) {
            let mut h = Harness::new(shards);
            h.seed = seed;
            let (a, b) = (h.name_on(sa, "a"), h.name_on(sb, "b"));
            h.inform("w", &[(10, &a), (5, &b)]);
            h.request("c1", "mb", &b, "job-b");
            h.request("c1", "ma", &a, "job-a");
            h.ready("w", 1);
            let sent = h.take_bodies("w");
            assert_eq!(sent, ["job-a"], "{shards} shards, a on {sa}, b on {sb}, w on {}, {seed:?}", h.shard_of("w"));
            h.ready("w", 1);
            assert_eq!(h.take_bodies("w"), ["job-b"]);
        }
    }
}

#[test]
fn ready_wakes_only_the_workers_own_queues() {
    for shards in SHARDS {
        let mut h = Harness::new(shards);
        h.inform("w1", &[(10, "a")]);
        h.inform("w2", &[(10, "b")]);
        h.request("c1", "m1", "b", "job-b");
        h.ready("w1", 1);
        assert!(h.take_requests("w1").is_empty(), "w1 does not serve b");
        assert_eq!((h.waiting("b"), h.slots("w1")), (vec!["job-b".to_string()], 1));
        h.ready("w2", 1);
        assert_eq!(h.take_bodies("w2"), ["job-b"]);
    }
}

#[test]
fn unknown_queue_falls_back_to_default_keeping_d4() {
    for shards in SHARDS {
        let mut h = Harness::new(shards);
        h.inform("w1", &[(10, "default")]);
        h.ready("w1", 1);
        h.request("c1", "m1", "nosuch", "job");
        assert_eq!(h.take_commands("c1"), ["REPLY"]);
        let sent = h.take_requests("w1");
        assert_eq!(sent.len(), 1, "{shards} shards");
        let crate::protocol::emqp::Command::Request { queue, .. } = &sent[0].command else { unreachable!() };
        assert_eq!(queue, b"nosuch", "frame 4 keeps the queue the client named");
        let snaps: Vec<_> = (0..shards).flat_map(|i| h.snapshot(i).queues).collect();
        assert!(snaps.iter().all(|q| q.name != "nosuch"), "no queue is made for it");
    }
}

/// For `queue_learn_grace` after the router starts serving (a restart,
/// a take-over), a REQUEST for a queue no worker has declared yet keeps its
/// queue, where the worker re-registering a moment later finds it; after
/// the grace the unknown-queue rule holds again (issue 30).
#[test]
fn right_after_a_start_an_undeclared_queue_keeps_its_jobs_for_the_learn_grace() {
    for shards in SHARDS {
        let grace = std::time::Duration::from_secs(30);
        let mut h = Harness::with_config(shards, |c| c.queue_learn_grace = grace);
        h.inform("wd", &[(10, "default")]);
        h.ready("wd", 1);
        h.request("c1", "m1", "reports", "r1");
        assert_eq!(h.take_commands("c1"), ["REPLY"]);
        assert!(h.take_requests("wd").is_empty(), "{shards} shards: r1 did not go to default");
        assert_eq!(h.waiting("reports"), ["r1"]);
        // The reports worker re-registers and takes it.
        h.inform("wr", &[(10, "reports")]);
        h.ready("wr", 1);
        assert_eq!(h.take_bodies("wr"), ["r1"]);
        // After the grace (the idle workers expired meanwhile), a name no
        // worker declared goes to default again.
        h.advance(grace);
        h.request("c1", "m2", "nosuch", "n1");
        assert_eq!((h.waiting("nosuch"), h.waiting("default")), (vec![], vec!["n1".to_string()]), "{shards} shards");
        // Within the grace, but past max_queues: default, never QUEUE_LIMIT.
        let mut h = Harness::with_config(shards, |c| {
            c.queue_learn_grace = grace;
            c.max_queues = 1;
        });
        h.inform("wd", &[(10, "default")]);
        h.ready("wd", 1);
        h.request("c1", "m1", "other", "o1");
        assert_eq!(h.take_commands("c1"), ["REPLY"]);
        assert_eq!(h.take_bodies("wd"), ["o1"], "{shards} shards");
    }
}

#[test]
fn declared_queue_keeps_its_jobs_after_its_workers_left() {
    for shards in SHARDS {
        let mut h = Harness::new(shards);
        h.inform("w1", &[(10, "reports")]);
        h.inform("w2", &[(10, "default")]);
        h.kbye("w1");
        h.advance(crate::limits::HEARTBEAT_TIMEOUT);
        assert_eq!(h.key_of("w1"), None, "w1 is forgotten");
        h.ready("w2", 1);
        h.request("c1", "m1", "reports", "r1");
        assert_eq!(h.waiting("reports"), ["r1"], "waits for a reports worker");
        assert!(h.take_requests("w2").is_empty());
    }
}

#[test]
fn queue_holding_jobs_stays_and_falls_back_once_empty() {
    for shards in SHARDS {
        let mut h = Harness::new(shards);
        assert_eq!(h.text_sched(1, "t", "t1"), super::harness::done());
        h.request("c1", "m1", "t", "r1");
        assert_eq!(h.waiting("t"), ["t1", "r1"], "a queue holding jobs is known");
        for _ in 0..2 {
            let id = super::harness::offer_id(&h.text_ask(1, "t")).expect("an offer");
            h.text_answer(1, id, crate::broker::text_port::TextAnswer::Ack);
        }
        // The ASKs keep `t` known for the ASK grace; after it, `t` is unknown.
        h.advance(h.ctx.config.text.ask_grace);
        h.request("c1", "m2", "t", "r2");
        assert_eq!((h.waiting("t"), h.waiting("default")), (vec![], vec!["r2".to_string()]));
    }
}

/// A new eMQP job stays counted in transit (as the I/O thread counted it)
/// until a shard admits it (then it is in job_bytes) or refuses it: also
/// while it travels on to `default`'s shard, and when it is refused there.
#[test]
fn a_job_is_in_transit_until_a_shard_admits_or_refuses_it() {
    use std::sync::atomic::Ordering::Relaxed;
    for refuse in [false, true] {
        let mut h = Harness::new(3);
        let (home, default) = (h.shard_of("nosuch"), h.shard_of("default"));
        assert_ne!(home, default, "the test needs the fallback to cross shards");
        h.set_draining(refuse);
        let frames =
            crate::broker::types::JobFrames::new(b"m1", b"nosuch", b"", b"job", &[] as &[&[u8]]).expect("frames");
        let len = frames.len();
        h.ctx.in_transit_bytes.fetch_add(len, Relaxed);
        let client = super::harness::peer("c1");
        h.post(home, ShardMsg::Batch(vec![ShardMsg::Request { client, frames, fallback_done: false }]));
        assert!(h.step(home));
        assert_eq!(h.ctx.in_transit_bytes.load(Relaxed), len, "forwarded to default: still in transit");
        assert_eq!(h.ctx.job_bytes.load(Relaxed), 0);
        assert!(h.step(default));
        assert_eq!(h.ctx.in_transit_bytes.load(Relaxed), 0, "refused: {refuse}");
        assert_eq!(h.ctx.job_bytes.load(Relaxed), if refuse { 0 } else { len });
        let answer = if refuse { "ERROR" } else { "REPLY" };
        assert_eq!(h.take_commands("c1"), [answer]);
    }
}

/// The duplicate window (docs/failover.md "Duplicates"): the same
/// (identity, msgid) within 10 minutes gets the acceptance again and makes
/// no job, also when the first went to `default` (its key stays with the
/// named queue's shard); another identity, a ROUTER-made identity (zero
/// first byte) or the end of the window make a new job.
#[test]
fn a_request_sent_again_makes_no_second_job_within_the_window() {
    for shards in SHARDS {
        let mut h = Harness::new(shards);
        for queue in ["nowhere", "default"] {
            let msgid = format!("m-{queue}");
            h.request("c1", &msgid, queue, &format!("{queue}-first"));
            h.request("c1", &msgid, queue, &format!("{queue}-again"));
            assert_eq!(h.take_commands("c1"), ["REPLY", "REPLY"], "{shards} shards, {queue}");
        }
        assert_eq!(h.waiting("default"), ["nowhere-first", "default-first"], "{shards} shards");
        assert_eq!(h.counter(|c| &c.dedup_hits), 2, "{shards} shards");
        h.request("c2", "m-default", "default", "other identity");
        h.request("\0abcd", "m-x", "default", "router-made 1");
        h.request("\0abcd", "m-x", "default", "router-made 2");
        let want = ["nowhere-first", "default-first", "other identity", "router-made 1", "router-made 2"];
        assert_eq!(h.waiting("default"), want, "{shards} shards");
        h.advance(crate::limits::DEDUP_WINDOW);
        h.request("c1", "m-default", "default", "ten minutes on");
        assert_eq!(h.counter(|c| &c.dedup_hits), 2, "{shards} shards");
        assert_eq!(h.counter(|c| &c.accepted_jobs), 6, "{shards} shards");
    }
}
