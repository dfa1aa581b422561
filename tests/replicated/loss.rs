//! The router's machine lost while jobs flow: an eMQP producer (emq's
//! client library) and a text producer (`SCHED`, then `ASK probe`, whose
//! `NOPE` carries the promise) send numbered jobs to `sh`, served by
//! `emq-worker`, and every [`PY_EVERY`]th to `py`, served by the real
//! Python EventMQ jobmanager
//! (only where the interop venv exists: else everything goes to `sh`, and
//! one line says so). Each job runs [`JOB_SECS`] and its consumer appends a
//! `start` and a `done` line. Then the router is `kill -9`ed, its data
//! directory deleted, and a new router with the same name started on other
//! ports (it waits for the killed router's lease to expire), with new
//! consumers pointed at it. Checked:
//!
//! * every job whose acknowledgement a producer received is delivered at
//!   least once;
//! * nothing is delivered that was not sent;
//! * a job is delivered at most once by each router, and again by the new
//!   one only if it was **in flight at the kill**: running then, or ended
//!   less than [`DONE_MARGIN`] before it (its completion's record may not
//!   have been stored yet). So the duplicates are at most the jobs in
//!   flight at the kill, which the test counts and prints, with the jobs
//!   running then (at most the consumers' slots).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use emq::client::emqp::{Client, Outcome};
use serde_json::json;

use super::{setup, Setup};
use crate::common::jobs::{self, JobEvent};
use crate::common::proc::Child;
use crate::common::{admin, python, wait};
use crate::durability::{read_line, text_conn, Node};

/// How long each job runs on its consumer (seconds): long against a
/// PubAck (milliseconds), so a slot finishes few jobs whose completion the
/// store has not confirmed when the router dies.
const JOB_SECS: f64 = 0.1;
/// `emq-worker`'s slots (`-J`).
const SH_SLOTS: u32 = 4;
/// The jobmanager's slots.
const PY_SLOTS: u32 = 2;
/// A job that ended less than this before the kill (seconds) was in flight
/// at it: its `Done` record may not have been stored. A PubAck takes
/// milliseconds, but the Python jobmanager sends a result up to about a
/// second after its job ended (EventMQ's worker loop); this allows for
/// that on a loaded machine.
const DONE_MARGIN: f64 = 3.0;
/// Pause between two jobs of one producer: the consumers keep up.
const SEND_PAUSE: Duration = Duration::from_millis(40);
/// Every this many jobs of a producer one goes to `py`: the jobmanager
/// takes about a second a job (EventMQ's worker loop), `emq-worker` a
/// tenth of that.
const PY_EVERY: usize = 8;
/// The eMQP producer's wait for an acceptance.
const ACK_TIMEOUT: Duration = Duration::from_secs(2);
/// Acknowledged jobs before the kill.
const ACKED_BEFORE_KILL: usize = 60;
/// How long the flow may take to reach that, and the new router to
/// deliver everything.
const FLOW_BOUND: Duration = Duration::from_secs(60);

/// What the producers sent and had acknowledged.
#[derive(Default)]
struct Ledger {
    sent: BTreeSet<String>,
    acked: BTreeSet<String>,
}

type Shared = Arc<Mutex<Ledger>>;

fn lock(l: &Shared) -> std::sync::MutexGuard<'_, Ledger> {
    l.lock().unwrap_or_else(|e| e.into_inner())
}

/// Where the jobs write, and which queues there are.
#[derive(Clone)]
struct Jobs {
    /// `emq-worker`'s lines.
    sh_out: PathBuf,
    /// The jobmanager's lines.
    py_out: PathBuf,
    /// Whether every [`PY_EVERY`]th job goes to `py` (the Python part).
    py: bool,
}

impl Jobs {
    /// Job `n` of `producer`: its queue, tag and body (the tag for `sh`, a
    /// Python call of `emq_interop_jobs.slow` for `py`).
    fn job(&self, producer: char, n: usize) -> (&'static str, String, String) {
        let queue = if self.py && n.is_multiple_of(PY_EVERY) { "py" } else { "sh" };
        let tag = format!("{producer}{n:05}-{queue}");
        let body = match queue {
            "py" => json!(["run", {"callable": "slow", "path": "emq_interop_jobs",
                "args": [self.py_out, tag, JOB_SECS], "kwargs": {}, "class_args": [], "class_kwargs": {}}])
            .to_string(),
            _ => tag.clone(),
        };
        (queue, tag, body)
    }

    /// Every line both consumers' jobs wrote.
    fn events(&self) -> Vec<JobEvent> {
        let mut all = jobs::read(&self.sh_out);
        all.extend(jobs::read(&self.py_out));
        all
    }
}

/// REQUESTs one job at a time, each acknowledged or not within
/// [`ACK_TIMEOUT`], until `stop`.
fn emqp_producer(frontend: String, jobs: Jobs, ledger: Shared, stop: Arc<AtomicBool>) {
    let mut client = Client::connect(&frontend).expect("a client").with_timeout(ACK_TIMEOUT);
    for n in 0.. {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let (queue, tag, body) = jobs.job('e', n);
        lock(&ledger).sent.insert(tag.clone());
        match client.request(queue, "", body.as_bytes()) {
            Ok(Outcome::Accepted { .. }) => {
                lock(&ledger).acked.insert(tag);
            }
            Ok(Outcome::Rejected { code, .. }) => panic!("{tag} refused: {code}"),
            Ok(Outcome::Unknown { .. }) | Err(_) => {}
        }
        std::thread::sleep(SEND_PAUSE);
    }
}

/// SCHEDs one task at a time, each followed by `ASK probe`: its `NOPE`
/// acknowledges the task. Until `stop` or the connection breaks.
fn text_producer(text: String, jobs: Jobs, ledger: Shared, stop: Arc<AtomicBool>) {
    let (mut w, mut r) = text_conn(&text).expect("a text connection");
    for n in 0.. {
        let (queue, tag, body) = jobs.job('t', n);
        lock(&ledger).sent.insert(tag.clone());
        if w.write_all(format!("SCHED {body}@{queue}\nASK probe\n").as_bytes()).is_err() {
            return;
        }
        match read_line(&mut r, &stop).as_deref() {
            Some("NOPE") => lock(&ledger).acked.insert(tag),
            Some(other) => panic!("{tag}: the text producer got {other:?}"),
            None => return,
        };
        std::thread::sleep(SEND_PAUSE);
    }
}

/// The job script of `emq-worker`: a `start` line, [`JOB_SECS`], a `done`
/// line, in the jobs file's format (`tests/common/jobs.rs`).
fn script(dir: &Path) -> PathBuf {
    let path = dir.join("job.sh");
    let record = r#"record() { printf '%s %s %s %s %s\n' "$1" "$p" "$$" "$LABEL" "$(date +%s.%N)" >> "$OUT"; }"#;
    let body = format!("#!/bin/sh\np=$(cat)\n{record}\nrecord start\nsleep {JOB_SECS}\nrecord done\necho ok\n");
    std::fs::write(&path, body).expect("write the job script");
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    path
}

/// The consumers of one router: `emq-worker` on `sh` and, with the Python
/// part, a jobmanager on `py`, both labelled `label` in the jobs files.
struct Consumers {
    worker: Child,
    jobmanager: Option<Child>,
}

impl Consumers {
    /// Starts them against `node` and waits until the router lists them
    /// (with every slot free when `idle`: no job waits for them yet).
    fn start(s: &Setup, node: &Node, jobs: &Jobs, label: &str, idle: bool) -> Consumers {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_emq-worker"));
        cmd.args(["-B", &node.backend(), "-Q", "sh", "-J", &SH_SLOTS.to_string()])
            .args(["--stats-interval", "0s", "--drain-timeout", "1s", "--"])
            .arg(script(&s.dir.path))
            .env("OUT", &jobs.sh_out)
            .env("LABEL", format!("sh{label}"));
        let worker =
            Child::spawn(&format!("emq-worker-{label}"), &mut cmd, &s.dir.join(&format!("worker-{label}.log")));
        let jobmanager =
            jobs.py.then(|| python::start_jobmanager(&s.dir, &node.backend(), label, r#"[[10,"py"]]"#, PY_SLOTS));
        let slots = i64::from(SH_SLOTS) + jobmanager.as_ref().map_or(0, |_| i64::from(PY_SLOTS));
        let admin_addr = node.admin();
        let registered = wait::until_ok(crate::common::interop::REGISTER_TIMEOUT, || {
            let listed = admin::workers(&admin_addr)?;
            let free: i64 = listed.iter().map(|w| w.available_slots).sum();
            if (free == slots || !idle) && listed.len() == 1 + usize::from(jobmanager.is_some()) {
                Ok(())
            } else {
                Err(format!("workers: {listed:?}"))
            }
        });
        let consumers = Consumers { worker, jobmanager };
        registered.unwrap_or_else(|why| panic!("the consumers did not register: {why}\n{}", consumers.logs()));
        consumers
    }

    /// Stops them: `emq-worker` lets its running jobs end (its router is
    /// gone, so it cannot say so), the jobmanager is killed with its
    /// worker processes.
    fn stop(mut self) {
        self.worker.terminate(Duration::from_secs(10));
        if let Some(mut jm) = self.jobmanager.take() {
            jm.kill_group();
        }
    }

    fn logs(&self) -> String {
        let mut all = vec![self.worker.log_tail(15)];
        all.extend(self.jobmanager.iter().map(|jm| jm.log_tail(15)));
        all.join("\n")
    }
}

/// Whether the Python part runs: the interop venv exists (under CI it is
/// made if it does not); else one line says why not.
fn python_part(test: &str) -> bool {
    let venv = std::env::var_os("EMQ_VENV").map(PathBuf::from).unwrap_or_else(|| python::project_root().join(".venv"));
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    if venv.join(".emq-interop-stamp").is_file() || ci {
        python::venv();
        return true;
    }
    eprintln!(
        "{test}: the Python jobmanager part skipped: no interop venv at {} (bash tests/interop/setup-venv.sh)",
        venv.display()
    );
    false
}

/// The producers' threads.
struct Producers {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Producers {
    fn start(node: &Node, jobs: &Jobs, ledger: &Shared) -> Producers {
        let stop = Arc::new(AtomicBool::new(false));
        let (fe, j, l, st) = (node.frontend(), jobs.clone(), ledger.clone(), stop.clone());
        let emqp = std::thread::spawn(move || emqp_producer(fe, j, l, st));
        let (text, j, l, st) = (node.text(), jobs.clone(), ledger.clone(), stop.clone());
        let text = std::thread::spawn(move || text_producer(text, j, l, st));
        Producers { stop, threads: vec![emqp, text] }
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            if let Err(e) = t.join() {
                std::panic::resume_unwind(e);
            }
        }
    }
}

fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

#[test]
fn replicated_router_loss_delivers_every_acknowledged_job_from_the_streams_alone() {
    let test = "loss";
    // First: under CI the venv may be made here, outside the time limit.
    let py = python_part(test);
    let Some(s) = setup(test, 180) else { return };
    let jobs = Jobs { sh_out: s.dir.join("sh-jobs.txt"), py_out: s.dir.join("py-jobs.txt"), py };
    let ledger: Shared = Arc::default();
    let a = s.node("router-a");
    let mut router = s.start(&a, &[]);
    let t0 = Instant::now();
    let consumers = Consumers::start(&s, &a, &jobs, "A", true);
    eprintln!("{test}: consumers registered after {:?}", t0.elapsed());
    let producers = Producers::start(&a, &jobs, &ledger);
    let flowing = wait::until(FLOW_BOUND, || {
        let started = jobs::by_tag(&jobs.events(), "start");
        let on = |label: &str| started.values().filter(|l| l.iter().any(|x| x == label)).count();
        lock(&ledger).acked.len() >= ACKED_BEFORE_KILL && on("shA") >= 5 && (!py || on("A") >= 2)
    });
    assert!(flowing, "jobs did not flow: {} acked\n{}", lock(&ledger).acked.len(), consumers.logs());

    eprintln!("{test}: flowing, the kill {:?} after the consumers' start", t0.elapsed());
    let killed_at = unix_now();
    let killed = Instant::now();
    router.kill_group();
    producers.stop();
    let _ = std::fs::remove_dir_all(&a.data);
    assert!(!a.data.exists(), "the data directory is gone");
    let (sent, acked) = {
        let l = lock(&ledger);
        (l.sent.clone(), l.acked.clone())
    };
    eprintln!("{test}: killed with {} jobs sent, {} acknowledged", sent.len(), acked.len());

    // At once: the killed router's lease has not expired yet.
    let b = s.node("router-b");
    let _router = s.start(&b, &[]);
    eprintln!(
        "{test}: the new router listened {:?} after the kill (it waits for the lease, {:?})",
        killed.elapsed(),
        super::LEASE
    );
    consumers.stop();
    eprintln!("{test}: the old consumers stopped {:?} after the kill", killed.elapsed());
    let consumers = Consumers::start(&s, &b, &jobs, "B", false);
    eprintln!("{test}: the new consumers registered {:?} after the kill", killed.elapsed());
    let delivered = wait::until(FLOW_BOUND, || {
        let status = b.status();
        let started = jobs::by_tag(&jobs.events(), "start");
        acked.iter().all(|t| started.contains_key(t))
            && status["waiting_messages_by_queue"] == json!({})
            && status["inflight_messages_by_queue"] == json!({})
    });
    eprintln!("{test}: everything delivered {:?} after the kill", killed.elapsed());
    consumers.stop();
    let events = jobs.events();
    let started = jobs::by_tag(&events, "start");
    let lost: Vec<&String> = acked.iter().filter(|t| !started.contains_key(*t)).collect();
    assert!(lost.is_empty(), "{} acknowledged jobs never delivered: {lost:?}", lost.len());
    assert!(delivered, "not drained: {}", b.status());
    let stray: Vec<&String> = started.keys().filter(|t| !sent.contains(*t)).collect();
    assert!(stray.is_empty(), "delivered, never sent: {stray:?}");
    check_duplicates(test, &events, killed_at, &started);
}

/// The module docs' rule on duplicates: at most one delivery per router,
/// and a second only for a job in flight at the kill.
fn check_duplicates(test: &str, events: &[JobEvent], killed_at: f64, started: &BTreeMap<String, Vec<String>>) {
    let before = |label: &String| label.ends_with('A');
    let done_at: BTreeMap<(&str, &str), f64> = events
        .iter()
        .filter(|e| e.event == "done")
        .map(|e| ((e.tag.as_str(), e.jobmanager.as_str()), e.time))
        .collect();
    let mut in_flight = BTreeSet::new();
    let mut running = 0;
    for e in events.iter().filter(|e| e.event == "start" && before(&e.jobmanager)) {
        let ended = done_at.get(&(e.tag.as_str(), e.jobmanager.as_str())).copied();
        if ended.is_none_or(|t| t >= killed_at - DONE_MARGIN) {
            in_flight.insert(e.tag.clone());
        }
        running += usize::from(ended.is_none_or(|t| t >= killed_at));
    }
    let mut duplicates = BTreeMap::new();
    for (tag, on) in started.iter().filter(|(_, on)| on.len() > 1) {
        let first = on.iter().filter(|l| before(l)).count();
        assert!(first <= 1 && on.len() - first <= 1, "{tag} delivered twice by one router: {on:?}");
        assert!(in_flight.contains(tag), "{tag} delivered again ({on:?}) but was not in flight at the kill");
        // When its first run ended, in seconds after the kill (none: running).
        let ended = on.iter().find(|l| before(l)).and_then(|l| done_at.get(&(tag.as_str(), l.as_str())));
        duplicates.insert(tag, ended.map(|t| format!("{:+.2}", t - killed_at)));
    }
    let slots = SH_SLOTS + PY_SLOTS;
    eprintln!(
        "{test}: {} jobs delivered, {} of them twice; in flight at the kill: {} (running then: {running}, slots \
         {slots}); the twice delivered, with the end of their first run after the kill: {duplicates:?}",
        started.len(),
        duplicates.len(),
        in_flight.len()
    );
    assert!(duplicates.len() <= in_flight.len());
    assert!(running <= slots as usize, "{running} jobs running at once on {slots} slots");
}
