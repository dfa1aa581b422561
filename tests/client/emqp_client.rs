//! `Client`, `Publisher`, `AdminClient` against a raw ROUTER: exact frames
//! (docs/emqp.md "Messages") and every outcome.

use std::time::Duration;

use emq::client::admin::AdminClient;
use emq::client::body::PythonCall;
use emq::client::emqp::{Client, ClientError, Outcome, Schedule};

use super::{free_port, watchdog, RawRouter};

const V: &[u8] = b"eMQP/1.0";
const BODY: &str = r#"["run", {"callable": "add", "path": "jobs_mod", "args": [2, 3], "kwargs": {}, "class_args": [], "class_kwargs": {}}]"#;

#[test]
fn request_frames_v5_and_acceptance() {
    let _w = watchdog(20);
    let router = RawRouter::bind();
    let ep = router.endpoint.clone();
    let body = PythonCall::from_dotted("jobs_mod.add").unwrap().args(vec![2.into(), 3.into()]).body();
    assert_eq!(body, BODY.as_bytes());
    let client = std::thread::spawn(move || {
        let mut c = Client::connect(&ep).unwrap().with_timeout(Duration::from_secs(5));
        c.request("email", "reply-requested,timeout:30", &body).unwrap()
    });
    let f = router.recv(Duration::from_secs(5)).expect("REQUEST");
    assert_eq!(f.len(), 8);
    assert_eq!(&f[1..4], &[b"".to_vec(), V.to_vec(), b"REQUEST".to_vec()]);
    assert_eq!(f[4].len(), 36, "uuid4 msgid");
    assert_eq!(&f[5..], &[b"email".to_vec(), b"reply-requested,timeout:30".to_vec(), BODY.as_bytes().to_vec()]);
    // An unrelated answer first, then ours: the client matches by msgid.
    router.send(&f[0], &[b"", V, b"REPLY", b"x", b"some-other-msgid"]);
    router.send(&f[0], &[b"", V, b"REPLY", b"6a5b4c3d-2e1f-4a0b-9c8d-7e6f5a4b3c2d", &f[4]]);
    assert_eq!(client.join().unwrap(), Outcome::Accepted { msgid: f[4].clone() });
}

#[test]
fn request_rejected_and_unknown() {
    let _w = watchdog(20);
    let router = RawRouter::bind();
    let mut c = Client::connect(&router.endpoint).unwrap().with_timeout(Duration::from_millis(400));
    let msgid = c.send_request("q", "", b"data").unwrap();
    let f = router.recv(Duration::from_secs(5)).unwrap();
    assert_eq!(f[4], msgid);
    router.send(&f[0], &[b"", V, b"ERROR", b"e1", &msgid, b"QUEUE_FULL", b"queue q is full"]);
    let outcome = c.wait(&msgid, std::time::Instant::now() + Duration::from_secs(5)).unwrap();
    assert_eq!(outcome, Outcome::Rejected { msgid, code: "QUEUE_FULL".into(), text: "queue q is full".into() });
    // A router that never answers (EventMQ buffering a job): Unknown, after the timeout.
    let started = std::time::Instant::now();
    match c.request("q", "", b"data").unwrap() {
        Outcome::Unknown { msgid } => assert_eq!(msgid.len(), 36),
        other => panic!("expected Unknown, got {other:?}"),
    }
    assert!(started.elapsed() >= Duration::from_millis(350));
}

#[test]
fn unreachable_is_an_error_within_the_timeout() {
    let _w = watchdog(20);
    let addr = format!("tcp://127.0.0.1:{}", free_port());
    let mut c = Client::connect(&addr).unwrap().with_timeout(Duration::from_millis(300));
    assert!(matches!(c.request("q", "", b"x"), Err(ClientError::Unreachable { .. })));
    let mut a = AdminClient::connect(&addr).unwrap().with_timeout(Duration::from_millis(300));
    let e = a.status().unwrap_err();
    assert!(e.to_string().contains("unreachable"), "{e}");
}

#[test]
fn schedule_and_unschedule_frames_v12_v13_v14() {
    let _w = watchdog(20);
    let router = RawRouter::bind();
    let mut c = Client::connect(&router.endpoint).unwrap();
    let body = PythonCall::new("jobs_mod", "add").args(vec![1.into(), 2.into()]).body();
    let m1 = c.schedule("default", &Schedule::Interval(60), &body, "guarantee").unwrap();
    let m2 = c.schedule("email", &Schedule::Cron("*/5 * * * *".into()), &body, "nohaste").unwrap();
    let m3 = c.unschedule("default", &body, "guarantee").unwrap();
    let expect = |word: &[u8], m: &[u8], q: &[u8], h: &[u8], i: &[u8], cron: &[u8]| -> Vec<Vec<u8>> {
        [b"" as &[u8], V, word, m, q, h, i, &body, cron].iter().map(|f| f.to_vec()).collect()
    };
    let got: Vec<_> = (0..3).map(|_| router.recv(Duration::from_secs(5)).unwrap()[1..].to_vec()).collect();
    assert_eq!(got[0], expect(b"SCHEDULE", &m1, b"default", b"guarantee", b"60", b""));
    assert_eq!(got[1], expect(b"SCHEDULE", &m2, b"email", b"nohaste", b"-1", b"*/5 * * * *"));
    assert_eq!(got[2], expect(b"UNSCHEDULE", &m3, b"default", b"guarantee", b"-1", b""));
    assert!(matches!(c.schedule("q", &Schedule::Interval(0), &body, ""), Err(ClientError::Invalid(_))));
}

#[test]
fn publish_frames_v19() {
    let _w = watchdog(20);
    let router = RawRouter::bind();
    let mut p = emq::client::emqp::Publisher::connect(&router.endpoint).unwrap();
    let m = p.publish(b"topic", br#"["update", "1"]"#).unwrap();
    let f = router.recv(Duration::from_secs(5)).unwrap();
    let want: Vec<Vec<u8>> =
        [b"" as &[u8], V, b"PUBLISH", &m, b"topic", br#"["update", "1"]"#].iter().map(|f| f.to_vec()).collect();
    assert_eq!(f[1..].to_vec(), want);
}

#[test]
fn admin_queries_and_disconnect() {
    let _w = watchdog(20);
    let router = RawRouter::bind();
    let ep = router.endpoint.clone();
    let admin = std::thread::spawn(move || {
        let mut a = AdminClient::connect(&ep).unwrap().with_timeout(Duration::from_secs(5));
        let status = a.status().unwrap();
        a.disconnect().unwrap();
        let mut short = AdminClient::connect(&ep).unwrap().with_timeout(Duration::from_millis(300));
        (status, short.latency().unwrap_err().to_string())
    });
    let f = router.recv(Duration::from_secs(5)).unwrap();
    assert_eq!(&f[1..4], &[b"".to_vec(), V.to_vec(), b"STATUS".to_vec()]);
    assert!(f[4].starts_with(b"admin:") && f[4].len() == 42 && f.len() == 5);
    router.send(&f[0], &[b"", V, b"REPLY", b"r1", br#"{"waiting_messages_by_queue": {"q": 3}}"#]);
    let f = router.recv(Duration::from_secs(5)).unwrap();
    assert_eq!(f[3], b"DISCONNECT");
    router.send(&f[0], &[b"", V, b"ACK", b"a1", &f[4]]);
    let f = router.recv(Duration::from_secs(5)).unwrap();
    assert_eq!(f[3], b"LATENCY"); // never answered: the client times out
    let (status, err) = admin.join().unwrap();
    assert_eq!(status["waiting_messages_by_queue"]["q"], 3);
    assert!(err.contains("no answer"), "{err}");
}
