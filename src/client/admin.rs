//! Admin client: a DEALER to the router's admin socket (EventMQ 0.3.13,
//! docs/emqp.md "Admin") or the scheduler's. Every call waits at most the timeout.
//!
//! ```no_run
//! use emq::client::admin::AdminClient;
//! let mut admin = AdminClient::connect("tcp://127.0.0.1:47293").unwrap();
//! let status = admin.status().unwrap();
//! println!("{}", status["waiting_messages_by_queue"]);
//! ```

use std::time::{Duration, Instant};

use super::socket::{ClientError, Dealer};
use crate::curve::ClientCurve;
use crate::limits;
use crate::protocol::emqp::{decode, AdminWord, Command, Frame, Socket, VERSION};

/// A DEALER connected to an admin socket.
pub struct AdminClient {
    dealer: Dealer,
    timeout: Duration,
    _ctx: zmq::Context,
}

impl AdminClient {
    /// Connects (never blocks) with [`limits::CLIENT_TIMEOUT`].
    ///
    /// # Errors
    /// [`ClientError::Address`] for a malformed address.
    pub fn connect(addr: &str) -> Result<AdminClient, ClientError> {
        AdminClient::connect_with(addr, None)
    }

    /// [`AdminClient::connect`], as a CURVE client of a CURVE admin
    /// endpoint (emq-router's `admin_curve`, emq-scheduler's
    /// `scheduler_admin_curve`) when `curve` is set. A key the server does
    /// not allow shows up as [`ClientError::Unreachable`] (the handshake is
    /// refused, so no connection ever comes up).
    ///
    /// # Errors
    /// [`ClientError::Address`] for a malformed address.
    pub fn connect_with(addr: &str, curve: Option<&ClientCurve>) -> Result<AdminClient, ClientError> {
        let ctx = zmq::Context::new();
        let dealer = Dealer::connect_with(&ctx, addr, limits::ADMIN_LINGER_MS, limits::ADMIN_MAX_ANSWER_BYTES, curve)?;
        Ok(AdminClient { dealer, timeout: limits::CLIENT_TIMEOUT, _ctx: ctx })
    }

    /// Sets the per-call timeout (connection plus answer).
    pub fn with_timeout(mut self, timeout: Duration) -> AdminClient {
        self.timeout = timeout;
        self
    }

    /// `STATUS`: the JSON of docs/emqp.md "Admin" (plus emq's extra keys).
    ///
    /// # Errors
    /// [`ClientError::Unreachable`], [`ClientError::Timeout`], [`ClientError::BadAnswer`].
    pub fn status(&mut self) -> Result<serde_json::Value, ClientError> {
        self.call(AdminWord::Status, &[])
    }

    /// `ROUTER_SHOW_WORKERS`. Errors as [`AdminClient::status`].
    pub fn workers(&mut self) -> Result<serde_json::Value, ClientError> {
        self.call(AdminWord::ShowWorkers, &[])
    }

    /// `ROUTER_SHOW_SCHEDULERS`. Errors as [`AdminClient::status`].
    pub fn schedulers(&mut self) -> Result<serde_json::Value, ClientError> {
        self.call(AdminWord::ShowSchedulers, &[])
    }

    /// `LATENCY` (emq extension): per-queue latency percentiles.
    /// Errors as [`AdminClient::status`]; an EventMQ router never answers it.
    pub fn latency(&mut self) -> Result<serde_json::Value, ClientError> {
        self.call(AdminWord::Latency, &[])
    }

    /// Admin command `word` with its argument frames `args` (docs/emqp.md
    /// "Admin": e.g. `DEAD_RETRY` with `["*", "email"]`); its answer's JSON.
    ///
    /// # Errors
    /// As [`AdminClient::status`]; a refusal (`ERROR BAD_REQUEST`, e.g. a
    /// malformed job id) comes back as [`ClientError::BadAnswer`] naming it.
    pub fn call(&mut self, word: AdminWord, args: &[&[u8]]) -> Result<serde_json::Value, ClientError> {
        self.query_with(word.word().as_bytes(), args.iter().map(|a| a.to_vec()).collect())
    }

    /// Any query `word` answered by a REPLY whose frame 4 is JSON, e.g. the
    /// scheduler's `SCHEDULES`. Sends `["", "eMQP/1.0", word, "admin:<uuid4>"]`.
    ///
    /// # Errors
    /// As [`AdminClient::status`].
    pub fn query(&mut self, word: &[u8]) -> Result<serde_json::Value, ClientError> {
        self.query_with(word, Vec::new())
    }

    /// [`AdminClient::query`] with frames `args` after the msgid.
    fn query_with(&mut self, word: &[u8], args: Vec<Frame>) -> Result<serde_json::Value, ClientError> {
        let frames = self.exchange(word, args)?;
        match decode(&frames, Socket::ClientSide).map(|m| m.command) {
            Ok(Command::Reply { body }) => {
                serde_json::from_slice(&body).map_err(|e| self.bad(format!("not JSON: {e}")))
            }
            Ok(Command::Error { code, text, .. }) => {
                Err(self.bad(format!("ERROR {} {}", String::from_utf8_lossy(&code), String::from_utf8_lossy(&text))))
            }
            Ok(other) => Err(self.bad(format!("unexpected {}", String::from_utf8_lossy(other.word())))),
            Err(e) => Err(self.bad(e.to_string())),
        }
    }

    /// `DISCONNECT`: asks the router to shut down and waits for its ACK
    /// (docs/emqp.md "DISCONNECT").
    ///
    /// # Errors
    /// As [`AdminClient::status`].
    pub fn disconnect(&mut self) -> Result<(), ClientError> {
        let frames = self.exchange(b"DISCONNECT", Vec::new())?;
        match decode(&frames, Socket::ClientSide).map(|m| m.command) {
            Ok(Command::Ack { .. }) => Ok(()),
            Ok(other) => Err(self.bad(format!("expected ACK, got {}", String::from_utf8_lossy(other.word())))),
            Err(e) => Err(self.bad(e.to_string())),
        }
    }

    /// Sends `word` (and `args` after the msgid) and returns the first
    /// answer whose frame 4 names our msgid (ACK, ERROR) or any REPLY
    /// (admin REPLYs carry no msgid).
    fn exchange(&mut self, word: &[u8], args: Vec<Frame>) -> Result<Vec<Frame>, ClientError> {
        let msgid = [b"admin:".as_slice(), &crate::protocol::emqp::new_msgid()].concat();
        let mut frames = vec![Vec::new(), VERSION.to_vec(), word.to_vec(), msgid.clone()];
        frames.extend(args);
        let deadline = Instant::now() + self.timeout;
        self.dealer.send_timeout(&frames, self.timeout)?;
        loop {
            let Some(answer) = self.dealer.recv_deadline(deadline)? else {
                return Err(ClientError::Timeout { addr: self.dealer.addr.clone(), timeout: self.timeout });
            };
            let ours = match answer.get(2).map(Vec::as_slice) {
                Some(b"REPLY") => true,
                Some(b"ACK") => answer.get(4) == Some(&msgid),
                Some(b"ERROR") => answer.get(4) == Some(&msgid),
                _ => false,
            };
            if ours {
                return Ok(answer);
            }
        }
    }

    fn bad(&self, why: String) -> ClientError {
        ClientError::BadAnswer { addr: self.dealer.addr.clone(), why }
    }
}
