//! The README walkthrough, run as the README writes it, on fresh ports:
//! once with only the README's variables set, once with the same addresses
//! as flags instead. Every step's output is checked.
//!
//! Each step is a line (or the heredoc) copied from README.md, and the test
//! first checks that README.md still holds it word for word; the test waits
//! between steps for what a person at a terminal would wait for (the worker
//! registered, the scheduler connected).

use std::path::Path;
use std::process::{Command, ExitStatus};
use std::time::Duration;

use serde_json::Value;

use crate::common::ports::{free_port, is_listening, zmq_endpoint};
use crate::common::proc::{self, Child, TestDir};
use crate::common::{wait, watchdog};

const README: &str = include_str!("../README.md");

/// The walkthrough's variables, as the README exports them.
const EXPORT: &str =
    "export EMQ_FRONTEND_ADDR=tcp://127.0.0.1:47291 EMQ_BACKEND_ADDR=tcp://127.0.0.1:47290 \\\n       \
                      EMQ_ADMIN_ADDR=tcp://127.0.0.1:47293 EMQ_TEXT_ADDR=127.0.0.1:47294 \\\n       \
                      EMQ_SCHEDULER_ADMIN_ADDR=tcp://127.0.0.1:47295 EMQ_METRICS_ADDR=127.0.0.1:47296";
const ROUTER: &str = "emq-router --data-dir \"$dir/router\" &";
const SCRIPT: &str = "cat > \"$dir/handle-job.sh\" <<'EOF'\n#!/bin/sh\npayload=$(cat)\n\
                      echo \"handled: $payload\" >> \"$(dirname \"$0\")/jobs.log\"\necho \"ok\"\nEOF\n\
                      chmod +x \"$dir/handle-job.sh\"";
const WORKER: &str = "emq-worker --queue email:10 --queue default:1 --concurrency 4 -- \"$dir/handle-job.sh\" &";
const REQUESTS: [&str; 2] = ["emq-cli request default '{\"to\": \"a@b.c\"}'", "emq-cli request email 'hello'"];
const SCHED: &str = "emq-cli sched 'hello from text' --queue email";
const RAW_SCHED: &str = "exec 3<>\"/dev/tcp/${EMQ_TEXT_ADDR%:*}/${EMQ_TEXT_ADDR##*:}\"; \
                         printf 'SCHED hello again@email\\nEND\\n' >&3; exec 3>&-";
const SCHEDULER: &str = "emq-scheduler --data-dir \"$dir/schedules\" &";
const SCHEDULES: [&str; 2] = [
    "emq-cli schedule default --every 60s --callable mymod.report",
    "emq-cli schedule email --cron '*/5 * * * *' --headers nohaste --callable mymod.digest",
];
const LIST: &str = "emq-cli schedules";
const WATCH: [&str; 4] = ["emq-cli status", "emq-cli workers", "emq-cli latency", "cat \"$dir/jobs.log\""];

/// How the addresses are given.
#[derive(Clone, Copy, PartialEq)]
enum Given {
    Variables,
    Flags,
}

/// One run of the walkthrough: its directory, addresses and processes.
struct Walk {
    dir: TestDir,
    given: Given,
    bin: String,
    frontend: String,
    backend: String,
    admin: String,
    text: String,
    scheduler_admin: String,
    metrics: String,
    children: Vec<Child>,
}

impl Walk {
    fn new(given: Given) -> Walk {
        let name = if given == Given::Flags { "walkthrough-flags" } else { "walkthrough-vars" };
        let bin = Path::new(env!("CARGO_BIN_EXE_emq-cli")).parent().expect("target dir").display().to_string();
        Walk {
            dir: TestDir::new(name),
            given,
            bin,
            frontend: zmq_endpoint(free_port()),
            backend: zmq_endpoint(free_port()),
            admin: zmq_endpoint(free_port()),
            text: format!("127.0.0.1:{}", free_port()),
            scheduler_admin: zmq_endpoint(free_port()),
            metrics: format!("127.0.0.1:{}", free_port()),
            children: Vec::new(),
        }
    }

    /// `line` with the addresses as flags after the program's name, in
    /// flags mode; as written otherwise.
    fn line(&self, line: &str) -> String {
        if self.given == Given::Variables {
            return line.to_string();
        }
        let (f, b, a, t, s) = (&self.frontend, &self.backend, &self.admin, &self.text, &self.scheduler_admin);
        let flags = [
            ("emq-router", format!("--frontend {f} --backend {b} --admin {a} --text {t} --metrics {}", self.metrics)),
            ("emq-worker", format!("--backend {b}")),
            ("emq-scheduler", format!("--frontend {f} --scheduler-admin {s}")),
            ("emq-cli", format!("--frontend {f} --admin {a} --text {t} --scheduler-admin {s}")),
        ];
        let (host, port) = t.rsplit_once(':').expect("host:port");
        let line = line.replace("${EMQ_TEXT_ADDR%:*}/${EMQ_TEXT_ADDR##*:}", &format!("{host}/{port}"));
        let (program, rest) = line.split_once(' ').unwrap_or((&line, ""));
        match flags.iter().find(|(name, _)| *name == program) {
            Some((_, flags)) => format!("{program} {flags} {rest}").trim_end().to_string(),
            None => line,
        }
    }

    /// bash running `line` in the walkthrough's environment: `$dir`, the
    /// binaries on PATH, the README's variables (variables mode only) and
    /// no other `EMQ_*` or `RUST_LOG`.
    fn bash(&self, line: &str) -> Command {
        let mut cmd = Command::new("bash");
        for (key, _) in std::env::vars_os() {
            let key = key.to_string_lossy().into_owned();
            if key.starts_with("EMQ_") || key == "RUST_LOG" {
                cmd.env_remove(key);
            }
        }
        let path = format!("{}:{}", self.bin, std::env::var("PATH").unwrap_or_default());
        cmd.env("PATH", path).env("dir", &self.dir.path).current_dir(&self.dir.path);
        // The router's and the scheduler's default data directories.
        cmd.env("XDG_STATE_HOME", self.dir.path.join("state"));
        if self.given == Given::Variables {
            let vars = [
                ("EMQ_FRONTEND_ADDR", &self.frontend),
                ("EMQ_BACKEND_ADDR", &self.backend),
                ("EMQ_ADMIN_ADDR", &self.admin),
                ("EMQ_TEXT_ADDR", &self.text),
                ("EMQ_SCHEDULER_ADMIN_ADDR", &self.scheduler_admin),
                ("EMQ_METRICS_ADDR", &self.metrics),
            ];
            cmd.envs(vars);
        }
        cmd.args(["-c", &self.line(line)]);
        cmd
    }

    /// Runs a foreground step; its status, stdout and stderr.
    fn run(&self, line: &str) -> (ExitStatus, String, String) {
        let (status, out, err) = proc::run("step", &mut self.bash(line), &self.dir.path, Duration::from_secs(20));
        (status.unwrap_or_else(|| panic!("{line} did not finish")), out, err)
    }

    /// Runs a step that must succeed and write nothing to stderr; its stdout.
    fn ok(&self, line: &str) -> String {
        let (status, out, err) = self.run(line);
        assert!(status.success() && err.is_empty(), "{line}: {status}\n{out}{err}");
        out
    }

    /// Starts a background step (`… &`).
    fn start(&mut self, name: &str, line: &str) {
        let line = line.strip_suffix(" &").expect("a background step");
        let child = Child::spawn(name, &mut self.bash(line), &self.dir.join(&format!("{name}.log")));
        self.children.push(child);
    }

    /// `emq-cli --json <what>`, parsed.
    fn json(&self, what: &str) -> Result<Value, String> {
        let (status, out, err) = self.run(&format!("emq-cli --json {what}"));
        if !status.success() {
            return Err(err);
        }
        serde_json::from_str(&out).map_err(|e| format!("{e}: {out}"))
    }

    fn logs(&self) -> String {
        self.children.iter().map(|c| c.log_tail(30)).collect::<Vec<_>>().join("\n")
    }
}

/// Waits up to 30 s for `check`.
fn eventually<T>(walk: &Walk, what: &str, check: impl FnMut() -> Result<T, String>) -> T {
    wait::until_ok(Duration::from_secs(30), check).unwrap_or_else(|e| panic!("{what}: {e}\n{}", walk.logs()))
}

/// The cells of a table line: columns are two or more spaces apart.
fn cells(line: &str) -> Vec<&str> {
    line.split("  ").map(str::trim).filter(|c| !c.is_empty()).collect()
}

/// `table` as `a | b | c` lines, the cells of the columns named in
/// `masked` shown as `*`.
fn mask(table: &str, masked: &[&str]) -> String {
    let header = cells(table.lines().next().unwrap_or(""));
    let hide: Vec<usize> = header.iter().enumerate().filter(|(_, n)| masked.contains(n)).map(|(i, _)| i).collect();
    let line = |line: &str| {
        let shown: Vec<&str> =
            cells(line).into_iter().enumerate().map(|(i, c)| if hide.contains(&i) { "*" } else { c }).collect();
        shown.join(" | ")
    };
    let mut out: Vec<String> = vec![header.join(" | ")];
    out.extend(table.lines().skip(1).map(line));
    out.join("\n")
}

fn is_msgid(text: &str) -> bool {
    text.len() == 36 && text.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
}

fn walkthrough(given: Given) {
    for step in [EXPORT, ROUTER, SCRIPT, WORKER, SCHED, RAW_SCHED, SCHEDULER, LIST, "dir=$(mktemp -d)"]
        .iter()
        .chain(&REQUESTS)
        .chain(&SCHEDULES)
        .chain(&WATCH)
    {
        assert!(README.contains(step), "README.md no longer holds this walkthrough step:\n{step}");
    }
    let mut walk = Walk::new(given);

    // 1. the broker, its write-ahead log in the walkthrough's directory
    walk.start("router", ROUTER);
    let ports: Vec<u16> = [&walk.frontend, &walk.backend, &walk.admin, &walk.text]
        .iter()
        .map(|a| a.rsplit(':').next().and_then(|p| p.parse().ok()).expect("a port"))
        .collect();
    eventually(&walk, "the router listens", || {
        ports.iter().all(|&p| is_listening(p)).then_some(()).ok_or_else(|| "not yet".to_string())
    });

    // 2. the worker
    walk.ok(SCRIPT);
    walk.start("worker", WORKER);
    let queues = eventually(&walk, "the worker registers", || {
        let workers = walk.json("workers")?;
        let w = workers["connected_workers"].as_object().and_then(|m| m.values().next().cloned());
        w.map(|w| w["queues"].to_string()).ok_or_else(|| workers.to_string())
    });
    assert_eq!(queues, r#"[[10,"email"],[1,"default"]]"#);

    // 3. jobs over eMQP and the text protocol
    for request in REQUESTS {
        let out = walk.ok(request);
        let id = out.strip_prefix("accepted ").and_then(|s| s.strip_suffix('\n')).unwrap_or("");
        assert!(is_msgid(id), "{request}: {out:?}");
    }
    assert_eq!(walk.ok(SCHED), "accepted on queue email\n");
    assert_eq!(walk.ok(RAW_SCHED), "");

    // 4. scheduled jobs
    walk.start("scheduler", SCHEDULER);
    eventually(&walk, "the scheduler connects", || {
        let s = walk.json("schedulers")?;
        (s["connected_schedulers"].as_object().map(|m| m.len()) == Some(1)).then_some(()).ok_or(s.to_string())
    });
    for schedule in SCHEDULES {
        let out = walk.ok(schedule);
        assert!(out.starts_with("SCHEDULE accepted ") && out.contains(r#""outcome":"added""#), "{schedule}: {out:?}");
    }
    eventually(&walk, "the scheduler holds both", || {
        let s = walk.json("schedules")?;
        (s.as_array().map(Vec::len) == Some(2)).then_some(()).ok_or(s.to_string())
    });
    let listed = walk.ok(LIST);
    let mut rows: Vec<String> = mask(&listed, &["NEXT-FIRE (UTC)", "KEY"]).lines().map(String::from).collect();
    rows[1..].sort();
    assert_eq!(
        rows,
        [
            "QUEUE | KIND | WHEN | NEXT-FIRE (UTC) | RUNS-LEFT | CALLABLE | KEY",
            "default | interval | every 1 min | * | - | mymod.report | *",
            "email | cron | */5 * * * * | * | - | mymod.digest | *",
        ],
        "{listed}"
    );

    // 5. watch: every job done, counted on its queue for both protocols
    let done = |status: &Value, queue: &str| status["completed_messages_by_queue"][queue].as_u64();
    eventually(&walk, "every job completes", || {
        let status = walk.json("status")?;
        (done(&status, "default") == Some(2) && done(&status, "email") == Some(3))
            .then_some(())
            .ok_or(status.to_string())
    });
    let status = walk.ok(WATCH[0]);
    let (table, summary) = status.split_once("\n\n").expect("a table, then the router's figures");
    assert_eq!(
        mask(table, &["P50-MS", "P99-MS"]),
        "QUEUE | WAITING | IN-FLIGHT | RETRYING | DEAD | ACCEPTED | DISPATCHED | COMPLETED | FAILED | RETRIED | \
         DEAD-LETTERED | P50-MS | P99-MS\n\
         default | 0 | 0 | 0 | 0 | 2 | 2 | 2 | 0 | 0 | 0 | * | *\n\
         email | 0 | 0 | 0 | 0 | 3 | 3 | 3 | 0 | 0 | 0 | * | *\n\
         (ACCEPTED to DEAD-LETTERED: since the router started; the other counts: now)",
    );
    assert!(summary.starts_with("emq ") && summary.contains(", accepting jobs\n"), "{summary}");
    assert!(summary.contains("counters: accepted_jobs=5 dispatched_jobs=5 completed_jobs=5"), "{summary}");
    assert!(walk.dir.join("router").is_dir(), "the router's data directory is the walkthrough's");
    assert!(!walk.dir.join("state").join("emq-router").exists(), "not the default one");
    let workers = walk.ok(WATCH[1]);
    assert_eq!(
        mask(&workers, &["WORKER", "LAST-HEARD"]),
        "WORKER | STATE | SLOTS | IN-FLIGHT | LAST-HEARD | QUEUES\n* | live | 4 | 0 | * | email:10,default:1",
        "{workers}"
    );
    let latency = walk.ok(WATCH[2]);
    let rows: Vec<String> = latency.lines().map(|l| cells(l)[..3].join(" | ")).collect();
    let want = ["queue wait", "service", "end to end"];
    let mut expected = vec!["QUEUE | FIGURE | JOBS".to_string()];
    expected.extend(want.iter().map(|f| format!("default | {f} | 2")));
    expected.extend(want.iter().map(|f| format!("email | {f} | 3")));
    assert_eq!(rows, expected, "{latency}");
    let mut handled: Vec<String> = walk.ok(WATCH[3]).lines().map(String::from).collect();
    handled.sort();
    assert_eq!(
        handled,
        [
            "handled: [\"run\", {\"callable\": \"report\", \"path\": \"mymod\", \"args\": [], \"kwargs\": {}, \
             \"class_args\": [], \"class_kwargs\": {}}]",
            "handled: hello",
            "handled: hello again",
            "handled: hello from text",
            "handled: {\"to\": \"a@b.c\"}",
        ]
    );
}

#[test]
fn readme_walkthrough_with_the_readmes_variables() {
    let _w = watchdog::Watchdog::new("walkthrough-vars", 120);
    walkthrough(Given::Variables);
}

#[test]
fn readme_walkthrough_with_flags_instead() {
    let _w = watchdog::Watchdog::new("walkthrough-flags", 120);
    walkthrough(Given::Flags);
}
