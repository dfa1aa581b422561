//! The router's CURVE endpoints as its I/O thread holds them: which
//! socket, the bound endpoint, key and ZAP domain, and rebinding them for
//! `RELOAD_KEYS DISCONNECT` (docs/security.md "Reload and revocation").
//! Here, not in `router::curve`, because the I/O thread does the binding.

use std::time::{Duration, Instant};

use crate::curve::{self, Key};
use crate::protocol::emqp::Socket;

/// One CURVE endpoint as the I/O thread rebinds it.
#[derive(Clone)]
pub struct CurveBind {
    /// Which ROUTER socket.
    pub socket: Socket,
    /// The endpoint as bound (port resolved).
    pub endpoint: String,
    /// The router's secret key.
    pub secret: Key,
    /// Its ZAP domain.
    pub domain: &'static str,
}

/// Rebinds the CURVE endpoints of the I/O thread's sockets (unbind, then
/// bind with the same options): the connections on them are dropped.
/// Returns how many were rebound.
///
/// # Errors
/// The first failure, naming the endpoint.
pub fn rebind(binds: &[CurveBind], sockets: [&mut zmq::Socket; 3]) -> Result<usize, String> {
    let [frontend, backend, admin] = sockets;
    for b in binds {
        let socket: &mut zmq::Socket = match b.socket {
            Socket::Frontend => frontend,
            Socket::Backend => backend,
            _ => admin,
        };
        socket.unbind(&b.endpoint).map_err(|e| format!("unbind {}: {e}", b.endpoint))?;
        rebind_one(socket, b)?;
    }
    Ok(binds.len())
}

/// Longest wait for libzmq to close an unbound listener before its address
/// can be bound again ([`rebind`]); below the admin side's wait for the
/// whole rebind (`router::curve`).
const ADDRESS_FREE_WAIT: Duration = Duration::from_secs(2);

/// Binds `b` again after its unbind. libzmq closes the old listener on its
/// own I/O thread, after `zmq_unbind` returns, so the first binds can fail
/// with `EADDRINUSE` (seen in tests/security_curve.rs): retried every 5 ms
/// for up to [`ADDRESS_FREE_WAIT`], which the calling I/O thread spends blocked
/// (a rare admin command; usually one retry).
fn rebind_one(socket: &mut zmq::Socket, b: &CurveBind) -> Result<(), String> {
    let deadline = Instant::now() + ADDRESS_FREE_WAIT;
    loop {
        match curve::bind_curve(socket, &b.endpoint, &b.secret, b.domain) {
            Ok(_) => return Ok(()),
            Err(e) if e.source == zmq::Error::EADDRINUSE && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => {
                tracing::error!(endpoint = %b.endpoint, error = %e, "CURVE endpoint not bound again after reload-keys --disconnect: its peers cannot connect until the router restarts");
                return Err(e.to_string());
            }
        }
    }
}
