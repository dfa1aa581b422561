//! A text connection over TLS (`text_tls`, docs/security.md "Text protocol:
//! TLS and tokens"): the rustls server state between the socket and the
//! line decoder, driven by the same readiness loop as plain connections.
//!
//! Reading: TLS bytes go from the socket into rustls (`read_tls`, 4 KiB at
//! most each), are decrypted (`process_new_packets`), and the plaintext is
//! moved at once into [`TlsLink::plain`], from which the I/O thread takes
//! its reads as it takes them from a plain socket (a whole read, or through
//! the next LF while the input budget is spent). A plain socket can be
//! peeked without taking its bytes; TLS records cannot be, so while the
//! budget is spent a TLS connection holds at most
//! [`limits::TEXT_TLS_PLAIN_BYTES`] decrypted plus one record beyond it
//! (counted in `buffered_bytes` like any held input).
//!
//! Writing: replies go to rustls ([`limits::TEXT_TLS_WRITE_CHUNK_BYTES`] at
//! a time, only once what it holds is written), which encrypts them;
//! `write_tls` sends while rustls wants to write. The connection's own
//! buffer keeps the rest, so `text_max_unsent_bytes` bounds a TLS client
//! that does not read as it bounds a plain one, and rustls's own buffer
//! limit is set to the same figure as a backstop.
//!
//! Readiness: the socket is registered for both directions, edge-triggered,
//! once (as plain connections are). rustls's `wants_read` is always true
//! here, since its plaintext is always taken at once, and `wants_write` is
//! looked at after every read and write ([`TlsLink::wants_write`] makes the
//! connection dirty); re-registering interest on every change, as rustls's
//! `tlsserver-mio` example does, would add a system call per turn and give
//! nothing with edge-triggered events.

use std::io::{self, BufRead, Write};
use std::sync::Arc;
use std::time::Instant;

use mio::net::TcpStream;
use rustls::{ServerConfig, ServerConnection};

use super::io::Got;
use super::stats::TextStats;
use crate::limits::{TEXT_TLS_PLAIN_BYTES, TEXT_TLS_READS_PER_TURN, TEXT_TLS_WRITE_CHUNK_BYTES};

/// The TLS state of one text connection.
pub(super) struct TlsLink {
    tls: ServerConnection,
    /// Decrypted bytes not yet handed to the line decoder.
    plain: Vec<u8>,
    /// When the handshake must be finished; `None` once it is.
    handshake_deadline: Option<Instant>,
    /// The peer closed (TLS `close_notify` or the TCP end of input).
    eof: bool,
}

impl std::fmt::Debug for TlsLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsLink")
            .field("plain", &self.plain.len())
            .field("handshaking", &self.tls.is_handshaking())
            .field("eof", &self.eof)
            .finish()
    }
}

impl TlsLink {
    /// A server connection under `config`, whose handshake must finish by
    /// `deadline`; rustls buffers at most `max_unsent` bytes.
    ///
    /// # Errors
    /// rustls refused to start a connection (not expected with a valid
    /// configuration).
    pub fn new(config: Arc<ServerConfig>, deadline: Instant, max_unsent: usize) -> Result<TlsLink, rustls::Error> {
        let mut tls = ServerConnection::new(config)?;
        tls.set_buffer_limit(Some(max_unsent));
        Ok(TlsLink { tls, plain: Vec::new(), handshake_deadline: Some(deadline), eof: false })
    }

    /// Decrypted bytes held, not yet decoded.
    pub fn held(&self) -> usize {
        self.plain.len()
    }

    /// Whether rustls has TLS bytes to write (handshake, alerts, replies).
    pub fn wants_write(&self) -> bool {
        self.tls.wants_write()
    }

    /// When the handshake must be finished, while it is not.
    pub fn handshake_deadline(&self) -> Option<Instant> {
        self.handshake_deadline
    }

    /// Whether the handshake is still going on at `now`, past its deadline.
    pub fn handshake_late(&self, now: Instant) -> bool {
        self.handshake_deadline.is_some_and(|at| at <= now)
    }

    /// Reads TLS from `stream` into [`TlsLink::plain`] until `enough` holds
    /// for it, the socket is empty, the peer closed, or
    /// [`limits::TEXT_TLS_READS_PER_TURN`] reads were made. Returns whether
    /// the socket may hold more.
    ///
    /// # Errors
    /// The socket's error, or a TLS error (`InvalidData`; its alert is
    /// queued to be written before the close). A failed handshake is
    /// counted and logged (rate-limited) with the peer's address.
    fn fill(&mut self, stream: &mut TcpStream, enough: impl Fn(&[u8]) -> bool, stats: &TextStats) -> io::Result<bool> {
        for _ in 0..TEXT_TLS_READS_PER_TURN {
            if self.eof || enough(&self.plain) {
                return Ok(!self.eof);
            }
            match self.tls.read_tls(stream) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            if let Err(e) = self.tls.process_new_packets() {
                if self.handshake_deadline.take().is_some() {
                    handshake_failed(stream, stats, &e.to_string());
                }
                return Err(io::Error::new(io::ErrorKind::InvalidData, e));
            }
            if self.handshake_deadline.is_some() && !self.tls.is_handshaking() {
                self.handshake_deadline = None;
                TextStats::inc(&stats.tls_handshakes);
            }
            self.take_plaintext()?;
            if self.eof && self.handshake_deadline.take().is_some() {
                handshake_failed(stream, stats, "the peer closed the connection");
            }
        }
        Ok(!self.eof)
    }

    /// Moves what rustls decrypted into `plain`; notes the peer's close.
    fn take_plaintext(&mut self) -> io::Result<()> {
        let mut reader = self.tls.reader();
        loop {
            match reader.fill_buf() {
                Ok([]) => {
                    self.eof = true;
                    return Ok(());
                }
                Ok(chunk) => {
                    let n = chunk.len();
                    self.plain.extend_from_slice(chunk);
                    reader.consume(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    // The TCP end without close_notify: a truncated line is
                    // dropped like any line without its LF.
                    self.eof = true;
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The TLS counterpart of the plain socket read (`io::read_input`):
    /// not `by_line`, up to `buf.len()` bytes; `by_line`, only through the
    /// first LF, or what is held when `take_all`, else [`Got::Pause`].
    /// [`Got::Again`] when TLS bytes were read that gave no plaintext yet
    /// (the handshake) and the socket may hold more.
    ///
    /// # Errors
    /// `WouldBlock` when nothing is held and the socket is empty; a socket
    /// or TLS error.
    pub fn read_input(
        &mut self,
        stream: &mut TcpStream,
        buf: &mut [u8],
        by_line: bool,
        take_all: bool,
        stats: &TextStats,
    ) -> io::Result<Got> {
        let cap = if by_line { TEXT_TLS_PLAIN_BYTES } else { buf.len().min(TEXT_TLS_PLAIN_BYTES * 4) };
        let more = if by_line && !take_all {
            self.fill(stream, |p| p.len() >= cap || memchr::memchr(b'\n', p).is_some(), stats)?
        } else {
            self.fill(stream, |p| p.len() >= cap, stats)?
        };
        if self.plain.is_empty() {
            return match (self.eof, more) {
                (true, _) => Ok(Got::Bytes(0, false)),
                (false, true) => Ok(Got::Again),
                (false, false) => Err(io::ErrorKind::WouldBlock.into()),
            };
        }
        let take = match (by_line, memchr::memchr(b'\n', &self.plain)) {
            (false, _) => self.plain.len(),
            (true, Some(lf)) => lf + 1,
            (true, None) if take_all => self.plain.len(),
            (true, None) => return Ok(Got::Pause),
        };
        let n = take.min(buf.len());
        buf[..n].copy_from_slice(&self.plain[..n]);
        self.plain.drain(..n);
        if self.plain.capacity() > TEXT_TLS_PLAIN_BYTES * 8 {
            self.plain.shrink_to(TEXT_TLS_PLAIN_BYTES);
        }
        Ok(Got::Bytes(n, more || !self.plain.is_empty() || self.eof))
    }

    /// Writes `out` through TLS as far as the socket takes it; what rustls
    /// accepted is removed from `out`. `Ok(true)`: everything is written.
    ///
    /// # Errors
    /// The socket's write error.
    pub fn write(&mut self, stream: &mut TcpStream, out: &mut Vec<u8>) -> io::Result<bool> {
        loop {
            while self.tls.wants_write() {
                match self.tls.write_tls(stream) {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            if out.is_empty() || self.tls.is_handshaking() {
                return Ok(out.is_empty());
            }
            let chunk = out.len().min(TEXT_TLS_WRITE_CHUNK_BYTES);
            let n = self.tls.writer().write(&out[..chunk])?;
            if n == 0 {
                return Ok(false);
            }
            out.drain(..n);
        }
    }

    /// The connection closes: a `close_notify` (unless the handshake did
    /// not finish) and whatever TLS bytes the socket takes now, without
    /// waiting.
    pub fn close(&mut self, stream: &mut TcpStream) {
        if !self.tls.is_handshaking() {
            self.tls.send_close_notify();
        }
        while self.tls.wants_write() {
            match self.tls.write_tls(stream) {
                Ok(n) if n > 0 => {}
                _ => break,
            }
        }
    }

    /// The handshake's time ran out: counted and logged.
    pub fn handshake_timed_out(&mut self, stream: &TcpStream, stats: &TextStats) {
        if self.handshake_deadline.take().is_some() {
            handshake_failed(stream, stats, "not finished within text_tls_handshake_timeout");
        }
    }
}

/// Counts a failed handshake and logs it, rate-limited, with the peer.
fn handshake_failed(stream: &TcpStream, stats: &TextStats, why: &str) {
    TextStats::inc(&stats.tls_handshake_failures);
    let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
    crate::log_limited!(warn, peer = %peer, why, "text TLS handshake failed; connection closed");
}
