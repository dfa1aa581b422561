//! Faults of a router's start that these tests found (both fixed in
//! `src/jslog`): requests to buckets and streams just made failed the
//! start, a lease revision read back from a lagging replica, and a lease
//! not renewed while the start replayed and made streams for longer than
//! the lease. And a start that fails after taking the router name: it
//! frees the name at once.

use std::time::{Duration, Instant};

use async_nats::jetstream;
use async_nats::jetstream::context::DeleteStreamErrorKind;
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use async_nats::jetstream::ErrorCode;
use serde_json::json;

use super::{log_count, setup, wal_shards, Setup, LEASE};
use crate::common::nats;
use crate::common::ports::is_listening;
use crate::common::proc::Child;
use crate::common::wait;
use crate::durability::{drain, sched, Node};

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

/// A JetStream client of the test's cluster (every node's URL), on its
/// own current-thread runtime.
struct Js {
    rt: tokio::runtime::Runtime,
    js: jetstream::Context,
}

impl Js {
    fn connect(s: &Setup) -> Js {
        let rt = nats::runtime();
        let urls = s.cluster.urls();
        let js = rt.block_on(async {
            let client = async_nats::ConnectOptions::new()
                .connection_timeout(Duration::from_secs(2))
                .connect(&urls[..])
                .await
                .unwrap_or_else(|e| panic!("connect to {urls:?}: {e}"));
            jetstream::ContextBuilder::new().timeout(Duration::from_secs(2)).build(client)
        });
        Js { rt, js }
    }

    /// Asks the cluster again every poll for up to [`ASK_FOR`] while `ask`
    /// fails: a loaded machine lets requests time out or find no
    /// responders now and then (seen in a full run).
    fn asked<T, Fut: std::future::Future<Output = Result<T, String>>>(&self, ask: impl FnMut() -> Fut) -> T {
        self.rt.block_on(nats::until_ok_async(ASK_FOR, ask)).unwrap_or_else(|why| panic!("{why}"))
    }

    /// Deletes stream `name`, as by hand.
    fn delete_stream(&self, name: &str) {
        self.asked(|| async {
            match self.js.delete_stream(name).await {
                Ok(d) if d.success => Ok(()),
                Ok(_) => Err(format!("delete stream {name}: not done")),
                // Deleted by an earlier try whose answer was lost.
                Err(e) if matches!(e.kind(), DeleteStreamErrorKind::JetStream(j) if j.error_code() == ErrorCode::STREAM_NOT_FOUND) => {
                    Ok(())
                }
                Err(e) => Err(format!("delete stream {name}: {e}")),
            }
        });
    }

    /// Deletes key `key` of bucket `bucket`, as by hand.
    fn delete_key(&self, bucket: &str, key: &str) {
        self.asked(|| async {
            let kv = self.js.get_key_value(bucket).await.map_err(|e| format!("bucket {bucket}: {e}"))?;
            kv.delete(key).await.map_err(|e| format!("delete {key} of {bucket}: {e}"))
        });
    }

    /// The value of key `key` of bucket `bucket` as the bucket's stream
    /// leader has it (a replica may lag): `None` when it was deleted or
    /// expired or never written.
    fn key(&self, bucket: &str, key: &str) -> Option<String> {
        let stream = format!("KV_{bucket}");
        self.asked(|| async {
            let s = self.js.get_stream(&stream).await.map_err(|e| format!("stream {stream}: {e}"))?;
            match s.get_last_raw_message_by_subject(&format!("$KV.{bucket}.{key}")).await {
                // A delete marker (`KV-Operation: DEL`) or a purge.
                Ok(m) if m.headers.get("KV-Operation").is_some() => Ok(None),
                Ok(m) => Ok(Some(String::from_utf8_lossy(&m.payload).into_owned())),
                Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
                Err(e) => Err(format!("key {key} of {bucket}: {e}")),
            }
        })
    }
}

/// How long [`Js`] asks the cluster again.
const ASK_FOR: Duration = Duration::from_secs(15);

/// A start that fails after it took the router name frees the name at
/// once, as a clean stop does (the key deleted), instead of leaving it held
/// until its lease expires (fixed in `src/jslog`: the store that releases
/// the lease on drop holds the NATS thread from the start; before, it got
/// it only at the end of a start that succeeded, and a router started once
/// the fault was repaired waited up to the lease for the name). Here the
/// layout names a stream deleted by hand: the start takes the name, finds
/// the stream gone (not read again: no passing failure), exits non-zero
/// saying so, and the name's key in `EMQ_routers` is gone as it exits. The
/// layout key deleted too (the jobs given up), a router starts with the
/// name at once. The lease is 10 s, so a key left held would still be
/// there at every check.
#[test]
fn replicated_a_start_that_fails_after_taking_the_name_frees_it() {
    let test = "failed-start";
    let Some(s) = setup(test, 120) else { return };
    let lease = ["--nats-lease", "10s"];
    let node = s.node("router");
    let mut router = s.start(&node, &lease);
    sched(&node.text(), "q", 5);
    let status = router.terminate(Duration::from_secs(10));
    assert!(status.is_some_and(|st| st.success()), "a clean stop: {status:?}\n{}", router.log_tail(20));
    let js = Js::connect(&s);
    assert_eq!(js.key("EMQ_routers", &s.name), None, "a clean stop frees the name");
    let stream = s.stream(1, 0);
    js.delete_stream(&stream);

    let failed = s.node("failed");
    let flags = s.flags(&lease);
    let started = Instant::now();
    let (status, log) = failed.run_to_exit(&flags.iter().map(String::as_str).collect::<Vec<_>>(), &s.dir);
    let took = started.elapsed();
    let held = js.key("EMQ_routers", &s.name);
    eprintln!(
        "{test}: the start with a stream deleted exited after {took:?}: {status:?}; the name's key then: {held:?}"
    );
    assert!(status.is_some_and(|st| !st.success()), "the start must fail: {status:?}\n{log}");
    let said = format!("reading stream {stream}: ");
    assert!(log.contains(&said), "{said:?} in\n{log}");
    assert!(log.contains("(the layout names this stream: was it deleted by hand? its jobs are gone)"), "{log}");
    // A stream that is gone is not read again for nats_give_up (30 s).
    assert!(!log.contains("reading it again"), "{log}");
    assert!(took < Duration::from_secs(10), "failed after {took:?}");
    assert_eq!(held, None, "the failed start left the name held");

    // The jobs given up: with no layout, a router starts with the name at
    // once, on a new stream.
    js.delete_key("EMQ_layouts", &s.name);
    let again = s.node("again");
    let started = Instant::now();
    let router = s.start(&again, &lease);
    let took = started.elapsed();
    eprintln!("{test}: with the layout key deleted, a router with the name listened after {took:?}");
    assert_eq!(log_count(&again, "the router name is held"), 0, "{}", router.log_tail(20));
    // A key left held would have kept it waiting about 10 s.
    assert!(took < Duration::from_secs(5), "started after {took:?}");
    let status = again.status();
    assert_eq!(status["waiting_messages_by_queue"], json!({}), "{status}");
    sched(&again.text(), "q", 2);
    assert_eq!(drain(&again.text(), "q"), ["job-0000", "job-0001"]);
}
