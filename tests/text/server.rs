//! The text server, every spec example byte for byte over plain TCP.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use emq::protocol::text::ErrorCode;

use super::{
    pipelined_sched_then_ask_ack, spec_example, text_config, text_wait_until, text_watchdog, TextConn, TextFixture,
};

#[test]
fn example_session_byte_for_byte() {
    let _w = text_watchdog(20);
    let f = TextFixture::default();
    let mut c = f.connect();
    // Line by line, as in the spec, reading each answer before going on.
    c.send(b"SCHED { email: \"test@test.de\", message: \"test message\" }@EMAILSERVICE\n");
    c.send(b"ASK EMAILSERVICE\n");
    c.expect(b"WANT? { email: \"test@test.de\", message: \"test message\" }\n");
    c.send(b"ACK\nASK EMAILSERVICE\n");
    c.expect(b"NOPE\n");
    c.send(b"ACK\n");
    c.expect(b"ERR NO_TASK no task is offered on this connection\n");
    c.send(b"END\n");
    c.expect_closed();
    assert_eq!(f.backend.counts().acked, 1);
}

#[test]
fn example_session_pipelined_and_one_byte_per_write() {
    let _w = text_watchdog(30);
    let f = TextFixture::default();
    for one_byte in [false, true] {
        spec_example(f.connect(), one_byte);
    }
    assert_eq!(f.backend.counts().acked, 2);
}

#[test]
fn at_rule_table_over_the_wire() {
    let _w = text_watchdog(20);
    let f = TextFixture::default();
    let mut c = f.connect();
    c.send(b"SCHED test\nSCHED {\"to\":\"a@b.c\"}\nSCHED hello@\nsched test@test.de\r\nSCHED x\r\r\n");
    c.send(b"ASK\nACK\nASK\nACK\nAsK \nACK\nASK\nDEL\nASK test.de\nACK\nASK\n");
    c.expect(b"WANT? test\n");
    c.expect(b"WANT? {\"to\":\"a@b.c\"}\n");
    c.expect(b"WANT? hello@\n");
    c.expect(b"WANT? x \n");
    c.expect(b"WANT? test\n");
    c.expect(b"NOPE\n");
    assert_eq!(f.stats.offers_rewritten.load(Relaxed), 1, "x\\r was written as x and a space");
    assert_eq!(f.backend.counts().deleted, 1);
}

#[test]
fn errors_and_state() {
    let _w = text_watchdog(20);
    let f = TextFixture::default();
    let mut c = f.connect();
    c.send(b"SCHED\nSCHED @q\nASK bad/name\nACK x\nDCL\nDEL\nFOO bar\nWANT? x\n");
    for code in ["BAD_FORMAT", "BAD_FORMAT", "BAD_FORMAT", "BAD_FORMAT", "NO_TASK", "NO_TASK", "UNKNOWN_COMMAND"] {
        c.expect_err(code);
    }
    c.expect_err("UNKNOWN_COMMAND");
    c.send(b"SCHED a@q\nSCHED b@q\nASK q\nASK q\nASK bad/name\nACK x\nEND x\n");
    c.expect(b"WANT? a\n");
    c.expect_err("PENDING");
    c.expect_err("BAD_FORMAT");
    c.expect_err("BAD_FORMAT");
    c.expect_err("BAD_FORMAT");
    c.send(b"DCL\nASK q\nACK\nASK q\nACK\nASK q\n");
    c.expect(b"WANT? b\n");
    c.expect(b"WANT? a\n");
    c.expect(b"NOPE\n");
    assert_eq!(f.stats.errors(ErrorCode::BadFormat), 7);
    assert_eq!(f.stats.errors(ErrorCode::NoTask), 2);
    assert_eq!(f.stats.errors(ErrorCode::UnknownCommand), 2);
    assert_eq!(f.stats.errors(ErrorCode::Pending), 1);
    let counts = f.backend.counts();
    assert_eq!((counts.declined, counts.acked), (1, 2));
}

#[test]
fn pipelined_100k_sched_then_ask_ack_until_nope() {
    let _w = text_watchdog(120);
    let f = TextFixture::default();
    let n = 100_000;
    pipelined_sched_then_ask_ack(f.connect(), n);
    assert_eq!(f.backend.counts().acked, n as u64);
    assert!(f.backend.queue("bulk").is_empty());
}

#[test]
fn bulk_conversation_one_byte_per_write() {
    let _w = text_watchdog(120);
    let f = TextFixture::default();
    let n = 1_000;
    let mut c = f.connect();
    let mut bytes = Vec::new();
    for i in 0..n {
        bytes.extend_from_slice(format!("SCHED task-{i}@bulk\n").as_bytes());
    }
    bytes.extend_from_slice(&b"ASK bulk\nACK\n".repeat(n));
    bytes.extend_from_slice(b"ASK bulk\nEND\n");
    for b in &bytes {
        c.send(std::slice::from_ref(b));
    }
    for i in 0..n {
        c.expect(format!("WANT? task-{i}\n").as_bytes());
    }
    c.expect(b"NOPE\n");
    c.expect_closed();
    assert_eq!(f.backend.counts().acked, n as u64);
}

#[test]
fn disconnect_holding_an_offer_returns_it_to_the_front() {
    let _w = text_watchdog(20);
    let f = TextFixture::default();
    let mut a = f.connect();
    a.send(b"SCHED one@q\nSCHED two@q\nASK q\n");
    a.expect(b"WANT? one\n");
    assert_eq!(f.stats.offers_held.load(Relaxed), 1);
    drop(a);
    text_wait_until("the offer to come back", || f.backend.queue("q").len() == 2);
    assert_eq!(f.backend.queue("q"), vec![b"one".to_vec(), b"two".to_vec()]);
    let mut b = f.connect();
    b.send(b"ASK q\nEND\n");
    b.expect(b"WANT? one\n");
    b.expect_closed();
    text_wait_until("END to return the offer", || f.backend.queue("q").len() == 2);
    assert_eq!(f.backend.counts().released, 2);
    assert_eq!(f.stats.offers_held.load(Relaxed), 0);
}

#[test]
fn offer_timeout_returns_the_task_and_a_late_ack_gets_no_task() {
    let _w = text_watchdog(20);
    let f = TextFixture::start(text_config(|c| c.offer_timeout = Duration::from_millis(200)), 100);
    let mut a = f.connect();
    a.send(b"SCHED one\nSCHED two\nASK\n");
    a.expect(b"WANT? one\n");
    std::thread::sleep(Duration::from_millis(300));
    let mut b = f.connect();
    b.send(b"ASK\n");
    b.expect(b"WANT? one\n");
    a.send(b"ACK\nASK\n");
    a.expect(b"ERR NO_TASK no task is offered on this connection\n");
    a.expect(b"WANT? two\n");
    b.send(b"ACK\n");
    a.send(b"ACK\nASK\n");
    a.expect(b"NOPE\n");
    text_wait_until("both ACKs", || f.backend.counts().acked == 2);
    assert_eq!(f.backend.counts().timed_out, 1);
}

#[test]
fn queue_full_and_shutting_down() {
    let _w = text_watchdog(20);
    let f = TextFixture::start(text_config(|_| {}), 2);
    let mut c = f.connect();
    c.send(b"SCHED a\nSCHED b\nSCHED c\nASK\n");
    c.expect(b"ERR QUEUE_FULL the queue is full\n");
    c.expect(b"WANT? a\n");
    c.send(b"SCHED c\nDCL\nASK\n");
    c.expect(b"WANT? b\n");
    assert_eq!(f.backend.queue("default"), vec![b"c".to_vec(), b"a".to_vec()], "DCL is taken back above the limit");
    f.backend.set_shutting_down(true);
    c.send(b"SCHED d\nACK\n");
    c.expect(b"ERR SHUTTING_DOWN the broker is shutting down\n");
    assert_eq!(f.stats.errors(ErrorCode::QueueFull), 1);
}

#[test]
fn bad_input_gets_errors_and_others_are_still_served() {
    let _w = text_watchdog(30);
    let f = TextFixture::start(text_config(|c| c.max_line_bytes = 64), 100);
    let mut good = f.connect();
    let mut bad = f.connect();
    // An HTTP request: one error, then the connection is closed.
    bad.send(b"GET / HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n\r\n");
    bad.expect_err("UNKNOWN_COMMAND");
    bad.expect_closed();
    let mut bad = f.connect();
    bad.send(b"\x00\x01\xff\xfe garbage \x80\n\n \t \n");
    bad.expect(b"ERR UNKNOWN_COMMAND unknown command \"\\x00\\x01\\xff\\xfe\"\n");
    // A leading space is refused saying so, and nothing is stored.
    bad.send(b" SCHED x\n\tASK\nASK\n");
    bad.expect(b"ERR UNKNOWN_COMMAND the line starts with a space: write the command first (SCHED, ASK, ACK, DCL, DEL or END)\n");
    bad.expect(
        b"ERR UNKNOWN_COMMAND the line starts with a tab: write the command first (SCHED, ASK, ACK, DCL, DEL or END)\n",
    );
    bad.expect(b"NOPE\n");
    let long = [b"SCHED ".as_slice(), &[b'x'; 58]].concat();
    assert_eq!(long.len(), 64);
    bad.send(&[long.as_slice(), b"\r\n"].concat());
    bad.send(&[long.as_slice(), b"y\r\nASK\n"].concat());
    bad.expect_err("TOO_BIG");
    bad.expect(format!("WANT? {}\n", "x".repeat(58)).as_bytes());
    good.send(b"SCHED fine\nASK\n");
    good.expect(b"WANT? fine\n");
    assert_eq!(f.stats.errors(ErrorCode::TooBig), 1);
}

#[test]
fn an_over_long_line_is_refused_while_it_streams_in() {
    let _w = text_watchdog(60);
    let f = TextFixture::start(text_config(|c| c.max_line_bytes = 1 << 20), 100);
    let mut c = f.connect();
    c.send(b"SCHED ");
    let chunk = vec![b'z'; 64 * 1024];
    // 2 MiB without an LF: the error arrives before the line ends.
    for _ in 0..32 {
        c.send(&chunk);
    }
    c.expect_err("TOO_BIG");
    for _ in 0..32 {
        c.send(&chunk);
    }
    c.send(b"\nSCHED small\nASK\n");
    c.expect(b"WANT? small\n");
}

#[test]
fn a_hanging_half_line_is_closed_after_the_line_timeout() {
    let _w = text_watchdog(20);
    let f = TextFixture::start(text_config(|c| c.line_timeout = Duration::from_millis(200)), 100);
    let mut idle = f.connect();
    let mut half = f.connect();
    half.send(b"SCHED never fini");
    half.expect_closed();
    std::thread::sleep(Duration::from_millis(300));
    idle.send(b"SCHED x\nASK\n");
    idle.expect(b"WANT? x\n");
    assert_eq!(f.stats.line_timeout_closed.load(Relaxed), 1);
    assert!(f.backend.queue("default").is_empty(), "the half line was not stored");
}

#[test]
fn past_the_connection_cap_busy_once_then_closed() {
    let _w = text_watchdog(20);
    let f = TextFixture::start(text_config(|c| c.max_connections = 2), 100);
    let mut a = f.connect();
    let mut b = f.connect();
    a.send(b"ASK\n");
    a.expect(b"NOPE\n");
    b.send(b"ASK\n");
    b.expect(b"NOPE\n");
    let mut c = f.connect();
    c.expect(b"ERR BUSY too many connections\n");
    c.expect_closed();
    drop(a);
    text_wait_until("a slot to free up", || f.stats.connections_open.load(Relaxed) == 1);
    let mut d = f.connect();
    d.send(b"ASK\n");
    d.expect(b"NOPE\n");
    assert_eq!(f.stats.errors(ErrorCode::Busy), 1);
}

#[test]
fn shutdown_closes_connections_and_returns_offers() {
    let _w = text_watchdog(20);
    let f = TextFixture::default();
    let mut c: TextConn = f.connect();
    c.send(b"SCHED a\nASK\n");
    c.expect(b"WANT? a\n");
    let (server, backend, stats) = (f.server, f.backend, f.stats);
    server.shutdown();
    c.expect_closed();
    assert_eq!(backend.queue("default"), vec![b"a".to_vec()]);
    assert_eq!(stats.connections_open.load(Relaxed), 0);
}

#[test]
fn an_http_request_on_the_text_port_is_refused_and_its_body_never_runs() {
    // Cross-protocol request forgery: a web page makes the browser POST a
    // text/plain form to 127.0.0.1:47294, its body a list of commands
    // (the attack Redis closes connections for).
    let _w = text_watchdog(20);
    let f = TextFixture::default();
    let mut victim = f.connect();
    victim.send(b"SCHED real job@default\n");
    text_wait_until("the real job is queued", || f.backend.queue("default").len() == 1);
    for first in [&b"POST / HTTP/1.1\r\nHost: 127.0.0.1:47294\r\n"[..], b"Host: 127.0.0.1\r\n"] {
        let mut c = f.connect();
        let mut forged = first.to_vec();
        forged.extend_from_slice(b"Content-Type: text/plain\r\n\r\nSCHED evil@default\nASK default\nDEL\n");
        c.send(&forged);
        let line = c.line();
        assert!(line.starts_with(b"ERR UNKNOWN_COMMAND an HTTP request on the text port"), "{}", line.escape_ascii());
        c.expect_closed();
    }
    assert_eq!(f.backend.queue("default"), vec![b"real job".to_vec()], "nothing taken, deleted or added");
    assert_eq!(f.backend.counts().deleted, 0);
}

#[test]
fn a_connection_paused_for_the_input_budget_resumes_when_another_thread_frees_the_lead() {
    // Two I/O threads: connections go to them in turn (a and c to the
    // first, b to the second). a's partial line spends the budget; c's
    // takes the lead; b waits. The end of c's line must wake the second
    // thread at once (its next timer is the line timeout, 60 s away), and
    // b then leads through its line.
    let _w = text_watchdog(30);
    const LINE: usize = 128 * 1024;
    let f = TextFixture::start(
        text_config(|c| {
            c.max_buffered_bytes = 2 * LINE;
            c.max_line_bytes = LINE;
        }),
        100,
    );
    let held = || f.stats.buffered_bytes.load(Relaxed);
    let (mut a, mut b, mut c) = (f.connect(), f.connect(), f.connect());
    let line = |fill: u8, len: usize| {
        let mut line = b"SCHED ".to_vec();
        line.resize(len - 2, fill);
        line.extend_from_slice(b"@q");
        line
    };
    // The budget is spent at 2 × LINE − (LINE + 1): a's line reaches it
    // with its last byte, so a never needs the lead.
    let spent = LINE - 1;
    let (line_a, line_b, line_c) = (line(b'a', spent), line(b'b', 100 * 1024), line(b'c', 20 * 1024));
    a.send(&line_a);
    text_wait_until("a's line held", || held() == spent as u64);
    c.send(&line_c);
    text_wait_until("c leads", || held() == (spent + 20 * 1024) as u64);
    b.send(&line_b);
    b.send(b"\n");
    text_wait_until("b paused", || f.stats.reads_paused.load(Relaxed) == 1);
    assert_eq!(held(), (spent + 20 * 1024) as u64, "b holds nothing");
    c.send(b"\n");
    text_wait_until("c's and b's lines stored", || f.backend.queue("q").len() == 2);
    a.send(b"\n");
    text_wait_until("a's line stored", || f.backend.queue("q").len() == 3);
    let mut got = f.backend.queue("q");
    got.sort();
    let data = |line: &[u8]| line[6..line.len() - 2].to_vec();
    assert_eq!(got, [data(&line_a), data(&line_b), data(&line_c)]);
    text_wait_until("nothing held", || held() == 0);
    let peak = f.stats.buffered_bytes_peak.load(Relaxed);
    assert!(peak <= (2 * LINE + 2 * emq::limits::TEXT_READ_BUF_BYTES) as u64, "{peak}");
    assert_eq!(f.stats.reads_paused.load(Relaxed), 1);
    assert_eq!(f.stats.line_timeout_closed.load(Relaxed), 0);
}

#[test]
fn a_command_held_behind_a_long_poll_counts_in_the_input_budget_until_it_runs() {
    let _w = text_watchdog(30);
    let f = TextFixture::default();
    let held = || f.stats.buffered_bytes.load(Relaxed);
    let mut c = f.connect();
    let data = vec![b'h'; 100_000];
    // The SCHED waits behind the long poll, parsed: its data and queue name.
    c.send(&[b"ASK q 20000\nSCHED ".as_slice(), &data, b"@r\n"].concat());
    text_wait_until("the SCHED held", || held() == 100_001);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(held(), 100_001, "held, not a line still arriving");
    assert!(f.backend.queue("r").is_empty());
    let mut p = f.connect();
    p.send(b"SCHED t@q\n");
    c.expect(b"WANT? t\n");
    text_wait_until("the SCHED ran", || f.backend.queue("r").len() == 1);
    assert_eq!(f.backend.queue("r"), [data]);
    text_wait_until("nothing held", || held() == 0);
}
