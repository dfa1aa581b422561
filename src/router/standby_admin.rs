//! A standby's admin socket (docs/replicated.md "Watching a take-over"):
//! while a router started with `standby` waits for its name and replays
//! the streams it took, its admin address is already bound and answers
//! STATUS with who owns the name and how old the owner's lease is, so an
//! operator (`emq-cli status`) and a health check can tell a standby from
//! a dead router. Every other admin command is refused with `ERROR
//! NOT_OWNER`, naming the owner. Once the router serves, the socket is
//! handed to the router's own I/O thread unchanged (no port is closed and
//! bound again).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use serde_json::{json, Value};

use super::StartError;
use crate::jslog::ownership::Ownership;
use crate::protocol::emqp::{decode_ref, AdminWord, Command, Message, Socket};

/// How long one wait for a request lasts before the stop flag is read, ms.
const POLL_MS: i64 = 100;

/// The thread answering a standby's admin socket.
pub struct StandbyAdmin {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<zmq::Socket>,
}

/// Starts answering `socket` (a bound ROUTER) for router `name` with
/// `own`'s view.
///
/// # Errors
/// [`StartError::Io`] when the thread cannot be made.
pub fn start(socket: zmq::Socket, own: Arc<Ownership>, name: String) -> Result<StandbyAdmin, StartError> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let thread = std::thread::Builder::new()
        .name("emq-standby-admin".into())
        .spawn(move || serve(socket, &own, &name, &flag))
        .map_err(|source| StartError::Io { what: "standby admin thread".into(), source })?;
    Ok(StandbyAdmin { stop, thread })
}

impl StandbyAdmin {
    /// Stops answering and gives the socket back (`None` if the thread
    /// panicked: the caller binds the address again).
    pub fn finish(self) -> Option<zmq::Socket> {
        self.stop.store(true, Ordering::Release);
        self.thread.join().ok()
    }
}

fn serve(socket: zmq::Socket, own: &Ownership, name: &str, stop: &AtomicBool) -> zmq::Socket {
    while !stop.load(Ordering::Acquire) {
        match socket.poll(zmq::POLLIN, POLL_MS) {
            Ok(n) if n > 0 => {}
            _ => continue,
        }
        let Ok(frames) = socket.recv_multipart(zmq::DONTWAIT) else { continue };
        let Some((peer, rest)) = frames.split_first() else { continue };
        let Ok(msg) = decode_ref(rest, Socket::Admin) else { continue };
        let command = match msg.command {
            Command::Admin { word: AdminWord::Status, .. } => {
                Command::Reply { body: status(own, name).to_string().into_bytes() }
            }
            _ => Command::Error {
                refers_to: msg.msgid.to_vec(),
                code: b"NOT_OWNER".to_vec(),
                text: refusal(own, name).into_bytes(),
            },
        };
        let mut out = vec![peer.clone()];
        out.extend(Message::new(command).encode());
        // A peer gone meanwhile is nothing to the standby.
        let _ = socket.send_multipart(out, zmq::DONTWAIT);
    }
    socket
}

/// STATUS as a standby answers it: EventMQ's shape with no queues, and
/// `emq.wal.nats.ownership` ([`Ownership::to_json`]); `emq.role` says
/// `standby` (or `replaying` once it took the name).
fn status(own: &Ownership, name: &str) -> Value {
    let view = own.to_json();
    json!({
        "emq": {
            "version": env!("CARGO_PKG_VERSION"),
            "role": view["role"],
            "router_name": name,
            "shards": 0,
            "uptime_secs": 0,
            "wal": {
                "durability": "replicated",
                "nats": {"role": view["role"], "router_name": name, "standby": true, "ownership": view,
                    "other_routers": own.peers().to_json()},
                "shards": [],
            },
        },
    })
}

/// The words of `ERROR NOT_OWNER`.
fn refusal(own: &Ownership, name: &str) -> String {
    let view = own.to_json();
    let holder = view["holder"].as_str().unwrap_or("unknown");
    format!(
        "this router is a {} for router name {name}; its owner is {holder}",
        view["role"].as_str().unwrap_or("standby")
    )
}
