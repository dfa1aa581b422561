//! One line → one command (text-protocol.md "Commands", "Queue names and the
//! `@` rule").

use super::ErrorCode;
use crate::limits;

/// Longest queue name in bytes (text-protocol.md: 1 to 255 bytes), the
/// same for both protocols.
pub const MAX_QUEUE_NAME_BYTES: usize = limits::MAX_QUEUE_NAME_BYTES;

/// Most bytes of an unknown keyword quoted back in the error text.
const QUOTED_KEYWORD_BYTES: usize = 32;

/// A command from a text client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TextCommand {
    /// `SCHED <data>[@<queue>]`: add a task. `data` is never empty; `queue`
    /// is a valid queue name (`default` when the line names none).
    Sched {
        /// The task's bytes, exactly as sent (any byte but LF).
        data: Vec<u8>,
        /// The target queue.
        queue: String,
    },
    /// `ASK [<queue>]`: ask for the oldest task of `queue` (`default` when
    /// the line names none).
    Ask {
        /// The queue asked for, a valid queue name.
        queue: String,
    },
    /// `ASK <queue> <ms>` (long poll, text-protocol.md "Extension: long-poll
    /// ASK"): like `ASK <queue>`, but with no task waiting the answer comes
    /// when one arrives, or as `NOPE` after `wait_ms` milliseconds.
    AskWait {
        /// The queue asked for, a valid queue name.
        queue: String,
        /// How long to wait at most, in milliseconds (0: answer at once).
        wait_ms: u64,
    },
    /// `ACK`: accept the offered task.
    Ack,
    /// `DCL`: decline the offered task (it moves to the back of its queue).
    Dcl,
    /// `DEL`: delete the offered task.
    Del,
    /// `END`: end the session.
    End,
    /// `AUTH <token>`: authenticate the connection (text-protocol.md
    /// "Authentication"); only as its first command, when the router has
    /// `text_auth_tokens_file`.
    Auth {
        /// The token as sent (never logged: its `Debug` hides it).
        token: Secret,
    },
}

/// Bytes that must never reach a log: `Debug` prints their length only.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret({} bytes)", self.0.len())
    }
}

/// The clients' *barrier* line (with its LF): an ASK for the name `!sync`,
/// which is no queue name (`!` is not a queue-name byte), so every server
/// answers it `ERR BAD_FORMAT` in its place after the replies of the
/// commands before it, with no change of state (the format error wins over
/// `PENDING`). emq's text client and emq-bench write it to learn that
/// every write-only command before it was answered (docs/text-protocol.md,
/// "The clients' barrier"). emq counts it apart from the errors
/// ([`TextError::Barrier`]).
pub const BARRIER_LINE: &[u8] = b"ASK !sync\n";

/// A line the decoder rejects. [`TextError::code`] gives the wire token;
/// `Display` gives the human text written after it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TextError {
    /// The keyword is not one of SCHED, ASK, ACK, DCL, DEL, END.
    #[error("unknown command \"{keyword}\"")]
    UnknownCommand {
        /// The keyword, ASCII-escaped and cut to 32 bytes (safe to write back).
        keyword: String,
    },
    /// A known keyword with a malformed argument.
    #[error("{why}")]
    BadFormat {
        /// What is wrong, e.g. "SCHED needs data".
        why: &'static str,
    },
    /// The line starts with a space or tab (text-protocol.md "Lines": the
    /// command word comes first, and spaces only separate it from its
    /// argument). Answered with `UNKNOWN_COMMAND`, like any line whose first
    /// word is not a command, but saying why, where the keyword would be
    /// empty or begin with the tab.
    #[error("the line starts with {what}: write the command first (SCHED, ASK, ACK, DCL, DEL or END)")]
    LeadingSpace {
        /// `a space`, `a tab`, or `whitespace` (another ASCII white-space byte).
        what: &'static str,
    },
    /// An HTTP request line or `Host:` field: a web page making a browser
    /// post to the text port (cross-protocol request forgery, the attack
    /// Redis closes connections for). Answered with `UNKNOWN_COMMAND`, and
    /// the connection is closed before any later line runs.
    #[error("an HTTP request on the text port: closing the connection (nothing after this line is run)")]
    Http,
    /// Exactly [`BARRIER_LINE`]: answered `BAD_FORMAT` like any invalid
    /// queue name, but a client's barrier, not its mistake, so the server
    /// counts it apart from the `ERR` lines by code.
    #[error("invalid queue name (\"!sync\" is the clients' barrier, answered so on purpose)")]
    Barrier,
    /// The line is longer than the limit; it is discarded.
    #[error("line longer than {max_line_bytes} bytes")]
    TooBig {
        /// The limit in bytes (not counting LF and a CR before it).
        max_line_bytes: usize,
    },
}

impl TextError {
    /// The wire token for this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            TextError::UnknownCommand { .. } | TextError::LeadingSpace { .. } | TextError::Http => {
                ErrorCode::UnknownCommand
            }
            TextError::BadFormat { .. } | TextError::Barrier => ErrorCode::BadFormat,
            TextError::TooBig { .. } => ErrorCode::TooBig,
        }
    }
}

/// Whether `name` is a valid queue name: 1 to 255 bytes from
/// `A-Z a-z 0-9 _ - . :` (text-protocol.md "Queue names").
pub fn valid_queue_name(name: &[u8]) -> bool {
    !name.is_empty()
        && name.len() <= MAX_QUEUE_NAME_BYTES
        && name.iter().all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'))
}

/// Splits a SCHED argument by the `@` rule: the queue is the text after the
/// last `@` when it is a valid queue name; otherwise the whole argument is
/// data and the queue is `default`. Returns `(data, queue)`.
///
/// ```
/// use emq::protocol::text::split_queue;
/// assert_eq!(split_queue(b"x@q"), (&b"x"[..], "q"));
/// assert_eq!(split_queue(b"{\"to\":\"a@b.c\"}"), (&b"{\"to\":\"a@b.c\"}"[..], "default"));
/// ```
pub fn split_queue(arg: &[u8]) -> (&[u8], &str) {
    if let Some(at) = memchr::memrchr(b'@', arg) {
        let suffix = &arg[at + 1..];
        if valid_queue_name(suffix) {
            // Valid names are ASCII, so this cannot fail.
            if let Ok(queue) = std::str::from_utf8(suffix) {
                return (&arg[..at], queue);
            }
        }
    }
    (arg, limits::DEFAULT_QUEUE)
}

/// Parses one line: the bytes before the LF, with a CR right before the LF
/// already removed. Returns `None` for a line that is empty or holds only
/// spaces and tabs (ignored by the spec).
///
/// The keyword is the text before the first space, compared without regard
/// to case; the argument is everything after that one space, and an empty
/// argument counts as none.
///
/// # Errors
/// [`TextError::UnknownCommand`] for any other keyword (including the server
/// words `WANT?` and `NOPE`); [`TextError::BadFormat`] for SCHED without data,
/// ASK with an invalid queue name, or an argument after ACK, DCL, DEL or END.
pub fn parse_command(line: &[u8]) -> Option<Result<TextCommand, TextError>> {
    if line.iter().all(|&b| b == b' ' || b == b'\t') {
        return None;
    }
    let (keyword, arg) = match memchr::memchr(b' ', line) {
        Some(sp) => (&line[..sp], &line[sp + 1..]),
        None => (line, &line[line.len()..]),
    };
    Some(match_keyword(keyword, arg))
}

fn match_keyword(keyword: &[u8], arg: &[u8]) -> Result<TextCommand, TextError> {
    let is = |k: &[u8]| keyword.eq_ignore_ascii_case(k);
    if is(b"SCHED") {
        parse_sched(arg)
    } else if is(b"ASK") {
        parse_ask(arg)
    } else if is(b"ACK") {
        no_argument(arg, TextCommand::Ack)
    } else if is(b"DCL") {
        no_argument(arg, TextCommand::Dcl)
    } else if is(b"DEL") {
        no_argument(arg, TextCommand::Del)
    } else if is(b"END") {
        no_argument(arg, TextCommand::End)
    } else if is(b"AUTH") {
        // Spaces and tabs around the token are not part of it.
        match arg.trim_ascii() {
            [] => Err(TextError::BadFormat { why: "AUTH needs a token" }),
            token => Ok(TextCommand::Auth { token: Secret(token.to_vec()) }),
        }
    } else if is_http(keyword, arg) {
        Err(TextError::Http)
    } else if let Some(what) = leading_space(keyword) {
        Err(TextError::LeadingSpace { what })
    } else {
        let quoted = &keyword[..keyword.len().min(QUOTED_KEYWORD_BYTES)];
        Err(TextError::UnknownCommand { keyword: quoted.escape_ascii().to_string() })
    }
}

/// What white space a keyword starts with, if it does: a line that starts
/// with a space has an empty keyword, one that starts with a tab a keyword
/// beginning with it.
fn leading_space(keyword: &[u8]) -> Option<&'static str> {
    match keyword.first() {
        None => Some("a space"),
        Some(b'\t') => Some("a tab"),
        Some(b) if b.is_ascii_whitespace() || *b == 0x0b => Some("whitespace"),
        Some(_) => None,
    }
}

/// Whether a line is an HTTP request line (`POST /x HTTP/1.1`: a method,
/// a target, an `HTTP/` version) or a `Host:` field: what a browser sends
/// first when a web page posts a form to the text port. No text command
/// looks like either.
fn is_http(keyword: &[u8], arg: &[u8]) -> bool {
    const METHODS: [&[u8]; 9] =
        [b"GET", b"POST", b"PUT", b"HEAD", b"DELETE", b"OPTIONS", b"PATCH", b"CONNECT", b"TRACE"];
    if keyword.eq_ignore_ascii_case(b"Host:") {
        return true;
    }
    let version = arg.iter().rposition(|&b| b == b' ').map_or(&b""[..], |sp| &arg[sp + 1..]);
    METHODS.iter().any(|m| keyword.eq_ignore_ascii_case(m)) && version.starts_with(b"HTTP/")
}

fn parse_sched(arg: &[u8]) -> Result<TextCommand, TextError> {
    let (data, queue) = split_queue(arg);
    if data.is_empty() {
        return Err(TextError::BadFormat { why: "SCHED needs data" });
    }
    Ok(TextCommand::Sched { data: data.to_vec(), queue: queue.to_string() })
}

/// Most digits of a long-poll wait: 19 always fit a `u64`.
const MAX_WAIT_DIGITS: usize = 19;

fn parse_ask(arg: &[u8]) -> Result<TextCommand, TextError> {
    if arg.is_empty() {
        return Ok(TextCommand::Ask { queue: limits::DEFAULT_QUEUE.to_string() });
    }
    if BARRIER_LINE.strip_prefix(b"ASK ").and_then(|b| b.strip_suffix(b"\n")) == Some(arg) {
        return Err(TextError::Barrier);
    }
    let (name, wait) = match memchr::memchr(b' ', arg) {
        Some(sp) => (&arg[..sp], Some(&arg[sp + 1..])),
        None => (arg, None),
    };
    let queue = match std::str::from_utf8(name) {
        Ok(queue) if valid_queue_name(name) => queue.to_string(),
        _ => return Err(TextError::BadFormat { why: "invalid queue name (1 to 255 bytes of A-Z a-z 0-9 _ - . :)" }),
    };
    // An empty wait (`ASK q ` with a trailing space) is no wait, as an
    // empty argument is no argument.
    let Some(wait) = wait.filter(|w| !w.is_empty()) else { return Ok(TextCommand::Ask { queue }) };
    if wait.len() > MAX_WAIT_DIGITS || !wait.iter().all(u8::is_ascii_digit) {
        return Err(TextError::BadFormat { why: "the wait of ASK <queue> <ms> is 1 to 19 digits" });
    }
    let wait_ms = wait.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    Ok(TextCommand::AskWait { queue, wait_ms })
}

fn no_argument(arg: &[u8], command: TextCommand) -> Result<TextCommand, TextError> {
    if arg.is_empty() {
        Ok(command)
    } else {
        Err(TextError::BadFormat { why: "this command takes no argument" })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sched(data: &[u8], queue: &str) -> Option<Result<TextCommand, TextError>> {
        Some(Ok(TextCommand::Sched { data: data.to_vec(), queue: queue.to_string() }))
    }

    fn code(line: &[u8]) -> ErrorCode {
        match parse_command(line) {
            Some(Err(e)) => e.code(),
            other => panic!("{line:?} gave {other:?}"),
        }
    }

    #[test]
    fn at_rule_table() {
        let email = br#"{ email: "test@test.de", message: "test message" }"#;
        let mut line = b"SCHED ".to_vec();
        line.extend_from_slice(email);
        line.extend_from_slice(b"@EMAILSERVICE");
        assert_eq!(parse_command(&line), sched(email, "EMAILSERVICE"));
        assert_eq!(parse_command(b"SCHED test"), sched(b"test", "default"));
        assert_eq!(parse_command(br#"SCHED {"to":"a@b.c"}"#), sched(br#"{"to":"a@b.c"}"#, "default"));
        assert_eq!(parse_command(b"SCHED hello@"), sched(b"hello@", "default"));
        assert_eq!(parse_command(b"SCHED test@test.de"), sched(b"test", "test.de"));
    }

    #[test]
    fn queue_name_bounds() {
        let q255 = "q".repeat(255);
        let line = format!("SCHED x@{q255}");
        assert_eq!(parse_command(line.as_bytes()), sched(b"x", &q255));
        let line = format!("SCHED x@{q255}q");
        assert_eq!(parse_command(line.as_bytes()), sched(&line.as_bytes()[6..], "default"));
        assert!(valid_queue_name(b"A-z_0.9:x"));
        assert!(!valid_queue_name(b"a/b"));
        assert!(!valid_queue_name(b""));
    }

    #[test]
    fn the_barrier_line_alone_is_the_barrier() {
        let line = BARRIER_LINE.strip_suffix(b"\n").expect("ends in LF");
        assert_eq!(parse_command(line), Some(Err(TextError::Barrier)));
        assert_eq!(code(line), ErrorCode::BadFormat);
        for other in [&b"ASK !syn"[..], b"ASK !sync 5", b"ASK !syncx", b"ASK !SYNC"] {
            assert!(matches!(parse_command(other), Some(Err(TextError::BadFormat { .. }))), "{}", other.escape_ascii());
        }
    }

    #[test]
    fn sched_without_data_is_bad_format() {
        for line in [&b"SCHED"[..], b"SCHED ", b"SCHED @q", b"sched @default"] {
            assert_eq!(code(line), ErrorCode::BadFormat, "{line:?}");
        }
        assert_eq!(parse_command(b"SCHED @"), sched(b"@", "default"));
    }

    #[test]
    fn ask_forms() {
        let ask = |q: &str| Some(Ok(TextCommand::Ask { queue: q.to_string() }));
        assert_eq!(parse_command(b"ASK"), ask("default"));
        assert_eq!(parse_command(b"ASK "), ask("default"));
        assert_eq!(parse_command(b"ask EMAILSERVICE"), ask("EMAILSERVICE"));
        assert_eq!(code(b"ASK bad/name"), ErrorCode::BadFormat);
        assert_eq!(code(b"ASK  q"), ErrorCode::BadFormat);
        assert_eq!(code(b"ASK \xff"), ErrorCode::BadFormat);
    }

    #[test]
    fn long_poll_ask_forms() {
        let wait = |q: &str, ms: u64| Some(Ok(TextCommand::AskWait { queue: q.to_string(), wait_ms: ms }));
        assert_eq!(parse_command(b"ASK q 1000"), wait("q", 1000));
        assert_eq!(parse_command(b"ask default 0"), wait("default", 0));
        assert_eq!(parse_command(b"ASK q 9999999999999999999"), wait("q", 9_999_999_999_999_999_999));
        assert_eq!(parse_command(b"ASK 500"), Some(Ok(TextCommand::Ask { queue: "500".into() })), "a number is a name");
        assert_eq!(parse_command(b"ASK q "), Some(Ok(TextCommand::Ask { queue: "q".into() })), "an empty wait is none");
        for line in
            [&b"ASK q  1"[..], b"ASK q x", b"ASK q -1", b"ASK q 1 2", b"ASK q 1.5", b"ASK q 99999999999999999999"]
        {
            assert_eq!(code(line), ErrorCode::BadFormat, "{line:?}");
        }
        assert_eq!(code(b"ASK bad/q 10"), ErrorCode::BadFormat);
    }

    #[test]
    fn no_argument_commands() {
        assert_eq!(parse_command(b"ACK"), Some(Ok(TextCommand::Ack)));
        assert_eq!(parse_command(b"dcl"), Some(Ok(TextCommand::Dcl)));
        assert_eq!(parse_command(b"Del "), Some(Ok(TextCommand::Del)));
        assert_eq!(parse_command(b"eNd"), Some(Ok(TextCommand::End)));
        assert_eq!(parse_command(b"auth  abc "), Some(Ok(TextCommand::Auth { token: Secret(b"abc".to_vec()) })));
        assert_eq!(parse_command(b"AUTH"), Some(Err(TextError::BadFormat { why: "AUTH needs a token" })));
        assert_eq!(format!("{:?}", parse_command(b"AUTH hunter2")), "Some(Ok(Auth { token: Secret(7 bytes) }))");
        for line in [&b"ACK x"[..], b"DCL x", b"DEL  ", b"END now"] {
            assert_eq!(code(line), ErrorCode::BadFormat, "{line:?}");
        }
    }

    #[test]
    fn unknown_and_blank() {
        assert_eq!(code(b"GET / HTTP/1.1"), ErrorCode::UnknownCommand);
        for http in
            [&b"POST / HTTP/1.1"[..], b"get /x?a=b HTTP/1.0", b"Host: 127.0.0.1:47294", b"HOST: x", b"PUT / HTTP/2"]
        {
            assert_eq!(parse_command(http), Some(Err(TextError::Http)), "{}", http.escape_ascii());
        }
        for not_http in [&b"POST x"[..], b"GET", b"Hosts: x", b"POSTHTTP/1.1"] {
            assert!(matches!(parse_command(not_http), Some(Err(TextError::UnknownCommand { .. }))));
        }
        assert_eq!(code(b"WANT? x"), ErrorCode::UnknownCommand);
        assert_eq!(code(b"NOPE"), ErrorCode::UnknownCommand);
        assert_eq!(code(b" ASK"), ErrorCode::UnknownCommand);
        assert_eq!(code(b"SCHEDX y"), ErrorCode::UnknownCommand);
        assert_eq!(parse_command(b""), None);
        assert_eq!(parse_command(b" \t  "), None);
        let e = parse_command(b"\xff\x00GET").and_then(Result::err).map(|e| e.to_string());
        assert_eq!(e.as_deref(), Some("unknown command \"\\xff\\x00GET\""));
    }

    #[test]
    fn a_line_starting_with_white_space_is_refused_saying_so() {
        let text = |line: &[u8]| parse_command(line).and_then(Result::err).map(|e| (e.code(), e.to_string()));
        let why = |what: &str| {
            Some((
                ErrorCode::UnknownCommand,
                format!("the line starts with {what}: write the command first (SCHED, ASK, ACK, DCL, DEL or END)"),
            ))
        };
        for line in [&b" SCHED x"[..], b"  ASK", b" ACK", b" x", b" \tEND"] {
            assert_eq!(text(line), why("a space"), "{}", line.escape_ascii());
        }
        for line in [&b"\tSCHED x"[..], b"\t ASK q", b"\tACK"] {
            assert_eq!(text(line), why("a tab"), "{}", line.escape_ascii());
        }
        for line in [&b"\x0bASK"[..], b"\x0cASK", b"\rASK"] {
            assert_eq!(text(line), why("whitespace"), "{}", line.escape_ascii());
        }
        // Blank lines stay ignored; white space inside the data is data.
        assert_eq!(parse_command(b" \t "), None);
        assert_eq!(parse_command(b"SCHED  x"), sched(b" x", "default"));
        assert_eq!(text(b"SCHED\tx"), Some((ErrorCode::UnknownCommand, "unknown command \"SCHED\\tx\"".to_string())));
    }

    #[test]
    fn data_is_bytes() {
        assert_eq!(parse_command(b"SCHED \xff\xfe\x00\r@q"), sched(b"\xff\xfe\x00\r", "q"));
        assert_eq!(parse_command(b"SCHED  two  spaces "), sched(b" two  spaces ", "default"));
    }
}
