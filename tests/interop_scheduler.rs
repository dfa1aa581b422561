//! Interop acceptance tests of the schedulers (project issue 4): the Rust
//! `emq-scheduler` and the real Python EventMQ 0.3.13 `emq-scheduler`
//! against the broker, with the real Python client (`messages.schedule`)
//! and real Python jobmanagers running the jobs.
//!
//! The broker is `emq-router` unless `EMQ_INTEROP_ROUTER` says otherwise
//! (see `common::router`; the `scheduled` counts of ROUTER_SHOW_SCHEDULERS
//! are only checked against `emq-router`). The tests share the interop
//! lock ([`begin`]): one interop test at a time, each under a watchdog.
//!
//! Timing facts the checks rely on (EventMQ 0.3.13, spec §7):
//! * a SCHEDULE without the `nohaste` header runs the job once at once (the
//!   "haste" run), then on its timer; the Python client sends none, so every
//!   job here has a haste run;
//! * the Rust scheduler restores stored jobs after a restart without a haste
//!   run, first fire one interval after the restart;
//! * job times come from the job itself (`time.time()` in the jobs file), so
//!   they include the router and jobmanager dispatch delay: the checks allow
//!   seconds of slack and never assert speed.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::common::interop::{begin, wait_schedulers, Setup};
use crate::common::jobs::{self, JobEvent};
use crate::common::ports::{free_port, zmq_endpoint};
use crate::common::proc::{Child, TestDir};
use crate::common::{admin, python, wait};

/// A jobmanager serving only `default`.
const Q_DEFAULT: &str = r#"[[10,"default"]]"#;
/// A jobmanager serving only `email`.
const Q_EMAIL: &str = r#"[[10,"email"]]"#;
/// Most a job may run after its due time and still count as on time
/// (router + jobmanager dispatch on a loaded 2-core machine).
const LATE: f64 = 5.0;
/// How long a run already dispatched before UNSCHEDULE/SIGTERM may still
/// take to land in the jobs file.
const SETTLE: Duration = Duration::from_secs(2);

/// A Rust `emq-scheduler` process (killed by PID on drop) and its admin
/// socket (answers `SCHEDULES`).
struct RustScheduler {
    child: Child,
    admin: String,
}

impl RustScheduler {
    /// Starts `emq-scheduler` against `frontend`, storing schedules in
    /// `data`, with its admin socket on a fresh port; log `<dir>/<name>.log`.
    fn start(dir: &TestDir, frontend: &str, data: &Path, name: &str) -> RustScheduler {
        let admin = zmq_endpoint(free_port());
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_emq-scheduler"));
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("EMQ_") {
                cmd.env_remove(key);
            }
        }
        cmd.args(["--router-addr", frontend, "--admin-addr", &admin]).arg("--data-dir").arg(data);
        cmd.env("RUST_LOG", "info");
        let child = Child::spawn(name, &mut cmd, &dir.join(&format!("{name}.log")));
        RustScheduler { child, admin }
    }

    /// The admin `SCHEDULES` rows (`{"key", "queue", "kind", ...}`), once
    /// the admin socket answers (it may still be starting).
    fn schedules(&self) -> Vec<Value> {
        let rows = wait::until_ok(Duration::from_secs(20), || {
            let reply = admin::request(&self.admin, "SCHEDULES")?;
            reply.as_array().cloned().ok_or_else(|| format!("SCHEDULES reply is not an array: {reply}"))
        });
        rows.unwrap_or_else(|why| panic!("no SCHEDULES answer: {why}\n{}", self.child.log_tail(30)))
    }
}

/// Unix time now, in seconds.
fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// The `run` lines of `tag` in `out`, sorted by time.
fn runs(out: &Path, tag: &str) -> Vec<JobEvent> {
    let events = jobs::read(out);
    let mut runs: Vec<JobEvent> = jobs::of_tag(&events, "run", tag).into_iter().cloned().collect();
    runs.sort_by(|a, b| a.time.total_cmp(&b.time));
    runs
}

/// Gaps between consecutive runs, in seconds.
fn gaps(runs: &[JobEvent]) -> Vec<f64> {
    runs.windows(2).map(|w| w[1].time - w[0].time).collect()
}

/// Checks that `runs` of `tag` (haste run included) all ran on jobmanager
/// `jm`, once per `interval` seconds: no two runs within half an interval
/// (a doubled schedule would show here) and on average one per interval.
fn assert_interval_runs(tag: &str, runs: &[JobEvent], interval: f64, jm: &str) {
    let elsewhere: Vec<&JobEvent> = runs.iter().filter(|r| r.jobmanager != jm).collect();
    assert!(elsewhere.is_empty(), "{tag} ran on another jobmanager than {jm}: {elsewhere:?}");
    let gaps = gaps(runs);
    let min = gaps.iter().copied().fold(f64::INFINITY, f64::min);
    assert!(min >= interval / 2.0, "{tag} ran twice within one {interval} s tick: gaps {gaps:.3?}");
    let mean = (runs[runs.len() - 1].time - runs[0].time) / gaps.len() as f64;
    assert!(
        (interval * 0.85..=interval * 1.2).contains(&mean),
        "{tag}: {} runs {mean:.3} s apart on average, want ~{interval} s: gaps {gaps:.3?}",
        runs.len()
    );
}

/// Waits until no new run of `tags` has landed for [`SETTLE`] (runs already
/// dispatched may still land), then checks that none lands for `quiet`
/// more. Returns the final run count per tag.
fn assert_stopped(out: &Path, tags: &[&str], quiet: Duration, setup: &Setup) -> Vec<usize> {
    let counts = || tags.iter().map(|t| runs(out, t).len()).collect::<Vec<usize>>();
    let mut last = (counts(), Instant::now());
    let settled = wait::until(Duration::from_secs(30), || {
        let now = counts();
        if now != last.0 {
            last = (now, Instant::now());
        }
        last.1.elapsed() >= SETTLE
    });
    assert!(settled, "{tags:?} kept running: {:?} runs\n{}", counts(), setup.logs());
    let before = counts();
    wait::until(quiet, || counts() != before);
    assert_eq!(counts(), before, "{tags:?} ran again within {quiet:?} after they stopped");
    before
}

/// Waits until `out` holds at least `n` runs of `tag`; panics with `logs()`.
fn wait_runs(out: &Path, tag: &str, n: usize, limit: Duration, logs: impl Fn() -> String) -> Vec<JobEvent> {
    let ok = wait::until(limit, || runs(out, tag).len() >= n);
    let got = runs(out, tag);
    assert!(ok, "{tag} ran {} times within {limit:?}, want {n}: {got:?}\n{}", got.len(), logs());
    got
}

/// Waits until the router lists `n` schedulers; panics with `logs`.
fn registered(setup: &Setup, n: usize, logs: &str) -> serde_json::Map<String, Value> {
    wait_schedulers(&setup.router.admin, n)
        .unwrap_or_else(|why| panic!("{n} scheduler(s) did not register: {why}\n{}\n{logs}", setup.logs()))
}

/// Checks the cron job's runs: the haste run within [`LATE`] s of `sent`
/// (Unix time just before the SCHEDULE), every later run at a minute
/// boundary (0 to [`LATE`] s past it), all on jobmanager `jm`.
fn assert_cron_runs(tag: &str, runs: &[JobEvent], sent: f64, jm: &str) {
    let elsewhere: Vec<&JobEvent> = runs.iter().filter(|r| r.jobmanager != jm).collect();
    assert!(elsewhere.is_empty(), "cron job {tag} ran on another jobmanager than {jm} (S3): {elsewhere:?}");
    let haste = runs[0].time - sent;
    assert!((0.0..LATE).contains(&haste), "no haste run at SCHEDULE: first run {haste:.3} s after it: {runs:?}");
    for run in &runs[1..] {
        let past_minute = run.time.rem_euclid(60.0);
        assert!(past_minute < LATE, "cron run {past_minute:.3} s past a minute boundary: {run:?}");
    }
}

#[test]
fn interop_rust_scheduler_interval_and_cron_on_their_queues() {
    let _turn = begin("interop_rust_scheduler_interval_cron", Duration::from_secs(240));
    let started = Instant::now();
    let setup = Setup::start("interop-rs-sched", &[("D", Q_DEFAULT), ("E", Q_EMAIL)], 2);
    let sched = RustScheduler::start(&setup.dir, &setup.router.frontend, &setup.dir.join("data"), "rs-scheduler");
    registered(&setup, 1, &sched.child.log_tail(30));
    let out = setup.dir.join("sched.txt");
    let logs = || format!("{}\n{}", setup.logs(), sched.child.log_tail(30));

    python::schedule(&setup.dir, &setup.router.frontend, &out, "tick", 1);
    let cron_sent = unix_now();
    python::schedule_cron(&setup.dir, &setup.router.frontend, &out, "minutely", "email", "* * * * *");

    // Interval: the haste run + 3 timer runs, ~1 s apart, on `default` (D).
    assert_interval_runs("tick", &wait_runs(&out, "tick", 4, Duration::from_secs(30), logs), 1.0, "D");
    let mut rows = sched.schedules();
    rows.sort_by_key(|r| r["kind"].as_str().map(String::from));
    assert_eq!(rows.len(), 2, "SCHEDULES: {rows:?}");
    assert_eq!((&rows[0]["queue"], &rows[0]["cron"]), (&Value::from("email"), &Value::from("* * * * *")));
    assert_eq!((&rows[1]["queue"], &rows[1]["interval_secs"]), (&Value::from("default"), &Value::from(1)));

    // Cron: the haste run, then the run at the next minute boundary (at most
    // ~61 s away), on `email` (E): EventMQ's scheduler sends it to `default` (S3).
    let cron_runs = wait_runs(&out, "minutely", 2, Duration::from_secs(75), logs);
    assert_cron_runs("minutely", &cron_runs, cron_sent, "E");
    let ticks = runs(&out, "tick");
    assert_interval_runs("tick", &ticks, 1.0, "D");

    // UNSCHEDULE both (the client's `unschedule=True`): the scheduler drops
    // them at once; waiting another minute for the cron job is not needed.
    python::unschedule(&setup.dir, &setup.router.frontend, &out, "tick");
    python::unschedule_from(&setup.dir, &setup.router.frontend, &out, "minutely", "email");
    let emptied = wait::until(Duration::from_secs(10), || sched.schedules().is_empty());
    assert!(emptied, "SCHEDULES after UNSCHEDULE: {:?}\n{}", sched.schedules(), logs());
    let counts = assert_stopped(&out, &["tick", "minutely"], Duration::from_secs(3), &setup);
    eprintln!(
        "interop_rust_scheduler_interval_cron: tick {} runs (~1 s apart), minutely {} runs (haste {:.3} s after \
         SCHEDULE, then {:.3} s past the minute), stopped by UNSCHEDULE; {:?} (router {:?})",
        counts[0],
        counts[1],
        cron_runs[0].time - cron_sent,
        cron_runs[1].time.rem_euclid(60.0),
        started.elapsed(),
        setup.router.kind
    );
}

/// Lines of a Python scheduler log saying it took a SCHEDULE.
fn schedule_lines(log: &str) -> Vec<&str> {
    log.lines().filter(|l| l.contains("Received new SCHEDULE request")).collect()
}

#[test]
fn interop_two_python_schedulers_each_schedule_runs_once_per_tick() {
    let _turn = begin("interop_two_python_schedulers", Duration::from_secs(240));
    let started = Instant::now();
    let mut setup = Setup::start("interop-py-scheds", &[("D", Q_DEFAULT)], 2);
    for label in ["S1", "S2"] {
        setup.jobmanagers.push(python::start_scheduler_labelled(&setup.dir, &setup.router.frontend, label));
    }
    registered(&setup, 2, "");
    let out = setup.dir.join("sched.txt");
    let tags = ["alpha", "beta"];
    for tag in tags {
        python::schedule(&setup.dir, &setup.router.frontend, &out, tag, 2);
    }
    for tag in tags {
        wait_runs(&out, tag, 5, Duration::from_secs(60), || setup.logs());
    }
    for tag in tags {
        assert_interval_runs(tag, &runs(&out, tag), 2.0, "D");
    }

    // Each SCHEDULE went to exactly one scheduler, one to each (round robin).
    let logs: Vec<String> = setup.jobmanagers[1..].iter().map(Child::log_text).collect();
    let taken: Vec<Vec<&str>> = logs.iter().map(|l| schedule_lines(l)).collect();
    assert!(taken.iter().all(|t| t.len() == 1), "SCHEDULEs taken per scheduler: {taken:?}");
    let holder = |tag: &str| taken.iter().position(|t| t[0].contains(tag));
    let (a, b) = (holder("alpha"), holder("beta"));
    assert!(a.is_some() && b.is_some() && a != b, "alpha on scheduler {a:?}, beta on {b:?}: {taken:?}");
    if !setup.router.is_python() {
        let listed = registered(&setup, 2, "");
        let counts: Vec<&Value> = listed.values().map(|s| &s["scheduled"]).collect();
        assert!(counts.iter().all(|c| **c == 1), "ROUTER_SHOW_SCHEDULERS: {listed:?}");
    }

    // UNSCHEDULE goes to every scheduler; the one holding the job drops it.
    for tag in tags {
        python::unschedule(&setup.dir, &setup.router.frontend, &out, tag);
    }
    let counts = assert_stopped(&out, &tags, Duration::from_secs(3), &setup);
    eprintln!(
        "interop_two_python_schedulers: alpha on S{}, beta on S{}, {counts:?} runs at 2 s, no doubles, stopped by \
         UNSCHEDULE; {:?} (router {:?})",
        a.unwrap_or(0) + 1,
        b.unwrap_or(0) + 1,
        started.elapsed(),
        setup.router.kind
    );
}

#[test]
fn interop_rust_scheduler_resumes_after_sigterm_restart() {
    let _turn = begin("interop_rust_scheduler_restart", Duration::from_secs(240));
    let started = Instant::now();
    let setup = Setup::start("interop-rs-restart", &[("D", Q_DEFAULT)], 2);
    let data = setup.dir.join("data");
    let mut sched = RustScheduler::start(&setup.dir, &setup.router.frontend, &data, "rs-scheduler-1");
    registered(&setup, 1, &sched.child.log_tail(30));
    let out = setup.dir.join("sched.txt");
    python::schedule(&setup.dir, &setup.router.frontend, &out, "tick", 1);
    wait_runs(&out, "tick", 3, Duration::from_secs(30), || format!("{}\n{}", setup.logs(), sched.child.log_tail(30)));
    let key = sched.schedules().first().map(|r| r["key"].clone()).unwrap_or(Value::Null);

    // SIGTERM: KBYE (the router forgets it), exit 0, and no more runs.
    let status = sched.child.terminate(Duration::from_secs(10));
    assert!(status.is_some_and(|s| s.success()), "emq-scheduler exit on SIGTERM: {status:?}");
    registered(&setup, 0, &sched.child.log_tail(30));
    let before = assert_stopped(&out, &["tick"], Duration::from_secs(2), &setup)[0];

    // Same data dir: the job comes back without being sent again.
    let restarted = RustScheduler::start(&setup.dir, &setup.router.frontend, &data, "rs-scheduler-2");
    registered(&setup, 1, &restarted.child.log_tail(30));
    let logs = || format!("{}\n{}", setup.logs(), restarted.child.log_tail(30));
    let all = wait_runs(&out, "tick", before + 3, Duration::from_secs(30), logs);
    assert_interval_runs("tick", &all[before..], 1.0, "D");
    let rows = restarted.schedules();
    assert_eq!(rows.len(), 1, "SCHEDULES after restart: {rows:?}");
    assert_eq!(rows[0]["key"], key, "restored another job: {rows:?}");
    if !setup.router.is_python() {
        let listed = registered(&setup, 1, "");
        let sent: Vec<&Value> = listed.values().map(|s| &s["scheduled"]).collect();
        assert_eq!(sent, [&Value::from(0)], "the router forwarded a SCHEDULE to the restarted scheduler");
    }
    eprintln!(
        "interop_rust_scheduler_restart: {before} runs, SIGTERM (exit 0), restart resumed ({} new runs ~1 s apart) \
         without a new SCHEDULE; {:?} (router {:?})",
        all.len() - before,
        started.elapsed(),
        setup.router.kind
    );
}
