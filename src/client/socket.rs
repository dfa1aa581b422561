//! Small ZeroMQ helpers shared by the client, admin client and worker: a
//! DEALER that never hangs (LINGER 0 or short, receive deadlines) and typed
//! errors.

use std::time::{Duration, Instant};

use crate::limits;
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
    /// The socket monitor's PAIR end, once [`Dealer::watch_disconnects`]
    /// made it: ZeroMQ tells it each connection that went down.
    monitor: Option<zmq::Socket>,
}

/// What [`Dealer::recv_or_disconnect`] got.
pub(crate) enum Heard {
    /// A message.
    Message(Vec<Frame>),
    /// A connection to a router went down (closed by the peer, or its ZMTP
    /// heartbeats went unanswered): what was sent on it may be lost.
    Disconnected,
    /// The deadline passed.
    Nothing,
}

impl Dealer {
    /// A DEALER with a fresh uuid4 identity (kept for the socket's life, so
    /// every router of the list knows the client by the same routing id),
    /// LINGER `linger_ms`, `ZMQ_IMMEDIATE` so a send waits for a real
    /// connection, ZMTP heartbeats ([`limits::ZMTP_HEARTBEAT_IVL`],
    /// [`limits::ZMTP_HEARTBEAT_TIMEOUT`]) so a dead router's connection is
    /// closed, and `ZMQ_MAXMSGSIZE` `max_answer_bytes`: ZeroMQ drops a
    /// larger message from the peer (with the connection) instead of
    /// holding it, so a wrong or hostile address cannot make the caller
    /// hold any size.
    ///
    /// `addrs` is one eMQP address or several separated by commas
    /// ([`crate::config::addr::emqp_list`]): the socket connects to each,
    /// and sends go to one that is connected (docs/failover.md). As a CURVE
    /// client when `curve` is set (one server key for every address, or one
    /// per address in order: [`crate::curve::ClientCurve`]).
    pub fn connect_with(
        ctx: &zmq::Context,
        addrs: &str,
        linger_ms: i32,
        max_answer_bytes: i64,
        curve: Option<&crate::curve::ClientCurve>,
    ) -> Result<Dealer, ClientError> {
        let list = crate::config::addr::emqp_list(addrs)?;
        let addr = list.join(",");
        let zerr = |what| ZmqError::at(format!("{what} {addr}"));
        let socket = ctx.socket(zmq::DEALER).map_err(zerr("socket for"))?;
        socket.set_identity(&crate::protocol::emqp::new_msgid()).map_err(zerr("identity for"))?;
        socket.set_linger(linger_ms).map_err(zerr("linger for"))?;
        socket.set_maxmsgsize(max_answer_bytes).map_err(zerr("max message size for"))?;
        set_router_options(&socket).map_err(zerr("options for"))?;
        crate::curve::connect_each(&socket, &list, curve)?;
        Ok(Dealer { socket, addr, monitor: None })
    }

    /// Starts watching the socket's connections (`zmq_socket_monitor`,
    /// `ZMQ_EVENT_DISCONNECTED`), for [`Dealer::recv_or_disconnect`].
    pub fn watch_disconnects(&mut self, ctx: &zmq::Context) -> Result<(), ClientError> {
        let endpoint = format!("inproc://emq-client-monitor-{}", uuid::Uuid::new_v4());
        let zerr = |what| ZmqError::at(format!("{what} {}", self.addr));
        self.socket.monitor(&endpoint, zmq::SocketEvent::DISCONNECTED as i32).map_err(zerr("monitor of"))?;
        let pair = ctx.socket(zmq::PAIR).map_err(zerr("monitor socket for"))?;
        pair.set_linger(0).map_err(zerr("monitor linger for"))?;
        pair.connect(&endpoint).map_err(zerr("monitor connect for"))?;
        self.monitor = Some(pair);
        Ok(())
    }

    /// Receives one message before `deadline`, or learns that a connection
    /// went down (only after [`Dealer::watch_disconnects`]).
    pub fn recv_or_disconnect(&self, deadline: Instant) -> Result<Heard, ClientError> {
        let zerr = |what: &str, source| ZmqError::new(format!("{what} {}", self.addr), source);
        let left = deadline.saturating_duration_since(Instant::now());
        let mut items = vec![self.socket.as_poll_item(zmq::POLLIN)];
        if let Some(m) = &self.monitor {
            items.push(m.as_poll_item(zmq::POLLIN));
        }
        let n = zmq::poll(&mut items, left.as_millis().min(i64::MAX as u128) as i64).map_err(|e| zerr("poll", e))?;
        if n == 0 {
            return Ok(Heard::Nothing);
        }
        let lost = items.get(1).is_some_and(zmq::PollItem::is_readable);
        if lost {
            if let Some(m) = &self.monitor {
                // Two frames per event (event and value, then the endpoint):
                // read them all; what they say is only "one went down".
                while m.recv_multipart(zmq::DONTWAIT).is_ok() {}
            }
            return Ok(Heard::Disconnected);
        }
        match self.socket.recv_multipart(zmq::DONTWAIT) {
            Ok(frames) => Ok(Heard::Message(frames)),
            Err(zmq::Error::EAGAIN) => Ok(Heard::Nothing),
            Err(e) => Err(zerr("recv from", e).into()),
        }
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

/// The options of every socket that connects to a router's list of
/// addresses (client, worker, scheduler): `ZMQ_IMMEDIATE` (messages wait
/// for, and go only to, connections that are up: a standby router binds
/// nothing, a dead one's connection is gone) and ZMTP heartbeats
/// (`ZMQ_HEARTBEAT_IVL` [`limits::ZMTP_HEARTBEAT_IVL`],
/// `ZMQ_HEARTBEAT_TIMEOUT` and `ZMQ_HEARTBEAT_TTL`
/// [`limits::ZMTP_HEARTBEAT_TIMEOUT`]). docs/failover.md.
///
/// # Errors
/// The failing `zmq_setsockopt`.
pub fn set_router_options(socket: &zmq::Socket) -> Result<(), zmq::Error> {
    socket.set_immediate(true)?;
    socket.set_heartbeat_ivl(millis(limits::ZMTP_HEARTBEAT_IVL))?;
    socket.set_heartbeat_timeout(millis(limits::ZMTP_HEARTBEAT_TIMEOUT))?;
    socket.set_heartbeat_ttl(millis(limits::ZMTP_HEARTBEAT_TIMEOUT))?;
    Ok(())
}

/// Connects `socket` to every address of `addrs` (one eMQP address or
/// several separated by commas), after [`set_router_options`].
///
/// # Errors
/// A malformed address, or the failing ZeroMQ call, naming the address.
pub fn connect_router(socket: &zmq::Socket, addrs: &str) -> Result<Vec<String>, ClientError> {
    connect_router_curve(socket, addrs, None)
}

/// [`connect_router`], as a CURVE client when `curve` is set (the i-th
/// address with the i-th server key, or the one key for all).
///
/// # Errors
/// As [`connect_router`].
pub fn connect_router_curve(
    socket: &zmq::Socket,
    addrs: &str,
    curve: Option<&crate::curve::ClientCurve>,
) -> Result<Vec<String>, ClientError> {
    let list = crate::config::addr::emqp_list(addrs)?;
    set_router_options(socket).map_err(ZmqError::at(format!("options for {addrs}")))?;
    crate::curve::connect_each(socket, &list, curve)?;
    Ok(list)
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
        let dealer = Dealer::connect_with(&ctx, &addr, 0, 1024, None).unwrap();
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
