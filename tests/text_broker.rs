//! The text protocol against the real router (its shards behind the text
//! server), with one and several shards, and across protocols with raw
//! eMQP peers.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use emq::router::RouterHandle;

use crate::common::admin::admin;
use crate::emqp_router::{config, eventually, Peer, Watchdog};
use crate::text::{pipelined_sched_then_ask_ack, spec_example, TextConn};

pub fn router_with_text(shards: usize, tweak: impl FnOnce(&mut emq::config::RawRouterConfig)) -> RouterHandle {
    let cfg = config(shards, |r| {
        r.text_addr = Some("127.0.0.1:0".into());
        tweak(r);
    });
    emq::router::start(cfg).expect("router starts")
}

pub fn connect(h: &RouterHandle) -> TextConn {
    TextConn::connect(h.endpoints.text.expect("text front end on"))
}

#[test]
fn spec_example_whole_and_one_byte_per_write() {
    let _w = Watchdog::new("text_broker_example", 30);
    for shards in [1, 3] {
        let h = router_with_text(shards, |_| {});
        for one_byte in [false, true] {
            spec_example(connect(&h), one_byte);
        }
        assert_eq!(h.counters().text_acked.load(Relaxed), 2);
    }
}

#[test]
fn pipelined_100k_sched_then_ask_ack_until_nope() {
    let _w = Watchdog::new("text_broker_100k", 240);
    // durability "async": each ASK waits for its WANT?, which with "sync"
    // waits for a sync (README "Durability"): 100,000 syncs would make this
    // a test of the disk.
    let h = router_with_text(2, |r| r.durability = Some("async".into()));
    let n = 100_000;
    pipelined_sched_then_ask_ack(connect(&h), n);
    assert_eq!(h.counters().text_acked.load(Relaxed), n as u64);
}

#[test]
fn disconnect_returns_to_front_and_dcl_to_back() {
    let _w = Watchdog::new("text_broker_front_back", 30);
    for shards in [1, 3] {
        let h = router_with_text(shards, |_| {});
        let mut a = connect(&h);
        a.send(b"SCHED one@q\nSCHED two@q\nSCHED three@q\nASK q\n");
        a.expect(b"WANT? one\n");
        drop(a);
        eventually(5, "offer back", || h.counters().text_returned_disconnect.load(Relaxed) == 1);
        let mut b = connect(&h);
        b.send(b"ASK q\n");
        b.expect(b"WANT? one\n");
        b.send(b"DCL\nASK q\n");
        b.expect(b"WANT? two\n");
        b.send(b"ACK\nASK q\n");
        b.expect(b"WANT? three\n");
        b.send(b"ACK\nASK q\n");
        b.expect(b"WANT? one\n");
        b.send(b"DEL\nASK q\n");
        b.expect(b"NOPE\n");
    }
}

#[test]
fn offer_timeout_then_late_ack_gets_no_task() {
    let _w = Watchdog::new("text_broker_offer_timeout", 30);
    let h = router_with_text(1, |r| r.text_offer_timeout = Some("200ms".into()));
    let mut a = connect(&h);
    a.send(b"SCHED t@q\nASK q\n");
    a.expect(b"WANT? t\n");
    std::thread::sleep(Duration::from_millis(500));
    let mut b = connect(&h);
    b.send(b"ASK q\n");
    b.expect(b"WANT? t\n");
    a.send(b"ACK\n");
    a.expect_err("NO_TASK");
    assert_eq!(h.counters().text_returned_timeout.load(Relaxed), 1);
}

#[test]
fn queue_full_and_bad_input() {
    let _w = Watchdog::new("text_broker_bad_input", 30);
    let h = crate::ops::router_with_http(|r| {
        r.max_queue_len = Some(1);
        r.text_max_line_bytes = Some(64);
    });
    let mut c = connect(&h);
    c.send(b"SCHED a@q\nSCHED b@q\n");
    c.expect_err("QUEUE_FULL");
    c.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    c.expect_err("UNKNOWN_COMMAND");
    c.expect_closed(); // an HTTP request closes the connection
    let mut c = connect(&h);
    c.send(&[b'x'; 100]);
    c.send(b"\n\xff\xfe\x00garbage\nASK q\n");
    c.expect_err("TOO_BIG");
    c.expect_err("UNKNOWN_COMMAND");
    c.expect(b"WANT? a\n");
    // The clients' barrier is BAD_FORMAT on the wire, counted apart; any
    // other invalid queue name is a BAD_FORMAT error (even while an offer
    // is held: the format error wins over PENDING).
    c.send(b"ASK !sync\nASK !sync\nASK !other\n");
    c.expect_err("BAD_FORMAT");
    c.expect_err("BAD_FORMAT");
    c.expect_err("BAD_FORMAT");
    let status = admin(&h, "STATUS");
    let errors = &status["emq"]["text"]["errors_by_code"];
    assert_eq!(errors["QUEUE_FULL"], 1, "{status}");
    assert_eq!(errors["TOO_BIG"], 1, "{status}");
    assert_eq!((&errors["BAD_FORMAT"], &status["emq"]["text"]["barriers"]), (&1.into(), &2.into()), "{status}");
    let (_, metrics) = crate::ops::http_get(h.endpoints.metrics.expect("metrics on"), "/metrics");
    let sample = |name: &str, label: &str| {
        let line = metrics.lines().find(|l| l.starts_with(&format!("{name}{{")) && l.contains(label));
        line.and_then(|l| l.rsplit(' ').next()).map(str::to_string)
    };
    assert_eq!(sample("emq_text_barriers_total", "router="), Some("2".into()), "{metrics}");
    assert_eq!(sample("emq_text_errors_total", "code=\"BAD_FORMAT\""), Some("1".into()), "{metrics}");
}

#[test]
fn a_thousand_concurrent_connections() {
    let _w = Watchdog::new("text_broker_1000_conns", 240);
    let h = router_with_text(2, |_| {});
    let addr = h.endpoints.text.unwrap();
    let threads: Vec<_> = (0..1000)
        .map(|i| {
            std::thread::Builder::new()
                .stack_size(128 * 1024)
                .spawn(move || {
                    let mut c = TextConn::connect(addr);
                    let q = format!("q{}", i % 10);
                    c.send(format!("SCHED job-{i}@{q}\nASK {q}\n").as_bytes());
                    let line = c.line();
                    assert!(line.starts_with(b"WANT? job-"), "{}", line.escape_ascii());
                    c.send(b"ACK\nEND\n");
                    c.expect_closed();
                    line
                })
                .unwrap()
        })
        .collect();
    let mut got: Vec<Vec<u8>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    got.sort();
    got.dedup();
    assert_eq!(got.len(), 1000, "every task taken exactly once");
    assert_eq!(h.counters().text_acked.load(Relaxed), 1000);
    let status = admin(&h, "STATUS");
    assert_eq!(status["waiting_messages_by_queue"], serde_json::json!({}), "{status}");
}

#[test]
fn text_sched_runs_on_an_emqp_worker() {
    let _w = Watchdog::new("text_to_emqp", 30);
    for shards in [1, 3] {
        let h = router_with_text(shards, |_| {});
        let w = Peer::new(&h.endpoints.backend, b"w");
        w.inform_worker(r#"[[10, "jobs"]]"#);
        w.ready(1);
        std::thread::sleep(Duration::from_millis(100));
        let mut c = connect(&h);
        c.send(b"SCHED [\"run\", {\"x\": 1}]@jobs\n");
        let req = w.expect("REQUEST");
        assert_eq!(req.len(), 7);
        assert_eq!(req[3].len(), 36, "fresh msgid");
        assert_eq!(
            (req[4].as_slice(), req[5].as_slice(), req[6].as_slice()),
            (&b"jobs"[..], &b"reply-requested"[..], &b"[\"run\", {\"x\": 1}]"[..])
        );
        w.job_reply(&req[3]);
        eventually(5, "completed", || h.counters().completed_jobs.load(Relaxed) == 1);
    }
}

#[test]
fn emqp_request_is_offered_to_ask_with_line_breaks_as_spaces() {
    let _w = Watchdog::new("emqp_to_text", 30);
    for shards in [1, 3] {
        let h = router_with_text(shards, |_| {});
        let client = Peer::new(&h.endpoints.frontend, b"client");
        client.request("m1", "default", "", "line1\nline2\r\nend");
        assert_eq!(client.expect("REPLY")[4], b"m1");
        let mut c = connect(&h);
        c.send(b"ASK default\n");
        c.expect(b"WANT? line1 line2  end\n");
        c.send(b"ACK\n");
        eventually(5, "rewritten counted", || admin(&h, "STATUS")["emq"]["text"]["offers_rewritten"] == 1);
    }
}

#[test]
fn emq_cli_sched_and_ask() {
    let _w = Watchdog::new("emq_cli_text", 60);
    let h = router_with_text(1, |_| {});
    let text = h.endpoints.text.unwrap().to_string();
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_emq-cli"))
            .args(["--text", &text, "--timeout", "2s"])
            .args(args)
            .output()
            .expect("emq-cli runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    cli(&["sched", "hello world", "--queue", "cliq"]);
    cli(&["sched", "second", "--queue", "cliq"]);
    assert_eq!(cli(&["ask", "cliq", "--dcl"]), "hello world\n");
    assert_eq!(cli(&["ask", "cliq"]), "second\n");
    assert_eq!(cli(&["--json", "ask", "cliq"]), "{\"task\":\"hello world\"}\n");
    assert_eq!(cli(&["ask", "cliq"]), "NOPE\n");
    // A long poll: answered when a task arrives, not at the end of its wait
    // (which is longer than --timeout).
    let started = std::time::Instant::now();
    let got = std::thread::scope(|scope| {
        let waiting = scope.spawn(|| cli(&["ask", "cliq", "--wait", "20s"]));
        std::thread::sleep(Duration::from_millis(300));
        cli(&["sched", "late", "--queue", "cliq"]);
        waiting.join().expect("the asking thread")
    });
    assert_eq!(got, "late\n");
    assert!(started.elapsed() < Duration::from_secs(15), "answered at the end of the wait: {:?}", started.elapsed());
    let started = std::time::Instant::now();
    assert_eq!(cli(&["ask", "cliq", "--wait", "400ms"]), "NOPE\n");
    assert!(started.elapsed() >= Duration::from_millis(400), "NOPE before the wait: {:?}", started.elapsed());
}

#[test]
fn a_second_offer_gets_its_own_full_timeout() {
    let _w = Watchdog::new("text_broker_second_offer", 30);
    let h = router_with_text(1, |r| r.text_offer_timeout = Some("600ms".into()));
    let mut a = connect(&h);
    a.send(b"SCHED one@q\nSCHED two@q\nASK q\n");
    a.expect(b"WANT? one\n");
    a.send(b"ACK\n");
    std::thread::sleep(Duration::from_millis(300));
    a.send(b"ASK q\n");
    a.expect(b"WANT? two\n");
    // 400 ms later the first offer's deadline has passed, not the second's.
    std::thread::sleep(Duration::from_millis(400));
    let mut b = connect(&h);
    b.send(b"ASK q\n");
    b.expect(b"NOPE\n");
    eventually(5, "second offer timed out", || h.counters().text_returned_timeout.load(Relaxed) == 1);
    b.send(b"ASK q\n");
    b.expect(b"WANT? two\n");
}

#[test]
fn a_sched_behind_a_waiting_long_poll_ask_goes_once_the_ask_is_answered() {
    // The shard answers in the order commands reach it; a SCHED sent while
    // the connection's long-poll ASK waits there would be answered first
    // and its outcome taken for the ASK's (and the ASK's offer for the
    // SCHED's). Queues q and r share the one shard.
    let _w = Watchdog::new("text_broker_sched_behind_long_poll", 30);
    for shards in [1, 3] {
        let h = router_with_text(shards, |_| {});
        let mut a = connect(&h);
        a.send(b"ASK q 5000\nSCHED y@r\n");
        // Let the ASK reach its shard and wait (were b's SCHED first, the ASK
        // would simply find x: the same replies).
        std::thread::sleep(Duration::from_millis(200));
        let mut b = connect(&h);
        b.send(b"SCHED x@q\n");
        a.expect(b"WANT? x\n");
        a.send(b"ACK\nASK r\n");
        a.expect(b"WANT? y\n");
        a.send(b"ACK\nASK q\nASK r\n");
        a.expect(b"NOPE\n");
        a.expect(b"NOPE\n");
        assert_eq!(h.counters().text_acked.load(Relaxed), 2, "{shards} shards");
        assert_eq!(h.counters().text_returned_disconnect.load(Relaxed), 0);
    }
}
