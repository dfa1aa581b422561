//! Schedulers on shard 0 (peers.rs): INFORM, SCHEDULE round-robin,
//! UNSCHEDULE to all, NO_SCHEDULER, heartbeats, expiry, failed forwards.

use std::time::Duration;

use super::harness::{schedule_frames, Harness};
use super::observe::shape;
use crate::broker::msg::{Dest, OnFail, Outgoing};
use crate::limits::{HEARTBEAT_INTERVAL, HEARTBEAT_TIMEOUT};

/// Schedulers `s1..=n` registered on shard 0 of 1 and of 3 shards.
fn with_schedulers(n: usize) -> Vec<Harness> {
    let mut all = Harness::setups(|_| {});
    for h in &mut all {
        for i in 1..=n {
            h.scheduler_inform(&format!("s{i}"));
        }
        h.emqp.clear();
    }
    all
}

/// The schedulers the frames went to, in order, and their frames.
fn forwards(h: &mut Harness) -> Vec<(String, Outgoing)> {
    std::mem::take(&mut h.emqp).into_iter().map(|o| (String::from_utf8_lossy(&o.peer.0).into_owned(), o)).collect()
}

#[test]
fn scheduler_inform_acks_then_heartbeats() {
    for mut h in Harness::setups(|_| {}) {
        h.scheduler_inform("s1");
        let out = h.take_to("s1");
        assert_eq!(shape(&out[0]), ["", "eMQP/1.0", "ACK", "*", "inform-s1"], "{}", h.setup());
        assert_eq!(shape(&out[1])[..4], ["", "eMQP/1.0", "HEARTBEAT", "*"]);
        assert!(out.iter().all(|o| o.dest == Dest::Frontend) && out.len() == 2);
        assert_eq!(h.snapshot(0).schedulers.len(), 1);
    }
}

#[test]
fn schedule_goes_round_robin_verbatim() {
    for mut h in with_schedulers(3) {
        let mut to = Vec::new();
        for n in 0..6 {
            let frames = h.schedule("c1", &format!("m{n}"), false);
            let out = forwards(&mut h);
            assert_eq!(out.len(), 1);
            assert_eq!(
                (&out[0].1.frames(), &out[0].1.on_fail),
                (&frames, &OnFail::Schedule { client: super::harness::peer("c1") })
            );
            to.push(out[0].0.clone());
        }
        assert_eq!(to, ["s1", "s2", "s3", "s1", "s2", "s3"], "{}", h.setup());
        assert!(h.snapshot(0).schedulers.iter().all(|s| s.scheduled == 2));
    }
}

#[test]
fn repeated_scheduler_inform_keeps_one_entry() {
    for mut h in with_schedulers(2) {
        h.scheduler_inform("s1");
        let ids: Vec<String> = h.snapshot(0).schedulers.into_iter().map(|s| s.id).collect();
        assert_eq!(ids, ["s2", "s1"], "{}", h.setup());
    }
}

#[test]
fn unschedule_goes_to_every_scheduler() {
    for mut h in with_schedulers(3) {
        let frames = h.schedule("c1", "m1", true);
        let out = forwards(&mut h);
        let to: Vec<&str> = out.iter().map(|(s, _)| s.as_str()).collect();
        assert_eq!(to, ["s1", "s2", "s3"], "{}", h.setup());
        assert!(out.iter().all(|(_, o)| o.frames() == frames && o.on_fail == OnFail::Unschedule));
    }
}

#[test]
fn no_scheduler_gives_an_error() {
    for mut h in with_schedulers(0) {
        for (msgid, unschedule) in [("m1", false), ("m2", true)] {
            h.schedule("c1", msgid, unschedule);
            let out = h.take_to("c1");
            let text = "no scheduler is connected";
            assert_eq!(shape(&out[0]), ["", "eMQP/1.0", "ERROR", "*", msgid, "NO_SCHEDULER", text], "{}", h.setup());
        }
        assert_eq!(h.counter(|c| &c.rejected_no_scheduler), 2);
    }
}

#[test]
fn schedulers_get_heartbeats_every_interval() {
    for mut h in with_schedulers(2) {
        h.advance(HEARTBEAT_INTERVAL - Duration::from_millis(1));
        assert!(h.emqp.is_empty());
        h.advance(Duration::from_millis(1));
        let to: Vec<(String, String)> = forwards(&mut h).into_iter().map(|(s, o)| (s, shape(&o)[2].clone())).collect();
        assert_eq!(to, [("s1".into(), "HEARTBEAT".into()), ("s2".into(), "HEARTBEAT".into())], "{}", h.setup());
    }
}

/// Expiry checks run at the timeout, then every half timeout: a scheduler
/// heard from at `t` goes at the first check at or after `t + timeout`.
#[test]
fn silent_schedulers_expire_and_forwarding_is_no_heartbeat() {
    let half = HEARTBEAT_TIMEOUT / 2;
    for mut h in with_schedulers(3) {
        h.advance(Duration::from_secs(1));
        h.scheduler_heartbeat("s2");
        h.schedule("c1", "m1", false);
        h.scheduler_heartbeat("nobody");
        h.advance(HEARTBEAT_TIMEOUT - Duration::from_secs(1));
        let ids = |h: &Harness| h.snapshot(0).schedulers.into_iter().map(|s| s.id).collect::<Vec<_>>();
        assert_eq!(ids(&h), ["s2"], "{}", h.setup());
        h.advance(half);
        assert_eq!(ids(&h), Vec::<String>::new());
        assert_eq!(h.counter(|c| &c.expired_schedulers), 3);
    }
}

#[test]
fn a_failed_schedule_goes_to_the_next_scheduler_then_errors() {
    for mut h in with_schedulers(2) {
        let frames = h.schedule("c1", "m1", false);
        assert_eq!(forwards(&mut h)[0].0, "s1");
        h.scheduler_send_failed("s1", Some(("c1", frames.clone())));
        let out = forwards(&mut h);
        assert_eq!((out[0].0.as_str(), &out[0].1.frames()), ("s2", &frames), "{}", h.setup());
        h.scheduler_send_failed("s2", Some(("c1", frames)));
        let out = h.take_to("c1");
        assert_eq!(shape(&out[0])[4..6], ["m1", "NO_SCHEDULER"]);
        assert!(h.snapshot(0).schedulers.is_empty());
    }
}

#[test]
fn a_failed_unschedule_or_a_kbye_drops_the_scheduler() {
    for mut h in with_schedulers(3) {
        h.scheduler_send_failed("s1", None);
        h.scheduler_kbye("s3");
        h.scheduler_kbye("nobody");
        let ids: Vec<String> = h.snapshot(0).schedulers.into_iter().map(|s| s.id).collect();
        assert_eq!(ids, ["s2"], "{}", h.setup());
        assert!(h.emqp.is_empty());
        h.schedule("c1", "m1", false);
        assert_eq!(forwards(&mut h)[0].1.frames(), schedule_frames("m1", false));
    }
}

/// A scheduler leaving (KBYE, failed forward) does not make the
/// round-robin skip the one whose turn is next.
#[test]
fn round_robin_goes_on_with_the_next_after_a_scheduler_leaves() {
    for mut h in with_schedulers(4) {
        h.schedule("c1", "m1", false);
        h.scheduler_kbye("s1");
        h.schedule("c1", "m2", false);
        h.schedule("c1", "m3", false);
        h.scheduler_send_failed("s3", None);
        h.schedule("c1", "m4", false);
        h.schedule("c1", "m5", false);
        let to: Vec<String> = forwards(&mut h).into_iter().map(|(s, _)| s).collect();
        assert_eq!(to, ["s1", "s2", "s3", "s4", "s2"], "{}", h.setup());
    }
}

#[test]
fn past_max_schedulers_an_inform_is_refused_but_a_repeat_is_not() {
    let mut h = super::harness::Harness::with_config(1, |c| c.max_schedulers = 1);
    h.scheduler_inform("s1");
    h.scheduler_inform("s2");
    assert_eq!(h.take_commands("s2"), ["ERROR"]);
    assert_eq!(h.ctx.counters.rejected_scheduler_limit.load(std::sync::atomic::Ordering::Relaxed), 1);
    h.take_commands("s1");
    h.scheduler_inform("s1");
    assert_eq!(h.take_commands("s1"), ["ACK", "HEARTBEAT"]);
}
