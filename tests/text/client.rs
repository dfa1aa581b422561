//! The Rust text client against a scripted fake server and the real one.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::thread::JoinHandle;
use std::time::Duration;

use emq::client::text::{ServerError, TextClient, TextClientError};
use emq::protocol::text::ErrorCode;

use super::{text_watchdog, TextFixture};

const T: Duration = Duration::from_secs(5);

/// A fake server: for each step, reads exactly `expect` bytes, checks them,
/// then writes `reply`. After the last step it closes, or with `hold` it
/// first waits for the client to close.
fn fake_server(steps: Vec<(&'static [u8], &'static [u8])>, hold: bool) -> (SocketAddr, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let handle = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        for (expect, reply) in steps {
            let mut got = vec![0; expect.len()];
            s.read_exact(&mut got).unwrap();
            assert_eq!(got.escape_ascii().to_string(), expect.escape_ascii().to_string());
            s.write_all(reply).unwrap();
        }
        if hold {
            let _ = s.read_to_end(&mut Vec::new());
        }
    });
    (addr, handle)
}

#[test]
fn ask_reads_want_and_nope_and_server_errors() {
    let _w = text_watchdog(20);
    let (addr, fake) = fake_server(
        vec![
            (b"ASK q\n", b"WANT? a b\n"),
            (b"ASK default\n", b"NOPE\n"),
            (b"ASK q\n", b"ERR PENDING this connection still holds an offer\n"),
            (b"END\n", b""),
        ],
        false,
    );
    let mut c = TextClient::connect(addr, T).unwrap();
    assert_eq!(c.ask("q").unwrap(), Some(b"a b".to_vec()));
    assert_eq!(c.ask("default").unwrap(), None);
    match c.ask("q") {
        Err(TextClientError::Server { code: ErrorCode::Pending, text }) => {
            assert_eq!(text, "this connection still holds an offer")
        }
        other => panic!("{other:?}"),
    }
    c.end().unwrap();
    fake.join().unwrap();
}

#[test]
fn write_only_errors_are_deferred_behind_the_barrier() {
    let _w = text_watchdog(20);
    let (addr, fake) = fake_server(
        vec![
            (b"SCHED x@q\nSCHED test@test.de@default\n", b""),
            (b"ASK !sync\nASK q\n", b"ERR QUEUE_FULL full\nERR BAD_FORMAT barrier\nWANT? x\n"),
            (b"ACK\nACK\nASK !sync\n", b"ERR NO_TASK none\nERR BAD_FORMAT barrier\n"),
            (b"DCL\nEND\n", b"ERR NO_TASK late\n"),
        ],
        false,
    );
    let mut c = TextClient::connect(addr, T).unwrap();
    c.pipeline_sched([(&b"x"[..], Some("q")), (&b"test@test.de"[..], None)]).unwrap();
    assert_eq!(c.ask("q").unwrap(), Some(b"x".to_vec()));
    assert_eq!(c.take_deferred(), vec![ServerError { code: ErrorCode::QueueFull, text: "full".into() }]);
    c.ack().unwrap();
    c.ack().unwrap();
    match c.sync() {
        Err(TextClientError::Deferred(errs)) => assert_eq!(errs[0].code, ErrorCode::NoTask),
        other => panic!("{other:?}"),
    }
    c.dcl().unwrap();
    match c.end() {
        Err(TextClientError::Deferred(errs)) => {
            assert_eq!(errs, vec![ServerError { code: ErrorCode::NoTask, text: "late".into() }])
        }
        other => panic!("{other:?}"),
    }
    fake.join().unwrap();
}

#[test]
fn busy_timeout_garbage_and_bad_arguments() {
    let _w = text_watchdog(20);
    let (addr, fake) = fake_server(vec![(b"ASK default\n", b"ERR BUSY too many connections\n")], false);
    let mut c = TextClient::connect(addr, T).unwrap();
    assert!(matches!(c.ask("default"), Err(TextClientError::Server { code: ErrorCode::Busy, .. })));
    fake.join().unwrap();
    assert!(matches!(c.ask("default"), Err(TextClientError::Closed) | Err(TextClientError::Io(_))));

    let (addr, fake) = fake_server(vec![(b"ASK q\n", b"HELLO\n"), (b"ASK q\n", b"")], true);
    let mut c = TextClient::connect(addr, Duration::from_millis(200)).unwrap();
    assert!(matches!(c.ask("q"), Err(TextClientError::Protocol(_))));
    assert!(matches!(c.ask("q"), Err(TextClientError::Timeout)));
    assert!(matches!(c.ask("bad/name"), Err(TextClientError::Encode(_))));
    assert!(matches!(c.sched(b"a\nb", None), Err(TextClientError::Encode(_))));
    assert!(matches!(c.sched(b"", None), Err(TextClientError::Encode(_))));
    drop(c);
    fake.join().unwrap();
}

#[test]
fn client_against_the_real_server() {
    let _w = text_watchdog(60);
    let f = TextFixture::start(super::text_config(|_| {}), 3);
    let mut c = TextClient::connect(f.server.local_addr(), T).unwrap();
    let tasks: Vec<Vec<u8>> = (0..4).map(|i| format!("{{\"to\":\"a@b.c\",\"n\":{i}}}").into_bytes()).collect();
    c.pipeline_sched(tasks.iter().map(|t| (t.as_slice(), Some("mail")))).unwrap();
    assert_eq!(c.ask("mail").unwrap().as_deref(), Some(tasks[0].as_slice()));
    assert_eq!(c.take_deferred().iter().map(|e| e.code).collect::<Vec<_>>(), vec![ErrorCode::QueueFull]);
    c.ack().unwrap();
    c.ack().unwrap();
    assert!(matches!(c.sync(), Err(TextClientError::Deferred(e)) if e[0].code == ErrorCode::NoTask));
    for t in &tasks[1..3] {
        assert_eq!(c.ask("mail").unwrap().as_deref(), Some(t.as_slice()));
        c.del().unwrap();
    }
    assert_eq!(c.ask("mail").unwrap(), None);
    c.sched(b"plain", None).unwrap();
    c.sync().unwrap();
    c.end().unwrap();
    assert_eq!(f.backend.queue("default"), vec![b"plain".to_vec()]);
}

#[test]
fn client_long_poll_waits_past_its_own_timeout() {
    let _w = text_watchdog(30);
    let f = TextFixture::default();
    let addr = f.server.local_addr();
    let mut c = TextClient::connect(addr, Duration::from_millis(300)).unwrap();
    assert_eq!(c.ask_wait("lp", Duration::from_millis(50)).unwrap(), None);
    let producer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(600));
        let mut p = TextClient::connect(addr, T).unwrap();
        p.sched(b"late", Some("lp")).unwrap();
        p.end().unwrap();
    });
    assert_eq!(c.ask_wait("lp", Duration::from_secs(20)).unwrap().as_deref(), Some(&b"late"[..]));
    c.ack().unwrap();
    c.end().unwrap();
    producer.join().unwrap();
    assert_eq!(f.backend.counts().acked, 1);
}

#[test]
fn the_timeout_bounds_a_whole_answer_not_each_read() {
    // A server that trickles its answer a byte every 200 ms: each read is
    // well within a 1 s timeout, the line never is.
    let _w = text_watchdog(20);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut ask = [0u8; 6];
        s.read_exact(&mut ask).unwrap();
        for &b in b"WANT? slow and never done" {
            if s.write_all(&[b]).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    let mut c = TextClient::connect(addr, Duration::from_secs(1)).unwrap();
    let t0 = std::time::Instant::now();
    let answer = c.ask("q");
    let took = t0.elapsed();
    assert!(matches!(answer, Err(TextClientError::Timeout)), "{answer:?}");
    assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(3), "{took:?}");
    drop(c);
    server.join().unwrap();
}

/// Calls `call` on a fresh connection the server refused (it wrote `ERR
/// BUSY` and closed), every 20 ms until it fails: the write-only commands
/// may write once into the closed connection before its reset arrives.
/// Returns the error.
fn first_error(
    addr: SocketAddr,
    mut call: impl FnMut(&mut TextClient) -> Result<(), TextClientError>,
) -> TextClientError {
    let mut c = TextClient::connect(addr, T).unwrap();
    for _ in 0..250 {
        if let Err(e) = call(&mut c) {
            return e;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("never failed")
}

#[test]
fn every_command_on_a_refused_connection_reports_the_servers_busy_not_a_broken_pipe() {
    let _w = text_watchdog(60);
    let f = TextFixture::start(super::text_config(|c| c.max_connections = 1), 10);
    let addr = f.server.local_addr();
    let mut held = TextClient::connect(addr, T).unwrap();
    assert_eq!(held.ask("q").unwrap(), None, "the one connection allowed");
    let busy = |e: TextClientError| match e {
        TextClientError::Server { code: ErrorCode::Busy, text } => text,
        other => panic!("{other:?}"),
    };
    let want = "too many connections";
    assert_eq!(busy(first_error(addr, |c| c.sched(b"hi", None))), want, "sched");
    assert_eq!(busy(first_error(addr, |c| c.pipeline_sched([(&b"a"[..], None), (b"b", None)]))), want);
    assert_eq!(busy(first_error(addr, |c| c.ack())), want, "ack");
    assert_eq!(busy(first_error(addr, |c| c.dcl())), want, "dcl");
    assert_eq!(busy(first_error(addr, |c| c.del())), want, "del");
    assert_eq!(busy(first_error(addr, |c| c.ask("q").map(|_| ()))), want, "ask");
    assert_eq!(busy(first_error(addr, |c| c.sched(b"x", None).and_then(|()| c.sync()))), want, "sync");
    // END after a write that went through, and END whose own write fails.
    let mut c = TextClient::connect(addr, T).unwrap();
    c.sched(b"hi", None).unwrap();
    assert_eq!(busy(c.end().unwrap_err()), want, "end after sched");
    let mut c = TextClient::connect(addr, T).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let _ = c.ack(); // into the closed connection: its reset comes back
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(busy(c.end().unwrap_err()), want, "end");
    held.end().unwrap();
    assert_eq!(f.backend.queue("default"), Vec::<Vec<u8>>::new(), "nothing from a refused connection");
}

#[test]
fn a_failed_write_reports_the_errors_the_server_wrote_before_closing() {
    let _w = text_watchdog(20);
    // The server refuses the SCHED, then goes away without an ERR BUSY.
    let (addr, fake) = fake_server(vec![(b"SCHED x\n", b"ERR QUEUE_FULL full\n")], false);
    let mut c = TextClient::connect(addr, T).unwrap();
    c.sched(b"x", Some("default")).unwrap_or_else(|e| panic!("{e:?}"));
    fake.join().unwrap();
    let mut errors = Vec::new();
    for _ in 0..250 {
        match c.ack() {
            Ok(()) => std::thread::sleep(Duration::from_millis(20)),
            Err(TextClientError::Deferred(e)) => {
                errors = e;
                break;
            }
            Err(other) => panic!("{other:?}"),
        }
    }
    assert_eq!(errors, vec![ServerError { code: ErrorCode::QueueFull, text: "full".into() }]);
    // Read already: the next failure is the bare I/O error.
    assert!(matches!(c.ack(), Err(TextClientError::Io(e)) if e.kind() == std::io::ErrorKind::BrokenPipe));
}
