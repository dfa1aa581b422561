//! One load connection of the line-protocol modes: plain TCP, or TLS over
//! it (the text mode against a router's `text_tls` listener, with an
//! `AUTH <token>` line first when a token is given), split into a reading
//! half and a writing half so that a producer can read replies on another
//! thread than the one that sends.
//!
//! Over TLS both halves share one `rustls::ClientConnection` behind a
//! mutex, held only while records are decrypted or encrypted, never while
//! the socket blocks: the reading half reads the socket first and then
//! locks to decrypt, the writing half encrypts under the lock and writes
//! the records after releasing it. Only the writing half writes to the
//! socket, so records leave in the order they were made; anything the
//! connection has to send on its own (a key update) leaves with the next
//! write.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rustls::ClientConnection;

use super::{ioerr, BenchError};
use crate::client::text::TextClientOptions;

/// Bytes read from the socket at a time over TLS (one full TLS record and
/// its header).
const TLS_READ_BYTES: usize = 16 * 1024 + 256;

/// The reading half of a load connection.
pub struct LinkRead {
    sock: TcpStream,
    tls: Option<TlsRead>,
}

/// What the reading half keeps over TLS.
struct TlsRead {
    conn: Arc<Mutex<ClientConnection>>,
    /// Bytes read from the socket; `start..end` not yet taken by rustls
    /// (it refuses more while its decrypted buffer is full).
    buf: Box<[u8]>,
    start: usize,
    end: usize,
}

/// The writing half of a load connection.
pub struct LinkWrite {
    sock: TcpStream,
    tls: Option<(Arc<Mutex<ClientConnection>>, Vec<u8>)>,
}

/// Opens a connection to `addr` with `TCP_NODELAY`: TLS when
/// `options.tls` is set (handshake done within `timeout`), then
/// `AUTH <token>` when `options.token` is.
///
/// # Errors
/// [`BenchError::TargetDown`] when the connection or the TLS handshake
/// fails (rustls's reason: an untrusted or misnamed certificate, a client
/// certificate refused); [`BenchError::Io`] for socket settings.
pub fn open(
    addr: SocketAddr,
    timeout: Duration,
    options: &TextClientOptions,
) -> Result<(LinkRead, LinkWrite), BenchError> {
    let down = |e: io::Error| BenchError::TargetDown(format!("cannot connect to {addr}: {e}"));
    let sock = TcpStream::connect_timeout(&addr, timeout).map_err(down)?;
    sock.set_nodelay(true).map_err(ioerr("TCP_NODELAY"))?;
    let clone = |s: &TcpStream| s.try_clone().map_err(ioerr("clone stream"));
    let (read, mut write) = match &options.tls {
        None => (LinkRead { sock: clone(&sock)?, tls: None }, LinkWrite { sock, tls: None }),
        Some((config, name)) => {
            let mut conn = ClientConnection::new(config.clone(), name.clone())
                .map_err(|e| BenchError::Invalid(format!("TLS to {addr}: {e}")))?;
            sock.set_read_timeout(Some(timeout)).map_err(ioerr("read timeout"))?;
            sock.set_write_timeout(Some(timeout)).map_err(ioerr("write timeout"))?;
            let mut hs = &sock;
            while conn.is_handshaking() {
                conn.complete_io(&mut hs).map_err(|e| down(io::Error::new(e.kind(), format!("TLS handshake: {e}"))))?;
            }
            sock.set_write_timeout(None).map_err(ioerr("write timeout"))?;
            let conn = Arc::new(Mutex::new(conn));
            let tls = TlsRead { conn: conn.clone(), buf: vec![0; TLS_READ_BYTES].into(), start: 0, end: 0 };
            (LinkRead { sock: clone(&sock)?, tls: Some(tls) }, LinkWrite { sock, tls: Some((conn, Vec::new())) })
        }
    };
    if let Some(token) = &options.token {
        let mut line = Vec::with_capacity(token.0.len() + 6);
        line.extend_from_slice(b"AUTH ");
        line.extend_from_slice(&token.0);
        line.push(b'\n');
        write.write_all(&line).map_err(|e| down(io::Error::new(e.kind(), format!("AUTH: {e}"))))?;
    }
    Ok((read, write))
}

impl LinkRead {
    /// Sets the socket's read timeout: a read waiting longer fails with
    /// `WouldBlock` or `TimedOut` and leaves the connection usable.
    ///
    /// # Errors
    /// The OS refused the setting.
    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.sock.set_read_timeout(timeout)
    }
}

impl Read for LinkRead {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let Some(t) = &mut self.tls else { return self.sock.read(out) };
        loop {
            {
                let mut conn = t.conn.lock();
                match conn.reader().read(out) {
                    Ok(n) => return Ok(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    // Closed without close_notify (emq closes so after ERR BUSY).
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
                    Err(e) => return Err(e),
                }
                if t.start < t.end {
                    let mut rest = &t.buf[t.start..t.end];
                    let took = conn.read_tls(&mut rest)?;
                    t.start += took;
                    conn.process_new_packets().map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                    continue;
                }
            }
            (t.start, t.end) = (0, 0);
            let n = self.sock.read(&mut t.buf)?;
            t.end = n;
            if n == 0 {
                return Ok(0);
            }
        }
    }
}

impl LinkWrite {
    /// Ends the sending direction (TLS `close_notify` first).
    pub fn shutdown(&mut self) {
        if let Some((conn, buf)) = &mut self.tls {
            {
                let mut conn = conn.lock();
                conn.send_close_notify();
                while conn.wants_write() && conn.write_tls(buf).is_ok() {}
            }
            let _ = self.sock.write_all(buf);
            buf.clear();
        }
        let _ = self.sock.shutdown(Shutdown::Write);
    }
}

impl Write for LinkWrite {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let Some((conn, buf)) = &mut self.tls else { return self.sock.write(data) };
        let taken = {
            let mut conn = conn.lock();
            let taken = conn.writer().write(data)?;
            while conn.wants_write() {
                conn.write_tls(buf)?;
            }
            taken
        };
        let sent = self.sock.write_all(buf);
        buf.clear();
        sent?;
        if taken == 0 && !data.is_empty() {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "TLS connection takes no more data"));
        }
        Ok(taken)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.sock.flush()
    }
}
