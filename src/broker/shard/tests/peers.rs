//! Workers on their home shard: INFORM, job REPLY, HEARTBEAT expiry,
//! heartbeats, KBYE and its grace, requeue order, MAX_RETRIES and failed
//! sends (peers.rs), on every [`Harness::setups`].

use std::time::Duration;

use super::harness::Harness;
use super::observe::shape;
use crate::broker::egress::Dest;
use crate::broker::inbox::ShardMsg;
use crate::ids::{JobId, MsgId};
use crate::limits::{HEARTBEAT_INTERVAL, HEARTBEAT_TIMEOUT, MAX_RETRIES};

const MS: Duration = Duration::from_millis(1);

/// Bodies held by worker `id`, in dispatch order.
fn held(h: &Harness, id: &str) -> Vec<String> {
    let key = h.key_of(id).expect("registered");
    h.jobs().inflight.get(&key).map_or(Vec::new(), |(_, held)| held.iter().map(|j| j.body.clone()).collect())
}

/// `w1` serving `queues` with `n` jobs `j0..` sent to it (msgids `m0..`,
/// on the first queue).
fn holding(mut h: Harness, queues: &[(i64, &str)], n: usize) -> Harness {
    h.inform("w1", queues);
    h.ready("w1", n);
    for i in 0..n {
        h.request("c1", &format!("m{i}"), queues[0].1, &format!("j{i}"));
    }
    assert_eq!(h.take_requests("w1").len(), n, "{}", h.setup());
    h
}

#[test]
fn inform_acks_then_heartbeats_and_adds_candidates() {
    for mut h in Harness::setups(|_| {}) {
        h.inform("w1", &[(10, "a"), (5, "b")]);
        let out = h.take_to("w1");
        let shapes: Vec<Vec<String>> = out.iter().map(|o| shape(o)[..5.min(o.frames().len())].to_vec()).collect();
        assert_eq!(shapes[0], ["", "eMQP/1.0", "ACK", "*", "inform-w1"], "{}", h.setup());
        assert_eq!(shapes[1][..4], ["", "eMQP/1.0", "HEARTBEAT", "*"]);
        assert_eq!((out.len(), out[1].frames().len(), out[0].dest), (2, 5, Dest::Backend));
        for (weight, queue) in [(10, "a"), (5, "b")] {
            let snap = h.snapshot(h.shard_of(queue));
            let q = snap.queues.iter().find(|q| q.name == queue).expect("the queue exists");
            assert_eq!(q.candidates, [(weight, "w1".to_string())]);
        }
    }
}

#[test]
fn re_inform_replaces_the_registration_and_requeues_its_jobs() {
    for h in Harness::setups(|_| {}) {
        let mut h = holding(h, &[(10, "a")], 2);
        h.request("c1", "mx", "a", "x");
        let old = h.key_of("w1");
        h.inform("w1", &[(5, "b")]);
        assert_eq!(h.take_commands("w1"), ["ACK", "HEARTBEAT"]);
        assert_ne!(h.key_of("w1"), old, "a new registration");
        assert_eq!((h.waiting("a"), h.slots("w1")), (vec!["j0".into(), "j1".into(), "x".into()], 0));
        assert!(held(&h, "w1").is_empty());
        let candidates = |h: &Harness, q: &str| {
            let snap = h.snapshot(h.shard_of(q));
            snap.queues.into_iter().find(|s| s.name == q).map(|s| s.candidates).unwrap_or_default()
        };
        assert_eq!((candidates(&h, "a"), candidates(&h, "b")), (vec![], vec![(5, "w1".to_string())]));
        assert_eq!(h.counter(|c| &c.requeued_jobs), 2);
        // The old registration's jobs were sent back: their answers now
        // complete nothing and are counted.
        h.reply("w1", "m0");
        assert_eq!((h.counter(|c| &c.completed_jobs), h.counter(|c| &c.unmatched_replies)), (0, 1));
    }
}

#[test]
fn job_reply_completes_and_unknown_msgids_are_ignored() {
    for h in Harness::setups(|_| {}) {
        let mut h = holding(h, &[(10, "q")], 2);
        h.reply("w1", "nosuch");
        assert_eq!((h.inflight("w1"), h.counter(|c| &c.completed_jobs)), (vec!["m0".into(), "m1".into()], 0));
        h.reply("w1", "m1");
        assert_eq!((h.inflight("w1"), h.counter(|c| &c.completed_jobs)), (vec!["m0".into()], 1));
        h.reply("w2", "m0");
        assert_eq!(h.inflight("w1"), ["m0"], "a REPLY from another peer completes nothing");
        assert_eq!(h.counter(|c| &c.unknown_worker_messages), 1);
        h.reply("w1", "m1");
        assert_eq!(h.counter(|c| &c.unmatched_replies), 2, "`nosuch` and the second answer of m1");
    }
}

#[test]
fn two_jobs_with_one_msgid_are_both_tracked_and_completed_oldest_first() {
    for mut h in Harness::setups(|_| {}) {
        h.inform("w1", &[(10, "q")]);
        h.ready("w1", 3);
        // Three clients: one client sending a msgid again is a duplicate
        // (no job; see flow.rs), three clients may share one.
        for (c, b) in [("c1", "first"), ("c2", "second"), ("c3", "third")] {
            h.request(c, "same", "q", b);
        }
        assert_eq!(held(&h, "w1"), ["first", "second", "third"], "{}", h.setup());
        h.reply("w1", "same");
        assert_eq!(held(&h, "w1"), ["second", "third"]);
        h.send_failed("w1", "same", false);
        assert_eq!(h.waiting("q"), ["second", "third"], "both requeued, in order");
    }
}

#[test]
fn silent_worker_expires_and_its_jobs_go_back_to_the_front_in_dispatch_order() {
    for h in Harness::setups(|_| {}) {
        let mut h = holding(h, &[(10, "q")], 3);
        h.request("c1", "mx", "q", "x");
        h.reply("w1", "m1");
        h.advance(HEARTBEAT_TIMEOUT - MS);
        assert!(h.key_of("w1").is_some(), "alive until the timeout");
        h.advance(MS);
        assert_eq!(h.key_of("w1"), None, "{}", h.setup());
        assert_eq!(h.waiting("q"), ["j0", "j2", "x"]);
        let counts = [h.counter(|c| &c.expired_workers), h.counter(|c| &c.requeued_jobs)];
        assert_eq!(counts, [1, 2]);
    }
}

#[test]
fn any_message_keeps_a_worker_alive() {
    // Expiry checks are rounded up to the grid (100 ms for the default 3 s
    // interval): a worker heard from off the grid goes at most a step late.
    let step = crate::broker::timers::Grid::for_heartbeats(std::time::Instant::now(), HEARTBEAT_INTERVAL).step();
    for mut h in Harness::setups(|_| {}) {
        h.inform("w1", &[(10, "q")]);
        h.advance(HEARTBEAT_TIMEOUT - MS);
        h.heartbeat("w1");
        h.advance(HEARTBEAT_TIMEOUT - MS);
        h.ready("w1", 1);
        h.advance(HEARTBEAT_TIMEOUT - MS);
        assert!(h.key_of("w1").is_some(), "{}", h.setup());
        h.advance(MS);
        assert!(h.key_of("w1").is_some(), "not before the next grid instant: {}", h.setup());
        h.advance(step);
        assert_eq!(h.key_of("w1"), None);
    }
}

#[test]
fn heartbeats_of_workers_informing_within_one_grid_step_fall_due_together() {
    for mut h in Harness::setups(|_| {}) {
        h.advance(10 * MS);
        h.inform("w1", &[(10, "q")]);
        h.advance(50 * MS);
        h.inform("w2", &[(10, "q")]);
        h.take_commands("w1");
        h.take_commands("w2");
        // Both were informed within (0 ms, 100 ms]: their next heartbeats
        // go out at 3 s, one grid step early for w2 and 10 ms early for w1.
        h.advance(HEARTBEAT_INTERVAL - 60 * MS - MS);
        assert!(h.take_commands("w1").is_empty(), "{}", h.setup());
        assert!(h.take_commands("w2").is_empty(), "{}", h.setup());
        h.advance(MS);
        assert_eq!(h.take_commands("w1"), ["HEARTBEAT"], "{}", h.setup());
        assert_eq!(h.take_commands("w2"), ["HEARTBEAT"], "{}", h.setup());
        // Then every interval exactly (while they stay alive).
        h.heartbeat("w1");
        h.heartbeat("w2");
        h.advance(HEARTBEAT_INTERVAL - MS);
        assert!(h.take_commands("w1").is_empty(), "{}", h.setup());
        assert!(h.take_commands("w2").is_empty(), "{}", h.setup());
        h.advance(MS);
        assert_eq!(h.take_commands("w1"), ["HEARTBEAT"], "{}", h.setup());
        assert_eq!(h.take_commands("w2"), ["HEARTBEAT"], "{}", h.setup());
    }
}

#[test]
fn heartbeats_are_sent_every_interval() {
    for mut h in Harness::setups(|_| {}) {
        h.inform("w1", &[(10, "q")]);
        h.take_commands("w1");
        for _ in 0..4 {
            h.advance(HEARTBEAT_INTERVAL - MS);
            assert!(h.take_commands("w1").is_empty(), "{}", h.setup());
            h.advance(MS);
            assert_eq!(h.take_commands("w1"), ["HEARTBEAT"]);
            h.heartbeat("w1");
        }
    }
}

#[test]
fn kbye_stops_new_jobs_and_heartbeats() {
    for h in Harness::setups(|c| c.kbye_grace = Duration::from_secs(60)) {
        let mut h = holding(h, &[(10, "q")], 1);
        h.ready("w1", 2);
        h.kbye("w1");
        h.request("c1", "m9", "q", "late");
        h.ready("w1", 1);
        assert_eq!(h.waiting("q"), ["late"], "{}", h.setup());
        h.advance(Duration::from_secs(30));
        assert_eq!(h.take_commands("w1"), Vec::<String>::new(), "nothing after KBYE: {}", h.setup());
        assert_eq!(held(&h, "w1"), ["j0"], "in flight within the grace");
        let snap = h.snapshot(h.shard_of("w1"));
        assert_eq!(snap.workers[0].state, "draining");
    }
}

#[test]
fn the_last_heartbeat_goes_before_the_kbye_and_a_re_inform_brings_them_back() {
    for h in Harness::setups(|c| c.kbye_grace = Duration::from_secs(60)) {
        let mut h = holding(h, &[(10, "q")], 1);
        h.take_commands("w1");
        h.advance(HEARTBEAT_INTERVAL);
        assert_eq!(h.take_commands("w1"), ["HEARTBEAT"], "{}", h.setup());
        h.heartbeat("w1");
        h.advance(HEARTBEAT_INTERVAL - MS);
        h.kbye("w1");
        // The heartbeat due 1 ms later, and every one after, is not sent;
        // the job it holds is still completed by its REPLY.
        for _ in 0..5 {
            h.advance(HEARTBEAT_INTERVAL);
            assert_eq!(h.take_commands("w1"), Vec::<String>::new(), "{}", h.setup());
        }
        h.reply("w1", "m0");
        assert_eq!(h.counter(|c| &c.completed_jobs), 1);
        // The same identity registering again is heartbeated again.
        h.inform("w1", &[(10, "q")]);
        assert_eq!(h.take_commands("w1"), ["ACK", "HEARTBEAT"]);
        h.advance(HEARTBEAT_INTERVAL);
        assert_eq!(h.take_commands("w1"), ["HEARTBEAT"], "{}", h.setup());
    }
}

#[test]
fn kbye_of_an_empty_worker_forgets_it_one_timeout_later() {
    for mut h in Harness::setups(|_| {}) {
        h.inform("w1", &[(10, "q")]);
        h.advance(Duration::from_secs(2));
        h.kbye("w1");
        h.advance(HEARTBEAT_TIMEOUT - MS);
        assert!(h.key_of("w1").is_some(), "{}", h.setup());
        h.advance(MS);
        assert_eq!(h.key_of("w1"), None);
        assert_eq!(h.counter(|c| &c.expired_workers), 0, "a KBYE is not an expiry");
    }
}

#[test]
fn kbye_grace_keeps_jobs_that_complete_and_requeues_the_rest() {
    let grace = Duration::from_secs(60);
    for h in Harness::setups(|c| c.kbye_grace = grace) {
        let mut h = holding(h, &[(10, "q")], 2);
        h.kbye("w1");
        h.advance(Duration::from_secs(20));
        h.reply("w1", "m0");
        assert_eq!(h.counter(|c| &c.completed_jobs), 1, "a REPLY after KBYE completes");
        h.advance(grace - Duration::from_secs(20) - MS);
        assert_eq!(held(&h, "w1"), ["j1"], "{}", h.setup());
        h.advance(MS);
        assert_eq!((h.key_of("w1"), h.waiting("q")), (None, vec!["j1".to_string()]));
    }
}

#[test]
fn repeated_kbye_adds_no_timer() {
    for mut h in Harness::setups(|_| {}) {
        h.inform("w1", &[(10, "q")]);
        let home = h.shard_of("w1");
        h.kbye("w1");
        let armed = h.timers(home);
        for _ in 0..3 {
            h.kbye("w1");
        }
        assert_eq!(h.timers(home), armed, "{}", h.setup());
        h.kbye("nobody");
        assert_eq!(h.counter(|c| &c.unknown_worker_messages), 1);
    }
}

#[test]
fn requeue_keeps_the_order_of_each_queue() {
    for mut h in Harness::setups(|_| {}) {
        h.inform("w1", &[(10, "a"), (10, "b")]);
        h.ready("w1", 4);
        for (m, q) in [("a1", "a"), ("b1", "b"), ("a2", "a"), ("b2", "b")] {
            h.request("c1", m, q, m);
        }
        h.request("c1", "xa", "a", "xa");
        h.request("c1", "xb", "b", "xb");
        assert_eq!(held(&h, "w1"), ["a1", "b1", "a2", "b2"]);
        h.advance(HEARTBEAT_TIMEOUT);
        assert_eq!(h.waiting("a"), ["a1", "a2", "xa"], "{}", h.setup());
        assert_eq!(h.waiting("b"), ["b1", "b2", "xb"]);
    }
}

/// Removes worker `id` the `n`-th way: heartbeat expiry, unreachable,
/// pipe full, re-INFORM, KBYE grace over.
fn kill(h: &mut Harness, id: &str, n: u32) {
    match n % 5 {
        0 => h.advance(HEARTBEAT_TIMEOUT),
        1 | 2 => h.send_failed(id, "m", n % 5 == 1),
        3 => h.inform(id, &[(10, "other")]),
        _ => {
            h.kbye(id);
            h.advance(h.ctx.config.kbye_grace);
        }
    }
    assert!(h.key_of(id).is_none() || n % 5 == 3, "{id} removed");
}

#[test]
fn a_job_whose_workers_keep_dying_is_dead_lettered_after_max_deliveries() {
    for mut h in Harness::setups(|c| c.kbye_grace = Duration::from_secs(10)) {
        h.inform("w0", &[(10, "q")]);
        h.request("c1", "m", "q", "poison");
        for death in 0..=MAX_RETRIES {
            let id = format!("w{death}");
            h.inform(&id, &[(10, "q")]);
            h.ready(&id, 1);
            assert_eq!(h.take_bodies(&id), ["poison"], "{}", h.setup());
            kill(&mut h, &id, death);
            let back = if death < MAX_RETRIES { vec!["poison".to_string()] } else { vec![] };
            assert_eq!(h.waiting("q"), back, "after {} deaths", death + 1);
        }
        assert_eq!(h.counter(|c| &c.dead_lettered), 1);
        assert_eq!(h.counter(|c| &c.requeued_jobs), u64::from(MAX_RETRIES));
        assert_eq!(h.ctx.job_bytes.load(std::sync::atomic::Ordering::Relaxed), 0, "its bytes no longer count");
    }
}

#[test]
fn send_failed_removes_the_worker_and_a_stale_one_changes_nothing() {
    for unreachable in [true, false] {
        for h in Harness::setups(|_| {}) {
            let mut h = holding(h, &[(10, "q")], 1);
            let old = h.key_of("w1").expect("registered");
            h.send_failed("w1", "m0", unreachable);
            assert_eq!((h.key_of("w1"), h.waiting("q")), (None, vec!["j0".to_string()]), "{}", h.setup());
            h.inform("w1", &[(10, "q")]);
            let stale = ShardMsg::SendFailed { key: old, msgid: MsgId::from(&b"m0"[..]), unreachable };
            h.send(h.shard_of("w1"), stale);
            assert!(h.key_of("w1").is_some(), "the new registration stays");
        }
    }
}

#[test]
fn a_job_dispatched_to_a_worker_gone_meanwhile_is_requeued() {
    for mut h in Harness::setups(|_| {}) {
        h.inform("w1", &[(10, "q")]);
        let old = h.key_of("w1").expect("registered");
        h.send_failed("w1", "m", true);
        h.request("c1", "m1", "q", "x");
        let none: &[&[u8]] = &[];
        let frames = crate::job::JobFrames::new(b"m-late", b"q", b"", b"late", none).expect("small frames");
        let job = crate::job::Job::new(JobId(1), frames, crate::job::Origin::Emqp, false, h.now, h.now);
        let msg = ShardMsg::Dispatched { key: old, job };
        h.send(h.shard_of("w1"), msg);
        assert_eq!(h.waiting("q"), ["late", "x"], "{}", h.setup());
    }
}

/// Worker `a` dies holding two jobs, which go to worker `b`; `b` dies in
/// the same instant, maybe before its home shard recorded them (then each
/// comes back on its own). For every placement of `a`, `b` and the queue,
/// the two jobs end up waiting in their order.
#[test]
fn jobs_bounced_from_a_worker_that_died_meanwhile_keep_their_order() {
    for shards in [1, 2, 3] {
        let placements = (0..shards).flat_map(|x| (0..shards).flat_map(move |y| (0..shards).map(move |z| (x, y, z))));
        for (sa, sb, sq) in placements {
            let mut h = Harness::new(shards);
            let (a, b, q) = (h.name_on(sa, "a"), h.name_on(sb, "b"), h.name_on(sq, "q"));
            h.inform(&a, &[(10, &q)]);
            h.inform(&b, &[(0, &q)]);
            h.ready(&a, 2);
            h.request("c1", "m1", &q, "j1");
            h.request("c1", "m2", &q, "j2");
            h.ready(&b, 2);
            h.advance(HEARTBEAT_TIMEOUT);
            let at = format!("{shards} shards: a on {sa}, b on {sb}, q on {sq}");
            assert_eq!((h.key_of(&a), h.key_of(&b)), (None, None), "{at}");
            assert_eq!(h.waiting(&q), ["j1", "j2"], "{at}");
        }
    }
}

#[test]
fn past_max_workers_an_inform_is_refused_until_a_worker_leaves() {
    for mut h in Harness::setups(|c| c.max_workers = 2) {
        h.inform("w1", &[(10, "q")]);
        h.inform("w2", &[(10, "q")]);
        h.inform("w3", &[(10, "q")]);
        assert_eq!(h.take_commands("w3"), ["ERROR"], "{}", h.setup());
        assert_eq!(h.ctx.counters.rejected_worker_limit.load(std::sync::atomic::Ordering::Relaxed), 1);
        assert!(h.key_of("w3").is_none());
        // A re-INFORM replaces a registration: it is not a new worker.
        h.take_commands("w1");
        h.inform("w1", &[(5, "q")]);
        assert_eq!(h.take_commands("w1"), ["ACK", "HEARTBEAT"], "{}", h.setup());
        // Once both are expired there is room again.
        h.advance(HEARTBEAT_TIMEOUT + HEARTBEAT_INTERVAL);
        assert!(h.key_of("w1").is_none() && h.key_of("w2").is_none(), "{}", h.setup());
        h.inform("w3", &[(10, "q")]);
        assert_eq!(h.take_commands("w3"), ["ACK", "HEARTBEAT"], "{}", h.setup());
    }
}

#[test]
fn unready_takes_back_a_free_slot_or_says_none_is_free() {
    for mut h in Harness::setups(|_| {}) {
        h.inform("w1", &[(10, "a")]);
        h.take_to("w1");
        h.ready("w1", 2);
        h.unready("w1", "u1");
        let out = h.take_to("w1");
        let shapes: Vec<Vec<String>> = out.iter().map(shape).collect();
        assert_eq!(shapes, [vec!["", "eMQP/1.0", "ACK", "*", "u1"]], "{}", h.setup());
        assert_eq!(h.slots("w1"), 1);
        // The last slot goes to a job; the next UNREADY finds none free.
        h.request("c1", "m1", "a", "x");
        assert_eq!(h.take_bodies("w1"), ["x"]);
        h.unready("w1", "u2");
        let out = h.take_to("w1");
        let shapes: Vec<Vec<String>> = out.iter().map(|o| shape(o)[..6].to_vec()).collect();
        assert_eq!(shapes, [vec!["", "eMQP/1.0", "ERROR", "*", "u2", "NO_FREE_SLOT"]]);
        assert_eq!(h.slots("w1"), 0);
        assert_eq!((h.counter(|c| &c.slots_taken_back), h.counter(|c| &c.unready_no_free_slot)), (1, 1));
        // From a worker the router does not know: DISCONNECT, as for READY.
        h.unready("w9", "u3");
        assert_eq!(h.take_commands("w9"), ["DISCONNECT"]);
    }
}
