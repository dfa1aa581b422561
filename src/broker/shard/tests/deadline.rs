//! Per-job deadlines (deadline.rs): a job its worker holds past its
//! deadline is taken back and runs elsewhere, the worker gets no more jobs
//! of that queue until its late REPLY, which is ignored and counted; the
//! `timeout:N` header overrides `job_timeout`; every deadline is a delivery.

use std::time::Duration;

use super::harness::Harness;
use crate::limits::{JOB_DEADLINE_GRACE, MAX_RETRIES};

const S: Duration = Duration::from_secs(1);

/// Every setup with `job_timeout` = `timeout` (`None`: off), long
/// heartbeat and KBYE timeouts, so workers only leave when a test says so,
/// and no retry back-off (tests/retries.rs has it), so a job taken back
/// waits in its queue at once.
fn setups(timeout: Option<Duration>) -> Vec<Harness> {
    Harness::setups(|c| {
        c.job_timeout = timeout;
        c.heartbeat_timeout = 1000 * S;
        c.retry_backoff = Duration::ZERO;
    })
}

#[test]
fn a_job_past_its_deadline_runs_on_another_worker_and_the_late_reply_is_ignored() {
    for mut h in setups(Some(10 * S)) {
        h.inform("w1", &[(10, "q")]);
        h.ready("w1", 2);
        h.request("c1", "m1", "q", "slow");
        assert_eq!(h.take_bodies("w1"), ["slow"]);
        h.advance(10 * S);
        assert_eq!(h.inflight("w1"), ["m1"], "within the grace ({})", h.setup());
        h.advance(JOB_DEADLINE_GRACE);
        assert!(h.inflight("w1").is_empty(), "taken back ({})", h.setup());
        assert_eq!(h.waiting("q"), ["slow"], "w1 gets no more of q, its free slot included");
        assert_eq!(h.counter(|c| &c.jobs_timed_out), 1);
        h.inform("w2", &[(10, "q")]);
        h.ready("w2", 1);
        assert_eq!(h.take_bodies("w2"), ["slow"], "another worker runs it ({})", h.setup());
        h.request("c1", "m2", "q", "next");
        assert_eq!(h.waiting("q"), ["next"], "w1 is still paused on q ({})", h.setup());
        h.reply("w1", "m1");
        assert_eq!(h.counter(|c| &c.late_replies), 1);
        assert_eq!(h.counter(|c| &c.completed_jobs), 0, "the late REPLY completes nothing");
        assert_eq!(h.take_bodies("w1"), ["next"], "answered: w1 serves q again ({})", h.setup());
        h.reply("w2", "m1");
        h.reply("w1", "m2");
        assert_eq!(h.counter(|c| &c.completed_jobs), 2);
        assert_eq!(h.counter(|c| &c.late_replies), 1);
    }
}

#[test]
fn an_answer_that_never_comes_bars_the_worker_for_the_jobs_time_limit_again_not_for_good() {
    // The REPLY was lost (over ZeroMQ's size limit, or a send error the
    // worker swallowed): the worker lives on, heartbeating, with free slots.
    for mut h in setups(Some(10 * S)) {
        h.inform("w1", &[(10, "q")]);
        h.ready("w1", 2);
        h.request("c1", "m1", "q", "lost answer");
        assert_eq!(h.take_bodies("w1"), ["lost answer"]);
        let limit = 10 * S + JOB_DEADLINE_GRACE;
        h.advance(limit);
        assert!(h.inflight("w1").is_empty(), "taken back ({})", h.setup());
        h.request("c1", "m2", "q", "next");
        h.advance(limit - S);
        assert_eq!(h.waiting("q"), ["lost answer", "next"], "still paused within the limit ({})", h.setup());
        assert_eq!(h.counter(|c| &c.late_replies_given_up), 0);
        h.advance(S);
        assert_eq!(h.counter(|c| &c.late_replies_given_up), 1, "{}", h.setup());
        assert_eq!(h.take_bodies("w1"), ["lost answer"], "w1 serves q again, in its one free slot ({})", h.setup());
        h.ready("w1", 1); // the READY that followed the lost REPLY
        assert_eq!(h.take_bodies("w1"), ["next"]);
        // The answer arriving after all completes nothing and is counted.
        h.reply("w1", "m1");
        assert_eq!(h.counter(|c| &c.late_replies), 0);
        assert_eq!(h.counter(|c| &c.unmatched_replies), 0, "m1 is held again: this REPLY completes it");
        assert_eq!(h.inflight("w1"), ["m2"], "{}", h.setup());
    }
}

#[test]
fn a_paused_worker_still_serves_its_other_queues() {
    for mut h in setups(Some(10 * S)) {
        h.inform("w1", &[(10, "q"), (5, "r")]);
        h.ready("w1", 1);
        h.request("c1", "m1", "q", "stuck");
        assert_eq!(h.take_bodies("w1"), ["stuck"]);
        h.advance(11 * S + JOB_DEADLINE_GRACE);
        h.ready("w1", 1);
        h.request("c1", "m2", "r", "other");
        assert_eq!(h.take_bodies("w1"), ["other"], "{}", h.setup());
        assert_eq!(h.waiting("q"), ["stuck"]);
    }
}

#[test]
fn the_timeout_header_overrides_job_timeout() {
    for mut h in setups(None) {
        h.inform("w1", &[(10, "q")]);
        h.ready("w1", 2);
        h.request_with("c1", "m1", "q", "limited", b"guarantee,timeout:5", &[]);
        h.request("c1", "m2", "q", "unlimited");
        assert_eq!(h.take_bodies("w1"), ["limited", "unlimited"]);
        h.advance(5 * S + JOB_DEADLINE_GRACE);
        assert_eq!(h.inflight("w1"), ["m2"], "only the job with a timeout header ({})", h.setup());
        h.advance(900 * S);
        assert_eq!(h.inflight("w1"), ["m2"], "job_timeout off: no deadline");
    }
    for mut h in setups(Some(100 * S)) {
        h.inform("w1", &[(10, "q")]);
        h.ready("w1", 1);
        h.request_with("c1", "m1", "q", "longer", b"timeout:300", &[]);
        h.take_bodies("w1");
        h.advance(200 * S);
        assert_eq!(h.inflight("w1"), ["m1"], "the header's longer limit wins ({})", h.setup());
        h.advance(100 * S + JOB_DEADLINE_GRACE);
        assert!(h.inflight("w1").is_empty());
    }
}

#[test]
fn a_queues_own_limit_overrides_job_timeout_and_the_header_overrides_both() {
    let setups = Harness::setups(|c| {
        c.job_timeout = Some(100 * S);
        c.job_timeouts = vec![("fast".into(), Some(5 * S)), ("free".into(), None)];
        c.heartbeat_timeout = 1000 * S;
        c.retry_backoff = Duration::ZERO;
    });
    for mut h in setups {
        h.inform("w1", &[(10, "fast"), (10, "free"), (10, "other")]);
        h.ready("w1", 5);
        h.request("c1", "m1", "fast", "a");
        h.request("c1", "m2", "free", "b");
        h.request("c1", "m3", "other", "c");
        h.request_with("c1", "m4", "fast", "d", b"timeout:50", &[]);
        h.request_with("c1", "m5", "fast", "e", b"reply-requested,timeout:0", &[]);
        assert_eq!(h.take_bodies("w1").len(), 5);
        h.advance(5 * S + JOB_DEADLINE_GRACE);
        assert_eq!(h.inflight("w1"), ["m2", "m3", "m4", "m5"], "fast's own 5 s ({})", h.setup());
        h.advance(100 * S);
        assert_eq!(h.inflight("w1"), ["m2", "m5"], "job_timeout for other, the header's 50 s for m4 ({})", h.setup());
        h.advance(800 * S);
        assert_eq!(h.inflight("w1"), ["m2", "m5"], "\"0s\": no limit on free; timeout:0, none on m5");
    }
}

#[test]
fn a_reply_in_time_is_a_completion_and_its_timer_does_nothing() {
    for mut h in setups(Some(10 * S)) {
        h.inform("w1", &[(10, "q")]);
        h.ready("w1", 1);
        h.request("c1", "m1", "q", "quick");
        h.take_bodies("w1");
        h.advance(5 * S);
        h.reply("w1", "m1");
        h.ready("w1", 1);
        h.request("c1", "m2", "q", "quick too");
        h.advance(6 * S + JOB_DEADLINE_GRACE);
        assert_eq!(h.inflight("w1"), ["m2"], "m2's deadline is later ({})", h.setup());
        h.advance(5 * S);
        assert!(h.inflight("w1").is_empty(), "then m2's deadline passes");
        assert_eq!((h.counter(|c| &c.completed_jobs), h.counter(|c| &c.jobs_timed_out)), (1, 1));
    }
}

#[test]
fn every_deadline_is_a_delivery_until_the_job_is_dead_lettered() {
    for mut h in setups(Some(10 * S)) {
        for round in 0..=MAX_RETRIES {
            let id = format!("w{round}");
            h.inform(&id, &[(10, "q")]);
            h.ready(&id, 1);
            if round == 0 {
                h.request("c1", "m1", "q", "hangs");
            }
            assert_eq!(h.take_bodies(&id), ["hangs"], "round {round} ({})", h.setup());
            h.advance(10 * S + JOB_DEADLINE_GRACE);
        }
        assert!(h.waiting("q").is_empty(), "{}", h.setup());
        assert_eq!(h.counter(|c| &c.jobs_timed_out), u64::from(MAX_RETRIES) + 1);
        assert_eq!(h.counter(|c| &c.dead_lettered), 1);
        assert_eq!(h.ctx.job_bytes.load(std::sync::atomic::Ordering::Relaxed), 0);
    }
}

#[test]
fn a_worker_that_dies_owing_answers_leaves_nothing_paused() {
    for mut h in setups(Some(10 * S)) {
        h.inform("w1", &[(10, "q")]);
        h.ready("w1", 1);
        h.request("c1", "m1", "q", "a");
        h.take_bodies("w1");
        h.advance(10 * S + JOB_DEADLINE_GRACE);
        h.inform("w1", &[(10, "q")]);
        h.ready("w1", 1);
        assert_eq!(h.take_bodies("w1"), ["a"], "a new registration is not paused ({})", h.setup());
        h.reply("w1", "m1");
        assert_eq!(h.counter(|c| &c.completed_jobs), 1, "its REPLY answers the new delivery");
        assert_eq!(h.counter(|c| &c.late_replies), 0);
    }
}
