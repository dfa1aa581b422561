//! Retries and the dead set (dead.rs): a failed job waits out a growing
//! back-off, then joins the back of its queue; out of retries (`max_retries`
//! or `retry:N`) any job goes to the dead set, whatever its last setback;
//! operators list, show, retry and delete dead jobs; the set is bounded.

use std::time::Duration;

use super::harness::Harness;
use crate::broker::admin::{AdminAnswer, AdminOp};
use crate::broker::dead::DeadTarget;
use crate::broker::inbox::ShardMsg;
use crate::broker::retry::backoff;
use crate::ids::{JobId, QueueName};
use crate::job::Setback;

const S: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);

/// Every setup with `max_retries` 2, a 1 s back-off and long heartbeat
/// timeouts (workers leave only when a test says so).
fn setups() -> Vec<Harness> {
    Harness::setups(|c| {
        c.max_retries = 2;
        c.retry_backoff = S;
        c.retry_backoff_max = 60 * S;
        c.heartbeat_timeout = 1000 * S;
    })
}

/// Asks the shard of job `id` (or shard 0) `op` and returns its answer.
pub(super) fn dead_op(h: &mut Harness, shard: usize, op: AdminOp) -> AdminAnswer {
    let (reply, rx) = crossbeam_channel::bounded(1);
    h.send(shard, ShardMsg::Admin { op, reply });
    rx.try_recv().expect("the shard answers at once")
}

/// Ids and reasons of the dead jobs of every shard, oldest first per shard.
fn dead_list(h: &mut Harness) -> Vec<(JobId, Setback, u32)> {
    let mut out = Vec::new();
    for shard in 0..h.shards.len() {
        if let AdminAnswer::DeadList { entries, .. } = dead_op(h, shard, AdminOp::DeadList(None)) {
            out.extend(entries.into_iter().map(|e| (e.id, e.why, e.failures)));
        }
    }
    out
}

#[test]
fn a_failed_job_waits_a_growing_back_off_then_goes_to_the_dead_set() {
    for mut h in setups() {
        h.inform("w1", &[(10, "q")]);
        h.ready("w1", 1);
        h.request("c1", "m1", "q", "flaky");
        assert_eq!(h.take_bodies("w1"), ["flaky"]);
        let id = JobId::new(h.shard_of("q"), 1);
        for attempt in 1..=2u32 {
            h.reply_failed("w1", "m1", true);
            let wait = backoff(attempt, S, 60 * S, id.0);
            assert!(wait >= S.mul_f64(0.75 * f64::from(1 << (attempt - 1))), "{wait:?}");
            h.advance(wait - MS);
            h.ready("w1", 1);
            assert!(h.take_bodies("w1").is_empty(), "not before its back-off ({})", h.setup());
            assert!(h.waiting("q").is_empty(), "waiting for its retry, not in the queue");
            h.advance(MS);
            assert_eq!(h.take_bodies("w1"), ["flaky"], "try {} after {wait:?} ({})", attempt + 1, h.setup());
        }
        assert_eq!(h.counts("q").get(crate::broker::counts::QueueCounter::Retried), 2);
        h.reply_failed("w1", "m1", true);
        assert_eq!(dead_list(&mut h), [(id, Setback::Failed, 3)], "{}", h.setup());
        assert_eq!(h.counter(|c| &c.dead_lettered), 1);
        assert_eq!(h.counter(|c| &c.retried_jobs), 2);
        assert_eq!(h.ctx.job_bytes.load(std::sync::atomic::Ordering::Relaxed), 0, "dead jobs leave the memory count");
        h.advance(3600 * S);
        h.ready("w1", 1);
        assert!(h.take_bodies("w1").is_empty(), "a dead job stays dead");
        assert_eq!(h.counts("q").get(crate::broker::counts::QueueCounter::Failed), 3);
    }
}

#[test]
fn the_retry_header_overrides_max_retries() {
    for mut h in setups() {
        h.inform("w1", &[(10, "q")]);
        h.ready("w1", 2);
        h.request_with("c1", "m0", "q", "never", b"retry:0", &[]);
        h.request_with("c1", "m9", "q", "more", b"reply-requested,retry:9", &[]);
        assert_eq!(h.take_bodies("w1"), ["never", "more"]);
        h.reply_failed("w1", "m0", true);
        assert_eq!(dead_list(&mut h).len(), 1, "retry:0: dead at its first failure ({})", h.setup());
        for _ in 0..5 {
            h.reply_failed("w1", "m9", true);
            h.advance(60 * S);
            h.ready("w1", 1);
            assert_eq!(h.take_bodies("w1"), ["more"], "{}", h.setup());
        }
        assert_eq!(dead_list(&mut h).len(), 1);
    }
}

#[test]
fn a_job_whose_workers_die_goes_back_at_once_then_to_the_dead_set() {
    for mut h in setups() {
        for round in 0..=2 {
            let id = format!("w{round}");
            h.inform(&id, &[(10, "q")]);
            if round == 0 {
                h.request("c1", "m1", "q", "deadly");
            }
            h.ready(&id, 1);
            assert_eq!(h.take_bodies(&id), ["deadly"], "round {round}: no back-off ({})", h.setup());
            h.send_failed(&id, "m1", true);
        }
        assert!(h.waiting("q").is_empty());
        let dead = dead_list(&mut h);
        assert_eq!(dead.iter().map(|d| (d.1, d.2)).collect::<Vec<_>>(), [(Setback::WorkerGone, 3)], "{}", h.setup());
    }
}

#[test]
fn operators_show_retry_and_delete_dead_jobs() {
    for mut h in setups() {
        h.inform("w1", &[(10, "q"), (10, "r")]);
        h.ready("w1", 3);
        for (msgid, queue) in [("a", "q"), ("b", "q"), ("c", "r")] {
            h.request_with("c1", msgid, queue, msgid, b"retry:0", &[]);
        }
        h.take_bodies("w1");
        for msgid in ["a", "b", "c"] {
            h.reply_failed("w1", msgid, true);
        }
        let (q, r) = (h.shard_of("q"), h.shard_of("r"));
        let (a, b) = (JobId::new(q, 1), JobId::new(q, 2));
        let AdminAnswer::DeadShow(Some(shown)) = dead_op(&mut h, q, AdminOp::DeadShow(a)) else { panic!("shown") };
        assert_eq!((shown.body.as_deref(), shown.headers.as_str()), (Some(&b"a"[..]), "retry:0"));
        assert!(matches!(dead_op(&mut h, q, AdminOp::DeadShow(JobId::new(q, 99))), AdminAnswer::DeadShow(None)));
        // Retried: back of its queue, its setbacks reset (so `retry:0` gets
        // its one try again).
        assert_eq!(dead_op(&mut h, q, AdminOp::DeadRetry(DeadTarget::One(a))).done(), 1);
        assert_eq!(dead_op(&mut h, q, AdminOp::DeadRetry(DeadTarget::One(a))).done(), 0, "gone from the set");
        h.ready("w1", 1);
        assert_eq!(h.take_bodies("w1"), ["a"], "{}", h.setup());
        h.reply("w1", "a");
        // Deleted: gone for good; `All` keeps to one queue when given.
        let all_r = AdminOp::DeadDelete(DeadTarget::All(Some(QueueName::named("r"))));
        assert_eq!(dead_op(&mut h, r, all_r).done(), 1);
        assert_eq!(dead_list(&mut h).iter().map(|d| d.0).collect::<Vec<_>>(), [b]);
        assert_eq!(dead_op(&mut h, q, AdminOp::DeadDelete(DeadTarget::All(None))).done(), 1);
        assert!(dead_list(&mut h).is_empty());
        h.advance(3600 * S);
        assert!(h.take_bodies("w1").is_empty(), "nothing deleted comes back");
    }
}

#[test]
fn the_dead_set_drops_its_oldest_past_its_limit() {
    let mut h = Harness::with_config(1, |c| {
        c.dead_max_jobs = 2;
        c.max_retries = 0;
    });
    h.inform("w1", &[(10, "q")]);
    h.ready("w1", 3);
    for msgid in ["a", "b", "c"] {
        h.request("c1", msgid, "q", msgid);
    }
    h.take_bodies("w1");
    for msgid in ["a", "b", "c"] {
        h.reply_failed("w1", msgid, true);
    }
    let ids: Vec<u64> = dead_list(&mut h).iter().map(|d| d.0.seq()).collect();
    assert_eq!(ids, [2, 3]);
    assert_eq!(h.counter(|c| &c.dead_evicted), 1);
}

#[test]
fn text_offers_returned_too_often_go_to_the_dead_set() {
    for mut h in setups() {
        assert!(matches!(h.text_sched(1, "t", "task"), crate::broker::text_port::TextOutcome::Done));
        for _ in 0..=2 {
            let id = super::harness::offer_id(&h.text_ask(1, "t")).expect("an offer");
            h.text_release(1, id);
        }
        let dead = dead_list(&mut h);
        assert_eq!(dead.iter().map(|d| (d.1, d.2)).collect::<Vec<_>>(), [(Setback::Returned, 3)], "{}", h.setup());
        assert_eq!(h.counter(|c| &c.text_dead_lettered), 1);
    }
}

#[test]
fn the_dead_set_limits_are_router_wide_and_a_job_over_the_byte_limit_is_not_kept() {
    let mut h = Harness::with_config(3, |c| {
        c.dead_max_jobs = 2;
        c.dead_max_bytes = 4096;
        c.max_retries = 0;
    });
    // Queues on every shard: each burial goes to its queue's shard.
    let queues: Vec<String> = (0..6).map(|i| format!("q{i}")).collect();
    let on: Vec<usize> = queues.iter().map(|q| h.shard_of(q)).collect();
    assert!(on.iter().collect::<std::collections::BTreeSet<_>>().len() > 1, "queues on several shards: {on:?}");
    let list: Vec<(i64, &str)> = queues.iter().map(|q| (10, q.as_str())).collect();
    h.inform("w1", &list);
    h.ready("w1", 10);
    for (i, q) in queues.iter().enumerate() {
        h.request("c1", &format!("m{i}"), q, "small");
        h.reply_failed("w1", &format!("m{i}"), true);
        let dead = dead_list(&mut h).len();
        assert!(dead <= 2, "after {} burials: {dead} dead", i + 1);
    }
    assert_eq!(dead_list(&mut h).len(), 2);
    assert_eq!(h.counter(|c| &c.dead_evicted), 4);
    assert_eq!(h.ctx.dead_jobs.load(std::sync::atomic::Ordering::Relaxed), 2);
    h.request("c1", "big", "q0", &"x".repeat(5000));
    h.reply_failed("w1", "big", true);
    assert_eq!(dead_list(&mut h).len(), 2, "the big job is dropped, the others kept");
    assert_eq!(h.counter(|c| &c.dead_evicted), 5);
}

#[test]
fn retrying_or_deleting_a_large_dead_set_goes_in_steps_and_the_shard_serves_between_them() {
    use super::harness::{offer_id, peer};
    use crate::job::JobFrames;
    use crate::limits::ADMIN_STEP_JOBS;
    for retry in [false, true] {
        let mut h = Harness::with_config(1, |c| {
            c.max_retries = 0;
            c.heartbeat_timeout = 1000 * S;
        });
        // Three steps' worth of dead jobs: text tasks whose offer came back.
        let n = 2 * ADMIN_STEP_JOBS + 10;
        for i in 0..n {
            h.text_sched(1, "t", &format!("task {i}"));
            let offer = offer_id(&h.text_ask(1, "t")).expect("an offer");
            h.text_release(1, offer);
        }
        assert_eq!(h.shards[0].dead.len(), n);
        h.inform("w1", &[(10, "q")]);
        h.ready("w1", 1);
        let (reply, rx) = crossbeam_channel::bounded(1);
        let op =
            if retry { AdminOp::DeadRetry(DeadTarget::All(None)) } else { AdminOp::DeadDelete(DeadTarget::All(None)) };
        h.post(0, ShardMsg::Admin { op, reply });
        // A client's REQUEST arrives while the operation is under way.
        let frames = JobFrames::new(b"m1", b"q", b"", b"meanwhile", &[] as &[&[u8]]).expect("frames");
        h.post(0, ShardMsg::Request { client: peer("c1"), frames, fallback_done: false });
        // The first step takes its share; the rest waits behind the REQUEST.
        assert!(h.step(0));
        assert!(rx.try_recv().is_err(), "no answer before the last step");
        assert_eq!(h.shards[0].dead.len(), n - ADMIN_STEP_JOBS);
        assert!(matches!(h.inbox[0].front(), Some(ShardMsg::Request { .. })), "the REQUEST is next");
        assert!(matches!(h.inbox[0].back(), Some(ShardMsg::DeadStep(_))), "then the next step");
        // The REQUEST is served (accepted and dispatched) between two steps.
        assert!(h.step(0));
        assert_eq!(h.take_bodies("w1"), ["meanwhile"]);
        assert_eq!(h.shards[0].dead.len(), n - ADMIN_STEP_JOBS, "no step meanwhile");
        assert!(rx.try_recv().is_err());
        // Two more steps; the answer comes with the last.
        assert!(h.step(0));
        assert!(rx.try_recv().is_err());
        assert_eq!(h.shards[0].dead.len(), n - 2 * ADMIN_STEP_JOBS);
        assert!(h.step(0));
        assert_eq!(rx.try_recv().map(|a| a.done()), Ok(n));
        assert!(h.inbox[0].is_empty() && h.shards[0].dead.is_empty());
        let waiting = h.waiting("t");
        match retry {
            true => assert_eq!(waiting, (0..n).map(|i| format!("task {i}")).collect::<Vec<_>>(), "in burial order"),
            false => assert!(waiting.is_empty()),
        }
    }
}

#[test]
fn a_retry_or_delete_of_all_leaves_jobs_buried_after_it_began() {
    use super::harness::offer_id;
    use crate::broker::text_port::TextCmd;
    let mut h = Harness::with_config(1, |c| c.max_retries = 0);
    for i in 0..crate::limits::ADMIN_STEP_JOBS + 1 {
        h.text_sched(1, "t", &format!("old {i}"));
        let offer = offer_id(&h.text_ask(1, "t")).expect("an offer");
        h.text_release(1, offer);
    }
    h.text_sched(1, "t", "new");
    let offer = offer_id(&h.text_ask(1, "t")).expect("an offer");
    let (reply, rx) = crossbeam_channel::bounded(1);
    h.post(0, ShardMsg::Admin { op: AdminOp::DeadDelete(DeadTarget::All(Some(QueueName::named("t")))), reply });
    // The offer comes back (a burial) between the first step and the next.
    h.text_post(0, 1, TextCmd::Release { offer });
    assert!(h.step(0));
    assert!(h.step(0));
    assert_eq!(h.shards[0].dead.len(), 2, "the last old job and the new one");
    h.run();
    assert_eq!(rx.try_recv().map(|a| a.done()), Ok(crate::limits::ADMIN_STEP_JOBS + 1));
    let AdminAnswer::DeadList { entries, total } = dead_op(&mut h, 0, AdminOp::DeadList(Some(QueueName::named("t"))))
    else {
        panic!("a list")
    };
    assert_eq!((entries.len(), total), (1, 1), "buried after the command began: not the operator's to delete");
}
