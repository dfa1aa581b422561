//! Losing the log never stops a program (README "Configuration"): the
//! router and emq-pubsub with stdout and stderr on a pipe whose reader is
//! gone before any traffic serve as usual and stop cleanly; the router
//! counts the lines it lost (`log_write_failures`). And SIGHUP stops the
//! router as SIGTERM does. emq-scheduler's and emq-worker's own checks are
//! in `scheduler_e2e` and `worker_e2e`. Lines the rate limit leaves out
//! are counted in the log, even when no later line of their kind comes
//! (a burst of dead-letterings).

use std::process::Command;
use std::time::Duration;

use emq::client::emqp::Publisher;
use emq::client::text::TextClient;

use crate::common::ports::{free_port, is_listening};
use crate::common::proc::{self, closed_pipe, TestDir};
use crate::common::router::{Router, RouterKind};
use crate::common::{admin, wait};
use crate::emqp_router::{Peer, Watchdog};

/// How long a program may take to stop after a stop signal.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// Sends `sig` to `child` and returns its exit code once it has exited
/// within [`STOP_GRACE`] (`None`: killed by a signal, or still running,
/// then SIGKILLed).
fn stop_with(child: &mut proc::Child, sig: i32) -> Option<i32> {
    child.stop_with(sig, STOP_GRACE)
}

#[test]
fn router_with_its_log_pipe_closed_keeps_serving_and_counts_the_lost_lines() {
    let _w = Watchdog::new("router_log_pipe_closed", 60);
    let dir = TestDir::new("router-log-pipe-closed");
    let extra = ["--log", "debug", "--durability", "memory", "--drain-timeout", "200ms"];
    let rust = RouterKind::Rust(crate::common::router::rust_router_bin());
    let mut router = Router::start_with_output(&dir, rust, &extra, Some(closed_pipe()));
    let text = router.wait_text();
    // A worker registers (its INFORM is ACKed), a client's REQUEST is
    // accepted and dispatched to it.
    let worker = Peer::new(&router.backend, b"worker-1");
    worker.inform_worker(r#"[[10, "q"]]"#);
    worker.ready(1);
    let client = Peer::new(&router.frontend, b"client-1");
    client.request("job-1", "q", "", "payload");
    assert_eq!(client.expect("REPLY")[4], b"job-1");
    let job = worker.expect("REQUEST");
    assert_eq!(job.last().map(Vec::as_slice), Some(&b"payload"[..]), "{job:?}");
    // The text front end still takes tasks (not ERR SHUTTING_DOWN).
    let mut t = TextClient::connect(text.as_str(), Duration::from_secs(5)).expect("text connection");
    t.sched(b"task", Some("q")).expect("SCHED");
    t.end().expect("SCHED accepted");
    let status = admin::request(&router.admin, "STATUS").expect("STATUS answered");
    let lost = status["emq"]["counters"]["log_write_failures"].as_u64();
    assert!(lost.is_some_and(|n| n > 0), "{status}");
    assert_eq!(stop_with(&mut router.child, libc::SIGTERM), Some(0), "exit status at SIGTERM");
}

#[test]
fn router_drains_and_exits_0_at_sighup() {
    let _w = Watchdog::new("router_sighup", 60);
    let dir = TestDir::new("router-sighup");
    let rust = RouterKind::Rust(crate::common::router::rust_router_bin());
    let mut router = Router::start_with(&dir, rust, &["--durability", "memory", "--drain-timeout", "200ms"]);
    let worker = Peer::new(&router.backend, b"worker-1");
    worker.inform_worker(r#"[[10, "q"]]"#);
    assert_eq!(stop_with(&mut router.child, libc::SIGHUP), Some(0), "{}", router.child.log_tail(20));
    // Drained like at SIGTERM: the worker was told goodbye.
    worker.expect("KBYE");
    assert!(router.child.log_text().contains("signal received"), "{}", router.child.log_tail(20));
}

#[test]
fn a_router_started_with_sighup_ignored_keeps_it_ignored() {
    // As `nohup emq-router &` starts it: the session's end must not stop it.
    let _w = Watchdog::new("router_nohup", 60);
    let dir = TestDir::new("router-nohup");
    let admin_port = free_port();
    let admin = format!("tcp://127.0.0.1:{admin_port}");
    let mut cmd = Command::new("nohup");
    cmd.arg(crate::common::router::rust_router_bin());
    cmd.args(["--frontend", &format!("tcp://127.0.0.1:{}", free_port())]);
    cmd.args(["--backend", &format!("tcp://127.0.0.1:{}", free_port()), "--admin", &admin]);
    cmd.args(["--text", "off", "--metrics", "off", "--durability", "memory", "--drain-timeout", "200ms"]);
    let mut router = proc::Child::spawn("router", &mut cmd, &dir.join("router.log"));
    assert!(wait::until(Duration::from_secs(20), || is_listening(admin_port)), "{}", router.log_tail(20));
    router.signal(libc::SIGHUP);
    std::thread::sleep(Duration::from_millis(500));
    let status = admin::request(&admin, "STATUS").expect("STATUS answered after SIGHUP");
    assert!(status["emq"]["counters"].is_object(), "{status}");
    assert!(router.is_alive(), "{}", router.log_tail(20));
    assert_eq!(stop_with(&mut router, libc::SIGTERM), Some(0), "exit status at SIGTERM");
}

#[test]
fn pubsub_with_its_output_pipe_closed_still_publishes() {
    let _w = Watchdog::new("pubsub_log_pipe_closed", 60);
    let dir = TestDir::new("pubsub-log-pipe-closed");
    let (in_port, out_port) = (free_port(), free_port());
    let (inp, out) = (format!("tcp://127.0.0.1:{in_port}"), format!("tcp://127.0.0.1:{out_port}"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_emq-pubsub"));
    cmd.args(["--pubsub-in", &inp, "--pubsub-out", &out, "--log", "debug"]);
    let pipe = closed_pipe();
    cmd.stderr(pipe.try_clone().expect("clone the pipe")).stdout(pipe);
    let mut pubsub = proc::Child::spawn_keeping_output("emq-pubsub", &mut cmd, &dir.join("pubsub.log"));
    let up = wait::until(Duration::from_secs(10), || !pubsub.is_alive() || is_listening(in_port));
    assert!(up && pubsub.is_alive(), "emq-pubsub did not start: {:?}", pubsub.exit_status());
    let ctx = zmq::Context::new();
    let sub = ctx.socket(zmq::SUB).expect("SUB socket");
    sub.set_linger(0).expect("linger");
    sub.set_rcvtimeo(100).expect("rcvtimeo");
    sub.set_subscribe(b"").expect("subscribe");
    sub.connect(&out).expect("connect SUB");
    // A malformed message first: the device logs a warning it cannot write.
    let bad = Peer::new(&inp, b"");
    bad.send(&[b"", b"eMQP/1.0", b"BOGUS", b"m1"]);
    let mut publisher = Publisher::connect(&inp).expect("publisher").with_timeout(Duration::from_secs(2));
    let got = crate::interop_pubsub::receive(&sub, Duration::from_secs(20), || {
        publisher.publish(b"news", b"still here").expect("PUBLISH sent");
    });
    assert_eq!(got, Some(vec![b"news".to_vec(), b"still here".to_vec()]));
    assert_eq!(stop_with(&mut pubsub, libc::SIGTERM), Some(0), "exit status at SIGTERM");
}

/// The number after `name=` in `line`, if any.
fn field(line: &str, name: &str) -> Option<u64> {
    let at = line.find(&format!(" {name}="))? + name.len() + 2;
    line[at..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

#[test]
fn every_dead_lettering_of_a_burst_is_in_the_log_as_a_line_or_a_count() {
    let _w = Watchdog::new("dead_lettering_burst_logged", 60);
    let dir = TestDir::new("dead-lettering-burst");
    let rust = RouterKind::Rust(crate::common::router::rust_router_bin());
    let mut router = Router::start_with(&dir, rust, &["--max-retries", "0", "--durability", "memory"]);
    let text = router.wait_text();
    // 200 tasks, each offered to a text consumer that goes away holding
    // it: with max_retries 0, 200 dead-letterings in a burst, and none
    // after it to carry the count of the lines left out.
    let burst = 200;
    let mut producer = TextClient::connect(text.as_str(), Duration::from_secs(10)).expect("text connects");
    for i in 0..burst {
        producer.sched(format!("task {i}").as_bytes(), Some("burst")).expect("SCHED");
    }
    producer.end().expect("every SCHED stored");
    for i in 0..burst {
        let mut consumer = TextClient::connect(text.as_str(), Duration::from_secs(10)).expect("text connects");
        assert!(consumer.ask("burst").expect("ASK").is_some(), "task {i} offered");
        drop(consumer);
    }
    let message = "job out of retries: moved to the dead set";
    let logged = |log: &str| -> (u64, u64, u64) {
        let (mut lines, mut carried, mut reported) = (0, 0, 0);
        for line in log.lines() {
            if line.contains("log lines suppressed by the rate limit") && line.contains(&format!("of=\"{message}\"")) {
                reported += field(line, "suppressed").unwrap_or(0);
            } else if line.contains(&format!("{message} suppressed=")) {
                lines += 1;
                carried += field(line, "suppressed").unwrap_or(0);
            }
        }
        (lines, carried, reported)
    };
    let counted = wait::until(Duration::from_secs(20), || {
        let (lines, carried, reported) = logged(&router.child.log_text());
        lines + carried + reported == burst
    });
    let (lines, carried, reported) = logged(&router.child.log_text());
    assert!(
        counted,
        "{lines} lines, {carried} counted on them, {reported} reported alone: not the {burst} dead-letterings\n{}",
        router.child.log_tail(40)
    );
    assert!(reported > 0, "the count after the burst has a line of its own\n{}", router.child.log_tail(40));
    assert!(lines < burst / 2, "the rate limit held ({lines} lines)");
    let status = admin::request(&router.admin, "STATUS").expect("STATUS");
    assert_eq!(status["emq"]["counters"]["dead_lettered"], burst, "{status}");
}
