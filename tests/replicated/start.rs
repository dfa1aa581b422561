//! Faults of a router's start that these tests found (both fixed in
//! `src/jslog`): requests to buckets and streams just made failed the
//! start, a lease revision read back from a lagging replica, and a lease
//! not renewed while the start replayed and made streams for longer than
//! the lease.

use std::time::Duration;

use super::{log_count, setup, wal_shards, LEASE};
use crate::common::ports::is_listening;
use crate::common::proc::Child;
use crate::common::wait;
use crate::durability::{sched, Node};

/// Found by these tests, two faults of a router's start on a fresh
/// cluster: it made the key-value buckets of the lease and the layout and
/// read them at once, before the servers answered for them (`503 no
/// responders`), and the start failed (about one start in four right
/// after the cluster formed, on the development machine); and it read back
/// the revision of the lease it had just created, from a replica that
/// might not have it yet, so its first renewal could fail and the router
/// decide that "another router took this router's name" (every new job
/// refused, `STORE_FAILED`; once in about twenty starts). Here eight
/// routers start at once on a cluster just formed, each making buckets of
/// its own (`--nats-stream-prefix`): each must come up and store a task,
/// and still store one after its lease was renewed at least twice.
#[test]
fn replicated_routers_start_on_buckets_they_just_made_and_keep_their_names() {
    let test = "fresh";
    let Some(s) = setup(test, 120) else { return };
    let nodes: Vec<Node> = (0..8).map(|k| s.node(&format!("router-{k}"))).collect();
    let mut routers: Vec<Child> = nodes
        .iter()
        .enumerate()
        .map(|(k, node)| {
            let flags = s.flags(&["--nats-stream-prefix", &format!("P{k}")]);
            let mut cmd = node.command(&flags.iter().map(String::as_str).collect::<Vec<_>>());
            Child::spawn(&format!("router-{k}"), &mut cmd, &node.log)
        })
        .collect();
    for (node, router) in nodes.iter().zip(&mut routers) {
        let text = node.ports[3];
        let up = wait::until(Duration::from_secs(30), || !router.is_alive() || is_listening(text));
        assert!(up && router.is_alive(), "{} did not start\n{}", router.name, router.log_tail(10));
        sched(&node.text(), "q", 1);
    }
    // Renewed every third of the lease: a router that thinks its name was
    // taken refuses the task (`ERR STORE_FAILED` before the `NOPE`).
    std::thread::sleep(LEASE);
    for node in &nodes {
        sched(&node.text(), "q", 1);
        assert_eq!(log_count(node, "another router took this router's name"), 0);
    }
    for mut router in routers {
        let status = router.terminate(Duration::from_secs(10));
        assert!(status.is_some_and(|st| st.success()), "a clean stop: {status:?}\n{}", router.log_tail(20));
    }
}

/// Found by these tests: the lease was renewed only once the start was
/// over, so a start longer than the lease (a replay of a long stream, a
/// slow cluster making the streams: 2 s once here; with the default 10 s
/// lease, a large backlog) let the key expire: meanwhile another router
/// could take the name, and the first renewal could fail, the router then
/// refusing every new job (`STORE_FAILED`, "another router took this
/// router's name"). Here router A makes 64 streams at its start, about 5 s
/// with a lease of 1 s; router B, started with the same name 2 s into it,
/// is refused; A then starts and keeps its name.
#[test]
fn replicated_a_start_longer_than_the_lease_keeps_the_name() {
    let test = "long-start";
    let Some(s) = setup(test, 120) else { return };
    let flags = s.flags(&["--nats-lease", "1s", "--shards", "64"]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let a = s.node("router-a");
    let mut router = Child::spawn("router-a", &mut a.command(&flags), &a.log);
    let connected = wait::until(Duration::from_secs(10), || log_count(&a, "event: connected") > 0);
    assert!(connected, "router A did not connect\n{}", router.log_tail(10));
    // It takes the name at once: two leases on, it still holds it.
    std::thread::sleep(Duration::from_secs(2));
    assert!(router.is_alive() && !is_listening(a.ports[3]), "A's start is over already: the case is not tried");
    let (status, log) = s.node("router-b").run_to_exit(&flags, &s.dir);
    assert!(status.is_some_and(|st| !st.success()), "B must be refused: {status:?}\n{log}");
    assert!(log.contains("is held by a live emq-router"), "{log}");
    let up = wait::until(Duration::from_secs(60), || !router.is_alive() || is_listening(a.ports[3]));
    assert!(up && router.is_alive(), "router A did not start\n{}", router.log_tail(20));
    let opened = wal_shards(&a.status())[0]["recovery_ms"].as_u64().expect("recovery_ms");
    eprintln!("{test}: A's log opened in {opened} ms (lease 1 s); B was refused");
    // Past a lease and more: still its name, on every shard.
    std::thread::sleep(Duration::from_secs(2));
    for q in 0..64 {
        sched(&a.text(), &format!("q{q}"), 1);
    }
    let status = a.status();
    let holding = wal_shards(&status).iter().filter(|sh| sh["live_jobs"] != 0).count();
    assert!(holding >= 16, "the tasks reached many shards: {status}");
    assert_eq!(log_count(&a, "another router took this router's name"), 0);
}
