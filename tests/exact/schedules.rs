//! Points 5 and 8 over real sockets: emq-router with two and three
//! `emq-scheduler`s. Every SCHEDULE of a schedule reaches the scheduler
//! that owns its key (a schedule sent twice fires at its own rate; a
//! change reaches its holder), and what the scheduler answers reaches the
//! client that sent the message.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use emq::client::body::PythonCall;
use emq::client::emqp::{Client, Schedule, ScheduleAnswer};
use serde_json::Value;

use crate::common::ports::{free_port, zmq_endpoint};
use crate::common::proc::{Child, TestDir};
use crate::common::{admin as raw_admin, wait};
use crate::emqp_router::{config, eventually, Peer, Watchdog};

/// An `emq-scheduler` process (killed by PID on drop) with its admin socket.
pub struct Sched {
    pub child: Child,
    pub admin: String,
}

impl Sched {
    /// Starts `emq-scheduler` against `frontend` with its store in `data`
    /// and fast heartbeats (the router under test uses a short timeout).
    pub fn start(dir: &TestDir, frontend: &str, data: &Path, name: &str) -> Sched {
        Sched::start_with(dir, frontend, data, name, &[])
    }

    /// Like [`Sched::start`], with `extra` flags (`--redis URL`: its
    /// schedules in Redis, its name still in `data`).
    pub fn start_with(dir: &TestDir, frontend: &str, data: &Path, name: &str, extra: &[&str]) -> Sched {
        let admin = zmq_endpoint(free_port());
        let mut cmd = super::scheduler_cmd(frontend, &admin, data, "30s");
        cmd.args(extra);
        let child = Child::spawn(name, &mut cmd, &dir.join(&format!("{name}.log")));
        Sched { child, admin }
    }

    /// The keys its admin socket lists.
    pub fn keys(&self) -> Vec<String> {
        let rows = wait::until_ok(Duration::from_secs(20), || raw_admin::request(&self.admin, "SCHEDULES"));
        let rows = rows.unwrap_or_else(|why| panic!("{why}\n{}", self.child.log_tail(20)));
        rows.as_array()
            .map(|a| a.iter().filter_map(|r| r["key"].as_str().map(String::from)).collect())
            .unwrap_or_default()
    }
}

/// A body whose schedule key depends on `n`.
pub fn body(n: i64) -> Vec<u8> {
    PythonCall::new("jobs_mod", "tick").args(vec![n.into()]).body()
}

/// When a REQUEST arrived, and its body.
type Arrival = (Instant, Vec<u8>);

/// A raw worker on queue `queue`, run by a thread that heartbeats, answers
/// every REQUEST as a jobmanager does (and registers again when told
/// DISCONNECT), recording when each REQUEST arrived and its body.
pub struct Counter {
    seen: Arc<Mutex<Vec<Arrival>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Counter {
    pub fn start(backend: &str, queue: &str) -> Counter {
        let worker = Peer::new(backend, format!("counter-{queue}").as_bytes());
        let inform = format!(r#"[[10, "{queue}"]]"#);
        worker.inform_worker(&inform);
        worker.ready(1000);
        let (seen, stop) = (Arc::new(Mutex::new(Vec::new())), Arc::new(AtomicBool::new(false)));
        let (seen2, stop2) = (seen.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !stop2.load(Ordering::Relaxed) {
                worker.send(&[b"", b"eMQP/1.0", b"HEARTBEAT", b"hb", b"0"]);
                while let Some(f) = worker.recv_within(100) {
                    match f[2].as_slice() {
                        b"REQUEST" => {
                            worker.job_reply(&f[3]);
                            worker.ready(1);
                            seen2.lock().unwrap_or_else(|e| e.into_inner()).push((Instant::now(), f[6].clone()));
                        }
                        b"DISCONNECT" => {
                            worker.inform_worker(&inform);
                            worker.ready(1000);
                        }
                        _ => {}
                    }
                }
            }
        });
        Counter { seen, stop, thread: Some(thread) }
    }

    /// Lets REQUESTs arrive for `d`.
    pub fn collect(&mut self, d: Duration) {
        std::thread::sleep(d);
    }

    /// Arrival times of the REQUESTs with `body` since `from`.
    pub fn times(&self, body: &[u8], from: Instant) -> Vec<Instant> {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.iter().filter(|(t, b)| b == body && *t >= from).map(|(t, _)| *t).collect()
    }
}

impl Drop for Counter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn outcome(answer: &ScheduleAnswer) -> String {
    match answer {
        ScheduleAnswer::Accepted { detail, .. } => {
            let v: Value = serde_json::from_str(detail).unwrap_or(Value::Null);
            v["outcome"].as_str().unwrap_or("?").to_string()
        }
        other => panic!("not accepted: {other:?}"),
    }
}

/// The smallest gap between consecutive times, in seconds.
fn min_gap(times: &[Instant]) -> f64 {
    times.windows(2).map(|w| (w[1] - w[0]).as_secs_f64()).fold(f64::INFINITY, f64::min)
}

fn fast_router() -> emq::router::RouterHandle {
    emq::router::start(config(2, |r| {
        r.heartbeat_interval = Some("300ms".into());
        r.heartbeat_timeout = Some("1500ms".into());
    }))
    .expect("router starts")
}

fn wait_schedulers(h: &emq::router::RouterHandle, n: usize) {
    eventually(30, &format!("{n} schedulers registered"), || {
        crate::common::admin::admin(h, "ROUTER_SHOW_SCHEDULERS")["connected_schedulers"]
            .as_object()
            .is_some_and(|m| m.len() == n)
    });
}

#[test]
fn a_schedule_sent_twice_to_three_schedulers_fires_at_its_own_rate_and_changes_reach_its_holder() {
    let _w = Watchdog::new("schedule_three_schedulers", 120);
    let h = fast_router();
    let dir = TestDir::new("exact-three-schedulers");
    let scheds: Vec<Sched> = (0..3)
        .map(|i| Sched::start(&dir, &h.endpoints.frontend, &dir.join(&format!("data-{i}")), &format!("sched-{i}")))
        .collect();
    wait_schedulers(&h, 3);
    let mut counter = Counter::start(&h.endpoints.backend, "ticks");
    let mut c1 = Client::connect(&h.endpoints.frontend).expect("client").with_timeout(Duration::from_secs(5));
    let mut c2 = Client::connect(&h.endpoints.frontend).expect("client").with_timeout(Duration::from_secs(5));
    let tick = body(1);
    let t0 = Instant::now();
    let first = c1.schedule_confirmed("ticks", &Schedule::Interval(1), &tick, "guarantee").expect("sent");
    let second = c2.schedule_confirmed("ticks", &Schedule::Interval(1), &tick, "guarantee").expect("sent");
    assert_eq!((outcome(&first), outcome(&second)), ("added".into(), "unchanged".into()));
    counter.collect(Duration::from_secs(5));
    let runs = counter.times(&tick, t0);
    eprintln!(
        "three schedulers, one schedule sent twice: {} runs in 5 s, smallest gap {:.3} s",
        runs.len(),
        min_gap(&runs)
    );
    assert!((4..=7).contains(&runs.len()), "one schedule at 1 s over 5 s: {} runs", runs.len());
    assert!(min_gap(&runs) > 0.5, "two runs within half an interval: the schedule runs twice");
    let holders: Vec<usize> = (0..3).filter(|&i| !scheds[i].keys().is_empty()).collect();
    assert_eq!(holders.len(), 1, "exactly one scheduler holds it");

    // A change (2 s) reaches the holder: replaced there, and the rate follows.
    let changed = c2.schedule_confirmed("ticks", &Schedule::Interval(2), &tick, "guarantee").expect("sent");
    assert_eq!(outcome(&changed), "replaced");
    let t1 = Instant::now();
    counter.collect(Duration::from_secs(6));
    let runs = counter.times(&tick, t1);
    assert!((2..=5).contains(&runs.len()), "one schedule at 2 s over 6 s (haste included): {} runs", runs.len());
    assert!(min_gap(&runs[1.min(runs.len())..]) > 1.5, "the old 1 s timer still runs somewhere");
    assert_eq!((0..3).filter(|&i| !scheds[i].keys().is_empty()).collect::<Vec<_>>(), holders);

    // Two more schedules: one per scheduler.
    for n in [2, 3] {
        let a = c1.schedule_confirmed("ticks", &Schedule::Interval(3600), &body(n), "nohaste").expect("sent");
        assert_eq!(outcome(&a), "added");
    }
    let per: Vec<usize> = scheds.iter().map(|s| s.keys().len()).collect();
    assert_eq!(per, [1, 1, 1], "three keys on three schedulers");

    let gone = c1.unschedule_confirmed("ticks", &tick, "").expect("sent");
    assert_eq!(outcome(&gone), "unscheduled");
    let again = c1.unschedule_confirmed("ticks", &tick, "").expect("sent");
    assert_eq!(outcome(&again), "not_found");
    counter.collect(Duration::from_millis(500));
    let t2 = Instant::now();
    counter.collect(Duration::from_secs(3));
    assert!(counter.times(&tick, t2).is_empty(), "it still runs after UNSCHEDULE");
}

/// Two emq-schedulers with file stores, a counting worker on `ticks`, a
/// client, and one schedule (`tick`, every second) with its owner found.
pub(super) struct Pair {
    h: emq::router::RouterHandle,
    dir: TestDir,
    data: [std::path::PathBuf; 2],
    scheds: Vec<Sched>,
    counter: Counter,
    client: Client,
    pub(super) tick: Vec<u8>,
    pub(super) owner: usize,
    /// Each scheduler's extra flags (its store), kept for a restart.
    stores: [Vec<String>; 2],
}

impl Pair {
    fn start(test: &str, n: i64, headers: &str) -> Pair {
        Pair::start_with(TestDir::new(test), n, headers, [vec![], vec![]])
    }

    /// Like [`Pair::start`] in `dir`, scheduler `i` started with `stores[i]`.
    pub(super) fn start_with(dir: TestDir, n: i64, headers: &str, stores: [Vec<String>; 2]) -> Pair {
        let h = fast_router();
        let data = [dir.join("data-0"), dir.join("data-1")];
        let start = |i: usize| {
            let extra: Vec<&str> = stores[i].iter().map(String::as_str).collect();
            Sched::start_with(&dir, &h.endpoints.frontend, &data[i], &format!("sched-{i}"), &extra)
        };
        let scheds: Vec<Sched> = (0..2).map(start).collect();
        wait_schedulers(&h, 2);
        let counter = Counter::start(&h.endpoints.backend, "ticks");
        let mut client = Client::connect(&h.endpoints.frontend).expect("client").with_timeout(Duration::from_secs(5));
        let tick = body(n);
        let first = client.schedule_confirmed("ticks", &Schedule::Interval(1), &tick, headers).expect("sent");
        assert_eq!(outcome(&first), "added");
        let owner = (0..2).find(|&i| !scheds[i].keys().is_empty()).expect("an owner");
        Pair { h, dir, data, scheds, counter, client, tick, owner, stores }
    }

    /// SIGKILLs the owner and waits until the router has expired it.
    fn kill_owner(&mut self) {
        self.scheds[self.owner].child.kill_group();
        wait_schedulers(&self.h, 1);
    }

    /// Starts the owner again on its data directory (so under its name).
    fn restart_owner(&mut self) {
        let extra: Vec<&str> = self.stores[self.owner].iter().map(String::as_str).collect();
        let back =
            Sched::start_with(&self.dir, &self.h.endpoints.frontend, &self.data[self.owner], "sched-back", &extra);
        wait_schedulers(&self.h, 2);
        self.scheds[self.owner] = back;
    }

    fn again(&mut self, headers: &str) -> String {
        outcome(&self.client.schedule_confirmed("ticks", &Schedule::Interval(1), &self.tick, headers).expect("sent"))
    }

    /// Runs of the schedule during `d`, after `settle`.
    fn runs(&mut self, settle: Duration, d: Duration) -> Vec<Instant> {
        self.counter.collect(settle);
        let t0 = Instant::now();
        self.counter.collect(d);
        self.counter.times(&self.tick, t0)
    }
}

#[test]
fn two_schedulers_a_dead_owners_schedules_stop_and_resume_when_it_returns() {
    let _w = Watchdog::new("schedule_dead_owner", 150);
    let mut p = Pair::start("exact-dead-owner", 7, "");
    let other = 1 - p.owner;
    // The owner dies (SIGKILL): its schedule stops; the other does not take it.
    p.kill_owner();
    assert!(p.runs(Duration::from_millis(1500), Duration::from_secs(3)).is_empty(), "a dead scheduler's schedule ran");
    assert!(p.scheds[other].keys().is_empty());
    // It comes back with its data directory (so its name): the schedule
    // resumes there, restored, and a repeated SCHEDULE still finds it.
    p.restart_owner();
    let runs = p.runs(Duration::ZERO, Duration::from_secs(4));
    assert!((2..=5).contains(&runs.len()), "restored schedule at 1 s over 4 s: {} runs", runs.len());
    assert_eq!(p.again(""), "unchanged", "the repeat reached the scheduler holding it");
    assert_eq!((p.scheds[p.owner].keys().len(), p.scheds[other].keys().len()), (1, 0));
}

#[test]
fn a_schedule_sent_again_while_its_owner_is_away_moves_and_the_returning_copy_is_dropped() {
    let _w = Watchdog::new("schedule_moved", 150);
    let mut p = Pair::start("exact-moved-owner", 8, "nohaste");
    let other = 1 - p.owner;
    p.kill_owner();
    // Sent again meanwhile: the survivor takes it and runs it.
    assert_eq!(p.again("nohaste"), "added");
    assert_eq!(p.scheds[other].keys().len(), 1);
    // The first owner comes back with its stored copy; the router's
    // tombstone makes it drop that copy before its ACK, and the schedule
    // runs once per second, on its new owner.
    p.restart_owner();
    assert!(p.scheds[p.owner].keys().is_empty(), "the returning copy was not dropped at its registration");
    assert_eq!(p.again("nohaste"), "unchanged", "it stays with its new owner");
    assert!(p.scheds[p.owner].keys().is_empty());
    let runs = p.runs(Duration::from_millis(500), Duration::from_secs(5));
    assert!((3..=7).contains(&runs.len()) && min_gap(&runs) > 0.5, "once per second: {} runs", runs.len());
}

#[test]
fn a_silent_scheduler_is_removed_at_the_heartbeat_timeout_never_early_and_at_most_a_grid_step_late() {
    let _w = Watchdog::new("scheduler_expiry_timing", 60);
    // Heartbeats every 300 ms: a grid of 10 ms steps; timeout 1.5 s. The
    // old check every half timeout (750 ms) removed a scheduler up to
    // 750 ms late; three schedulers registered 250 ms apart cannot all be
    // lucky with it.
    let h = fast_router();
    let step = Duration::from_millis(10);
    let timeout = Duration::from_millis(1500);
    let mut informed = Vec::new();
    let mut peers = Vec::new();
    for i in 0..3 {
        let id = format!("silent-sched-{i}");
        let p = Peer::new(&h.endpoints.frontend, id.as_bytes());
        let t = Instant::now();
        p.send(&[b"", b"eMQP/1.0", b"INFORM", b"inf", b"", b"scheduler"]);
        p.expect("ACK");
        informed.push((id, t));
        peers.push(p);
        std::thread::sleep(Duration::from_millis(250));
    }
    let mut removed: Vec<Option<Duration>> = vec![None; 3];
    let end = Instant::now() + Duration::from_secs(5);
    while removed.iter().any(Option::is_none) && Instant::now() < end {
        let listed = crate::common::admin::admin(&h, "ROUTER_SHOW_SCHEDULERS")["connected_schedulers"].clone();
        for (i, (id, t)) in informed.iter().enumerate() {
            if removed[i].is_none() && listed.get(id).is_none() {
                removed[i] = Some(t.elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    eprintln!("silent schedulers removed after {removed:?} (timeout {timeout:?}, grid step {step:?})");
    for (i, took) in removed.iter().enumerate() {
        let took = took.unwrap_or_else(|| panic!("scheduler {i} never removed"));
        assert!(took >= timeout, "scheduler {i} removed early: {took:?}");
        // One grid step late at most, plus the admin poll's own latency.
        assert!(took <= timeout + step + Duration::from_millis(120), "scheduler {i} removed late: {took:?}");
    }
}

#[test]
fn an_unschedule_while_its_owner_is_away_is_deferred_and_the_owner_drops_the_schedule_when_it_returns() {
    let _w = Watchdog::new("schedule_unschedule_owner_away", 150);
    let p = Pair::start("exact-unschedule-owner-away", 9, "nohaste");
    unschedule_while_owner_away(p);
}

/// The owner of `p`'s schedule is killed; an UNSCHEDULE gets `deferred`;
/// the owner, restarted on its store, drops the schedule before it runs.
/// Returns the pair after that, for checks on the store.
pub(super) fn unschedule_while_owner_away(mut p: Pair) -> Pair {
    let other = 1 - p.owner;
    p.kill_owner();
    // Not `not_found`: the owner holds it and would run it when back.
    let tick = p.tick.clone();
    let answer = p.client.unschedule_confirmed("ticks", &tick, "").expect("sent");
    let ScheduleAnswer::Accepted { detail, .. } = &answer else { panic!("not accepted: {answer:?}") };
    let v: Value = serde_json::from_str(detail).expect("JSON");
    assert_eq!(v["outcome"], "deferred", "{detail}");
    assert_eq!(v["next_fire"], Value::Null, "{detail}");
    let status = crate::common::admin::admin(&p.h, "STATUS");
    assert_eq!(status["emq"]["counters"]["schedule_unschedules_deferred"], 1);
    // The owner comes back with its stored copy: it drops it before it
    // could run it.
    p.restart_owner();
    let runs = p.runs(Duration::ZERO, Duration::from_secs(3));
    assert!(runs.is_empty(), "the unscheduled schedule ran {} times after its owner came back", runs.len());
    assert!(p.scheds[p.owner].keys().is_empty() && p.scheds[other].keys().is_empty());
    let again = p.client.unschedule_confirmed("ticks", &tick, "").expect("sent");
    assert_eq!(outcome(&again), "not_found");
    let status = crate::common::admin::admin(&p.h, "STATUS");
    assert_eq!(status["emq"]["counters"]["schedule_tombstones_delivered"], 1, "{}", status["emq"]["counters"]);
    p
}
