//! The first hour's typos and what the programs say about them, the shared
//! settings (`--config`, `--print-config`, `log`, old names), and a STATUS
//! that counts what workers and text consumers did.

use std::process::{Command, Output};
use std::time::Duration;

use emq::client::text::TextClient;
use serde_json::{json, Value};

use crate::common::ports::{free_port, zmq_endpoint};
use crate::common::proc::{Child, TestDir};
use crate::common::router::Router;
use crate::common::{wait, watchdog};

/// One of this crate's binaries, with no `EMQ_*` or `RUST_LOG` from the
/// test's environment.
pub(crate) fn bin(name: &str) -> Command {
    let path = match name {
        "emq-router" => env!("CARGO_BIN_EXE_emq-router"),
        "emq-worker" => env!("CARGO_BIN_EXE_emq-worker"),
        "emq-cli" => env!("CARGO_BIN_EXE_emq-cli"),
        "emq-scheduler" => env!("CARGO_BIN_EXE_emq-scheduler"),
        "emq-pubsub" => env!("CARGO_BIN_EXE_emq-pubsub"),
        "emq-bench" => env!("CARGO_BIN_EXE_emq-bench"),
        other => panic!("no binary {other}"),
    };
    let mut cmd = Command::new(path);
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy().into_owned();
        if key.starts_with("EMQ_") || key == "RUST_LOG" {
            cmd.env_remove(key);
        }
    }
    if name == "emq-router" {
        // Its default data directory: never the user's, never shared.
        cmd.env("XDG_STATE_HOME", crate::common::data::fresh());
    }
    cmd
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs a command that must fail before doing anything: exit status 1,
/// nothing on stdout, exactly `want` (one line) on stderr.
pub(crate) fn refused(cmd: &mut Command, want: &str) {
    let out: Output = cmd.output().expect("runs");
    assert_eq!(
        (out.status.code(), text(&out.stderr), text(&out.stdout)),
        (Some(1), format!("{want}\n"), String::new())
    );
}

#[test]
fn worker_refuses_a_command_it_cannot_run_and_weights_below_one() {
    let _w = watchdog::Watchdog::new("worker-typos", 30);
    let dir = TestDir::new("worker-typos");
    let script = dir.join("job.sh");
    std::fs::write(&script, "#!/bin/sh\ncat\n").expect("write");
    let backend = zmq_endpoint(free_port());
    let worker = |args: &[&str]| {
        let mut cmd = bin("emq-worker");
        cmd.args(["--backend", &backend]).args(args).current_dir(&dir.path);
        cmd
    };
    refused(
        &mut worker(&["--", "handle-job.sh"]),
        "emq-worker: command \"handle-job.sh\" not found on PATH (give its path, e.g. ./handle-job.sh)",
    );
    let missing = dir.join("nope.sh").display().to_string();
    refused(
        &mut worker(&["--", &missing]),
        &format!("emq-worker: command {missing:?} cannot be run: No such file or directory (os error 2)"),
    );
    let script = script.display().to_string();
    refused(
        &mut worker(&["--", &script]),
        &format!("emq-worker: command {script:?} is not executable (chmod +x {script})"),
    );
    for weight in ["0", "-1", "x"] {
        refused(
            &mut worker(&["--queue", &format!("email:{weight}"), "--", "/bin/cat"]),
            &format!(
                "emq-worker: setting queue: \"email:{weight}\": the weight \"{weight}\" must be a whole number of at \
                 least 1"
            ),
        );
    }
    refused(
        &mut worker(&["--queue", "a@b", "--", "/bin/cat"]),
        "emq-worker: setting queue: \"a@b\": queue name \"a@b\" is not valid: use 1 to 255 characters from A-Z a-z \
         0-9 _ - . :",
    );
}

#[test]
fn cli_refuses_queue_names_neither_protocol_takes() {
    let _w = watchdog::Watchdog::new("cli-queue-names", 30);
    let nowhere = zmq_endpoint(free_port());
    let long = "q".repeat(300);
    let cases: [(&[&str], &str); 5] = [
        (&["request", "bad queue", "x"], "bad queue"),
        (&["request", "a@b", "x"], "a@b"),
        (&["request", &long, "x"], &long),
        (&["sched", "x", "--queue", "a@b"], "a@b"),
        (&["ask", "bad/q"], "bad/q"),
    ];
    for (args, name) in cases {
        let mut cmd = bin("emq-cli");
        cmd.args(["--frontend", &nowhere, "--admin", &nowhere, "--text", "127.0.0.1:1"]).args(args);
        let rule = "is not valid: use 1 to 255 characters from A-Z a-z 0-9 _ - . :";
        refused(&mut cmd, &format!("emq-cli: queue name {name:?} {rule}"));
    }
}

/// The subcommands a help text lists under `Commands:` (without `help`).
fn subcommands(help: &str) -> Vec<String> {
    let listed = help.lines().skip_while(|l| *l != "Commands:").skip(1).take_while(|l| !l.is_empty());
    listed.filter_map(|l| l.split_whitespace().next()).filter(|n| *n != "help").map(String::from).collect()
}

#[test]
fn no_help_line_ends_in_a_space() {
    let _w = watchdog::Watchdog::new("help-spaces", 60);
    let programs = ["emq-router", "emq-scheduler", "emq-worker", "emq-cli", "emq-pubsub", "emq-bench"];
    let mut todo: Vec<(&str, Vec<String>)> = programs.iter().map(|p| (*p, Vec::new())).collect();
    let mut seen = 0;
    while let Some((program, command)) = todo.pop() {
        for flag in ["-h", "--help"] {
            let out = bin(program).args(&command).arg(flag).output().expect("runs");
            let help = text(&out.stdout);
            assert!(out.status.success() && help.contains("Usage: "), "{program} {command:?} {flag}: {help}");
            let spaced: Vec<&str> = help.lines().filter(|l| l.ends_with(char::is_whitespace)).collect();
            assert!(spaced.is_empty(), "{program} {command:?} {flag}: {spaced:?}");
            if flag == "-h" {
                todo.extend(subcommands(&help).into_iter().map(|sub| (program, [&command[..], &[sub]].concat())));
            }
            seen += 1;
        }
    }
    assert_eq!(
        seen,
        2 * (6 + 18 + 4 + 1 + 9),
        "every program, emq-cli's 18 commands, 4 dead ones and 1 token one, emq-bench's 9"
    );
}

#[test]
fn misspelled_addresses_get_the_expected_form() {
    let _w = watchdog::Watchdog::new("address-typos", 30);
    let emqp =
        "is not an eMQP address (no tcp://): eMQP addresses look like tcp://host:port, e.g. tcp://127.0.0.1:47291";
    refused(
        bin("emq-cli").args(["--admin", "127.0.0.1:48303", "status"]),
        &format!("emq-cli: setting admin: \"127.0.0.1:48303\" {emqp}"),
    );
    refused(
        bin("emq-cli").args(["--text", "tcp://127.0.0.1:48304", "sched", "x"]),
        "emq-cli: setting text: \"tcp://127.0.0.1:48304\" is not a text address (no tcp:// here): the text address \
         is host:port, e.g. 127.0.0.1:47294",
    );
    refused(
        bin("emq-worker").env("EMQ_BACKEND_ADDR", "localhost:47290").args(["--", "/bin/cat"]),
        &format!("emq-worker: setting backend: \"localhost:47290\" {emqp}"),
    );
    refused(
        bin("emq-scheduler").env("EMQ_FRONTEND_ADDR", "127.0.0.1:47291"),
        &format!("emq-scheduler: setting frontend: \"127.0.0.1:47291\" {emqp}"),
    );
    refused(
        bin("emq-router").args(["--backend", "tcp://127.0.0.1"]),
        "emq-router: setting backend: \"tcp://127.0.0.1\" is not an eMQP address (no :port): eMQP addresses look \
         like tcp://host:port, e.g. tcp://127.0.0.1:47291",
    );
    refused(
        bin("emq-pubsub").args(["--pubsub-out", "udp://127.0.0.1:1"]),
        "emq-pubsub: setting pubsub_out: \"udp://127.0.0.1:1\" is not an eMQP address (unknown transport \"udp\"; \
         use tcp): eMQP addresses look like tcp://host:port, e.g. tcp://127.0.0.1:47291",
    );
}

#[test]
fn invalid_ip_addresses_are_refused_at_start_by_every_program() {
    let _w = watchdog::Watchdog::new("address-ip-literals", 30);
    let v4 = "is not an eMQP address (\"256.1.1.1\" is not an IPv4 address: it needs four numbers from 0 to 255): \
              eMQP addresses look like tcp://host:port, e.g. tcp://127.0.0.1:47291";
    let bad = "tcp://256.1.1.1:5";
    refused(bin("emq-cli").args(["--admin", bad, "status"]), &format!("emq-cli: setting admin: \"{bad}\" {v4}"));
    refused(
        bin("emq-worker").args(["--backend", bad, "--", "/bin/cat"]),
        &format!("emq-worker: setting backend: \"{bad}\" {v4}"),
    );
    refused(
        bin("emq-scheduler").args(["--frontend", bad]),
        &format!("emq-scheduler: setting frontend: \"{bad}\" {v4}"),
    );
    refused(bin("emq-router").args(["--admin", bad]), &format!("emq-router: setting admin: \"{bad}\" {v4}"));
    refused(bin("emq-pubsub").args(["--pubsub-in", bad]), &format!("emq-pubsub: setting pubsub_in: \"{bad}\" {v4}"));
    refused(
        bin("emq-cli").args(["--text", "1.2.3:47294", "sched", "x"]),
        "emq-cli: setting text: \"1.2.3:47294\" is not a text address (\"1.2.3\" is not an IPv4 address: it needs \
         four numbers from 0 to 255): the text address is host:port, e.g. 127.0.0.1:47294",
    );
    refused(
        bin("emq-router").args(["--frontend", "tcp://[::g]:1"]),
        "emq-router: setting frontend: \"tcp://[::g]:1\" is not an eMQP address (\"[::g]\" is not an IPv6 address in \
         brackets): eMQP addresses look like tcp://host:port, e.g. tcp://127.0.0.1:47291",
    );
    // emq-bench's address flags take the same check (clap reports it).
    let out = bin("emq-bench").args(["idle", "--backend", bad]).output().expect("runs");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(&format!("invalid value '{bad}' for '--backend <BACKEND>': \"{bad}\" {v4}")), "{err}");
}

#[test]
fn errors_are_printed_once() {
    let _w = watchdog::Watchdog::new("errors-once", 30);
    let dir = TestDir::new("errors-once");
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "frontend = 3\n").expect("write");
    let out = bin("emq-router").arg("--config").arg(&bad).output().expect("runs");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(err.starts_with(&format!("emq-router: config file {}: TOML parse error", bad.display())), "{err}");
    assert_eq!(err.matches("invalid type: integer `3`, expected a string").count(), 1, "{err}");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port();
    let (fe, be, ad) = (zmq_endpoint(port), zmq_endpoint(free_port()), zmq_endpoint(free_port()));
    refused(
        bin("emq-router")
            .args(["--frontend", &fe, "--backend", &be, "--admin", &ad, "--text", "off", "--metrics", ""])
            .args(["--durability", "memory"]),
        &format!("emq-router: cannot start: zmq bind frontend {fe} failed: Address already in use"),
    );
}

/// What `--print-config` prints: a TOML file naming what was given.
fn print_config(cmd: &mut Command) -> (String, String) {
    let out = cmd.arg("--print-config").output().expect("runs");
    assert!(out.status.success(), "{}", text(&out.stderr));
    (text(&out.stdout), text(&out.stderr))
}

#[test]
fn every_program_takes_config_variables_and_flags_the_same_way() {
    let _w = watchdog::Watchdog::new("settings", 30);
    let dir = TestDir::new("settings");
    let file = dir.join("emq.toml");
    for (program, key, addr) in [
        ("emq-router", "frontend", "tcp://127.0.0.1:1"),
        ("emq-worker", "backend", "[\"tcp://127.0.0.1:1\"]"),
        ("emq-scheduler", "frontend", "tcp://127.0.0.1:1"),
        ("emq-cli", "admin", "tcp://127.0.0.1:1"),
        ("emq-pubsub", "pubsub_in", "tcp://127.0.0.1:1"),
    ] {
        let value = if addr.starts_with('[') { addr.to_string() } else { format!("{addr:?}") };
        std::fs::write(&file, format!("log = \"emq=debug\"\n{key} = {value}\n")).expect("write");
        let (printed, warnings) = print_config(bin(program).arg("--config").arg(&file));
        assert_eq!(warnings, "", "{program}");
        assert!(printed.starts_with(&format!("# Resolved: {key}, log given by")), "{program}: {printed}");
        assert!(printed.contains(&format!("\n{key} = {value}")), "{program}: {printed}");
        assert!(printed.contains("\nlog = \"emq=debug\""), "{program}: {printed}");
        // What it printed is a config file it reads back to the same values
        // (every key is given by the file then).
        std::fs::write(&file, &printed).expect("write");
        let again = print_config(bin(program).arg("--config").arg(&file)).0;
        assert_eq!(again.split_once('\n').map(|(_, rest)| rest), printed.split_once('\n').map(|(_, rest)| rest));
    }
    std::fs::write(&file, "log = \"info\"\n").expect("write");
    let (printed, _) = print_config(bin("emq-bench").arg("--config").arg(&file));
    assert!(printed.starts_with("# Resolved: log given by") && printed.contains("\nlog = \"info\""), "{printed}");
    let flag_over_variable = print_config(
        bin("emq-cli").env("EMQ_FRONTEND_ADDR", "tcp://127.0.0.1:2").args(["--frontend", "tcp://127.0.0.1:3"]),
    );
    assert!(flag_over_variable.0.contains("\nfrontend = \"tcp://127.0.0.1:3\""), "{}", flag_over_variable.0);
}

#[test]
fn old_names_still_work_and_say_what_replaced_them() {
    let _w = watchdog::Watchdog::new("old-names", 30);
    let addr = "tcp://127.0.0.1:7";
    let cases = [
        ("emq-router", Some("--frontend-addr"), None, "frontend", "frontend_addr (--frontend-addr)"),
        (
            "emq-scheduler",
            None,
            Some("EMQ_SCHEDULER_ROUTER_ADDR"),
            "frontend",
            "router_addr (--router-addr, EMQ_SCHEDULER_ROUTER_ADDR)",
        ),
        ("emq-pubsub", Some("--in"), None, "pubsub_in", "in (--in, EMQ_PUBSUB_IN)"),
        ("emq-cli", None, Some("EMQ_PUBSUB_ADDR"), "pubsub_in", "pubsub (--pubsub, EMQ_PUBSUB_ADDR)"),
    ];
    for (program, flag, var, key, old) in cases {
        let mut cmd = bin(program);
        cmd.args(flag.map(|f| [f, addr]).into_iter().flatten());
        cmd.envs(var.map(|v| (v, addr)));
        let (printed, warnings) = print_config(&mut cmd);
        assert!(printed.contains(&format!("\n{key} = \"{addr}\"")), "{printed}");
        let new = match key {
            "frontend" => "frontend (--frontend, EMQ_FRONTEND_ADDR)",
            _ => "pubsub_in (--pubsub-in, EMQ_PUBSUB_IN_ADDR)",
        };
        let warning = format!("WARN main emq::config::table: setting {old} is deprecated: use {new}");
        assert!(warnings.contains(&warning), "{warnings}");
    }
    let (printed, warnings) = print_config(bin("emq-worker").args(["--router", addr]));
    assert!(printed.contains(&format!("\nbackend = [\"{addr}\"]")), "{printed}");
    assert!(warnings.contains("setting router (--router) is deprecated: use backend (--backend, EMQ_BACKEND_ADDR)"));
}

/// Runs emq-cli with `args` against `router` (its text protocol at
/// `text_addr`); it must succeed. Returns its stdout and stderr.
fn cli_ok(router: &Router, text_addr: &str, args: &[&str]) -> (String, String) {
    let mut cmd = bin("emq-cli");
    cmd.args(["--frontend", &router.frontend, "--admin", &router.admin, "--text", text_addr]).args(args);
    let out = cmd.output().expect("runs");
    assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
    (text(&out.stdout), text(&out.stderr))
}

/// `emq-cli --json status` against `router`.
fn status_of(router: &Router, text_addr: &str) -> Result<Value, String> {
    serde_json::from_str(&cli_ok(router, text_addr, &["--json", "status"]).0).map_err(|e| e.to_string())
}

/// A test's watchdog (60 s), directory and router (`name`), the router's
/// text port up; the text address last.
fn start_router(name: &str) -> (watchdog::Watchdog, TestDir, Router, String) {
    let w = watchdog::Watchdog::new(name, 60);
    let dir = TestDir::new(name);
    let mut router = Router::start(&dir);
    let text_addr = router.wait_text();
    (w, dir, router, text_addr)
}

/// A worker script: payload `fail` exits 1, anything else succeeds.
const SCRIPT: &str = "#!/bin/sh\np=$(cat)\n[ \"$p\" = fail ] && exit 1\necho ok\n";

#[test]
fn status_counts_what_workers_and_text_consumers_did() {
    let (_w, dir, router, text_addr) = start_router("status-counts");
    let script = dir.join("job.sh");
    std::fs::write(&script, SCRIPT).expect("write");
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    let mut worker_cmd = bin("emq-worker");
    worker_cmd.args(["--backend", &router.backend, "-Q", "jobs", "--stats-interval", "0s", "--"]).arg(&script);
    let mut worker = Child::spawn("worker", &mut worker_cmd, &dir.join("worker.log"));
    let cli = |args: &[&str]| cli_ok(&router, &text_addr, args);
    let status = || status_of(&router, &text_addr);
    wait::until_ok(Duration::from_secs(20), || {
        let s = status()?;
        s["served_queues"].as_array().filter(|q| q.iter().any(|q| q == "jobs")).map(|_| ()).ok_or(s.to_string())
    })
    .unwrap_or_else(|e| panic!("the worker registers: {e}\n{}", worker.log_tail(20)));
    // The failing jobs are not retried (`retry:0`): straight to the dead set.
    for body in ["a", "fail", "b", "fail", "c"] {
        let headers = if body == "fail" { "retry:0" } else { "" };
        assert!(cli(&["request", "jobs", body, "--headers", headers]).0.starts_with("accepted "));
    }
    for data in ["t1", "t2", "t3"] {
        assert_eq!(cli(&["sched", data, "--queue", "tasks"]), ("accepted on queue tasks\n".into(),
            "emq-cli: note: no worker serves queue \"tasks\": the task waits there until a worker declares the queue \
             or a text client asks for it (check the name)\n".into()));
    }
    assert_eq!(cli(&["ask", "tasks"]).0, "t1\n");
    assert_eq!(cli(&["ask", "tasks", "--del"]).0, "t2\n");
    assert_eq!(cli(&["ask", "tasks", "--dcl"]).0, "t3\n");
    let (out, note) = cli(&["request", "jobz", "typo"]);
    assert!(out.starts_with("accepted "), "{out}");
    assert_eq!(
        note,
        "emq-cli: note: no worker serves queue \"jobz\" or has declared it lately (an idle queue is forgotten \
         queue_idle_grace after its last worker left), so the router put the job on \"default\" (check the name, or \
         start a worker for \"jobz\" first)\n"
    );
    wait::until_ok(Duration::from_secs(20), || {
        let s = status()?;
        let done = s["completed_messages_by_queue"]["jobs"].as_u64().unwrap_or(0)
            + s["failed_messages_by_queue"]["jobs"].as_u64().unwrap_or(0);
        (done == 5).then_some(()).ok_or(s.to_string())
    })
    .unwrap_or_else(|e| panic!("the jobs end: {e}\n{}", worker.log_tail(20)));
    let (table, _) = cli(&["status"]);
    let rows: Vec<String> = table
        .lines()
        .take_while(|l| !l.is_empty() && !l.starts_with('('))
        .map(|l| l.split_whitespace().take(11).collect::<Vec<_>>().join(" "))
        .collect();
    assert_eq!(
        rows,
        [
            "QUEUE WAITING IN-FLIGHT RETRYING DEAD ACCEPTED DISPATCHED COMPLETED FAILED RETRIED DEAD-LETTERED",
            "default 1 0 0 0 1 0 0 0 0 0",
            "jobs 0 0 0 2 5 5 3 2 0 2",
            "tasks 1 0 0 0 3 3 1 1 0 0",
        ],
        "{table}"
    );
    let dead = cli(&["--json", "dead", "list", "jobs"]).0;
    let dead: Value = serde_json::from_str(&dead).expect("JSON");
    assert_eq!(dead["total"], 2, "{dead}");
    worker.terminate(Duration::from_secs(10));
    assert!(worker.log_text().contains("jobs ok=3 failed=2 timed_out=0"), "{}", worker.log_tail(5));
}

#[test]
fn queues_text_clients_ask_for_are_served_for_the_cli_too() {
    // The watchdog (60 s) ends the test before `text_ask_grace` (60 s) has
    // passed since any ASK of it: every queue asked for here stays known.
    let (_w, _dir, router, text_addr) = start_router("asked-queues");
    let cli = |args: &[&str]| cli_ok(&router, &text_addr, args);
    let addr = text_addr.clone();
    let consumer = std::thread::spawn(move || -> Result<Option<Vec<u8>>, String> {
        let mut c = TextClient::connect(addr.as_str(), Duration::from_secs(10)).map_err(|e| e.to_string())?;
        let task = c.ask_wait("lp", Duration::from_secs(50)).map_err(|e| e.to_string())?;
        c.ack().map_err(|e| e.to_string())?;
        c.end().map_err(|e| e.to_string())?;
        Ok(task)
    });
    wait::until_ok(Duration::from_secs(20), || {
        let s = status_of(&router, &text_addr)?;
        (s["emq"]["asks_waiting"] == 1 && s["asked_queues"] == json!(["lp"])).then_some(()).ok_or(s.to_string())
    })
    .unwrap_or_else(|e| panic!("the long-poll ASK waits: {e}\n{}", router.child.log_tail(20)));
    let (out, note) = cli(&["request", "lp", "x"]);
    assert!(out.starts_with("accepted "), "{out}");
    assert_eq!(note, "", "the job stays on lp: a long-poll ASK waits there");
    assert_eq!(consumer.join().expect("consumer"), Ok(Some(b"x".to_vec())));
    assert_eq!(cli(&["ask", "tq"]), ("NOPE\n".into(), String::new()));
    let (out, note) = cli(&["--json", "request", "tq", "z"]);
    let out: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(
        (&out["status"], &out["queue"], &out["note"], note.as_str()),
        (&json!("accepted"), &json!("tq"), &Value::Null, "")
    );
    assert_eq!(cli(&["sched", "y", "--queue", "tq"]), ("accepted on queue tq\n".into(), String::new()));
    let s = status_of(&router, &text_addr).expect("STATUS");
    assert_eq!((&s["asked_queues"], &s["waiting_messages_by_queue"]), (&json!(["lp", "tq"]), &json!({"tq": 2})));
}

#[test]
fn refusals_are_one_line_on_stderr_and_exit_1() {
    let _w = watchdog::Watchdog::new("refusals", 60);
    let dir = TestDir::new("refusals");
    let (fe, be, ad) = (zmq_endpoint(free_port()), zmq_endpoint(free_port()), zmq_endpoint(free_port()));
    let text_addr = format!("127.0.0.1:{}", free_port());
    let mut cmd = bin("emq-router");
    cmd.args(["--frontend", &fe, "--backend", &be, "--admin", &ad, "--text", &text_addr, "--max-queue-len", "1"]);
    cmd.args(["--metrics", &format!("127.0.0.1:{}", free_port())]);
    let router = Child::spawn("router", &mut cmd, &dir.join("router.log"));
    let cli = |args: &[&str]| {
        let out = bin("emq-cli").args(["--frontend", &fe, "--admin", &ad, "--text", &text_addr]).args(args).output();
        let out = out.expect("runs");
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    };
    let up = wait::until_ok(Duration::from_secs(20), || match cli(&["sched", "a", "--queue", "default"]) {
        (Some(0), out, _) => Ok(out),
        other => Err(format!("{other:?}")),
    });
    assert_eq!(up.unwrap_or_else(|e| panic!("{e}\n{}", router.log_tail(20))), "accepted on queue default\n");
    let (code, out, err) = cli(&["sched", "b"]);
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (Some(1), "", "emq-cli: SCHED refused: QUEUE_FULL the queue is full\n")
    );
    let (code, out, err) = cli(&["request", "default", "c"]);
    assert_eq!((code, out.as_str()), (Some(1), ""));
    let id = err.strip_prefix("emq-cli: request ").and_then(|e| e.split(' ').next()).unwrap_or("");
    assert_eq!(err, format!("emq-cli: request {id} rejected: QUEUE_FULL queue default holds 1 jobs, its limit\n"));
    let schedule = ["schedule", "default", "{\"any\": \"body\"}", "--every", "60s"];
    let (code, out, err) = cli(&schedule);
    assert_eq!((code, out.as_str()), (Some(1), ""));
    let id = err.strip_prefix("emq-cli: SCHEDULE ").and_then(|e| e.split(' ').next()).unwrap_or("");
    let refusal = "BAD_BODY frame 7: job body must be a JSON array [subcommand, {params}]";
    assert_eq!(err, format!("emq-cli: SCHEDULE {id} refused: {refusal}\n"));
    let (code, out, err) = cli(&[&["--json"][..], &schedule].concat());
    let id = err.strip_prefix("emq-cli: SCHEDULE ").and_then(|e| e.split(' ').next()).unwrap_or("");
    let out: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(
        (code, out, err.clone()),
        (
            Some(1),
            json!({"status": "refused", "msgid": id, "detail": refusal}),
            format!("emq-cli: SCHEDULE {id} refused: {refusal}\n")
        )
    );
}

/// `emq-router` on free ports (text on `text_addr`, metrics off) with its
/// descriptor limit, soft and hard, at `fds` (`ulimit -n fds`), and `args`.
fn router_under_fds(fds: u64, text_addr: &str, args: &[&str]) -> Command {
    let (fe, be, ad) = (zmq_endpoint(free_port()), zmq_endpoint(free_port()), zmq_endpoint(free_port()));
    let mut cmd = bin("emq-router");
    cmd.args(["--frontend", &fe, "--backend", &be, "--admin", &ad, "--text", text_addr, "--metrics", "off"]);
    cmd.args(args);
    crate::common::proc::limit_descriptors(&mut cmd, fds, fds);
    cmd
}

#[test]
fn a_text_descriptor_reserve_the_limit_cannot_hold_is_refused_at_start() {
    let _w = watchdog::Watchdog::new("text-reserve", 60);
    let dir = TestDir::new("text-reserve");
    let text_addr = format!("127.0.0.1:{}", free_port());
    // Not below the limit at all: refused before anything starts.
    refused(
        &mut router_under_fds(1024, &text_addr, &["--text-reserved-fds", "30000"]),
        "emq-router: setting text_reserved_fds: 30000 is not below the descriptor limit (RLIMIT_NOFILE, hard) of \
         1024: every text connection would get ERR BUSY too few descriptors left; lower it or raise the limit \
         (ulimit -n), or turn the text port off (text = \"off\")",
    );
    refused(
        &mut router_under_fds(1024, &text_addr, &["--text-reserved-fds", "1024"]),
        "emq-router: setting text_reserved_fds: 1024 is not below the descriptor limit (RLIMIT_NOFILE, hard) of \
         1024: every text connection would get ERR BUSY too few descriptors left; lower it or raise the limit \
         (ulimit -n), or turn the text port off (text = \"off\")",
    );
    // Below it, but leaving nothing once the router's own are open: found
    // at start, after the log lines of the start so far.
    let (status, out, err) = crate::common::proc::run(
        "router-reserve",
        &mut router_under_fds(1024, &text_addr, &["--text-reserved-fds", "1020"]),
        &dir.path,
        Duration::from_secs(30),
    );
    let last = err.lines().last().unwrap_or("");
    let open: u64 = last
        .split(" and ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{err}"));
    assert!((4..=1024).contains(&open), "{err}");
    assert_eq!(
        (status.and_then(|s| s.code()), out.as_str(), last),
        (
            Some(1),
            "",
            format!(
                "emq-router: cannot start: setting text_reserved_fds: 1020 leaves no descriptor for text \
                 connections: the descriptor limit (RLIMIT_NOFILE) is 1024 and {open} are open at start, so every \
                 text connection would get ERR BUSY too few descriptors left; lower text_reserved_fds or raise the \
                 limit (ulimit -n)"
            )
            .as_str()
        )
    );
    assert!(!err.contains("text protocol listening"), "{err}");
}

#[test]
fn settings_that_lose_python_peers_are_a_warning_at_start() {
    let _w = watchdog::Watchdog::new("heartbeat-warning", 30);
    let warning = "WARN main emq::config::router: Python EventMQ peers heartbeat every 3 s and reconnect after \
                   ~15 s of router silence: these settings will expire or lose them";
    for (flag, value) in
        [("--heartbeat-timeout", "3200ms"), ("--heartbeat-timeout", "3400ms"), ("--heartbeat-interval", "6s")]
    {
        let mut cmd = bin("emq-router");
        if flag == "--heartbeat-interval" {
            cmd.args(["--heartbeat-timeout", "20s"]);
        }
        let (_, warnings) = print_config(cmd.args([flag, value]));
        assert!(warnings.contains(warning), "{flag} {value}: {warnings:?}");
    }
    let (_, warnings) = print_config(bin("emq-router").env("EMQ_HEARTBEAT_TIMEOUT", "3100ms"));
    assert!(warnings.contains(warning), "{warnings:?}");
    let (_, warnings) = print_config(bin("emq-router").args(["--heartbeat-timeout", "3500ms"]));
    assert_eq!(warnings, "", "3.5 s keeps Python peers");
}

#[test]
fn the_router_raises_its_soft_descriptor_limit_to_the_hard_one_with_the_text_port_off() {
    // eMQP connections cost descriptors too: once they are all taken no
    // listener accepts, the admin socket's included (README "Limits").
    let _w = watchdog::Watchdog::new("nofile-raise", 60);
    let dir = TestDir::new("nofile-raise");
    let admin_port = free_port();
    let mut cmd = bin("emq-router");
    cmd.args(["--frontend", &zmq_endpoint(free_port()), "--backend", &zmq_endpoint(free_port())]);
    cmd.args(["--admin", &zmq_endpoint(admin_port), "--text", "off", "--metrics", "off", "--durability", "memory"]);
    crate::common::proc::limit_descriptors(&mut cmd, 512, 1024);
    let mut router = Child::spawn("router", &mut cmd, &dir.join("router.log"));
    assert!(
        wait::until(Duration::from_secs(20), || crate::common::ports::is_listening(admin_port)),
        "{}",
        router.log_tail(20)
    );
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", router.pid())).expect("the router's limits");
    let nofile = limits.lines().find(|l| l.starts_with("Max open files")).map(|l| l.split_whitespace().collect());
    assert_eq!(nofile, Some(vec!["Max", "open", "files", "1024", "1024", "files"]), "{limits}");
    assert_eq!(router.terminate(Duration::from_secs(20)).and_then(|s| s.code()), Some(0));
}

#[test]
fn text_connections_the_limit_cannot_hold_are_a_warning_at_start() {
    let _w = watchdog::Watchdog::new("text-room", 60);
    let dir = TestDir::new("text-room");
    let text_addr = format!("127.0.0.1:{}", free_port());
    let mut cmd =
        router_under_fds(1024, &text_addr, &["--text-reserved-fds", "256", "--text-max-connections", "10000"]);
    let mut router = Child::spawn("router", &mut cmd, &dir.join("router.log"));
    let port = text_addr.rsplit(':').next().and_then(|p| p.parse().ok()).expect("port");
    assert!(
        wait::until(Duration::from_secs(20), || crate::common::ports::is_listening(port)),
        "{}",
        router.log_tail(20)
    );
    let log = router.log_text();
    let warning = log.lines().find_map(|l| l.split_once("WARN main emq::router: ")).map(|(_, w)| w);
    let open: u64 = warning
        .and_then(|w| w.split("and the ").nth(1))
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{log}"));
    assert_eq!(
        warning,
        Some(
            format!(
                "text_max_connections (10000) cannot all be open: the descriptor limit (RLIMIT_NOFILE) of 1024, \
                 less text_reserved_fds (256) and the {open} descriptors open at start, leaves room for {} text \
                 connections; past them a client gets ERR BUSY too few descriptors left",
                1024 - 256 - open
            )
            .as_str()
        )
    );
    assert_eq!(router.terminate(Duration::from_secs(20)).and_then(|s| s.code()), Some(0));
}

/// The router's `emq::router::control` lines after their prefix.
fn control_lines(log: &str) -> Vec<&str> {
    log.lines().filter_map(|l| l.split_once("emq::router::control: ")).map(|(_, rest)| rest).collect()
}

#[test]
fn a_drain_timeout_warns_only_when_something_remains() {
    let _w = watchdog::Watchdog::new("drain-warn", 60);
    let dir = TestDir::new("drain-warn");
    for jobs in [0, 1] {
        let text_addr = format!("127.0.0.1:{}", free_port());
        let mut cmd = router_under_fds(4096, &text_addr, &["--drain-timeout", "0s", "--durability", "memory"]);
        let log = dir.join(&format!("router-{jobs}.log"));
        let mut router = Child::spawn("router", &mut cmd, &log);
        let up = wait::until_ok(Duration::from_secs(20), || {
            TextClient::connect(text_addr.as_str(), Duration::from_secs(5)).map_err(|e| e.to_string())
        });
        let mut client = up.unwrap_or_else(|e| panic!("{e}\n{}", router.log_tail(20)));
        for _ in 0..jobs {
            client.sched(b"left", None).expect("sched");
        }
        client.end().expect("accepted");
        assert_eq!(router.terminate(Duration::from_secs(20)).and_then(|s| s.code()), Some(0));
        let log = router.log_text();
        let want = match jobs {
            0 => vec![
                "draining: new work is refused reason=Requested",
                "drained: nothing queued or in flight",
                "emq-router stopped",
            ],
            _ => vec![
                "draining: new work is refused reason=Requested",
                "drain timeout: jobs remain (each shard logs them: kept in the write-ahead log, or listed with \
                 durability \"memory\") pending=1 shards_not_answering=0",
                "emq-router stopped",
            ],
        };
        assert_eq!(control_lines(&log), want, "{log}");
    }
}

#[test]
fn sched_and_ask_refused_for_too_many_connections_say_so() {
    let _w = watchdog::Watchdog::new("cli-busy", 60);
    let dir = TestDir::new("cli-busy");
    let text_addr = format!("127.0.0.1:{}", free_port());
    let mut cmd = router_under_fds(4096, &text_addr, &["--text-max-connections", "1", "--durability", "memory"]);
    let router = Child::spawn("router", &mut cmd, &dir.join("router.log"));
    let up = wait::until_ok(Duration::from_secs(20), || {
        TextClient::connect(text_addr.as_str(), Duration::from_secs(5)).map_err(|e| e.to_string())
    });
    let mut held = up.unwrap_or_else(|e| panic!("{e}\n{}", router.log_tail(20)));
    assert_eq!(held.ask("default").expect("the one connection"), None);
    let cli = |args: &[&str]| {
        let out = bin("emq-cli").args(["--text", &text_addr]).args(args).output().expect("runs");
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    };
    let busy = (Some(1), String::new(), "emq-cli: server error BUSY: too many connections\n".to_string());
    for args in
        [&["sched", "hi"][..], &["sched", "hi", "--queue", "email"], &["ask"], &["ask", "--dcl"], &["ask", "--del"]]
    {
        // Several times: the refusal races the client's writes differently each time.
        for _ in 0..5 {
            assert_eq!(cli(args), busy, "{args:?}");
        }
    }
    held.end().expect("held connection ends cleanly");
}

#[test]
fn peer_chosen_bytes_cannot_forge_router_log_lines_or_reach_the_terminal() {
    let (_w, _dir, router, _text) = start_router("log-injection");
    let ctx = zmq::Context::new();
    let worker = ctx.socket(zmq::DEALER).expect("socket");
    worker.set_linger(0).expect("linger");
    let forged = "X\n2026-12-02T11:00:00.000000Z  INFO main emq::router: FORGED-BY-IDENTITY\u{1b}]0;PWNED\u{7}";
    worker.set_identity(forged.as_bytes()).expect("identity");
    worker.connect(&router.backend).expect("connect");
    let inform: [&[u8]; 6] = [b"", b"eMQP/1.0", b"INFORM", b"m1", br#"[[10,"q"]]"#, b"worker"];
    worker.send_multipart(inform, 0).expect("INFORM");
    worker.set_rcvtimeo(5_000).expect("timeout");
    let ack = worker.recv_multipart(0).expect("the router answers the INFORM");
    assert_eq!(ack[2], b"ACK");
    worker.send_multipart([&b""[..], b"eMQP/1.0", b"KBYE", b"m2"], 0).expect("KBYE");
    let log = wait::until_ok(Duration::from_secs(10), || {
        let log = router.child.log_text();
        log.contains("KBYE").then_some(log.clone()).ok_or(log)
    })
    .unwrap_or_else(|log| panic!("no KBYE logged:\n{log}"));
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("FORGED-BY-IDENTITY")).collect();
    assert!(lines.len() >= 2, "registration and KBYE name the worker:\n{log}");
    for line in lines {
        assert!(!line.starts_with("2026-12-02T11:00:00.000000Z"), "a forged line:\n{log}");
        assert!(
            line.contains(
                r"X\n2026-12-02T11:00:00.000000Z  INFO main emq::router: FORGED-BY-IDENTITY\u{1b}]0;PWNED\u{7}"
            ),
            "{line}"
        );
    }
    assert!(!log.contains('\u{1b}') && !log.contains('\u{7}'), "no terminal escape reaches the log:\n{log}");
}

/// The cell of `column` in `queue`'s row of an `emq-cli status` table.
fn status_cell(table: &str, queue: &str, column: &str) -> String {
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().unwrap_or("").split_whitespace().collect();
    let at = header.iter().position(|h| *h == column).unwrap_or_else(|| panic!("no column {column}:\n{table}"));
    let row =
        lines.find(|l| l.split_whitespace().next() == Some(queue)).unwrap_or_else(|| panic!("no {queue}:\n{table}"));
    row.split_whitespace().nth(at).unwrap_or("").to_string()
}

/// `GET /` of the router's status page: the HTML.
fn status_page(router: &Router) -> String {
    http_get(router, "/")
}

/// `GET path` of the router's HTTP server: the whole answer, head and body.
fn http_get(router: &Router, path: &str) -> String {
    use std::io::{Read, Write};
    let addr = router.metrics.as_deref().expect("metrics on");
    let mut s = std::net::TcpStream::connect(addr).expect("the HTTP server accepts");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    s.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes()).expect("request sent");
    let mut page = String::new();
    s.read_to_string(&mut page).expect("page read");
    page
}

#[test]
fn status_tells_the_dead_set_now_from_dead_letterings_since_start_and_jobs_waiting_for_a_retry() {
    let _w = watchdog::Watchdog::new("status-dead-now", 90);
    let dir = TestDir::new("status-dead-now");
    let kind = crate::common::router::RouterKind::Rust(crate::common::router::rust_router_bin());
    let slow_retries = ["--retry-backoff", "1h", "--retry-backoff-max", "1h"];
    let mut router = Router::start_with(&dir, kind.clone(), &slow_retries);
    let mut text_addr = router.wait_text();
    let script = dir.join("job.sh");
    std::fs::write(&script, SCRIPT).expect("write");
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    let mut worker_cmd = bin("emq-worker");
    worker_cmd.args(["--backend", &router.backend, "-Q", "jobs", "-Q", "gone", "--stats-interval", "0s", "--"]);
    worker_cmd.arg(&script);
    let mut worker = Child::spawn("worker", &mut worker_cmd, &dir.join("worker.log"));
    wait::until_ok(Duration::from_secs(20), || {
        let s = status_of(&router, &text_addr)?;
        s["served_queues"].as_array().filter(|q| q.iter().any(|q| q == "jobs")).map(|_| ()).ok_or(s.to_string())
    })
    .unwrap_or_else(|e| panic!("the worker registers: {e}\n{}", worker.log_tail(20)));
    // Two jobs straight to the dead set, one waiting an hour for its
    // retry, one done.
    for (body, headers) in [("fail", "retry:0"), ("fail", "retry:0"), ("fail", "retry:1"), ("ok", "")] {
        assert!(cli_ok(&router, &text_addr, &["request", "jobs", body, "--headers", headers])
            .0
            .starts_with("accepted "));
    }
    wait::until_ok(Duration::from_secs(20), || {
        let s = status_of(&router, &text_addr)?;
        let done = s["completed_messages_by_queue"]["jobs"].as_u64().unwrap_or(0)
            + s["failed_messages_by_queue"]["jobs"].as_u64().unwrap_or(0);
        (done == 4).then_some(()).ok_or(s.to_string())
    })
    .unwrap_or_else(|e| panic!("the jobs end: {e}\n{}", worker.log_tail(20)));
    let cells = |router: &Router, text_addr: &str, columns: &[&str]| {
        let table = cli_ok(router, text_addr, &["status"]).0;
        columns.iter().map(|c| format!("{c}={}", status_cell(&table, "jobs", c))).collect::<Vec<_>>().join(" ")
    };
    let columns = ["WAITING", "IN-FLIGHT", "RETRYING", "DEAD", "FAILED", "RETRIED", "DEAD-LETTERED"];
    assert_eq!(
        cells(&router, &text_addr, &columns),
        "WAITING=0 IN-FLIGHT=0 RETRYING=1 DEAD=2 FAILED=3 RETRIED=1 DEAD-LETTERED=2"
    );
    // One dead job deleted: the dead set holds 1, 2 were dead-lettered.
    let dead: Value = serde_json::from_str(&cli_ok(&router, &text_addr, &["--json", "dead", "list"]).0).expect("JSON");
    let id = dead["jobs"][0]["id"].as_str().expect("an id").to_string();
    assert_eq!(cli_ok(&router, &text_addr, &["dead", "delete", &id]).0, format!("dead job {id} deleted\n"));
    assert_eq!(cells(&router, &text_addr, &["RETRYING", "DEAD", "DEAD-LETTERED"]), "RETRYING=1 DEAD=1 DEAD-LETTERED=2");
    let listed = cli_ok(&router, &text_addr, &["dead", "list"]).0;
    assert_eq!((listed.lines().count(), listed.lines().last()), (3, Some("(1 dead job)")), "{listed}");
    let status = status_of(&router, &text_addr).expect("STATUS");
    assert_eq!(
        (&status["retrying_messages_by_queue"], &status["dead_messages_by_queue"]),
        (&json!({"jobs": 1}), &json!({"jobs": 1}))
    );
    assert_eq!(status["dead_lettered_messages_by_queue"], json!({"jobs": 2}));
    // The status page: waiting, in flight, retrying, dead now, accepted,
    // completed, failed, dead-lettered.
    let page = status_page(&router);
    let row = "<td>jobs</td><td>0</td><td>0</td><td>1</td><td>1</td><td>4</td><td>1</td><td>3</td><td>2</td>";
    assert!(page.contains(row), "{page}");
    assert!(page.contains("<th>retrying</th><th>dead now</th>") && page.contains("<th>dead-lettered</th>"), "{page}");
    // A queue whose only job dies: after a restart it is known by its dead
    // set alone, and /metrics still labels it.
    assert!(cli_ok(&router, &text_addr, &["request", "gone", "fail", "--headers", "retry:0"])
        .0
        .starts_with("accepted "));
    wait::until_ok(Duration::from_secs(20), || {
        let s = status_of(&router, &text_addr)?;
        (s["dead_messages_by_queue"]["gone"] == 1).then_some(()).ok_or(s.to_string())
    })
    .unwrap_or_else(|e| panic!("the job dies: {e}\n{}", worker.log_tail(20)));
    // After a restart the dead set is still there, dead-lettered starts at
    // 0, and the job that waited for its retry is ready at once.
    worker.terminate(Duration::from_secs(10));
    router.child.kill_group();
    router = Router::start_with(&dir, kind, &slow_retries);
    text_addr = router.wait_text();
    assert_eq!(
        cells(&router, &text_addr, &["WAITING", "RETRYING", "DEAD", "DEAD-LETTERED"]),
        "WAITING=1 RETRYING=0 DEAD=1 DEAD-LETTERED=0"
    );
    let listed = cli_ok(&router, &text_addr, &["dead", "list"]).0;
    assert_eq!(listed.lines().last(), Some("(2 dead jobs)"), "{listed}");
    let metrics = http_get(&router, "/metrics");
    let lines: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("emq_jobs_dead{") || l.starts_with("emq_metrics_queues_folded"))
        .collect();
    assert_eq!(
        lines,
        [
            "emq_jobs_dead{router=\"emq\",queue=\"gone\"} 1",
            "emq_jobs_dead{router=\"emq\",queue=\"jobs\"} 1",
            "emq_metrics_queues_folded{router=\"emq\"} 0"
        ]
    );
}

#[test]
fn request_and_sched_without_an_answer_exit_3_outcome_unknown() {
    let (_w, _dir, mut router, text_addr) = start_router("outcome-unknown");
    let admin = router.admin.clone();
    let cli = |frontend: &str, args: &[&str]| {
        let mut cmd = bin("emq-cli");
        cmd.args(["--frontend", frontend, "--admin", &admin, "--text", &text_addr, "--timeout", "1s"]).args(args);
        let out = cmd.output().expect("runs");
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    };
    // A router that takes a REQUEST and never answers, as an emq router
    // paused after the handshake, or an EventMQ router with no free
    // worker, would: a ROUTER socket of the test's own.
    let ctx = zmq::Context::new();
    let silent = ctx.socket(zmq::ROUTER).expect("a ROUTER socket");
    silent.set_linger(0).expect("linger");
    silent.set_rcvtimeo(5_000).expect("receive timeout");
    silent.bind("tcp://127.0.0.1:*").expect("bind");
    let silent_addr = silent.get_last_endpoint().expect("endpoint").expect("UTF-8");
    let (code, out, err) = cli(&silent_addr, &["request", "jobs", "unanswered"]);
    let id = err.strip_prefix("emq-cli: no answer to request ").and_then(|e| e.split(' ').next()).unwrap_or("");
    let note = format!(
        "no answer to request {id} within 1s: outcome unknown (exit status 3). An emq router acknowledges every job it \
         stores, so it has not acknowledged this one (a router that is paused or overloaded may still store it: see \
         emq-cli status); an EventMQ router answers only jobs it dispatches to a worker at once, so there the job may \
         be queued"
    );
    assert_eq!((code, out.as_str(), err.as_str()), (Some(3), "", format!("emq-cli: {note}\n").as_str()));
    let got = silent.recv_multipart(0).expect("the REQUEST arrived");
    assert_eq!((&got[3][..], &got[4][..], &got[7][..]), (&b"REQUEST"[..], id.as_bytes(), &b"unanswered"[..]));
    let (code, out, err) = cli(&silent_addr, &["--json", "request", "jobs", "unanswered"]);
    let out: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!((code, &out["status"]), (Some(3), &json!("unknown")), "{err}");
    assert_eq!(err, format!("emq-cli: {}\n", out["note"].as_str().unwrap_or("")));

    // The real router paused (SIGSTOP): a REQUEST is not sent (eMQP waits
    // for the handshake), exit status 1; a SCHED is (TCP connects through
    // the listen backlog), its answer does not come: exit status 3, and the
    // router stores the task once it runs again.
    router.child.signal(libc::SIGSTOP);
    let request = cli(&router.frontend, &["request", "jobs", "not sent"]);
    let sched = cli(&router.frontend, &["sched", "stored late", "--queue", "held"]);
    router.child.signal(libc::SIGCONT);
    assert_eq!((request.0, request.1.as_str()), (Some(1), ""));
    let unreachable =
        format!("emq-cli: request not sent: {} is unreachable: no connection within 1s\n", router.frontend);
    assert_eq!(request.2, unreachable);
    assert_eq!(
        sched,
        (
            Some(3),
            String::new(),
            "emq-cli: SCHED on queue held: no answer within 1s: outcome unknown (exit status 3): the router may have \
             stored the task (a router that is paused or overloaded stores it and answers late): see emq-cli status\n"
                .to_string()
        )
    );
    wait::until_ok(Duration::from_secs(20), || {
        let s = status_of(&router, &text_addr)?;
        (s["waiting_messages_by_queue"]["held"] == 1).then_some(()).ok_or(s.to_string())
    })
    .unwrap_or_else(|e| panic!("the task paused in flight is stored: {e}\n{}", router.child.log_tail(20)));
    // Acknowledged: exit status 0.
    assert_eq!(cli(&router.frontend, &["sched", "at once", "--queue", "held"]).0, Some(0));
}

/// A malformed emq-cli command line (an invalid or missing argument, an
/// unknown option) exits 1 like every other refusal, whichever subcommand
/// checks it; help exits 0.
#[test]
fn a_malformed_command_line_exits_1_whatever_the_subcommand() {
    let _w = watchdog::Watchdog::new("cli-usage-exit", 30);
    let cases: [(&[&str], &str); 5] = [
        (&["dead", "show", "abc"], "error: invalid value 'abc' for '<ID>'"),
        (&["dead", "list", "bad queue"], "error: invalid value 'bad queue' for '[QUEUE]'"),
        (&["dead", "retry"], "error: the following required arguments were not provided"),
        (&["dead", "list", "--queue", "x"], "error: unexpected argument '--queue' found"),
        (&["no-such-command"], "error: unrecognized subcommand 'no-such-command'"),
    ];
    for (args, says) in cases {
        let out = bin("emq-cli").args(args).output().expect("runs");
        let err = text(&out.stderr);
        assert_eq!((out.status.code(), text(&out.stdout).as_str()), (Some(1), ""), "{args:?}: {err}");
        assert!(err.starts_with(says), "{args:?}: {err}");
    }
    let out = bin("emq-cli").args(["dead", "--help"]).output().expect("runs");
    assert_eq!(out.status.code(), Some(0));
}

/// `emq-cli admin` sends any admin command; a refusal quotes at most 512
/// bytes of a bad argument, however long it was.
#[test]
fn admin_sends_any_command_and_a_refusal_quotes_a_bounded_part_of_the_argument() {
    let (_w, _dir, router, text_addr) = start_router("cli-admin-any");
    let listed: Value = serde_json::from_str(&cli_ok(&router, &text_addr, &["admin", "DEAD_LIST"]).0).expect("JSON");
    assert_eq!(listed, json!({"jobs": [], "total": 0}));
    let long = "7".repeat(120_000);
    let mut cmd = bin("emq-cli");
    cmd.args(["--admin", &router.admin, "admin", "DEAD_SHOW", &long]);
    let out = cmd.output().expect("runs");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let quoted = format!("{}…(120000 bytes)", "7".repeat(512));
    assert!(err.contains(&format!("{quoted:?} is not a job id of this router")), "{}", &err[..err.len().min(300)]);
    assert!(err.len() < 1_000, "{} bytes", err.len());
}

/// An admin command with more frames than the router reads is answered
/// `ERROR BAD_FRAMES`, not dropped in silence (emq-cli would wait out its
/// timeout).
#[test]
fn an_admin_command_with_too_many_frames_is_answered() {
    let (_w, _dir, router, _text_addr) = start_router("cli-admin-frames");
    let many: Vec<String> = (1..=63).map(|i| i.to_string()).collect();
    let mut cmd = bin("emq-cli");
    cmd.args(["--admin", &router.admin, "--timeout", "10s", "admin", "DEAD_LIST"]).args(&many);
    let out = cmd.output().expect("runs");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("BAD_FRAMES") && err.contains("the message has 68 frames; at most"), "{err}");
}
