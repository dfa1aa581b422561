//! Per-queue settings (`queues`, [`crate::config::queues`]): a named queue's
//! own retries, limits and time limit apply to it alone; every other queue
//! and every setting it leaves out keeps the router-wide value.

use std::time::Duration;

use super::harness::Harness;
use super::observe::shape;
use super::retries::dead_op;
use crate::broker::admin::{AdminAnswer, AdminOp};
use crate::limits::JOB_DEADLINE_GRACE;

const S: Duration = Duration::from_secs(1);

/// Every setup with `max_retries` 2 and `max_queue_len` 3 router-wide;
/// `strict` has no retries and room for one job, `slow` no time limit.
fn setups() -> Vec<Harness> {
    Harness::setups(|c| {
        c.max_retries = 2;
        c.max_queue_len = 3;
        c.job_timeout = Some(10 * S);
        c.retry_backoff = Duration::ZERO;
        c.heartbeat_timeout = 1000 * S;
        c.queues = serde_json::from_str(
            r#"{"strict": {"max_retries": 0, "max_queue_len": 1}, "slow": {"job_timeout": "0s"}}"#,
        )
        .expect("a JSON table");
    })
}

/// Dead jobs of every shard.
fn dead_jobs(h: &mut Harness) -> usize {
    (0..h.shards.len())
        .map(|shard| match dead_op(h, shard, AdminOp::DeadList(None)) {
            AdminAnswer::DeadList { entries, .. } => entries.len(),
            _ => 0,
        })
        .sum()
}

#[test]
fn a_queues_own_limit_refuses_its_jobs_alone() {
    for mut h in setups() {
        h.inform("w1", &[(10, "strict"), (10, "other")]);
        h.request("c1", "m1", "strict", "a");
        h.request("c1", "m2", "strict", "b");
        for n in 0..4 {
            h.request("c1", &format!("o{n}"), "other", "x");
        }
        let refusals: Vec<Vec<String>> =
            h.take_to("c1").iter().map(shape).filter(|f| f[2] == "ERROR").map(|f| f[4..].to_vec()).collect();
        assert_eq!(
            refusals,
            [
                ["m2", "QUEUE_FULL", "queue strict holds 1 jobs, its limit"],
                ["o3", "QUEUE_FULL", "queue other holds 3 jobs, its limit"]
            ],
            "{}",
            h.setup()
        );
        assert_eq!(h.waiting("strict"), ["a"]);
        assert_eq!(h.waiting("other").len(), 3, "the router-wide max_queue_len");
        assert_eq!(h.counter(|c| &c.rejected_queue_full), 2);
    }
}

#[test]
fn a_queues_own_retries_decide_when_its_job_is_dead() {
    for mut h in setups() {
        h.inform("w1", &[(10, "strict"), (10, "other")]);
        h.ready("w1", 2);
        h.request("c1", "m1", "strict", "once");
        h.request("c1", "m2", "other", "thrice");
        assert_eq!(h.take_bodies("w1").len(), 2);
        h.reply_failed("w1", "m1", true);
        h.reply_failed("w1", "m2", true);
        assert_eq!(dead_jobs(&mut h), 1, "strict's job at its first failure ({})", h.setup());
        for _ in 0..2 {
            h.ready("w1", 1);
            assert_eq!(h.take_bodies("w1"), ["thrice"], "other's job retried ({})", h.setup());
            h.reply_failed("w1", "m2", true);
        }
        assert_eq!(dead_jobs(&mut h), 2, "other's job past the router-wide 2 retries");
    }
}

#[test]
fn a_queues_own_time_limit_keeps_the_router_wide_retries() {
    for mut h in setups() {
        h.inform("w1", &[(10, "slow"), (10, "other")]);
        h.ready("w1", 2);
        h.request("c1", "m1", "slow", "long");
        h.request("c1", "m2", "other", "short");
        assert_eq!(h.take_bodies("w1").len(), 2);
        h.advance(10 * S + JOB_DEADLINE_GRACE);
        assert_eq!(h.inflight("w1"), ["m1"], "slow has no time limit; other's 10 s passed ({})", h.setup());
        assert_eq!(dead_jobs(&mut h), 0, "other's job has retries left");
    }
}
