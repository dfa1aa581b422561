//! Interop acceptance tests: the real Python EventMQ 0.3.13 jobmanager,
//! client and emq-cli against the broker (project issue 2).
//!
//! The broker is `emq-router` unless `EMQ_INTEROP_ROUTER=python` points the
//! same tests at the Python reference router (see `common::router`). The
//! Python venv is created on first use by `tests/interop/setup-venv.sh`.
//! Every test runs under a watchdog and waits for states, never for times.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::common::interop::{begin, wait_schedulers, Setup};
use crate::common::{jobs, python, wait};

/// Queues of jobmanager A in the routing tests (weights as in the issue).
const QUEUES_A: &str = r#"[[10,"default"],[5,"email"]]"#;
/// Queues of jobmanager B.
const QUEUES_B: &str = r#"[[10,"reports"]]"#;
/// How long the exactly-once test keeps looking for duplicates after every
/// job has run once (a negative can only be checked over a window).
const DUPLICATE_WINDOW: Duration = Duration::from_secs(2);

#[test]
fn interop_thousand_jobs_run_exactly_once_on_the_right_jobmanager() {
    let _turn = begin("interop_thousand_jobs", Duration::from_secs(300));
    let started = Instant::now();
    let setup = Setup::start("interop-thousand", &[("A", QUEUES_A), ("B", QUEUES_B)], 2);
    let out = setup.dir.join("jobs.txt");
    let queues = ["default", "email", "reports", "no-such-queue"];
    let sent = python::send_jobs(&setup.dir, &setup.router.frontend, &out, 1000, &queues, "j", None);

    // Every job must run; then a settle pass so duplicates would show up.
    let all_ran = wait::until(Duration::from_secs(180), || jobs::by_tag(&jobs::read(&out), "run").len() >= sent.len());
    let ran = jobs::by_tag(&jobs::read(&out), "run");
    let missing: Vec<&str> = sent.iter().filter(|j| !ran.contains_key(&j.tag)).map(|j| j.tag.as_str()).collect();
    assert!(
        all_ran,
        "{} of {} jobs never ran, e.g. {:?}\n{}",
        missing.len(),
        sent.len(),
        &missing[..missing.len().min(10)],
        setup.logs()
    );
    // A duplicate (a job dispatched twice) would land within this window:
    // the jobs are quick and both jobmanagers are idle by now.
    std::thread::sleep(DUPLICATE_WINDOW);
    let ran = jobs::by_tag(&jobs::read(&out), "run");

    let expected: BTreeMap<&str, &str> =
        sent.iter().map(|j| (j.tag.as_str(), if j.queue == "reports" { "B" } else { "A" })).collect();
    let twice: Vec<_> = ran.iter().filter(|(_, on)| on.len() != 1).collect();
    assert!(twice.is_empty(), "jobs ran more than once: {twice:?}");
    let stray: Vec<_> = ran.keys().filter(|t| !expected.contains_key(t.as_str())).collect();
    assert!(stray.is_empty(), "unexpected job tags ran: {stray:?}");
    let wrong: Vec<_> =
        ran.iter().filter(|(tag, on)| on[0] != expected[tag.as_str()]).map(|(tag, on)| (tag, &on[0])).collect();
    assert!(
        wrong.is_empty(),
        "{} jobs ran on the wrong jobmanager, e.g. {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(10)]
    );
    assert_eq!(ran.len(), 1000);
    eprintln!(
        "interop_thousand_jobs: 1000 jobs exactly once in {:?} (router {:?})",
        started.elapsed(),
        setup.router.kind
    );
}

#[test]
fn interop_emq_cli_status_and_show_workers() {
    let _turn = begin("interop_emq_cli", Duration::from_secs(180));
    let started = Instant::now();
    let mut setup = Setup::start("interop-emq-cli", &[("A", QUEUES_A), ("B", QUEUES_B)], 2);
    let workers = setup.wait_workers(&[QUEUES_A, QUEUES_B], 2);
    let ids: BTreeSet<String> = workers.iter().map(|w| w.id.clone()).collect();

    let answers = python::emq_cli(&setup.dir, &setup.router.admin, &["status", "show_workers"]);
    let status = answers[0].as_object().unwrap_or_else(|| panic!("emq-cli status printed no dict: {}", answers[0]));
    for key in [
        "inflight_messages_by_queue",
        "latency_messages_by_queue",
        "max_latency_messages_by_queue",
        "waiting_messages_by_queue",
        "processed_messages_by_queue",
        "processed_messages_by_worker",
    ] {
        assert!(status.get(key).is_some_and(|v| v.is_object()), "status has no {key} dict: {}", answers[0]);
    }

    let shown = &answers[1];
    let connected = shown["connected_workers"]
        .as_object()
        .unwrap_or_else(|| panic!("show_workers printed no connected_workers dict: {shown}"));
    let shown_ids: BTreeSet<String> = connected.keys().cloned().collect();
    assert_eq!(shown_ids, ids, "emq-cli show_workers lists other workers than ROUTER_SHOW_WORKERS");
    for w in &workers {
        assert_eq!(connected[&w.id]["queues"], w.queues, "queues of worker {}", w.id);
        assert_eq!(connected[&w.id]["available_slots"], 2, "slots of worker {}", w.id);
    }
    let (a, b) = (&workers[0].id, &workers[1].id);
    assert_eq!(shown["connected_queues"]["default"], serde_json::json!([[10, a]]), "{shown}");
    assert_eq!(shown["connected_queues"]["email"], serde_json::json!([[5, a]]), "{shown}");
    assert_eq!(shown["connected_queues"]["reports"], serde_json::json!([[10, b]]), "{shown}");
    eprintln!("interop_emq_cli: ok in {:?} (router {:?})", started.elapsed(), setup.router.kind);
}

#[test]
fn interop_killed_jobmanager_in_flight_jobs_rerun_on_survivor() {
    let _turn = begin("interop_killed_jobmanager", Duration::from_secs(300));
    let started = Instant::now();
    let queues = r#"[[10,"default"]]"#;
    let mut setup = Setup::start("interop-kill", &[("A", queues)], 2);
    let out = setup.dir.join("jobs.txt");
    // A holds both slots; B registers afterwards and takes the rest.
    let sent = python::send_jobs(&setup.dir, &setup.router.frontend, &out, 8, &["default"], "slow", Some(3.0));
    let in_flight_on_a = || {
        let events = jobs::read(&out);
        let done: BTreeSet<String> =
            events.iter().filter(|e| e.event == "done" && e.jobmanager == "A").map(|e| e.tag.clone()).collect();
        events
            .iter()
            .filter(|e| e.event == "start" && e.jobmanager == "A" && !done.contains(&e.tag))
            .map(|e| e.tag.clone())
            .collect::<BTreeSet<String>>()
    };
    assert!(
        wait::until(Duration::from_secs(60), || !in_flight_on_a().is_empty()),
        "jobmanager A never started a job\n{}",
        setup.logs()
    );
    setup.jobmanagers[0].kill_group();
    let lost = in_flight_on_a();
    assert!(!lost.is_empty(), "no job was in flight on A when it was killed");
    setup.jobmanagers.push(python::start_jobmanager(&setup.dir, &setup.router.backend, "B", queues, 2));

    // Every job completes at least once; the ones A held complete on B.
    let done_all = || {
        let done = jobs::by_tag(&jobs::read(&out), "done");
        sent.iter().filter(|j| !done.contains_key(&j.tag)).map(|j| j.tag.clone()).collect::<Vec<_>>()
    };
    let finished = wait::until(Duration::from_secs(90), || done_all().is_empty());
    let done = jobs::by_tag(&jobs::read(&out), "done");
    assert!(
        finished,
        "jobs never completed: {:?} (in flight on A when killed: {lost:?})\n{}",
        done_all(),
        setup.logs()
    );
    for tag in &lost {
        assert!(
            done[tag].iter().any(|on| on == "B"),
            "job {tag} in flight on killed A did not rerun on B: {:?}",
            done[tag]
        );
    }
    eprintln!(
        "interop_killed_jobmanager: {} in-flight jobs re-ran on B, all 8 done in {:?} (router {:?})",
        lost.len(),
        started.elapsed(),
        setup.router.kind
    );
}

#[test]
fn interop_jobmanager_finishes_its_job_after_its_kbye_without_router_heartbeats() {
    // After a jobmanager's KBYE (SIGTERM) emq-router sends it no more
    // HEARTBEATs; the jobmanager, which no longer reads its socket then,
    // finishes the job it holds (over three heartbeat intervals), sends its
    // result and exits; the job completes once and is not requeued.
    let _turn = begin("interop_kbye_no_heartbeats", Duration::from_secs(120));
    let queues = r#"[[10,"default"]]"#;
    let mut setup = Setup::start("interop-kbye", &[("A", queues)], 1);
    let out = setup.dir.join("jobs.txt");
    let sent = python::send_jobs(&setup.dir, &setup.router.frontend, &out, 1, &["default"], "bye", Some(10.0));
    let tag = sent[0].tag.clone();
    let started = || jobs::by_tag(&jobs::read(&out), "start").contains_key(&tag);
    assert!(wait::until(Duration::from_secs(60), started), "the job never started\n{}", setup.logs());
    // SAFETY: plain syscall on our own, not yet reaped, child.
    unsafe { libc::kill(setup.jobmanagers[0].pid(), libc::SIGTERM) };
    let done = || jobs::by_tag(&jobs::read(&out), "done").get(&tag).map(Vec::len) == Some(1);
    assert!(wait::until(Duration::from_secs(30), done), "the job did not finish after the KBYE\n{}", setup.logs());
    let exited = wait::until(Duration::from_secs(15), || !setup.jobmanagers[0].is_alive());
    assert!(exited, "the jobmanager did not exit after its job\n{}", setup.logs());
    assert_eq!(setup.jobmanagers[0].exit_status().and_then(|s| s.code()), Some(0), "{}", setup.logs());
    if let crate::common::router::RouterKind::Rust(_) = setup.router.kind {
        let counters =
            || crate::common::admin::request(&setup.router.admin, "STATUS").map(|s| s["emq"]["counters"].clone());
        let completed = wait::until(Duration::from_secs(5), || counters().is_ok_and(|c| c["completed_jobs"] == 1));
        assert!(completed, "the result sent after the KBYE was not taken: {:?}\n{}", counters(), setup.logs());
        let c = counters().unwrap_or_default();
        assert_eq!((c["requeued_jobs"].as_u64(), c["retried_jobs"].as_u64()), (Some(0), Some(0)), "{c}");
    }
}

#[test]
fn interop_python_scheduler_schedule_and_unschedule() {
    let _turn = begin("interop_scheduler", Duration::from_secs(240));
    let started = Instant::now();
    let mut setup = Setup::start("interop-sched", &[("A", r#"[[10,"default"]]"#)], 2);
    setup.jobmanagers.push(python::start_scheduler(&setup.dir, &setup.router.frontend));
    if let Err(why) = wait_schedulers(&setup.router.admin, 1) {
        panic!("emq-scheduler did not register: {why}\n{}\n{}", setup.logs(), setup.jobmanagers[1].log_tail(20));
    }
    let out = setup.dir.join("sched.txt");
    let runs = || jobs::by_tag(&jobs::read(&out), "run").get("tick").map_or(0, Vec::len);

    python::schedule(&setup.dir, &setup.router.frontend, &out, "tick", 1);
    assert!(
        wait::until(Duration::from_secs(60), || runs() >= 3),
        "1 s interval job ran {} times\n{}",
        runs(),
        setup.logs()
    );
    python::unschedule(&setup.dir, &setup.router.frontend, &out, "tick");

    // A run already on its way may still land: wait until the count holds
    // still for 4 s (> 3 intervals), then check it holds for 4 s more.
    let mut last = (runs(), Instant::now());
    let settled = wait::until(Duration::from_secs(30), || {
        let now = runs();
        if now != last.0 {
            last = (now, Instant::now());
        }
        last.1.elapsed() >= Duration::from_secs(4)
    });
    assert!(settled, "job kept running after UNSCHEDULE ({} runs)", runs());
    let before = runs();
    wait::until(Duration::from_secs(4), || runs() != before);
    assert_eq!(runs(), before, "job ran again after UNSCHEDULE");
    eprintln!(
        "interop_scheduler: {before} runs, stopped after UNSCHEDULE, in {:?} (router {:?})",
        started.elapsed(),
        setup.router.kind
    );
}

/// Reads one line from a text-protocol connection.
fn text_line(reader: &mut impl std::io::BufRead) -> String {
    let mut line = String::new();
    reader.read_line(&mut line).expect("text protocol answer");
    line
}

#[test]
fn interop_text_sched_runs_on_a_python_jobmanager() {
    let _turn = begin("interop_text_to_python", Duration::from_secs(180));
    let mut setup = Setup::start("interop-text-sched", &[("T", r#"[[10,"textq"]]"#)], 2);
    assert!(!setup.router.is_python(), "the Python router has no text protocol: run this test against emq-router");
    let text = setup.router.wait_text();
    let out = setup.dir.join("text-jobs.txt");
    let out_json = serde_json::to_string(&out.to_string_lossy()).unwrap();
    let mut stream = std::net::TcpStream::connect(&text).expect("text port");
    let tags: Vec<String> = (0..5).map(|i| format!("text-{i}")).collect();
    for tag in &tags {
        let body = format!(
            r#"["run", {{"callable": "record", "path": "emq_interop_jobs", "args": [{out_json}, "{tag}"], "kwargs": {{}}, "class_args": [], "class_kwargs": {{}}}}]"#
        );
        std::io::Write::write_all(&mut stream, format!("SCHED {body}@textq\n").as_bytes()).unwrap();
    }
    std::io::Write::write_all(&mut stream, b"END\n").unwrap();
    let ran = wait::until(Duration::from_secs(60), || {
        let runs = jobs::by_tag(&jobs::read(&out), "run");
        tags.iter().all(|t| runs.get(t).is_some_and(|v| v.len() == 1))
    });
    assert!(ran, "text-SCHEDed EventMQ jobs did not each run once: {:?}\n{}", jobs::read(&out), setup.logs());
}

#[test]
fn interop_python_request_is_offered_to_ask() {
    let _turn = begin("interop_python_to_text", Duration::from_secs(180));
    let mut setup = Setup::start("interop-text-ask", &[], 1);
    assert!(!setup.router.is_python(), "the Python router has no text protocol: run this test against emq-router");
    let text = setup.router.wait_text();
    let out = setup.dir.join("unused.txt");
    let sent = python::send_jobs(&setup.dir, &setup.router.frontend, &out, 3, &["default"], "ask", None);
    let stream = std::net::TcpStream::connect(&text).expect("text port");
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    let mut offered = Vec::new();
    for _ in 0..sent.len() {
        std::io::Write::write_all(&mut writer, b"ASK default\n").unwrap();
        let line = text_line(&mut reader);
        let body = line.strip_prefix("WANT? ").unwrap_or_else(|| panic!("expected WANT?, got {line:?}"));
        let job: serde_json::Value =
            serde_json::from_str(body.trim_end()).expect("the offered data is the REQUEST body");
        assert_eq!(job[0], "run");
        assert_eq!(job[1]["path"], "emq_interop_jobs");
        offered.push(job[1]["args"][1].as_str().unwrap_or_default().to_string());
        std::io::Write::write_all(&mut writer, b"ACK\n").unwrap();
    }
    std::io::Write::write_all(&mut writer, b"ASK default\n").unwrap();
    assert_eq!(text_line(&mut reader), "NOPE\n");
    let want: Vec<String> = sent.iter().map(|s| s.tag.clone()).collect();
    assert_eq!(offered, want, "every Python REQUEST offered once, in order");
}
