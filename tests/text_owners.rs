//! The text protocol over several owners (issue 31, docs/scaleout.md): two
//! independent `emq-router` processes with different router names
//! (`memory` durability), the spreading client
//! (`emq::client::text_spread::TextOwners`), `emq-cli sched`/`ask` and
//! `emq-bench text` given both text addresses.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use emq::client::text::TextClientOptions;
use emq::client::text_spread::{OwnersError, TextOwners};
use serde_json::Value;

use crate::cli::bin;
use crate::common::admin;
use crate::common::ports::free_port;
use crate::common::proc::{self, TestDir};
use crate::common::router::{rust_router_bin, Router, RouterKind};
use crate::common::wait;
use crate::common::watchdog::Watchdog;

const TIMEOUT: Duration = Duration::from_secs(5);

/// One owner: a router process with its own name, directory and ports.
struct Owner {
    router: Router,
    text: String,
    _dir: TestDir,
}

fn owner(name: &str) -> Owner {
    owner_with(name, &[])
}

fn owner_with(name: &str, flags: &[&str]) -> Owner {
    let dir = TestDir::new(&format!("text-owners-{name}"));
    let mut extra = vec!["--durability", "memory", "--router-name", name];
    extra.extend_from_slice(flags);
    let mut router = Router::start_with(&dir, RouterKind::Rust(rust_router_bin()), &extra);
    let text = router.wait_text();
    Owner { router, text, _dir: dir }
}

fn status(o: &Owner) -> Value {
    admin::request(&o.router.admin, "STATUS").unwrap_or_else(|e| panic!("STATUS of {}: {e}", o.text))
}

/// Tasks waiting in `queue` on `o` (absent: none).
fn waiting(o: &Owner, queue: &str) -> u64 {
    status(o)["waiting_messages_by_queue"][queue].as_u64().unwrap_or(0)
}

fn text_acked(o: &Owner) -> u64 {
    let v = status(o);
    v["emq"]["counters"]["text_acked"].as_u64().unwrap_or_else(|| panic!("no text_acked in {v}"))
}

/// Waits (up to 5 s) until `f` gives `want`: STATUS counts what the
/// shards did, which a reply on the text connection does not wait for.
fn settles<T: PartialEq + std::fmt::Debug>(what: &str, want: T, mut f: impl FnMut() -> T) {
    let mut last = f();
    let ok = wait::until(Duration::from_secs(5), || {
        last = f();
        last == want
    });
    assert!(ok, "{what}: want {want:?}, got {last:?}");
}

fn client(owners: &[&str]) -> TextOwners {
    let list = owners.iter().map(|a| vec![a.to_string()]).collect();
    TextOwners::new(list, TIMEOUT, &TextClientOptions::default()).expect("owner list")
}

/// Asks every owner until a whole round says NOPE, ACKing each task;
/// returns data → owner index, asserting no task came twice.
fn drain(c: &mut TextOwners, queue: &str) -> BTreeMap<String, usize> {
    let mut got = BTreeMap::new();
    while let Some(offer) = c.ask(queue, Duration::from_millis(50)).expect("ask") {
        assert_eq!(c.ack().expect("ack"), offer.owner, "ACK goes to the owner of the offer");
        let data = String::from_utf8(offer.data).expect("utf-8");
        assert!(got.insert(data.clone(), offer.owner).is_none(), "{data} offered twice");
        assert!(got.len() <= 1000, "runaway");
    }
    c.sync().expect("no deferred errors");
    got
}

#[test]
fn sched_spreads_over_both_owners_and_ask_takes_each_task_once() {
    let _w = Watchdog::new("text_owners_spread", 60);
    let (a, b) = (owner("text-a"), owner("text-b"));
    let mut producer = client(&[&a.text, &b.text]);
    let mut placed = [0u64; 2];
    for i in 0..20 {
        let k = producer.sched(format!("job-{i}").as_bytes(), Some("q")).expect("stored");
        placed[k] += 1;
    }
    producer.end().expect("clean end");
    // Round-robin per SCHED over two owners that are up: 10 each.
    assert_eq!(placed, [10, 10]);
    settles("STATUS of each router", (10, 10), || (waiting(&a, "q"), waiting(&b, "q")));

    let mut consumer = client(&[&a.text, &b.text]);
    // One task, ACKed: it leaves its own owner only.
    let offer = consumer.ask("q", Duration::from_millis(50)).expect("ask").expect("a task");
    assert_eq!(consumer.ack().expect("ack"), offer.owner);
    consumer.sync().expect("no deferred errors");
    let (home, other) = if offer.owner == 0 { (&a, &b) } else { (&b, &a) };
    settles("the ACKed task left its owner", (9, 1), || (waiting(home, "q"), text_acked(home)));
    settles("the other owner untouched", (10, 0), || (waiting(other, "q"), text_acked(other)));

    let rest = drain(&mut consumer, "q");
    assert_eq!(rest.len(), 19);
    let mut all: Vec<String> = rest.keys().cloned().collect();
    all.push(String::from_utf8(offer.data).expect("utf-8"));
    all.sort();
    let mut want: Vec<String> = (0..20).map(|i| format!("job-{i}")).collect();
    want.sort();
    assert_eq!(all, want, "every task exactly once");
    consumer.end().expect("clean end");
    settles("both drained", (0, 0), || (waiting(&a, "q"), waiting(&b, "q")));
    settles("each ACK went to the task's own owner", (10, 10), || (text_acked(&a), text_acked(&b)));
}

#[test]
fn one_owner_down_sched_goes_to_the_other_and_ask_still_serves() {
    let _w = Watchdog::new("text_owners_down", 60);
    let (mut a, mut b) = (owner("text-a"), owner("text-b"));
    let mut producer = client(&[&a.text, &b.text]);
    let mut consumer = client(&[&a.text, &b.text]);
    // Both connections made and idle on each client.
    for i in 0..2 {
        producer.sched(format!("before-{i}").as_bytes(), Some("q")).expect("stored");
    }
    assert_eq!(drain(&mut consumer, "q").len(), 2);
    // The router of b dies: its connections are closed under both clients.
    b.router.child.kill_group();
    for i in 0..6 {
        match producer.sched(format!("after-{i}").as_bytes(), Some("q")) {
            Ok(k) => assert_eq!(k, 0, "SCHED {i} went to the owner that is up"),
            Err(e) => panic!("SCHED {i}: {e} (a closed idle connection is not an unknown outcome)"),
        }
    }
    settles("all six on a", 6, || waiting(&a, "q"));
    let got = drain(&mut consumer, "q");
    let want: Vec<String> = (0..6).map(|i| format!("after-{i}")).collect();
    assert_eq!(got.keys().cloned().collect::<Vec<_>>(), want);
    assert!(got.values().all(|&k| k == 0));
    // A SCHED that cannot be stored anywhere says so, with each owner's reason.
    a.router.child.kill_group();
    match producer.sched(b"nowhere", Some("q")) {
        Err(OwnersError::NotStored(why)) => assert_eq!(why.len(), 2, "{why:?}"),
        other => panic!("want NotStored, got {other:?}"),
    }
    drop(a);
}

#[test]
fn a_refused_sched_goes_to_the_next_owner() {
    let _w = Watchdog::new("text_owners_refused", 60);
    let (a, b) = (owner_with("text-a", &["--max-queue-len", "1"]), owner("text-b"));
    let mut producer = client(&[&a.text, &b.text]);
    let mut placed = [0u64; 2];
    for i in 0..5 {
        placed[producer.sched(format!("r-{i}").as_bytes(), Some("q")).expect("stored somewhere")] += 1;
    }
    // a takes one, then answers QUEUE_FULL (not stored): each of those goes to b.
    assert_eq!(placed, [1, 4]);
    settles("a full, the rest on b", (1, 4), || (waiting(&a, "q"), waiting(&b, "q")));
    producer.end().expect("clean end");
}

/// A text server that reads one line per connection and closes without
/// answering: a SCHED written whose answer is lost.
fn silent_owner() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("local addr").to_string();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let mut line = String::new();
            let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(&conn), &mut line);
        }
    });
    addr
}

#[test]
fn a_sched_whose_answer_is_lost_is_unknown_and_not_sent_elsewhere() {
    let _w = Watchdog::new("text_owners_unknown", 60);
    let (silent, b) = (silent_owner(), owner("text-b"));
    let mut producer = client(&[&silent, &b.text]);
    let (mut stored, mut unknown) = (0u64, 0u64);
    // Round-robin per SCHED: two start at the silent owner, two at b.
    for i in 0..4 {
        match producer.sched(format!("u-{i}").as_bytes(), Some("q")) {
            Ok(k) => {
                assert_eq!(k, 1);
                stored += 1;
            }
            Err(OwnersError::Unknown { owner, .. }) => {
                assert_eq!(owner, silent);
                unknown += 1;
            }
            Err(e) => panic!("SCHED {i}: {e}"),
        }
    }
    assert_eq!((stored, unknown), (2, 2));
    settles("only the SCHEDs b answered are on b", 2, || waiting(&b, "q"));
}

#[test]
fn emq_cli_sched_and_ask_over_two_owners() {
    let _w = Watchdog::new("text_owners_cli", 60);
    let (a, b) = (owner("text-a"), owner("text-b"));
    let both = format!("{};{}", a.text, b.text);
    for i in 0..4 {
        let out = bin("emq-cli").args(["--text", &both, "sched", &format!("cli-{i}"), "--queue", "c"]).output();
        let out = out.expect("emq-cli runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
        assert!(stdout.starts_with("accepted on queue c by 127.0.0.1:"), "{stdout}");
    }
    settles("four stored", 4, || waiting(&a, "c") + waiting(&b, "c"));
    let mut got = Vec::new();
    for _ in 0..5 {
        let out = bin("emq-cli").args(["--text", &both, "ask", "c"]).output().expect("emq-cli runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        got.push(String::from_utf8_lossy(&out.stdout).trim().to_string());
    }
    got.sort();
    assert_eq!(got, ["NOPE", "cli-0", "cli-1", "cli-2", "cli-3"]);
    settles("four ACKed", 4, || text_acked(&a) + text_acked(&b));
    // A long poll asks each owner with its wait in turn: NOPE after both.
    let started = Instant::now();
    let out = bin("emq-cli").args(["--text", &both, "ask", "c", "--wait", "300ms"]).output().expect("emq-cli runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "NOPE");
    assert!(started.elapsed() >= Duration::from_millis(600), "not both waits: {:?}", started.elapsed());
    // An owner that is down is skipped: the SCHED lands on the other.
    let dead = format!("127.0.0.1:{}", free_port());
    let out = bin("emq-cli").args(["--text", &format!("{dead};{}", a.text), "sched", "x", "--queue", "d"]).output();
    let out = out.expect("emq-cli runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), format!("accepted on queue d by {}", a.text));
    settles("x on a", 1, || waiting(&a, "d"));
}

#[test]
fn emq_bench_text_over_two_owners() {
    let _w = Watchdog::new("text_owners_bench", 120);
    let (a, b) = (owner("text-a"), owner("text-b"));
    let dir = TestDir::new("text-owners-bench");
    let both = format!("{};{}", a.text, b.text);
    let out_dir = dir.path.to_string_lossy().into_owned();
    #[rustfmt::skip]
    let args = [
        "text", "--addr", &both, "--target-name", "two", "--clients", "2", "--workers", "1",
        "--requests", "400", "--warmup", "0s", "--probe-timeout", "10s", "--drain-timeout", "20s",
        "--no-progress", "--out", &out_dir, "--name", "t",
    ];
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_emq-bench"));
    let (st, stdout, stderr) = proc::run("bench", cmd.args(args), &dir.path, Duration::from_secs(90));
    assert!(st.is_some_and(|s| s.success()), "emq-bench text: {st:?}\n{stdout}\n{stderr}");
    let json: Value = serde_json::from_slice(&std::fs::read(dir.join("t.json")).expect("t.json")).expect("json");
    let r = &json["results"][0];
    for (key, want) in [("sent", 400), ("received", 400), ("lost", 0), ("duplicates", 0), ("errors", 0)] {
        assert_eq!(r[key], want, "{key} in {r}");
    }
    // Producer i sends to owner i mod 2, each its half of --requests.
    settles("each owner served its half", (200, 200), || (text_acked(&a), text_acked(&b)));
    // Fewer producers than owners: refused before any load.
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_emq-bench"));
    let (st, _, stderr) = proc::run(
        "bench-one",
        cmd.args(["text", "--addr", &both, "--clients", "1", "--requests", "10", "--no-progress", "--out", &out_dir]),
        &dir.path,
        Duration::from_secs(30),
    );
    assert!(st.is_some_and(|s| !s.success()), "{stderr}");
    assert!(stderr.contains("2 owners need --clients of at least 2"), "{stderr}");
}
