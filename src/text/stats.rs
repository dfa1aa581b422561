//! Counters of the text connections for STATUS, readable from any thread.
//! What happens to offers (answered, returned by disconnect or timeout,
//! dead-lettered) is counted once, by whoever holds them (the shards'
//! [`crate::metrics::counters::Counters`]).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::protocol::text::ErrorCode;

/// Live counters, updated by the text I/O threads with relaxed atomics.
/// Read them with [`TextStats::snapshot`].
#[derive(Debug, Default)]
pub struct TextStats {
    /// Connections open now (gauge).
    pub connections_open: AtomicU64,
    /// Connections accepted since start (including those refused with BUSY).
    pub connections_total: AtomicU64,
    /// Offers held by connections now (gauge; an offer leaves it when it is
    /// answered, released, or its deadline passes).
    pub offers_held: AtomicU64,
    /// Offers whose data had CR or LF bytes written as spaces.
    pub offers_rewritten: AtomicU64,
    /// Connections closed because a line was not complete within
    /// `text_line_timeout` of its first byte.
    pub line_timeout_closed: AtomicU64,
    /// Connections closed because they held more than
    /// `text_max_unsent_bytes` of replies they did not read.
    pub slow_reader_closed: AtomicU64,
    /// Connections refused with `ERR BUSY` because fewer than
    /// `text_reserved_fds` descriptors were left (also in `errors` BUSY).
    pub refused_fds: AtomicU64,
    /// Bytes of input held now for all connections that have not run yet:
    /// partial lines, bytes read but not decoded, commands held back behind
    /// an unanswered ASK (gauge). At most
    /// `text_max_buffered_bytes` plus one read (64 KiB) per I/O thread.
    pub buffered_bytes: AtomicU64,
    /// The most [`TextStats::buffered_bytes`] has been since start.
    pub buffered_bytes_peak: AtomicU64,
    /// Times a connection stopped being read because the input budget
    /// (`text_max_buffered_bytes`) was spent, its next line was not
    /// complete in its socket and another connection had the lead (once
    /// per wait: it is read again when the total falls or the lead is
    /// free, or its line times out).
    pub reads_paused: AtomicU64,
    /// Failed `accept` calls (logged at most once a second).
    pub accept_errors: AtomicU64,
    /// The process's descriptor limit (`RLIMIT_NOFILE`, soft) when the text
    /// front end started.
    pub fd_limit: AtomicU64,
    /// Connections accepted on the `text_tls` listener (also in
    /// [`TextStats::connections_total`]).
    pub tls_connections_total: AtomicU64,
    /// TLS handshakes that finished.
    pub tls_handshakes: AtomicU64,
    /// TLS connections closed before their handshake finished: bytes that
    /// are not TLS (a plain-TCP client on the TLS port), a failed
    /// verification (no or a wrong client certificate with
    /// `text_tls_client_ca_file`), no shared protocol version or cipher,
    /// the peer closing, or `text_tls_handshake_timeout` passing.
    pub tls_handshake_failures: AtomicU64,
    /// Connections that sent a valid `AUTH <token>`.
    pub auth_ok: AtomicU64,
    /// Connections closed after an `AUTH` with a token not in the tokens
    /// file (`ERR AUTH_FAILED`).
    pub auth_failed: AtomicU64,
    /// Connections closed because their first command was not `AUTH`
    /// while tokens are required (`ERR NOAUTH`).
    pub auth_noauth: AtomicU64,
    /// Barrier lines answered (`ASK !sync`, [`crate::protocol::text::BARRIER_LINE`]):
    /// an `ERR BAD_FORMAT` a client asked for, not counted in `errors`.
    pub barriers: AtomicU64,
    /// `ERR` lines written, by code ([`ErrorCode::index`]), barriers' answers
    /// left out.
    pub errors: [AtomicU64; ErrorCode::ALL.len()],
}

/// A plain copy of [`TextStats`] at one moment.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TextStatsSnapshot {
    /// See [`TextStats::connections_open`].
    pub connections_open: u64,
    /// See [`TextStats::connections_total`].
    pub connections_total: u64,
    /// See [`TextStats::offers_held`].
    pub offers_held: u64,
    /// See [`TextStats::offers_rewritten`].
    pub offers_rewritten: u64,
    /// See [`TextStats::line_timeout_closed`].
    pub line_timeout_closed: u64,
    /// See [`TextStats::slow_reader_closed`].
    pub slow_reader_closed: u64,
    /// See [`TextStats::refused_fds`].
    pub refused_fds: u64,
    /// See [`TextStats::buffered_bytes`].
    pub buffered_bytes: u64,
    /// See [`TextStats::buffered_bytes_peak`].
    pub buffered_bytes_peak: u64,
    /// See [`TextStats::reads_paused`].
    pub reads_paused: u64,
    /// See [`TextStats::accept_errors`].
    pub accept_errors: u64,
    /// See [`TextStats::fd_limit`].
    pub fd_limit: u64,
    /// See [`TextStats::tls_connections_total`].
    pub tls_connections_total: u64,
    /// See [`TextStats::tls_handshakes`].
    pub tls_handshakes: u64,
    /// See [`TextStats::tls_handshake_failures`].
    pub tls_handshake_failures: u64,
    /// See [`TextStats::auth_ok`].
    pub auth_ok: u64,
    /// See [`TextStats::auth_failed`].
    pub auth_failed: u64,
    /// See [`TextStats::auth_noauth`].
    pub auth_noauth: u64,
    /// Barrier lines answered.
    pub barriers: u64,
    /// `(code token, count)` for every code, in [`ErrorCode::ALL`] order.
    pub errors: Vec<(&'static str, u64)>,
}

impl TextStats {
    /// Counts one `ERR` line with `code`.
    pub fn count_error(&self, code: ErrorCode) {
        self.errors[code.index()].fetch_add(1, Relaxed);
    }

    /// `ERR` lines written with `code` so far.
    pub fn errors(&self, code: ErrorCode) -> u64 {
        self.errors[code.index()].load(Relaxed)
    }

    /// Adds one to a counter (shorthand for the relaxed `fetch_add`).
    pub(crate) fn inc(counter: &AtomicU64) {
        counter.fetch_add(1, Relaxed);
    }

    /// Takes one from a gauge.
    pub(crate) fn dec(counter: &AtomicU64) {
        counter.fetch_sub(1, Relaxed);
    }

    /// Copies every counter.
    pub fn snapshot(&self) -> TextStatsSnapshot {
        TextStatsSnapshot {
            connections_open: self.connections_open.load(Relaxed),
            connections_total: self.connections_total.load(Relaxed),
            offers_held: self.offers_held.load(Relaxed),
            offers_rewritten: self.offers_rewritten.load(Relaxed),
            line_timeout_closed: self.line_timeout_closed.load(Relaxed),
            slow_reader_closed: self.slow_reader_closed.load(Relaxed),
            refused_fds: self.refused_fds.load(Relaxed),
            buffered_bytes: self.buffered_bytes.load(Relaxed),
            buffered_bytes_peak: self.buffered_bytes_peak.load(Relaxed),
            reads_paused: self.reads_paused.load(Relaxed),
            accept_errors: self.accept_errors.load(Relaxed),
            fd_limit: self.fd_limit.load(Relaxed),
            tls_connections_total: self.tls_connections_total.load(Relaxed),
            tls_handshakes: self.tls_handshakes.load(Relaxed),
            tls_handshake_failures: self.tls_handshake_failures.load(Relaxed),
            auth_ok: self.auth_ok.load(Relaxed),
            auth_failed: self.auth_failed.load(Relaxed),
            auth_noauth: self.auth_noauth.load(Relaxed),
            barriers: self.barriers.load(Relaxed),
            errors: ErrorCode::ALL.iter().map(|&c| (c.as_str(), self.errors(c))).collect(),
        }
    }
}
