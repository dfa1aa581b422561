//! Operating emq (README "Metrics and the status page"): `/metrics` parsed
//! by the real Python `prometheus_client` parser and checked against
//! STATUS after a scripted run; the status page rendered by headless
//! Chromium.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use emq::client::text::TextClient;
use emq::router::RouterHandle;
use serde_json::Value;

use crate::common::admin::admin;
use crate::common::ports::free_port;
use crate::common::proc::{self, TestDir};
use crate::common::python;
use crate::emqp_router::{config, Watchdog};

const T: Duration = Duration::from_secs(5);

/// A router with the text protocol and the HTTP server on fresh ports.
pub fn router_with_http(tweak: impl FnOnce(&mut emq::config::RawRouterConfig)) -> RouterHandle {
    let cfg = config(1, |r| {
        r.text_addr = Some("127.0.0.1:0".into());
        r.metrics = Some(format!("127.0.0.1:{}", free_port()));
        tweak(r);
    });
    emq::router::start(cfg).expect("router starts")
}

/// `GET path` over HTTP/1.0: `(status line, body)`.
pub fn http_get(addr: SocketAddr, path: &str) -> (String, String) {
    let mut s = TcpStream::connect_timeout(&addr, T).expect("HTTP server accepts");
    s.set_read_timeout(Some(T)).expect("timeout");
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").expect("request sent");
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("answer read");
    let (head, body) = raw.split_once("\r\n\r\n").expect("headers, then a body");
    (head.lines().next().unwrap_or("").to_string(), body.to_string())
}

/// A scripted run over the text protocol: `mail` gets 3 tasks (one ACKed,
/// one DELeted, one left waiting) and a 4th refused (QUEUE_FULL, limit 3);
/// `reports` gets 1, ACKed.
pub fn scripted_run(h: &RouterHandle) {
    let addr = h.endpoints.text.expect("text on");
    let mut c = TextClient::connect(addr, T).expect("text connects");
    for i in 0..3 {
        c.sched(format!("mail {i}").as_bytes(), Some("mail")).expect("SCHED");
    }
    c.sched(b"one too many", Some("mail")).expect("SCHED sent");
    c.sched(b"report", Some("reports")).expect("SCHED");
    match c.sync() {
        Err(emq::client::text::TextClientError::Deferred(errors)) => assert_eq!(errors.len(), 1, "{errors:?}"),
        other => panic!("the 4th SCHED is refused: {other:?}"),
    }
    assert!(c.ask("mail").expect("ASK").is_some());
    c.ack().expect("ACK");
    assert!(c.ask("mail").expect("ASK").is_some());
    c.del().expect("DEL");
    assert!(c.ask("reports").expect("ASK").is_some());
    c.ack().expect("ACK");
    c.end().expect("END");
}

/// Parses exposition text with `prometheus_client.parser` in the test
/// venv: every sample as `[name, {labels}, value]`.
fn parse_with_python(text: &str) -> Vec<(String, serde_json::Map<String, Value>, f64)> {
    let script = "import json, sys\n\
                  from prometheus_client.parser import text_string_to_metric_families\n\
                  out = []\n\
                  for fam in text_string_to_metric_families(sys.stdin.read()):\n\
                  \x20   for s in fam.samples:\n\
                  \x20       out.append([s.name, s.labels, s.value])\n\
                  print(json.dumps(out))\n";
    let mut child = Command::new(python::venv().join("bin").join("python"))
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the venv's python runs");
    child.stdin.take().expect("stdin").write_all(text.as_bytes()).expect("exposition written");
    let out = child.wait_with_output().expect("the parser ends");
    assert!(
        out.status.success(),
        "prometheus_client rejects /metrics: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let samples: Vec<(String, serde_json::Map<String, Value>, f64)> =
        serde_json::from_slice(&out.stdout).expect("the parser's JSON");
    samples
}

#[test]
fn metrics_parse_with_prometheus_client_and_match_status() {
    let _w = Watchdog::new("metrics_match_status", 120);
    let h = router_with_http(|r| r.max_queue_len = Some(3));
    scripted_run(&h);
    let addr = h.endpoints.metrics.expect("metrics on");
    let (status_line, text) = http_get(addr, "/metrics");
    assert!(status_line.contains(" 200"), "{status_line}");
    let samples = parse_with_python(&text);
    let status = admin(&h, "STATUS");
    let sample = |name: &str, label: (&str, &str)| -> Option<f64> {
        samples
            .iter()
            .find(|(n, l, _)| n == name && l.get(label.0).and_then(Value::as_str) == Some(label.1))
            .map(|s| s.2)
    };
    let pairs = [
        ("emq_jobs_accepted_total", "accepted_messages_by_queue"),
        ("emq_jobs_dispatched_total", "dispatched_messages_by_queue"),
        ("emq_jobs_completed_total", "completed_messages_by_queue"),
        ("emq_jobs_failed_total", "failed_messages_by_queue"),
        ("emq_jobs_dead_lettered_total", "dead_lettered_messages_by_queue"),
        ("emq_jobs_waiting", "waiting_messages_by_queue"),
    ];
    for queue in ["mail", "reports"] {
        for (metric, key) in pairs {
            let want = status[key][queue].as_u64().unwrap_or(0) as f64;
            assert_eq!(
                sample(metric, ("queue", queue)),
                Some(want),
                "{metric}{{queue={queue}}} vs STATUS {key}\n{text}"
            );
        }
    }
    // The figures themselves, so that a STATUS that lost them fails too.
    assert_eq!(sample("emq_jobs_accepted_total", ("queue", "mail")), Some(3.0));
    assert_eq!(sample("emq_jobs_completed_total", ("queue", "mail")), Some(1.0));
    assert_eq!(sample("emq_jobs_failed_total", ("queue", "mail")), Some(1.0));
    assert_eq!(sample("emq_jobs_waiting", ("queue", "mail")), Some(1.0));
    let refused = status["emq"]["counters"]["rejected_queue_full"].as_u64().map(|n| n as f64);
    assert_eq!(sample("emq_jobs_refused_total", ("reason", "queue_full")), refused);
    assert_eq!(refused, Some(1.0));
    let accepted = status["emq"]["counters"]["accepted_jobs"].as_u64().map(|n| n as f64);
    assert_eq!(sample("emq_events_total", ("event", "accepted_jobs")), accepted);
    // Histograms: every ACK is one end-to-end observation, +Inf = count.
    let inf = samples.iter().find(|(n, l, _)| {
        n == "emq_job_end_to_end_seconds_bucket"
            && l.get("queue") == Some(&"mail".into())
            && l.get("le") == Some(&"+Inf".into())
    });
    assert_eq!(inf.map(|s| s.2), Some(1.0), "{text}");
    assert_eq!(sample("emq_job_end_to_end_seconds_count", ("queue", "reports")), Some(1.0));
    let (status_line, _) = http_get(addr, "/nothing");
    assert!(status_line.contains(" 404"), "{status_line}");
}

#[test]
fn metrics_fold_queues_past_the_limit_and_can_be_off() {
    let _w = Watchdog::new("metrics_fold", 60);
    let h = router_with_http(|r| r.metrics_max_queues = Some(2));
    let mut c = TextClient::connect(h.endpoints.text.expect("text on"), T).expect("text connects");
    for q in ["a", "b", "c", "d"] {
        c.sched(b"x", Some(q)).expect("SCHED");
    }
    c.sync().expect("SCHEDs answered");
    let (_, text) = http_get(h.endpoints.metrics.expect("metrics on"), "/metrics");
    for line in [
        "emq_jobs_waiting{router=\"emq\",queue=\"a\"} 1",
        "emq_jobs_waiting{router=\"emq\",queue=\"b\"} 1",
        "emq_jobs_waiting{router=\"emq\",queue=\"_other\"} 2",
        "emq_metrics_queues_folded{router=\"emq\"} 2",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} missing\n{text}");
    }
    assert!(!text.contains("queue=\"c\""), "{text}");
    let off = emq::router::start(config(1, |_| {})).expect("router starts");
    assert_eq!(off.endpoints.metrics, None);
}

/// Headless Chromium (Debian's `chromium`, installed by `.ci/run`) with a
/// fresh profile in `dir`, loading `url` with `args`: `(stdout, stderr)`.
pub fn chromium(dir: &TestDir, url: &str, args: &[&str]) -> (String, String) {
    let mut cmd = Command::new("chromium");
    cmd.args(["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-dev-shm-usage"])
        .arg(format!("--user-data-dir={}", dir.join("profile").display()))
        .args(args)
        .arg(url);
    let (status, out, err) = proc::run("chromium", &mut cmd, &dir.path, Duration::from_secs(60));
    assert!(status.is_some_and(|s| s.success()), "chromium {args:?} {url}: {status:?}\n{err}");
    (out, err)
}

#[test]
fn status_page_renders_in_headless_chromium() {
    let _w = Watchdog::new("status_page_chromium", 120);
    let dir = TestDir::new("status-page");
    let h = router_with_http(|r| r.max_queue_len = Some(3));
    scripted_run(&h);
    let url = format!("http://{}/", h.endpoints.metrics.expect("metrics on"));
    let (dom, _) = chromium(&dir, &url, &["--dump-dom"]);
    for want in ["<td>mail</td>", "<td>reports</td>", "<table id=\"workers\">", "<table id=\"dead\">"] {
        assert!(dom.contains(want), "{want} missing in the rendered page:\n{dom}");
    }
    let figure = dom.split("<figure id=\"latency\">").nth(1).unwrap_or("");
    assert!(figure.trim_start().starts_with("<svg"), "no latency SVG:\n{dom}");
    for queue in ["mail", "reports"] {
        let legend = figure.split("</text>").any(|t| t.rsplit('>').next().is_some_and(|l| l.trim() == queue));
        assert!(legend, "{queue} not in the plot's legend:\n{figure}");
    }
    let (status_line, _) = http_get(h.endpoints.metrics.expect("metrics on"), "/");
    assert!(status_line.contains(" 200"), "{status_line}");
}
