//! Schedulers on shard 0 (scheduling.rs): INFORM, SCHEDULE to the owner
//! of its key, UNSCHEDULE to all, NO_SCHEDULER, heartbeats, expiry, failed
//! forwards. (Routing by key in depth, answers, refusals and re-admission:
//! `scheduling.rs` in these tests.)

use std::time::Duration;

use super::harness::{schedule_frames, Harness};
use super::observe::shape;
use crate::broker::egress::{Dest, OnFail, Outgoing};
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
fn a_schedule_goes_verbatim_to_the_owner_of_its_key_every_time() {
    for mut h in with_schedulers(3) {
        let mut to = Vec::new();
        for n in 0..6 {
            let frames = h.schedule("c1", &format!("m{n}"), false);
            let out = forwards(&mut h);
            assert_eq!(out.len(), 1, "unnamed (EventMQ) schedulers get no DROP copies");
            assert_eq!(
                (&out[0].1.frames(), &out[0].1.on_fail),
                (&frames, &OnFail::Schedule { client: super::harness::peer("c1") })
            );
            to.push(out[0].0.clone());
        }
        assert!(to.iter().all(|s| *s == to[0]), "one key, one owner: {to:?} ({})", h.setup());
        let counts: Vec<u64> = h.snapshot(0).schedulers.iter().map(|s| s.scheduled).collect();
        assert_eq!(counts.iter().sum::<u64>(), 6);
        assert!(counts.contains(&6));
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
        let mut to: Vec<&str> = out.iter().map(|(s, _)| s.as_str()).collect();
        to.sort();
        assert_eq!(to, ["s1", "s2", "s3"], "{}", h.setup());
        // The owner gets the client's frames (its answer goes back); the
        // others a copy with a fresh msgid.
        let verbatim: Vec<&Outgoing> = out.iter().map(|(_, o)| o).filter(|o| o.frames() == frames).collect();
        assert_eq!(verbatim.len(), 1);
        assert!(matches!(verbatim[0].on_fail, OnFail::Schedule { .. }));
        let copies: Vec<&Outgoing> = out.iter().map(|(_, o)| o).filter(|o| o.frames() != frames).collect();
        assert!(copies.iter().all(|o| o.on_fail == OnFail::Unschedule && o.frames()[2] == b"UNSCHEDULE"));
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

/// A scheduler heard from at `t` goes at the first heartbeat grid step at
/// or after `t + timeout` (docs/emqp.md "Liveness"), as a worker does: not
/// at the next of checks every half timeout, as before.
#[test]
fn silent_schedulers_expire_and_forwarding_is_no_heartbeat() {
    let step = HEARTBEAT_INTERVAL / 30;
    for mut h in with_schedulers(3) {
        h.advance(Duration::from_secs(1));
        h.scheduler_heartbeat("s2");
        h.schedule("c1", "m1", false);
        // An unknown peer's HEARTBEAT re-admits it (scheduling.rs).
        h.scheduler_heartbeat("nobody");
        h.advance(HEARTBEAT_TIMEOUT - Duration::from_secs(1));
        let ids = |h: &Harness| h.snapshot(0).schedulers.into_iter().map(|s| s.id).collect::<Vec<_>>();
        assert_eq!(ids(&h), ["s2", "nobody"], "{}", h.setup());
        h.advance(Duration::from_secs(1) - Duration::from_millis(1));
        assert_eq!(ids(&h), ["s2", "nobody"], "never early");
        h.advance(Duration::from_millis(1) + step);
        assert_eq!(ids(&h), Vec::<String>::new(), "at most one grid step late");
        assert_eq!(h.counter(|c| &c.expired_schedulers), 4);
    }
}

#[test]
fn a_failed_schedule_goes_to_the_next_scheduler_then_errors() {
    for mut h in with_schedulers(2) {
        let frames = h.schedule("c1", "m1", false);
        let first = forwards(&mut h)[0].0.clone();
        let other = if first == "s1" { "s2" } else { "s1" };
        h.scheduler_send_failed(&first, Some(("c1", frames.clone())));
        let out = forwards(&mut h);
        assert_eq!((out[0].0.as_str(), &out[0].1.frames()), (other, &frames), "{}", h.setup());
        h.scheduler_send_failed(other, Some(("c1", frames)));
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

/// A scheduler leaving (KBYE, failed forward) moves only its own keys.
#[test]
fn a_schedule_stays_with_its_owner_until_the_owner_leaves() {
    for mut h in with_schedulers(4) {
        h.schedule("c1", "m1", false);
        let owner = forwards(&mut h)[0].0.clone();
        let bystander = ["s1", "s2", "s3", "s4"].into_iter().find(|s| *s != owner).unwrap_or("s1");
        h.scheduler_kbye(bystander);
        h.schedule("c1", "m2", false);
        assert_eq!(forwards(&mut h)[0].0, owner, "{}", h.setup());
        h.scheduler_send_failed(&owner, None);
        h.schedule("c1", "m3", false);
        let moved = forwards(&mut h)[0].0.clone();
        assert!(moved != owner && moved != bystander, "{moved} ({})", h.setup());
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
