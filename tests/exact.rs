//! Exact tracking (project issue 11): every job, peer and schedule is known
//! by a unique key, and every refusal reaches its sender. Each module takes
//! one point of the issue and checks it over real sockets on fresh ports,
//! every test under a watchdog.

mod clocks;
mod cron;
mod handover;
mod ids;
mod inform;
mod offers;
mod refusals;
mod restarts;
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
    wait_slots(h, worker, 1);
    let c = Peer::new(&h.endpoints.frontend, client);
    c.request(msgid, "default", "", msgid);
    assert_eq!(w.expect("REQUEST")[3], msgid.as_bytes());
    (w, c)
}

/// Waits until the router shows worker `id` with `slots` free slots: the
/// READYs sent on the backend have landed before a REQUEST is sent on the
/// frontend (two sockets, no order between them).
pub fn wait_slots(h: &RouterHandle, id: &[u8], slots: u64) {
    let id = String::from_utf8_lossy(id).into_owned();
    crate::emqp_router::eventually(10, &format!("worker {id} has {slots} free slots"), || {
        crate::common::admin::admin(h, "ROUTER_SHOW_WORKERS")["connected_workers"][&id]["available_slots"] == slots
    });
}

/// An `emq-scheduler` command against the router frontend `frontend`:
/// its admin socket `admin` (or `off`), its store in `data`, heartbeats
/// every 300 ms (the routers under test use short timeouts) and
/// `router_timeout` of router silence before it registers again.
pub fn scheduler_cmd(
    frontend: &str,
    admin: &str,
    data: &std::path::Path,
    router_timeout: &str,
) -> std::process::Command {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_emq-scheduler"));
    cmd.args(["--frontend", frontend, "--scheduler-admin", admin, "--heartbeat-interval", "300ms"])
        .args(["--router-timeout", router_timeout])
        .arg("--data-dir")
        .arg(data);
    cmd
}

/// A REQUEST the scheduler sent: when it arrived, and its body.
pub type Fired = (std::time::Instant, Vec<u8>);
/// An answer the scheduler sent: `(refers_to, REPLY or ERROR)`.
pub type Answered = (Vec<u8>, Vec<u8>);

/// A raw ROUTER playing the router frontend for one `emq-scheduler` child,
/// which it has registered (INFORM, ACK).
pub struct FakeFrontend {
    pub socket: zmq::Socket,
    /// The scheduler's identity.
    pub id: Vec<u8>,
    pub child: crate::common::proc::Child,
    _ctx: zmq::Context,
}

impl FakeFrontend {
    /// Starts `emq-scheduler` (admin off, heartbeats every 300 ms, data in
    /// `<dir>/data`, plus `args` and `env`) against a fresh ROUTER, and
    /// ACKs its INFORM.
    pub fn start(dir: &crate::common::proc::TestDir, args: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> FakeFrontend {
        let ctx = zmq::Context::new();
        let socket = ctx.socket(zmq::ROUTER).expect("socket");
        socket.set_linger(0).expect("linger");
        socket.bind("tcp://127.0.0.1:*").expect("bind");
        let endpoint = socket.get_last_endpoint().expect("endpoint").expect("utf-8");
        let mut cmd = scheduler_cmd(&endpoint, "off", &dir.join("data"), "30s");
        cmd.args(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = crate::common::proc::Child::spawn("emq-scheduler", &mut cmd, &dir.join("scheduler.log"));
        let mut f = FakeFrontend { socket, id: Vec::new(), child, _ctx: ctx };
        let inform = std::iter::from_fn(|| f.recv(5000)).find(|m| m[3] == b"INFORM").expect("INFORM");
        f.id = inform[0].clone();
        f.send(&[b"", b"eMQP/1.0", b"ACK", b"ack", &inform[4]]);
        f
    }

    /// The next message (R-frames) within `ms`.
    pub fn recv(&self, ms: i64) -> Option<Vec<Vec<u8>>> {
        (self.socket.poll(zmq::POLLIN, ms).unwrap_or(0) > 0).then(|| self.socket.recv_multipart(0).ok()).flatten()
    }

    /// Sends D-frames to the scheduler.
    pub fn send(&self, frames: &[&[u8]]) {
        let mut all: Vec<&[u8]> = vec![&self.id];
        all.extend_from_slice(frames);
        self.socket.send_multipart(all, 0).expect("send");
    }

    /// For `d`, heartbeats like a router and collects what the scheduler
    /// sends: (REQUEST arrival times with their bodies, answers as
    /// `(refers_to, command)`).
    pub fn run(&self, d: std::time::Duration) -> (Vec<Fired>, Vec<Answered>) {
        let (end, mut fires, mut answers) = (std::time::Instant::now() + d, Vec::new(), Vec::new());
        while std::time::Instant::now() < end {
            self.send(&[b"", b"eMQP/1.0", b"HEARTBEAT", b"hb", b"0"]);
            while let Some(f) = self.recv(100) {
                match f[3].as_slice() {
                    b"REQUEST" => fires.push((std::time::Instant::now(), f[7].clone())),
                    b"REPLY" | b"ERROR" => answers.push((f[5].clone(), f[3].clone())),
                    _ => {}
                }
            }
        }
        (fires, answers)
    }
}
