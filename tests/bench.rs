//! emq-bench's library in-process against an in-process emq-router, the
//! baseline forwarders and tiny fake text and beanstalkd servers, and the
//! `emq-bench` binary against its own eMQP-wire forwarder process: exact
//! counts (every job received exactly once, every acceptance and job the
//! forwarder should send) and the output files; no timing assertions.

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use emq::bench::baseline::{Counted, Wire};
use emq::bench::body::Tally;
use emq::bench::emqp::Target;
use emq::bench::report::{self, Record};
use emq::bench::run::RunResult;
use emq::bench::{baseline, beanstalk, emqp, text, BenchError, LoadSettings};
use emq::config::RawRouterConfig;

use crate::common::proc::{self, Child, TestDir};
use crate::common::wait;
use crate::common::watchdog::Watchdog as BenchWatchdog;

fn load(requests: u64) -> LoadSettings {
    LoadSettings {
        clients: 2,
        workers: 3,
        in_flight: 8,
        requests: Some(requests),
        warmup: Duration::ZERO,
        queues: 2,
        weights: vec![10, 5],
        probe_timeout: Duration::from_secs(3),
        drain_timeout: Duration::from_secs(5),
        ..LoadSettings::default()
    }
}

fn assert_exact(t: &Tally, n: u64) {
    assert_eq!((t.sent, t.received, t.received_all, t.duplicates, t.errors), (n, n, n, 0, 0));
    assert_eq!(t.latency.len(), n);
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn bench_emqp_against_router_and_baseline_writes_outputs() {
    let _w = BenchWatchdog::new("bench_emqp_against_router_and_baseline_writes_outputs", 60);
    let raw = RawRouterConfig {
        frontend_addr: Some("tcp://127.0.0.1:*".into()),
        backend_addr: Some("tcp://127.0.0.1:*".into()),
        admin_addr: Some("tcp://127.0.0.1:*".into()),
        text_addr: Some("off".into()),
        metrics: Some(String::new()),
        shards: Some(2),
        drain_timeout: Some("200ms".into()),
        data_dir: Some(crate::common::data::fresh()),
        ..Default::default()
    };
    let router = emq::router::start(raw.validate().expect("valid config")).expect("router starts");
    let target =
        Target { frontend: router.endpoints.frontend.clone(), backend: router.endpoints.backend.clone(), curve: None };
    let emq_tally = emqp::run(&target, &load(300), Arc::default()).expect("emq run");
    assert_exact(&emq_tally, 300);
    assert_eq!(emq_tally.accepted, 300, "emq-router accepts every REQUEST");
    assert_eq!(emq_tally.ack_latency.len(), 300);

    let fwd = baseline::Forwarder::start(Wire::One).expect("forwarder starts");
    let base_tally = emqp::run(&fwd.target, &load(200), Arc::default()).expect("baseline run");
    assert_exact(&base_tally, 200);
    assert_eq!(base_tally.accepted, 0, "the forwarder sends no acceptance REPLY");
    // Final counts: those read while it runs are published after each
    // batch, so they may trail a job the workers already have.
    assert_eq!(fwd.stop().forwarded, 200);

    let dir = TempDir(std::env::temp_dir().join(format!("emq-bench-test-{}", uuid::Uuid::new_v4().simple())));
    let results = vec![RunResult::from_tally("emq", &emq_tally), RunResult::from_tally("baseline", &base_tally)];
    let record = Record {
        tool: "emq-bench",
        mode: "emqp",
        machine: report::machine(),
        settings: serde_json::to_value(load(300)).expect("settings serialize"),
        results: &results,
        ratios: serde_json::Map::new(),
    };
    let written = report::write(&dir.0, "t", &record).expect("outputs written");
    let names: Vec<String> = written.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
    assert_eq!(names, ["t.json", "t-emq.hgrm", "t-baseline.hgrm", "t.svg"]);
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.0.join("t.json")).unwrap()).unwrap();
    assert_eq!(json["results"][0]["received"], 300);
    assert_eq!(json["results"][1]["lost"], 0);
    assert_eq!(json["settings"]["requests"], 300);
    let hgrm = std::fs::read_to_string(dir.0.join("t-emq.hgrm")).unwrap();
    assert!(hgrm.starts_with("       Value     Percentile TotalCount 1/(1-Percentile)"));
    assert!(hgrm.contains("Total count    =          300]"), "{hgrm}");
    let svg = std::fs::read_to_string(dir.0.join("t.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("baseline"));
}

#[test]
fn bench_reports_a_target_that_is_down() {
    let _w = BenchWatchdog::new("bench_reports_a_target_that_is_down", 20);
    let free = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = free.local_addr().unwrap().port();
    drop(free);
    let addr = format!("tcp://127.0.0.1:{port}");
    let mut l = load(10);
    l.probe_timeout = Duration::from_millis(300);
    let err = emqp::run(&Target { frontend: addr.clone(), backend: addr, curve: None }, &l, Arc::default()).err();
    assert!(matches!(err, Some(BenchError::TargetDown(_))), "{err:?}");
    let err = text::run(&format!("127.0.0.1:{port}"), &l, Arc::default()).err();
    assert!(matches!(err, Some(BenchError::TargetDown(_))), "{err:?}");
}

type FakeQueues = Arc<Mutex<HashMap<Vec<u8>, VecDeque<Vec<u8>>>>>;

/// A tiny text-protocol server: SCHED data@queue, ASK queue → WANT?/NOPE,
/// ACK. Enough for the bench's text mode; the real one is emq's.
fn fake_text_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let queues = FakeQueues::default();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let q = queues.clone();
            std::thread::spawn(move || fake_conn(conn, &q));
        }
    });
    addr
}

fn fake_conn(conn: TcpStream, queues: &FakeQueues) {
    let mut w = conn.try_clone().unwrap();
    for line in BufReader::new(conn).split(b'\n').map_while(Result::ok) {
        if let Some(arg) = line.strip_prefix(b"SCHED ") {
            let at = arg.iter().rposition(|b| *b == b'@').unwrap();
            queues.lock().unwrap().entry(arg[at + 1..].to_vec()).or_default().push_back(arg[..at].to_vec());
        } else if let Some(q) = line.strip_prefix(b"ASK ") {
            let task = queues.lock().unwrap().get_mut(q).and_then(VecDeque::pop_front);
            let reply = match task {
                Some(t) => [b"WANT? ".as_slice(), &t, b"\n"].concat(),
                None => b"NOPE\n".to_vec(),
            };
            if w.write_all(&reply).is_err() {
                return;
            }
        } else if line == b"END" {
            return;
        }
    }
}

#[test]
fn bench_text_mode_against_fake_server() {
    let _w = BenchWatchdog::new("bench_text_mode_against_fake_server", 30);
    let addr = fake_text_server();
    let mut l = load(250);
    l.clients = 3;
    l.workers = 4;
    let t = text::run(&addr, &l, Arc::default()).expect("text run");
    assert_exact(&t, 250);
}

/// Jobs `(id, data)` by tube.
type FakeTubes = HashMap<String, VecDeque<(u64, Vec<u8>)>>;

/// A tiny beanstalkd: `use`, `put`, `watch`, `ignore`,
/// `reserve-with-timeout`, `delete`, `quit`; counts puts and deletes.
#[derive(Default)]
struct FakeBeanstalk {
    tubes: Mutex<FakeTubes>,
    reserved: Mutex<std::collections::HashSet<u64>>,
    next_id: std::sync::atomic::AtomicU64,
    puts: std::sync::atomic::AtomicU64,
    deletes: std::sync::atomic::AtomicU64,
}

fn fake_beanstalkd() -> (String, Arc<FakeBeanstalk>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let fake = Arc::new(FakeBeanstalk::default());
    let f = fake.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let f = f.clone();
            std::thread::spawn(move || fake_beanstalk_conn(conn, &f));
        }
    });
    (addr, fake)
}

fn fake_beanstalk_conn(conn: TcpStream, f: &FakeBeanstalk) {
    let mut w = conn.try_clone().unwrap();
    let mut r = BufReader::new(conn);
    let (mut used, mut watched) = ("default".to_string(), vec!["default".to_string()]);
    let mut line = String::new();
    while matches!(r.read_line(&mut line), Ok(n) if n > 0) {
        let words: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        line.clear();
        let reply = match words.iter().map(String::as_str).collect::<Vec<_>>()[..] {
            ["use", t] => {
                used = t.to_string();
                format!("USING {t}\r\n")
            }
            ["put", _, _, _, n] => {
                let mut data = vec![0; n.parse::<usize>().unwrap() + 2];
                std::io::Read::read_exact(&mut r, &mut data).unwrap();
                assert!(data.ends_with(b"\r\n"));
                data.truncate(data.len() - 2);
                let id = f.next_id.fetch_add(1, Ordering::Relaxed) + 1;
                f.tubes.lock().unwrap().entry(used.clone()).or_default().push_back((id, data));
                f.puts.fetch_add(1, Ordering::Relaxed);
                format!("INSERTED {id}\r\n")
            }
            ["watch", t] => {
                watched.push(t.to_string());
                format!("WATCHING {}\r\n", watched.len())
            }
            ["ignore", t] => {
                watched.retain(|w| w != t);
                format!("WATCHING {}\r\n", watched.len())
            }
            ["reserve-with-timeout", "0"] => {
                let mut tubes = f.tubes.lock().unwrap();
                match watched.iter().find_map(|t| tubes.get_mut(t).and_then(VecDeque::pop_front)) {
                    Some((id, data)) => {
                        f.reserved.lock().unwrap().insert(id);
                        format!("RESERVED {id} {}\r\n{}\r\n", data.len(), String::from_utf8(data).unwrap())
                    }
                    None => "TIMED_OUT\r\n".to_string(),
                }
            }
            ["delete", id] if f.reserved.lock().unwrap().remove(&id.parse::<u64>().unwrap()) => {
                f.deletes.fetch_add(1, Ordering::Relaxed);
                "DELETED\r\n".to_string()
            }
            ["quit"] => return,
            _ => "UNKNOWN_COMMAND\r\n".to_string(),
        };
        if w.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

#[test]
fn bench_beanstalk_mode_against_fake_server() {
    let _w = BenchWatchdog::new("bench_beanstalk_mode_against_fake_server", 30);
    let (addr, fake) = fake_beanstalkd();
    let mut l = load(250);
    l.clients = 3;
    l.workers = 4;
    let t = beanstalk::run(&addr, &l, Arc::default()).expect("beanstalk run");
    assert_exact(&t, 250);
    assert_eq!(fake.puts.load(Ordering::Relaxed), 250, "every job put once");
    // The last deletes are sent just before the consumers' quit.
    let end = Instant::now() + Duration::from_secs(3);
    while fake.deletes.load(Ordering::Relaxed) < 250 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(fake.deletes.load(Ordering::Relaxed), 250, "every job deleted once");
    assert!(fake.tubes.lock().unwrap().values().all(VecDeque::is_empty));
    assert!(fake.reserved.lock().unwrap().is_empty());
}

/// What a forwarder of the eMQP wire must have counted after `n` jobs served
/// by `workers` × `slots`: every REQUEST accepted once and sent to a worker
/// once. The workers' last job-result REPLYs and READYs may be lost when the
/// load generator closes its sockets (linger 0), so those are bounded: each
/// job took a READY credit (at least `n` READYs), a worker sends its REPLY
/// before its READY, and its first `slots` READYs come before any job.
fn assert_emqp_wire_counts(c: &Counted, n: u64, workers: u64, slots: u64) {
    assert_eq!((c.requests, c.accepted, c.forwarded, c.dropped), (n, n, n, 0), "{c}");
    assert!((n..=n + workers * slots).contains(&c.readies), "{c}");
    assert!((n.saturating_sub(workers * slots)..=n).contains(&c.results), "{c}");
}

#[test]
fn bench_emqp_against_the_in_process_emqp_wire_forwarder() {
    let _w = BenchWatchdog::new("bench_emqp_against_the_in_process_emqp_wire_forwarder", 60);
    let fwd = baseline::Forwarder::start(Wire::Emqp).expect("forwarder starts");
    let mut l = load(400);
    l.slots = 2;
    let t = emqp::run(&fwd.target, &l, Arc::default()).expect("baseline-emqp run");
    assert_exact(&t, 400);
    assert_eq!(t.accepted, 400, "every REQUEST gets its acceptance REPLY");
    assert_eq!(t.ack_latency.len(), 400);
    assert_emqp_wire_counts(&fwd.stop(), 400, 3, 2);
}

/// The `key=value` counts the forwarder process prints when it stops.
fn parse_counts(log: &str) -> Option<Counted> {
    let line = log.lines().rev().find(|l| l.starts_with("requests="))?;
    let mut c = Counted::default();
    for pair in line.split_whitespace() {
        let (k, v) = pair.split_once('=')?;
        let v: u64 = v.parse().ok()?;
        match k {
            "requests" => c.requests = v,
            "accepted" => c.accepted = v,
            "forwarded" => c.forwarded = v,
            "results" => c.results = v,
            "readies" => c.readies = v,
            "dropped" => c.dropped = v,
            _ => return None,
        }
    }
    Some(c)
}

#[test]
fn bench_emqp_against_the_emqp_wire_forwarder_process() {
    let _w = BenchWatchdog::new("bench_emqp_against_the_emqp_wire_forwarder_process", 90);
    let dir = TestDir::new("bench-forwarder-emqp");
    let bench = env!("CARGO_BIN_EXE_emq-bench");
    let mut fwd = Child::spawn(
        "forwarder",
        Command::new(bench).args(["forwarder", "--wire", "emqp"]),
        &dir.join("forwarder.log"),
    );
    // Fresh ports: the forwarder binds port `*` and prints what it got.
    let endpoints = wait::until_ok(Duration::from_secs(10), || {
        let log = fwd.log_text();
        let bound = log.lines().find_map(|l| {
            let (fe, be) = l.split_once(' ')?;
            Some((fe.strip_prefix("frontend=")?.to_string(), be.strip_prefix("backend=")?.to_string()))
        });
        bound.ok_or_else(|| format!("not bound yet: {log:?}"))
    });
    let (fe, be) = endpoints.unwrap_or_else(|e| panic!("{e}\n{}", fwd.log_tail(20)));
    let (n, workers, slots) = (600u64, 3u64, 2u64);
    let pid = fwd.pid().to_string();
    let out_dir = dir.path.to_string_lossy().into_owned();
    #[rustfmt::skip]
    let args = [
        "emqp", "--frontend", &fe, "--backend", &be, "--target-name", "forwarder-emqp", "--pid", &pid,
        "--clients", "2", "--workers", "3", "--slots", "2", "--in-flight", "8", "--queues", "2",
        "--requests", "600", "--warmup", "0s", "--probe-timeout", "5s", "--drain-timeout", "10s",
        "--no-progress", "--out", &out_dir, "--name", "t",
    ];
    let (status, stdout, stderr) =
        proc::run("load", Command::new(bench).args(args), &dir.path, Duration::from_secs(60));
    assert!(status.is_some_and(|s| s.success()), "emq-bench emqp: {status:?}\n{stdout}\n{stderr}");
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("t.json")).expect("t.json written")).expect("t.json parses");
    let r = &json["results"][0];
    assert_eq!(r["target"], "forwarder-emqp");
    for (key, want) in [("sent", n), ("received", n), ("lost", 0), ("duplicates", 0), ("errors", 0), ("accepted", n)] {
        assert_eq!(r[key], want, "{key} in {r}");
    }
    assert_eq!(r["ack_latency_ms"]["count"], n, "every job's acceptance REPLY timed");
    assert!(r["extra"]["broker_cpu_us_per_job"].is_number() && r["extra"]["wall_s"].is_number(), "{r}");

    assert_eq!(fwd.stop_with(libc::SIGTERM, Duration::from_secs(10)), Some(0), "{}", fwd.log_tail(20));
    let counts = parse_counts(&fwd.log_text()).unwrap_or_else(|| panic!("no counts\n{}", fwd.log_tail(20)));
    assert_emqp_wire_counts(&counts, n, workers, slots);
}
