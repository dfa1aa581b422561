//! Scale-out (issue 31, docs/scaleout.md): several owners (router names)
//! serve one workload.
//!
//! [`two_owners_serve_one_workload_and_a_killed_owner_loses_nothing`]: on
//! a real 3-node nats-server cluster, owner `soa` with a standby and owner
//! `sob`; producers over eMQP (the emq client library given both owners,
//! `a,a2;b`: it spreads REQUESTs round-robin) and text (`TextOwners`, one
//! SCHED per owner in turn); one `emq-worker -J 4` serving both owners (a
//! DEALER each, concurrency split). A job script appends `<body> <start
//! ns> <end ns>` per job. Checked:
//!
//! * phase 1 (no fault): both owners accepted and completed jobs; every
//!   acknowledged job ran exactly once; nothing ran that was never sent;
//!   the script never saw more than 4 jobs at once;
//! * phase 2: `kill -9` of owner `soa` under load, its standby takes over:
//!   every acknowledged job ran; a job ran twice only if its first run
//!   started within [`IN_FLIGHT_MARGIN`] before the kill (in flight at the
//!   dead owner);
//! * the worker's own count (its exit line): `peak_busy` at most 4 and
//!   `over_limit=0` (no router ever sent it more jobs than it had slots).
//!
//! [`a_workers_slots_move_to_the_owner_with_the_backlog`]: two plain
//! routers (memory durability: the rule is the worker's), one `emq-worker
//! -J 4` serving both. A backlog of slow jobs on one owner only: within
//! [`MOVE_BOUND`] of its first job, three of that owner's jobs run at
//! once (the fourth slot stays with the idle owner, so that work arriving
//! there is seen); then the same the other way round. The idle owner's
//! STATUS counts the slots taken back (`slots_taken_back`). Then one owner
//! is killed (`kill -9`): a backlog on the other runs 4 jobs at once
//! within [`MOVE_BOUND`] (the worker frees the dead owner's slots when
//! its connection drops, not after its 15 s silence timeout).
//!
//! Without a nats-server the first test says so in one line and skips.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use emq::client::emqp::{Client, Outcome};
use emq::client::text::TextClientOptions;
use emq::client::text_spread::TextOwners;

use crate::common::proc::{Child, TestDir};
use crate::common::router::{Router, RouterKind};
use crate::common::wait;
use crate::common::watchdog::Watchdog;
use crate::replicated_faults::load::Threads;
use crate::replicated_faults::{rig, start};

/// From the owner's `kill -9` to its standby listening (docs/failover.md):
/// the lease (10 s) + 2 s, and room for a loaded machine.
const TAKE_OVER_BOUND: Duration = Duration::from_secs(20);

/// A job run twice must have started its first run at most this before the
/// kill (in flight at the dead owner; its `Done` not yet durable).
const IN_FLIGHT_MARGIN: Duration = Duration::from_secs(5);

/// How long an eMQP producer's request waits for its acceptance: past a
/// take-over (its re-send goes to the owner's standby).
const REQUEST_WAIT: Duration = Duration::from_secs(30);

/// Between two jobs of one producer.
const PACE: Duration = Duration::from_millis(10);

/// Until every acknowledged job ran, after the producers stopped.
const DRAIN_BOUND: Duration = Duration::from_secs(40);

/// The stated worst time for a worker's slots to move to an owner with a
/// backlog (docs/scaleout.md "Slots": `slot_move_after` 1 s + a check
/// every 250 ms + two round trips), with room for a shared 2-core machine.
const MOVE_BOUND: Duration = Duration::from_millis(3000);

/// What became of a body sent: acknowledged or not.
type Book = Arc<Mutex<BTreeMap<String, bool>>>;

fn book(b: &Book) -> MutexGuard<'_, BTreeMap<String, bool>> {
    b.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sends `e<phase>-<t>-<n>` through a spreading `Client` of `addrs`, one at
/// a time, until `stop`.
fn emqp_producer(addrs: String, tag: String, sent: Book, stop: Arc<AtomicBool>) {
    let mut c = Client::connect(&addrs).expect("connect").with_timeout(REQUEST_WAIT);
    assert_eq!(c.owners(), 2, "{addrs}");
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        let body = format!("{tag}-{n}");
        n += 1;
        book(&sent).insert(body.clone(), false);
        let acked = matches!(c.request("default", "", body.as_bytes()), Ok(Outcome::Accepted { .. }));
        book(&sent).insert(body, acked);
        std::thread::sleep(PACE);
    }
}

/// Sends `t<phase>-<n>` with `TextOwners` over `owners` until `stop`.
fn text_producer(owners: Vec<Vec<String>>, tag: String, sent: Book, stop: Arc<AtomicBool>) {
    let mut c = TextOwners::new(owners, Duration::from_secs(5), &TextClientOptions::default()).expect("owners");
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        let body = format!("{tag}-{n}");
        n += 1;
        book(&sent).insert(body.clone(), false);
        let acked = c.sched(body.as_bytes(), Some("default")).is_ok();
        book(&sent).insert(body, acked);
        std::thread::sleep(PACE);
    }
}

/// The job script: sleeps `$NAP`, then appends `<body> <start ns> <end
/// ns>` to `$OUT` (one line, one write).
fn script(dir: &Path) -> PathBuf {
    let path = dir.join("job.sh");
    std::fs::write(
        &path,
        "#!/bin/sh\ns=$(date +%s%N)\np=$(cat)\nsleep \"${NAP:-0}\"\nprintf '%s %s %s\\n' \"$p\" \"$s\" \"$(date +%s%N)\" >> \"$OUT\"\n",
    )
    .expect("write job.sh");
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod job.sh");
    path
}

/// One execution read back: start and end, ns since the Unix epoch.
#[derive(Debug, Clone, Copy)]
struct Run {
    start: u128,
    end: u128,
}

/// Every execution in `out`, by body; lines not of the script apart.
fn runs(out: &Path) -> (BTreeMap<String, Vec<Run>>, Vec<String>) {
    let (mut m, mut junk) = (BTreeMap::<String, Vec<Run>>::new(), Vec::new());
    for line in std::fs::read_to_string(out).unwrap_or_default().lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let num = |i: usize| f.get(i).and_then(|s| s.parse::<u128>().ok());
        match (f.first(), num(1), num(2), f.len()) {
            (Some(body), Some(start), Some(end), 3) => m.entry(body.to_string()).or_default().push(Run { start, end }),
            _ => junk.push(line.to_string()),
        }
    }
    (m, junk)
}

/// The most runs of `runs` overlapping at any moment, and the first
/// moment (ns) at which `at_least` overlapped, if any.
fn overlap<'a>(runs: impl Iterator<Item = &'a Run>, at_least: usize) -> (usize, Option<u128>) {
    let mut edges: Vec<(u128, i32)> = runs.flat_map(|r| [(r.start, 1), (r.end, -1)]).collect();
    // Ends before starts at the same instant: back-to-back runs do not overlap.
    edges.sort();
    let (mut now, mut most, mut first) = (0i32, 0usize, None);
    for (t, d) in edges {
        now += d;
        let n = usize::try_from(now).unwrap_or(0);
        most = most.max(n);
        if n >= at_least && first.is_none() {
            first = Some(t);
        }
    }
    (most, first)
}

fn epoch_ns(t: SystemTime) -> u128 {
    t.duration_since(UNIX_EPOCH).expect("after the epoch").as_nanos()
}

/// `emq-worker -J 4 -Q default` over `backends`, running [`script`].
fn worker(dir: &TestDir, backends: &str, out: &Path, nap: &str, label: &str) -> Child {
    let job = script(&dir.path);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_emq-worker"));
    cmd.args(["-B", backends, "-Q", "default", "-J", "4", "--stats-interval", "0s", "--"])
        .arg(&job)
        .env("OUT", out)
        .env("NAP", nap);
    Child::spawn(label, &mut cmd, &dir.join(&format!("{label}.log")))
}

/// The worker's own counts from its exit line (`peak_busy=N
/// over_limit=N slots_moved=N`), after a clean stop.
fn worker_counts(w: &mut Child) -> BTreeMap<String, u64> {
    let status = w.terminate(Duration::from_secs(20));
    assert!(status.is_some_and(|s| s.success()), "the worker stops cleanly: {status:?}\n{}", w.log_tail(20));
    let log = w.log_text();
    let line =
        log.lines().rfind(|l| l.contains("emq-worker: jobs ok=")).unwrap_or_else(|| panic!("no exit line\n{log}"));
    line.split([' ', ';'])
        .filter_map(|kv| kv.split_once('='))
        .filter_map(|(k, v)| Some((k.to_string(), v.parse::<u64>().ok()?)))
        .collect()
}

/// `emq.counters.<name>` of a STATUS.
fn counter(status: &serde_json::Value, name: &str) -> u64 {
    status["emq"]["counters"][name].as_u64().unwrap_or(0)
}

/// Runs the producers of `tag` for `load`, then stops them.
fn load(emqp: &str, text: &[Vec<String>], tag: &str, sent: &Book, load: Duration) {
    let mut producers = Threads::default();
    for t in 0..2 {
        let (a, b, tag) = (emqp.to_string(), sent.clone(), format!("e{tag}-{t}"));
        producers.spawn(move |stop| emqp_producer(a, tag, b, stop));
    }
    let (o, b, tag) = (text.to_vec(), sent.clone(), format!("t{tag}"));
    producers.spawn(move |stop| text_producer(o, tag, b, stop));
    std::thread::sleep(load);
    producers.stop();
}

/// The bodies acknowledged so far.
fn acknowledged(sent: &Book) -> BTreeSet<String> {
    book(sent).iter().filter(|(_, ok)| **ok).map(|(b, _)| b.clone()).collect()
}

/// Waits up to [`DRAIN_BOUND`] until every job of `acked` ran, then
/// `settle` more for duplicates: whether all ran, the runs by body, and the
/// acknowledged never run. Every line of `out` must be the script's.
fn drain(acked: &BTreeSet<String>, out: &Path, settle: Duration) -> (bool, BTreeMap<String, Vec<Run>>, Vec<String>) {
    let drained = wait::until(DRAIN_BOUND, || {
        let r = runs(out).0;
        acked.iter().all(|b| r.contains_key(b))
    });
    std::thread::sleep(settle);
    let (r, junk) = runs(out);
    assert!(junk.is_empty(), "lines of runs.txt not of the script: {junk:?}");
    let lost = acked.iter().filter(|b| !r.contains_key(*b)).cloned().collect();
    (drained, r, lost)
}

#[test]
fn two_owners_serve_one_workload_and_a_killed_owner_loses_nothing() {
    let test = "scaleout_two_owners";
    let Some((s, a, mut owner_a, _ledger)) = start(test, 240, "soa", &[]) else { return };
    let a2 = a.elsewhere(&s.dir, "a2").with_flags(&["--standby"]);
    let mut standby = a2.spawn();
    let b = rig::Node::new(&s.dir, s.cluster.urls(), "sob", &[]).logging_to(&s.dir, "b");
    let mut owner_b = b.start();
    let waits =
        wait::until(Duration::from_secs(15), || standby.log_text().contains("standby: the router name is held"));
    assert!(waits, "the standby does not say it waits\n{}", standby.log_tail(30));

    let out = s.dir.join("runs.txt");
    let mut w = worker(&s.dir, &format!("{},{};{}", a.backend(), a2.backend(), b.backend()), &out, "0", "worker");
    let emqp = format!("{},{};{}", a.frontend(), a2.frontend(), b.frontend());
    let text = vec![vec![a.text(), a2.text()], vec![b.text()]];
    let sent: Book = Arc::default();

    // Phase 1: no fault.
    load(&emqp, &text, "1", &sent, Duration::from_secs(4));
    let acked = acknowledged(&sent);
    assert!(acked.len() >= 50, "too little load: {} acknowledged\n{}", acked.len(), w.log_tail(20));
    let (drained, r, lost) = drain(&acked, &out, Duration::from_secs(1));
    assert!(drained && lost.is_empty(), "phase 1: acknowledged, never run: {lost:?}\n{}", w.log_tail(30));
    let twice: Vec<(&String, usize)> = r.iter().filter(|(_, v)| v.len() > 1).map(|(b, v)| (b, v.len())).collect();
    assert!(twice.is_empty(), "phase 1, no fault: run more than once: {twice:?}");
    let never_sent: Vec<&String> = r.keys().filter(|b| !book(&sent).contains_key(*b)).collect();
    assert!(never_sent.is_empty(), "ran, never sent: {never_sent:?}");
    let (most, _) = overlap(r.values().flatten(), usize::MAX);
    assert!(most <= 4, "the script saw {most} jobs at once with concurrency 4");
    let (sa, sb) = (a.status().expect("STATUS of soa"), b.status().expect("STATUS of sob"));
    let per_owner: Vec<(u64, u64)> =
        [&sa, &sb].iter().map(|st| (counter(st, "accepted_jobs"), counter(st, "completed_jobs"))).collect();
    eprintln!(
        "{test}: phase 1: {} acknowledged ({} eMQP, {} text), {} runs; (accepted, completed) by owner {per_owner:?}",
        acked.len(),
        acked.iter().filter(|b| b.starts_with('e')).count(),
        acked.iter().filter(|b| b.starts_with('t')).count(),
        r.values().map(Vec::len).sum::<usize>()
    );
    for (name, (accepted, completed)) in ["soa", "sob"].iter().zip(&per_owner) {
        assert!(*accepted >= 10 && *completed >= 10, "{name} served too little: {per_owner:?}");
    }
    let total: u64 = per_owner.iter().map(|(a, _)| a).sum();
    assert_eq!(total, acked.len() as u64, "each acknowledged job accepted by exactly one owner: {per_owner:?}");

    // Phase 2: kill -9 of owner soa under load; its standby takes over.
    let mut producers = Threads::default();
    for t in 0..2 {
        let (e, bk, tag) = (emqp.clone(), sent.clone(), format!("e2-{t}"));
        producers.spawn(move |stop| emqp_producer(e, tag, bk, stop));
    }
    let (o, bk) = (text.clone(), sent.clone());
    producers.spawn(move |stop| text_producer(o, "t2".into(), bk, stop));
    std::thread::sleep(Duration::from_secs(2));
    let killed_wall = SystemTime::now();
    let killed = Instant::now();
    owner_a.kill_group();
    let up = a2.wait_listening(&mut standby, TAKE_OVER_BOUND);
    assert!(up, "the standby did not take over\n{}", standby.log_tail(40));
    eprintln!("{test}: the standby of soa listened {:?} after the kill -9", killed.elapsed());
    std::thread::sleep(Duration::from_secs(4));
    producers.stop();
    let acked = acknowledged(&sent);
    let (drained, r, lost) = drain(&acked, &out, Duration::from_secs(2));
    assert!(
        drained && lost.is_empty(),
        "acknowledged, never run ({}): {lost:?}\n{}\n{}",
        lost.len(),
        standby.log_tail(30),
        w.log_tail(30)
    );
    let kill_ns = epoch_ns(killed_wall);
    let mut in_flight = Vec::new();
    for (body, runs) in &r {
        if runs.len() > 1 {
            let first = runs.iter().map(|x| x.start).min().unwrap_or(0);
            let before = kill_ns.saturating_sub(first);
            assert!(
                runs.len() == 2
                    && first <= kill_ns + IN_FLIGHT_MARGIN.as_nanos()
                    && before <= IN_FLIGHT_MARGIN.as_nanos(),
                "{body} ran {} times, its first run {before} ns before the kill: not in flight at it",
                runs.len()
            );
            in_flight.push(body.clone());
        }
    }
    let (most, _) = overlap(r.values().flatten(), usize::MAX);
    assert!(most <= 4, "the script saw {most} jobs at once with concurrency 4");
    let counts = worker_counts(&mut w);
    eprintln!(
        "{test}: phase 2: {} acknowledged in all, run twice (in flight at the kill) {in_flight:?}; the worker: {counts:?}",
        acked.len()
    );
    assert!(counts.get("peak_busy").is_some_and(|n| (1..=4).contains(n)), "the worker's own count: {counts:?}");
    assert_eq!(counts.get("over_limit"), Some(&0), "a router sent more jobs than READYs: {counts:?}");
    for (c, name) in [(&mut standby, "standby"), (&mut owner_b, "sob")] {
        let st = c.terminate(Duration::from_secs(20));
        assert!(st.is_some_and(|x| x.success()), "{name}: a clean stop {st:?}\n{}", c.log_tail(20));
    }
}

/// Sends 24 jobs `<prefix>-<i>` to the router at `frontend` and waits until
/// they ran; the most of them that ran at once, and how long after the
/// first started `at_once` of them first ran together.
fn backlog(frontend: &str, prefix: &str, out: &Path, at_once: usize, w: &Child) -> (usize, Option<Duration>) {
    let mut c = Client::connect(frontend).expect("client");
    let bodies: Vec<String> = (0..24).map(|i| format!("{prefix}-{i}")).collect();
    for body in &bodies {
        let outcome = c.request("default", "", body.as_bytes()).expect("request");
        assert!(matches!(outcome, Outcome::Accepted { .. }), "{outcome:?}");
    }
    let done = wait::until(Duration::from_secs(40), || {
        let r = runs(out).0;
        bodies.iter().all(|b| r.contains_key(b))
    });
    assert!(done, "the backlog {prefix} on {frontend} did not drain\n{}", w.log_tail(30));
    let r = runs(out).0;
    let mine: Vec<&Run> = bodies.iter().filter_map(|b| r.get(b)).flatten().collect();
    let (most, together) = overlap(mine.iter().copied(), at_once);
    let first = mine.iter().map(|x| x.start).min().unwrap_or(0);
    let after = together.map(|t| Duration::from_nanos(u64::try_from(t.saturating_sub(first)).unwrap_or(u64::MAX)));
    (most, after)
}

/// Two plain routers (owners) in `memory` mode, each in its own directory:
/// `(a's directory, b's, a, b)`.
fn two_memory_owners(test: &str) -> (TestDir, TestDir, Router, Router) {
    let (da, db) = (TestDir::new(&format!("{test}-a")), TestDir::new(&format!("{test}-b")));
    let kind = RouterKind::Rust(crate::common::router::rust_router_bin());
    let flags = ["--durability", "memory"];
    let ra = Router::start_with(&da, kind.clone(), &flags);
    let rb = Router::start_with(&db, kind, &flags);
    (da, db, ra, rb)
}

#[test]
fn a_workers_slots_move_to_the_owner_with_the_backlog() {
    let test = "scaleout_slots";
    let _watchdog = Watchdog::new(test, 120);
    let (da, _db, mut ra, mut rb) = two_memory_owners(test);
    let out = da.join("runs.txt");
    let mut w = worker(&da, &format!("{};{}", ra.backend, rb.backend), &out, "0.4", "worker");
    let status = |r: &Router| {
        emq::client::admin::AdminClient::connect(&r.admin)
            .expect("admin")
            .with_timeout(Duration::from_secs(5))
            .status()
            .expect("STATUS")
    };
    let registered = wait::until(Duration::from_secs(15), || {
        [&ra, &rb].iter().all(|r| status(r)["emq"]["workers"].as_u64() == Some(1))
    });
    assert!(registered, "the worker did not register with both\n{}", w.log_tail(20));
    // Past slot_move_after: the slots have settled (2 and 2).
    std::thread::sleep(Duration::from_secs(2));

    for (phase, (busy, idle, name)) in [(&ra, &rb, "a"), (&rb, &ra, "b")].into_iter().enumerate() {
        let before = counter(&status(idle), "slots_taken_back");
        let (most, moved) = backlog(&busy.frontend, name, &out, 3, &w);
        let after = counter(&status(idle), "slots_taken_back");
        eprintln!(
            "{test}: backlog on {name}: at most {most} of its jobs at once, 3 at once {moved:?} after its first \
             started; slots taken back from the idle owner {}",
            after - before
        );
        assert_eq!(most, 3, "phase {phase}: {name}'s jobs at once (one slot stays with the idle owner)");
        assert!(moved.is_some_and(|m| m <= MOVE_BOUND), "phase {phase}: slots moved after {moved:?}");
        assert!(after > before, "phase {phase}: the idle owner counts no slot taken back");
    }
    // An owner dies: the slots it held are free at once (the worker sees
    // the connection drop), not after its 15 s silence timeout.
    ra.child.kill_group();
    std::thread::sleep(Duration::from_millis(500));
    let (most, moved) = backlog(&rb.frontend, "after-kill", &out, 4, &w);
    eprintln!(
        "{test}: owner a killed: at most {most} of b's jobs at once, 4 at once {moved:?} after its first started"
    );
    assert_eq!(most, 4, "after a's death b gets every slot\n{}", w.log_tail(20));
    assert!(moved.is_some_and(|m| m <= MOVE_BOUND), "slots freed by a's death reached b after {moved:?}");

    let (all, _) = runs(&out);
    let (most, _) = overlap(all.values().flatten(), usize::MAX);
    assert!(most <= 4, "the script saw {most} jobs at once with concurrency 4");
    let counts = worker_counts(&mut w);
    eprintln!("{test}: the worker: {counts:?}");
    assert_eq!(counts.get("over_limit"), Some(&0), "{counts:?}");
    assert!(counts.get("peak_busy").is_some_and(|n| *n <= 4), "{counts:?}");
    assert!(counts.get("slots_moved").is_some_and(|n| *n >= 2), "{counts:?}");
    for r in [&mut ra, &mut rb] {
        r.child.terminate(Duration::from_secs(20));
    }
}

/// The hint a worker logs when the two routers of its `-B` list are joined
/// with `,` (one owner and its standby) where `;` (two owners) was meant:
/// its one DEALER sends the INFORM to one router and READYs in turn to the
/// other, which answers DISCONNECT, again and again.
const COMMA_HINT: &str = "separate them with ';'";

#[test]
fn a_comma_where_a_semicolon_was_meant_is_hinted_in_the_workers_log() {
    let test = "scaleout_comma";
    let _watchdog = Watchdog::new(test, 60);
    let (dir, _db, mut ra, mut rb) = two_memory_owners(test);
    let out = dir.join("runs.txt");
    let mut w = worker(&dir, &format!("{},{}", ra.backend, rb.backend), &out, "0.1", "comma-worker");
    let hinted = wait::until(Duration::from_secs(20), || w.log_text().contains(COMMA_HINT));
    assert!(hinted, "no hint in the worker's log\n{}", w.log_tail(30));
    w.terminate(Duration::from_secs(20));
    // Written right, the same two routers give no hint.
    let mut w = worker(&dir, &format!("{};{}", ra.backend, rb.backend), &out, "0.1", "semicolon-worker");
    let registered =
        wait::until(Duration::from_secs(15), || w.log_text().matches("registered: announcing").count() >= 2);
    assert!(registered, "the worker did not register with both\n{}", w.log_tail(20));
    std::thread::sleep(Duration::from_secs(2));
    assert!(!w.log_text().contains(COMMA_HINT), "{}", w.log_tail(30));
    w.terminate(Duration::from_secs(20));
    for r in [&mut ra, &mut rb] {
        r.child.terminate(Duration::from_secs(20));
    }
}
