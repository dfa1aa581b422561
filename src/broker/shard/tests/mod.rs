//! Shard tests without sockets, threads or sleeps: a [`Harness`] drives one
//! or more shards with messages and a hand-made clock, routes what they
//! send each other like the router does, and collects their frames and text
//! answers for exact checks.

mod counts;
mod deadline;
mod durable;
mod flow;
mod harness;
mod joblog;
mod lifecycle;
mod model;
mod observe;
mod peers;
mod policies;
mod retries;
mod schedulers;
mod scheduling;
mod text;
mod text_ext;
mod wal_faults;

use std::time::Duration;

use harness::{body, Harness};

use crate::protocol::text::ErrorCode;

#[test]
fn request_is_accepted_queued_then_dispatched_on_ready() {
    for shards in [1, 3] {
        let mut h = Harness::new(shards);
        h.inform("w1", &[(10, "q")]);
        assert_eq!(h.take_commands("w1"), ["ACK", "HEARTBEAT"]);
        h.request("c1", "m1", "q", "job-1");
        assert_eq!(h.take_commands("c1"), ["REPLY"], "the acceptance REPLY ({shards} shards)");
        assert_eq!(h.waiting("q"), ["job-1"]);
        h.ready("w1", 1);
        let sent = h.take_requests("w1");
        assert_eq!(sent.len(), 1);
        assert_eq!(body(&sent[0]), "job-1");
        assert!(h.waiting("q").is_empty());
        assert_eq!(h.inflight("w1"), ["m1"]);
        assert_eq!(h.slots("w1"), 0);
    }
}

#[test]
fn text_sched_ask_ack_and_timeout() {
    let mut h = Harness::with_config(1, |c| c.text.offer_timeout = Duration::from_secs(10));
    assert_eq!(h.text_sched(1, "q", "t1"), harness::done());
    let offer = h.text_ask(1, "q");
    let id = harness::offer_id(&offer).expect("an offer");
    assert_eq!(h.text_ask(2, "q"), crate::broker::text_port::TextOutcome::Nope);
    h.advance(Duration::from_secs(11));
    assert_eq!(h.waiting("q"), ["t1"], "the lapsed offer is back at the front");
    assert_eq!(h.text_answer(1, id, crate::broker::text_port::TextAnswer::Ack), harness::refused(ErrorCode::NoTask));
}

#[test]
fn reply_completes_and_kbye_keeps_inflight_until_grace() {
    let mut h = Harness::with_config(1, |c| c.kbye_grace = Duration::from_secs(60));
    h.inform("w1", &[(10, "q")]);
    h.ready("w1", 2);
    h.request("c1", "m1", "q", "a");
    h.request("c1", "m2", "q", "b");
    let sent = h.take_requests("w1");
    assert_eq!(harness::headers(&sent[0]), b"reply-requested,guarantee");
    h.reply("w1", "m1");
    assert_eq!(h.inflight("w1"), ["m2"]);
    h.kbye("w1");
    h.request("c1", "m3", "q", "c");
    assert_eq!(h.waiting("q"), ["c"], "no new jobs after KBYE");
    h.advance(Duration::from_secs(30));
    h.heartbeat("w1");
    assert_eq!(h.inflight("w1"), ["m2"], "kept within the grace");
    h.advance(Duration::from_secs(31));
    assert_eq!(h.waiting("q"), ["b", "c"], "requeued at the front after the grace");
}

#[test]
fn released_text_offer_goes_back_to_the_front() {
    let mut h = Harness::new(1);
    h.text_sched(1, "q", "t1");
    h.text_sched(1, "q", "t2");
    let id = harness::offer_id(&h.text_ask(1, "q")).expect("an offer");
    h.text_release(1, id);
    assert_eq!(h.waiting("q"), ["t1", "t2"]);
    assert_eq!(h.ctx.counters.text_returned_disconnect.load(std::sync::atomic::Ordering::Relaxed), 1);
}
