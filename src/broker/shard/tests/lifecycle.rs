//! Every step of a job's life is one debug line with its ids, so that
//! `--log emq=debug` answers "where did my job go?"; at info there is
//! nothing per job.

use std::time::Duration;

use super::harness::{self, Harness};
use crate::broker::text_port::TextAnswer;
use crate::logging::capture;

/// The messages of the lines that name `job=`, with the fields that matter.
fn steps(log: &str) -> Vec<String> {
    let field = |line: &str, name: &str| {
        let start = line.find(&format!(" {name}="))? + name.len() + 2;
        line[start..].split(' ').next().map(|v| format!("{name}={v}"))
    };
    log.lines()
        .filter(|line| line.contains(" job="))
        .map(|line| {
            let message = line.split(": ").nth(1).unwrap_or("").split(" queue=").next().unwrap_or("").to_string();
            let ids = ["queue", "job", "msgid", "worker", "conn", "to"].iter().filter_map(|n| field(line, n));
            std::iter::once(message).chain(ids).collect::<Vec<_>>().join(" ")
        })
        .collect()
}

fn life(h: &mut Harness) {
    h.inform("w1", &[(10, "q")]);
    h.request("c1", "m1", "q", "a");
    h.request("c1", "m2", "q", "b");
    h.ready("w1", 2);
    h.reply("w1", "m1");
    h.reply_failed("w1", "m2", true);
    h.request("c1", "m3", "q", "c");
    h.heartbeat("w1");
    h.text_sched(1, "t", "x");
    let offer = harness::offer_id(&h.text_ask(1, "t")).expect("an offer");
    h.text_answer(1, offer, TextAnswer::Dcl);
    let offer = harness::offer_id(&h.text_ask(1, "t")).expect("an offer");
    h.text_answer(1, offer, TextAnswer::Ack);
    h.text_sched(1, "t", "y");
    let offer = harness::offer_id(&h.text_ask(1, "t")).expect("an offer");
    h.text_answer(1, offer, TextAnswer::Del);
}

#[test]
fn debug_logs_each_step_with_its_ids() {
    let mut h = Harness::new(1);
    let ((), log) = capture("emq=debug", || life(&mut h));
    let steps = steps(&log);
    let want = [
        "job accepted and queued queue=q job=0-1 msgid=m1",
        "job accepted and queued queue=q job=0-2 msgid=m2",
        "job dispatched queue=q job=0-1 msgid=m1 worker=w1",
        "job dispatched queue=q job=0-2 msgid=m2 worker=w1",
        "job completed queue=q job=0-1 msgid=m1 worker=w1",
        "job failed queue=q job=0-2 msgid=m2 worker=w1",
        "job will be retried queue=q job=0-2 msgid=m2",
        "job accepted and queued queue=q job=0-3 msgid=m3",
    ];
    assert_eq!(steps[..want.len()], want, "{log}");
    // A text job's msgid is a fresh uuid4, made by the router.
    let msgid =
        |step: &String| step.split(" msgid=").nth(1).and_then(|s| s.split(' ').next()).unwrap_or("").to_string();
    let (x, y) = (msgid(&steps[want.len()]), msgid(&steps[want.len() + 5]));
    assert_eq!(
        steps[want.len()..],
        [
            format!("job accepted and queued queue=t job=0-4 msgid={x}"),
            format!("job offered queue=t job=0-4 msgid={x} conn=text-1"),
            format!("job requeued queue=t job=0-4 msgid={x} to=back"),
            format!("job offered queue=t job=0-4 msgid={x} conn=text-1"),
            format!("job completed (ACK) queue=t job=0-4 msgid={x} conn=text-1"),
            format!("job accepted and queued queue=t job=0-5 msgid={y}"),
            format!("job offered queue=t job=0-5 msgid={y} conn=text-1"),
            format!("job failed (DEL) queue=t job=0-5 msgid={y} conn=text-1"),
        ],
        "{log}"
    );
    assert!(x.len() == 36 && y.len() == 36 && x != y, "{x} {y}");
}

/// A text offer that times out and a REPLY for a job its deadline took
/// back: `life` with both, under `filter`; the log.
fn lapses(filter: &str) -> String {
    let mut h = Harness::with_config(1, |c| {
        c.text.offer_timeout = Duration::from_secs(10);
        c.job_timeout = Some(Duration::from_secs(10));
        c.retry_backoff = Duration::ZERO;
        c.heartbeat_timeout = Duration::from_secs(1000);
    });
    capture(filter, || {
        h.text_sched(1, "t", "x");
        assert!(harness::offer_id(&h.text_ask(1, "t")).is_some());
        h.advance(Duration::from_secs(11));
        h.inform("w1", &[(10, "q")]);
        h.ready("w1", 1);
        h.request("c1", "m1", "q", "slow");
        h.advance(Duration::from_secs(10) + crate::limits::JOB_DEADLINE_GRACE);
        h.reply("w1", "m1");
        assert_eq!(h.counter(|c| &c.late_replies), 1);
    })
    .1
}

#[test]
fn a_lapsed_offer_and_a_late_reply_are_debug_lines() {
    let log = lapses("emq=debug");
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("timed out") || l.contains("REPLY for"))
        .filter_map(|l| l.split_once(' ').map(|(_time, rest)| rest.trim_start()))
        .collect();
    let offer = lines.first().and_then(|l| l.split(" msgid=").nth(1)).and_then(|m| m.split(' ').next()).unwrap_or("");
    assert_eq!(
        lines,
        [
            format!("DEBUG emq::broker::shard::text: text offer timed out queue=t job=0-1 msgid={offer} conn=text-1"),
            "DEBUG emq::broker::shard::deadline: REPLY for a job taken back by its deadline: ignored worker=w1 \
             queue=q msgid=m1"
                .to_string(),
        ],
        "{log}"
    );
    let info = lapses("info");
    let per_job: Vec<&str> =
        info.lines().filter(|l| !l.contains("worker registered") && !l.contains("past its deadline")).collect();
    assert_eq!(per_job, Vec::<&str>::new(), "at info only the (rate-limited) deadline warning");
}

#[test]
fn info_logs_nothing_per_job() {
    let mut h = Harness::new(1);
    let ((), log) = capture("info", || life(&mut h));
    assert_eq!(log.lines().filter(|l| !l.contains("worker registered")).collect::<Vec<_>>(), Vec::<&str>::new());
}

#[test]
fn a_dead_workers_jobs_are_logged_as_requeued() {
    let mut h = Harness::new(1);
    h.inform("w1", &[(10, "q")]);
    h.ready("w1", 1);
    h.request("c1", "m1", "q", "a");
    let ((), log) = capture("emq=debug", || h.advance(crate::limits::HEARTBEAT_TIMEOUT * 2));
    assert_eq!(steps(&log), ["job requeued queue=q job=0-1 msgid=m1 to=front"], "{log}");
}
