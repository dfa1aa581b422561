//! Exact tracking (project issue 11): every job, peer and schedule is known
//! by a unique key, and every refusal reaches its sender. Each module takes
//! one point of the issue and checks it over real sockets on fresh ports,
//! every test under a watchdog.

mod clocks;
mod cron;
mod handover;
mod ids;
mod inform;
mod refusals;
mod schedules;
mod stores;
mod written_off;

use emq::router::RouterHandle;

use crate::emqp_router::Peer;

/// A raw worker `worker` (INFORMed on `default`, one READY) holding the job
/// `msgid` that raw client `client` sent: returns both peers.
pub fn worker_holding(h: &RouterHandle, worker: &[u8], client: &[u8], msgid: &str) -> (Peer, Peer) {
    let w = Peer::new(&h.endpoints.backend, worker);
    w.inform_worker(r#"[[10, "default"]]"#);
    w.ready(1);
    let c = Peer::new(&h.endpoints.frontend, client);
    // Let the READY land before the REQUEST (different sockets, no order).
    std::thread::sleep(std::time::Duration::from_millis(100));
    c.request(msgid, "default", "", msgid);
    assert_eq!(w.expect("REQUEST")[3], msgid.as_bytes());
    (w, c)
}
