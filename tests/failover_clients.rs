//! Router address lists (docs/failover.md): a client and a worker given
//! several router addresses connect to all of them (`ZMQ_IMMEDIATE`, ZMTP
//! heartbeats) and talk to the router that is up; after that router goes
//! away and another starts on other addresses, they follow it (the worker
//! registers again: it is told DISCONNECT by a router that does not know
//! it).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use emq::client::emqp::{Client, Outcome};
use emq::client::worker::{Worker, WorkerConfig};

use crate::common::ports::{free_port_outside_ephemeral, zmq_endpoint};
use crate::emqp_router::{config, eventually, Watchdog};

/// An address where nothing listens (a standby that binds nothing yet, or
/// a dead router), on a port outside the ephemeral range: the clients and
/// workers here dial it every 100 ms, and a dial whose source port is the
/// port itself connects the socket to itself (see
/// [`free_port_outside_ephemeral`]; the likely cause of the follow test's
/// two failures under a parallel run).
fn dead_address() -> String {
    zmq_endpoint(free_port_outside_ephemeral())
}

#[test]
fn a_client_and_a_worker_with_one_dead_address_work() {
    let _w = Watchdog::new("failover_dead_address", 60);
    let h = emq::router::start(config(1, |_| {})).expect("router starts");
    let (front, back) = (h.endpoints.frontend.clone(), h.endpoints.backend.clone());
    let dead_front = dead_address();
    let worker =
        Worker::start(WorkerConfig::new(&dead_address()).failover(&back).queues(vec![(10, "default".into())]), |job| {
            Ok(job.body)
        })
        .expect("worker starts");
    // Dead address first, then the live one; and the other way round.
    for list in [format!("{dead_front},{front}"), format!("{front}, {dead_front}")] {
        let mut client = Client::connect(&list).expect("connect").with_timeout(Duration::from_secs(5));
        for i in 0..20 {
            let outcome = client.request("default", "", format!("job-{i}").as_bytes()).expect("request");
            assert!(matches!(outcome, Outcome::Accepted { .. }), "{list}: {outcome:?}");
        }
    }
    eventually(20, "40 jobs completed", || h.counters().completed_jobs.load(Ordering::Relaxed) == 40);
    assert_eq!(worker.stats().reconnects, 0, "the dead address made the worker reconnect");
    worker.shutdown().expect("worker stops");
    h.shutdown();
}

#[test]
fn a_malformed_address_in_a_list_is_named() {
    let Err(e) = Client::connect("tcp://127.0.0.1:1,127.0.0.1:2") else { panic!("connected") };
    assert!(e.to_string().starts_with("\"127.0.0.1:2\" is not an eMQP address (no tcp://)"), "{e}");
}

#[test]
fn a_client_and_a_worker_follow_the_router_to_its_new_addresses() {
    let _w = Watchdog::new("failover_follow", 90);
    let fast = |r: &mut emq::config::RawRouterConfig| {
        r.heartbeat_interval = Some("300ms".into());
        r.heartbeat_timeout = Some("1s".into());
    };
    let (f1, b1, f2, b2) = (dead_address(), dead_address(), dead_address(), dead_address());
    let a = emq::router::start(config(1, |r| {
        fast(r);
        r.frontend_addr = Some(f1.clone());
        r.backend_addr = Some(b1.clone());
    }))
    .expect("router A starts");
    let worker =
        Worker::start(WorkerConfig::new(&b1).failover(&b2).queues(vec![(10, "default".into())]), |job| Ok(job.body))
            .expect("worker starts");
    let mut client = Client::connect(&format!("{f1},{f2}")).expect("connect").with_timeout(Duration::from_secs(10));
    for i in 0..10 {
        let outcome = client.request("default", "", format!("a-{i}").as_bytes()).expect("request");
        assert!(matches!(outcome, Outcome::Accepted { .. }), "{outcome:?}");
    }
    eventually(20, "A completed 10 jobs", || a.counters().completed_jobs.load(Ordering::Relaxed) == 10);
    a.shutdown();
    a.wait();
    let b = emq::router::start(config(1, |r| {
        fast(r);
        r.frontend_addr = Some(f2.clone());
        r.backend_addr = Some(b2.clone());
    }))
    .expect("router B starts");
    let started = Instant::now();
    for i in 0..10 {
        let outcome = client.request("default", "", format!("b-{i}").as_bytes()).expect("request");
        assert!(matches!(outcome, Outcome::Accepted { .. }), "{outcome:?}");
    }
    let end = Instant::now() + Duration::from_secs(30);
    while b.counters().completed_jobs.load(Ordering::Relaxed) < 10 {
        assert!(
            Instant::now() < end,
            "B completed {} of 10 jobs in 30 s; worker {:?}",
            b.counters().completed_jobs.load(Ordering::Relaxed),
            worker.stats()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("followed to B: 10 jobs done {:?} after B started", started.elapsed());
    assert!(worker.stats().reconnects >= 1, "the worker registered again with B");
    worker.shutdown().expect("worker stops");
    b.shutdown();
}

/// A ROUTER bound on `endpoint`, playing a router frontend.
fn raw_router(ctx: &zmq::Context, endpoint: &str) -> zmq::Socket {
    let s = ctx.socket(zmq::ROUTER).unwrap();
    s.set_linger(0).unwrap();
    s.set_rcvtimeo(10_000).unwrap();
    s.bind(endpoint).unwrap();
    s
}

#[test]
fn an_unanswered_request_is_sent_again_with_its_msgid_after_the_router_goes_away() {
    let _w = Watchdog::new("failover_resend", 60);
    let (a_addr, b_addr) = (dead_address(), dead_address());
    let ctx = zmq::Context::new();
    let a = raw_router(&ctx, &a_addr);
    let mut client =
        Client::connect(&format!("{a_addr},{b_addr}")).expect("connect").with_timeout(Duration::from_secs(15));
    let msgid = client.send_request("default", "", b"payload").expect("sent");
    let first = a.recv_multipart(0).expect("A gets the REQUEST");
    assert_eq!(first[4], msgid);
    // A dies without answering; B comes up on the other address.
    drop(a);
    let b = raw_router(&ctx, &b_addr);
    let waiter = std::thread::spawn(move || {
        let outcome = client.wait(&msgid, Instant::now() + Duration::from_secs(15)).expect("wait");
        (outcome, client.resent(), client.pending())
    });
    let again = b.recv_multipart(0).expect("B gets the REQUEST again");
    assert_eq!(again, first, "the same frames: the same routing id and the same msgid");
    b.send_multipart([&again[0][..], b"", b"eMQP/1.0", b"REPLY", b"reply-1", &again[4][..]], 0).unwrap();
    let (outcome, resent, pending) = waiter.join().expect("waiter");
    assert_eq!(outcome, Outcome::Accepted { msgid: again[4].clone() });
    assert!(resent >= 1, "re-sent {resent} times");
    assert_eq!(pending, 0, "answered: out of the re-send set");
}
