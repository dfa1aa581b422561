//! Point 9: delivery counts for text offers. An offer that comes back,
//! because its connection closed or because its offer timeout passed,
//! counts as a delivery of the task, both causes against the same count;
//! past `MAX_RETRIES` the task is dead-lettered (counted in STATUS) and
//! the task behind it comes out.

use std::sync::atomic::Ordering::Relaxed;

use crate::emqp_router::{admin, eventually, Watchdog};
use crate::text_broker::{connect, router_with_text};

#[test]
fn offers_returned_by_timeout_and_by_disconnect_count_alike_and_the_task_is_dead_lettered() {
    let _w = Watchdog::new("text_offer_deliveries", 60);
    for shards in [1, 3] {
        let h = router_with_text(shards, |r| r.text_offer_timeout = Some("200ms".into()));
        let mut p = connect(&h);
        p.send(b"SCHED poison@q\nSCHED next@q\nEND\n");
        p.expect_closed();
        let returns = u64::from(emq::limits::MAX_RETRIES) + 1;
        // Connections whose offer timed out stay open: closing them must
        // not count again.
        let mut held = Vec::new();
        for round in 0..returns {
            let mut c = connect(&h);
            c.send(b"ASK q\n");
            c.expect(b"WANT? poison\n");
            let (timeouts, disconnects) = (round.div_ceil(2), round / 2);
            if round % 2 == 0 {
                eventually(10, "offer timed out", || h.counters().text_returned_timeout.load(Relaxed) == timeouts + 1);
                held.push(c);
            } else {
                drop(c);
                eventually(10, "offer returned", || {
                    h.counters().text_returned_disconnect.load(Relaxed) == disconnects + 1
                });
            }
        }
        eventually(10, "dead-lettered", || h.counters().text_dead_lettered.load(Relaxed) == 1);
        let mut c = connect(&h);
        c.send(b"ASK q\n");
        c.expect(b"WANT? next\n");
        c.send(b"ACK\n");
        // A late answer to a timed-out offer finds no task.
        held[0].send(b"ACK\n");
        held[0].expect_err("NO_TASK");
        let status = admin(&h, "STATUS");
        assert_eq!(status["emq"]["text"]["offers_dead_lettered"], 1, "{shards} shards: {status}");
        assert_eq!(status["emq"]["counters"]["dead_lettered"], 1, "{status}");
        assert_eq!(
            (h.counters().text_returned_timeout.load(Relaxed), h.counters().text_returned_disconnect.load(Relaxed)),
            (returns.div_ceil(2), returns / 2),
            "{shards} shards"
        );
        assert_eq!(status["waiting_messages_by_queue"]["q"].as_u64().unwrap_or(0), 0, "{status}");
    }
}
