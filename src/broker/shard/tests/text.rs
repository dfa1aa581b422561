//! Text commands and offers (text.rs): SCHED, ASK, ACK/DCL/DEL, release,
//! the offer timeout, stale offer ids, and the snapshot figures.

use std::time::Duration;

use super::harness::{body, done, offer_id, refused, Harness};
use crate::broker::text_port::{TextAnswer, TextCmd, TextOutcome, TextReply};
use crate::ids::{ConnId, OfferId, QueueName};
use crate::protocol::text::ErrorCode;

const OFFER_TIMEOUT: Duration = Duration::from_secs(10);

/// Every setup with a 10 s offer timeout and `tasks` SCHEDed on `q`.
fn with_tasks(tasks: &[&str]) -> Vec<Harness> {
    let mut all = Harness::setups(|c| c.text.offer_timeout = OFFER_TIMEOUT);
    for h in &mut all {
        for t in tasks {
            assert_eq!(h.text_sched(9, "q", t), done());
        }
    }
    all
}

/// `ASK q` from `conn`: the offer's id (panics on anything else).
fn ask(h: &mut Harness, conn: u64) -> OfferId {
    let outcome = h.text_ask(conn, "q");
    offer_id(&outcome).unwrap_or_else(|| panic!("an offer for conn {conn}, got {outcome:?} ({})", h.setup()))
}

#[test]
fn ask_offers_the_oldest_task_until_a_deadline() {
    for mut h in with_tasks(&["t1", "t2"]) {
        let outcome = h.text_ask(1, "q");
        let id = OfferId { shard: h.shard_of("q"), seq: 1 };
        let want = TextOutcome::Offer { id, data: b"t1".to_vec(), deadline: h.now + OFFER_TIMEOUT };
        assert_eq!(outcome, want, "{}", h.setup());
        assert_eq!(offer_id(&h.text_ask(2, "q")).map(|o| o.seq), Some(2));
        assert_eq!(h.text_ask(3, "q"), TextOutcome::Nope);
        assert_eq!(h.text_ask(3, "nosuch"), TextOutcome::Nope);
    }
}

#[test]
fn ack_dcl_and_del_end_an_offer_each_their_way() {
    let cases = [(TextAnswer::Ack, vec!["t2"]), (TextAnswer::Dcl, vec!["t2", "t1"]), (TextAnswer::Del, vec!["t2"])];
    for (answer, left) in cases {
        for mut h in with_tasks(&["t1", "t2"]) {
            let id = ask(&mut h, 1);
            assert_eq!(h.text_answer(1, id, answer), done());
            assert_eq!(h.waiting("q"), left, "{answer:?}, {}", h.setup());
            assert_eq!(h.text_answer(1, id, answer), refused(ErrorCode::NoTask), "answered once only");
            let counts =
                [h.counter(|c| &c.text_acked), h.counter(|c| &c.text_declined), h.counter(|c| &c.text_deleted)];
            assert_eq!(counts.iter().sum::<u64>(), 1);
        }
    }
}

#[test]
fn stale_foreign_and_other_connections_offer_ids_get_no_task() {
    for mut h in with_tasks(&["t1", "t2", "t3"]) {
        let old = ask(&mut h, 1);
        let id = ask(&mut h, 1);
        assert_eq!(h.waiting("q"), ["t1", "t3"], "the displaced offer is back at the front");
        let foreign = OfferId { shard: id.shard + 1, seq: id.seq };
        let wrong = [(1, old), (2, id), (1, foreign)];
        for (conn, offer) in wrong {
            let answer = TextCmd::Answer { offer, answer: TextAnswer::Ack };
            assert_eq!(h.text_cmd(id.shard, conn, answer), Some(refused(ErrorCode::NoTask)), "{}", h.setup());
        }
        h.text_release(2, id);
        assert_eq!(h.text_answer(1, id, TextAnswer::Ack), done(), "the live offer was kept");
        assert_eq!(h.counter(|c| &c.text_returned_disconnect), 0);
    }
}

#[test]
fn a_lapsed_offer_goes_back_to_the_front_at_its_deadline() {
    for mut h in with_tasks(&["t1", "t2"]) {
        let id = ask(&mut h, 1);
        h.advance(OFFER_TIMEOUT - Duration::from_millis(1));
        assert_eq!(h.waiting("q"), ["t2"], "{}", h.setup());
        h.advance(Duration::from_millis(1));
        assert_eq!(h.waiting("q"), ["t1", "t2"]);
        assert_eq!(h.counter(|c| &c.text_returned_timeout), 1);
        assert_eq!(h.text_answer(1, id, TextAnswer::Ack), refused(ErrorCode::NoTask));
        h.text_release(1, id);
        assert_eq!(h.waiting("q"), ["t1", "t2"], "a stale release changes nothing");
    }
}

#[test]
fn a_connection_keeps_at_most_one_offer_timer() {
    for mut h in with_tasks(&[]) {
        let shard = h.shard_of("q");
        let before = h.timers(shard);
        for n in 0..50 {
            h.text_sched(9, "q", &format!("t{n}"));
            let id = ask(&mut h, 1);
            h.text_answer(1, id, TextAnswer::Ack);
            h.advance(Duration::from_secs(1));
        }
        assert!(h.timers(shard) <= before + 1, "{} timers ({})", h.timers(shard), h.setup());
    }
}

#[test]
fn released_offers_go_back_to_the_front_in_order() {
    for mut h in with_tasks(&["t1", "t2", "t3"]) {
        let a = ask(&mut h, 1);
        let b = ask(&mut h, 2);
        h.text_release(2, b);
        h.text_release(1, a);
        assert_eq!(h.waiting("q"), ["t1", "t2", "t3"], "{}", h.setup());
        assert_eq!(h.counter(|c| &c.text_returned_disconnect), 2);
    }
}

#[test]
fn sched_is_refused_when_full_or_draining_and_answers_still_work() {
    for mut h in Harness::setups(|c| c.max_queue_len = 2) {
        for t in ["t1", "t2"] {
            assert_eq!(h.text_sched(9, "q", t), done());
        }
        assert_eq!(h.text_sched(9, "q", "t3"), refused(ErrorCode::QueueFull), "{}", h.setup());
        let id = ask(&mut h, 1);
        h.set_draining(true);
        assert_eq!(h.text_sched(9, "q", "t4"), refused(ErrorCode::ShuttingDown));
        assert_eq!(h.text_sched(9, "q", "t5"), refused(ErrorCode::ShuttingDown));
        let second = ask(&mut h, 2);
        assert_eq!(h.text_answer(1, id, TextAnswer::Dcl), done());
        assert_eq!(h.text_answer(2, second, TextAnswer::Ack), done(), "ASK and answers go on while draining");
        assert_eq!(h.waiting("q"), ["t1"]);
        let counts = [h.counter(|c| &c.rejected_queue_full), h.counter(|c| &c.rejected_shutting_down)];
        assert_eq!(counts, [1, 2]);
    }
}

#[test]
fn text_and_emqp_share_queues() {
    for mut h in with_tasks(&[]) {
        h.inform("w1", &[(10, "q")]);
        h.ready("w1", 1);
        h.text_sched(9, "q", "from-text");
        let sent = h.take_requests("w1");
        assert_eq!((sent.len(), body(&sent[0])), (1, "from-text".to_string()), "{}", h.setup());
        assert_eq!(sent[0].msgid.len(), 36, "a fresh uuid msgid");
        assert_eq!(super::harness::headers(&sent[0]), b"reply-requested");
        h.request("c1", "m1", "q", "from-emqp");
        let offer = h.text_ask(1, "q");
        assert_eq!(offer_id(&offer).map(|_| ()), Some(()));
        assert!(matches!(offer, TextOutcome::Offer { data, .. } if data == b"from-emqp"));
    }
}

#[test]
fn snapshots_count_waiting_offered_processed_and_inflight() {
    for mut h in with_tasks(&["t1", "t2", "t3"]) {
        ask(&mut h, 1);
        h.inform("w1", &[(7, "q")]);
        h.ready("w1", 2);
        h.advance(Duration::from_secs(2));
        let snap = h.snapshot(h.shard_of("q"));
        let q = snap.queues.iter().find(|q| q.name == "q").expect("q");
        let figures = (q.waiting, q.offered, q.processed, q.candidates.clone());
        assert_eq!(figures, (0, 1, 2, vec![(7, "w1".to_string())]), "{}", h.setup());
        let snap = h.snapshot(h.shard_of("w1"));
        let w = &snap.workers[0];
        assert_eq!((w.slots, w.state, w.processed, w.inflight.len()), (0, "live", 2, 2));
        assert!(w.inflight.iter().all(|(q, age)| q == "q" && *age == Duration::from_secs(2)));
        let pending: usize = (0..h.shards.len()).map(|i| h.snapshot(i).pending()).sum();
        assert_eq!(pending, 3, "offered and in flight count as pending");
    }
}

#[test]
fn only_the_answer_to_a_sched_that_stored_its_task_is_marked_stored() {
    // With durability sync such answers wait for the sync; the rest leave
    // at once (router::outbox).
    for mut h in with_tasks(&[]) {
        let q = h.shard_of("q");
        let sched = |data: &str| TextCmd::Sched { queue: QueueName::named("q"), data: data.as_bytes().to_vec() };
        let stored = |r: Option<TextReply>| r.map(|r| (r.stored, r.outcome));
        assert_eq!(stored(h.text_reply(q, 1, sched("t1"))), Some((true, done())), "{}", h.setup());
        let ask = TextCmd::Ask { queue: QueueName::named("q") };
        let offered = h.text_reply(q, 2, ask.clone()).expect("an offer");
        assert!(!offered.stored && offer_id(&offered.outcome).is_some(), "{}", h.setup());
        let id = offer_id(&offered.outcome).expect("an offer");
        let ack = TextCmd::Answer { offer: id, answer: TextAnswer::Ack };
        assert_eq!(stored(h.text_reply(id.shard, 2, ack)), Some((false, done())), "an ACK's Done promises nothing");
        assert_eq!(stored(h.text_reply(q, 2, ask)), Some((false, TextOutcome::Nope)));
        // A long poll served by another connection's SCHED.
        assert_eq!(h.text_ask_wait(3, "q", Duration::from_secs(5)), None);
        assert_eq!(stored(h.text_reply(q, 1, sched("t2"))), Some((true, done())));
        let served: Vec<bool> = h.text.iter().filter(|r| r.conn == ConnId(3)).map(|r| r.stored).collect();
        assert_eq!(served, [false], "{}", h.setup());
        h.text_answers(3);
        // Refused: nothing stored.
        h.set_draining(true);
        let refusal = h.text_reply(q, 1, sched("t3")).expect("an answer");
        assert!(!refusal.stored && matches!(refusal.outcome, TextOutcome::Refused(_)), "{}", h.setup());
    }
}
