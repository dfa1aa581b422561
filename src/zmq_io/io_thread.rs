//! The I/O thread: owns the frontend, backend and admin ROUTER sockets and
//! the egress PULL. It decodes every inbound message, routes it to the
//! shard that owns it, and sends what the shards hand it. It holds no queue
//! state and blocks in `zmq::poll` with no timeout: an idle broker sleeps.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use crossbeam_channel::Sender;

use super::admin::AdminRequest;
use super::egress::decode_tag;
use crate::broker::msg::{Dest, OnFail, ShardMsg};
use crate::broker::types::{shard_of, show, Job, Origin, PeerId, QueueName};
use crate::limits;
use crate::metrics::counters::Counters;
use crate::protocol::emqp::{decode, Command, Frame, Message, PeerType, ShowFrames, Socket};
use crate::protocol::queues::parse_queue_list;

/// Why the router should stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// DISCONNECT on the admin socket.
    AdminDisconnect,
    /// A signal or [`crate::zmq_io::RouterHandle::shutdown`].
    Requested,
}

/// Everything the I/O thread owns.
pub struct IoThread {
    /// Frontend ROUTER.
    pub frontend: zmq::Socket,
    /// Backend ROUTER.
    pub backend: zmq::Socket,
    /// Admin ROUTER.
    pub admin: zmq::Socket,
    /// Egress PULL (shards and admin thread → sockets).
    pub egress: zmq::Socket,
    /// Every shard's channel.
    pub shards: Arc<[Sender<ShardMsg>]>,
    /// The admin thread.
    pub admin_tx: Sender<AdminRequest>,
    /// Tells the control thread to stop the router.
    pub stop_tx: Sender<StopReason>,
    /// Counters.
    pub counters: Arc<Counters>,
    /// `(weight, queue)` for an INFORM with an empty queue list.
    pub default_queues: Vec<(i64, QueueName)>,
}

impl IoThread {
    /// Runs until the exit tag arrives on the egress socket.
    pub fn run(mut self) {
        loop {
            let mut items = [
                self.egress.as_poll_item(zmq::POLLIN),
                self.frontend.as_poll_item(zmq::POLLIN),
                self.backend.as_poll_item(zmq::POLLIN),
                self.admin.as_poll_item(zmq::POLLIN),
            ];
            if let Err(e) = zmq::poll(&mut items, -1) {
                tracing::error!(error = %e, "zmq poll failed");
                std::thread::sleep(std::time::Duration::from_millis(10));
                continue;
            }
            let ready: Vec<bool> = items.iter().map(|i| i.is_readable()).collect();
            if ready[0] && !self.drain_egress() {
                return;
            }
            for (i, socket) in [(1, Socket::Frontend), (2, Socket::Backend), (3, Socket::Admin)] {
                if ready[i] {
                    self.drain_inbound(socket);
                }
            }
        }
    }

    fn socket(&self, which: Socket) -> &zmq::Socket {
        match which {
            Socket::Backend => &self.backend,
            Socket::Admin => &self.admin,
            _ => &self.frontend,
        }
    }

    /// Reads up to a batch of messages from one router socket.
    fn drain_inbound(&mut self, which: Socket) {
        for _ in 0..limits::BATCH {
            match self.socket(which).recv_multipart(zmq::DONTWAIT) {
                Ok(frames) => self.on_message(which, frames),
                Err(zmq::Error::EAGAIN) => return,
                Err(e) => {
                    tracing::error!(socket = which.name(), error = %e, "recv failed");
                    return;
                }
            }
        }
    }

    /// Sends up to a batch of egress messages; `false` on the exit tag.
    fn drain_egress(&mut self) -> bool {
        for _ in 0..limits::BATCH {
            match self.egress.recv_multipart(zmq::DONTWAIT) {
                Ok(mut frames) if frames.len() >= 2 => {
                    if frames[0].first() == Some(&b'X') {
                        self.flush_egress();
                        return false;
                    }
                    let Some((dest, on_fail)) = decode_tag(&frames[0]) else {
                        tracing::error!(tag = %ShowFrames(&frames[..1]), "egress message with a bad tag dropped");
                        continue;
                    };
                    frames.remove(0);
                    self.send_out(dest, on_fail, frames);
                }
                Ok(_) => tracing::error!("short egress message dropped"),
                Err(zmq::Error::EAGAIN) => return true,
                Err(e) => {
                    tracing::error!(error = %e, "egress recv failed");
                    return true;
                }
            }
        }
        true
    }

    /// At exit: sends what the shards queued before they stopped (their
    /// KBYEs), which fair queueing may have left behind the exit tag.
    fn flush_egress(&mut self) {
        while let Ok(mut frames) = self.egress.recv_multipart(zmq::DONTWAIT) {
            if frames.len() >= 2 {
                if let Some((dest, _)) = decode_tag(&frames[0]) {
                    frames.remove(0);
                    self.send_out(dest, OnFail::Count, frames);
                }
            }
        }
    }

    /// Sends `[identity, D-frames…]`; on failure does what `on_fail` says.
    fn send_out(&mut self, dest: Dest, on_fail: OnFail, frames: Vec<Frame>) {
        let socket = match dest {
            Dest::Frontend => &self.frontend,
            Dest::Backend => &self.backend,
            Dest::Admin => &self.admin,
        };
        let err = match socket.send_multipart(frames.iter(), zmq::DONTWAIT) {
            Ok(()) => return,
            Err(e) => e,
        };
        Counters::bump(&self.counters.send_failures);
        let peer = PeerId(frames[0].clone());
        let d_frames = frames[1..].to_vec();
        let unreachable = err == zmq::Error::EHOSTUNREACH;
        tracing::debug!(%peer, error = %err, "send failed");
        let msg = match on_fail {
            OnFail::Count => return,
            OnFail::Job { home, key } => {
                let msgid = d_frames.get(3).cloned().unwrap_or_default();
                (home, ShardMsg::SendFailed { key, msgid, unreachable })
            }
            OnFail::Schedule { client } => {
                (0, ShardMsg::SchedulerSendFailed { id: peer, retry: Some((client, d_frames)) })
            }
            OnFail::Unschedule => (0, ShardMsg::SchedulerSendFailed { id: peer, retry: None }),
        };
        self.send_to_shard(msg.0, msg.1);
    }

    fn send_to_shard(&self, index: usize, msg: ShardMsg) {
        if self.shards[index].send(msg).is_err() {
            tracing::error!(shard = index, "shard gone; message dropped");
        }
    }

    fn malformed(&self, which: Socket) -> &AtomicU64 {
        match which {
            Socket::Backend => &self.counters.malformed_backend,
            Socket::Admin => &self.counters.malformed_admin,
            _ => &self.counters.malformed_frontend,
        }
    }

    fn on_message(&mut self, which: Socket, mut frames: Vec<Frame>) {
        if frames.is_empty() {
            return;
        }
        let peer = PeerId(frames.remove(0));
        let msg = match decode(&frames, which) {
            Ok(msg) => msg,
            Err(e) => {
                Counters::bump(self.malformed(which));
                tracing::warn!(socket = which.name(), %peer, error = %e, frames = %ShowFrames(&frames), "malformed message dropped");
                return;
            }
        };
        match which {
            Socket::Backend => self.on_backend(peer, msg),
            Socket::Admin => self.on_admin(peer, msg),
            _ => self.on_frontend(peer, msg, frames),
        }
    }

    fn on_frontend(&mut self, peer: PeerId, msg: Message, frames: Vec<Frame>) {
        match msg.command {
            Command::Request { queue, headers, body, extra } => {
                let name = QueueName(queue.clone());
                let job = Job {
                    msgid: msg.msgid,
                    queue_frame: queue,
                    headers,
                    body,
                    extra,
                    accepted_at: std::time::Instant::now(),
                    origin: Origin::Emqp(peer),
                    redeliveries: 0,
                };
                let index = shard_of(&name.0, self.shards.len());
                self.send_to_shard(index, ShardMsg::Request { queue: name, job, fallback_done: false });
            }
            Command::Inform { peer: PeerType::Scheduler, .. } => {
                self.send_to_shard(0, ShardMsg::SchedulerInform { id: peer, msgid: msg.msgid })
            }
            Command::Inform { peer: PeerType::Worker, .. } => self.wrong_socket(Socket::Frontend, &peer, msg.msgid),
            Command::Schedule(_) | Command::Unschedule(_) => {
                let unschedule = matches!(msg.command, Command::Unschedule(_));
                self.send_to_shard(0, ShardMsg::Schedule { client: peer, msgid: msg.msgid, frames, unschedule })
            }
            Command::Heartbeat { .. } => self.send_to_shard(0, ShardMsg::SchedulerHeartbeat { id: peer }),
            Command::Kbye => self.send_to_shard(0, ShardMsg::SchedulerKbye { id: peer }),
            Command::Error { refers_to, code, text } => {
                // A scheduler refusing a SCHEDULE/UNSCHEDULE (emq-scheduler).
                // The router does not track which client sent it, so it is
                // logged and counted, not forwarded.
                Counters::bump(&self.counters.scheduler_errors);
                tracing::warn!(scheduler = %peer, msgid = %show(&refers_to), code = %show(&code), text = %show(&text), "scheduler refused a message");
            }
            other => tracing::debug!(%peer, command = ?other.word().escape_ascii().to_string(), "ignored on frontend"),
        }
    }

    fn on_backend(&mut self, peer: PeerId, msg: Message) {
        let home = shard_of(&peer.0, self.shards.len());
        let shard_msg = match msg.command {
            Command::Inform { peer: PeerType::Worker, queues } => {
                let Some(queues) = self.inform_queues(&peer, &queues) else {
                    return self.reject_inform(Dest::Backend, &peer, msg.msgid, "bad queue list");
                };
                ShardMsg::WorkerInform { id: peer, msgid: msg.msgid, queues }
            }
            Command::Inform { peer: PeerType::Scheduler, .. } => {
                return self.wrong_socket(Socket::Backend, &peer, msg.msgid)
            }
            Command::Ready => ShardMsg::WorkerReady { id: peer },
            Command::JobReply { request_msgid, .. } => ShardMsg::WorkerReply { id: peer, request_msgid },
            Command::Heartbeat { .. } => ShardMsg::WorkerHeartbeat { id: peer },
            Command::Kbye => ShardMsg::WorkerKbye { id: peer },
            _ => return,
        };
        self.send_to_shard(home, shard_msg);
    }

    /// The queues of an INFORM: the router defaults for an empty frame.
    fn inform_queues(&self, peer: &PeerId, frame: &[u8]) -> Option<Vec<(i64, QueueName)>> {
        if frame.is_empty() {
            return Some(self.default_queues.clone());
        }
        match parse_queue_list(frame) {
            Ok(q) => Some(q.into_iter().map(|(w, n)| (w, QueueName(n.into_bytes()))).collect()),
            Err(e) => {
                tracing::warn!(worker = %peer, error = %e, "INFORM with a bad queue list refused");
                None
            }
        }
    }

    fn wrong_socket(&mut self, which: Socket, peer: &PeerId, msgid: Frame) {
        let dest = if which == Socket::Backend { Dest::Backend } else { Dest::Frontend };
        let why = if which == Socket::Backend {
            "schedulers INFORM on the frontend"
        } else {
            "workers INFORM on the backend"
        };
        self.reject_inform(dest, peer, msgid, why);
    }

    /// Answers a refused INFORM with an ERROR (EventMQ stays silent, D14).
    fn reject_inform(&mut self, dest: Dest, peer: &PeerId, msgid: Frame, why: &str) {
        Counters::bump(&self.counters.rejected_inform);
        let cmd = Command::Error { refers_to: msgid, code: b"BAD_INFORM".to_vec(), text: why.as_bytes().to_vec() };
        let frames = std::iter::once(peer.0.clone()).chain(Message::new(cmd).encode()).collect();
        self.send_out(dest, OnFail::Count, frames);
    }

    fn on_admin(&mut self, peer: PeerId, msg: Message) {
        match msg.command {
            Command::Admin(query) => {
                let sent = self.admin_tx.send(AdminRequest { peer, msgid: msg.msgid, query });
                if sent.is_err() {
                    tracing::error!("admin thread gone");
                }
            }
            Command::Disconnect => {
                tracing::info!(%peer, "DISCONNECT on the admin socket: shutting down");
                let frames =
                    std::iter::once(peer.0).chain(Message::new(Command::Ack { acked: msg.msgid }).encode()).collect();
                self.send_out(Dest::Admin, OnFail::Count, frames);
                let _ = self.stop_tx.send(StopReason::AdminDisconnect);
            }
            _ => {}
        }
    }
}
