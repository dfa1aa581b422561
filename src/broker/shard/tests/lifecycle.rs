//! Every step of a job's life is one debug line with its ids, so that
//! `--log emq=debug` answers "where did my job go?"; at info there is
//! nothing per job.

use super::harness::{self, Harness};
use crate::broker::msg::TextAnswer;
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
    let text: Vec<&str> = steps[want.len()..].iter().map(|s| s.split(" msgid=").next().unwrap_or("")).collect();
    assert_eq!(text[0], "job accepted and queued queue=t job=0-4");
    assert_eq!(
        text[1..4],
        ["job offered queue=t job=0-4", "job requeued queue=t job=0-4", "job offered queue=t job=0-4"]
    );
    assert!(
        steps.last().is_some_and(|s| s.starts_with("job completed (ACK) queue=t job=0-4 conn=text-1")),
        "{steps:?}"
    );
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
