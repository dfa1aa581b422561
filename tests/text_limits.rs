//! The text front end's extensions and limits over real sockets: long-poll
//! ASK, replies in command order across shards, the cross-protocol case of
//! an ASKed queue, the line timeout, slow readers, delivery counts and the
//! descriptor reserve (text-protocol.md "Limits on connections",
//! "Extension: long-poll ASK", "One broker, one queue namespace").

use std::io::Write;
use std::process::Command;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use emq::router::RouterHandle;

use crate::common::admin::admin;
use crate::common::ports::{free_port, zmq_endpoint};
use crate::common::proc::{Child, TestDir};
use crate::common::router::rust_router_bin;
use crate::emqp_router::{eventually, Peer, Watchdog};
use crate::text::TextConn;
use crate::text_broker::{connect, router_with_text};

fn text_stat(h: &RouterHandle, f: impl Fn(&emq::text::TextStats) -> u64) -> u64 {
    f(h.text_stats().expect("text front end on"))
}

#[test]
fn long_poll_ask_gets_the_next_task_or_nope_and_old_forms_keep_their_meaning() {
    let _w = Watchdog::new("text_long_poll", 30);
    for shards in [1, 3] {
        let h = router_with_text(shards, |_| {});
        let (mut a, mut b, mut producer) = (connect(&h), connect(&h), connect(&h));
        // Both wait; no answer yet. The first to ask gets the first task
        // (b asks only once a's wait is registered: they may be served by
        // different I/O threads).
        a.send(b"ASK jobs 20000\n");
        eventually(5, "a waiting", || admin(&h, "STATUS")["emq"]["asks_waiting"] == 1);
        b.send(b"ASK jobs 20000\n");
        eventually(5, "two waiting", || admin(&h, "STATUS")["emq"]["asks_waiting"] == 2);
        producer.send(b"SCHED first@jobs\nSCHED second@jobs\n");
        a.expect(b"WANT? first\n");
        b.expect(b"WANT? second\n");
        a.send(b"ACK\nASK jobs 50\n");
        a.expect(b"NOPE\n");
        b.send(b"ACK\nASK 500\nASK default 0\nASK jobs 1.5\n");
        b.expect(b"NOPE\n");
        b.expect(b"NOPE\n");
        b.expect_err("BAD_FORMAT");
        assert_eq!(h.counters().text_ask_waits_expired.load(Relaxed), 1);
    }
}

#[test]
fn a_long_poll_past_the_limit_is_refused_and_end_waits_for_it() {
    let _w = Watchdog::new("text_long_poll_limit", 30);
    let h = router_with_text(1, |r| r.text_max_ask_wait = Some("1s".into()));
    let mut c = connect(&h);
    c.send(b"ASK q 1001\nASK q 300\nEND\n");
    c.expect(b"ERR BAD_FORMAT the wait of ASK <queue> <ms> is at most 1000 ms\n");
    c.expect(b"NOPE\n");
    c.expect_closed();
}

#[test]
fn a_long_poll_of_a_closed_connection_takes_no_task() {
    let _w = Watchdog::new("text_long_poll_closed", 30);
    let h = router_with_text(2, |_| {});
    let mut gone = connect(&h);
    gone.send(b"ASK q 20000\n");
    eventually(5, "waiting", || admin(&h, "STATUS")["emq"]["text"]["connections_open"] == 1);
    drop(gone);
    eventually(5, "closed", || admin(&h, "STATUS")["emq"]["text"]["connections_open"] == 0);
    let mut c = connect(&h);
    c.send(b"SCHED t@q\nASK q\n");
    c.expect(b"WANT? t\n");
    assert_eq!(h.counters().text_returned_disconnect.load(Relaxed), 0, "the task never went to the closed one");
}

#[test]
fn replies_keep_command_order_across_shards() {
    let _w = Watchdog::new("text_order_across_shards", 60);
    let h = router_with_text(4, |r| r.max_queue_len = Some(1));
    let mut c = connect(&h);
    let queues: Vec<String> = (0..16).map(|i| format!("q{i}")).collect();
    let mut cmds = Vec::new();
    let mut want = Vec::new();
    for q in &queues {
        cmds.extend_from_slice(format!("SCHED a-{q}@{q}\nSCHED b-{q}@{q}\nASK {q}\nFOO\nACK\nASK {q}\n").as_bytes());
        want.push("ERR QUEUE_FULL the queue is full".to_string());
        want.push(format!("WANT? a-{q}"));
        want.push("ERR UNKNOWN_COMMAND unknown command \"FOO\"".to_string());
        want.push("NOPE".to_string());
    }
    c.send(&cmds);
    for w in want {
        c.expect(format!("{w}\n").as_bytes());
    }
}

#[test]
fn an_emqp_request_for_a_queue_a_text_client_asked_for_is_offered_to_it() {
    let _w = Watchdog::new("text_asked_queue_known", 30);
    for shards in [1, 3] {
        let h = router_with_text(shards, |_| {});
        let default_worker = Peer::new(&h.endpoints.backend, b"w-default");
        default_worker.inform_worker(r#"[[10, "default"]]"#);
        default_worker.ready(1);
        let mut text = connect(&h);
        text.send(b"ASK reports\n");
        text.expect(b"NOPE\n");
        let client = Peer::new(&h.endpoints.frontend, b"client");
        client.request("m1", "reports", "", "monthly");
        assert_eq!(client.expect("REPLY")[4], b"m1");
        text.send(b"ASK reports\n");
        text.expect(b"WANT? monthly\n");
        default_worker.expect_none("REQUEST", 200);
        // A long poll makes it known too, and is answered at once.
        text.send(b"ACK\nASK later 20000\n");
        eventually(5, "the long poll waits", || admin(&h, "STATUS")["emq"]["asks_waiting"] == 1);
        client.request("m2", "later", "", "soon");
        text.expect(b"WANT? soon\n");
    }
}

#[test]
fn a_line_must_be_complete_within_the_line_timeout_of_its_first_byte() {
    let _w = Watchdog::new("text_line_timeout", 30);
    let h = router_with_text(1, |r| r.text_line_timeout = Some("600ms".into()));
    let mut trickle = connect(&h);
    let mut idle = connect(&h);
    // One byte every 100 ms: the line never completes in time although
    // bytes keep coming.
    let writer = trickle.writer.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        let mut w = writer;
        for b in b"SCHED slowly but surely".iter().cycle().take(100) {
            if w.write_all(std::slice::from_ref(b)).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    trickle.expect_closed();
    sender.join().unwrap();
    idle.send(b"ASK\n");
    idle.expect(b"NOPE\n");
    assert_eq!(text_stat(&h, |s| s.line_timeout_closed.load(Relaxed)), 1);
    assert_eq!(admin(&h, "STATUS")["emq"]["text"]["line_timeout_closed"], 1);
}

#[test]
fn a_client_that_does_not_read_is_closed_and_its_offer_returns_counted() {
    let _w = Watchdog::new("text_slow_reader", 60);
    let h = router_with_text(1, |r| {
        r.text_max_line_bytes = Some(2048);
        r.text_max_unsent_bytes = Some(4096);
    });
    let big = "x".repeat(2000);
    let mut producer = connect(&h);
    producer.send(format!("SCHED {big}@q\nASK q\n").as_bytes());
    producer.expect(format!("WANT? {big}\n").as_bytes());
    producer.send(b"DCL\n");
    let slow = connect(&h);
    let mut w = slow.writer.try_clone().unwrap();
    // Far more WANT? bytes than the socket buffers hold; never read.
    let asks = b"ASK q\nDCL\n".repeat(20_000);
    let _ = w.write_all(&asks);
    eventually(20, "the slow reader closed", || text_stat(&h, |s| s.slow_reader_closed.load(Relaxed)) == 1);
    producer.send(b"ASK q\n");
    producer.expect(format!("WANT? {big}\n").as_bytes());
    drop(slow);
}

#[test]
fn an_offer_returned_too_often_is_dead_lettered_and_the_queue_moves_on() {
    let _w = Watchdog::new("text_dead_letter", 60);
    let h = router_with_text(2, |_| {});
    let mut p = connect(&h);
    p.send(b"SCHED poison@q\nSCHED next@q\nEND\n");
    p.expect_closed();
    for round in 0..=u64::from(emq::limits::MAX_RETRIES) {
        let mut crash = connect(&h);
        crash.send(b"ASK q\n");
        crash.expect(b"WANT? poison\n");
        drop(crash);
        eventually(5, "returned", || h.counters().text_returned_disconnect.load(Relaxed) == round + 1);
    }
    eventually(5, "dead-lettered", || h.counters().text_dead_lettered.load(Relaxed) == 1);
    let mut c = connect(&h);
    c.send(b"ASK q\n");
    c.expect(b"WANT? next\n");
    let status = admin(&h, "STATUS");
    assert_eq!(status["emq"]["text"]["offers_dead_lettered"], 1, "{status}");
    assert_eq!(status["emq"]["counters"]["dead_lettered"], 1, "{status}");
}

/// Starts `emq-router` under `ulimit -n fds` with `args`; returns it with
/// its admin endpoint, backend endpoint and text address.
fn router_with_fds(dir: &TestDir, fds: u32, args: &str) -> (Child, String, String, std::net::SocketAddr) {
    let (fp, bp, ap, tp, mp) = (free_port(), free_port(), free_port(), free_port(), free_port());
    let (frontend, backend, admin_addr) = (zmq_endpoint(fp), zmq_endpoint(bp), zmq_endpoint(ap));
    let script = format!(
        "ulimit -n {fds} && exec {} --frontend-addr {frontend} --backend-addr {backend} --admin-addr {admin_addr} \
         --text-addr 127.0.0.1:{tp} --metrics 127.0.0.1:{mp} --data-dir {} {args}",
        rust_router_bin().display(),
        dir.join("router-data").display()
    );
    let router = Child::spawn("router", Command::new("sh").args(["-c", &script]), &dir.join("router.log"));
    eventually(10, "text port", || crate::common::ports::is_listening(tp));
    (router, admin_addr, backend, format!("127.0.0.1:{tp}").parse().unwrap())
}

/// Opens text connections (each answering `ASK` with `NOPE`) until one is
/// refused; returns them and the refusal.
fn fill(addr: std::net::SocketAddr, most: usize) -> (Vec<TextConn>, Vec<u8>) {
    let mut open = Vec::new();
    loop {
        assert!(open.len() < most, "never refused");
        let mut c = TextConn::connect(addr);
        c.send(b"ASK\n");
        let line = c.line();
        if line != b"NOPE\n" {
            return (open, line);
        }
        open.push(c);
    }
}

#[test]
fn with_few_descriptors_text_gets_busy_and_emqp_and_admin_are_still_served() {
    let _w = Watchdog::new("text_descriptor_reserve", 60);
    let dir = TestDir::new("text_descriptor_reserve");
    let (_router, admin_addr, backend, addr) = router_with_fds(&dir, 256, "--text-reserved-fds 64");
    let (open, refused) = fill(addr, 256);
    assert_eq!(refused, b"ERR BUSY too few descriptors left\n");
    assert!(open.len() > 100, "{} connections before the reserve", open.len());
    let status = crate::common::admin::request(&admin_addr, "STATUS").expect("admin answers");
    assert_eq!(status["emq"]["text"]["refused_fds"], 1, "{status}");
    assert_eq!(status["emq"]["text"]["fd_limit"], 256, "{status}");
    let worker = Peer::new(&backend, b"w-after-text-filled");
    worker.inform_worker(r#"[[10, "default"]]"#);
}

#[test]
fn out_of_descriptors_a_client_is_still_told_busy() {
    let _w = Watchdog::new("text_out_of_descriptors", 60);
    let dir = TestDir::new("text_out_of_descriptors");
    // No reserve: accept itself runs out, and the spare descriptor answers.
    let (_router, admin_addr, _, addr) = router_with_fds(&dir, 128, "--text-reserved-fds 0");
    let (open, refused) = fill(addr, 128);
    assert_eq!(refused, b"ERR BUSY too few descriptors left\n");
    drop(open);
    eventually(10, "STATUS once descriptors are free", || {
        crate::common::admin::request(&admin_addr, "STATUS").is_ok_and(|s| {
            s["emq"]["text"]["accept_errors"].as_u64() >= Some(1) && s["emq"]["text"]["refused_fds"] == 1
        })
    });
}

#[test]
fn a_half_closed_connection_stops_waiting_even_with_commands_behind_its_long_poll() {
    // The commands after the long poll wait unread behind it; the close
    // behind them is seen from the readiness event. Were the ASK to wait
    // its 60 s, the connection's 10 s read timeout would fail the test.
    let _w = Watchdog::new("text_long_poll_half_closed", 30);
    let h = router_with_text(1, |_| {});
    let mut c = connect(&h);
    c.send(b"ASK q 60000\nSCHED zz@r\nASK r 60000\nASK q 60000\n");
    c.writer.shutdown(std::net::Shutdown::Write).expect("half-close");
    c.expect(b"NOPE\n");
    c.expect(b"WANT? zz\n");
    c.expect_err("PENDING");
    c.expect_closed();
    let mut d = connect(&h);
    d.send(b"ASK r\n");
    d.expect(b"WANT? zz\n");
}

#[test]
fn commands_and_a_half_close_arriving_together_are_answered_and_the_connection_closes() {
    // The kind: the last bytes and the close come in one readiness event,
    // so a short read does not mean the socket is drained; the end of
    // input must still be read. Many connections at once make the I/O
    // thread read behind the senders, so the two arrive together.
    let _w = Watchdog::new("text_data_and_half_close_together", 60);
    let h = router_with_text(1, |_| {});
    const N: usize = 200;
    let mut conns: Vec<TextConn> = (0..N).map(|_| connect(&h)).collect();
    for (i, c) in conns.iter_mut().enumerate() {
        c.send(format!("SCHED j{i}@hc\nASK hc\nASK hc 60000\n").as_bytes());
        c.writer.shutdown(std::net::Shutdown::Write).expect("half-close");
    }
    for c in &mut conns {
        let first = c.line();
        assert!(first.starts_with(b"WANT? j") || first == b"NOPE\n", "{:?}", first.escape_ascii().to_string());
        let second = c.line();
        let want: &[u8] = if first == b"NOPE\n" { b"NOPE\n" } else { b"ERR PENDING " };
        assert!(second.starts_with(want), "{:?}", second.escape_ascii().to_string());
        c.expect_closed();
    }
    // Every offer went back when its connection closed: nothing is lost.
    let mut d = connect(&h);
    let mut got = std::collections::BTreeSet::new();
    for _ in 0..N {
        d.send(b"ASK hc\n");
        let line = d.line();
        let data = line.strip_prefix(b"WANT? ").expect("a task for every SCHED");
        assert!(got.insert(data.to_vec()), "twice: {:?}", data.escape_ascii().to_string());
        d.send(b"ACK\n");
    }
    d.send(b"ASK hc\n");
    d.expect(b"NOPE\n");
}

/// The text front end's STATUS figures.
fn text_figures(h: &RouterHandle) -> serde_json::Value {
    admin(h, "STATUS")["emq"]["text"].clone()
}

fn figure(figures: &serde_json::Value, name: &str) -> u64 {
    figures[name].as_u64().unwrap_or_else(|| panic!("no {name} in {figures}"))
}

/// The figures once the bytes held and the pauses stay the same over
/// 200 ms (the senders' bytes have all arrived or wait unread).
fn settled(h: &RouterHandle) -> serde_json::Value {
    let key = |t: &serde_json::Value| (figure(t, "buffered_bytes"), figure(t, "reads_paused"));
    let mut last = text_figures(h);
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(200));
        let now = text_figures(h);
        if key(&now) == key(&last) {
            return now;
        }
        last = now;
    }
    panic!("the text figures never settled: {last}");
}

const BUDGET: u64 = 1 << 20;
const MAX_LINE: u64 = 256 * 1024;
/// Where the budget is spent: one longest line of it is kept for the lead.
const SPENT: u64 = BUDGET - MAX_LINE - 1;
/// One read of an I/O thread: how far past the budget one thread may go.
const ONE_READ: u64 = emq::limits::TEXT_READ_BUF_BYTES as u64;
/// Bytes of each partial line: eight of them are well past the budget.
const PART: usize = 200 * 1024;

/// A router with one text I/O thread, a 1 MiB input budget and lines of at
/// most 256 KiB, timed out after `line_timeout`.
fn router_with_budget(line_timeout: &str) -> RouterHandle {
    router_with_text(1, |r| {
        r.text_threads = Some(1);
        r.text_max_buffered_bytes = Some(BUDGET as usize);
        r.text_max_line_bytes = Some(MAX_LINE as usize);
        r.text_line_timeout = Some(line_timeout.into());
        r.durability = Some("memory".into());
    })
}

/// Opens `n` connections, each sending `SCHED <i>:xxx…` (`PART` bytes, no
/// LF) from a thread of its own (the write waits while the router does not
/// read); each thread then ends its line with `@big\n` once told to.
fn partial_lines(h: &RouterHandle, n: usize) -> (Vec<TextConn>, Vec<std::sync::mpsc::Sender<()>>) {
    let mut conns = Vec::new();
    let mut finish = Vec::new();
    for i in 0..n {
        let c = connect(h);
        let mut w = c.writer.try_clone().unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            let mut line = format!("SCHED {i}:").into_bytes();
            line.resize(PART, b'x');
            // Errors: the router closed the connection (the line timed out).
            if w.write_all(&line).is_ok() && rx.recv().is_ok() {
                let _ = w.write_all(b"@big\n");
            }
        });
        conns.push(c);
        finish.push(tx);
    }
    (conns, finish)
}

/// Takes the `n` tasks the lines of [`partial_lines`] stored in queue
/// `big` (asking again while they are not all there), checking each is
/// whole; then the queue is empty.
fn take_big_lines(c: &mut TextConn, n: usize) {
    let mut got = std::collections::BTreeSet::new();
    // Well within the line timeout (60 s): no line waits for it.
    let until = std::time::Instant::now() + Duration::from_secs(20);
    for _ in 0..n {
        // The lines complete as the router reads them: NOPE until then.
        let line = loop {
            assert!(std::time::Instant::now() < until, "only {} of {n} lines stored", got.len());
            c.send(b"ASK big\n");
            let line = c.line();
            if line != b"NOPE\n" {
                break line;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let data = line.strip_prefix(b"WANT? ").unwrap_or_else(|| panic!("{:?}", line.escape_ascii().to_string()));
        let (i, rest) = data.split_at(data.iter().position(|&b| b == b':').expect("i:"));
        assert_eq!(rest.len(), PART - "SCHED ".len() - i.len() + 1, "the whole line (and the reply's LF)");
        assert!(rest[1..rest.len() - 1].iter().all(|&b| b == b'x'));
        assert!(got.insert(String::from_utf8(i.to_vec()).unwrap()));
        c.send(b"ACK\n");
    }
    assert_eq!(got, (0..n).map(|i| i.to_string()).collect());
    c.send(b"ASK big\n");
    c.expect(b"NOPE\n");
}

#[test]
fn long_lines_of_many_connections_all_get_through_a_small_input_budget() {
    // Sixteen lines of 200 KiB at once, five times the budget, each longer
    // than one read: read in turns they could together spend the budget
    // with every one of them still unfinished; the lead lets one finish at
    // a time, so none waits for the line timeout.
    let _w = Watchdog::new("text_input_budget_long_lines", 60);
    let h = router_with_budget("60s");
    const N: usize = 16;
    let (_conns, finish) = partial_lines(&h, N);
    for tx in &finish {
        tx.send(()).unwrap();
    }
    take_big_lines(&mut connect(&h), N);
    eventually(10, "nothing held", || figure(&text_figures(&h), "buffered_bytes") == 0);
    let t = text_figures(&h);
    assert!(figure(&t, "buffered_bytes_peak") <= BUDGET + ONE_READ, "{t}");
    assert_eq!(figure(&t, "line_timeout_closed"), 0, "{t}");
}

#[test]
fn partial_lines_of_all_connections_stay_within_the_input_budget_and_complete_lines_still_run() {
    let _w = Watchdog::new("text_input_budget", 60);
    let h = router_with_budget("60s");
    const N: usize = 8;
    let (_partial, finish) = partial_lines(&h, N);
    // The budget fills up; one line takes the lead, the lines that do not
    // fit wait unread.
    eventually(10, "the budget spent", || {
        let t = text_figures(&h);
        figure(&t, "buffered_bytes") >= SPENT && figure(&t, "reads_paused") >= 1
    });
    let t = settled(&h);
    assert!((SPENT..=BUDGET + ONE_READ).contains(&figure(&t, "buffered_bytes")), "{t}");
    assert!(figure(&t, "buffered_bytes_peak") <= BUDGET + ONE_READ, "{t}");

    // A fresh connection's complete commands run at once, pipelined too.
    let mut fresh = connect(&h);
    fresh.send(b"SCHED small@q\nASK q\n");
    fresh.expect(b"WANT? small\n");
    fresh.send(b"ACK\nSCHED one@q\nSCHED two@q\nASK q\nACK\nASK q\nACK\nASK q\n");
    fresh.expect(b"WANT? one\n");
    fresh.expect(b"WANT? two\n");
    fresh.expect(b"NOPE\n");
    // A fresh connection's partial line waits unread (counted once), and
    // goes through once its LF arrives: it then holds nothing.
    let paused = figure(&text_figures(&h), "reads_paused");
    let mut late = connect(&h);
    late.send(b"SCHED wai");
    eventually(10, "the partial line paused", || figure(&text_figures(&h), "reads_paused") > paused);
    late.send(b"ted@q\nASK q\n");
    late.expect(b"WANT? waited\n");
    let t = text_figures(&h);
    assert!((SPENT..=BUDGET + ONE_READ).contains(&figure(&t, "buffered_bytes")), "still spent: {t}");

    // The partial lines end: every one gets through, paused or not.
    for tx in &finish {
        tx.send(()).unwrap();
    }
    take_big_lines(&mut fresh, N);
    eventually(10, "nothing held", || figure(&text_figures(&h), "buffered_bytes") == 0);
    let t = text_figures(&h);
    assert!(figure(&t, "buffered_bytes_peak") <= BUDGET + ONE_READ, "{t}");
    assert_eq!(figure(&t, "line_timeout_closed"), 0, "{t}");
    assert_eq!(t["errors_by_code"]["TOO_BIG"], 0, "{t}");
}

#[test]
fn a_spent_input_budget_frees_itself_as_partial_lines_time_out() {
    let _w = Watchdog::new("text_input_budget_timeout", 60);
    let h = router_with_budget("1s");
    const N: usize = 8;
    let (partial, _never) = partial_lines(&h, N);
    eventually(10, "the budget spent", || figure(&text_figures(&h), "reads_paused") >= 1);
    // Every one is closed by the line timeout, the ones that waited unread
    // too (their line's time runs from when its first byte was seen).
    for mut c in partial {
        c.expect_closed();
    }
    eventually(10, "all timed out", || figure(&text_figures(&h), "line_timeout_closed") == N as u64);
    let t = text_figures(&h);
    assert_eq!(figure(&t, "buffered_bytes"), 0, "{t}");
    assert!(figure(&t, "buffered_bytes_peak") <= BUDGET + ONE_READ, "{t}");
    // The budget is free again: a line longer than one read gets through.
    let mut c = connect(&h);
    let mut line = b"SCHED ".to_vec();
    line.resize(PART, b'y');
    line.extend_from_slice(b"@q\nASK q\n");
    c.send(&line);
    let want = [b"WANT? ".as_slice(), &line[6..PART], b"\n"].concat();
    c.expect(&want);
}

#[test]
fn a_queues_own_length_limit_holds_for_it_alone() {
    let _w = Watchdog::new("text_per_queue_limit", 30);
    let h = router_with_text(2, |r| {
        r.max_queue_len = Some(2);
        r.queues = Some(r#"{"strict": {"max_queue_len": 1}}"#.into());
    });
    let mut c = connect(&h);
    c.send(b"SCHED a@strict\nSCHED b@strict\nSCHED x@other\nSCHED y@other\nSCHED z@other\nASK strict\n");
    c.expect(b"ERR QUEUE_FULL the queue is full\n");
    c.expect(b"ERR QUEUE_FULL the queue is full\n");
    c.expect(b"WANT? a\n");
    c.send(b"ACK\nASK other\nACK\nASK other\nACK\nASK other\n");
    c.expect(b"WANT? x\n");
    c.expect(b"WANT? y\n");
    c.expect(b"NOPE\n");
}
