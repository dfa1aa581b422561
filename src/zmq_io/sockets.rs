//! Socket set-up for the router's ROUTER sockets.

use crate::limits;
use crate::zmq_error::ZmqError;

/// A ROUTER socket named `name`, bound to `addr`, with `ROUTER_MANDATORY`
/// (a send to an unknown identity fails instead of vanishing), the
/// high-water mark `hwm` both ways, and `ZMQ_MAXMSGSIZE` `max_frame_bytes`
/// (libzmq drops the connection of a peer that sends a larger frame, before
/// buffering it). Returns the socket and the endpoint it really bound (port
/// 0 resolved).
///
/// # Errors
/// [`ZmqError`] naming the option or the address.
pub fn router_socket(
    ctx: &zmq::Context,
    addr: &str,
    hwm: i32,
    max_frame_bytes: usize,
    name: &str,
) -> Result<(zmq::Socket, String), ZmqError> {
    let s = ctx.socket(zmq::ROUTER).map_err(ZmqError::at(format!("{name} socket")))?;
    s.set_router_mandatory(true).map_err(ZmqError::at("ROUTER_MANDATORY"))?;
    s.set_sndhwm(hwm).map_err(ZmqError::at("SNDHWM"))?;
    s.set_rcvhwm(hwm).map_err(ZmqError::at("RCVHWM"))?;
    s.set_maxmsgsize(i64::try_from(max_frame_bytes).unwrap_or(i64::MAX)).map_err(ZmqError::at("MAXMSGSIZE"))?;
    s.set_linger(limits::ROUTER_LINGER.as_millis() as i32).map_err(ZmqError::at("LINGER"))?;
    s.bind(addr).map_err(ZmqError::at(format!("bind {name} {addr}")))?;
    let bound = s.get_last_endpoint().ok().and_then(|e| e.ok()).unwrap_or_else(|| addr.to_string());
    Ok((s, bound))
}
