//! emq-scheduler without sockets: schedule keys (spec §7.3, §13 V12), the
//! timetable under a fake clock, and the crash-safe file store.

use std::sync::OnceLock;
use std::time::Instant;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use emq::scheduler::key::{key_body, KeyError};
use emq::scheduler::schedule::{Definition, ScheduleError};
use emq::scheduler::store::{FileStore, Store, StoreError, Stored};
use emq::scheduler::timetable::{Change, Now, Outcome, Timetable};

/// `BODY_1_2` of spec §13 V12.
pub const BODY_1_2: &str = r#"["run", {"callable": "add", "path": "jobs_mod", "args": [1, 2], "kwargs": {}, "class_args": [], "class_kwargs": {}}]"#;

/// The wall time the fake monotonic clock's zero stands for.
const EPOCH: &str = "2020-01-01T00:00:00Z";

fn wall(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
}

/// The fake monotonic clock's zero.
fn zero() -> Instant {
    static ZERO: OnceLock<Instant> = OnceLock::new();
    *ZERO.get_or_init(Instant::now)
}

/// Both clocks at wall time `s`, agreeing (no step since [`EPOCH`]).
pub fn t(s: &str) -> Now {
    let w = wall(s);
    Now { mono: zero() + (w - wall(EPOCH)).to_std().unwrap(), wall: w }
}

/// `now` moved on by `secs` seconds on both clocks.
fn plus(now: Now, secs: i64) -> Now {
    Now {
        mono: now.mono + std::time::Duration::from_secs(secs as u64),
        wall: now.wall + chrono::TimeDelta::seconds(secs),
    }
}

/// The timetable's next deadline as both clocks read then (no step).
fn next(tt: &mut Timetable) -> Option<Now> {
    tt.next_deadline().map(|mono| Now { mono, wall: wall(EPOCH) + chrono::TimeDelta::from_std(mono - zero()).unwrap() })
}

fn body(args: &str) -> String {
    format!(
        r#"["run", {{"callable": "f", "path": "m", "args": {args}, "kwargs": {{}}, "class_args": [], "class_kwargs": {{}}}}]"#
    )
}

fn def(queue: &str, headers: &str, interval: &str, args: &str, cron: &str) -> Definition {
    Definition::from_record([queue.into(), headers.into(), interval.into(), body(args), cron.into()]).unwrap()
}

#[test]
fn key_spec_vectors() {
    let k = key_body(BODY_1_2.as_bytes()).unwrap();
    assert_eq!(k.key.as_str(), "9e1e59012f7f704b21daedd11ff7b4900b19e107");
    assert_eq!(
        k.canonical,
        r#"{"args": [1, 2], "callable": "add", "class_args": [], "class_kwargs": {}, "kwargs": {}, "path": "jobs_mod"}"#
    );
    assert_eq!(k.request_body, BODY_1_2);
    // The test-suite vector, in two key orders (spec §7.3).
    let a = r#"["run", {"path": "test", "callable": "do_the_thing", "args": [33, "asdf"], "kwargs": {"zeta": "Z", "alpha": "α"}, "class_args": [0], "class_kwargs": {"donkey": true, "apple": false}}]"#;
    let b = r#"["x",{"class_kwargs":{"apple":false,"donkey":true},"kwargs":{"alpha":"\u03b1","zeta":"Z"},"class_args":[0],"args":[33,"asdf"],"callable":"do_the_thing","path":"test","extra":1}]"#;
    for text in [a, b] {
        let k = key_body(text.as_bytes()).unwrap();
        assert_eq!(k.key.as_str(), "4658982cab9d32bf1ef9113a9d8bdec01775e2bc");
        assert_eq!(
            k.canonical,
            r#"{"args": [33, "asdf"], "callable": "do_the_thing", "class_args": [0], "class_kwargs": {"apple": false, "donkey": true}, "kwargs": {"alpha": "\u03b1", "zeta": "Z"}, "path": "test"}"#
        );
    }
}

#[test]
fn key_edge_cases_match_python() {
    // Canonical texts and hashes produced by CPython 3.11 json.dumps(sort_keys=True) + hashlib.sha1.
    let cases = [
        (
            r#"[1e16, 1e-05, -0.0, 1.0, 1, 0.1, 1E400, 12345678901234567890]"#,
            r#"[1e+16, 1e-05, -0.0, 1.0, 1, 0.1, Infinity, 12345678901234567890]"#,
        ),
        (r#"["é😀\u007f\ud800", "a/b\"\\\n"]"#, r#"["\u00e9\ud83d\ude00\u007f\ud800", "a/b\"\\\n"]"#),
    ];
    for (args, want) in cases {
        let k = key_body(body(args).as_bytes()).unwrap();
        let expected = format!(
            r#"{{"args": {want}, "callable": "f", "class_args": [], "class_kwargs": {{}}, "kwargs": {{}}, "path": "m"}}"#
        );
        assert_eq!(k.canonical, expected);
    }
    let k = key_body(body("[1e16, 1e-05, -0.0, 1.0, 1]").as_bytes()).unwrap();
    assert_eq!(k.key.as_str(), "7f05a9a95cca48e660ca2425e5566e94c45a4d7f");
    let k = key_body(body(r#"["é😀"]"#).as_bytes()).unwrap();
    assert_eq!(k.key.as_str(), "63b5e1f7a4763960d5fcb691b680e40480f59cc2");
}

#[test]
fn key_rejects_bad_bodies() {
    assert_eq!(key_body(b"\xff"), Err(KeyError::NotUtf8));
    assert!(matches!(key_body(b"[1,"), Err(KeyError::Json(_))));
    assert_eq!(key_body(b"{\"a\": 1}"), Err(KeyError::Shape));
    assert_eq!(key_body(b"[\"run\", []]"), Err(KeyError::Shape));
    let no_kwargs = r#"["run", {"callable": "f", "path": "m", "args": [], "class_args": [], "class_kwargs": {}}]"#;
    assert_eq!(key_body(no_kwargs.as_bytes()), Err(KeyError::MissingField("kwargs")));
}

#[test]
fn definitions_reject_bad_frames() {
    let rec = |interval: &str, headers: &str, cron: &str| {
        Definition::from_record(["q".into(), headers.into(), interval.into(), body("[]"), cron.into()])
    };
    assert!(matches!(rec("0", "", ""), Err(ScheduleError::BadInterval(_))));
    assert!(matches!(rec("abc", "", ""), Err(ScheduleError::BadInterval(_))));
    assert!(matches!(rec("999999999999", "", ""), Err(ScheduleError::BadInterval(_))));
    assert!(matches!(rec("-1", "", ""), Err(ScheduleError::BadCron { .. })));
    assert!(matches!(rec("-1", "", "61 * * * *"), Err(ScheduleError::BadCron { .. })));
    assert!(matches!(rec("-1", "", "0 * * * * *"), Err(ScheduleError::BadCron { .. })));
    assert!(matches!(rec("5", "run_count:x", ""), Err(ScheduleError::BadRunCount(_))));
    let d = rec(" 60 ", "guarantee,nohaste,run_count:3", "").unwrap();
    assert_eq!((d.nohaste, d.run_count), (true, Some(3)));
    assert!(!rec("60", "nohaste-not", "").unwrap().nohaste);
}

#[test]
fn interval_haste_fixed_rate_and_no_burst_after_stall() {
    let mut tt = Timetable::new(Tz::UTC);
    let t0 = t("2024-01-01T00:00:00Z");
    let (outcome, haste, changes) = tt.schedule(def("email", "guarantee", "10", "[1]", ""), t0).unwrap();
    assert_eq!(outcome, Outcome::Added);
    let haste = haste.unwrap();
    assert_eq!((haste.queue.as_str(), haste.body.as_str()), ("email", body("[1]").as_str()));
    assert!(matches!(&changes[..], [Change::Put(_, None)]));
    assert_eq!(next(&mut tt), Some(t("2024-01-01T00:00:10Z")));
    assert!(tt.fire_due(t("2024-01-01T00:00:09Z")).0.is_empty());
    assert_eq!(tt.fire_due(t("2024-01-01T00:00:10.300Z")).0.len(), 1);
    assert_eq!(next(&mut tt), Some(t("2024-01-01T00:00:20Z")), "fixed rate, no drift");
    // Stalled for 75 s: one fire, then now + interval.
    assert_eq!(tt.fire_due(t("2024-01-01T00:01:35Z")).0.len(), 1);
    assert_eq!(next(&mut tt), Some(t("2024-01-01T00:01:45Z")));
}

#[test]
fn repeated_identical_schedule_keeps_timer_changed_one_replaces() {
    let mut tt = Timetable::new(Tz::UTC);
    let t0 = t("2024-01-01T00:00:00Z");
    tt.schedule(def("q", "run_count:5", "10", "[1]", ""), t0).unwrap();
    let later = t("2024-01-01T00:00:04Z");
    let (outcome, haste, changes) = tt.schedule(def("q", "run_count:5", "10", "[1]", ""), later).unwrap();
    assert_eq!((outcome, haste, changes), (Outcome::Unchanged, None, vec![]));
    assert_eq!(next(&mut tt), Some(t("2024-01-01T00:00:10Z")));
    assert_eq!(tt.get(&key_body(body("[1]").as_bytes()).unwrap().key).unwrap().1, Some(4));
    // Another queue, same key: replaced, haste again, timer restarted.
    let (outcome, haste, _) = tt.schedule(def("other", "run_count:5", "10", "[1]", ""), later).unwrap();
    assert_eq!(outcome, Outcome::Replaced);
    assert_eq!(haste.unwrap().queue, "other");
    assert_eq!(next(&mut tt), Some(t("2024-01-01T00:00:14Z")));
    assert_eq!(tt.len(), 1);
    // nohaste replacement: no immediate run.
    let (_, haste, _) = tt.schedule(def("other", "nohaste", "10", "[1]", ""), later).unwrap();
    assert!(haste.is_none());
}

#[test]
fn run_count_counts_the_haste_run() {
    let mut tt = Timetable::new(Tz::UTC);
    let mut now = t("2024-01-01T00:00:00Z");
    let (_, haste, _) = tt.schedule(def("q", "run_count:3", "1", "[1]", ""), now).unwrap();
    let mut fired = usize::from(haste.is_some());
    let mut deletes = 0;
    for _ in 0..10 {
        now = plus(now, 1);
        let (fires, changes) = tt.fire_due(now);
        fired += fires.len();
        deletes += changes.iter().filter(|c| matches!(c, Change::Delete(_))).count();
    }
    assert_eq!((fired, deletes, tt.len()), (3, 1, 0));
    // nohaste: all N at the interval; run_count:0 removes the key.
    let (_, haste, _) = tt.schedule(def("q", "nohaste,run_count:2", "1", "[2]", ""), now).unwrap();
    assert!(haste.is_none());
    let (outcome, haste, changes) = tt.schedule(def("q", "run_count:0", "1", "[2]", ""), now).unwrap();
    assert_eq!((outcome, haste), (Outcome::Removed, None));
    assert!(matches!(&changes[..], [Change::Delete(_)]));
    assert!(tt.is_empty());
}

#[test]
fn unschedule_removes_cron_and_interval_jobs() {
    let mut tt = Timetable::new(Tz::UTC);
    let now = t("2024-01-01T00:00:00Z");
    let cron = def("email", "nohaste", "-1", "[1]", "*/5 * * * *");
    let key = cron.key.clone();
    tt.schedule(cron, now).unwrap();
    assert_eq!(next(&mut tt), Some(t("2024-01-01T00:05:00Z")));
    let (fires, _) = tt.fire_due(t("2024-01-01T00:05:00Z"));
    assert_eq!(fires[0].queue, "email", "cron jobs keep their queue (S3)");
    assert!(tt.unschedule(&key));
    assert!(tt.fire_due(t("2024-01-01T01:00:00Z")).0.is_empty());
    assert_eq!(next(&mut tt), None);
}

/// The next `n` cron fire times after `from`, firing each as the loop would.
fn cron_fires(tz: Tz, expr: &str, from: &str, n: usize) -> Vec<String> {
    let mut tt = Timetable::new(tz);
    tt.schedule(def("q", "nohaste", "-1", "[1]", expr), t(from)).unwrap();
    let mut out = Vec::new();
    for _ in 0..n {
        let at = next(&mut tt).unwrap();
        out.push(at.wall.to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
        assert_eq!(tt.fire_due(at).0.len(), 1);
    }
    out
}

#[test]
fn cron_calendar_rules() {
    assert_eq!(
        cron_fires(Tz::UTC, "0 12 29 2 *", "2025-03-01T00:00:00Z", 2),
        ["2028-02-29T12:00:00Z", "2032-02-29T12:00:00Z"]
    );
    // Day of month OR day of week (Vixie cron, croniter): the 13th or any Friday.
    assert_eq!(
        cron_fires(Tz::UTC, "0 0 13 * 5", "2024-09-01T00:00:00Z", 5),
        [
            "2024-09-06T00:00:00Z",
            "2024-09-13T00:00:00Z",
            "2024-09-20T00:00:00Z",
            "2024-09-27T00:00:00Z",
            "2024-10-04T00:00:00Z"
        ]
    );
    assert_eq!(cron_fires(Tz::UTC, "0 0 13 * 5", "2024-10-12T00:00:00Z", 1), ["2024-10-13T00:00:00Z"]);
    assert_eq!(
        cron_fires(Tz::UTC, "*/20 9-10 * * 1-5", "2024-01-05T10:30:00Z", 4),
        ["2024-01-05T10:40:00Z", "2024-01-08T09:00:00Z", "2024-01-08T09:20:00Z", "2024-01-08T09:40:00Z"]
    );
    assert_eq!(cron_fires(Tz::UTC, "@daily", "2024-12-31T23:59:59Z", 1), ["2025-01-01T00:00:00Z"]);
}

#[test]
fn cron_dst_in_a_time_zone() {
    let berlin: Tz = "Europe/Berlin".parse().unwrap();
    // Spring forward (2024-03-31, 02:00 CET → 03:00 CEST): 02:30 does not exist; fires at 03:00 CEST.
    assert_eq!(
        cron_fires(berlin, "30 2 * * *", "2024-03-30T12:00:00Z", 2),
        ["2024-03-31T01:00:00Z", "2024-04-01T00:30:00Z"]
    );
    // Fall back (2024-10-27, 03:00 CEST → 02:00 CET): 02:30 happens twice; fires once, the first time.
    assert_eq!(
        cron_fires(berlin, "30 2 * * *", "2024-10-26T12:00:00Z", 2),
        ["2024-10-27T00:30:00Z", "2024-10-28T01:30:00Z"]
    );
    // Wildcard jobs follow the local clock through the repeated hour's second pass (Vixie cron; cron.rs).
    assert_eq!(
        cron_fires(berlin, "*/30 * * * *", "2024-10-27T00:15:00Z", 3),
        ["2024-10-27T00:30:00Z", "2024-10-27T01:00:00Z", "2024-10-27T01:30:00Z"]
    );
    // UTC default: no DST at all.
    assert_eq!(
        cron_fires(Tz::UTC, "30 2 * * *", "2024-03-30T12:00:00Z", 2),
        ["2024-03-31T02:30:00Z", "2024-04-01T02:30:00Z"]
    );
}

#[test]
fn ten_thousand_schedules_one_deadline() {
    let mut tt = Timetable::new(Tz::UTC);
    let now = t("2024-01-01T00:00:00Z");
    for i in 0..10_000 {
        tt.schedule(def("q", "nohaste", &(60 + i % 600).to_string(), &format!("[{i}]"), ""), now).unwrap();
    }
    assert_eq!(tt.len(), 10_000);
    assert_eq!(next(&mut tt), Some(t("2024-01-01T00:01:00Z")));
    assert!(tt.fire_due(t("2024-01-01T00:00:59Z")).0.is_empty());
    assert_eq!(tt.fire_due(t("2024-01-01T00:01:00Z")).0.len(), 17);
}

#[test]
fn stale_timers_do_not_accumulate() {
    let mut tt = Timetable::new(Tz::UTC);
    let now = t("2024-01-01T00:00:00Z");
    tt.schedule(def("q", "nohaste", "30", "[0]", ""), now).unwrap();
    for i in 0..5_000 {
        let d = def("q", "nohaste", "3600", &format!("[{}]", i % 7 + 1), "");
        let key = d.key.clone();
        tt.schedule(d, now).unwrap();
        assert!(tt.unschedule(&key));
    }
    assert_eq!(tt.len(), 1);
    assert!(tt.pending_timers() <= 2 + 1024 + 1, "{} heap entries", tt.pending_timers());
    assert_eq!(next(&mut tt), Some(t("2024-01-01T00:00:30Z")));
}

fn stored(args: &str) -> (emq::scheduler::key::ScheduleKey, Stored) {
    let record = ["q".to_string(), "run_count:4".into(), "60".into(), body(args), String::new()];
    (key_body(record[3].as_bytes()).unwrap().key, Stored { record, runs_left: Some(3), next_fire: None })
}

/// Runs `f` with the warnings logged on this thread written (no colours)
/// to the file `log`: its result and the lines.
fn warnings<R>(log: &std::path::Path, f: impl FnOnce() -> R) -> (R, String) {
    let file = std::fs::File::create(log).expect("log file");
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
        .with_ansi(false)
        .with_writer(std::sync::Mutex::new(file))
        .finish();
    let result = tracing::subscriber::with_default(subscriber, f);
    (result, std::fs::read_to_string(log).expect("log read"))
}

#[test]
fn file_store_survives_torn_and_damaged_writes() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, c) = (stored("[1]"), stored("[2]"), stored("[3]"));
    {
        let mut s = FileStore::open(dir.path()).unwrap();
        assert!(matches!(FileStore::open(dir.path()), Err(StoreError::Locked(_))));
        for (k, v) in [&a, &b, &c] {
            s.put(k, v).unwrap();
        }
        s.delete(&b.0).unwrap();
        s.sync().unwrap();
    }
    let log = dir.path().join("schedules.log");
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(text.lines().count(), 4);
    // Damage line 1 (A's put), tear a last write, leave a half-written compaction file.
    let damaged = text.replacen("run_count:4", "run_count:5", 1) + "0badc0de {\"op\":\"put\",\"key\":";
    std::fs::write(&log, &damaged).unwrap();
    std::fs::write(dir.path().join("schedules.log.tmp"), "garbage").unwrap();
    let logs = tempfile::tempdir().unwrap();
    let (s, logged) = warnings(&logs.path().join("warnings.log"), || FileStore::open(dir.path()));
    let mut s = s.unwrap();
    assert_eq!(s.load().unwrap(), vec![c.clone()]);
    assert!(!dir.path().join("schedules.log.tmp").exists());
    // The damaged original was moved aside before the compaction, intact.
    let aside: Vec<std::path::PathBuf> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("schedules.log.damaged-"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(std::fs::read_to_string(&aside[0]).unwrap(), damaged);
    // What was skipped is logged: each line with its number and why, and
    // where the damaged original went.
    let torn = "0badc0de {\"op\":\"put\",\"key\":".len();
    let warned: Vec<&str> = logged.lines().collect();
    assert_eq!(warned.len(), 2, "{logged}");
    assert!(warned[0].contains("removing unfinished compaction file"), "{logged}");
    let skipped = format!(
        "skipped=2 lines=[\"line 1: checksum mismatch\", \"line 5: torn last line ({torn} bytes, no newline)\"]"
    );
    assert!(
        warned[1].contains("the schedule log has lines that cannot be read: moved aside")
            && warned[1].contains(&format!("kept={}", aside[0].display()))
            && warned[1].contains(&skipped),
        "{logged}"
    );
    s.put(&a.0, &a.1).unwrap();
    drop(s);
    let mut s = FileStore::open(dir.path()).unwrap();
    let mut want = vec![a, c];
    want.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(s.load().unwrap(), want);
}

#[test]
fn redis_record_matches_eventmq_v21() {
    use emq::scheduler::redis_store::{decode_record, encode_record};
    let record = ["default".to_string(), "guarantee".into(), "60".into(), BODY_1_2.into(), String::new()];
    let v21 = r#"["default", "guarantee", "60", "[\"run\", {\"callable\": \"add\", \"path\": \"jobs_mod\", \"args\": [1, 2], \"kwargs\": {}, \"class_args\": [], \"class_kwargs\": {}}]", ""]"#;
    let stored = Stored { record: record.clone(), runs_left: None, next_fire: None };
    assert_eq!(encode_record(&stored), v21);
    assert_eq!(decode_record(v21).unwrap(), stored);
    let counted = Stored {
        record: ["q".into(), "guarantee,run_count:3".into(), "5".into(), "[]".into(), "".into()],
        runs_left: Some(1),
        next_fire: None,
    };
    let text = encode_record(&counted);
    assert_eq!(text, r#"["q", "guarantee,run_count:1", "5", "[]", ""]"#);
    assert_eq!(decode_record(&text).unwrap().runs_left, Some(1));
    assert!(decode_record(r#"["a"]"#).is_err());
}

/// The job's next fire after a restart at `at`, restored from a record whose
/// stored next fire is `stored_next`, and how many times it fires at `at`.
fn restored(d: Definition, stored_next: Option<&str>, at: Now) -> (Timetable, Option<Now>, usize) {
    let mut tt = Timetable::new(Tz::UTC);
    tt.restore(d, None, stored_next.map(wall), at).unwrap();
    let fired = tt.fire_due(at).0.len();
    let n = next(&mut tt);
    (tt, n, fired)
}

#[test]
fn a_restored_interval_job_keeps_its_phase_and_makes_up_a_missed_run_once() {
    let at = t("2024-01-01T00:00:40Z");
    // Due at :30 and at :36 while down (every 6 s): one run at once, then every 6 s from it.
    let (mut tt, n, fired) = restored(def("q", "nohaste", "6", "[1]", ""), Some("2024-01-01T00:00:30Z"), at);
    assert_eq!((fired, n), (1, Some(t("2024-01-01T00:00:46Z"))), "nohaste plays no part in a restore");
    assert!(tt.fire_due(t("2024-01-01T00:00:45Z")).0.is_empty());
    assert_eq!(tt.fire_due(t("2024-01-01T00:00:46Z")).0.len(), 1);
    // Not yet due: at its stored time, not one interval after the restart.
    let (_, n, fired) = restored(def("q", "", "6", "[1]", ""), Some("2024-01-01T00:00:42Z"), at);
    assert_eq!((fired, n), (0, Some(t("2024-01-01T00:00:42Z"))));
    // A stored time more than an interval ahead (the wall clock went back
    // while down): no later than one interval from the restart.
    let (_, n, _) = restored(def("q", "", "6", "[1]", ""), Some("2024-01-01T01:00:00Z"), at);
    assert_eq!(n, Some(t("2024-01-01T00:00:46Z")));
    // Unknown (an older record): one interval from the restart, no run now.
    let (_, n, fired) = restored(def("q", "", "6", "[1]", ""), None, at);
    assert_eq!((fired, n), (0, Some(t("2024-01-01T00:00:46Z"))));
}

#[test]
fn a_restored_cron_job_makes_up_a_time_missed_while_down_once() {
    let at = t("2024-01-01T00:12:30Z");
    // Every 5 minutes; :05 and :10 passed while down: one run at once, then :15.
    let (mut tt, _, fired) = restored(def("q", "", "-1", "[1]", "*/5 * * * *"), Some("2024-01-01T00:05:00Z"), at);
    assert_eq!(fired, 1);
    assert_eq!(tt.list(at)[0].next_fire, wall("2024-01-01T00:15:00Z"));
    assert!(tt.fire_due(t("2024-01-01T00:14:59Z")).0.is_empty());
    assert_eq!(tt.fire_due(t("2024-01-01T00:15:00Z")).0.len(), 1);
    // Not yet due: its next time, no run now.
    let (tt, _, fired) = restored(def("q", "", "-1", "[1]", "*/5 * * * *"), Some("2024-01-01T00:15:00Z"), at);
    assert_eq!((fired, tt.list(at)[0].next_fire), (0, wall("2024-01-01T00:15:00Z")));
}

#[test]
fn every_run_stores_the_next_fire_and_the_file_store_keeps_it() {
    let mut tt = Timetable::new(Tz::UTC);
    let now = t("2024-01-01T00:00:00Z");
    let d = def("q", "nohaste", "6", "[1]", "");
    let key = d.key.clone();
    tt.schedule(d, now).unwrap();
    let (fires, changes) = tt.fire_due(plus(now, 6));
    assert_eq!(
        (fires.len(), changes),
        (1, vec![Change::Put(key.clone(), None)]),
        "an unlimited job's run is stored too"
    );
    assert_eq!(tt.next_of(&key, plus(now, 6)), Some(wall("2024-01-01T00:00:12Z")));
    let dir = tempfile::tempdir().unwrap();
    let record = ["q".to_string(), "nohaste".into(), "6".into(), body("[1]"), String::new()];
    let kept = Stored { record, runs_left: None, next_fire: Some(wall("2024-01-01T00:00:12.345Z")) };
    {
        let mut s = FileStore::open(dir.path()).unwrap();
        s.put(&key, &kept).unwrap();
        s.sync().unwrap();
    }
    let mut s = FileStore::open(dir.path()).unwrap();
    assert_eq!(s.load().unwrap(), vec![(key, kept)]);
}
