//! Per-queue counts, on the shard that owns the queue, for both protocols:
//! what `emq-cli status` shows.

use super::harness::{self, Harness};
use crate::broker::counts::QueueCounter::{Completed, Dispatched, Failed};
use crate::broker::text_port::TextAnswer;

#[test]
fn emqp_jobs_are_counted_on_their_queues_shard_whatever_the_workers_home() {
    for shards in [1, 4] {
        let mut h = Harness::new(shards);
        h.inform("w1", &[(10, "q"), (10, "r")]);
        h.ready("w1", 3);
        for (msgid, queue) in [("m1", "q"), ("m2", "q"), ("m3", "r")] {
            h.request("c1", msgid, queue, "job");
        }
        assert_eq!(h.take_requests("w1").len(), 3);
        let q = h.counts("q");
        assert_eq!((q.get(Dispatched), q.get(Completed), q.get(Failed)), (2, 0, 0), "{shards} shards: in flight");
        h.reply("w1", "m1");
        h.reply_failed("w1", "m2", true);
        h.reply_failed("w1", "m3", false);
        h.reply("w1", "m3");
        let (q, r) = (h.counts("q"), h.counts("r"));
        assert_eq!((q.get(Dispatched), q.get(Completed), q.get(Failed)), (2, 1, 1), "{shards} shards");
        assert_eq!((r.get(Dispatched), r.get(Completed), r.get(Failed)), (1, 1, 0), "a repeated REPLY counts once");
        let router_wide = (h.counter(|c| &c.completed_jobs), h.counter(|c| &c.failed_results));
        assert_eq!(
            router_wide,
            (3, 1),
            "{shards} shards: completed_jobs counts the failed one, failed_results it alone"
        );
    }
}

#[test]
fn text_offers_acks_and_deletes_are_counted() {
    let mut h = Harness::new(2);
    for data in ["a", "b", "c"] {
        h.text_sched(1, "q", data);
    }
    let ack = harness::offer_id(&h.text_ask(1, "q")).expect("an offer");
    h.text_answer(1, ack, TextAnswer::Ack);
    let dcl = harness::offer_id(&h.text_ask(1, "q")).expect("an offer");
    h.text_answer(1, dcl, TextAnswer::Dcl);
    let del = harness::offer_id(&h.text_ask(1, "q")).expect("an offer");
    h.text_answer(1, del, TextAnswer::Del);
    let q = h.counts("q");
    assert_eq!((q.get(Dispatched), q.get(Completed), q.get(Failed)), (3, 1, 1), "a declined offer is not an end");
    assert_eq!(h.waiting("q"), ["b"]);
}

/// The bytes the memory limit counts (`ShardContext::job_bytes`).
fn job_bytes(h: &Harness) -> usize {
    h.ctx.job_bytes.load(std::sync::atomic::Ordering::Relaxed)
}

#[test]
fn every_end_of_a_job_gives_its_bytes_back() {
    let timeout = std::time::Duration::from_secs(10);
    for mut h in Harness::setups(|c| c.text.offer_timeout = timeout) {
        h.inform("w1", &[(10, "q")]);
        h.ready("w1", 1);
        h.request("c1", "m1", "q", "emqp");
        assert!(job_bytes(&h) > 0, "a job in flight counts ({})", h.setup());
        h.reply("w1", "m1");
        assert_eq!(job_bytes(&h), 0, "completed ({})", h.setup());
        for answer in [TextAnswer::Ack, TextAnswer::Del] {
            h.text_sched(1, "t", "task");
            let offer = harness::offer_id(&h.text_ask(1, "t")).expect("an offer");
            h.text_answer(1, offer, answer);
            assert_eq!(job_bytes(&h), 0, "{answer:?} ({})", h.setup());
        }
        h.text_sched(1, "t", "poison");
        for _ in 0..=crate::limits::MAX_RETRIES {
            harness::offer_id(&h.text_ask(1, "t")).expect("an offer");
            h.advance(timeout * 2);
        }
        assert_eq!(h.counter(|c| &c.dead_lettered), 1);
        assert_eq!(job_bytes(&h), 0, "dead-lettered ({})", h.setup());
    }
}
