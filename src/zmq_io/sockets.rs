//! Socket set-up for the router's ROUTER sockets.

use crate::limits;
use crate::zmq_error::ZmqError;

/// A ROUTER socket named `name`, bound to `addr`, with `ROUTER_MANDATORY`
/// (a send to an unknown identity fails instead of vanishing),
/// `ROUTER_HANDOVER`, the high-water mark `hwm` for sending and at most
/// [`limits::ZMQ_RCVHWM`] for receiving, and
/// `ZMQ_MAXMSGSIZE` `max_msg_size` ([`limits::zmq_max_msg_size`]: emq's
/// libzmq drops the connection of a peer whose multipart message, every
/// frame counted, passes it, before buffering it). Returns the socket and
/// the endpoint it really bound (port 0 resolved).
///
/// `ROUTER_HANDOVER` (emq's rule; EventMQ 0.3.13 leaves it off): when a peer
/// connects with an identity that is already connected, the new connection
/// takes the identity over and libzmq terminates the old one's pipe, with
/// whatever it still queued. Without it libzmq ignores the newcomer until
/// the old pipe is gone: a client that reconnects under a fixed identity
/// had 7–19 % of its REQUESTs silently dropped and leaked ~1.9 KB per
/// reconnect, and a worker reconnecting while its old connection was
/// half-open received nothing, ever. Broker state is keyed by identity, not
/// by connection, so the peer keeps its registration; a worker that
/// re-INFORMs replaces it (and its jobs in flight are requeued).
///
/// # Errors
/// [`ZmqError`] naming the option or the address.
pub fn router_socket(
    ctx: &zmq::Context,
    addr: &str,
    hwm: i32,
    max_msg_size: i64,
    name: &str,
) -> Result<(zmq::Socket, String), ZmqError> {
    let s = ctx.socket(zmq::ROUTER).map_err(ZmqError::at(format!("{name} socket")))?;
    s.set_router_mandatory(true).map_err(ZmqError::at("ROUTER_MANDATORY"))?;
    s.set_router_handover(true).map_err(ZmqError::at("ROUTER_HANDOVER"))?;
    s.set_sndhwm(hwm).map_err(ZmqError::at("SNDHWM"))?;
    // 0 is "no limit" to libzmq: the read-ahead cap holds then too.
    let rcvhwm = if hwm <= 0 { limits::ZMQ_RCVHWM } else { hwm.min(limits::ZMQ_RCVHWM) };
    s.set_rcvhwm(rcvhwm).map_err(ZmqError::at("RCVHWM"))?;
    s.set_maxmsgsize(max_msg_size).map_err(ZmqError::at("MAXMSGSIZE"))?;
    s.set_linger(limits::ROUTER_LINGER.as_millis() as i32).map_err(ZmqError::at("LINGER"))?;
    s.bind(addr).map_err(ZmqError::at(format!("bind {name} {addr}")))?;
    let bound = s.get_last_endpoint().ok().and_then(|e| e.ok()).unwrap_or_else(|| addr.to_string());
    Ok((s, bound))
}

#[cfg(test)]
mod tests {
    /// libzmq is built with CURVE (vendor/zeromq-src patch 4, libsodium):
    /// a build without libsodium must fail CI, not ship without encryption.
    #[test]
    fn libzmq_has_curve() {
        assert_eq!(zmq::has("curve"), Some(true));
        let pair = zmq::CurveKeyPair::new().expect("CURVE key pair");
        assert_eq!(pair.public_key.len(), 32);
    }
}
