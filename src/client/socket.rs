//! Small ZeroMQ helpers shared by the client, admin client and worker: a
//! DEALER that never hangs (LINGER 0 or short, receive deadlines) and typed
//! errors.

use std::time::{Duration, Instant};

use crate::protocol::emqp::Frame;

/// Errors of the client library. Each names the address or msgid involved.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// A ZeroMQ call failed (socket creation, bad endpoint, …).
    #[error("zmq {what} failed for {addr}: {source}")]
    Zmq {
        /// The operation, e.g. `connect`.
        what: &'static str,
        /// The endpoint.
        addr: String,
        /// The zmq error.
        source: zmq::Error,
    },
    /// No peer accepted the connection within the timeout (ZeroMQ `connect`
    /// never fails by itself; the send waits for a live connection).
    #[error("{addr} is unreachable: no connection within {timeout:?}")]
    Unreachable {
        /// The endpoint.
        addr: String,
        /// How long we waited.
        timeout: Duration,
    },
    /// Connected, but no answer arrived within the timeout.
    #[error("no answer from {addr} within {timeout:?}")]
    Timeout {
        /// The endpoint.
        addr: String,
        /// How long we waited.
        timeout: Duration,
    },
    /// The answer was not what the command expects (e.g. a REPLY that is not JSON).
    #[error("bad answer from {addr}: {why}")]
    BadAnswer {
        /// The endpoint.
        addr: String,
        /// What was wrong.
        why: String,
    },
    /// The caller's arguments were invalid (e.g. a schedule interval of 0).
    #[error("invalid argument: {0}")]
    Invalid(String),
}

/// A connected DEALER plus the address it talks to.
pub(crate) struct Dealer {
    pub socket: zmq::Socket,
    pub addr: String,
}

impl Dealer {
    /// A DEALER with a fresh uuid4 identity, LINGER `linger_ms`, and
    /// `ZMQ_IMMEDIATE` so a send waits for a real connection.
    pub fn connect(ctx: &zmq::Context, addr: &str, linger_ms: i32) -> Result<Dealer, ClientError> {
        let zerr = |what, source| ClientError::Zmq { what, addr: addr.to_string(), source };
        let socket = ctx.socket(zmq::DEALER).map_err(|e| zerr("socket", e))?;
        socket.set_identity(&crate::protocol::emqp::new_msgid()).map_err(|e| zerr("identity", e))?;
        socket.set_linger(linger_ms).map_err(|e| zerr("linger", e))?;
        socket.set_immediate(true).map_err(|e| zerr("immediate", e))?;
        socket.connect(addr).map_err(|e| zerr("connect", e))?;
        Ok(Dealer { socket, addr: addr.to_string() })
    }

    /// Sends D-frames, waiting up to `timeout` for a connection.
    ///
    /// # Errors
    /// [`ClientError::Unreachable`] when no connection came up in time.
    pub fn send_timeout(&self, frames: &[Frame], timeout: Duration) -> Result<(), ClientError> {
        let zerr = |source| ClientError::Zmq { what: "send", addr: self.addr.clone(), source };
        self.socket.set_sndtimeo(millis(timeout)).map_err(zerr)?;
        match self.socket.send_multipart(frames, 0) {
            Ok(()) => Ok(()),
            Err(zmq::Error::EAGAIN) => Err(ClientError::Unreachable { addr: self.addr.clone(), timeout }),
            Err(e) => Err(zerr(e)),
        }
    }

    /// Receives one message before `deadline`; `Ok(None)` when it passed.
    pub fn recv_deadline(&self, deadline: Instant) -> Result<Option<Vec<Frame>>, ClientError> {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut items = [self.socket.as_poll_item(zmq::POLLIN)];
        let zerr = |what, source| ClientError::Zmq { what, addr: self.addr.clone(), source };
        let n = zmq::poll(&mut items, left.as_millis().min(i64::MAX as u128) as i64).map_err(|e| zerr("poll", e))?;
        if n == 0 {
            return Ok(None);
        }
        self.socket.recv_multipart(0).map(Some).map_err(|e| zerr("recv", e))
    }
}

/// A duration as zmq milliseconds (clamped to `i32::MAX`).
pub(crate) fn millis(d: Duration) -> i32 {
    d.as_millis().min(i32::MAX as u128) as i32
}
