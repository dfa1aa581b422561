//! The I/O thread: owns the frontend, backend and admin ROUTER sockets. It
//! decodes every inbound message, routes it to the shard that owns it, and
//! sends what the shards hand it through the egress channel. It holds no
//! queue state and blocks in `zmq::poll` with no timeout (the egress wake-up
//! is one of the poll items): an idle broker sleeps.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use crossbeam_channel::Sender;

use super::egress::{Egress, EgressRx};
use crate::broker::msg::{Dest, OnFail, Outgoing, Schedule, ShardMsg};
use crate::broker::types::{shard_of, NewJob, Origin};
use crate::ids::{MsgId, PeerId, QueueName};
use crate::limits;
use crate::metrics::counters::Counters;
use crate::protocol::emqp::{decode, AdminQuery, Command, DecodeError, Frame, Message, PeerType, ShowFrames, Socket};
use crate::protocol::queues::parse_queue_list;

/// A query from the admin socket, for the admin thread.
#[derive(Debug)]
pub struct AdminRequest {
    /// The emq-cli peer.
    pub peer: PeerId,
    /// Its msgid.
    pub msgid: MsgId,
    /// What it asks.
    pub query: AdminQuery,
}

/// Why the router should stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// DISCONNECT on the admin socket.
    AdminDisconnect,
    /// A signal or [`crate::router::RouterHandle::shutdown`].
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
    /// What shards and the admin thread hand over for sending.
    pub egress: EgressRx,
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
    /// Runs until [`Egress::Exit`] arrives.
    pub fn run(mut self) {
        loop {
            if !self.drain_egress() {
                return;
            }
            let egress_fd = self.egress.fd();
            let mut items = [
                zmq::PollItem::from_fd(egress_fd, zmq::POLLIN),
                self.frontend.as_poll_item(zmq::POLLIN),
                self.backend.as_poll_item(zmq::POLLIN),
                self.admin.as_poll_item(zmq::POLLIN),
            ];
            // Block only when nothing was handed over since the drain.
            let timeout = if self.egress.arm() { -1 } else { 0 };
            let polled = zmq::poll(&mut items, timeout);
            self.egress.disarm();
            if let Err(e) = polled {
                tracing::error!(error = %e, "zmq poll failed");
                std::thread::sleep(std::time::Duration::from_millis(10));
                continue;
            }
            let ready: [bool; 4] = std::array::from_fn(|i| items[i].is_readable());
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

    /// Sends up to a batch of egress messages; `false` on [`Egress::Exit`].
    fn drain_egress(&mut self) -> bool {
        for _ in 0..limits::BATCH {
            match self.egress.try_recv() {
                Some(Egress::Send(out)) => self.send_out(out),
                Some(Egress::Exit) => {
                    self.flush_egress();
                    return false;
                }
                None => return true,
            }
        }
        true
    }

    /// At exit: sends what was handed over before the shards stopped (their
    /// KBYEs), failures only counted.
    fn flush_egress(&mut self) {
        while let Some(e) = self.egress.try_recv() {
            if let Egress::Send(out) = e {
                self.send_out(Outgoing { on_fail: OnFail::Count, ..out });
            }
        }
    }

    /// Sends `[identity, D-frames…]`; on failure does what `on_fail` says.
    fn send_out(&mut self, out: Outgoing) {
        let socket = match out.dest {
            Dest::Frontend => &self.frontend,
            Dest::Backend => &self.backend,
            Dest::Admin => &self.admin,
        };
        let frames = std::iter::once(&out.peer.0).chain(out.frames.iter());
        let err = match socket.send_multipart(frames, zmq::DONTWAIT) {
            Ok(()) => return,
            Err(e) => e,
        };
        Counters::bump(&self.counters.send_failures);
        let unreachable = err == zmq::Error::EHOSTUNREACH;
        tracing::debug!(peer = %out.peer, error = %err, "send failed");
        let (index, msg) = match out.on_fail {
            OnFail::Count => return,
            OnFail::Job { home, key } => {
                let msgid = MsgId(out.frames.get(3).cloned().unwrap_or_default());
                (home, ShardMsg::SendFailed { key, msgid, unreachable })
            }
            OnFail::Schedule { client } => {
                (0, ShardMsg::SchedulerSendFailed { id: out.peer, retry: Schedule::from_frames(client, out.frames) })
            }
            OnFail::Unschedule => (0, ShardMsg::SchedulerSendFailed { id: out.peer, retry: None }),
        };
        self.send_to_shard(index, msg);
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
                if which == Socket::Frontend {
                    self.refuse_short_schedule(&peer, &frames, &e);
                }
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
                let job = NewJob {
                    msgid: MsgId(msg.msgid),
                    queue_frame: queue,
                    headers,
                    body,
                    extra,
                    origin: Origin::Emqp(peer),
                };
                let index = shard_of(&name.0, self.shards.len());
                self.send_to_shard(index, ShardMsg::Request { queue: name, job, fallback_done: false });
            }
            Command::Inform { peer: PeerType::Scheduler, name, .. } => {
                self.send_to_shard(0, ShardMsg::SchedulerInform { id: peer, msgid: MsgId(msg.msgid), name })
            }
            Command::Inform { peer: PeerType::Worker, .. } => self.wrong_socket(Socket::Frontend, &peer, msg.msgid),
            Command::Schedule(body) | Command::Unschedule(body) => {
                let unschedule = frames.get(2).is_some_and(|w| w.as_slice() == b"UNSCHEDULE");
                let sched = Schedule { client: peer, msgid: MsgId(msg.msgid), frames, body, unschedule };
                self.send_to_shard(0, ShardMsg::Schedule(sched))
            }
            Command::Heartbeat { .. } => {
                self.send_to_shard(0, ShardMsg::SchedulerHeartbeat { id: peer, msgid: MsgId(msg.msgid) })
            }
            Command::Kbye => self.send_to_shard(0, ShardMsg::SchedulerKbye { id: peer }),
            // A scheduler's answer to a SCHEDULE/UNSCHEDULE (emq-scheduler),
            // for the client that sent it.
            Command::Error { refers_to, .. } | Command::Reply { body: refers_to } => {
                self.send_to_shard(0, ShardMsg::SchedulerAnswer { id: peer, refers_to: MsgId(refers_to), frames })
            }
            other => tracing::debug!(%peer, command = ?other.word().escape_ascii().to_string(), "ignored on frontend"),
        }
    }

    fn on_backend(&mut self, peer: PeerId, msg: Message) {
        let home = shard_of(&peer.0, self.shards.len());
        let shard_msg = match msg.command {
            Command::Inform { peer: PeerType::Worker, queues, .. } => match self.inform_queues(&peer, &queues) {
                Ok(queues) => ShardMsg::WorkerInform { id: peer, msgid: MsgId(msg.msgid), queues },
                Err(why) => return self.reject_inform(Dest::Backend, &peer, msg.msgid, &why),
            },
            Command::Inform { peer: PeerType::Scheduler, .. } => {
                return self.wrong_socket(Socket::Backend, &peer, msg.msgid)
            }
            Command::Ready => ShardMsg::WorkerReady { id: peer },
            Command::JobReply { request_msgid, .. } => {
                ShardMsg::WorkerReply { id: peer, request_msgid: MsgId(request_msgid) }
            }
            Command::Heartbeat { .. } => ShardMsg::WorkerHeartbeat { id: peer },
            Command::Kbye => ShardMsg::WorkerKbye { id: peer },
            _ => return,
        };
        self.send_to_shard(home, shard_msg);
    }

    /// The queues of an INFORM: the router defaults for an empty frame;
    /// otherwise the list, validated ([`parse_queue_list`]'s rules). The
    /// error is the refusal's text.
    fn inform_queues(&self, peer: &PeerId, frame: &[u8]) -> Result<Vec<(i64, QueueName)>, String> {
        if frame.is_empty() {
            return Ok(self.default_queues.clone());
        }
        match parse_queue_list(frame) {
            Ok(q) => Ok(q.into_iter().map(|(w, n)| (w, QueueName(n.into_bytes()))).collect()),
            Err(e) => {
                tracing::warn!(worker = %peer, error = %e, "INFORM with a bad queue list refused");
                Err(format!("bad queue list: {e}"))
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

    /// A SCHEDULE/UNSCHEDULE with frames missing gets `ERROR BAD_FRAMES`
    /// naming the frame (EventMQ dropped it, or killed its scheduler, S6).
    fn refuse_short_schedule(&mut self, peer: &PeerId, frames: &[Frame], e: &DecodeError) {
        let (DecodeError::MissingFrame { command: "SCHEDULE" | "UNSCHEDULE", .. }, Some(msgid)) = (e, frames.get(3))
        else {
            return;
        };
        Counters::bump(&self.counters.rejected_schedule_invalid);
        let cmd =
            Command::Error { refers_to: msgid.clone(), code: b"BAD_FRAMES".to_vec(), text: e.to_string().into_bytes() };
        let frames = Message::new(cmd).encode();
        self.send_out(Outgoing { dest: Dest::Frontend, peer: peer.clone(), frames, on_fail: OnFail::Count });
    }

    /// Answers a refused INFORM with an ERROR (EventMQ 0.3.13 stays silent).
    fn reject_inform(&mut self, dest: Dest, peer: &PeerId, msgid: Frame, why: &str) {
        Counters::bump(&self.counters.rejected_inform);
        let cmd = Command::Error { refers_to: msgid, code: b"BAD_INFORM".to_vec(), text: why.as_bytes().to_vec() };
        self.send_out(Outgoing {
            dest,
            peer: peer.clone(),
            frames: Message::new(cmd).encode(),
            on_fail: OnFail::Count,
        });
    }

    fn on_admin(&mut self, peer: PeerId, msg: Message) {
        match msg.command {
            Command::Admin(query) => {
                let sent = self.admin_tx.send(AdminRequest { peer, msgid: MsgId(msg.msgid), query });
                if sent.is_err() {
                    tracing::error!("admin thread gone");
                }
            }
            Command::Disconnect => {
                tracing::info!(%peer, "DISCONNECT on the admin socket: shutting down");
                let frames = Message::new(Command::Ack { acked: msg.msgid }).encode();
                self.send_out(Outgoing { dest: Dest::Admin, peer, frames, on_fail: OnFail::Count });
                let _ = self.stop_tx.send(StopReason::AdminDisconnect);
            }
            _ => {}
        }
    }
}
