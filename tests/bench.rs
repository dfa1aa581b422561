//! emq-bench's library in-process against an in-process emq-router, the
//! baseline forwarder and tiny fake text and beanstalkd servers: exact counts (every job
//! received exactly once) and the output files; no timing assertions.

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use emq::bench::body::Tally;
use emq::bench::emqp::Target;
use emq::bench::report::{self, Record};
use emq::bench::run::RunResult;
use emq::bench::{baseline, beanstalk, emqp, text, BenchError, LoadSettings};
use emq::config::RawRouterConfig;

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
    let target = Target { frontend: router.endpoints.frontend.clone(), backend: router.endpoints.backend.clone() };
    let emq_tally = emqp::run(&target, &load(300), Arc::default()).expect("emq run");
    assert_exact(&emq_tally, 300);
    assert_eq!(emq_tally.accepted, 300, "emq-router accepts every REQUEST");
    assert_eq!(emq_tally.ack_latency.len(), 300);

    let fwd = baseline::Forwarder::start().expect("forwarder starts");
    let base_tally = emqp::run(&fwd.target, &load(200), Arc::default()).expect("baseline run");
    assert_exact(&base_tally, 200);
    assert_eq!(base_tally.accepted, 0, "the forwarder sends no acceptance REPLY");
    assert_eq!(fwd.forwarded.load(Ordering::Relaxed), 200);

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
    let err = emqp::run(&Target { frontend: addr.clone(), backend: addr }, &l, Arc::default()).err();
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
