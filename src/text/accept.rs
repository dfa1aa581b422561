//! The listener and the acceptor threads: the connection cap and `ERR BUSY`.

use std::io::{self, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use socket2::{Domain, Protocol, Socket, Type};

use super::stats::TextStats;
use super::{conn, Shared};
use crate::ids::ConnId;
use crate::limits;
use crate::protocol::text::{encode_err, ErrorCode};

/// Binds a TCP listener with `SO_REUSEADDR` (a restarted router can bind
/// while old connections linger in TIME_WAIT) and a
/// [`limits::TEXT_LISTEN_BACKLOG`]-deep backlog.
///
/// # Errors
/// The socket, bind or listen error.
pub(super) fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(limits::TEXT_LISTEN_BACKLOG)?;
    Ok(socket.into())
}

/// Accepts until shutdown, handing each connection to its own thread.
pub(super) fn accept_loop(shared: Arc<Shared>, listener: TcpListener) {
    loop {
        let accepted = listener.accept();
        if shared.stopping.load(Relaxed) {
            return;
        }
        match accepted {
            Ok((stream, _peer)) => admit(&shared, stream),
            Err(e) => {
                tracing::warn!(error = %e, "text accept failed");
                std::thread::sleep(limits::TEXT_ACCEPT_ERROR_PAUSE);
            }
        }
    }
}

/// Starts a connection thread, or refuses with `ERR BUSY` past the cap.
fn admit(shared: &Arc<Shared>, stream: TcpStream) {
    let stats = &shared.stats;
    TextStats::inc(&stats.connections_total);
    let open = stats.connections_open.fetch_add(1, Relaxed) + 1;
    if open > shared.config.max_connections as u64 {
        TextStats::dec(&stats.connections_open);
        refuse(shared, stream);
        return;
    }
    let id = ConnId(shared.next_conn.fetch_add(1, Relaxed));
    let registered = stream.try_clone().map(|clone| shared.streams.lock().insert(id, clone));
    if let Err(e) = registered {
        tracing::warn!(conn = %id, error = %e, "cannot register text connection");
        TextStats::dec(&stats.connections_open);
        return;
    }
    let _ = stream.set_nodelay(true);
    let thread_shared = Arc::clone(shared);
    let spawned = std::thread::Builder::new()
        .name(format!("emq-text-{}", id.0))
        .stack_size(limits::TEXT_CONN_STACK_BYTES)
        .spawn(move || conn::serve(&thread_shared, id, stream));
    if let Err(e) = spawned {
        tracing::warn!(conn = %id, error = %e, "cannot start text connection thread");
        if let Some(s) = shared.streams.lock().remove(&id) {
            let _ = s.shutdown(Shutdown::Both);
        }
        TextStats::dec(&stats.connections_open);
    }
}

/// Writes `ERR BUSY` once and closes (docs/text-protocol.md "Limits").
fn refuse(shared: &Shared, mut stream: TcpStream) {
    shared.stats.count_error(ErrorCode::Busy);
    let mut line = Vec::new();
    encode_err(&mut line, ErrorCode::Busy, ErrorCode::Busy.default_text());
    let _ = stream.set_write_timeout(Some(limits::TEXT_BUSY_WRITE_TIMEOUT));
    let _ = stream.write_all(&line);
    let _ = stream.shutdown(Shutdown::Write);
}
