//! Disk faults under load (issue 25), over real sockets with the crash
//! test's producers, consumers and rules ([`super::check`]): the data
//! directory on a tmpfs that fills up (with and without the free-space
//! alarm), on an ext4 that the kernel turns read-only and an operator
//! brings back, and deleted while the router runs.
//!
//! In each: fresh producers are refused at once with the fault's code
//! (`STORE_FULL`, `STORE_FAILED`: no silent drop, no hang), the router
//! stays up and admin answers, consumers drain the queues, and once the
//! cause is gone producers are accepted again without a restart; then a
//! `kill -9` and a restart deliver every acknowledged job.
//!
//! The mount tests need root (CI runs as root); elsewhere they say in one
//! line that they skip.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{check, dealer, lock, read_line, recv_within, text_conn, Node, Phase, Shared};
use crate::common::mounts::{root_or_skip, Mount};
use crate::common::ports::free_port;
use crate::common::proc::TestDir;
use crate::common::wait;
use crate::common::watchdog::Watchdog;

/// How long a fresh producer may wait for its answer.
const ANSWER: Duration = Duration::from_secs(5);

/// One REQUEST from a fresh client, recorded in the ledger like the load's:
/// `"REPLY"`, or the ERROR's code; `None` when nothing came within
/// [`ANSWER`].
fn probe_emqp(node: &Node, ledger: &Shared, next: &AtomicU64) -> Option<String> {
    let ctx = zmq::Context::new();
    let s = dealer(&ctx, &node.frontend())?;
    // Its own prefix: fresh jobs keep their order per producer, and a probe
    // races the load's producer ([`super::check`] orders by first letter).
    let body = format!("p-{:08}", next.fetch_add(1, Ordering::Relaxed));
    lock(ledger).sent.insert(body.clone());
    let frames: [&[u8]; 7] = [b"", b"eMQP/1.0", b"REQUEST", body.as_bytes(), b"default", b"", body.as_bytes()];
    s.send_multipart(frames, 0).ok()?;
    let f = recv_within(&s, ANSWER.as_millis() as i64)?;
    let mut l = lock(ledger);
    match f.get(2).map(Vec::as_slice) {
        Some(b"REPLY") => {
            l.acked.insert(body);
            Some("REPLY".into())
        }
        Some(b"ERROR") => {
            let code = String::from_utf8_lossy(&f[5]).into_owned();
            *l.codes.entry(code.clone()).or_default() += 1;
            l.refused.insert(body);
            Some(code)
        }
        _ => None,
    }
}

/// One SCHED from a fresh text connection (then `ASK probe`): `"OK"`, or
/// the `ERR` code; `None` when nothing came within [`ANSWER`].
fn probe_text(node: &Node, ledger: &Shared, next: &AtomicU64) -> Option<String> {
    let (mut w, mut r) = text_conn(&node.text())?;
    let body = format!("s-{:08}", next.fetch_add(1, Ordering::Relaxed));
    lock(ledger).sent.insert(body.clone());
    w.write_all(format!("SCHED {body}@tq\nASK probe\n").as_bytes()).ok()?;
    let give_up = Arc::new(AtomicBool::new(false));
    let timer = {
        let give_up = give_up.clone();
        std::thread::spawn(move || {
            std::thread::sleep(ANSWER);
            give_up.store(true, Ordering::Relaxed);
        })
    };
    let first = read_line(&mut r, &give_up)?;
    drop(timer);
    let mut l = lock(ledger);
    if first == "NOPE" {
        l.acked.insert(body);
        return Some("OK".into());
    }
    let code = first.strip_prefix("ERR ")?.split(' ').next()?.to_string();
    *l.codes.entry(code.clone()).or_default() += 1;
    l.refused.insert(body);
    Some(code)
}

/// Probes both protocols until both answer `want` (eMQP `REPLY`/code, text
/// `OK`/code) or `within` passes; the last answers.
fn until_probes(
    node: &Node,
    ledger: &Shared,
    counters: &[Arc<AtomicU64>; 2],
    want: (&str, &str),
    within: Duration,
) -> (Option<String>, Option<String>) {
    let mut last = (None, None);
    wait::until(within, || {
        last = (probe_emqp(node, ledger, &counters[0]), probe_text(node, ledger, &counters[1]));
        last.0.as_deref() == Some(want.0) && last.1.as_deref() == Some(want.1)
    });
    last
}

/// Writes a file in `dir` until the file system is full (or `leave` bytes
/// are left free); its path.
fn fill(dir: &Path, leave: u64) -> PathBuf {
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).expect("filler");
    let chunk = vec![0x5au8; 64 << 10];
    loop {
        let free = emq::wal::dir::free_bytes(dir).expect("statvfs");
        if free <= leave + chunk.len() as u64 {
            if leave == 0 {
                let _ = f.write_all(&chunk[..free as usize % chunk.len()]);
            }
            let _ = f.flush();
            return path;
        }
        if f.write_all(&chunk).is_err() {
            return path;
        }
    }
}

/// The shards' log states in STATUS (`ok`, `disk_alarm`, `full`, …).
fn states(node: &Node) -> Vec<String> {
    let s = node.status();
    s["emq"]["wal"]["shards"]
        .as_array()
        .map(|a| a.iter().map(|sh| sh["state"].as_str().unwrap_or("?").to_string()).collect())
        .unwrap_or_default()
}

/// The repairs the shards' logs made so far.
fn repairs(node: &Node) -> u64 {
    let s = node.status();
    s["emq"]["wal"]["shards"].as_array().map_or(0, |a| a.iter().map(|sh| sh["repairs"].as_u64().unwrap_or(0)).sum())
}

/// Whether nothing waits in the consumers' queues.
fn drained(node: &Node) -> bool {
    node.status()["waiting_messages_by_queue"]
        .as_object()
        .is_some_and(|m| !m.contains_key("default") && !m.contains_key("tq"))
}

/// A `kill -9` of `router`, then a restart that must deliver every
/// acknowledged job; checks the ledger.
fn kill_restart_check(
    node: &Node,
    mut router: crate::common::proc::Child,
    load: Phase,
    flags: &[&str],
    ledger: &Shared,
    counters: &[Arc<AtomicU64>; 2],
) {
    router.kill_group();
    load.stop();
    let _router = node.start(flags);
    let drain = Phase::start(node, 1, false, ledger, counters);
    let done = wait::until(Duration::from_secs(60), || {
        let l = lock(ledger);
        let got: std::collections::BTreeSet<&String> = l.delivered.iter().map(|d| &d.2).collect();
        l.acked.iter().all(|b| got.contains(b))
    });
    drain.stop();
    let l = lock(ledger);
    eprintln!("end: {} codes {:?}", l.counts(), l.codes);
    check(&l);
    assert!(done, "every acknowledged job delivered after the restart");
}

/// The load of the crash test on `node`: both protocols' producers and
/// consumers.
fn load(node: &Node, ledger: &Shared, counters: &[Arc<AtomicU64>; 2]) -> Phase {
    let phase = Phase::start(node, 0, true, ledger, counters);
    let started = wait::until(Duration::from_secs(10), || lock(ledger).acked.len() > 50);
    assert!(started, "the load runs: {}", lock(ledger).counts());
    phase
}

#[test]
fn a_full_tmpfs_data_directory_refuses_producers_keeps_serving_and_resumes() {
    if !root_or_skip("a_full_tmpfs_data_directory") {
        return;
    }
    let _w = Watchdog::new("disk_full", 150);
    let dir = TestDir::new("disk-full");
    let mnt = Mount::tmpfs(&dir.join("mnt"), 32 << 20);
    let node = Node::with_data(&dir, mnt.path.join("data"));
    let flags = ["--disk-free-limit", "0"];
    let router = node.start(&flags);
    let (ledger, counters): (Shared, _) = (Arc::default(), [Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0))]);
    let phase = load(&node, &ledger, &counters);
    let filler = fill(&mnt.path, 0);
    // Fresh producers get the code at once; the router stays up.
    let got = until_probes(&node, &ledger, &counters, ("STORE_FULL", "STORE_FULL"), Duration::from_secs(15));
    assert_eq!(got, (Some("STORE_FULL".into()), Some("STORE_FULL".into())), "{}", lock(&ledger).counts());
    assert!(states(&node).iter().any(|s| s == "full"), "STATUS says why: {:?}", states(&node));
    // Consumers are served from memory: the queues drain.
    assert!(wait::until(Duration::from_secs(20), || drained(&node)), "drained while full: {}", node.status());
    // Space freed: accepted again, no restart.
    std::fs::remove_file(&filler).expect("free the space");
    let got = until_probes(&node, &ledger, &counters, ("REPLY", "OK"), Duration::from_secs(15));
    assert_eq!(got, (Some("REPLY".into()), Some("OK".into())), "accepted again once space is free");
    let more = lock(&ledger).acked.len();
    assert!(wait::until(Duration::from_secs(10), || lock(&ledger).acked.len() > more + 50), "the load resumes");
    kill_restart_check(&node, router, phase, &flags, &ledger, &counters);
    drop(mnt);
}

#[test]
fn free_space_below_disk_free_limit_refuses_producers_before_writes_fail() {
    if !root_or_skip("free_space_below_disk_free_limit") {
        return;
    }
    let _w = Watchdog::new("disk_alarm", 150);
    let dir = TestDir::new("disk-alarm");
    let mnt = Mount::tmpfs(&dir.join("mnt"), 32 << 20);
    let node = Node::with_data(&dir, mnt.path.join("data"));
    let flags = ["--disk-free-limit", &(8u64 << 20).to_string()];
    let router = node.start(&flags);
    let (ledger, counters): (Shared, _) = (Arc::default(), [Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0))]);
    let phase = load(&node, &ledger, &counters);
    let filler = fill(&mnt.path, 4 << 20);
    // The running producers themselves are refused: nothing waits for a
    // write that cannot happen.
    let refused = |l: &Shared| lock(l).codes.get("STORE_FULL").copied().unwrap_or(0);
    assert!(
        wait::until(Duration::from_secs(10), || refused(&ledger) > 20),
        "the load is refused: {:?}",
        lock(&ledger).codes
    );
    let got = until_probes(&node, &ledger, &counters, ("STORE_FULL", "STORE_FULL"), Duration::from_secs(5));
    assert_eq!(got, (Some("STORE_FULL".into()), Some("STORE_FULL".into())));
    assert!(states(&node).iter().all(|s| s == "disk_alarm"), "{:?}", states(&node));
    assert!(wait::until(Duration::from_secs(20), || drained(&node)), "drained under the alarm: {}", node.status());
    assert_eq!(node.status()["emq"]["wal"]["shards"][0]["errors"]["full"], 0, "no write failed");
    std::fs::remove_file(&filler).expect("free the space");
    let got = until_probes(&node, &ledger, &counters, ("REPLY", "OK"), Duration::from_secs(10));
    assert_eq!(got, (Some("REPLY".into()), Some("OK".into())), "accepted again above the limit");
    kill_restart_check(&node, router, phase, &flags, &ledger, &counters);
    drop(mnt);
}

/// New-user finding 1: a router started on a file system with less free
/// space than `disk_free_limit` (here the default 256 MiB, on an 8 MiB
/// tmpfs) refuses from its very first job (the log reads free space when
/// it opens, not a second later), and says once at start that the whole
/// file system is smaller than the limit and which setting to lower. With
/// the limit lowered it accepts.
#[test]
fn a_router_started_below_disk_free_limit_refuses_its_first_job_and_says_why() {
    if !root_or_skip("a_router_started_below_disk_free_limit") {
        return;
    }
    let _w = Watchdog::new("started_below_limit", 90);
    let dir = TestDir::new("started-below-limit");
    let mnt = Mount::tmpfs(&dir.join("mnt"), 8 << 20);
    let node = Node::with_data(&dir, mnt.path.join("data"));
    let (ledger, counters): (Shared, _) = (Arc::default(), [Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0))]);
    let mut router = node.start(&["--shards", "2"]);
    // The first job of each protocol, sent as soon as the ports listen.
    assert_eq!(probe_emqp(&node, &ledger, &counters[0]).as_deref(), Some("STORE_FULL"), "{}", router.log_tail(20));
    assert_eq!(probe_text(&node, &ledger, &counters[1]).as_deref(), Some("STORE_FULL"), "{}", router.log_tail(20));
    assert_eq!(states(&node), ["disk_alarm", "disk_alarm"]);
    assert!(lock(&ledger).acked.is_empty(), "nothing accepted");
    let log = std::fs::read_to_string(&node.log).expect("router log");
    let count = |text: &str| log.matches(text).count();
    assert_eq!(count("less than disk_free_limit (268435456 bytes)"), 1, "one warning at start:\n{log}");
    assert_eq!(count("Lower disk_free_limit (--disk-free-limit, EMQ_DISK_FREE_LIMIT"), 1, "{log}");
    assert_eq!(
        count("free disk space below disk_free_limit: new jobs are refused (STORE_FULL)"),
        2,
        "each shard's alarm, from the start:\n{log}"
    );
    // The advice works: with the limit lowered the same disk takes jobs.
    router.kill_group();
    router = node.start(&["--shards", "2", "--disk-free-limit", "1048576"]);
    assert_eq!(probe_emqp(&node, &ledger, &counters[0]).as_deref(), Some("REPLY"), "{}", router.log_tail(20));
    assert_eq!(probe_text(&node, &ledger, &counters[1]).as_deref(), Some("OK"), "{}", router.log_tail(20));
    assert_eq!(states(&node), ["ok", "ok"]);
    let log = std::fs::read_to_string(&node.log).expect("router log");
    assert_eq!(log.matches("less than disk_free_limit").count(), 1, "no warning with the lower limit:\n{log}");
    router.kill_group();
    drop(mnt);
}

#[test]
fn a_data_directory_turned_read_only_and_brought_back_loses_nothing() {
    if !root_or_skip("a_data_directory_turned_read_only") {
        return;
    }
    let _w = Watchdog::new("disk_read_only", 150);
    let dir = TestDir::new("disk-ro");
    let mut mnt = Mount::ext4(&dir.join("mnt"), &dir.join("ext4.img"), 96 << 20);
    let node = Node::with_data(&dir, mnt.path.join("data"));
    let flags = ["--disk-free-limit", "0"];
    let router = node.start(&flags);
    let (ledger, counters): (Shared, _) = (Arc::default(), [Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0))]);
    let phase = load(&node, &ledger, &counters);
    mnt.trigger_error();
    let got = until_probes(&node, &ledger, &counters, ("STORE_FAILED", "STORE_FAILED"), Duration::from_secs(15));
    assert_eq!(got, (Some("STORE_FAILED".into()), Some("STORE_FAILED".into())), "{}", lock(&ledger).counts());
    // The kernel's error may fail the write or sync under way with EIO
    // before the remount makes the next one fail with EROFS: the first
    // cause names the fault (io or read_only), and the log's next tries
    // meet the read-only file system and count it.
    let named = states(&node);
    assert!(named.iter().any(|s| s == "read_only" || s == "io"), "{named:?}");
    let read_only_counted = || {
        let s = node.status();
        let shards = s["emq"]["wal"]["shards"].as_array().cloned().unwrap_or_default();
        shards.iter().any(|sh| sh["errors"]["read_only"].as_u64().unwrap_or(0) > 0)
    };
    assert!(wait::until(Duration::from_secs(15), read_only_counted), "EROFS counted: {}", node.status());
    assert!(wait::until(Duration::from_secs(20), || drained(&node)), "drained while read-only: {}", node.status());
    // The operator's way back: unmount (the router has let go of its
    // files), check, mount again.
    assert!(mnt.check_and_remount(Duration::from_secs(10)), "the router let go of the file system");
    let got = until_probes(&node, &ledger, &counters, ("REPLY", "OK"), Duration::from_secs(20));
    assert_eq!(got, (Some("REPLY".into()), Some("OK".into())), "accepted again once the disk is back");
    assert!(repairs(&node) >= 1);
    let more = lock(&ledger).acked.len();
    assert!(wait::until(Duration::from_secs(10), || lock(&ledger).acked.len() > more + 50), "the load resumes");
    kill_restart_check(&node, router, phase, &flags, &ledger, &counters);
    drop(mnt);
}

/// The data directory deleted under load: the router finds it at its next
/// sync, refuses nothing it can store again, rebuilds the log from memory
/// in a directory made again, and keeps every acknowledged job; a second
/// router is refused the path throughout.
fn deleted_under_load(name: &str, flags: &[&str]) {
    let _w = Watchdog::new(name, 150);
    let dir = TestDir::new(name);
    let node = Node::new(&dir);
    let router = node.start(flags);
    let (ledger, counters): (Shared, _) = (Arc::default(), [Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0))]);
    let phase = load(&node, &ledger, &counters);
    let other = Node {
        ports: [free_port(), free_port(), free_port(), free_port()],
        data: node.data.clone(),
        log: dir.join("other.log"),
        metrics: None,
    };
    std::fs::remove_dir_all(&node.data).expect("delete the data directory");
    let (status, log) = other.run_to_exit(flags, &dir);
    assert!(status.is_some_and(|s| !s.success()), "a second router is refused: {status:?}\n{log}");
    assert!(log.contains("is in use by another emq-router"), "{log}");
    assert!(wait::until(Duration::from_secs(15), || repairs(&node) >= 1), "rebuilt: {}", node.status());
    assert!(node.data.join("wal").is_dir(), "the directory is made again");
    let more = lock(&ledger).acked.len();
    assert!(wait::until(Duration::from_secs(10), || lock(&ledger).acked.len() > more + 50), "the load goes on");
    let (status, _) = other.run_to_exit(flags, &dir);
    assert!(status.is_some_and(|s| !s.success()), "still refused after the rebuild");
    kill_restart_check(&node, router, phase, flags, &ledger, &counters);
}

#[test]
fn the_data_directory_deleted_under_load_loses_no_acknowledged_job() {
    deleted_under_load("deleted-dir", &[]);
}

#[test]
fn the_data_directory_deleted_under_load_async_two_shards() {
    deleted_under_load("deleted-dir-async", &super::ASYNC_TWO_SHARDS);
}

/// SCHEDs numbered 2 KB tasks to `fill` on one connection, each followed
/// by `ASK probe`, until one is refused or unanswered (the log hit the full
/// disk: its batch waits for space); the bodies acknowledged.
fn fill_with_jobs(node: &Node, round: &str) -> Vec<String> {
    let (mut w, mut r) = text_conn(&node.text()).expect("text connection");
    let pad = "x".repeat(2000);
    let mut acked = Vec::new();
    for i in 0..100_000 {
        let body = format!("{round}-{i:06}-{pad}");
        w.write_all(format!("SCHED {body}@fill\nASK probe\n").as_bytes()).expect("write");
        let give_up = Arc::new(AtomicBool::new(false));
        let timer = {
            let give_up = give_up.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_secs(3));
                give_up.store(true, Ordering::Relaxed);
            })
        };
        let answer = read_line(&mut r, &give_up);
        drop(timer);
        match answer.as_deref() {
            Some("NOPE") => acked.push(body),
            Some(other) => {
                assert!(other.starts_with("ERR STORE_FULL"), "refused as full: {other}");
                return acked;
            }
            None => return acked,
        }
    }
    panic!("the 8 MiB file system never filled up");
}

/// Takes every task waiting in `fill` (ASK + ACK until NOPE); their bodies.
fn take_all(node: &Node) -> BTreeSet<String> {
    let (mut w, mut r) = text_conn(&node.text()).expect("text connection");
    let mut got = BTreeSet::new();
    let stop = AtomicBool::new(false);
    loop {
        w.write_all(b"ASK fill\n").expect("write");
        match read_line(&mut r, &stop) {
            Some(l) if l.starts_with("WANT? ") => {
                got.insert(l["WANT? ".len()..].to_string());
                w.write_all(b"ACK\n").expect("write");
            }
            Some(l) if l == "NOPE" => return got,
            other => panic!("take_all got {other:?}"),
        }
    }
}

/// Black-box finding 2 (HIGH): a log that fills its disk (the disk holds
/// nothing else) frees space as consumers finish jobs, with no `Done`
/// record written, and accepts again without a restart; a router killed
/// with its disk full starts on it in the `Full` fault (producers refused
/// with STORE_FULL, consumers and admin served), not exits, and the same
/// happens. Every acknowledged job is delivered.
#[test]
fn a_log_that_fills_its_disk_frees_it_as_jobs_finish_and_starts_on_it_full() {
    if !root_or_skip("a_log_that_fills_its_disk") {
        return;
    }
    let _w = Watchdog::new("log_fills_disk", 150);
    let dir = TestDir::new("log-fills-disk");
    let mnt = Mount::tmpfs(&dir.join("mnt"), 8 << 20);
    let node = Node::with_data(&dir, mnt.path.join("data"));
    let flags = ["--disk-free-limit", "0", "--wal-segment-bytes", "262144", "--shards", "1"];
    let (ledger, counters): (Shared, _) = (Arc::default(), [Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0))]);
    let mut router = node.start(&flags);
    for round in ["a", "b"] {
        let acked = fill_with_jobs(&node, round);
        assert!(acked.len() > 1000, "round {round}: {} jobs acknowledged before the disk filled", acked.len());
        let got = until_probes(&node, &ledger, &counters, ("STORE_FULL", "STORE_FULL"), Duration::from_secs(10));
        assert_eq!(got, (Some("STORE_FULL".into()), Some("STORE_FULL".into())), "round {round}");
        assert_eq!(states(&node), vec!["full".to_string()], "round {round}");
        if round == "b" {
            // Killed on the full disk; it must start on it.
            router.kill_group();
            router = node.start(&flags);
            assert_eq!(states(&node), vec!["full".to_string()], "started in the Full fault");
            let got = until_probes(&node, &ledger, &counters, ("STORE_FULL", "STORE_FULL"), Duration::from_secs(5));
            assert_eq!(got, (Some("STORE_FULL".into()), Some("STORE_FULL".into())), "refused after the restart");
        }
        // Consumers are served while full; as the jobs finish, the
        // segments they filled are deleted and the log takes writes again.
        let got = take_all(&node);
        let lost: Vec<&String> = acked.iter().filter(|b| !got.contains(*b)).collect();
        assert!(lost.is_empty(), "round {round}: {} acknowledged jobs not delivered", lost.len());
        assert!(got.iter().all(|b| b.starts_with(&format!("{round}-"))), "round {round}: only this round's jobs");
        let got = until_probes(&node, &ledger, &counters, ("REPLY", "OK"), Duration::from_secs(30));
        assert_eq!(got, (Some("REPLY".into()), Some("OK".into())), "round {round}: accepted again, no restart");
        assert_eq!(states(&node), vec!["ok".to_string()], "round {round}");
        let log_bytes = node.status()["emq"]["wal"]["shards"][0]["log_bytes"].as_u64().expect("log_bytes");
        assert!(log_bytes < 1 << 20, "round {round}: the log gave its space back: {log_bytes} bytes");
    }
    router.kill_group();
    drop(mnt);
}

/// Black-box finding 4: the data directory is a mount point and its file
/// system is unmounted under the router. The log must not be made again
/// on the file system beneath (the root one), where it would vanish when
/// the volume is mounted back: the directory's device differs from the
/// one at start, so producers are refused (STORE_FAILED, state `gone`)
/// and nothing is written there; consumers are still served.
#[test]
fn an_unmounted_data_directory_is_refused_not_made_again_beneath() {
    if !root_or_skip("an_unmounted_data_directory") {
        return;
    }
    let _w = Watchdog::new("unmounted", 120);
    let dir = TestDir::new("unmounted");
    let mnt = Mount::tmpfs(&dir.join("mnt"), 32 << 20);
    let node = Node::with_data(&dir, mnt.path.clone());
    let flags = ["--disk-free-limit", "0", "--shards", "1"];
    let mut router = node.start(&flags);
    super::sched(&node.text(), "kept", 20);
    let (ledger, counters): (Shared, _) = (Arc::default(), [Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0))]);
    let out = std::process::Command::new("umount").arg("-l").arg(&mnt.path).output().expect("umount");
    assert!(out.status.success(), "umount -l: {}", String::from_utf8_lossy(&out.stderr));
    let got = until_probes(&node, &ledger, &counters, ("STORE_FAILED", "STORE_FAILED"), Duration::from_secs(15));
    assert_eq!(got, (Some("STORE_FAILED".into()), Some("STORE_FAILED".into())));
    assert_eq!(states(&node), vec!["gone".to_string()]);
    // Its repairs find the other file system and stop there.
    let said = wait::until(Duration::from_secs(30), || {
        std::fs::read_to_string(&node.log).unwrap_or_default().contains("is now on another file system")
    });
    assert!(said, "the router says why: {}", router.log_tail(20));
    let beneath: Vec<_> = std::fs::read_dir(&mnt.path).expect("the mount point").map(|e| e.unwrap().path()).collect();
    assert_eq!(beneath, Vec::<PathBuf>::new(), "nothing made on the file system beneath");
    assert_eq!(states(&node), vec!["gone".to_string()], "still refused");
    // Consumers are served from memory.
    let jobs = super::drain(&node.text(), "kept");
    assert_eq!(jobs, (0..20).map(|i| format!("job-{i:04}")).collect::<Vec<_>>());
    router.kill_group();
    drop(mnt);
}
