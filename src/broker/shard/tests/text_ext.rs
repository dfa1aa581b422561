//! The shard's side of the text protocol's extensions: long-poll ASK,
//! queues kept known by ASK, and delivery counts of returned offers
//! (text-protocol.md "Extension: long-poll ASK", "One broker, one queue
//! namespace", "Limits on connections").

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use super::harness::{self, body, Harness};
use crate::broker::text_port::{TextAnswer, TextOutcome};
use crate::limits;
use crate::protocol::text::ErrorCode;

const S: Duration = Duration::from_secs(1);

fn data(o: &TextOutcome) -> Option<String> {
    match o {
        TextOutcome::Offer { data, .. } => Some(String::from_utf8_lossy(data).into_owned()),
        _ => None,
    }
}

#[test]
fn long_poll_asks_are_served_in_arrival_order_as_tasks_arrive() {
    for shards in [1, 3] {
        let mut h = Harness::new(shards);
        assert_eq!(h.text_ask_wait(1, "q", 10 * S), None, "nothing waits: the ASK waits");
        assert_eq!(h.text_ask_wait(2, "q", 10 * S), None);
        assert_eq!(h.text_ask(3, "q"), TextOutcome::Nope, "a plain ASK does not wait");
        h.text_sched(9, "q", "t1");
        assert_eq!(h.text_answers(1).iter().map(data).collect::<Vec<_>>(), [Some("t1".into())]);
        assert!(h.text_answers(2).is_empty());
        h.request("c1", "m1", "q", "t2");
        assert_eq!(h.text_answers(2).iter().map(data).collect::<Vec<_>>(), [Some("t2".into())], "eMQP jobs too");
        assert!(h.waiting("q").is_empty());
        assert_eq!(h.text_ask_wait(4, "q", 10 * S), None);
        h.advance(10 * S);
        assert_eq!(h.text_answers(4), [TextOutcome::Nope], "NOPE when the wait ends");
        assert_eq!(h.ctx.counters.text_ask_waits_expired.load(Relaxed), 1);
    }
}

#[test]
fn a_shorter_wait_after_a_longer_one_ends_on_time() {
    let mut h = Harness::new(1);
    assert_eq!(h.text_ask_wait(1, "q", 100 * S), None);
    h.text_sched(9, "q", "t1");
    assert_eq!(h.text_answers(1).len(), 1);
    assert_eq!(h.text_ask_wait(1, "q", S), None);
    h.advance(S);
    assert_eq!(h.text_answers(1), [TextOutcome::Nope], "not when the first wait's timer was due");
}

#[test]
fn a_waiting_task_answers_a_long_poll_at_once_and_a_zero_wait_is_a_plain_ask() {
    let mut h = Harness::new(1);
    assert_eq!(h.text_ask_wait(1, "q", Duration::ZERO), Some(TextOutcome::Nope));
    h.text_sched(9, "q", "t1");
    assert_eq!(h.text_ask_wait(1, "q", 10 * S).as_ref().and_then(data).as_deref(), Some("t1"));
}

#[test]
fn emqp_workers_take_arriving_tasks_before_waiting_asks() {
    for shards in [1, 3] {
        let mut h = Harness::new(shards);
        h.inform("w1", &[(10, "q")]);
        h.ready("w1", 1);
        assert_eq!(h.text_ask_wait(1, "q", 10 * S), None);
        h.text_sched(9, "q", "first");
        h.text_sched(9, "q", "second");
        let sent = h.take_requests("w1");
        assert_eq!(sent.iter().map(body).collect::<Vec<_>>(), ["first"], "the worker's free slot takes it");
        assert_eq!(h.text_answers(1).iter().map(data).collect::<Vec<_>>(), [Some("second".into())]);
    }
}

#[test]
fn a_cancelled_wait_is_answered_nope_and_skipped() {
    let mut h = Harness::new(1);
    assert_eq!(h.text_ask_wait(1, "q", 10 * S), None);
    assert_eq!(h.text_ask_wait(2, "q", 10 * S), None);
    h.text_cancel(0, 1);
    assert_eq!(h.text_answers(1), [TextOutcome::Nope]);
    h.text_cancel(0, 1);
    assert!(h.text_answers(1).is_empty(), "answered once");
    h.text_sched(9, "q", "t1");
    assert_eq!(h.text_answers(2).iter().map(data).collect::<Vec<_>>(), [Some("t1".into())]);
    h.advance(20 * S);
    assert!(h.text_answers(2).is_empty(), "a served wait's timer does nothing");
}

#[test]
fn an_asked_queue_is_known_for_the_grace_then_requests_fall_back() {
    for shards in [1, 3] {
        let mut h = Harness::with_config(shards, |c| c.text.ask_grace = 60 * S);
        h.request("c1", "m0", "never-asked", "x");
        assert_eq!(h.waiting("default"), ["x"], "an unknown queue falls back (docs/emqp.md \"Unknown queues\")");
        assert_eq!(h.text_ask(1, "reports",), TextOutcome::Nope);
        assert_eq!(h.snapshot(h.shard_of("reports")).asked, ["reports"], "STATUS's asked_queues");
        h.request("c1", "m1", "reports", "r1");
        assert_eq!(h.waiting("reports"), ["r1"], "ASKed: the REQUEST waits there");
        let offer = h.text_ask(1, "reports");
        assert_eq!(data(&offer).as_deref(), Some("r1"), "and is offered to the text client");
        h.text_answer(1, harness::offer_id(&offer).unwrap(), TextAnswer::Ack);
        h.advance(61 * S);
        assert!(h.snapshot(h.shard_of("reports")).asked.is_empty());
        h.request("c1", "m2", "reports", "r2");
        assert_eq!(h.waiting("default"), ["x", "r2"], "after the grace it falls back again");
    }
}

#[test]
fn a_waiting_long_poll_keeps_its_queue_known() {
    let mut h = Harness::with_config(1, |c| c.text.ask_grace = S);
    assert_eq!(h.text_ask_wait(1, "slow", 100 * S), None);
    h.advance(50 * S);
    assert_eq!(h.snapshot(0).asked, ["slow"], "past its grace, listed while the ASK waits");
    h.request("c1", "m1", "slow", "job");
    assert_eq!(h.text_answers(1).iter().map(data).collect::<Vec<_>>(), [Some("job".into())]);
    assert!(h.snapshot(0).asked.is_empty(), "served: no longer waiting");
}

#[test]
fn asks_for_too_many_new_names_get_queue_limit() {
    let mut h = Harness::with_config(1, |c| {
        c.text.max_asked_queues = 2;
        c.text.ask_grace = 10 * S;
    });
    h.text_sched(9, "busy", "x");
    assert_eq!(h.text_ask(1, "a"), TextOutcome::Nope);
    assert_eq!(h.text_ask(1, "b"), TextOutcome::Nope);
    assert_eq!(h.text_ask(1, "c"), harness::refused(ErrorCode::QueueLimit));
    assert_eq!(h.text_ask_wait(1, "c", S), Some(harness::refused(ErrorCode::QueueLimit)));
    assert_eq!(h.text_ask(1, "a"), TextOutcome::Nope, "a name held is refreshed");
    assert!(harness::offer_id(&h.text_ask(1, "busy")).is_some(), "a queue known otherwise is served");
    assert_eq!(h.ctx.counters.rejected_queue_limit.load(Relaxed), 2);
    h.advance(11 * S);
    assert_eq!(h.text_ask(2, "c"), TextOutcome::Nope, "names whose grace ended make room");
}

#[test]
fn returned_text_offers_count_deliveries_and_are_dead_lettered_past_the_limit() {
    let mut h = Harness::with_config(1, |c| c.text.offer_timeout = 10 * S);
    h.text_sched(9, "q", "poison");
    h.text_sched(9, "q", "next");
    for round in 0..=limits::MAX_RETRIES {
        let offer = h.text_ask(1, "q");
        assert_eq!(data(&offer).as_deref(), Some("poison"), "round {round}: back at the front");
        if round % 2 == 0 {
            h.text_release(1, harness::offer_id(&offer).unwrap());
        } else {
            h.advance(11 * S);
        }
    }
    let counters = &h.ctx.counters;
    assert_eq!(counters.text_dead_lettered.load(Relaxed), 1);
    assert_eq!(counters.dead_lettered.load(Relaxed), 1);
    let returned = counters.text_returned_disconnect.load(Relaxed) + counters.text_returned_timeout.load(Relaxed);
    assert_eq!(returned, u64::from(limits::MAX_RETRIES) + 1);
    assert_eq!(h.waiting("q"), ["next"], "the queue behind it moves on");
}

#[test]
fn a_declined_offer_is_not_a_delivery() {
    let mut h = Harness::new(1);
    h.text_sched(9, "q", "t");
    for _ in 0..=limits::MAX_RETRIES + 2 {
        let offer = h.text_ask(1, "q");
        h.text_answer(1, harness::offer_id(&offer).unwrap(), TextAnswer::Dcl);
    }
    assert_eq!(h.waiting("q"), ["t"]);
    assert_eq!(h.ctx.counters.text_dead_lettered.load(Relaxed), 0);
}

#[test]
fn an_ask_past_max_queues_is_refused_and_never_makes_a_request_refused() {
    for shards in [1, 3] {
        let mut h = Harness::with_config(shards, |c| {
            c.max_queues = 2;
            c.text.ask_grace = 60 * S;
        });
        h.inform("w1", &[(10, "a"), (10, "b")]);
        assert_eq!(h.text_ask(1, "newq"), harness::refused(ErrorCode::QueueLimit), "a new name past the limit");
        assert_eq!(h.text_ask_wait(1, "newq", S), Some(harness::refused(ErrorCode::QueueLimit)));
        assert!(h.snapshot(h.shard_of("newq")).asked.is_empty(), "not recorded");
        assert_eq!(h.text_ask(1, "a"), TextOutcome::Nope, "a queue held is asked for as before");
        assert_eq!(h.ctx.counters.rejected_queue_limit.load(Relaxed), 2);
        h.request("c1", "m1", "newq", "x");
        assert_eq!(h.waiting("default"), ["x"], "the REQUEST goes to default, as without the ASK");
    }
    // A name asked below the limit, then the limit reached by other
    // queues: REQUESTs for it fall back instead of being refused.
    let mut h = Harness::with_config(1, |c| {
        c.max_queues = 1;
        c.text.ask_grace = 60 * S;
    });
    assert_eq!(h.text_ask(1, "early"), TextOutcome::Nope);
    h.text_sched(9, "other", "o");
    h.request("c1", "m2", "early", "y");
    assert_eq!(h.waiting("default"), ["y"]);
    assert_eq!(h.ctx.counters.rejected_queue_limit.load(Relaxed), 0, "nothing refused");
}
