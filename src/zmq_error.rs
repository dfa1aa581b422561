//! The one error type for a failed ZeroMQ call, shared by every layer that
//! touches zmq (client, worker, scheduler peer, pub/sub device, bench). It
//! says what was being done, with the address when there is one, and keeps
//! the zmq error as its source.

use std::borrow::Cow;

/// A ZeroMQ call failed: socket creation, an option, bind, connect, poll,
/// send or receive.
///
/// ```
/// use emq::zmq_error::ZmqError;
/// let ctx = zmq::Context::new();
/// let socket = ctx.socket(zmq::ROUTER).unwrap();
/// let addr = "tcp://127.0.0.1:not-a-port";
/// let err = socket.bind(addr).map_err(ZmqError::at(format!("bind frontend {addr}"))).unwrap_err();
/// assert!(err.to_string().starts_with("zmq bind frontend tcp://127.0.0.1:not-a-port failed: "), "{err}");
/// ```
#[derive(Debug, thiserror::Error)]
#[error("zmq {what} failed: {source}")]
pub struct ZmqError {
    /// What was being done, naming the socket or address, e.g.
    /// `bind frontend tcp://127.0.0.1:47291` or `poll`.
    pub what: Cow<'static, str>,
    /// The zmq error.
    pub source: zmq::Error,
}

impl ZmqError {
    /// A `ZmqError` for `source` while doing `what`.
    pub fn new(what: impl Into<Cow<'static, str>>, source: zmq::Error) -> ZmqError {
        ZmqError { what: what.into(), source }
    }

    /// A mapper for `map_err`: `socket.bind(addr).map_err(ZmqError::at("bind"))`.
    /// A `&'static str` costs no allocation, so it is fine on hot paths;
    /// pass a `String` (e.g. `format!("connect {addr}")`) to name the address.
    pub fn at(what: impl Into<Cow<'static, str>>) -> impl FnOnce(zmq::Error) -> ZmqError {
        let what = what.into();
        move |source| ZmqError { what, source }
    }
}
