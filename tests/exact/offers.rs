//! Point 9: delivery counts for text offers. An offer that comes back,
//! because its connection closed or because its offer timeout passed,
//! counts as a delivery of the task, both causes against the same count;
//! past `MAX_RETRIES` the task is dead-lettered (counted in STATUS, listed
//! by DEAD_LIST with its reason and setbacks, its body shown by DEAD_SHOW
//! and never written to the router's log) and the task behind it comes out.

use serde_json::json;

use crate::common::admin::{call, request};
use crate::common::proc::TestDir;
use crate::common::router::{rust_router_bin, Router, RouterKind};
use crate::emqp_router::{eventually, Watchdog};
use crate::text::TextConn;
use emq::protocol::emqp::AdminWord;

/// The task that keeps coming back: its data appears nowhere else, so the
/// router's log holds it only if the router logged it.
const POISON: &str = "poison-7c1e93fa-data";

#[test]
fn offers_returned_by_timeout_and_by_disconnect_count_alike_and_the_task_is_dead_lettered() {
    let _w = Watchdog::new("text_offer_deliveries", 90);
    for shards in [1, 3] {
        let dir = TestDir::new("text-offer-deliveries");
        // The router binary, so its log is a file to read; `emq=debug` logs
        // every step of every job.
        let n = shards.to_string();
        let flags = ["--shards", &n, "--text-offer-timeout", "200ms", "--log", "emq=debug"];
        let mut router = Router::start_with(&dir, RouterKind::Rust(rust_router_bin()), &flags);
        let text: std::net::SocketAddr = router.wait_text().parse().expect("text address");
        let connect = || TextConn::connect(text);
        let status = || request(&router.admin, "STATUS").expect("STATUS");
        let text_count = |key: &str| status()["emq"]["text"][key].as_u64().unwrap_or(0);
        let mut p = connect();
        p.send(format!("SCHED {POISON}@q\nSCHED next@q\nEND\n").as_bytes());
        p.expect_closed();
        let returns = u64::from(emq::limits::MAX_RETRIES) + 1;
        // Connections whose offer timed out stay open: closing them must
        // not count again.
        let mut held = Vec::new();
        for round in 0..returns {
            let mut c = connect();
            c.send(b"ASK q\n");
            c.expect(format!("WANT? {POISON}\n").as_bytes());
            let (timeouts, disconnects) = (round.div_ceil(2), round / 2);
            if round % 2 == 0 {
                eventually(10, "offer timed out", || text_count("offers_returned_timeout") == timeouts + 1);
                held.push(c);
            } else {
                drop(c);
                eventually(10, "offer returned", || text_count("offers_returned_disconnect") == disconnects + 1);
            }
        }
        eventually(10, "dead-lettered", || text_count("offers_dead_lettered") == 1);
        let mut c = connect();
        c.send(b"ASK q\n");
        c.expect(b"WANT? next\n");
        c.send(b"ACK\n");
        // A late answer to a timed-out offer finds no task.
        held[0].send(b"ACK\n");
        held[0].expect_err("NO_TASK");
        let status = status();
        assert_eq!(status["emq"]["text"]["offers_dead_lettered"], 1, "{shards} shards: {status}");
        assert_eq!(status["emq"]["counters"]["dead_lettered"], 1, "{status}");
        assert_eq!(
            (
                status["emq"]["text"]["offers_returned_timeout"].as_u64(),
                status["emq"]["text"]["offers_returned_disconnect"].as_u64()
            ),
            (Some(returns.div_ceil(2)), Some(returns / 2)),
            "{shards} shards: {status}"
        );
        assert_eq!(status["waiting_messages_by_queue"]["q"].as_u64().unwrap_or(0), 0, "{status}");
        assert_eq!(status["dead_messages_by_queue"], json!({"q": 1}), "{status}");
        assert_eq!(status["dead_lettered_messages_by_queue"], json!({"q": 1}), "{status}");

        // The dead set, as `emq-cli dead list` shows it: the first job of
        // the queue's shard, every return a setback, the last one's reason.
        let listed = request(&router.admin, "DEAD_LIST").expect("DEAD_LIST");
        assert_eq!(listed["total"], 1, "{listed}");
        let job = &listed["jobs"][0];
        let msgid = job["msgid"].as_str().unwrap_or_default();
        assert!(uuid::Uuid::parse_str(msgid).is_ok(), "a text job's msgid is a uuid: {job}");
        let none: &[&[u8]] = &[];
        let frames = emq::job::JobFrames::new(msgid.as_bytes(), b"q", b"", POISON.as_bytes(), none);
        let id = format!("{}-1", emq::broker::types::shard_of(b"q", shards));
        let want = json!({"id": id, "queue": "q", "msgid": msgid, "headers": "", "reason": "text_returned",
            "failures": returns, "dead_at": job["dead_at"], "bytes": frames.expect("frames").len()});
        assert_eq!(job, &want, "{shards} shards");
        let shown = call(&router.admin, AdminWord::DeadShow, &[id.as_bytes()]).expect("DEAD_SHOW");
        assert_eq!((shown["job"]["id"].as_str(), shown["job"]["body"].as_str()), (Some(id.as_str()), Some(POISON)));

        // The router logged the burial with the job's id and setbacks, and
        // every step at debug level, but never the task's data.
        let log = router.child.log_text();
        let buried = log.lines().find(|l| l.contains("job out of retries: moved to the dead set"));
        assert!(
            buried.is_some_and(|l| l.contains(&format!("job={id} queue=q msgid={msgid} "))
                && l.contains(&format!("failures={returns} why=\"text_returned\""))),
            "{buried:?}"
        );
        assert!(log.contains("job offered"), "debug lines logged: {}", router.child.log_tail(20));
        assert!(!log.contains(POISON), "the task's data is in the router's log:\n{log}");
    }
}
