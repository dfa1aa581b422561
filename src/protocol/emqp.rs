//! The eMQP codec: EventMQ 0.3.13 multipart messages as values (docs/emqp.md "Frames", "Messages").
//!
//! Pure code: no sockets, no clocks. A message is a list of frames; each frame
//! is an opaque byte string (never assumed to be UTF-8, identities included).
//! Frames are numbered as docs/emqp.md "Frames" numbers them: the DEALER's
//! view, starting with the empty delimiter. A ROUTER peer strips the
//! identity frame before decoding and prepends it after encoding.
//!
//! * [`decode`] turns frames into a [`Message`], checking the command against
//!   a per-socket whitelist ([`Socket`]) and the frame count the command needs.
//! * [`Message::encode`] turns a [`Message`] back into frames, byte-exact with
//!   what the Python peers send (the byte sequences in docs/emqp.md "Messages").
//!
//! Errors ([`DecodeError`]) name the frame index that was wrong.

use std::fmt;

/// The protocol version frame (frame 1). Receivers never check it (docs/emqp.md "Frames");
/// senders always write it.
pub const VERSION: &[u8] = b"eMQP/1.0";

/// The optional last frame of a job-result REPLY by which an emq worker says
/// the job failed (docs/emqp.md "Job-result REPLY").
pub const FAILED: &[u8] = b"failed";

/// A frame: opaque bytes.
pub type Frame = Vec<u8>;

/// Which socket (and which side of it) a message was read from. Each socket
/// accepts a fixed set of commands (docs/emqp.md "Messages"); everything else is
/// [`DecodeError::NotAllowed`] (fixes EventMQ defect frame 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Socket {
    /// Router frontend (clients, schedulers → router).
    Frontend,
    /// Router backend (workers → router).
    Backend,
    /// Router admin socket (emq-cli → router).
    Admin,
    /// What a worker DEALER receives from the router backend.
    WorkerSide,
    /// What a scheduler DEALER receives from the router frontend.
    SchedulerSide,
    /// What a client DEALER receives from the router frontend (acceptance
    /// REPLY, ERROR) or admin socket (admin REPLY, ACK).
    ClientSide,
    /// The pub/sub device's incoming ROUTER (docs/emqp.md "PUBLISH").
    PubIn,
}

impl Socket {
    /// A short lower-case name, used in logs and STATUS counters.
    pub fn name(self) -> &'static str {
        match self {
            Socket::Frontend => "frontend",
            Socket::Backend => "backend",
            Socket::Admin => "admin",
            Socket::WorkerSide => "worker",
            Socket::SchedulerSide => "scheduler",
            Socket::ClientSide => "client",
            Socket::PubIn => "pubsub",
        }
    }

    fn allows(self, cmd: &[u8]) -> bool {
        let allowed: &[&[u8]] = match self {
            Socket::Frontend => {
                &[b"INFORM", b"REQUEST", b"SCHEDULE", b"UNSCHEDULE", b"HEARTBEAT", b"KBYE", b"ERROR", b"REPLY"]
            }
            Socket::Backend => &[b"INFORM", b"READY", b"UNREADY", b"REPLY", b"HEARTBEAT", b"KBYE"],
            Socket::Admin => return AdminWord::from_word(cmd).is_some() || cmd == b"DISCONNECT" || cmd == b"HELLO",
            Socket::WorkerSide => &[b"ACK", b"REQUEST", b"HEARTBEAT", b"KBYE", b"DISCONNECT", b"ERROR"],
            Socket::SchedulerSide => {
                &[b"ACK", b"SCHEDULE", b"UNSCHEDULE", b"DROP", b"HEARTBEAT", b"KBYE", b"DISCONNECT", b"REPLY", b"ERROR"]
            }
            Socket::ClientSide => &[b"REPLY", b"ACK", b"ERROR", b"HEARTBEAT", b"KBYE"],
            Socket::PubIn => &[b"PUBLISH"],
        };
        allowed.contains(&cmd)
    }
}

/// The peer type named in INFORM's frame 5 (docs/emqp.md "INFORM").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerType {
    /// `worker`: a jobmanager; ACKed on the backend.
    Worker,
    /// `scheduler`: ACKed on the frontend.
    Scheduler,
}

/// Declares the admin commands once ([`AdminWord`]): each line gives the
/// variant, the word on the wire, the most argument frames it reads (after
/// the msgid; more are ignored), how its arguments read, the `emq-cli`
/// command that sends it and what it answers. Decoding, encoding, the
/// admin socket's allowed words, `emq-cli admin --help` and the table in
/// docs/emqp.md "Admin" (checked by a test) all come from it.
macro_rules! admin_words {
    ($( $(#[doc = $doc:literal])+ $variant:ident = $word:literal, $max:literal, $args:literal, $cli:literal, $what:literal; )*) => {
        /// An admin command (docs/emqp.md "Admin"): EventMQ's queries and
        /// emq's extensions.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum AdminWord {
            $( $(#[doc = $doc])+ $variant, )*
        }

        impl AdminWord {
            /// Every admin command, in the table's order.
            pub const ALL: &'static [AdminWord] = &[$( AdminWord::$variant, )*];

            /// The command word on the wire.
            pub fn word(self) -> &'static str {
                match self { $( AdminWord::$variant => $word, )* }
            }

            /// The most argument frames (after the msgid) the command reads.
            pub fn max_args(self) -> usize {
                match self { $( AdminWord::$variant => $max, )* }
            }

            /// How its argument frames read (`""`: none).
            pub fn args(self) -> &'static str {
                match self { $( AdminWord::$variant => $args, )* }
            }

            /// The `emq-cli` command that sends it.
            pub fn cli(self) -> &'static str {
                match self { $( AdminWord::$variant => $cli, )* }
            }

            /// What it answers.
            pub fn what(self) -> &'static str {
                match self { $( AdminWord::$variant => $what, )* }
            }

            /// The command `word` names.
            pub fn from_word(word: &[u8]) -> Option<AdminWord> {
                AdminWord::ALL.iter().copied().find(|w| w.word().as_bytes() == word)
            }
        }
    };
}

admin_words! {
    /// `STATUS` (EventMQ).
    Status = "STATUS", 0, "", "emq-cli status",
        "per-queue figures and the router's (`emq` object) as JSON";
    /// `ROUTER_SHOW_WORKERS` (EventMQ).
    ShowWorkers = "ROUTER_SHOW_WORKERS", 0, "", "emq-cli workers",
        "`connected_workers` and `connected_queues` as JSON";
    /// `ROUTER_SHOW_SCHEDULERS` (EventMQ).
    ShowSchedulers = "ROUTER_SHOW_SCHEDULERS", 0, "", "emq-cli schedulers",
        "`connected_schedulers` as JSON";
    /// `LATENCY` (emq extension): per-queue latency percentiles.
    Latency = "LATENCY", 0, "", "emq-cli latency",
        "per-queue latency percentiles as JSON";
    /// `DEAD_LIST` (emq extension).
    DeadList = "DEAD_LIST", 1, "[queue]", "emq-cli dead list",
        "`{\"jobs\": [job…], \"total\": n}`, the oldest 1,000 burials first";
    /// `DEAD_SHOW` (emq extension).
    DeadShow = "DEAD_SHOW", 1, "id", "emq-cli dead show",
        "`{\"job\": job with \"body\" and \"body_utf8\"}`, or `{\"job\": null}`";
    /// `DEAD_RETRY` (emq extension).
    DeadRetry = "DEAD_RETRY", 2, "id, or `*` [queue]", "emq-cli dead retry",
        "`{\"retried\": n}`";
    /// `DEAD_DELETE` (emq extension).
    DeadDelete = "DEAD_DELETE", 2, "id, or `*` [queue]", "emq-cli dead delete",
        "`{\"deleted\": n}`";
    /// `RELOAD_KEYS` (emq extension): rescans the CURVE allow-lists; with
    /// `DISCONNECT`, rebinds the CURVE endpoints (docs/security.md "CURVE").
    ReloadKeys = "RELOAD_KEYS", 1, "[`DISCONNECT`]", "emq-cli reload-keys",
        "`{\"reloaded\": true, \"keys\": {domain: n}, \"disconnected\": bool, \"endpoints_rebound\": n}`";
}

/// The body of a SCHEDULE or UNSCHEDULE (docs/emqp.md "SCHEDULE and UNSCHEDULE"): frames 4..8. `B` is how a
/// frame is held: owned [`Frame`]s by default, `&[u8]` borrowed from the
/// received frames by [`decode_ref`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleBody<B = Frame> {
    /// frame 4: queue name the job runs on.
    pub queue: B,
    /// frame 5: headers CSV (`guarantee`, `nohaste`, `run_count:N`).
    pub headers: B,
    /// frame 6: interval in seconds as decimal text; `-1` for cron jobs.
    pub interval: B,
    /// frame 7: job body JSON.
    pub body: B,
    /// frame 8: cron expression, empty for interval jobs. `None` when the
    /// frame is empty or missing (missing is tolerated for UNSCHEDULE and
    /// DROP, which need only frames 4..7); encoded as an empty frame.
    pub cron: Option<B>,
}

/// One eMQP command with its body frames (docs/emqp.md "Messages"). Field names follow the
/// frame tables of docs/emqp.md "Messages"; each field says which frame it is. `B` is how
/// a frame is held: owned [`Frame`]s by default, `&[u8]` borrowed from the
/// received frames by [`decode_ref`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command<B = Frame> {
    /// INFORM: a worker or scheduler registers (docs/emqp.md "INFORM").
    Inform {
        /// frame 4: the queue list as JSON, `[[weight, "name"], ...]`
        /// ([`crate::protocol::queues`]); empty means the router's defaults.
        queues: B,
        /// frame 5: who is registering.
        peer: PeerType,
        /// frame 6 (emq extension, optional): a scheduler's stable name, which
        /// the router routes SCHEDULEs by (rendezvous hashing) so that a
        /// restarted scheduler, connecting under a fresh identity, owns the
        /// same schedules. EventMQ's router ignores extra INFORM frames.
        /// `None` when empty or missing.
        name: Option<B>,
    },
    /// ACK: the router accepted an INFORM (or an admin DISCONNECT).
    Ack {
        /// frame 4: the msgid (frame 3) of the message being acknowledged.
        acked: B,
    },
    /// READY: no body; one more free slot.
    Ready,
    /// UNREADY (emq extension, worker → router backend): no body; take
    /// back one free slot the worker announced with READY. The router
    /// answers `ACK` (frame 4: this msgid) when it took one, or `ERROR
    /// NO_FREE_SLOT` when every announced slot is already used by a job
    /// (that job reaches the worker before the answer). A worker serving
    /// several routers moves its slots with it (docs/scaleout.md "Slots").
    /// EventMQ's router does not know it and never answers.
    Unready,
    /// REQUEST: a job, from a client to the router and from the router to
    /// a worker (docs/emqp.md "REQUEST").
    Request {
        /// frame 4: the queue name.
        queue: B,
        /// frame 5: headers CSV (`reply-requested`, `guarantee`, `timeout:N`, ...;
        /// see [`crate::protocol::headers`]).
        headers: B,
        /// frame 6: the job body (a Python body `["run", {...}]` or any bytes).
        body: B,
        /// frame 7 and later: any extra frames, kept and forwarded unchanged.
        extra: Vec<B>,
    },
    /// REPLY with one body frame: the acceptance REPLY or the admin REPLY.
    Reply {
        /// frame 4: the accepted message's msgid (acceptance REPLY) or the
        /// answer's JSON (admin REPLY).
        body: B,
    },
    /// Job-result REPLY from a worker (docs/emqp.md "Job results").
    JobReply {
        /// Frame 6 (emq extension, optional): [`FAILED`] when the worker
        /// reports the job failed. EventMQ's router reads only frame 5, so
        /// old routers ignore it; Python jobmanagers never send it.
        failed: bool,
        /// frame 4: the result JSON, `{"value": ...}`.
        result: B,
        /// frame 5: the msgid (frame 3) of the REQUEST this answers.
        request_msgid: B,
    },
    /// HEARTBEAT (docs/emqp.md "HEARTBEAT").
    Heartbeat {
        /// frame 4: the sender's wall clock in seconds as decimal text (never read).
        timestamp: B,
    },
    /// KBYE: no body.
    Kbye,
    /// DISCONNECT: no body (extra frames ignored).
    Disconnect,
    /// SCHEDULE: 9 frames.
    Schedule(ScheduleBody<B>),
    /// UNSCHEDULE: at least 8 frames.
    Unschedule(ScheduleBody<B>),
    /// DROP (emq extension, router → emq-scheduler): the frames of a
    /// SCHEDULE whose key another scheduler owns now; the receiver forgets
    /// its copy of the schedule (a shared store keeps the record). Sent
    /// only to schedulers that named themselves in their INFORM.
    Drop(ScheduleBody<B>),
    /// PUBLISH to the pub/sub device (docs/emqp.md "PUBLISH").
    Publish {
        /// frame 4: the topic, sent as the first frame of the PUB message.
        topic: B,
        /// frame 5: the message, sent as the second frame.
        message: B,
    },
    /// An admin command ([`AdminWord`], admin socket).
    Admin {
        /// Which.
        word: AdminWord,
        /// frames 4…: its arguments, at most [`AdminWord::max_args`], the
        /// empty ones at the end left out (an empty optional frame is an
        /// absent one, docs/emqp.md "Frames").
        args: Vec<B>,
    },
    /// `HELLO`, which the Python emq-cli sends on connect; never answered.
    Hello,
    /// ERROR (emq extension): a message was rejected. Old Python clients
    /// never read it; old schedulers log it as unhandled.
    Error {
        /// frame 4: the msgid (frame 3) of the rejected message.
        refers_to: B,
        /// frame 5: an error code token, e.g. `QUEUE_FULL`.
        code: B,
        /// frame 6: human-readable text.
        text: B,
    },
}

impl<B> Command<B> {
    /// The command word on the wire (frame 2).
    pub fn word(&self) -> &'static [u8] {
        match self {
            Command::Inform { .. } => b"INFORM",
            Command::Ack { .. } => b"ACK",
            Command::Ready => b"READY",
            Command::Unready => b"UNREADY",
            Command::Request { .. } => b"REQUEST",
            Command::Reply { .. } | Command::JobReply { .. } => b"REPLY",
            Command::Heartbeat { .. } => b"HEARTBEAT",
            Command::Kbye => b"KBYE",
            Command::Disconnect => b"DISCONNECT",
            Command::Schedule(_) => b"SCHEDULE",
            Command::Unschedule(_) => b"UNSCHEDULE",
            Command::Drop(_) => b"DROP",
            Command::Publish { .. } => b"PUBLISH",
            Command::Admin { word, .. } => word.word().as_bytes(),
            Command::Hello => b"HELLO",
            Command::Error { .. } => b"ERROR",
        }
    }
}

/// A decoded message: the msgid (frame 3) and the command, with frames held as
/// `B` (see [`Command`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message<B = Frame> {
    /// frame 3: this message's id (a uuid4 text for Python peers; opaque here).
    pub msgid: B,
    /// frame 2 and the body frames.
    pub command: Command<B>,
}

/// Why a message could not be decoded. Every variant names the frame (D-index)
/// that was wrong, so logs point at the byte that broke it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Fewer than 4 frames: no command or msgid.
    #[error("message has {frames} frame(s); eMQP needs at least 4 (empty, version, command, msgid)")]
    TooShort {
        /// Number of frames received.
        frames: usize,
    },
    /// The command word (frame 2) is not an eMQP command at all.
    #[error("frame 2: unknown command {word:?}")]
    UnknownCommand {
        /// The command frame, lossily shown as text.
        word: String,
    },
    /// A known command that this socket does not accept.
    #[error("frame 2: command {word} is not accepted on the {socket} socket")]
    NotAllowed {
        /// The command word.
        word: String,
        /// The socket name.
        socket: &'static str,
    },
    /// The command needs a body frame that is missing.
    #[error("frame {index}: {command} needs {what} (message has {frames} frames)")]
    MissingFrame {
        /// The command word.
        command: &'static str,
        /// The missing D-index.
        index: usize,
        /// What that frame should hold.
        what: &'static str,
        /// Number of frames received.
        frames: usize,
    },
    /// INFORM's peer type (frame 5) is neither `worker` nor `scheduler`.
    #[error("frame 5: INFORM peer type {0:?} is neither \"worker\" nor \"scheduler\"")]
    BadPeerType(String),
}

/// A peer's frame as text for an error: lossy UTF-8, cut at
/// [`limits::LOG_FRAME_BYTES`](crate::limits::LOG_FRAME_BYTES) with the
/// bytes left out counted, so an error's text (logged, sometimes sent back)
/// stays short whatever the peer sent.
fn lossy(b: &[u8]) -> String {
    let max = crate::limits::LOG_FRAME_BYTES;
    let mut text = String::from_utf8_lossy(&b[..b.len().min(max)]).into_owned();
    if b.len() > max {
        text.push_str(&format!("…(+{})", b.len() - max));
    }
    text
}

/// Decodes frames read from `socket`.
///
/// Positional, like EventMQ (docs/emqp.md "Frames"): frame 0 and frame 1 are not checked. The
/// command word is matched exactly (upper case), then checked against the
/// socket's whitelist, then its body frames are counted.
///
/// # Errors
/// [`DecodeError`] naming the offending frame; the input is left untouched so
/// the caller can log it.
///
/// # Example
/// ```
/// use emq::protocol::emqp::{decode, Command, Socket};
/// let frames: Vec<Vec<u8>> = vec![b"".to_vec(), b"eMQP/1.0".to_vec(), b"READY".to_vec(), b"id-1".to_vec()];
/// let msg = decode(&frames, Socket::Backend).unwrap();
/// assert_eq!(msg.command, Command::Ready);
/// assert!(decode(&frames, Socket::Frontend).is_err()); // READY is a backend command
/// ```
pub fn decode<F: AsRef<[u8]>>(frames: &[F], socket: Socket) -> Result<Message, DecodeError> {
    decode_ref(frames, socket).map(|m| m.to_owned_frames())
}

/// [`decode`] without copying: the message's frames borrow from `frames`.
/// The router's I/O thread decodes every inbound message this way and
/// copies only what it hands on.
///
/// # Errors
/// As [`decode`].
pub fn decode_ref<F: AsRef<[u8]>>(frames: &[F], socket: Socket) -> Result<Message<&[u8]>, DecodeError> {
    if frames.len() < 4 {
        return Err(DecodeError::TooShort { frames: frames.len() });
    }
    let word = frames[2].as_ref();
    let name = command_name(word).ok_or_else(|| DecodeError::UnknownCommand { word: lossy(word) })?;
    if !socket.allows(word) {
        return Err(DecodeError::NotAllowed { word: name.to_string(), socket: socket.name() });
    }
    let body = Body { frames, command: name };
    let command = match name {
        "INFORM" => Command::Inform {
            queues: body.get(4, "the queue list")?,
            peer: peer_type(body.get(5, "the peer type")?)?,
            name: body.present(6),
        },
        "ACK" => Command::Ack { acked: body.get(4, "the acknowledged msgid")? },
        "READY" => Command::Ready,
        "UNREADY" => Command::Unready,
        "REQUEST" => Command::Request {
            queue: body.get(4, "the queue name")?,
            headers: body.get(5, "the headers")?,
            body: body.get(6, "the job body")?,
            extra: body.rest(7),
        },
        "REPLY" if socket == Socket::Backend => Command::JobReply {
            result: body.get(4, "the result")?,
            request_msgid: body.get(5, "the REQUEST msgid")?,
            failed: body.opt(6).is_some_and(|f| f == FAILED),
        },
        "REPLY" => Command::Reply { body: body.get(4, "the reply body")? },
        "HEARTBEAT" => Command::Heartbeat { timestamp: body.opt(4).unwrap_or_default() },
        "KBYE" => Command::Kbye,
        "DISCONNECT" => Command::Disconnect,
        "SCHEDULE" => Command::Schedule(schedule_body(&body, true)?),
        "UNSCHEDULE" => Command::Unschedule(schedule_body(&body, false)?),
        "DROP" => Command::Drop(schedule_body(&body, false)?),
        "PUBLISH" => Command::Publish { topic: body.get(4, "the topic")?, message: body.get(5, "the message")? },
        "HELLO" => Command::Hello,
        "ERROR" => Command::Error {
            refers_to: body.get(4, "the rejected msgid")?,
            code: body.opt(5).unwrap_or_default(),
            text: body.opt(6).unwrap_or_default(),
        },
        _ => match AdminWord::from_word(word) {
            Some(admin) => {
                let mut args = body.rest(4);
                args.truncate(admin.max_args());
                while args.last().is_some_and(|a| a.is_empty()) {
                    args.pop();
                }
                Command::Admin { word: admin, args }
            }
            None => return Err(DecodeError::UnknownCommand { word: lossy(word) }),
        },
    };
    Ok(Message { msgid: frames[3].as_ref(), command })
}

const COMMANDS: &[&str] = &[
    "INFORM",
    "ACK",
    "READY",
    "UNREADY",
    "REQUEST",
    "REPLY",
    "HEARTBEAT",
    "KBYE",
    "DISCONNECT",
    "SCHEDULE",
    "UNSCHEDULE",
    "DROP",
    "PUBLISH",
    "HELLO",
    "ERROR",
];

/// The name of command `word`: one of [`COMMANDS`] or an admin word.
fn command_name(word: &[u8]) -> Option<&'static str> {
    COMMANDS.iter().copied().find(|c| c.as_bytes() == word).or_else(|| AdminWord::from_word(word).map(AdminWord::word))
}

fn peer_type(frame: &[u8]) -> Result<PeerType, DecodeError> {
    match frame {
        b"worker" => Ok(PeerType::Worker),
        b"scheduler" => Ok(PeerType::Scheduler),
        other => Err(DecodeError::BadPeerType(lossy(other))),
    }
}

fn schedule_body<'a, F: AsRef<[u8]>>(
    body: &Body<'a, F>,
    need_cron: bool,
) -> Result<ScheduleBody<&'a [u8]>, DecodeError> {
    Ok(ScheduleBody {
        queue: body.get(4, "the queue name")?,
        headers: body.get(5, "the headers")?,
        interval: body.get(6, "the interval")?,
        body: body.get(7, "the job body")?,
        // SCHEDULE needs the frame (EventMQ always sends five body frames);
        // an empty one, like a missing one elsewhere, is no cron expression.
        cron: match need_cron {
            true => Some(body.get(8, "the cron expression")?).filter(|c| !c.is_empty()),
            false => body.present(8),
        },
    })
}

struct Body<'a, F> {
    frames: &'a [F],
    command: &'static str,
}

impl<'a, F: AsRef<[u8]>> Body<'a, F> {
    fn get(&self, index: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        self.opt(index).ok_or(DecodeError::MissingFrame {
            command: self.command,
            index,
            what,
            frames: self.frames.len(),
        })
    }

    fn opt(&self, index: usize) -> Option<&'a [u8]> {
        self.frames.get(index).map(|f| f.as_ref())
    }

    /// An optional frame whose absence and emptiness mean the same: `None`
    /// for both (docs/emqp.md "Frames"), so that what [`Message::encode`]
    /// writes for `None` (an empty frame where later frames need the
    /// position, nothing at the end) decodes to `None` again.
    fn present(&self, index: usize) -> Option<&'a [u8]> {
        self.opt(index).filter(|f| !f.is_empty())
    }

    fn rest(&self, from: usize) -> Vec<&'a [u8]> {
        self.frames.iter().skip(from).map(|f| f.as_ref()).collect()
    }
}

impl Message {
    /// Builds a message with a fresh uuid4 msgid (docs/emqp.md "Frames").
    pub fn new(command: Command) -> Message {
        Message { msgid: new_msgid(), command }
    }
}

impl<B: AsRef<[u8]>> Message<B> {
    /// The same message with every frame copied into an owned [`Frame`].
    pub fn to_owned_frames(&self) -> Message {
        let f = |b: &B| b.as_ref().to_vec();
        let command = match &self.command {
            Command::Inform { queues, peer, name } => {
                Command::Inform { queues: f(queues), peer: *peer, name: name.as_ref().map(f) }
            }
            Command::Ack { acked } => Command::Ack { acked: f(acked) },
            Command::Ready => Command::Ready,
            Command::Unready => Command::Unready,
            Command::Request { queue, headers, body, extra } => Command::Request {
                queue: f(queue),
                headers: f(headers),
                body: f(body),
                extra: extra.iter().map(f).collect(),
            },
            Command::Reply { body } => Command::Reply { body: f(body) },
            Command::JobReply { result, request_msgid, failed } => {
                Command::JobReply { result: f(result), request_msgid: f(request_msgid), failed: *failed }
            }
            Command::Heartbeat { timestamp } => Command::Heartbeat { timestamp: f(timestamp) },
            Command::Kbye => Command::Kbye,
            Command::Disconnect => Command::Disconnect,
            Command::Schedule(s) => Command::Schedule(s.to_owned_frames()),
            Command::Unschedule(s) => Command::Unschedule(s.to_owned_frames()),
            Command::Drop(s) => Command::Drop(s.to_owned_frames()),
            Command::Publish { topic, message } => Command::Publish { topic: f(topic), message: f(message) },
            Command::Admin { word, args } => Command::Admin { word: *word, args: args.iter().map(f).collect() },
            Command::Hello => Command::Hello,
            Command::Error { refers_to, code, text } => {
                Command::Error { refers_to: f(refers_to), code: f(code), text: f(text) }
            }
        };
        Message { msgid: f(&self.msgid), command }
    }

    /// Encodes as frames: `["", "eMQP/1.0", WORD, msgid, body…]`.
    pub fn encode(&self) -> Vec<Frame> {
        let c = |b: &B| b.as_ref().to_vec();
        let mut out = vec![Vec::new(), VERSION.to_vec(), self.command.word().to_vec(), c(&self.msgid)];
        match &self.command {
            Command::Inform { queues, peer, name } => {
                out.push(c(queues));
                out.push(match peer {
                    PeerType::Worker => b"worker".to_vec(),
                    PeerType::Scheduler => b"scheduler".to_vec(),
                });
                out.extend(name.iter().map(c));
            }
            Command::Ack { acked } => out.push(c(acked)),
            Command::Ready | Command::Unready | Command::Kbye | Command::Disconnect | Command::Hello => {}
            Command::Admin { args, .. } => out.extend(args.iter().map(c)),
            Command::Request { queue, headers, body, extra } => {
                out.extend([c(queue), c(headers), c(body)]);
                out.extend(extra.iter().map(c));
            }
            Command::Reply { body } => out.push(c(body)),
            Command::JobReply { result, request_msgid, failed } => {
                out.extend([c(result), c(request_msgid)]);
                if *failed {
                    out.push(FAILED.to_vec());
                }
            }
            Command::Heartbeat { timestamp } => out.push(c(timestamp)),
            Command::Schedule(s) | Command::Unschedule(s) | Command::Drop(s) => {
                out.extend([c(&s.queue), c(&s.headers), c(&s.interval), c(&s.body)]);
                out.push(s.cron.as_ref().map(c).unwrap_or_default());
            }
            Command::Publish { topic, message } => out.extend([c(topic), c(message)]),
            Command::Error { refers_to, code, text } => out.extend([c(refers_to), c(code), c(text)]),
        }
        out
    }
}

impl<B: AsRef<[u8]>> ScheduleBody<B> {
    /// The same body with every frame copied into an owned [`Frame`].
    pub fn to_owned_frames(&self) -> ScheduleBody {
        let f = |b: &B| b.as_ref().to_vec();
        ScheduleBody {
            queue: f(&self.queue),
            headers: f(&self.headers),
            interval: f(&self.interval),
            body: f(&self.body),
            cron: self.cron.as_ref().map(f),
        }
    }
}

/// A fresh msgid: a lowercase hyphenated uuid4, 36 bytes (docs/emqp.md "Frames").
pub fn new_msgid() -> Frame {
    uuid::Uuid::new_v4().hyphenated().to_string().into_bytes()
}

/// The HEARTBEAT timestamp frame: the wall clock in seconds as decimal text,
/// like Python's `str(time.time())` (docs/emqp.md "HEARTBEAT"). Receivers never read it.
pub fn heartbeat_timestamp() -> Frame {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    format!("{}.{:06}", now.as_secs(), now.subsec_micros()).into_bytes()
}

/// One frame shown for logs as [`ShowFrames`] shows each: quoted, hex
/// escapes where not printable ASCII, cut at
/// [`limits::LOG_FRAME_BYTES`](crate::limits::LOG_FRAME_BYTES) (the rest
/// counted: `…(+N)`).
pub struct ShowFrame<'a>(pub &'a [u8]);

impl fmt::Display for ShowFrame<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (b, max) = (self.0, crate::limits::LOG_FRAME_BYTES);
        write!(f, "\"{}\"", b[..b.len().min(max)].escape_ascii())?;
        if b.len() > max {
            write!(f, "…(+{})", b.len() - max)?;
        }
        Ok(())
    }
}

/// Frames shown for logs: UTF-8 text where valid, hex escapes elsewhere,
/// at most [`limits::LOG_FRAMES_SHOWN`](crate::limits::LOG_FRAMES_SHOWN)
/// frames (the rest counted: `…(+N frames)`), each cut at
/// [`limits::LOG_FRAME_BYTES`](crate::limits::LOG_FRAME_BYTES) (the rest
/// counted: `…(+N)`). Whatever a peer sends, the text is at most about
/// 4.5 KiB, so every log line using it is bounded.
pub struct ShowFrames<'a, F>(pub &'a [F]);

impl<F: AsRef<[u8]>> fmt::Display for ShowFrames<'_, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let max_frames = crate::limits::LOG_FRAMES_SHOWN;
        f.write_str("[")?;
        for (i, frame) in self.0.iter().take(max_frames).enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{}", ShowFrame(frame.as_ref()))?;
        }
        if self.0.len() > max_frames {
            write!(f, ", …(+{} frames)", self.0.len() - max_frames)?;
        }
        f.write_str("]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(parts: &[&[u8]]) -> Vec<Frame> {
        parts.iter().map(|p| p.to_vec()).collect()
    }

    #[test]
    fn job_reply_may_say_the_job_failed() {
        let base = frames(&[b"", VERSION, b"REPLY", b"m", br#"{"value": "x"}"#, b"job-1"]);
        let failed_of = |last: Option<&[u8]>| {
            let mut f = base.clone();
            f.extend(last.map(<[u8]>::to_vec));
            match decode(&f, Socket::Backend).unwrap().command {
                Command::JobReply { failed, .. } => failed,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!([failed_of(None), failed_of(Some(FAILED)), failed_of(Some(b"other"))], [false, true, false]);
        let mut f = base.clone();
        f.push(FAILED.to_vec());
        assert_eq!(decode(&f, Socket::Backend).unwrap().encode(), f);
    }

    #[test]
    fn request_keeps_extra_frames() {
        let f = frames(&[b"", VERSION, b"REQUEST", b"m", b"q", b"h", b"b", b"x1", b"x2"]);
        let m = decode(&f, Socket::Frontend).unwrap();
        assert_eq!(m.encode(), f);
    }

    #[test]
    fn short_messages_name_the_frame() {
        let f = frames(&[b"", VERSION, b"INFORM", b"m", b"[]"]);
        let e = decode(&f, Socket::Backend).unwrap_err();
        assert_eq!(e, DecodeError::MissingFrame { command: "INFORM", index: 5, what: "the peer type", frames: 5 });
        assert!(e.to_string().starts_with("frame 5:"));
        assert_eq!(decode(&frames(&[b"", VERSION]), Socket::Backend), Err(DecodeError::TooShort { frames: 2 }));
    }

    #[test]
    fn shown_frames_are_cut_in_number_and_in_bytes() {
        let mut many: Vec<Frame> = (0..100_000).map(|i| vec![b'a' + (i % 26) as u8]).collect();
        let shown = ShowFrames(&many).to_string();
        assert_eq!(
            shown,
            r#"["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p", …(+99984 frames)]"#
        );
        many.truncate(16);
        assert!(!ShowFrames(&many).to_string().contains("…"), "16 frames show whole");
        // The worst case: every byte escaped, every frame cut.
        let wide = vec![vec![0xffu8; 100_000]; 20];
        let shown = ShowFrames(&wide).to_string();
        let frame = format!("\"{}\"…(+99936)", "\\xff".repeat(64));
        assert_eq!(shown, format!("[{}, …(+4 frames)]", vec![frame; 16].join(", ")));
        assert!(shown.len() < 4_700, "{} bytes", shown.len());
    }

    #[test]
    fn decoding_errors_quote_at_most_64_bytes_of_a_frame() {
        let word = vec![b'X'; 10_000];
        let e = decode(&[&b""[..], VERSION, &word, b"m"], Socket::Frontend).unwrap_err();
        assert_eq!(e.to_string(), format!("frame 2: unknown command \"{}…(+9936)\"", "X".repeat(64)));
        let e = decode(&[&b""[..], VERSION, b"INFORM", b"m", b"[]", &word], Socket::Backend).unwrap_err();
        assert_eq!(e, DecodeError::BadPeerType(format!("{}…(+9936)", "X".repeat(64))));
    }

    /// Every optional frame: absent and empty decode alike, and every
    /// decoded message encodes to frames that decode to it again (the
    /// emqp_decode fuzz target's round trip; its failing input of issue 25,
    /// a DROP without a cron frame, is `drop_without_cron` in its corpus).
    #[test]
    fn an_absent_and_an_empty_optional_frame_mean_the_same() {
        let cases: [(&[u8], usize, Socket); 6] = [
            (b"INFORM", 6, Socket::Frontend),
            (b"DEAD_LIST", 5, Socket::Admin),
            (b"DEAD_DELETE", 5, Socket::Admin),
            (b"UNSCHEDULE", 8, Socket::Frontend),
            (b"DROP", 8, Socket::SchedulerSide),
            (b"UNSCHEDULE", 8, Socket::SchedulerSide),
        ];
        let body = |word: &[u8]| -> Vec<Frame> {
            match word {
                b"INFORM" => frames(&[b"[]", b"scheduler"]),
                b"DEAD_LIST" | b"DEAD_DELETE" => frames(&[b"*"]),
                _ => frames(&[b"q", b"h", b"60", b"[]"]),
            }
        };
        for (word, index, socket) in cases {
            let mut absent = frames(&[b"", VERSION, word, b"m"]);
            absent.extend(body(word));
            assert_eq!(absent.len(), index, "{}", ShowFrames(&absent));
            let mut empty = absent.clone();
            empty.push(Vec::new());
            let (a, e) = (decode(&absent, socket).unwrap(), decode(&empty, socket).unwrap());
            assert_eq!(a, e, "{} on {socket:?}", ShowFrames(&empty));
            for m in [a, e] {
                assert_eq!(decode(&m.encode(), socket).as_ref(), Ok(&m), "{} on {socket:?}", ShowFrames(&m.encode()));
            }
        }
        // SCHEDULE needs its cron frame; empty is an interval job's.
        let f = frames(&[b"", VERSION, b"SCHEDULE", b"m", b"q", b"h", b"60", b"[]", b""]);
        let m = decode(&f, Socket::Frontend).unwrap();
        assert!(matches!(&m.command, Command::Schedule(s) if s.cron.is_none()));
        assert_eq!(m.encode(), f);
        assert!(decode(&f[..8], Socket::Frontend).is_err(), "SCHEDULE without its cron frame");
        // The fuzz input itself (the target decodes the frames after the
        // first byte, split at LF, on every socket; DROP is the scheduler
        // side's).
        let input = [
            &b"\xff\xfe\xfe\x83\xe8\xb9\xb0\xaf\x01\x9aeee\n0\xfb\xb6NFOM\nDROP\n-,1\nRM\nDM\nmNFOerSCHE\x01\x01RO|P\n-"[..],
        ]
        .concat();
        let frames: Vec<&[u8]> = input[1..].split(|b| *b == b'\n').collect();
        let m = decode(&frames, Socket::SchedulerSide).unwrap();
        assert_eq!(decode(&m.encode(), Socket::SchedulerSide), Ok(m));
    }

    #[test]
    fn whitelist_per_socket() {
        let f = frames(&[b"", VERSION, b"DISCONNECT", b"m"]);
        assert!(decode(&f, Socket::Admin).is_ok());
        let f = frames(&[b"", VERSION, b"on_request", b"m"]);
        assert!(matches!(decode(&f, Socket::Backend), Err(DecodeError::UnknownCommand { .. })));
        let f = frames(&[b"", VERSION, b"READY", b"m"]);
        assert!(matches!(decode(&f, Socket::Frontend), Err(DecodeError::NotAllowed { .. })));
    }

    /// docs/emqp.md "Admin" lists every admin command as the table says.
    #[test]
    fn the_admin_page_lists_every_admin_command() {
        let page = include_str!("../../docs/emqp.md");
        let mut table = String::from("| Command | argument frames | sent by | answer |\n|---|---|---|---|\n");
        for w in AdminWord::ALL {
            table.push_str(&format!("| `{}` | {} | `{}` | {} |\n", w.word(), w.args(), w.cli(), w.what()));
        }
        assert!(page.contains(&table), "docs/emqp.md \"Admin\" should hold:\n{table}");
    }

    #[test]
    fn an_admin_command_keeps_its_arguments_and_drops_the_rest() {
        let decode_admin = |frames: &[&[u8]]| {
            let mut all: Vec<&[u8]> = vec![b"", VERSION];
            all.extend_from_slice(frames);
            decode(&all, Socket::Admin).map(|m| m.command)
        };
        let admin = |word, args: &[&[u8]]| Command::Admin { word, args: args.iter().map(|a| a.to_vec()).collect() };
        assert_eq!(decode_admin(&[b"STATUS", b"m", b"x"]), Ok(admin(AdminWord::Status, &[])), "extra frames ignored");
        assert_eq!(decode_admin(&[b"DEAD_LIST", b"m", b""]), Ok(admin(AdminWord::DeadList, &[])));
        assert_eq!(
            decode_admin(&[b"DEAD_RETRY", b"m", b"*", b"q", b"z"]),
            Ok(admin(AdminWord::DeadRetry, &[b"*", b"q"]))
        );
        assert_eq!(decode_admin(&[b"DEAD_DELETE", b"m", b"", b"q"]), Ok(admin(AdminWord::DeadDelete, &[b"", b"q"])));
        for w in AdminWord::ALL {
            assert_eq!(AdminWord::from_word(w.word().as_bytes()), Some(*w));
            let m = Message { msgid: b"m".to_vec(), command: admin(*w, &[]) };
            assert_eq!(decode(&m.encode(), Socket::Admin), Ok(m.clone()), "{} round trip", w.word());
            assert!(decode(&m.encode(), Socket::Frontend).is_err(), "{} only on the admin socket", w.word());
        }
    }
}
