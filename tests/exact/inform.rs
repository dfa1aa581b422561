//! Point 4: INFORM validation. An empty list, a weight outside 1..=1,000,000
//! or a queue listed twice gets `ERROR BAD_INFORM` with the reason, and the
//! worker is not registered.

use std::sync::atomic::Ordering;

use crate::common::admin::admin;
use crate::emqp_router::{router, Peer, Watchdog};

#[test]
fn odd_informs_are_refused_with_the_reason() {
    let _w = Watchdog::new("odd_informs", 30);
    let h = router(2);
    let w = Peer::new(&h.endpoints.backend, b"odd-worker");
    let cases: [(&str, &str); 6] = [
        ("[]", "bad queue list: queue list is empty"),
        (r#"[[-5, "q"]]"#, "bad queue list: queue list element 0: weight must be from 1 to 1000000"),
        (r#"[[10, "a"], [0, "q"]]"#, "bad queue list: queue list element 1: weight must be from 1 to 1000000"),
        (r#"[[2000000, "q"]]"#, "bad queue list: queue list element 0: weight must be from 1 to 1000000"),
        (r#"[[10, "a"], [5, "a"]]"#, r#"bad queue list: queue list elements 0 and 1: queue "a" is listed twice"#),
        (r#"[[10, ""]]"#, "bad queue list: queue list element 0: name must not be empty"),
    ];
    for (i, (queues, why)) in cases.iter().enumerate() {
        let msgid = format!("inform-{i}");
        w.send(&[b"", b"eMQP/1.0", b"INFORM", msgid.as_bytes(), queues.as_bytes(), b"worker"]);
        let err = w.expect("ERROR");
        assert_eq!(err.len(), 7, "{err:?}");
        assert_eq!(err[4], msgid.as_bytes());
        assert_eq!(err[5], b"BAD_INFORM");
        let text = String::from_utf8_lossy(&err[6]);
        assert!(text.starts_with(why), "{queues}: {text}");
    }
    assert_eq!(admin(&h, "ROUTER_SHOW_WORKERS")["connected_workers"], serde_json::json!({}));
    assert_eq!(h.counters().rejected_inform.load(Ordering::Relaxed), cases.len() as u64);
    w.inform_worker(r#"[[10, "a"], [5, "b"]]"#);
}
