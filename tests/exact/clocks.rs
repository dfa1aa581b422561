//! Point 6: monotonic intervals, cron on the wall clock re-planned when the
//! wall clock steps. The timetable with injected clocks, then the real
//! `emq-scheduler` under libfaketime with its wall clock stepped back 60 s.

use std::time::{Duration, Instant};

use chrono::{DateTime, SecondsFormat, TimeDelta, Utc};
use chrono_tz::Tz;
use emq::scheduler::schedule::Definition;
use emq::scheduler::timetable::{Now, Timetable};

use crate::common::proc::TestDir;
use crate::emqp_router::Watchdog;
use crate::scheduler::BODY_1_2;

fn def(interval: &str, cron: &str) -> Definition {
    let record = ["q".into(), "nohaste".into(), interval.into(), BODY_1_2.into(), cron.into()];
    Definition::from_record(record).expect("a valid schedule")
}

/// Two clocks a test moves by hand.
struct Clocks {
    now: Now,
}

impl Clocks {
    fn at(wall: &str) -> Clocks {
        let wall = DateTime::parse_from_rfc3339(wall).expect("time").with_timezone(&Utc);
        Clocks { now: Now { mono: Instant::now(), wall } }
    }

    /// Time passes: both clocks move by `secs`.
    fn pass(&mut self, secs: f64) -> Now {
        let d = Duration::from_secs_f64(secs);
        self.now = Now { mono: self.now.mono + d, wall: self.now.wall + TimeDelta::from_std(d).expect("small") };
        self.now
    }

    /// The wall clock alone steps by `secs` (negative: back).
    fn step(&mut self, secs: i64) -> Now {
        self.now.wall += TimeDelta::seconds(secs);
        self.now
    }

    fn wall(&self) -> String {
        self.now.wall.to_rfc3339_opts(SecondsFormat::Secs, true)
    }
}

/// The wall time of the timetable's next deadline, as the clocks read now.
fn next_wall(tt: &mut Timetable, c: &Clocks) -> String {
    let at = tt.next_deadline().expect("a deadline");
    c.now.wall_at(at).to_rfc3339_opts(SecondsFormat::Secs, true)
}

#[test]
fn a_wall_clock_step_back_does_not_delay_an_interval_job() {
    let mut c = Clocks::at("2024-01-01T12:00:00Z");
    let mut tt = Timetable::new(Tz::UTC);
    tt.schedule(def("2", ""), c.now).expect("scheduled");
    for round in 0..3 {
        c.pass(1.0);
        c.step(-60);
        c.pass(1.0);
        assert_eq!(tt.fire_due(c.now).0.len(), 1, "round {round}: the interval job is due every 2 s of real time");
    }
    c.step(3600);
    c.pass(2.0);
    assert_eq!(tt.fire_due(c.now).0.len(), 1, "a step forward does not make it burst either");
    assert!(tt.fire_due(c.now).0.is_empty());
}

#[test]
fn a_cron_job_jumped_over_by_a_step_forward_fires_once() {
    let mut c = Clocks::at("2024-01-01T12:01:00Z");
    let mut tt = Timetable::new(Tz::UTC);
    tt.schedule(def("-1", "*/5 * * * *"), c.now).expect("scheduled");
    assert_eq!(next_wall(&mut tt, &c), "2024-01-01T12:05:00Z");
    c.pass(30.0);
    c.step(600); // 12:11:30
    assert_eq!(tt.fire_due(c.now).0.len(), 1, "12:05 was jumped over: it fires once, at once");
    assert_eq!(next_wall(&mut tt, &c), "2024-01-01T12:15:00Z", "then on the new clock");
    assert!(tt.fire_due(c.now).0.is_empty());
}

#[test]
fn a_cron_job_never_fires_before_its_time_after_a_step_back() {
    let mut c = Clocks::at("2024-01-01T12:04:00Z");
    let mut tt = Timetable::new(Tz::UTC);
    tt.schedule(def("-1", "*/5 * * * *"), c.now).expect("scheduled");
    c.pass(30.0);
    c.step(-60); // 12:03:30 on the wall, 30 s before the monotonic deadline
    c.pass(30.0); // monotonic deadline reached; the wall reads 12:04:00
    assert!(tt.fire_due(c.now).0.is_empty(), "12:05 has not come on the wall clock");
    assert_eq!(next_wall(&mut tt, &c), "2024-01-01T12:05:00Z");
    c.pass(60.0);
    assert_eq!(tt.fire_due(c.now).0.len(), 1, "{}", c.wall());
}

#[test]
fn after_a_step_back_a_fixed_time_job_does_not_run_twice_but_a_wildcard_job_follows_the_clock() {
    let mut c = Clocks::at("2024-01-01T02:29:00Z");
    let mut fixed = Timetable::new(Tz::UTC);
    let mut wild = Timetable::new(Tz::UTC);
    fixed.schedule(def("-1", "30 2 * * *"), c.now).expect("scheduled");
    wild.schedule(def("-1", "30 * * * *"), c.now).expect("scheduled");
    c.pass(60.0);
    assert_eq!((fixed.fire_due(c.now).0.len(), wild.fire_due(c.now).0.len()), (1, 1), "both at 02:30");
    c.pass(60.0);
    c.step(-600); // 02:21 again
    fixed.fire_due(c.now);
    wild.fire_due(c.now);
    assert_eq!(next_wall(&mut fixed, &c), "2024-01-02T02:30:00Z", "02:30 today already ran");
    assert_eq!(next_wall(&mut wild, &c), "2024-01-01T02:30:00Z", "the wildcard job runs by the new time");
}

/// libfaketime's multi-threaded library (Debian's `faketime` package).
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

#[test]
fn emq_scheduler_under_a_60_s_wall_clock_step_back_keeps_its_interval_jobs_on_time() {
    let _w = Watchdog::new("faketime_step_back", 60);
    assert!(
        std::path::Path::new(LIBFAKETIME).exists(),
        "this test needs libfaketime ({LIBFAKETIME}: apt-get install faketime)"
    );
    let dir = TestDir::new("exact-faketime");
    let offset = dir.join("faketime.rc");
    std::fs::write(&offset, "+0\n").expect("write offset");
    let env: [(&str, &std::ffi::OsStr); 4] = [
        ("LD_PRELOAD", LIBFAKETIME.as_ref()),
        ("FAKETIME_TIMESTAMP_FILE", offset.as_os_str()),
        ("FAKETIME_NO_CACHE", "1".as_ref()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".as_ref()),
    ];
    let fake = super::FakeFrontend::start(&dir, &[], &env);
    let sched = &fake.child;
    fake.send(&[b"", b"eMQP/1.0", b"SCHEDULE", b"s", b"q", b"nohaste", b"1", BODY_1_2.as_bytes(), b""]);
    let collect = |d: Duration| fake.run(d).0.into_iter().map(|(t, _)| t).collect::<Vec<Instant>>();
    let before = collect(Duration::from_secs(3));
    std::fs::write(&offset, "-60\n").expect("step the clock back");
    let stepped = Instant::now();
    let after = collect(Duration::from_secs(5));
    let mut all = before.clone();
    all.extend(&after);
    let gaps: Vec<f64> = all.windows(2).map(|w| (w[1] - w[0]).as_secs_f64()).collect();
    eprintln!(
        "interval 1 s under a 60 s step back: {} runs before, {} after; gaps {gaps:.2?}",
        before.len(),
        after.len()
    );
    assert!(before.len() >= 2, "no runs before the step\n{}", sched.log_tail(20));
    assert!(after.len() >= 4, "the job stalled after the step: {} runs in 5 s\n{}", after.len(), sched.log_tail(20));
    assert!(
        after.first().is_some_and(|t| *t - stepped < Duration::from_millis(1600)),
        "first run after the step came late"
    );
    assert!(gaps.iter().all(|g| *g < 1.6), "a gap longer than the interval: {gaps:.2?}");
    let log = sched.log_text();
    assert!(log.contains("wall clock moved"), "the step went unnoticed\n{}", sched.log_tail(20));
}
