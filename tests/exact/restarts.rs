//! Restarts of `emq-scheduler` keep each schedule's phase (docs/emqp.md
//! "The scheduler", "Restarts"): a run that fell due while the scheduler
//! was down is made up once at the restart, then the period goes on from
//! that run; a run not yet due comes at its original time; a scheduler
//! restarted more often than its job's interval still runs it.

use std::time::{Duration, Instant};

use emq::client::emqp::{Client, Schedule};

use super::schedules::{body, Counter, Sched};
use crate::common::proc::TestDir;
use crate::emqp_router::{config, eventually, Watchdog};

/// A router (fast heartbeats), one counting worker on `ticks` and a client.
fn setup() -> (emq::router::RouterHandle, Counter, Client) {
    let h = emq::router::start(config(1, |r| {
        r.heartbeat_interval = Some("300ms".into());
        r.heartbeat_timeout = Some("1500ms".into());
    }))
    .expect("router starts");
    let counter = Counter::start(&h.endpoints.backend, "ticks");
    let client = Client::connect(&h.endpoints.frontend).expect("client").with_timeout(Duration::from_secs(5));
    (h, counter, client)
}

fn registered(h: &emq::router::RouterHandle) -> usize {
    crate::common::admin::admin(h, "ROUTER_SHOW_SCHEDULERS")["connected_schedulers"].as_object().map_or(0, |m| m.len())
}

fn secs(times: &[Instant], from: Instant) -> Vec<String> {
    times.iter().map(|t| format!("{:.2}", (*t - from).as_secs_f64())).collect()
}

#[test]
fn a_run_missed_while_the_scheduler_was_down_is_made_up_once_then_the_period_goes_on() {
    let _w = Watchdog::new("scheduler_restart_catch_up", 90);
    let (h, counter, mut client) = setup();
    let dir = TestDir::new("exact-restart-catch-up");
    let data = dir.join("data");
    let mut sched = Sched::start(&dir, &h.endpoints.frontend, &data, "sched");
    eventually(20, "registered", || registered(&h) == 1);
    let tick = body(31);
    client.schedule_confirmed("ticks", &Schedule::Interval(3), &tick, "nohaste").expect("sent");
    // Down from 1 s to about 7.5 s: the runs due at 3 s and 6 s are missed.
    std::thread::sleep(Duration::from_secs(1));
    sched.child.kill_group();
    std::thread::sleep(Duration::from_millis(6500));
    let back = Instant::now();
    let _sched = Sched::start(&dir, &h.endpoints.frontend, &data, "sched-back");
    std::thread::sleep(Duration::from_millis(5500));
    let runs = counter.times(&tick, back);
    eprintln!("runs after the restart, s: {:?}", secs(&runs, back));
    assert!(runs.len() >= 2, "missed run not made up, or period lost: {:?}", secs(&runs, back));
    assert!(runs[0] - back < Duration::from_millis(1500), "made up only {:?} after the restart", runs[0] - back);
    let gap = runs[1] - runs[0];
    assert!(
        // Slack for a loaded machine; a lost phase would put the next
        // run a whole period (3 s) after a late first one.
        gap > Duration::from_millis(2500) && gap < Duration::from_millis(4000),
        "one run for the missed ones, then the 3 s period: gap {gap:?}"
    );
    assert_eq!(runs.len(), 2, "a burst of missed runs: {:?}", secs(&runs, back));
}

#[test]
fn a_run_not_yet_due_at_the_restart_comes_at_its_original_time() {
    let _w = Watchdog::new("scheduler_restart_phase", 90);
    let (h, counter, mut client) = setup();
    let dir = TestDir::new("exact-restart-phase");
    let data = dir.join("data");
    let mut sched = Sched::start(&dir, &h.endpoints.frontend, &data, "sched");
    eventually(20, "registered", || registered(&h) == 1);
    let tick = body(32);
    let t0 = Instant::now();
    client.schedule_confirmed("ticks", &Schedule::Interval(6), &tick, "nohaste").expect("sent");
    // Restarted every 2 s (more often than the 6 s interval): the run due
    // at 6 s still comes at 6 s, and the next at 12 s.
    for _ in 0..6 {
        std::thread::sleep(Duration::from_millis(1900));
        sched.child.kill_group();
        sched = Sched::start(&dir, &h.endpoints.frontend, &data, "sched-again");
    }
    std::thread::sleep(Duration::from_millis(500));
    let runs = counter.times(&tick, t0);
    eprintln!(
        "runs, s after the SCHEDULE: {:?} (restarted every ~2 s until {:.1} s)",
        secs(&runs, t0),
        (Instant::now() - t0).as_secs_f64()
    );
    assert!(!runs.is_empty(), "a scheduler restarted more often than the interval never ran the job");
    let first = runs[0] - t0;
    assert!(
        // A restart may land just before 6 s: the run waits for the
        // scheduler's start. Without the stored phase it would never come
        // while the restarts go on (until ~12 s).
        first >= Duration::from_secs(6) && first < Duration::from_millis(8000),
        "the first run came at {first:?}, not at its original time (6 s)"
    );
}
