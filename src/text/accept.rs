//! The listener and accepting (text-protocol.md "Limits on connections"):
//! the connection cap, the descriptor reserve and `ERR BUSY`.
//!
//! Accepting runs inside the first `text_acceptors` I/O threads, each with
//! its own copy of the listener in its poll; accepted connections go to the
//! I/O threads round-robin. A connection is refused with `ERR BUSY` (one
//! line, then closed) when `text_max_connections` are open, or when fewer
//! than `text_reserved_fds` descriptors are left: the kernel gives a new
//! socket the lowest free descriptor number, so a number at or above
//! `RLIMIT_NOFILE − reserve` means every lower one is taken. When even
//! `accept` fails for lack of descriptors, the acceptor frees a spare one it
//! keeps (`/dev/null`), accepts, refuses, and takes the spare back, so a
//! client is told instead of waiting and the listener does not spin.
//!
//! The TLS listener (`text_tls`) is accepted the same way, by the same
//! threads, and its connections count in the same `text_max_connections`
//! (each also holds TLS state, docs/security.md). A TLS connection refused
//! is closed without the `ERR BUSY` line: plaintext on a TLS connection is
//! not something its client could read.

use std::fs::File;
use std::io::{self, Write};
use std::net::{Shutdown, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use mio::net::{TcpListener, TcpStream};
use socket2::{Domain, Protocol, Socket, Type};

use super::stats::TextStats;
use super::Shared;
use crate::limits;
use crate::protocol::text::{encode_err, ErrorCode};

/// Whether a failed `accept` may fail the same way at once if tried again
/// (out of descriptors, memory or buffers; a listener in a bad state): the
/// acceptor then waits [`limits::TEXT_ACCEPT_RETRY`]. The errors accept(2)
/// passes on from one pending connection (reset or aborted before it was
/// taken, network errors Linux reports there, "treat like EAGAIN") are that
/// connection's only: the next may be accepted at once.
fn lasting(e: &io::Error) -> bool {
    let of_one_connection = [
        libc::ECONNABORTED,
        libc::EPROTO,
        libc::ENOPROTOOPT,
        libc::EHOSTDOWN,
        libc::ENONET,
        libc::EHOSTUNREACH,
        libc::EOPNOTSUPP,
        libc::ENETDOWN,
        libc::ENETUNREACH,
    ];
    !e.raw_os_error().is_some_and(|n| of_one_connection.contains(&n))
}

/// Binds a TCP listener with `SO_REUSEADDR` (a restarted router can bind
/// while old connections linger in TIME_WAIT) and a
/// [`limits::TEXT_LISTEN_BACKLOG`]-deep backlog, non-blocking.
///
/// # Errors
/// The socket, bind or listen error.
pub(super) fn bind(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(limits::TEXT_LISTEN_BACKLOG)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// The accepting part of an I/O thread.
#[derive(Debug)]
pub(super) struct Acceptor {
    listener: TcpListener,
    /// The I/O thread it runs in.
    me: usize,
    /// It accepts on the TLS listener.
    tls: bool,
    /// The listener may have connections waiting (edge-triggered).
    ready: bool,
    /// After a failure no spare descriptor could get past: try again then.
    retry_at: Option<Instant>,
    /// A descriptor kept to be given up when `accept` finds none.
    spare: Option<File>,
    /// Failed accepts not logged yet, and when the next may be.
    unlogged: u64,
    next_log: Option<Instant>,
}

impl Acceptor {
    /// An acceptor in I/O thread `me` on `listener` (a copy of the
    /// server's plain listener, or of its TLS one when `tls`).
    pub fn new(listener: TcpListener, me: usize, tls: bool) -> Acceptor {
        Acceptor { listener, me, tls, ready: true, retry_at: None, spare: spare(), unlogged: 0, next_log: None }
    }

    /// Whether it accepts on the TLS listener.
    pub fn tls(&self) -> bool {
        self.tls
    }

    /// The listener, to register in the thread's poll.
    pub fn listener(&mut self) -> &mut TcpListener {
        &mut self.listener
    }

    /// Whether connections may be waiting now.
    pub fn ready(&self) -> bool {
        self.ready
    }

    /// The listener reported readiness.
    pub fn set_ready(&mut self) {
        self.ready = true;
    }

    /// When to try again after running out of descriptors.
    pub fn retry_at(&self) -> Option<Instant> {
        self.retry_at
    }

    /// Accepts up to [`limits::TEXT_ACCEPT_BATCH`] connections, refusing or
    /// handing each over (to another I/O thread, or to `local` for this one).
    pub fn accept(&mut self, now: Instant, shared: &Shared, mut local: impl FnMut(TcpStream)) {
        if self.retry_at.is_some_and(|at| at <= now) {
            self.retry_at = None;
            self.ready = true;
        }
        if !self.ready {
            return;
        }
        for _ in 0..limits::TEXT_ACCEPT_BATCH {
            match self.listener.accept() {
                Ok((stream, _)) => admit(shared, stream, self.me, self.tls, &mut local),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.ready = false;
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.failed(now, &e, shared);
                    if !lasting(&e) || (is_out_of_descriptors(&e) && self.refuse_with_spare(shared)) {
                        continue;
                    }
                    // Polled again at once, it would fail again at once:
                    // the thread would spin.
                    self.ready = false;
                    self.retry_at = Some(now + limits::TEXT_ACCEPT_RETRY);
                    return;
                }
            }
        }
    }

    /// Counts a failed `accept` and logs it at most once per
    /// [`limits::TEXT_ACCEPT_LOG_INTERVAL`], with the count not logged.
    fn failed(&mut self, now: Instant, e: &io::Error, shared: &Shared) {
        TextStats::inc(&shared.stats.accept_errors);
        if self.next_log.is_some_and(|at| now < at) {
            self.unlogged += 1;
            return;
        }
        tracing::warn!(error = %e, not_logged = self.unlogged, "text accept failed");
        self.unlogged = 0;
        self.next_log = Some(now + limits::TEXT_ACCEPT_LOG_INTERVAL);
    }

    /// Out of descriptors: gives up the spare one to accept a connection and
    /// refuse it. Whether a connection was taken from the listener.
    fn refuse_with_spare(&mut self, shared: &Shared) -> bool {
        if self.spare.take().is_none() {
            return false;
        }
        let taken = match self.listener.accept() {
            Ok((stream, _)) => {
                TextStats::inc(&shared.stats.connections_total);
                TextStats::inc(&shared.stats.refused_fds);
                refuse(shared, stream, self.tls, "too few descriptors left");
                true
            }
            Err(_) => false,
        };
        self.spare = spare();
        taken
    }
}

fn spare() -> Option<File> {
    File::open("/dev/null").ok()
}

fn is_out_of_descriptors(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

/// Hands a new connection to an I/O thread, or refuses it with `ERR BUSY`.
fn admit(shared: &Shared, stream: TcpStream, me: usize, tls: bool, local: &mut impl FnMut(TcpStream)) {
    let stats = &shared.stats;
    TextStats::inc(&stats.connections_total);
    let open = stats.connections_open.fetch_add(1, Relaxed) + 1;
    if open > shared.config.max_connections as u64 {
        TextStats::dec(&stats.connections_open);
        return refuse(shared, stream, tls, ErrorCode::Busy.default_text());
    }
    let fd = u64::try_from(stream.as_raw_fd()).unwrap_or(u64::MAX);
    if fd.saturating_add(shared.config.reserved_fds as u64) >= stats.fd_limit.load(Relaxed) {
        TextStats::dec(&stats.connections_open);
        TextStats::inc(&stats.refused_fds);
        return refuse(shared, stream, tls, "too few descriptors left");
    }
    let _ = stream.set_nodelay(true);
    let inboxes = &shared.inboxes;
    let to = shared.next_thread.fetch_add(1, Relaxed) % inboxes.len().max(1);
    match inboxes.get(to) {
        Some(inbox) if to != me => inbox.hand(stream, tls),
        _ => local(stream),
    }
}

/// Writes `ERR BUSY <text>` once and closes (text-protocol.md "Limits on
/// connections"). The socket is new, so its send buffer takes the line. A
/// TLS connection is only closed (counted as BUSY all the same).
fn refuse(shared: &Shared, mut stream: TcpStream, tls: bool, text: &str) {
    shared.stats.count_error(ErrorCode::Busy);
    if !tls {
        let mut line = Vec::new();
        encode_err(&mut line, ErrorCode::Busy, text);
        let _ = stream.write_all(&line);
    }
    let _ = stream.shutdown(Shutdown::Write);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_that_would_come_again_at_once_make_the_acceptor_wait() {
        for n in [libc::EMFILE, libc::ENFILE, libc::ENOBUFS, libc::ENOMEM, libc::EINVAL, libc::EPERM] {
            assert!(lasting(&io::Error::from_raw_os_error(n)), "errno {n}");
        }
        for n in [libc::ECONNABORTED, libc::EPROTO, libc::ENETUNREACH] {
            assert!(!lasting(&io::Error::from_raw_os_error(n)), "errno {n}");
        }
    }

    /// A socket bound but not listening fails every `accept` with EINVAL,
    /// an error that lasts: the acceptor waits for its retry time (it kept
    /// trying, so its thread polled with no timeout, at 100 % of a core).
    #[test]
    fn a_listener_failing_every_accept_fails_with_a_lasting_error() {
        let socket = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).expect("socket");
        socket.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into()).expect("bind");
        socket.set_nonblocking(true).expect("non-blocking");
        let listener = TcpListener::from_std(socket.into());
        let e = listener.accept().expect_err("not listening");
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
        assert!(lasting(&e));
    }
}
