//! A blocking Rust client for the text protocol (docs/text-protocol.md).
//!
//! # How errors of write-only commands surface
//!
//! SCHED, ACK, DCL and DEL send nothing back when they succeed, so
//! [`TextClient::sched`], [`TextClient::ack`], [`TextClient::dcl`] and
//! [`TextClient::del`] only write; they fail only on I/O errors. An `ERR`
//! line the server writes for one of them (`QUEUE_FULL`, `NO_TASK`, …) is
//! read later, and kept apart from the answers to ASK with a *barrier*: the
//! line `ASK !sync`, which every server answers with `ERR BAD_FORMAT` and no
//! change of state (`!` is not a queue-name byte, and the format error wins
//! over `PENDING`). Before the next reading call the client writes the
//! barrier; every `ERR` line before the barrier's answer belongs to an
//! earlier write-only command and is kept as a *deferred* error:
//!
//! * [`TextClient::ask`] returns only the answer to its own ASK; deferred
//!   errors stay queued.
//! * [`TextClient::sync`] and [`TextClient::end`] return
//!   [`TextClientError::Deferred`] with every queued error, in order.
//! * [`TextClient::take_deferred`] hands them over without failing.
//!
//! The barrier costs one line per reading call that follows write-only
//! commands. emq's server counts it in `barriers`, apart from the
//! `BAD_FORMAT` errors ([`crate::protocol::text::BARRIER_LINE`]).
//!
//! # A connection the server closed
//!
//! The server refuses a connection it cannot take (`text_max_connections`,
//! the descriptor reserve) with one `ERR BUSY <why>` line, then closes it.
//! A write to it succeeds once (the server's host answers it with a reset)
//! and fails after (`EPIPE`, `ECONNRESET`), so the call that fails may be
//! any of them, before anything was read. Every call therefore reads, when
//! its write fails so, what the server wrote before closing: `ERR BUSY`
//! comes back as [`TextClientError::Server`], whatever the call; `ERR`
//! lines for earlier write-only commands as [`TextClientError::Deferred`];
//! only when the server wrote neither is the I/O error returned. A call
//! that reads (`ask`, `sync`, `end`) and meets `ERR BUSY` returns it as
//! `Server` too. So do `ERR NOAUTH` and `ERR AUTH_FAILED`, which also end
//! the connection.
//!
//! # TLS and tokens
//!
//! [`TextClient::connect_with`] takes [`TextClientOptions`]: TLS to a
//! `text_tls` listener (a rustls client configuration and the server's
//! name; the handshake is finished before it returns, so a refused
//! certificate fails the connect) and a token, sent as `AUTH <token>`
//! before anything else. A good token is answered with nothing, so a wrong
//! one surfaces at the next reading call (or a failed write) as
//! [`TextClientError::Server`] with `AUTH_FAILED`.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, StreamOwned};

use crate::limits;
use crate::protocol::text::{
    encode_command, parse_server_line, EncodeError, ErrorCode, Secret, ServerLine, TextCommand, BARRIER_LINE as BARRIER,
};

/// An `ERR <CODE> <text>` line from the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerError {
    /// The code token.
    pub code: ErrorCode,
    /// The human text.
    pub text: String,
}

/// Errors of [`TextClient`].
#[derive(Debug, thiserror::Error)]
pub enum TextClientError {
    /// The server answered this call with `ERR` (`ERR BUSY` also ends
    /// the connection).
    #[error("server error {code}: {text}")]
    Server {
        /// The code token.
        code: ErrorCode,
        /// The human text.
        text: String,
    },
    /// `ERR` lines for earlier SCHED/ACK/DCL/DEL commands, in order.
    #[error("{} earlier command(s) failed, first: {}", .0.len(), .0.first().map(|e| e.code.as_str()).unwrap_or(""))]
    Deferred(Vec<ServerError>),
    /// The command cannot be written as one line.
    #[error("cannot encode command: {0}")]
    Encode(#[from] EncodeError),
    /// The server sent a line the client does not understand here.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The server closed the connection.
    #[error("connection closed by the server")]
    Closed,
    /// No answer within the client's timeout.
    #[error("timed out")]
    Timeout,
    /// Another I/O error.
    #[error("i/o error: {0}")]
    Io(io::Error),
}

impl From<io::Error> for TextClientError {
    fn from(e: io::Error) -> TextClientError {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => TextClientError::Timeout,
            io::ErrorKind::UnexpectedEof => TextClientError::Closed,
            _ => TextClientError::Io(e),
        }
    }
}

/// How [`TextClient::connect_with`] reaches the server besides its address.
#[derive(Debug, Clone, Default)]
pub struct TextClientOptions {
    /// TLS: the client configuration (trusted CAs, a client certificate)
    /// and the name the server's certificate must carry.
    pub tls: Option<(Arc<ClientConfig>, ServerName<'static>)>,
    /// A token sent as `AUTH <token>` first (never logged).
    pub token: Option<Secret>,
}

/// The byte stream under a client: plain TCP or TLS over it.
#[derive(Debug)]
enum Link {
    Plain(TcpStream),
    Tls(Box<StreamOwned<ClientConnection, TcpStream>>),
}

impl Link {
    /// The socket (for its timeouts).
    fn sock(&self) -> &TcpStream {
        match self {
            Link::Plain(s) => s,
            Link::Tls(t) => &t.sock,
        }
    }
}

impl Read for Link {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Link::Plain(s) => s.read(buf),
            Link::Tls(t) => match t.read(buf) {
                // A server that closes without close_notify (as emq does
                // after ERR BUSY) ends the stream like a plain one.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(0),
                other => other,
            },
        }
    }
}

impl Write for Link {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Link::Plain(s) => s.write(buf),
            Link::Tls(t) => t.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Link::Plain(s) => s.flush(),
            Link::Tls(t) => t.flush(),
        }
    }
}

/// A text-protocol connection.
///
/// ```no_run
/// use std::time::Duration;
/// use emq::client::text::TextClient;
///
/// let mut c = TextClient::connect("127.0.0.1:47294", Duration::from_secs(5))?;
/// c.sched(b"{\"to\":\"a@b.c\"}", Some("EMAILSERVICE"))?;
/// if let Some(task) = c.ask("EMAILSERVICE")? {
///     println!("{}", String::from_utf8_lossy(&task));
///     c.ack()?;
/// }
/// c.end()?; // fails with Deferred if an earlier SCHED or ACK was refused
/// # Ok::<(), emq::client::text::TextClientError>(())
/// ```
#[derive(Debug)]
pub struct TextClient {
    /// The stream, read through the buffer and written directly.
    reader: BufReader<Link>,
    out: Vec<u8>,
    /// Write-only commands were sent since the last barrier.
    unsynced: bool,
    deferred: Vec<ServerError>,
}

impl TextClient {
    /// Connects to `addr` (each resolved address in turn); `timeout` bounds
    /// the connect and every later read and write.
    ///
    /// # Errors
    /// [`TextClientError::Io`] or [`TextClientError::Timeout`].
    pub fn connect(addr: impl ToSocketAddrs, timeout: Duration) -> Result<TextClient, TextClientError> {
        TextClient::connect_with(addr, timeout, &TextClientOptions::default())
    }

    /// [`TextClient::connect`] with TLS and a token (see the module docs).
    ///
    /// # Errors
    /// [`TextClientError::Io`] or [`TextClientError::Timeout`]; a failed TLS
    /// handshake (an untrusted or misnamed certificate, a client
    /// certificate refused) as `Io` with rustls's reason.
    pub fn connect_with(
        addr: impl ToSocketAddrs,
        timeout: Duration,
        options: &TextClientOptions,
    ) -> Result<TextClient, TextClientError> {
        let mut last = io::Error::new(io::ErrorKind::InvalidInput, "no address to connect to");
        let addrs: Vec<SocketAddr> = addr.to_socket_addrs()?.collect();
        for a in addrs {
            match TcpStream::connect_timeout(&a, timeout) {
                Ok(stream) => return TextClient::from_stream(stream, timeout, options),
                Err(e) => last = e,
            }
        }
        Err(last.into())
    }

    fn from_stream(
        stream: TcpStream,
        timeout: Duration,
        options: &TextClientOptions,
    ) -> Result<TextClient, TextClientError> {
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        let link = match &options.tls {
            None => Link::Plain(stream),
            Some((config, name)) => {
                let conn = ClientConnection::new(config.clone(), name.clone())
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
                let mut tls = StreamOwned::new(conn, stream);
                while tls.conn.is_handshaking() {
                    tls.conn.complete_io(&mut tls.sock)?;
                }
                Link::Tls(Box::new(tls))
            }
        };
        let mut client =
            TextClient { reader: BufReader::new(link), out: Vec::new(), unsynced: false, deferred: Vec::new() };
        if let Some(token) = &options.token {
            client.send(TextCommand::Auth { token: token.clone() })?;
            // Nothing is answered to a good AUTH: not a write-only command
            // whose ERR would be deferred.
            client.unsynced = false;
        }
        Ok(client)
    }

    /// Sends `SCHED <data>[@<queue>]` (`None`: the `default` queue). Writes
    /// only; see the module docs for how a refusal surfaces.
    ///
    /// # Errors
    /// [`TextClientError::Encode`] for empty data, data with an LF, or an
    /// invalid queue name (nothing is sent); I/O errors; when the server
    /// closed the connection, what it said before (`Server` for `ERR BUSY`;
    /// see the module docs).
    pub fn sched(&mut self, data: &[u8], queue: Option<&str>) -> Result<(), TextClientError> {
        self.pipeline_sched([(data, queue)])
    }

    /// Sends many SCHED lines in one write (for throughput). Either every
    /// line is encoded and written, or (on an encoding error) none is.
    ///
    /// # Errors
    /// As [`TextClient::sched`].
    pub fn pipeline_sched<'a>(
        &mut self,
        tasks: impl IntoIterator<Item = (&'a [u8], Option<&'a str>)>,
    ) -> Result<(), TextClientError> {
        self.out.clear();
        for (data, queue) in tasks {
            let queue = queue.unwrap_or(limits::DEFAULT_QUEUE).to_string();
            encode_command(&mut self.out, &TextCommand::Sched { data: data.to_vec(), queue })?;
        }
        self.write_out(true)
    }

    /// Sends `ASK <queue>` and reads its answer: `Some(data)` for
    /// `WANT? <data>` (the connection now holds the offer), `None` for `NOPE`.
    ///
    /// # Errors
    /// [`TextClientError::Server`] for `ERR` (`PENDING` when an offer is
    /// still held); `Encode` for an invalid queue name; `Protocol`, `Closed`,
    /// `Timeout`, `Io`. Errors of earlier write-only commands are deferred.
    pub fn ask(&mut self, queue: &str) -> Result<Option<Vec<u8>>, TextClientError> {
        self.ask_command(&TextCommand::Ask { queue: queue.to_string() }, Duration::ZERO)
    }

    /// Sends the long-poll `ASK <queue> <ms>` (text-protocol.md "Extension:
    /// long-poll ASK"): the server answers when a task arrives, or `NOPE`
    /// once `wait` (whole milliseconds) has passed. The answer may take
    /// `wait` longer than the client's timeout. As [`TextClient::ask`]
    /// otherwise.
    ///
    /// # Errors
    /// As [`TextClient::ask`]; `ERR BAD_FORMAT` when `wait` exceeds the
    /// server's `text_max_ask_wait`.
    pub fn ask_wait(&mut self, queue: &str, wait: Duration) -> Result<Option<Vec<u8>>, TextClientError> {
        let wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        self.ask_command(&TextCommand::AskWait { queue: queue.to_string(), wait_ms }, wait)
    }

    fn ask_command(&mut self, command: &TextCommand, wait: Duration) -> Result<Option<Vec<u8>>, TextClientError> {
        self.out.clear();
        let barrier = self.unsynced;
        if barrier {
            self.out.extend_from_slice(BARRIER);
        }
        encode_command(&mut self.out, command)?;
        self.write_out(false)?;
        if barrier {
            self.read_to_barrier()?;
        }
        let timeout = self.sock().read_timeout()?;
        if !wait.is_zero() {
            self.sock().set_read_timeout(timeout.map(|t| t.saturating_add(wait)))?;
        }
        let line = self.read_server_line();
        if !wait.is_zero() {
            self.sock().set_read_timeout(timeout)?;
        }
        match line? {
            ServerLine::Want(data) => Ok(Some(data)),
            ServerLine::Nope => Ok(None),
            ServerLine::Err { code, text } => Err(TextClientError::Server { code, text }),
        }
    }

    /// Sends `ACK` (write only).
    ///
    /// # Errors
    /// I/O errors; when the server closed the connection, what it said
    /// before (`Server` for `ERR BUSY`; see the module docs).
    pub fn ack(&mut self) -> Result<(), TextClientError> {
        self.send(TextCommand::Ack)
    }

    /// Sends `DCL` (write only).
    ///
    /// # Errors
    /// I/O errors; when the server closed the connection, what it said
    /// before (`Server` for `ERR BUSY`; see the module docs).
    pub fn dcl(&mut self) -> Result<(), TextClientError> {
        self.send(TextCommand::Dcl)
    }

    /// Sends `DEL` (write only).
    ///
    /// # Errors
    /// I/O errors; when the server closed the connection, what it said
    /// before (`Server` for `ERR BUSY`; see the module docs).
    pub fn del(&mut self) -> Result<(), TextClientError> {
        self.send(TextCommand::Del)
    }

    /// Waits until the server has handled every command sent so far.
    ///
    /// # Errors
    /// [`TextClientError::Deferred`] with every `ERR` for earlier write-only
    /// commands (then cleared); `Server` for `ERR BUSY`; I/O errors.
    pub fn sync(&mut self) -> Result<(), TextClientError> {
        if self.unsynced {
            self.out.clear();
            self.out.extend_from_slice(BARRIER);
            self.write_out(false)?;
            self.read_to_barrier()?;
        }
        self.deferred_result()
    }

    /// Sends `END` and reads until the server closes the connection.
    ///
    /// # Errors
    /// [`TextClientError::Deferred`] as [`TextClient::sync`]; `Server` for
    /// `ERR BUSY` (a connection the server refused); I/O errors.
    pub fn end(mut self) -> Result<(), TextClientError> {
        self.out.clear();
        self.out.extend_from_slice(b"END\n");
        self.write_out(false)?;
        loop {
            match self.read_server_line() {
                Ok(ServerLine::Err {
                    code: code @ (ErrorCode::Busy | ErrorCode::NoAuth | ErrorCode::AuthFailed),
                    text,
                }) => return Err(TextClientError::Server { code, text }),
                Ok(ServerLine::Err { code, text }) => self.deferred.push(ServerError { code, text }),
                Ok(other) => return Err(TextClientError::Protocol(format!("unexpected {other:?} after END"))),
                Err(TextClientError::Closed) => return self.deferred_result(),
                Err(e) => return Err(e),
            }
        }
    }

    /// Takes the deferred errors read so far (see the module docs).
    pub fn take_deferred(&mut self) -> Vec<ServerError> {
        std::mem::take(&mut self.deferred)
    }

    fn deferred_result(&mut self) -> Result<(), TextClientError> {
        if self.deferred.is_empty() {
            Ok(())
        } else {
            Err(TextClientError::Deferred(self.take_deferred()))
        }
    }

    fn send(&mut self, command: TextCommand) -> Result<(), TextClientError> {
        self.out.clear();
        encode_command(&mut self.out, &command)?;
        self.write_out(true)
    }

    /// Whether the server has closed this connection (or it broke) while
    /// the client was idle: a non-blocking peek at the socket reads its end
    /// (or an error). `false` while bytes wait unread (an `ERR` line, read
    /// at the next reading call) or nothing came. A caller reusing an idle
    /// connection asks first, so that a command is not written into a
    /// connection the server already closed ([`super::text_spread`]).
    pub fn peer_closed(&self) -> bool {
        let sock = self.sock();
        if sock.set_nonblocking(true).is_err() {
            return true;
        }
        let mut byte = [0u8; 1];
        let closed = match sock.peek(&mut byte) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted),
        };
        sock.set_nonblocking(false).is_err() || closed
    }

    /// The socket under the stream.
    fn sock(&self) -> &TcpStream {
        self.reader.get_ref().sock()
    }

    fn write_out(&mut self, write_only: bool) -> Result<(), TextClientError> {
        let link = self.reader.get_mut();
        if let Err(e) = link.write_all(&self.out).and_then(|()| link.flush()) {
            return Err(self.closed_by_server(e));
        }
        self.unsynced |= write_only;
        Ok(())
    }

    /// The error of a failed write: when the server closed the connection
    /// (`EPIPE`, `ECONNRESET`), what it wrote before closing, read to the
    /// end (at most [`limits::TEXT_CLIENT_LINES_AFTER_CLOSE`] lines, each
    /// read within the client's timeout): its `ERR BUSY` as
    /// [`TextClientError::Server`], else its `ERR` lines for earlier
    /// write-only commands as [`TextClientError::Deferred`], else `e`.
    fn closed_by_server(&mut self, e: io::Error) -> TextClientError {
        use io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset};
        if !matches!(e.kind(), BrokenPipe | ConnectionReset | ConnectionAborted) {
            return e.into();
        }
        for _ in 0..limits::TEXT_CLIENT_LINES_AFTER_CLOSE {
            match self.read_server_line() {
                Ok(ServerLine::Err {
                    code: code @ (ErrorCode::Busy | ErrorCode::NoAuth | ErrorCode::AuthFailed),
                    text,
                }) => return TextClientError::Server { code, text },
                // The barrier's answer (the client sends no other bad line).
                Ok(ServerLine::Err { code: ErrorCode::BadFormat, .. }) => {}
                Ok(ServerLine::Err { code, text }) => self.deferred.push(ServerError { code, text }),
                // An answer nobody waits for any more; read on.
                Ok(ServerLine::Want(_) | ServerLine::Nope) => {}
                Err(_) => break,
            }
        }
        if self.deferred.is_empty() {
            e.into()
        } else {
            TextClientError::Deferred(self.take_deferred())
        }
    }

    /// Reads lines up to the barrier's `ERR BAD_FORMAT`, deferring the
    /// `ERR` lines before it.
    fn read_to_barrier(&mut self) -> Result<(), TextClientError> {
        loop {
            match self.read_server_line()? {
                ServerLine::Err { code: ErrorCode::BadFormat, .. } => {
                    self.unsynced = false;
                    return Ok(());
                }
                ServerLine::Err {
                    code: code @ (ErrorCode::Busy | ErrorCode::NoAuth | ErrorCode::AuthFailed),
                    text,
                } => return Err(TextClientError::Server { code, text }),
                ServerLine::Err { code, text } => self.deferred.push(ServerError { code, text }),
                other => return Err(TextClientError::Protocol(format!("unexpected {other:?} before the barrier"))),
            }
        }
    }

    /// Reads one server line. The socket's read timeout (the client's
    /// timeout, plus a long poll's wait) bounds the whole line, not each
    /// read: a server sending a byte at a time cannot hold the caller
    /// past it.
    fn read_server_line(&mut self) -> Result<ServerLine, TextClientError> {
        let limit = self.sock().read_timeout()?;
        let deadline = limit.and_then(|t| Instant::now().checked_add(t));
        let line = self.read_line_by(deadline);
        if deadline.is_some() {
            self.sock().set_read_timeout(limit)?;
        }
        let line = line?;
        parse_server_line(&line).map_err(|e| TextClientError::Protocol(e.to_string()))
    }

    /// The bytes of the next line, without its LF, read before `deadline`.
    fn read_line_by(&mut self, deadline: Option<Instant>) -> Result<Vec<u8>, TextClientError> {
        let mut line = Vec::new();
        loop {
            if let Some(deadline) = deadline {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(TextClientError::Timeout);
                }
                self.sock().set_read_timeout(Some(left))?;
            }
            let buf = match self.reader.fill_buf() {
                Ok(buf) => buf,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e.into()),
            };
            if buf.is_empty() {
                return Err(TextClientError::Closed);
            }
            let (take, done) = match memchr::memchr(b'\n', buf) {
                Some(lf) => (lf, true),
                None => (buf.len(), false),
            };
            line.extend_from_slice(&buf[..take]);
            self.reader.consume(take + usize::from(done));
            if done {
                return Ok(line);
            }
            if line.len() as u64 >= limits::TEXT_CLIENT_MAX_LINE_BYTES {
                return Err(TextClientError::Protocol("server line too long".into()));
            }
        }
    }
}
