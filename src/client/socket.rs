//! Small ZeroMQ helpers shared by the client, admin client and worker: a
//! DEALER that never hangs (LINGER 0 or short, receive deadlines) and typed
//! errors.

use std::time::{Duration, Instant};

use crate::protocol::emqp::Frame;
use crate::zmq_error::ZmqError;

/// Errors of the client library. Each names the address or msgid involved.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// A ZeroMQ call failed (socket creation, bad endpoint, …); names the
    /// operation and the endpoint.
    #[error(transparent)]
    Zmq(#[from] ZmqError),
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
    /// The address is not an eMQP address (`tcp://host:port`).
    #[error(transparent)]
    Address(#[from] crate::config::addr::AddrError),
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
    /// A DEALER with a fresh uuid4 identity, LINGER `linger_ms`,
    /// `ZMQ_IMMEDIATE` so a send waits for a real connection, and
    /// `ZMQ_MAXMSGSIZE` `max_answer_bytes`: ZeroMQ drops a larger message
    /// from the peer (with the connection) instead of holding it, so a
    /// wrong or hostile address cannot make the caller hold any size.
    pub fn connect(
        ctx: &zmq::Context,
        addr: &str,
        linger_ms: i32,
        max_answer_bytes: i64,
    ) -> Result<Dealer, ClientError> {
        crate::config::addr::emqp(addr)?;
        let zerr = |what| ZmqError::at(format!("{what} {addr}"));
        let socket = ctx.socket(zmq::DEALER).map_err(zerr("socket for"))?;
        socket.set_identity(&crate::protocol::emqp::new_msgid()).map_err(zerr("identity for"))?;
        socket.set_linger(linger_ms).map_err(zerr("linger for"))?;
        socket.set_maxmsgsize(max_answer_bytes).map_err(zerr("max message size for"))?;
        socket.set_immediate(true).map_err(zerr("immediate for"))?;
        socket.connect(addr).map_err(zerr("connect"))?;
        Ok(Dealer { socket, addr: addr.to_string() })
    }

    /// Sends frames, waiting up to `timeout` for a connection.
    ///
    /// # Errors
    /// [`ClientError::Unreachable`] when no connection came up in time.
    pub fn send_timeout(&self, frames: &[Frame], timeout: Duration) -> Result<(), ClientError> {
        let zerr = |source| ZmqError::new(format!("send to {}", self.addr), source);
        self.socket.set_sndtimeo(millis(timeout)).map_err(zerr)?;
        match self.socket.send_multipart(frames, 0) {
            Ok(()) => Ok(()),
            Err(zmq::Error::EAGAIN) => Err(ClientError::Unreachable { addr: self.addr.clone(), timeout }),
            Err(e) => Err(zerr(e).into()),
        }
    }

    /// Receives one message before `deadline`; `Ok(None)` when it passed.
    pub fn recv_deadline(&self, deadline: Instant) -> Result<Option<Vec<Frame>>, ClientError> {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut items = [self.socket.as_poll_item(zmq::POLLIN)];
        let zerr = |what: &str, source| ZmqError::new(format!("{what} {}", self.addr), source);
        let n = zmq::poll(&mut items, left.as_millis().min(i64::MAX as u128) as i64).map_err(|e| zerr("poll", e))?;
        if n == 0 {
            return Ok(None);
        }
        Ok(self.socket.recv_multipart(0).map(Some).map_err(|e| zerr("recv from", e))?)
    }
}

/// A duration as zmq milliseconds (clamped to `i32::MAX`).
pub(crate) fn millis(d: Duration) -> i32 {
    d.as_millis().min(i32::MAX as u128) as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_over_the_limit_is_dropped_not_held() {
        let ctx = zmq::Context::new();
        let router = ctx.socket(zmq::ROUTER).unwrap();
        router.set_linger(0).unwrap();
        router.bind("tcp://127.0.0.1:*").unwrap();
        router.set_rcvtimeo(10_000).unwrap();
        let addr = router.get_last_endpoint().unwrap().unwrap();
        let dealer = Dealer::connect(&ctx, &addr, 0, 1024).unwrap();
        dealer.send_timeout(&[b"hello".to_vec()], Duration::from_secs(5)).unwrap();
        let hello = router.recv_multipart(0).expect("hello within 10 s");
        let in_a_second = || Instant::now() + Duration::from_secs(1);
        router.send_multipart([&hello[0][..], &[7u8; 1024][..]], 0).unwrap();
        assert_eq!(dealer.recv_deadline(in_a_second()).unwrap(), Some(vec![vec![7u8; 1024]]), "the limit itself");
        router.send_multipart([&hello[0][..], &[8u8; 1025][..]], 0).unwrap();
        assert_eq!(dealer.recv_deadline(in_a_second()).unwrap(), None, "over max_answer_bytes: dropped");
    }

    #[test]
    fn a_misspelled_address_says_what_was_expected() {
        let Err(e) = crate::client::admin::AdminClient::connect("127.0.0.1:47293") else { panic!("connected") };
        let want = "\"127.0.0.1:47293\" is not an eMQP address (no tcp://): eMQP addresses look like tcp://host:port";
        assert!(e.to_string().starts_with(want), "{e}");
    }
}
