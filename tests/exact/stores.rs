//! Point 10: scheduler stores. Redis with timeouts and atomic writes: a
//! paused Redis does not stop the scheduler, which keeps firing from memory,
//! logs the failure once and stores what changed when Redis is back; two
//! schedulers sharing one Redis: the survivor takes a dead one's schedules
//! over. (The file store moving a damaged log aside is checked in
//! `tests/scheduler.rs`.)

use std::process::Command;
use std::time::{Duration, Instant};

use emq::client::emqp::{Client, Schedule};

use super::schedules::{body, Counter, Sched};
use crate::common::ports::{free_port, zmq_endpoint};
use crate::common::proc::{Child, TestDir};
use crate::common::wait;
use crate::emqp_router::{config, eventually, Watchdog};
use crate::scheduler::BODY_1_2;

/// A `redis-server` on a fresh port (killed by PID on drop).
struct Redis {
    child: Child,
    url: String,
}

impl Redis {
    fn start(dir: &TestDir) -> Redis {
        let port = free_port();
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]);
        let child = Child::spawn("redis-server", &mut cmd, &dir.join("redis.log"));
        let url = format!("redis://127.0.0.1:{port}/0");
        let client = redis::Client::open(url.as_str()).expect("url");
        let up = wait::until(Duration::from_secs(10), || client.get_connection().is_ok());
        assert!(up, "redis-server did not start (apt-get install redis-server)\n{}", child.log_tail(10));
        Redis { child, url }
    }

    fn con(&self) -> redis::Connection {
        let con = redis::Client::open(self.url.as_str()).expect("url").get_connection().expect("connection");
        con.set_read_timeout(Some(Duration::from_secs(2))).expect("timeout");
        con
    }

    fn get(&self, key: &str) -> Option<String> {
        self.get_in(0, key)
    }

    /// The URL of database `db` of this server.
    fn url_of(&self, db: u32) -> String {
        format!("{}/{db}", self.url.trim_end_matches("/0"))
    }

    /// `GET key` in database `db`.
    fn get_in(&self, db: u32, key: &str) -> Option<String> {
        let mut con = redis::Client::open(self.url_of(db).as_str()).expect("url").get_connection().expect("connection");
        redis::cmd("GET").arg(key).query(&mut con).expect("GET")
    }

    /// Calls of `command` so far (INFO commandstats).
    fn calls(&self, command: &str) -> u64 {
        let info: String = redis::cmd("INFO").arg("commandstats").query(&mut self.con()).expect("INFO");
        let prefix = format!("cmdstat_{command}:calls=");
        info.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on a child this test started.
        assert_eq!(unsafe { libc::kill(self.child.pid(), sig) }, 0);
    }
}

const KEY_1_2: &str = "9e1e59012f7f704b21daedd11ff7b4900b19e107";

#[test]
fn a_paused_redis_does_not_stop_the_scheduler_and_changes_are_stored_when_it_is_back() {
    let _w = Watchdog::new("paused_redis", 90);
    let dir = TestDir::new("exact-paused-redis");
    let redis = Redis::start(&dir);
    let fake = super::FakeFrontend::start(&dir, &["--redis", &redis.url], &[]);
    let (sched, send, run) = (&fake.child, |f: &[&[u8]]| fake.send(f), |d| fake.run(d));
    let (eval_before, lpush_before) = (redis.calls("eval"), redis.calls("lpush"));
    send(&[b"", b"eMQP/1.0", b"SCHEDULE", b"s1", b"q", b"nohaste", b"1", BODY_1_2.as_bytes(), b""]);
    let (_, answers) = run(Duration::from_secs(2));
    assert_eq!(answers, [(b"s1".to_vec(), b"REPLY".to_vec())]);
    assert!(redis.get(KEY_1_2).is_some(), "stored");
    // Written by one atomic script (its LPUSH runs inside it).
    assert!(redis.calls("eval") > eval_before, "a put is one EVAL");
    assert!(redis.calls("lpush") > lpush_before);

    // Redis stops answering. The scheduler keeps firing, and still takes
    // (and answers) a SCHEDULE, from memory.
    redis.signal(libc::SIGSTOP);
    let second = String::from_utf8(body(42)).expect("utf-8");
    let second_key = emq::scheduler::key::key_body(second.as_bytes()).expect("key").key;
    send(&[b"", b"eMQP/1.0", b"SCHEDULE", b"s2", b"q", b"nohaste", b"1", second.as_bytes(), b""]);
    let t0 = Instant::now();
    let (fires, answers) = run(Duration::from_secs(8));
    redis.signal(libc::SIGCONT);
    assert_eq!(answers, [(b"s2".to_vec(), b"REPLY".to_vec())], "answered while Redis is paused");
    for b in [BODY_1_2.as_bytes(), second.as_bytes()] {
        let times: Vec<Instant> = fires.iter().filter(|(_, f)| f == b).map(|(t, _)| *t).collect();
        let mut all = vec![t0];
        all.extend(&times);
        let gaps: Vec<f64> = all.windows(2).map(|w| (w[1] - w[0]).as_secs_f64()).collect();
        eprintln!("while Redis was paused: {} runs, gaps {gaps:.2?}", times.len());
        assert!(times.len() >= 5, "{} runs in 8 s\n{}", times.len(), sched.log_tail(20));
        assert!(gaps.iter().all(|g| *g < 3.5), "the scheduler stalled: {gaps:.2?}");
    }
    // Back: what changed is stored within a retry period; one failure line.
    let stored = wait::until(Duration::from_secs(15), || redis.get(second_key.as_str()).is_some());
    assert!(stored, "the SCHEDULE taken while Redis was paused was never stored\n{}", sched.log_tail(30));
    let log = sched.log_text();
    assert_eq!(log.matches("cannot reach the schedule store").count(), 1, "logged once a minute at most\n{log}");
    eventually(10, "recovery logged", || sched.log_text().contains("reachable again"));
}

#[test]
fn two_schedulers_sharing_redis_the_survivor_takes_a_dead_ones_schedules_over() {
    let _w = Watchdog::new("shared_redis_takeover", 150);
    let dir = TestDir::new("exact-shared-redis");
    let redis = Redis::start(&dir);
    let h = emq::router::start(config(1, |r| {
        r.heartbeat_interval = Some("300ms".into());
        r.heartbeat_timeout = Some("1500ms".into());
    }))
    .expect("router starts");
    let start = |i: usize| {
        let admin = zmq_endpoint(free_port());
        let mut cmd = super::scheduler_cmd(&h.endpoints.frontend, &admin, &dir.join(&format!("data-{i}")), "30s");
        cmd.args(["--redis", &redis.url]);
        Sched { child: Child::spawn(&format!("sched-{i}"), &mut cmd, &dir.join(&format!("sched-{i}.log"))), admin }
    };
    let mut scheds = [start(0), start(1)];
    eventually(30, "two schedulers", || {
        crate::common::admin::admin(&h, "ROUTER_SHOW_SCHEDULERS")["connected_schedulers"]
            .as_object()
            .is_some_and(|m| m.len() == 2)
    });
    let mut counter = Counter::start(&h.endpoints.backend, "ticks");
    let tick = body(9);
    let mut c = Client::connect(&h.endpoints.frontend).expect("client").with_timeout(Duration::from_secs(5));
    c.schedule_confirmed("ticks", &Schedule::Interval(1), &tick, "nohaste").expect("sent");
    let owner = (0..2).find(|&i| !scheds[i].keys().is_empty()).expect("an owner");
    let other = 1 - owner;
    assert!(scheds[other].keys().is_empty(), "one owner");
    scheds[owner].child.kill_group();
    // The survivor takes it over once the dead one's lease lapses (15 s) and it reconciles (every 5 s).
    let died = Instant::now();
    let taken = wait::until(Duration::from_secs(40), || scheds[other].keys().len() == 1);
    assert!(taken, "not taken over\n{}", scheds[other].child.log_tail(20));
    eprintln!("shared Redis: schedule taken over {:?} after its scheduler died", died.elapsed());
    counter.collect(Duration::from_millis(500));
    let t0 = Instant::now();
    counter.collect(Duration::from_secs(4));
    let runs = counter.times(&tick, t0);
    assert!((3..=5).contains(&runs.len()), "after the takeover: {} runs in 4 s", runs.len());
    let key = emq::scheduler::key::key_body(&tick).expect("key").key;
    let owner_key = format!("{}{}", emq::scheduler::redis_store::OWNER_PREFIX, key.as_str());
    let name = std::fs::read_to_string(dir.join(&format!("data-{other}")).join("name")).expect("name");
    assert_eq!(redis.get(&owner_key), Some(name.trim().to_string()), "the record names its new owner");
}

#[test]
fn an_unschedule_while_its_owner_is_away_is_deferred_and_the_owner_removes_it_from_redis_when_it_returns() {
    let _w = Watchdog::new("unschedule_owner_away_redis", 150);
    let dir = TestDir::new("exact-unschedule-owner-away-redis");
    let redis = Redis::start(&dir);
    // Each scheduler its own database, as each has its own file store in
    // the file-store version of this test (`tests/exact/schedules.rs`).
    let stores = [0, 1].map(|db| vec!["--redis".to_string(), redis.url_of(db)]);
    let p = super::schedules::Pair::start_with(dir, 9, "nohaste", stores);
    let tick = String::from_utf8(p.tick.clone()).expect("utf-8");
    let key = emq::scheduler::key::key_body(tick.as_bytes()).expect("key").key.as_str().to_string();
    let owner_db = p.owner as u32;
    let next = format!("emq:scheduler:next:{key}");
    assert!(redis.get_in(owner_db, &key).is_some(), "the owner stored the schedule in its database");
    let p = super::schedules::unschedule_while_owner_away(p);
    // Dropped from the owner's store, not only from its memory.
    let gone = wait::until(Duration::from_secs(10), || {
        redis.get_in(owner_db, &key).is_none() && redis.get_in(owner_db, &next).is_none()
    });
    assert!(gone, "the schedule is still in Redis: {:?}", redis.get_in(owner_db, &key));
    assert!(redis.get_in(1 - owner_db, &key).is_none(), "the other scheduler never stored it");
    drop(p);
}
