//! Schedulers on shard 0, without sockets: SCHEDULE/UNSCHEDULE routing by
//! schedule key, answers back to the sender, refusals, re-admission, and
//! DISCONNECT for unknown workers.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::harness::{peer, Harness};
use crate::broker::egress::{Dest, Outgoing};
use crate::broker::inbox::{Schedule, ShardMsg};
use crate::ids::MsgId;
use crate::protocol::emqp::Frame;

fn body(args: &str) -> String {
    format!(
        r#"["run", {{"callable": "f", "path": "m", "args": {args}, "kwargs": {{}}, "class_args": [], "class_kwargs": {{}}}}]"#
    )
}

fn frames(word: &str, msgid: &str, interval: &str, body: &str, cron: &str) -> Vec<Frame> {
    [&b""[..], b"eMQP/1.0", word.as_bytes(), msgid.as_bytes(), b"q", b"nohaste", interval.as_bytes(), body.as_bytes()]
        .iter()
        .map(|f| f.to_vec())
        .chain(std::iter::once(cron.as_bytes().to_vec()))
        .collect()
}

fn inform(h: &mut Harness, id: &str, name: Option<&str>) {
    let msg = ShardMsg::SchedulerInform {
        id: peer(id),
        msgid: MsgId::from(format!("inform-{id}").into_bytes()),
        name: name.map(|n| n.as_bytes().to_vec()),
    };
    h.send(0, msg);
    assert_eq!(h.take_commands(id), ["ACK", "HEARTBEAT"]);
}

fn schedule(h: &mut Harness, client: &str, f: Vec<Frame>) {
    let sched = Schedule::from_frames(peer(client), f).expect("a SCHEDULE or UNSCHEDULE");
    h.send(0, ShardMsg::Schedule(sched));
}

/// `(peer, command word, msgid)` of every frame list sent so far, taken.
fn sent(h: &mut Harness) -> Vec<(String, String, String)> {
    std::mem::take(&mut h.emqp)
        .into_iter()
        .map(|o: Outgoing| {
            assert_eq!(o.dest, Dest::Frontend);
            let s = |f: &Frame| String::from_utf8_lossy(f).into_owned();
            let f = o.frames();
            (s(&o.peer.0.to_vec()), s(&f[2]), s(&f[3]))
        })
        .collect()
}

fn counter(h: &Harness, f: impl Fn(&crate::metrics::counters::Counters) -> &std::sync::atomic::AtomicU64) -> u64 {
    f(&h.ctx.counters).load(Ordering::Relaxed)
}

#[test]
fn a_schedule_goes_to_its_owner_every_time_and_the_others_drop_copies() {
    let mut h = Harness::new(2);
    for (id, name) in [("s1", "one"), ("s2", "two"), ("s3", "three")] {
        inform(&mut h, id, Some(name));
    }
    schedule(&mut h, "c1", frames("SCHEDULE", "m1", "60", &body("[1]"), ""));
    let first = sent(&mut h);
    let owners: Vec<&(String, String, String)> = first.iter().filter(|(_, w, _)| w == "SCHEDULE").collect();
    assert_eq!(owners.len(), 1, "{first:?}");
    let (owner, _, msgid) = owners[0].clone();
    assert_eq!(msgid, "m1", "the owner gets the client's frames verbatim");
    let drops: Vec<&(String, String, String)> = first.iter().filter(|(_, w, _)| w == "DROP").collect();
    assert_eq!(drops.len(), 2, "every other emq-scheduler drops any copy: {first:?}");
    assert!(drops.iter().all(|(p, _, m)| *p != owner && m.len() == 36), "fresh msgids: {drops:?}");
    // The same schedule again, from another client: the same owner.
    schedule(&mut h, "c2", frames("SCHEDULE", "m2", "30", &body("[1]"), ""));
    let again = sent(&mut h);
    assert!(again.contains(&(owner.clone(), "SCHEDULE".into(), "m2".into())), "{again:?}");
    // Three keys on three schedulers: each new key to the least loaded.
    for (i, args) in ["[2]", "[3]"].iter().enumerate() {
        schedule(&mut h, "c1", frames("SCHEDULE", &format!("k{i}"), "60", &body(args), ""));
    }
    let mut holders: Vec<String> =
        sent(&mut h).into_iter().filter(|(_, w, _)| w == "SCHEDULE").map(|(p, _, _)| p).collect();
    holders.push(owner);
    holders.sort();
    assert_eq!(holders, ["s1", "s2", "s3"]);
}

#[test]
fn unschedule_goes_to_the_owner_and_a_copy_to_every_other_scheduler() {
    let mut h = Harness::new(1);
    inform(&mut h, "named", Some("n"));
    inform(&mut h, "python", None);
    schedule(&mut h, "c", frames("SCHEDULE", "s", "60", &body("[1]"), ""));
    let owner = sent(&mut h).into_iter().find(|(_, w, _)| w == "SCHEDULE").expect("routed").0;
    schedule(&mut h, "c", frames("UNSCHEDULE", "u", "-1", &body("[1]"), ""));
    let out = sent(&mut h);
    assert_eq!(out.len(), 2, "{out:?}");
    assert!(out.contains(&(owner.clone(), "UNSCHEDULE".into(), "u".into())), "{out:?}");
    let copy = out.iter().find(|(p, _, _)| *p != owner).expect("a copy");
    assert_eq!((copy.1.as_str(), copy.2.len()), ("UNSCHEDULE", 36), "a Python scheduler gets UNSCHEDULE, not DROP");
}

#[test]
fn answers_go_back_to_the_client_that_sent_the_schedule() {
    let mut h = Harness::new(1);
    inform(&mut h, "s1", Some("one"));
    schedule(&mut h, "c1", frames("SCHEDULE", "dup", "60", &body("[1]"), ""));
    schedule(&mut h, "c2", frames("SCHEDULE", "dup", "60", &body("[1]"), "0 0 30 2 *"));
    assert_eq!(h.take_commands("c2"), ["ERROR"], "the second is refused by the router (interval and cron)");
    assert_eq!(sent(&mut h).len(), 1);
    schedule(&mut h, "c2", frames("SCHEDULE", "dup", "-1", &body("[1]"), "0 0 30 2 *"));
    sent(&mut h);
    let reply = [&b""[..], b"eMQP/1.0", b"REPLY", b"r1", b"dup", b"{\"outcome\":\"added\"}"];
    let reply: Vec<Frame> = reply.iter().map(|f| f.to_vec()).collect();
    h.send(0, ShardMsg::SchedulerAnswer { id: peer("s1"), refers_to: MsgId::from(&b"dup"[..]), frames: reply.clone() });
    let to_c1 = h.take_to("c1");
    assert_eq!(to_c1.len(), 1);
    assert_eq!(to_c1[0].frames(), reply, "forwarded verbatim to the first sender");
    let error = [&b""[..], b"eMQP/1.0", b"ERROR", b"e1", b"dup", b"BAD_CRON", b"never matches"];
    let error: Vec<Frame> = error.iter().map(|f| f.to_vec()).collect();
    h.send(0, ShardMsg::SchedulerAnswer { id: peer("s1"), refers_to: MsgId::from(&b"dup"[..]), frames: error.clone() });
    assert_eq!(h.take_to("c2")[0].frames(), error);
    h.send(0, ShardMsg::SchedulerAnswer { id: peer("s1"), refers_to: MsgId::from(&b"dup"[..]), frames: error });
    assert!(h.emqp.is_empty(), "nobody waits any more");
    assert_eq!(counter(&h, |c| &c.schedule_answers_forwarded), 2);
    assert_eq!(counter(&h, |c| &c.schedule_answers_unmatched), 1);
}

#[test]
fn what_a_scheduler_would_refuse_is_refused_by_the_router_with_its_reason() {
    let mut h = Harness::new(1);
    schedule(&mut h, "c", frames("SCHEDULE", "none", "60", &body("[1]"), ""));
    let e = h.take_to("c");
    assert_eq!((e[0].frames()[2].as_slice(), e[0].frames()[5].as_slice()), (&b"ERROR"[..], &b"NO_SCHEDULER"[..]));
    inform(&mut h, "s1", None);
    let cases = [
        (frames("SCHEDULE", "a", "-1", &body("[1]"), "61 * * * *"), "BAD_CRON"),
        (frames("SCHEDULE", "b", "60", &body("[1]"), "* * * * *"), "BAD_SCHEDULE"),
        (frames("SCHEDULE", "c", "0", &body("[1]"), ""), "BAD_INTERVAL"),
        (frames("SCHEDULE", "d", "60", r#"{"any": "body"}"#, ""), "BAD_BODY"),
        (frames("UNSCHEDULE", "e", "-1", "[]", ""), "BAD_BODY"),
    ];
    for (f, code) in cases {
        let msgid = f[3].clone();
        schedule(&mut h, "c", f);
        let out = h.take_to("c");
        assert_eq!(out.len(), 1, "{code}");
        assert_eq!((out[0].frames()[4].clone(), out[0].frames()[5].clone()), (msgid, code.as_bytes().to_vec()));
        let text = String::from_utf8_lossy(&out[0].frames()[6]).into_owned();
        assert!(text.starts_with("frame"), "the reason names the frame: {text}");
    }
    assert!(h.take_to("s1").is_empty(), "nothing reached the scheduler");
    assert_eq!(counter(&h, |c| &c.rejected_schedule_invalid), 5);
}

#[test]
fn a_returning_scheduler_gets_its_keys_back_by_name_and_a_moved_key_stays_moved() {
    let mut h = Harness::with_config(1, |c| c.heartbeat_timeout = Duration::from_secs(5));
    inform(&mut h, "a-1", Some("a"));
    inform(&mut h, "b-1", Some("b"));
    schedule(&mut h, "c", frames("SCHEDULE", "k1", "60", &body("[1]"), ""));
    schedule(&mut h, "c", frames("SCHEDULE", "k2", "60", &body("[2]"), ""));
    let routed: Vec<(String, String)> =
        sent(&mut h).into_iter().filter(|(_, w, _)| w == "SCHEDULE").map(|(p, _, m)| (m, p)).collect();
    let owner_of = |m: &str| routed.iter().find(|(k, _)| k == m).map(|(_, p)| p.clone()).expect("routed");
    let (dead, alive) = (owner_of("k1"), owner_of("k2"));
    assert_ne!(dead, alive, "one key each");
    // k1's owner goes silent and expires; the survivor keeps heartbeating.
    for _ in 0..4 {
        h.advance(Duration::from_secs(2));
        h.send(0, ShardMsg::SchedulerHeartbeat { id: peer(&alive), msgid: MsgId::from(&b"hb"[..]) });
    }
    h.emqp.clear();
    assert_eq!(counter(&h, |c| &c.expired_schedulers), 1);
    // k2 is untouched; k1 sent again moves to the survivor.
    schedule(&mut h, "c", frames("SCHEDULE", "k1-again", "60", &body("[1]"), ""));
    assert!(sent(&mut h).contains(&(alive.clone(), "SCHEDULE".into(), "k1-again".into())));
    // The dead one comes back under its name with a new identity: k2 stays
    // where it was, and k1 stays with its new owner.
    let name = if dead == "a-1" { "a" } else { "b" };
    // Its stale copy of k1 is dropped before its ACK (tombstones.rs).
    let back = format!("{name}-2");
    let msgid = MsgId::from(&b"inform-back"[..]);
    h.send(0, ShardMsg::SchedulerInform { id: peer(&back), msgid, name: Some(name.as_bytes().to_vec()) });
    assert_eq!(h.take_commands(&back), ["DROP", "ACK", "HEARTBEAT"]);
    schedule(&mut h, "c", frames("SCHEDULE", "k2-again", "60", &body("[2]"), ""));
    assert!(sent(&mut h).contains(&(alive.clone(), "SCHEDULE".into(), "k2-again".into())));
    schedule(&mut h, "c", frames("SCHEDULE", "k1-third", "60", &body("[1]"), ""));
    let out = sent(&mut h);
    assert!(out.contains(&(alive.clone(), "SCHEDULE".into(), "k1-third".into())), "moved keys stay moved: {out:?}");
    let drop = out.iter().find(|(p, _, _)| *p == format!("{name}-2")).expect("a DROP for the returned scheduler");
    assert_eq!((out.len(), drop.1.as_str()), (2, "DROP"), "its stale copy is dropped: {out:?}");
}

#[test]
fn a_returning_scheduler_owns_the_keys_nobody_moved() {
    let mut h = Harness::new(1);
    inform(&mut h, "a-1", Some("a"));
    schedule(&mut h, "c", frames("SCHEDULE", "k", "60", &body("[1]"), ""));
    sent(&mut h);
    h.send(0, ShardMsg::SchedulerKbye { id: peer("a-1") });
    inform(&mut h, "b-1", Some("b"));
    inform(&mut h, "a-2", Some("a"));
    schedule(&mut h, "c", frames("SCHEDULE", "k-again", "60", &body("[1]"), ""));
    let out = sent(&mut h);
    assert!(out.contains(&("a-2".into(), "SCHEDULE".into(), "k-again".into())), "{out:?}");
}

#[test]
fn an_unknown_scheduler_heartbeat_re_admits_it_within_the_limit() {
    let mut h = Harness::new(1);
    h.send(0, ShardMsg::SchedulerHeartbeat { id: peer("ghost"), msgid: MsgId::from(&b"hb-1"[..]) });
    let out = h.take_to("ghost");
    assert_eq!(out.len(), 2);
    assert_eq!((out[0].frames()[2].as_slice(), out[0].frames()[4].as_slice()), (&b"ACK"[..], &b"hb-1"[..]));
    assert_eq!(out[1].frames()[2], b"HEARTBEAT");
    h.send(0, ShardMsg::SchedulerHeartbeat { id: peer("ghost"), msgid: MsgId::from(&b"hb-2"[..]) });
    assert!(h.take_to("ghost").is_empty(), "a known scheduler's heartbeat is only noted");
    assert_eq!(counter(&h, |c| &c.readmitted_schedulers), 1);
    for i in 1..crate::limits::MAX_SCHEDULERS {
        h.send(0, ShardMsg::SchedulerHeartbeat { id: peer(&format!("s{i}")), msgid: MsgId::from(&b"hb"[..]) });
    }
    h.emqp.clear();
    inform_refused(&mut h);
}

fn inform_refused(h: &mut Harness) {
    let msg = ShardMsg::SchedulerInform { id: peer("late"), msgid: MsgId::from(&b"i"[..]), name: None };
    h.send(0, msg);
    let out = h.take_to("late");
    assert_eq!((out.len(), out[0].frames()[5].as_slice()), (1, &b"BUSY"[..]));
    assert_eq!(counter(h, |c| &c.rejected_inform), 1);
}

#[test]
fn an_unknown_worker_is_told_disconnect_but_not_for_kbye() {
    let mut h = Harness::new(3);
    h.ready("nobody", 1);
    h.heartbeat("nobody");
    h.reply("nobody", "m");
    h.kbye("nobody");
    assert_eq!(h.take_commands("nobody"), ["DISCONNECT", "DISCONNECT", "DISCONNECT"]);
    assert_eq!(counter(&h, |c| &c.disconnects_to_unknown_workers), 3);
}

#[test]
fn two_live_schedulers_sharing_a_name_are_counted_when_one_takes_it_back() {
    let mut h = Harness::new(1);
    inform(&mut h, "a-1", Some("a"));
    inform(&mut h, "a-2", Some("a"));
    assert_eq!(counter(&h, |c| &c.scheduler_name_conflicts), 0, "a restart under a new identity");
    inform(&mut h, "a-1", Some("a"));
    inform(&mut h, "a-2", Some("a"));
    assert_eq!(counter(&h, |c| &c.scheduler_name_conflicts), 2, "each takes the name back from the other");
}
