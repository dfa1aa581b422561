//! The I/O thread: owns the frontend, backend and admin ROUTER sockets. It
//! decodes every inbound message in place, routes it to the shard that owns
//! it, and sends what the shards hand it through the egress channel. It
//! holds no queue state and blocks in `zmq::poll` with no timeout (the
//! egress wake-up is one of the poll items): an idle broker sleeps.
//!
//! Per read batch (up to [`limits::BATCH`] messages from one socket), the
//! messages for each shard go out as one [`ShardMsg::Batch`]: one channel
//! operation per shard per batch, not per message.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crossbeam_channel::Sender;

use super::egress::{Egress, EgressRx};
use super::frames::{send_out, InFrame, Inbound, Received};
use crate::broker::egress::{Dest, OnFail, OutMsg, Outgoing};
use crate::broker::inbox::{Schedule, ShardMsg};
use crate::broker::types::shard_of;
use crate::ids::{show, MsgId, PeerId, QueueName};
use crate::job::JobFrames;
use crate::limits;
use crate::metrics::counters::Counters;
use crate::protocol::emqp::{decode_ref, AdminWord, Command, DecodeError, Message, PeerType, ShowFrames, Socket};
use crate::protocol::queues::parse_queue_list;

/// The result a Python jobmanager sends for a job that ran out of time
/// (EventMQ 0.3.13 `worker.py`: `{"value": "TimeoutError"}`, serialized by
/// `json.dumps`): the one failure its results show, counted and retried as
/// failed (docs/emqp.md "Job results"). An exception's result is its text,
/// which cannot be told from a return value.
pub const PYTHON_TIMEOUT_RESULT: &[u8] = br#"{"value": "TimeoutError"}"#;

/// An admin command from the admin socket, for the admin thread.
#[derive(Debug)]
pub struct AdminRequest {
    /// The emq-cli peer.
    pub peer: PeerId,
    /// Its msgid.
    pub msgid: MsgId,
    /// The command.
    pub word: AdminWord,
    /// Its argument frames (frames 4…, as decoded).
    pub args: Vec<Vec<u8>>,
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
    /// Per shard, the front-end messages handed over and not taken yet.
    pub inbox_load: Arc<[AtomicUsize]>,
    /// Bytes of every waiting and in-flight job (the shards' count).
    pub job_bytes: Arc<AtomicUsize>,
    /// Bytes of new jobs handed to shards and not yet admitted or refused
    /// ([`crate::broker::shard::ShardContext::in_transit_bytes`]).
    pub in_transit_bytes: Arc<AtomicUsize>,
    /// The limits the I/O thread enforces.
    pub limits: IoLimits,
    /// The CURVE endpoints on the three sockets (rebound on
    /// [`Egress::RebindCurve`]); empty without CURVE.
    pub curve: Vec<super::curve_binds::CurveBind>,
    /// The plain frontend and backend endpoints as bound (unbound on
    /// [`Egress::UnbindPeers`]).
    pub peer_endpoints: [String; 2],
}

/// What the I/O thread refuses or waits for (each a router setting).
#[derive(Debug, Clone, Copy)]
pub struct IoLimits {
    /// Largest message, all frames together (`max_message_bytes`): past it
    /// `ERROR TOO_BIG`.
    pub max_message_bytes: usize,
    /// Most queues in one INFORM (`max_queues_per_worker`).
    pub max_queues_per_worker: usize,
    /// Messages in transit to one shard before reading pauses
    /// (`shard_inbox_messages`).
    pub shard_inbox_messages: usize,
    /// The broker-wide byte limit (`max_memory_bytes`): a REQUEST that
    /// would pass it, counting the jobs held and those in transit, gets
    /// `ERROR QUEUE_FULL` from the I/O thread.
    pub memory_limit: usize,
}

/// Answers that could not be delivered (a full pipe: the peer does not read;
/// or the peer is gone), counted per peer and logged at most once a minute
/// per peer, and these lines rate-limited together ([`crate::log_limited`]:
/// 10,000 workers leaving at once wrote 10,000 lines); the map holds at
/// most [`limits::UNDELIVERED_PEERS`] peers.
#[derive(Default)]
struct Undelivered {
    peers: crate::ids::FastMap<PeerId, (u64, Option<std::time::Instant>)>,
}

impl Undelivered {
    fn note(&mut self, peer: &PeerId, unreachable: bool) {
        if self.peers.len() >= limits::UNDELIVERED_PEERS && !self.peers.contains_key(peer) {
            self.peers.clear();
        }
        let now = std::time::Instant::now();
        let (count, logged) = self.peers.entry(peer.clone()).or_default();
        *count += 1;
        if logged.is_none_or(|at| now.duration_since(at) >= limits::UNDELIVERED_LOG_EVERY) {
            let why = if unreachable { "gone" } else { "not reading (pipe full)" };
            crate::log_limited!(warn, %peer, answers = *count, why, "answers to this peer could not be delivered");
            *count = 0;
            *logged = Some(now);
        }
    }
}

/// The I/O thread's working state besides what it was given.
struct Loop {
    io: IoThread,
    inbound: Inbound,
    /// Messages for each shard gathered during the current read batch.
    pending: Vec<Vec<ShardMsg>>,
    /// Bytes of the new jobs among them.
    pending_bytes: usize,
    /// Answers that could not be delivered, per peer, reported once a minute.
    undelivered: Undelivered,
}

impl IoThread {
    /// Runs until [`Egress::Exit`] arrives.
    pub fn run(self) {
        let pending = (0..self.shards.len()).map(|_| Vec::new()).collect();
        Loop { io: self, inbound: Inbound::default(), pending, pending_bytes: 0, undelivered: Undelivered::default() }
            .run();
    }
}

impl Loop {
    fn run(mut self) {
        loop {
            if !self.drain_egress() {
                return;
            }
            let io = &self.io;
            // While a shard is behind, the frontend and backend are not read:
            // their peers' pipes fill up to the HWM and push back.
            let paused = self.shard_behind();
            let events = if paused { zmq::PollEvents::empty() } else { zmq::POLLIN };
            let mut items = [
                zmq::PollItem::from_fd(io.egress.fd(), zmq::POLLIN),
                io.frontend.as_poll_item(events),
                io.backend.as_poll_item(events),
                io.admin.as_poll_item(zmq::POLLIN),
            ];
            // Block only when nothing was handed over since the drain; while
            // paused, look at the shards again every millisecond.
            let timeout = match (io.egress.arm(), paused) {
                (false, _) => 0,
                (true, true) => limits::BACKPRESSURE_POLL.as_millis() as i64,
                (true, false) => -1,
            };
            let polled = zmq::poll(&mut items, timeout);
            io.egress.disarm();
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
            Socket::Backend => &self.io.backend,
            Socket::Admin => &self.io.admin,
            _ => &self.io.frontend,
        }
    }

    /// Reads up to a batch of messages from one router socket, then hands
    /// each shard what is for it.
    fn drain_inbound(&mut self, which: Socket) {
        let mut inbound = std::mem::take(&mut self.inbound);
        for _ in 0..limits::BATCH {
            match inbound.recv(self.socket(which)) {
                Ok(Received::Frames(_)) => self.on_message(which, inbound.frames()),
                Ok(Received::TooManyFrames { frames: n, bytes }) => {
                    // Size first, then the frame count, as for any message.
                    if let Some((identity, frames)) = inbound.frames().split_first() {
                        if self.over_size(which, frames, bytes) {
                            self.too_big(which, &PeerId::from(identity.as_ref()), frames, bytes);
                            continue;
                        }
                    }
                    Counters::bump(self.malformed(which));
                    crate::log_limited!(
                        warn,
                        socket = which.name(),
                        frames = n,
                        max = limits::MAX_FRAMES,
                        "message with too many frames dropped"
                    );
                    if let Some((identity, frames)) = inbound.frames().split_first() {
                        let why = format!("the message has {n} frames; at most {} are accepted", limits::MAX_FRAMES);
                        self.refuse_unreadable(which, &PeerId::from(identity.as_ref()), frames, &why);
                    }
                }
                Ok(Received::Nothing) => break,
                Err(e) => {
                    tracing::error!(socket = which.name(), error = %e, "recv failed");
                    break;
                }
            }
        }
        self.inbound = inbound;
        self.flush_pending();
    }

    fn flush_pending(&mut self) {
        if self.pending_bytes > 0 {
            // Counted before the shards can take (and subtract) them.
            self.io.in_transit_bytes.fetch_add(std::mem::take(&mut self.pending_bytes), Ordering::Relaxed);
        }
        for (index, pending) in self.pending.iter_mut().enumerate() {
            if pending.is_empty() {
                continue;
            }
            let msg = ShardMsg::Batch(std::mem::take(pending));
            self.io.inbox_load[index].fetch_add(msg.inbox_weight(), Ordering::Relaxed);
            if let Err(crossbeam_channel::SendError(msg)) = self.io.shards[index].send(msg) {
                crate::broker::shard::release_in_transit(&self.io.in_transit_bytes, msg.in_transit_bytes());
                tracing::error!(shard = index, "shard gone; messages dropped");
            }
        }
    }

    /// Whether some shard has `shard_inbox_messages` or more messages from
    /// the front ends it has not taken yet.
    fn shard_behind(&self) -> bool {
        let max = self.io.limits.shard_inbox_messages;
        self.io.inbox_load.iter().any(|n| n.load(Ordering::Relaxed) >= max)
    }

    /// Sends up to a batch of egress batches; `false` on [`Egress::Exit`].
    fn drain_egress(&mut self) -> bool {
        for _ in 0..limits::BATCH {
            match self.io.egress.try_recv() {
                Some(Egress::Send(batch)) => batch.into_iter().for_each(|out| self.send(out)),
                Some(Egress::Exit) => {
                    self.flush_egress();
                    return false;
                }
                Some(Egress::RebindCurve(reply)) => {
                    let io = &mut self.io;
                    let result =
                        super::curve_binds::rebind(&io.curve, [&mut io.frontend, &mut io.backend, &mut io.admin]);
                    if let Err(why) = &result {
                        tracing::error!(%why, "CURVE endpoints not rebound");
                    }
                    let _ = reply.send(result);
                }
                Some(Egress::UnbindPeers) => self.unbind_peers(),
                None => return true,
            }
        }
        true
    }

    /// Unbinds the frontend and backend endpoints, plain and CURVE (each
    /// failure logged; an endpoint already unbound is skipped).
    fn unbind_peers(&mut self) {
        let io = &mut self.io;
        let curve = io.curve.iter().filter(|c| c.socket != Socket::Admin).map(|c| (c.socket, c.endpoint.clone()));
        let plain = [(Socket::Frontend, std::mem::take(&mut io.peer_endpoints[0]))]
            .into_iter()
            .chain([(Socket::Backend, std::mem::take(&mut io.peer_endpoints[1]))]);
        let mut done = Vec::new();
        for (which, endpoint) in plain.chain(curve).filter(|(_, e)| !e.is_empty()) {
            let socket = if which == Socket::Backend { &io.backend } else { &io.frontend };
            match socket.unbind(&endpoint) {
                Ok(()) => done.push(endpoint),
                Err(e) => tracing::warn!(socket = which.name(), %endpoint, error = %e, "not unbound"),
            }
        }
        io.curve.retain(|c| c.socket == Socket::Admin);
        tracing::warn!(endpoints = ?done, "fenced: frontend and backend unbound, their connections dropped; admin stays");
    }

    /// At exit: sends what was handed over before the shards stopped (their
    /// KBYEs), failures only counted.
    fn flush_egress(&mut self) {
        while let Some(e) = self.io.egress.try_recv() {
            if let Egress::Send(batch) = e {
                for out in batch {
                    self.send(Outgoing { on_fail: OnFail::Count, ..out });
                }
            }
        }
    }

    /// Sends one message; on failure does what its `on_fail` says.
    fn send(&mut self, out: Outgoing) {
        let socket = match out.dest {
            Dest::Frontend => &mut self.io.frontend,
            Dest::Backend => &mut self.io.backend,
            Dest::Admin => &mut self.io.admin,
        };
        let err = match send_out(socket, &out.peer.0, &out.msg) {
            Ok(()) => return,
            Err(e) => e,
        };
        Counters::bump(&self.io.counters.send_failures);
        let unreachable = err == zmq::Error::EHOSTUNREACH;
        tracing::debug!(peer = %out.peer, error = %err, "send failed");
        let (index, msg) = match (out.on_fail, out.msg) {
            (OnFail::Count, _) => {
                Counters::bump(&self.io.counters.undelivered_answers);
                return self.undelivered.note(&out.peer, unreachable);
            }
            (OnFail::Job { home, key }, msg) => {
                let msgid = match &msg {
                    OutMsg::Job(f) => MsgId::from(f.msgid()),
                    _ => MsgId::default(),
                };
                (home, ShardMsg::SendFailed { key, msgid, unreachable })
            }
            (OnFail::Schedule { client }, msg) => {
                let retry = Schedule::from_frames(client, msg.to_frames());
                (0, ShardMsg::SchedulerSendFailed { id: out.peer, retry })
            }
            (OnFail::Unschedule, _) => (0, ShardMsg::SchedulerSendFailed { id: out.peer, retry: None }),
        };
        if self.io.shards[index].send(msg).is_err() {
            tracing::error!(shard = index, "shard gone; message dropped");
        }
    }

    fn for_shard(&mut self, index: usize, msg: ShardMsg) {
        self.pending[index].push(msg);
    }

    fn malformed(&self, which: Socket) -> &AtomicU64 {
        match which {
            Socket::Backend => &self.io.counters.malformed_backend,
            Socket::Admin => &self.io.counters.malformed_admin,
            _ => &self.io.counters.malformed_frontend,
        }
    }

    fn on_message(&mut self, which: Socket, frames: &[InFrame]) {
        let Some((identity, frames)) = frames.split_first() else { return };
        let peer = PeerId::from(identity.as_ref());
        let bytes: usize = frames.iter().map(|f| f.as_ref().len()).sum();
        if self.over_size(which, frames, bytes) {
            return self.too_big(which, &peer, frames, bytes);
        }
        let msg = match decode_ref(frames, which) {
            Ok(msg) => msg,
            Err(e) => {
                Counters::bump(self.malformed(which));
                crate::log_limited!(warn, socket = which.name(), %peer, error = %e, frames = %ShowFrames(frames), "malformed message dropped");
                if let DecodeError::MissingFrame { .. } = e {
                    self.refuse_unreadable(which, &peer, frames, &e.to_string());
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

    /// Whether a message of `bytes` (every frame but the identity; `frames`
    /// are its first frames without the identity) is over
    /// `max_message_bytes`: refused `TOO_BIG`. The first check on every
    /// message, before its frame count and its decoding (docs/emqp.md
    /// "ERROR"). A job result's result frame does not count
    /// ([`is_job_result`]).
    fn over_size(&self, which: Socket, frames: &[InFrame], bytes: usize) -> bool {
        let max = self.io.limits.max_message_bytes;
        bytes > max && !(is_job_result(which, frames) && bytes - frames[4].as_ref().len() <= max)
    }

    /// Whether a new job of `len` bytes would take the jobs held, in transit
    /// and read in this batch past the memory limit (the shard's own
    /// admission check, made before the job is handed over).
    fn over_memory_limit(&self, len: usize) -> bool {
        let held = self.io.job_bytes.load(Ordering::Relaxed) + self.io.in_transit_bytes.load(Ordering::Relaxed);
        held + self.pending_bytes + len > self.io.limits.memory_limit
    }

    /// A REQUEST refused by [`Loop::over_memory_limit`]: `ERROR QUEUE_FULL`
    /// with the figures, counted as the shards count theirs.
    fn memory_full(&mut self, peer: &PeerId, msgid: &[u8], len: usize) {
        Counters::bump(&self.io.counters.rejected_queue_full);
        let held = self.io.job_bytes.load(Ordering::Relaxed) + self.io.in_transit_bytes.load(Ordering::Relaxed);
        let limit = self.io.limits.memory_limit;
        let text = format!("the broker holds {held} bytes of jobs; its limit is {limit} (a job of {len} bytes)");
        self.error(Dest::Frontend, peer, msgid, "QUEUE_FULL", &text);
    }

    /// A message over `max_message_bytes`: counted, and a frontend peer gets
    /// `ERROR TOO_BIG` about its msgid (frame 3) when it has one.
    fn too_big(&mut self, which: Socket, peer: &PeerId, frames: &[InFrame], bytes: usize) {
        Counters::bump(&self.io.counters.rejected_too_big);
        let max = self.io.limits.max_message_bytes;
        crate::log_limited!(warn, socket = which.name(), %peer, bytes, max, "message over max_message_bytes refused");
        if let (Socket::Frontend, Some(msgid)) = (which, frames.get(3)) {
            let text = format!("the message has {bytes} bytes; at most {max} are accepted");
            self.error(Dest::Frontend, peer, msgid.as_ref(), "TOO_BIG", &text);
        }
    }

    fn on_frontend(&mut self, peer: PeerId, msg: Message<&[u8]>, frames: &[InFrame]) {
        match msg.command {
            Command::Request { queue, headers, body, extra } => {
                match JobFrames::new(msg.msgid, queue, headers, body, &extra) {
                    Ok(job) if self.over_memory_limit(job.len()) => self.memory_full(&peer, msg.msgid, job.len()),
                    Ok(job) => {
                        self.pending_bytes += job.len();
                        self.for_shard(
                            shard_of(queue, self.io.shards.len()),
                            ShardMsg::Request { client: peer, frames: job, fallback_done: false },
                        )
                    }
                    Err(e) => {
                        Counters::bump(&self.io.counters.rejected_bad_request);
                        crate::log_limited!(warn, client = %peer, msgid = %show(msg.msgid), error = %e, "REQUEST refused");
                        self.error(Dest::Frontend, &peer, msg.msgid, "BAD_REQUEST", &e.to_string());
                    }
                }
            }
            Command::Inform { peer: PeerType::Scheduler, name, .. } => {
                let name = name.map(<[u8]>::to_vec);
                self.for_shard(0, ShardMsg::SchedulerInform { id: peer, msgid: MsgId::from(msg.msgid), name })
            }
            Command::Inform { peer: PeerType::Worker, .. } => self.wrong_socket(Socket::Frontend, &peer, msg.msgid),
            Command::Schedule(ref body) | Command::Unschedule(ref body) => {
                let unschedule = matches!(msg.command, Command::Unschedule(_));
                let frames = frames.iter().map(|f| f.as_ref().to_vec()).collect();
                let (msgid, body) = (MsgId::from(msg.msgid), body.to_owned_frames());
                self.for_shard(0, ShardMsg::Schedule(Schedule { client: peer, msgid, frames, body, unschedule }))
            }
            Command::Heartbeat { .. } => {
                self.for_shard(0, ShardMsg::SchedulerHeartbeat { id: peer, msgid: MsgId::from(msg.msgid) })
            }
            Command::Kbye => self.for_shard(0, ShardMsg::SchedulerKbye { id: peer }),
            // A scheduler's answer to a SCHEDULE/UNSCHEDULE (emq-scheduler),
            // for the client that sent it.
            Command::Error { refers_to, .. } | Command::Reply { body: refers_to } => {
                let frames = frames.iter().map(|f| f.as_ref().to_vec()).collect();
                self.for_shard(0, ShardMsg::SchedulerAnswer { id: peer, refers_to: MsgId::from(refers_to), frames })
            }
            other => tracing::debug!(%peer, command = ?other.word().escape_ascii().to_string(), "ignored on frontend"),
        }
    }

    fn on_backend(&mut self, peer: PeerId, msg: Message<&[u8]>) {
        let home = shard_of(&peer.0, self.io.shards.len());
        let shard_msg = match msg.command {
            Command::Inform { peer: PeerType::Worker, queues, .. } => match self.inform_queues(queues) {
                Ok(queues) => ShardMsg::WorkerInform { id: peer, msgid: MsgId::from(msg.msgid), queues },
                Err(why) => {
                    crate::log_limited!(warn, worker = %peer, why = %why, "INFORM refused");
                    return self.reject_inform(Dest::Backend, &peer, msg.msgid, &why);
                }
            },
            Command::Inform { peer: PeerType::Scheduler, .. } => {
                return self.wrong_socket(Socket::Backend, &peer, msg.msgid)
            }
            Command::Ready => ShardMsg::WorkerReady { id: peer },
            Command::Unready => ShardMsg::WorkerUnready { id: peer, msgid: MsgId::from(msg.msgid) },
            Command::JobReply { request_msgid, failed, result } => {
                let failed = failed || result == PYTHON_TIMEOUT_RESULT;
                ShardMsg::WorkerReply { id: peer, request_msgid: MsgId::from(request_msgid), failed }
            }
            Command::Heartbeat { .. } => ShardMsg::WorkerHeartbeat { id: peer },
            Command::Kbye => ShardMsg::WorkerKbye { id: peer },
            _ => return,
        };
        self.for_shard(home, shard_msg);
    }

    /// The queues of an INFORM (the router defaults for an empty frame), or
    /// why they are refused. The frame is measured before it is parsed, so
    /// parsing costs at most ~`max_queues_per_worker` × 300 bytes of JSON.
    fn inform_queues(&self, frame: &[u8]) -> Result<Vec<(i64, QueueName)>, String> {
        if frame.is_empty() {
            return Ok(self.io.default_queues.clone());
        }
        let max = self.io.limits.max_queues_per_worker;
        let max_bytes = max.saturating_mul(limits::MAX_QUEUE_NAME_BYTES + 45);
        if frame.len() > max_bytes {
            return Err(format!("the queue list has {} bytes; at most {max} queues are accepted", frame.len()));
        }
        let queues = parse_queue_list(frame).map_err(|e| format!("bad queue list: {e}"))?;
        if queues.len() > max {
            return Err(format!("the INFORM declares {} queues; at most {max} are accepted", queues.len()));
        }
        if let Some((_, long)) = queues.iter().find(|(_, n)| n.len() > limits::MAX_QUEUE_NAME_BYTES) {
            return Err(format!("queue name of {} bytes; at most {}", long.len(), limits::MAX_QUEUE_NAME_BYTES));
        }
        Ok(queues.into_iter().map(|(w, n)| (w, QueueName::from(n.into_bytes()))).collect())
    }

    /// A message dropped unread (frames missing, or more than
    /// [`limits::MAX_FRAMES`]) whose frame 3 is there is answered about that
    /// msgid when its frame 2 names a command that expects an answer: on
    /// the frontend a REQUEST, SCHEDULE or UNSCHEDULE gets `ERROR BAD_FRAMES
    /// <why>` (the router answers every REQUEST; docs/emqp.md "ERROR"), an
    /// INFORM on either socket `ERROR BAD_INFORM <why>`, an admin command
    /// on the admin socket `ERROR BAD_FRAMES <why>`. Anything else stays
    /// unanswered (logged and counted as malformed). EventMQ 0.3.13 dropped
    /// all of these silently, or killed its scheduler (S6).
    fn refuse_unreadable(&mut self, which: Socket, peer: &PeerId, frames: &[InFrame], why: &str) {
        let (Some(command), Some(msgid)) = (frames.get(2), frames.get(3)) else { return };
        match (which, command.as_ref()) {
            (Socket::Frontend, b"SCHEDULE" | b"UNSCHEDULE") => {
                Counters::bump(&self.io.counters.rejected_schedule_invalid);
                self.error(Dest::Frontend, peer, msgid.as_ref(), "BAD_FRAMES", why);
            }
            (Socket::Frontend, b"REQUEST") => self.error(Dest::Frontend, peer, msgid.as_ref(), "BAD_FRAMES", why),
            (Socket::Frontend | Socket::Backend, b"INFORM") => {
                let dest = if which == Socket::Backend { Dest::Backend } else { Dest::Frontend };
                self.reject_inform(dest, peer, msgid.as_ref(), why);
            }
            (Socket::Admin, word) if crate::protocol::emqp::AdminWord::from_word(word).is_some() => {
                self.error(Dest::Admin, peer, msgid.as_ref(), "BAD_FRAMES", why);
            }
            _ => {}
        }
    }

    fn wrong_socket(&mut self, which: Socket, peer: &PeerId, msgid: &[u8]) {
        let dest = if which == Socket::Backend { Dest::Backend } else { Dest::Frontend };
        let why = if which == Socket::Backend {
            "schedulers INFORM on the frontend"
        } else {
            "workers INFORM on the backend"
        };
        self.reject_inform(dest, peer, msgid, why);
    }

    /// Answers a refused INFORM with an ERROR (EventMQ 0.3.13 stays silent).
    fn reject_inform(&mut self, dest: Dest, peer: &PeerId, msgid: &[u8], why: &str) {
        Counters::bump(&self.io.counters.rejected_inform);
        self.error(dest, peer, msgid, "BAD_INFORM", why);
    }

    /// Sends `ERROR <code> <text>` about `msgid` to `peer`.
    fn error(&mut self, dest: Dest, peer: &PeerId, msgid: &[u8], code: &str, text: &str) {
        let cmd = Command::Error {
            refers_to: msgid.to_vec(),
            code: code.as_bytes().to_vec(),
            text: text.as_bytes().to_vec(),
        };
        let msg = OutMsg::Frames(Message::new(cmd).encode());
        self.send(Outgoing { dest, peer: peer.clone(), msg, on_fail: OnFail::Count });
    }

    fn on_admin(&mut self, peer: PeerId, msg: Message<&[u8]>) {
        match msg.command {
            Command::Admin { word, args } => {
                let args = args.iter().map(|a| a.to_vec()).collect();
                let request = AdminRequest { peer, msgid: MsgId::from(msg.msgid), word, args };
                if self.io.admin_tx.send(request).is_err() {
                    tracing::error!("admin thread gone");
                }
            }
            Command::Disconnect => {
                tracing::info!(%peer, "DISCONNECT on the admin socket: shutting down");
                let msg = OutMsg::Frames(Message::new(Command::Ack { acked: msg.msgid.to_vec() }).encode());
                self.send(Outgoing { dest: Dest::Admin, peer, msg, on_fail: OnFail::Count });
                let _ = self.io.stop_tx.send(StopReason::AdminDisconnect);
            }
            _ => {}
        }
    }
}

/// Whether `frames` (without the identity) are a worker's job-result REPLY
/// on the backend. Its result frame (frame 4) is taken whatever its size
/// (`max_message_bytes` bounds what the router keeps, and the rest of the
/// message must still fit it): the router reads only its msgid and
/// `failed` frames and never stores or forwards the result, and dropping it
/// would leave its job unanswered, held until its deadline and its worker
/// barred from the queue. (ZeroMQ still drops a message over
/// [`limits::zmq_max_msg_size`], about twice `max_message_bytes`, with its
/// connection: a result up to twice `max_message_bytes` arrives.)
fn is_job_result(which: Socket, frames: &[InFrame]) -> bool {
    which == Socket::Backend && frames.len() >= 6 && frames[2].as_ref() == b"REPLY"
}
