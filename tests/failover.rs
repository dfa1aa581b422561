//! Failover of `durability = "replicated"` (issue 28, part 1): an owner
//! and a standby (`--standby`) with the same router name on other ports
//! of this machine, on a real 3-node nats-server cluster
//! (tests/common/nats.rs), with the rigs of `replicated_faults` (ledger,
//! load, clients).
//!
//! * [`a_standby_takes_over_an_owner_killed_under_load`]: `kill -9` of
//!   the owner under load (eMQP and text producers and consumers), with
//!   jobs waiting and one text task in flight: the standby listens within
//!   [`TAKE_OVER_BOUND`] (the lease, 10 s, + 2 s; measured 7.0-7.5 s, six runs),
//!   every acknowledged job is delivered at least once, and again only
//!   jobs in flight at the kill (`replicated_faults::after_take_over`).
//! * SIGSTOP of the owner past its lease
//!   ([`a_paused_owner_is_fenced_by_the_standby_that_took_over`]): the
//!   standby takes over (measured 10.0-10.4 s, six runs) and serves; after SIGCONT
//!   the old owner refuses what producers send it (eMQP `ERROR …
//!   STORE_FAILED`, text `ERR STORE_FAILED`), appends nothing more to the
//!   stream (the stream takes the new owner's subject only, and every
//!   message after the new owner's marker is on that subject, of the new
//!   owner's boot), says `fenced` in its log and STATUS
//!   (`wal.nats.role`), and every job acknowledged by either is delivered
//!   exactly once by the new owner.
//! * [`no_responders_and_the_subject_gone_is_fenced`]: the old owner's
//!   side alone: its stream's subjects moved by hand, its next publish
//!   finds no responders and it is fenced at once (refused within
//!   milliseconds, not at `nats_give_up`).
//!
//! Without a nats-server the tests say so in one line and skip.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use futures_util::StreamExt;

use crate::common::wait;
use crate::replicated_faults::clients::{
    offer_text, send_acked_emqp, send_acked_text, send_until_acked, take_emqp, take_text, Load, PreQueues,
};
use crate::replicated_faults::ledger::{self, lock, Answer};
use crate::replicated_faults::rig::Node;
use crate::replicated_faults::{
    after_take_over, checks, load, start, with_js, BACK_BOUND, DONE_MARGIN, PRE_JOBS, SERVED_BOUND,
};

/// From the owner's end (`kill -9`, SIGSTOP) to the standby listening:
/// the goal of docs/replicated.md, "Failover": the lease (10 s) + 2 s.
/// The lease runs out 6.7-10 s after the end (renewed every 3.3 s), the
/// standby sees it within its poll (`LEASE_POLL`, 250 ms), then fences
/// and replays (well under a second here).
const TAKE_OVER_BOUND: Duration = Duration::from_secs(12);

/// Until the standby says it waits.
const STANDBY_BOUND: Duration = Duration::from_secs(15);

/// Waits up to 10 s until `node`'s STATUS says `wal.nats.role` `fenced`.
fn wait_fenced(node: &Node) -> Result<serde_json::Value, String> {
    wait::until_ok(Duration::from_secs(10), || {
        let st = node.status()?;
        let role = st["emq"]["wal"]["nats"]["role"].clone();
        if role == "fenced" {
            Ok(st)
        } else {
            Err(format!("role {role}"))
        }
    })
}

/// Once a router knows it is fenced, it unbinds its eMQP frontend and
/// backend (within 5 s here): clients and workers listing several
/// routers of the name then talk to the new owner only; admin and text
/// stay.
fn assert_unbound(node: &Node, router: &crate::common::proc::Child) {
    let (fp, bp) = (port_of(&node.frontend()), port_of(&node.backend()));
    let closed = wait::until(Duration::from_secs(5), || {
        !crate::common::ports::is_listening(fp) && !crate::common::ports::is_listening(bp)
    });
    assert!(closed, "the fenced router still listens on its frontend or backend\n{}", router.log_tail(20));
    assert!(router.log_text().contains("fenced: frontend and backend unbound"), "{}", router.log_tail(20));
    // Fenced, it waits for nothing: no thread spins (its shards were woken
    // at once, again and again, each taking a core).
    let (before, t) = (crate::common::proc::cpu_time(router.pid()), Instant::now());
    std::thread::sleep(Duration::from_secs(2));
    let spent = crate::common::proc::cpu_time(router.pid()) - before;
    assert!(spent < Duration::from_millis(500), "the fenced router used {spent:?} of CPU in {:?}", t.elapsed());
    eprintln!("fenced router: {spent:?} of CPU in {:?}", t.elapsed());
}

fn wait_standby(router: &crate::common::proc::Child) {
    let said = wait::until(STANDBY_BOUND, || router.log_text().contains("standby: the router name is held"));
    assert!(said, "the standby does not say it waits\n{}", router.log_tail(30));
}

#[test]
fn a_standby_takes_over_an_owner_killed_under_load() {
    let test = "failover_kill";
    let Some((s, node, mut owner, ledger)) = start(test, 200, "fk", &[]) else { return };
    let standby = node.elsewhere(&s.dir, "b").with_flags(&["--standby"]);
    let mut router = standby.spawn();
    wait_standby(&router);
    let pre = PreQueues::queue(&node, &ledger);
    send_acked_text(&node, &ledger, "held", "held", 1);
    let offered = offer_text(&node, &ledger, "held");
    let load = Load::start(&node, &ledger);
    checks::wait_acked(&ledger, 300 + 2 * PRE_JOBS + 1, Duration::from_secs(20));
    let settled = lock(&ledger).deliveries.len();
    std::thread::sleep(DONE_MARGIN);
    let killed = Instant::now();
    // SAFETY: plain syscall on the process group of a child of this test.
    unsafe { libc::killpg(owner.pid(), libc::SIGKILL) };
    owner.kill_group();
    load.producers.stop();
    load.consumers.stop();
    drop((pre, offered));
    let (old, at_kill) = {
        let l = lock(&ledger);
        (l.deliveries.len(), l.counts())
    };
    let up = standby.wait_listening(&mut router, TAKE_OVER_BOUND + Duration::from_secs(10));
    let listened = killed.elapsed();
    assert!(up, "the standby did not take over\n{}", router.log_tail(40));
    let first = send_until_acked(&standby, &ledger, "after", "default", BACK_BOUND);
    first.unwrap_or_else(|why| panic!("the new owner acknowledges nothing: {why}\n{}", router.log_tail(30)));
    let first_ack = killed.elapsed();
    let log = router.log_text();
    eprintln!(
        "{test}: owner killed ({at_kill}); the standby listened {listened:?} after the kill and acknowledged a job \
         {first_ack:?} after it"
    );
    assert!(log.contains("took the router name: its holder's lease expired"), "the take-over line\n{log}");
    assert!(listened <= TAKE_OVER_BOUND, "the standby listened {listened:?} after the kill");
    after_take_over(test, &standby, &ledger, killed, settled, old, &mut router);
}

/// One message of a log stream as [`messages`] reads it.
#[derive(Debug)]
struct Msg {
    seq: u64,
    subject: String,
    /// The emq header's boot; 0 for a marker.
    boot: u32,
    /// A marker's `Emq-Fence` header: the holder's JSON.
    marker: Option<String>,
}

/// Every message of `stream`.
async fn messages(js: &async_nats::jetstream::Context, stream: &str) -> Result<Vec<Msg>, String> {
    let mut st = js.get_stream(stream).await.map_err(|e| e.to_string())?;
    let last = st.info().await.map_err(|e| e.to_string())?.state.last_sequence;
    let consumer = st
        .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig::default())
        .await
        .map_err(|e| e.to_string())?;
    let mut msgs = consumer.messages().await.map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    loop {
        let m = match tokio::time::timeout(Duration::from_secs(5), msgs.next()).await {
            Ok(Some(Ok(m))) => m,
            other => return Err(format!("reading {stream} before {last}: {:?}", other.map(|o| o.map(|r| r.is_ok())))),
        };
        let seq = m.info().map_err(|e| e.to_string())?.stream_sequence;
        let marker =
            m.headers.as_ref().and_then(|h| h.get(emq::jslog::message::FENCE_HEADER)).map(|v| v.as_str().to_string());
        let boot = match marker {
            Some(_) => 0,
            None => emq::jslog::message::Header::decode(&m.payload)?.0.boot,
        };
        out.push(Msg { seq, subject: m.subject.to_string(), boot, marker });
        if seq >= last {
            return Ok(out);
        }
    }
}

/// What [`offer_both`] reports for an eMQP REQUEST no one answered
/// because the router's frontend is no longer bound (a fenced router
/// unbinds it within its fence check, 200 ms).
const UNBOUND: &str = "UNBOUND";

/// The TCP port of a `tcp://host:port` endpoint.
fn port_of(endpoint: &str) -> u16 {
    endpoint.rsplit(':').next().and_then(|p| p.parse::<u16>().ok()).expect("a port")
}

/// Sends `body` to `queue` over eMQP and text on the router `node`; the
/// two answers (eMQP command, error code; the text line). A fenced router
/// either refuses the REQUEST or has unbound its frontend by the time it
/// arrives: then the command is [`UNBOUND`] (the job is noted unanswered).
fn offer_both(node: &Node, ledger: &ledger::Shared, body: &str, queue: &str) -> (String, String, String) {
    let ctx = zmq::Context::new();
    let s = load::dealer(&ctx, &node.frontend());
    let b = format!("{body}-e");
    let frames: [&[u8]; 7] = [b"", b"eMQP/1.0", b"REQUEST", b.as_bytes(), queue.as_bytes(), b"", b.as_bytes()];
    let at = Instant::now();
    s.send_multipart(frames, 0).expect("send a REQUEST");
    let frontend = port_of(&node.frontend());
    let mut answered = None;
    while answered.is_none() && at.elapsed() < Duration::from_secs(10) {
        answered = load::recv_within(&s, 200);
        if answered.is_none() && !crate::common::ports::is_listening(frontend) {
            break;
        }
    }
    let (command, code, answer) = match answered {
        Some(f) => {
            let text = |i: usize| f.get(i).map(|x| String::from_utf8_lossy(x).into_owned()).unwrap_or_default();
            let (command, code) = (text(2), text(5));
            let answer = match command.as_str() {
                "REPLY" => Some((Instant::now(), Answer::Acked)),
                _ => Some((Instant::now(), Answer::Refused { code: code.clone(), text: text(6) })),
            };
            (command, code, answer)
        }
        None if !crate::common::ports::is_listening(frontend) => (UNBOUND.to_string(), String::new(), None),
        None => panic!("no answer to {b}, and the frontend still listens"),
    };
    lock(ledger).jobs.insert(b, ledger::Sent { at, answer });
    let line = sched_text(node, ledger, body, queue);
    (command, code, line)
}

/// One text SCHED of `<body>-t` to `node`, noted in `ledger`; the answer line.
fn sched_text(node: &Node, ledger: &ledger::Shared, body: &str, queue: &str) -> String {
    use std::io::{BufRead, Write};
    let t = std::net::TcpStream::connect(node.text()).expect("a text connection");
    t.set_read_timeout(Some(Duration::from_secs(10))).expect("read timeout");
    let b = format!("{body}-t");
    let at = Instant::now();
    (&t).write_all(format!("SCHED {b}@{queue}\n").as_bytes()).expect("write");
    let mut line = String::new();
    std::io::BufReader::new(&t).read_line(&mut line).expect("a text answer");
    let line = line.trim_end().to_string();
    let answer = if line.starts_with("OK") {
        Answer::Acked
    } else {
        Answer::Refused { code: "STORE_FAILED".into(), text: line.clone() }
    };
    lock(ledger).jobs.insert(b, ledger::Sent { at, answer: Some((Instant::now(), answer)) });
    line
}

#[test]
fn a_paused_owner_is_fenced_by_the_standby_that_took_over() {
    let test = "failover_fence";
    let Some((s, node, mut owner, ledger)) = start(test, 200, "ff", &[]) else { return };
    let standby = node.elsewhere(&s.dir, "b").with_flags(&["--standby"]);
    let mut router = standby.spawn();
    wait_standby(&router);
    send_acked_emqp(&node, &ledger, "before-e", "fe", 10);
    send_acked_text(&node, &ledger, "before-t", "ft", 10);
    let paused = Instant::now();
    // SAFETY: plain syscall on a child of this test.
    unsafe { libc::kill(owner.pid(), libc::SIGSTOP) };
    let up = standby.wait_listening(&mut router, TAKE_OVER_BOUND + Duration::from_secs(10));
    let took = paused.elapsed();
    assert!(up, "the standby did not take over\n{}", router.log_tail(40));
    send_until_acked(&standby, &ledger, "after", "fe", BACK_BOUND)
        .unwrap_or_else(|why| panic!("the new owner acknowledges nothing: {why}\n{}", router.log_tail(30)));
    eprintln!("{test}: the owner paused; the standby listened {took:?} after");
    assert!(took <= TAKE_OVER_BOUND, "the standby listened {took:?} after the pause");

    // SAFETY: as above.
    unsafe { libc::kill(owner.pid(), libc::SIGCONT) };
    let (command, code, line) = offer_both(&node, &ledger, "stale", "fe");
    let refused = (command.as_str(), code.as_str()) == ("ERROR", "STORE_FAILED") || command == UNBOUND;
    assert!(refused, "eMQP to the fenced owner: {command} {code}");
    assert!(line.starts_with("ERR STORE_FAILED"), "text to the fenced owner: {line}");
    wait_fenced(&node).unwrap_or_else(|why| panic!("the old owner's STATUS does not say fenced: {why}"));
    let log = owner.log_text();
    assert!(
        log.contains("fenced") || log.contains("another router took this router's name"),
        "the old owner's log says it lost the name\n{}",
        owner.log_tail(30)
    );
    // Once it knows, it unbinds its frontend and backend, so clients and
    // workers listing both routers reach the new owner only; admin (above)
    // and text stay, text still refused.
    assert_unbound(&node, &owner);
    let line = sched_text(&node, &ledger, "stale2", "fe");
    assert!(line.starts_with("ERR STORE_FAILED"), "text to the fenced owner, again: {line}");
    wait_fenced(&node).unwrap_or_else(|why| panic!("admin of the fenced owner: {why}"));
    std::thread::sleep(Duration::from_secs(1));

    // The stream: it takes the new owner's subject only, and nothing of
    // the old owner follows the new owner's marker.
    let stream = node.stream();
    let (msgs, subjects) = with_js(&s, |js| async move {
        let msgs = messages(&js, &stream).await?;
        let mut st = js.get_stream(&stream).await.map_err(|e| e.to_string())?;
        let subjects = st.info().await.map_err(|e| e.to_string())?.config.subjects.clone();
        Ok((msgs, subjects))
    })
    .expect("the stream");
    let marker = msgs.iter().rfind(|m| m.marker.is_some()).expect("a marker");
    let holder: serde_json::Value =
        serde_json::from_str(marker.marker.as_deref().unwrap_or_default()).expect("a marker names its holder in JSON");
    assert_eq!(holder["pid"], router.pid(), "the last marker is the new owner's: {holder}");
    assert_eq!(subjects, std::slice::from_ref(&marker.subject), "the stream takes the new owner's subject only");
    let before: BTreeSet<u32> = msgs.iter().filter(|m| m.seq < marker.seq && m.boot > 0).map(|m| m.boot).collect();
    let after: Vec<&Msg> = msgs.iter().filter(|m| m.seq > marker.seq).collect();
    let boots_after: BTreeSet<u32> = after.iter().map(|m| m.boot).collect();
    eprintln!(
        "{test}: the new owner's marker at {} on {}; boots before it {before:?}, after it {boots_after:?} ({} messages)",
        marker.seq,
        marker.subject,
        after.len()
    );
    let stray: Vec<&&Msg> = after.iter().filter(|m| m.subject != marker.subject || m.marker.is_some()).collect();
    assert!(stray.is_empty(), "after the new owner's marker, messages not on its subject: {stray:?}");
    assert_eq!(boots_after.len(), 1, "one boot after the new owner's marker: {boots_after:?}");
    assert!(before.iter().all(|b| !boots_after.contains(b)), "the old owner appended after the marker");

    // The fenced owner hands out none of the jobs it still holds in memory
    // (they are the new owner's): no eMQP worker can reach it (its backend
    // is unbound, above), a text ASK gets NOPE.
    assert_eq!(
        take_text(&node, &ledger, "ft", Duration::from_secs(3)),
        Vec::<String>::new(),
        "the fenced owner offered"
    );

    // Every job acknowledged by either is delivered once, by the new owner.
    let acked_e = lock(&ledger).acked().filter(|(b, _)| b.starts_with("before-e") || b.starts_with("after")).count();
    let ran = take_emqp(&standby, &ledger, "default", acked_e, SERVED_BOUND);
    assert_eq!(ran, acked_e, "fe: the new owner's STATUS {:?}", standby.status());
    let ft: Vec<String> = (0..10).map(|i| format!("before-t-{i:04}")).collect();
    assert_eq!(take_text(&standby, &ledger, "ft", SERVED_BOUND), ft, "ft in order");
    std::thread::sleep(Duration::from_secs(1));
    let l = lock(&ledger);
    let counts = l.delivery_counts();
    let lost: Vec<&String> = l.acked().map(|(b, _)| b).filter(|b| !counts.contains_key(b.as_str())).collect();
    assert!(lost.is_empty(), "acknowledged, never delivered: {lost:?}");
    let twice: Vec<(&&str, &usize)> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "delivered twice: {twice:?}");
    assert!(!counts.keys().any(|b| b.starts_with("stale")), "a job refused by the fenced owner was delivered");
    drop(l);
    assert!(owner.is_alive(), "the fenced owner stays up (refusing) until stopped");
    let status = router.terminate(Duration::from_secs(20));
    assert!(status.is_some_and(|st| st.success()), "a clean stop: {status:?}\n{}", router.log_tail(30));
}

/// The old owner's side of a fence alone (no second router, the lease
/// still this router's): its stream's subjects are set by hand to another
/// one, as a new owner's start does. The next publish finds no
/// responders, the stream answers without the router's subject: the
/// router is fenced at once (no retry until `nats_give_up`), refuses
/// producers with `STORE_FAILED`, says `fenced` in STATUS and its log,
/// stays up, and the stream gets nothing more.
#[test]
fn no_responders_and_the_subject_gone_is_fenced() {
    let test = "failover_subject_gone";
    let Some((s, node, mut owner, ledger)) = start(test, 120, "fg", &[]) else { return };
    send_acked_emqp(&node, &ledger, "before-e", "fg", 5);
    let stream = node.stream();
    let (old, held) = with_js(&s, |js| {
        let stream = stream.clone();
        async move {
            let mut st = js.get_stream(&stream).await.map_err(|e| e.to_string())?;
            let info = st.info().await.map_err(|e| e.to_string())?.clone();
            let mut config = info.config.clone();
            let old = config.subjects.clone();
            config.subjects = vec![format!("{}.moved", old.first().cloned().unwrap_or_default())];
            js.update_stream(config).await.map_err(|e| e.to_string())?;
            Ok((old, info.state.messages))
        }
    })
    .expect("the stream's subjects changed by hand");
    let at = Instant::now();
    let (command, code, line) = offer_both(&node, &ledger, "gone", "fg");
    let answered = at.elapsed();
    eprintln!("{test}: subjects {old:?} moved away; the router refused {answered:?} after");
    assert_eq!((command.as_str(), code.as_str()), ("ERROR", "STORE_FAILED"), "eMQP to the fenced router");
    assert!(line.starts_with("ERR STORE_FAILED"), "text to the fenced router: {line}");
    // Well before nats_give_up (30 s): fenced, not given up.
    assert!(answered < Duration::from_secs(15), "refused {answered:?} after");
    wait_fenced(&node).unwrap_or_else(|why| panic!("STATUS does not say fenced: {why}"));
    let said = wait::until(Duration::from_secs(5), || owner.log_text().contains("this router is fenced"));
    assert!(said, "the router's log says it is fenced\n{}", owner.log_tail(30));
    let (command, _, line) = offer_both(&node, &ledger, "gone2", "fg");
    assert!(command == "ERROR" || command == UNBOUND, "eMQP to the fenced router, again: {command}");
    assert!(line.starts_with("ERR STORE_FAILED"), "text to the fenced router, again: {line}");
    let now = with_js(&s, |js| async move {
        let mut st = js.get_stream(&stream).await.map_err(|e| e.to_string())?;
        Ok(st.info().await.map_err(|e| e.to_string())?.state.messages)
    })
    .expect("the stream");
    assert_eq!(now, held, "the stream got nothing after its subjects moved");
    assert_unbound(&node, &owner);
    assert!(owner.is_alive(), "the fenced router stays up (refusing) until stopped");
    let l = lock(&ledger);
    assert!(!l.acked().any(|(b, _)| b.starts_with("gone")), "a job sent to the fenced router was acknowledged");
}
