//! The text protocol's pure parts (docs/text-protocol.md): the incremental line
//! decoder, command parsing, and the encoders and decoders for both
//! directions. No sockets, no clocks.
//!
//! * [`LineDecoder`]: bytes in any chunking → [`TextCommand`]s or
//!   [`TextError`]s, in order; over-long lines are cut off as they stream in.
//! * [`parse_command`]: one line (without its LF and CR) → command.
//! * [`encode_want`], [`encode_nope`], [`encode_err`]: server lines.
//! * [`encode_command`], [`parse_server_line`]: the client side.

mod command;
mod encode;
mod line;

pub use command::{
    parse_command, split_queue, valid_queue_name, Secret, TextCommand, TextError, BARRIER_LINE, MAX_QUEUE_NAME_BYTES,
};
pub use encode::{
    encode_command, encode_err, encode_nope, encode_want, parse_server_line, EncodeError, ServerLine, ServerLineError,
};
pub use line::LineDecoder;

/// The stable error tokens of `ERR <CODE> <text>` (docs/text-protocol.md,
/// "Answers and errors"). The first three come from the decoder; the others from the
/// server and its queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// The keyword is not a command.
    UnknownCommand,
    /// A known keyword with a malformed argument.
    BadFormat,
    /// The line exceeds the maximum line length; it is discarded.
    TooBig,
    /// ACK, DCL or DEL while this connection holds no offer.
    NoTask,
    /// ASK while this connection still holds an offer.
    Pending,
    /// SCHED into a queue at its limit; the task is not stored.
    QueueFull,
    /// The broker is draining; the task is not stored.
    ShuttingDown,
    /// Too many connections (or too few descriptors left); sent once, then
    /// the connection is closed.
    Busy,
    /// ASK (or SCHED) naming a new queue while the broker holds its most
    /// queue names; nothing is stored.
    QueueLimit,
    /// SCHED while the job log is out of space (or below
    /// `disk_free_limit`); the task is not stored.
    StoreFull,
    /// SCHED while the job log cannot be written (read-only, failing, its
    /// directory gone, stalled); the task is not stored.
    StoreFailed,
    /// A command other than `AUTH` came first on a connection that must
    /// authenticate (`text_auth_tokens_file`); the connection is closed.
    NoAuth,
    /// `AUTH` with a token that is not in the tokens file; the connection
    /// is closed (one try per connection).
    AuthFailed,
}

impl ErrorCode {
    /// Every code, in the spec's table order (for counters indexed by code).
    pub const ALL: [ErrorCode; 13] = [
        ErrorCode::UnknownCommand,
        ErrorCode::BadFormat,
        ErrorCode::TooBig,
        ErrorCode::NoTask,
        ErrorCode::Pending,
        ErrorCode::QueueFull,
        ErrorCode::ShuttingDown,
        ErrorCode::Busy,
        ErrorCode::QueueLimit,
        ErrorCode::StoreFull,
        ErrorCode::StoreFailed,
        ErrorCode::NoAuth,
        ErrorCode::AuthFailed,
    ];

    /// The token as written on the wire, e.g. `"NO_TASK"`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::UnknownCommand => "UNKNOWN_COMMAND",
            ErrorCode::BadFormat => "BAD_FORMAT",
            ErrorCode::TooBig => "TOO_BIG",
            ErrorCode::NoTask => "NO_TASK",
            ErrorCode::Pending => "PENDING",
            ErrorCode::QueueFull => "QUEUE_FULL",
            ErrorCode::ShuttingDown => "SHUTTING_DOWN",
            ErrorCode::Busy => "BUSY",
            ErrorCode::QueueLimit => "QUEUE_LIMIT",
            ErrorCode::StoreFull => "STORE_FULL",
            ErrorCode::StoreFailed => "STORE_FAILED",
            ErrorCode::NoAuth => "NOAUTH",
            ErrorCode::AuthFailed => "AUTH_FAILED",
        }
    }

    /// The code for a wire token (exact, upper case), or `None`.
    pub fn from_token(token: &[u8]) -> Option<ErrorCode> {
        ErrorCode::ALL.into_iter().find(|c| c.as_str().as_bytes() == token)
    }

    /// Position in [`ErrorCode::ALL`] (0..13).
    pub fn index(self) -> usize {
        self as usize
    }

    /// The default human text written after the code, e.g. for `NO_TASK`
    /// "no task is offered on this connection" (the spec's example session).
    pub fn default_text(self) -> &'static str {
        match self {
            ErrorCode::UnknownCommand => "unknown command",
            ErrorCode::BadFormat => "malformed argument",
            ErrorCode::TooBig => "line too long",
            ErrorCode::NoTask => "no task is offered on this connection",
            ErrorCode::Pending => "this connection still holds an offer",
            ErrorCode::QueueFull => "the queue is full",
            ErrorCode::ShuttingDown => "the broker is shutting down",
            ErrorCode::Busy => "too many connections",
            ErrorCode::QueueLimit => "too many queue names",
            ErrorCode::StoreFull => "the job log is out of space; the task is not stored",
            ErrorCode::StoreFailed => "the job log cannot be written; the task is not stored",
            ErrorCode::NoAuth => "authenticate first: AUTH <token>",
            ErrorCode::AuthFailed => "the token is not valid",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::ErrorCode;

    #[test]
    fn error_code_tokens_and_indexes() {
        for (i, code) in ErrorCode::ALL.into_iter().enumerate() {
            assert_eq!(code.index(), i);
            assert_eq!(ErrorCode::from_token(code.as_str().as_bytes()), Some(code));
        }
        assert_eq!(ErrorCode::from_token(b"no_task"), None);
        let tokens: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        let want = [
            "UNKNOWN_COMMAND",
            "BAD_FORMAT",
            "TOO_BIG",
            "NO_TASK",
            "PENDING",
            "QUEUE_FULL",
            "SHUTTING_DOWN",
            "BUSY",
            "QUEUE_LIMIT",
            "STORE_FULL",
            "STORE_FAILED",
            "NOAUTH",
            "AUTH_FAILED",
        ];
        assert_eq!(tokens, want);
    }
}
