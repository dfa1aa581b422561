//! Point 8: refusals reach the sender. What the router or the scheduler
//! refuses about a SCHEDULE/UNSCHEDULE comes back to the client that sent
//! it, `emq-cli schedule` prints it and exits non-zero, and the README's
//! schedule examples work as written.

use std::process::Command;
use std::time::Duration;

use super::schedules::Sched;
use crate::common::proc::{run, TestDir};
use crate::emqp_router::{config, eventually, Peer, Watchdog};

/// Runs `emq-cli` with `args` against the router's frontend and the
/// scheduler's admin socket; returns (exit code, stdout, stderr).
fn emq_cli(dir: &TestDir, frontend: &str, sched_admin: &str, args: &[&str]) -> (i32, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_emq-cli"));
    cmd.args(args).env("EMQ_FRONTEND_ADDR", frontend).env("EMQ_SCHEDULER_ADMIN_ADDR", sched_admin);
    let (status, out, err) = run("emq-cli", &mut cmd, &dir.path, Duration::from_secs(30));
    let code = status.and_then(|s| s.code()).unwrap_or(-1);
    (code, out, err)
}

fn router_and_scheduler(dir: &TestDir) -> (emq::router::RouterHandle, Sched) {
    let h = emq::router::start(config(1, |r| {
        r.heartbeat_interval = Some("300ms".into());
        r.heartbeat_timeout = Some("1500ms".into());
    }))
    .expect("router starts");
    let sched = Sched::start(dir, &h.endpoints.frontend, &dir.join("data"), "scheduler");
    eventually(30, "scheduler registered", || {
        crate::common::admin::admin(&h, "ROUTER_SHOW_SCHEDULERS")["connected_schedulers"]
            .as_object()
            .is_some_and(|m| m.len() == 1)
    });
    (h, sched)
}

#[test]
fn emq_cli_schedule_with_a_bad_cron_exits_non_zero_with_the_schedulers_reason() {
    let _w = Watchdog::new("emq_cli_bad_cron", 90);
    let dir = TestDir::new("exact-cli-bad-cron");
    let (h, sched) = router_and_scheduler(&dir);
    let fe = h.endpoints.frontend.clone();
    // A cron the scheduler's rules reject (the router applies them for it).
    let (code, out, err) =
        emq_cli(&dir, &fe, &sched.admin, &["schedule", "q", "--cron", "61 * * * *", "--callable", "m.f"]);
    // One line, on stderr (stdout carries the answer only with --json).
    assert_eq!(code, 1, "stdout {out}\nstderr {err}");
    assert_eq!(out, "", "{err}");
    assert!(err.starts_with("emq-cli: SCHEDULE ") && err.contains(" refused: "), "{err}");
    assert!(err.contains("BAD_CRON frame 8: bad cron expression \"61 * * * *\""), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    // A date that never comes: only the scheduler finds out, and its ERROR
    // comes back through the router.
    let (code, out, err) =
        emq_cli(&dir, &fe, &sched.admin, &["schedule", "q", "--cron", "0 0 30 2 *", "--callable", "m.f"]);
    assert_eq!(code, 1, "{out}");
    assert!(err.contains("BAD_CRON frame 8: bad cron expression \"0 0 30 2 *\""), "{err}");
    assert!(sched.child.log_text().contains("rejected message"), "the scheduler refused it itself");
    // Accepted, with the scheduler's outcome.
    let (code, out, _) =
        emq_cli(&dir, &fe, &sched.admin, &["schedule", "q", "--cron", "0 0 29 2 *", "--callable", "m.f"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("SCHEDULE accepted ") && out.contains(r#""outcome":"added""#), "{out}");
    let counters = &crate::common::admin::admin(&h, "STATUS")["emq"]["counters"];
    assert_eq!(
        (counters["rejected_schedule_invalid"].as_u64(), counters["scheduler_errors"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(counters["schedule_answers_forwarded"], 2, "{counters}");
}

#[test]
fn malformed_schedules_get_an_error_naming_the_frame() {
    let _w = Watchdog::new("malformed_schedules", 30);
    let h = crate::emqp_router::router(1);
    let s = Peer::new(&h.endpoints.frontend, b"a-scheduler");
    s.send(&[b"", b"eMQP/1.0", b"INFORM", b"i", b"", b"scheduler"]);
    s.expect("ACK");
    let c = Peer::new(&h.endpoints.frontend, b"a-client");
    let body = String::from_utf8(super::schedules::body(1)).expect("utf-8");
    c.send(&[b"", b"eMQP/1.0", b"SCHEDULE", b"short", b"q", b"", b"60", body.as_bytes()]);
    let e = c.expect("ERROR");
    assert_eq!((e[4].as_slice(), e[5].as_slice()), (&b"short"[..], &b"BAD_FRAMES"[..]));
    assert_eq!(String::from_utf8_lossy(&e[6]), "frame 8: SCHEDULE needs the cron expression (message has 8 frames)");
    c.send(&[b"", b"eMQP/1.0", b"SCHEDULE", b"both", b"q", b"", b"60", body.as_bytes(), b"* * * * *"]);
    let e = c.expect("ERROR");
    assert_eq!((e[4].as_slice(), e[5].as_slice()), (&b"both"[..], &b"BAD_SCHEDULE"[..]));
    assert!(String::from_utf8_lossy(&e[6]).starts_with("frames 6 and 8: both an interval"), "{e:?}");
    s.expect_none("SCHEDULE", 300);
}

/// Splits a shell command line the way `sh` would for the README's simple
/// lines: words, `'…'` and `"…"` quoting, and a `#` comment after a space.
fn shell_words(line: &str) -> Vec<String> {
    let (mut words, mut word, mut quote, mut in_word) = (Vec::new(), String::new(), None, false);
    for ch in line.chars() {
        match (quote, ch) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(ch);
                in_word = true;
            }
            (None, '#') if !in_word => break,
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

/// The README's `emq-cli schedule …`, `unschedule …` and `schedules`
/// commands, each once, in order: whole lines (the walkthrough) and
/// `` `…` `` spans in the text.
fn readme_schedule_commands(readme: &str) -> Vec<String> {
    let is_command = |c: &str| {
        c == "emq-cli schedules" || c.starts_with("emq-cli schedule ") || c.starts_with("emq-cli unschedule ")
    };
    let mut found: Vec<String> = Vec::new();
    for line in readme.lines() {
        let spans = line.split('`').skip(1).step_by(2);
        for command in std::iter::once(line.trim()).chain(spans) {
            if is_command(command) && !found.iter().any(|f| f == command) {
                found.push(command.to_string());
            }
        }
    }
    found
}

#[test]
fn the_readme_schedule_examples_run_as_written() {
    let _w = Watchdog::new("readme_schedule_examples", 90);
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).expect("README");
    // Run in this order (the README mentions `emq-cli schedules` early too).
    let lines = [
        "emq-cli schedule default --every 60s --callable mymod.report",
        "emq-cli schedule email --cron '*/5 * * * *' --headers nohaste --callable mymod.digest",
        "emq-cli schedules",
        "emq-cli unschedule default --callable mymod.report",
    ];
    let mut found = readme_schedule_commands(&readme);
    found.sort();
    let mut want = lines.map(String::from).to_vec();
    want.sort();
    assert_eq!(found, want, "the README's schedule examples");
    let dir = TestDir::new("exact-readme-schedules");
    let (h, sched) = router_and_scheduler(&dir);
    let mut outputs = Vec::new();
    for line in &lines {
        let words = shell_words(line);
        let args: Vec<&str> = words[1..].iter().map(String::as_str).collect();
        let (code, out, err) = emq_cli(&dir, &h.endpoints.frontend, &sched.admin, &args);
        assert_eq!(code, 0, "{line}\nstdout {out}\nstderr {err}");
        outputs.push(out);
    }
    assert!(outputs[0].starts_with("SCHEDULE accepted") && outputs[0].contains(r#""outcome":"added""#), "{outputs:?}");
    assert!(outputs[1].starts_with("SCHEDULE accepted") && outputs[1].contains(r#""outcome":"added""#), "{outputs:?}");
    assert!(outputs[2].contains("mymod") || outputs[2].contains("email"), "schedules lists them: {}", outputs[2]);
    assert!(outputs[3].starts_with("UNSCHEDULE accepted") && outputs[3].contains("unscheduled"), "{outputs:?}");
    assert_eq!(sched.keys().len(), 1, "the cron schedule remains");
}

#[test]
fn shell_words_split_like_sh() {
    assert_eq!(
        shell_words(r#"emq-cli schedule email --cron '*/5 * * * *' --args '["x"]'   # note"#),
        ["emq-cli", "schedule", "email", "--cron", "*/5 * * * *", "--args", r#"["x"]"#]
    );
}

#[test]
fn requests_and_informs_dropped_unread_are_answered_about_their_msgid() {
    // The kind: whatever the router cannot read (frames missing, more than
    // 64) still gets an answer when it is a command that expects one and
    // names its msgid; other commands are only counted (docs/emqp.md "ERROR").
    let _w = Watchdog::new("unreadable_answered", 30);
    let h = crate::emqp_router::router(2);
    let c = Peer::new(&h.endpoints.frontend, b"a-client");
    let error_of = |e: &Vec<Vec<u8>>| {
        (
            String::from_utf8_lossy(&e[4]).into_owned(),
            String::from_utf8_lossy(&e[5]).into_owned(),
            String::from_utf8_lossy(&e[6]).into_owned(),
        )
    };
    let head: [&[u8]; 7] = [b"", b"eMQP/1.0", b"REQUEST", b"many", b"q", b"", b"body"];
    // 64 frames with the identity: accepted, extras and all.
    let mut frames: Vec<&[u8]> = head.to_vec();
    frames[3] = b"most";
    frames.resize(63, b"x");
    c.send(&frames);
    assert_eq!(c.expect("REPLY")[4], b"most");
    // One more: refused, about its msgid.
    frames[3] = b"many";
    frames.push(b"x");
    for command in [&b"REQUEST"[..], b"SCHEDULE", b"UNSCHEDULE"] {
        frames[2] = command;
        c.send(&frames);
        let why = "the message has 65 frames; at most 64 are accepted".to_string();
        assert_eq!(error_of(&c.expect("ERROR")), ("many".into(), "BAD_FRAMES".into(), why));
    }
    // Frames missing.
    c.send(&[b"", b"eMQP/1.0", b"REQUEST", b"short", b"q"]);
    let (msgid, code, why) = error_of(&c.expect("ERROR"));
    assert_eq!((msgid.as_str(), code.as_str()), ("short", "BAD_FRAMES"));
    assert!(why.starts_with("frame 5: REQUEST needs"), "{why}");
    let w = Peer::new(&h.endpoints.backend, b"a-worker");
    w.send(&[b"", b"eMQP/1.0", b"INFORM", b"inf"]);
    let (msgid, code, why) = error_of(&w.expect("ERROR"));
    assert_eq!((msgid.as_str(), code.as_str()), ("inf", "BAD_INFORM"));
    assert!(why.starts_with("frame 4: INFORM needs"), "{why}");
    // A worker's READY with too many frames: counted, not answered.
    let mut ready: Vec<&[u8]> = vec![b"", b"eMQP/1.0", b"READY", b"r1"];
    ready.resize(70, b"x");
    w.send(&ready);
    w.expect_none("ERROR", 300);
    let counters = &crate::common::admin::admin(&h, "STATUS")["emq"]["counters"];
    assert_eq!((counters["malformed_frontend"].as_u64(), counters["malformed_backend"].as_u64()), (Some(4), Some(2)));
    assert_eq!(counters["rejected_schedule_invalid"], 2, "{counters}");
    // The router goes on.
    c.send(&head);
    assert_eq!(c.expect("REPLY")[4], b"many");
}
