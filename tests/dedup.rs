//! The router's duplicate window (docs/failover.md "Duplicates") over real
//! sockets, `emq-router` as a process on fresh ports: a REQUEST sent again
//! with the same routing identity and msgid makes no second job and gets
//! the first acceptance again (counted `dedup_hits`), also across a
//! `kill -9` and a restart on the same data directory (`durability =
//! "sync"`), and across a take-over of a replicated log (NATS) by another
//! router of the same name; another identity with the same msgid makes a
//! job of its own.
//!
//! The acceptance REPLY carries no job id (EventMQ's REPLY is the
//! REQUEST's msgid only): "the same acceptance" is a REPLY naming the same
//! msgid, and "no second job" is checked by draining the queue over the
//! text protocol (one body, the first one's) and by `accepted_jobs`.

use std::time::Duration;

use crate::common::proc::TestDir;
use crate::common::watchdog::Watchdog;
use crate::durability::{drain, recv_within, Node};

/// A DEALER with routing identity `identity`, connected to `endpoint`.
fn dealer(ctx: &zmq::Context, endpoint: &str, identity: &str) -> zmq::Socket {
    let s = ctx.socket(zmq::DEALER).expect("socket");
    s.set_linger(0).expect("linger");
    s.set_identity(identity.as_bytes()).expect("identity");
    s.connect(endpoint).expect("connect");
    s
}

/// Sends REQUEST `msgid` for `queue` with `body` and returns the answer's
/// command and the msgid it refers to (frames 2 and 4).
fn request(s: &zmq::Socket, msgid: &str, queue: &str, body: &str) -> (String, String) {
    let frames: [&[u8]; 7] = [b"", b"eMQP/1.0", b"REQUEST", msgid.as_bytes(), queue.as_bytes(), b"", body.as_bytes()];
    s.send_multipart(frames, 0).expect("send");
    let f = recv_within(s, 10_000).unwrap_or_else(|| panic!("no answer to REQUEST {msgid}"));
    let text = |i: usize| f.get(i).map(|b| String::from_utf8_lossy(b).into_owned()).unwrap_or_default();
    (text(2), text(4))
}

fn counter(node: &Node, name: &str) -> u64 {
    let status = node.status();
    status["emq"]["counters"][name].as_u64().unwrap_or_else(|| panic!("no counter {name}: {status}"))
}

fn accepted(msgid: &str) -> (String, String) {
    ("REPLY".to_string(), msgid.to_string())
}

#[test]
fn dedup_a_request_sent_twice_makes_one_job_and_another_identity_its_own() {
    let _w = Watchdog::new("dedup_twice", 90);
    let dir = TestDir::new("dedup-twice");
    let node = Node::new(&dir);
    // Several shards and a queue nobody serves: the job goes to `default`
    // (perhaps on another shard) and the key stays with the named queue's
    // shard, where the copy arrives.
    let mut router = node.start(&["--shards", "4"]);
    let ctx = zmq::Context::new();
    let a = dealer(&ctx, &node.frontend(), "client-a");
    for (queue, drained) in [("nowhere", "default"), ("default", "default")] {
        let msgid = format!("m-{queue}");
        assert_eq!(request(&a, &msgid, queue, "first"), accepted(&msgid));
        assert_eq!(request(&a, &msgid, queue, "second"), accepted(&msgid), "the same acceptance again");
        assert_eq!(drain(&node.text(), drained), vec!["first".to_string()], "one job, the first");
    }
    assert_eq!(counter(&node, "dedup_hits"), 2);
    assert_eq!(counter(&node, "accepted_jobs"), 2);

    // Another identity, the same msgid: a job of its own.
    let b = dealer(&ctx, &node.frontend(), "client-b");
    assert_eq!(request(&b, "m-default", "default", "third"), accepted("m-default"));
    assert_eq!(drain(&node.text(), "default"), vec!["third".to_string()]);
    assert_eq!(counter(&node, "dedup_hits"), 2);
    assert_eq!(counter(&node, "accepted_jobs"), 3);
    router.terminate(Duration::from_secs(10));
}

#[test]
fn dedup_a_request_sent_again_after_kill_9_and_a_restart_makes_no_second_job() {
    let _w = Watchdog::new("dedup_restart", 120);
    let dir = TestDir::new("dedup-restart");
    let node = Node::new(&dir);
    let mut router = node.start(&[]);
    let ctx = zmq::Context::new();
    let a = dealer(&ctx, &node.frontend(), "client-a");
    // One job left waiting, one finished before the crash: neither key is
    // forgotten.
    assert_eq!(request(&a, "finished", "default", "f-first"), accepted("finished"));
    assert_eq!(drain(&node.text(), "default"), vec!["f-first".to_string()]);
    assert_eq!(request(&a, "waiting", "default", "w-first"), accepted("waiting"));
    drop(a);
    router.kill_group();

    for round in 0..2 {
        // Twice: the second start finds the keys the first one logged again.
        let mut router = node.start(&[]);
        let a = dealer(&ctx, &node.frontend(), "client-a");
        assert_eq!(request(&a, "waiting", "default", "w-again"), accepted("waiting"), "round {round}");
        assert_eq!(request(&a, "finished", "default", "f-again"), accepted("finished"), "round {round}");
        assert_eq!(counter(&node, "dedup_hits"), 2, "round {round}");
        assert_eq!(counter(&node, "accepted_jobs"), 0, "round {round}");
        drop(a);
        router.kill_group();
    }
    let mut router = node.start(&[]);
    // The waiting job is the first one's; another identity makes its own.
    let b = dealer(&ctx, &node.frontend(), "client-b");
    assert_eq!(request(&b, "waiting", "default", "b-job"), accepted("waiting"));
    assert_eq!(drain(&node.text(), "default"), vec!["w-first".to_string(), "b-job".to_string()]);
    assert_eq!(counter(&node, "dedup_hits"), 0);
    router.terminate(Duration::from_secs(10));
}

/// `durability = "replicated"` (a 3-node NATS cluster): the router is
/// killed with -9 and another router of the same name on other ports and
/// another data directory takes its log over (its machine lost); a
/// REQUEST re-sent to it for a job still waiting makes no job, and another
/// identity with the same msgid makes its own. (A job finished before the
/// crash is not checked: the replicated log purges its record with the
/// job, key and all, as docs/failover.md says.)
#[test]
fn dedup_replicated_a_take_over_by_another_router_of_the_name_keeps_the_keys() {
    let test = "dedup-takeover";
    let Some(s) = crate::replicated::setup(test, 150) else { return };
    let first = s.node("first");
    let mut router = s.start(&first, &[]);
    let ctx = zmq::Context::new();
    let a = dealer(&ctx, &first.frontend(), "client-a");
    assert_eq!(request(&a, "waiting", "default", "w-first"), accepted("waiting"));
    drop(a);
    router.kill_group();

    let second = s.node("second");
    let mut router = s.start(&second, &[]);
    let a = dealer(&ctx, &second.frontend(), "client-a");
    assert_eq!(request(&a, "waiting", "default", "w-again"), accepted("waiting"));
    assert_eq!(counter(&second, "dedup_hits"), 1);
    assert_eq!(counter(&second, "accepted_jobs"), 0);
    let b = dealer(&ctx, &second.frontend(), "client-b");
    assert_eq!(request(&b, "waiting", "default", "b-job"), accepted("waiting"));
    assert_eq!(drain(&second.text(), "default"), vec!["w-first".to_string(), "b-job".to_string()]);
    router.terminate(Duration::from_secs(10));
}
