//! Writing lines in both directions, and reading server lines on the client
//! side (docs/text-protocol.md "Answers and errors", "Line breaks in data").

use super::command::{split_queue, valid_queue_name, TextCommand};
use super::ErrorCode;
use crate::limits;

/// Appends `WANT? <data>\n`, writing each CR and LF byte of `data` as a
/// space (docs/text-protocol.md "Line breaks in data"). Returns whether any byte
/// was rewritten, for the STATUS counter.
pub fn encode_want(out: &mut Vec<u8>, data: &[u8]) -> bool {
    out.extend_from_slice(b"WANT? ");
    let rewritten = memchr::memchr2(b'\r', b'\n', data).is_some();
    if rewritten {
        out.extend(data.iter().map(|&b| if b == b'\r' || b == b'\n' { b' ' } else { b }));
    } else {
        out.extend_from_slice(data);
    }
    out.push(b'\n');
    rewritten
}

/// Appends `NOPE\n`.
pub fn encode_nope(out: &mut Vec<u8>) {
    out.extend_from_slice(b"NOPE\n");
}

/// Appends `ERR <CODE> <text>\n` (`ERR <CODE>\n` when `text` is empty); CR
/// and LF in `text` are written as spaces so the reply stays one line.
pub fn encode_err(out: &mut Vec<u8>, code: ErrorCode, text: &str) {
    out.extend_from_slice(b"ERR ");
    out.extend_from_slice(code.as_str().as_bytes());
    if !text.is_empty() {
        out.push(b' ');
        out.extend(text.bytes().map(|b| if b == b'\r' || b == b'\n' { b' ' } else { b }));
    }
    out.push(b'\n');
}

/// A command the client cannot put on one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// SCHED needs at least one byte of data.
    #[error("SCHED needs data")]
    EmptyData,
    /// Data with an LF byte cannot be sent as text (use eMQP).
    #[error("data holds an LF byte, which the text protocol cannot carry")]
    LineBreakInData,
    /// Not 1 to 255 bytes of `A-Z a-z 0-9 _ - . :`.
    #[error("invalid queue name {0:?}")]
    InvalidQueueName(String),
    /// An AUTH token that is empty or holds a CR or LF byte.
    #[error("an AUTH token must be one line of at least one byte")]
    BadToken,
}

/// Appends the line for `command`, ending in LF. A SCHED gets an explicit
/// `@<queue>` unless the queue is `default` and the line would be read back
/// unchanged without it (no `@name` tail in the data, no CR at its end).
///
/// # Errors
/// [`EncodeError`] when the command cannot be written as one line that the
/// server reads back as the same command; nothing is appended then.
pub fn encode_command(out: &mut Vec<u8>, command: &TextCommand) -> Result<(), EncodeError> {
    match command {
        TextCommand::Sched { data, queue } => encode_sched(out, data, queue)?,
        TextCommand::Ask { queue } => {
            check_queue(queue)?;
            out.extend_from_slice(b"ASK ");
            out.extend_from_slice(queue.as_bytes());
        }
        TextCommand::AskWait { queue, wait_ms } => {
            check_queue(queue)?;
            out.extend_from_slice(format!("ASK {queue} {wait_ms}").as_bytes());
        }
        TextCommand::Ack => out.extend_from_slice(b"ACK"),
        TextCommand::Dcl => out.extend_from_slice(b"DCL"),
        TextCommand::Del => out.extend_from_slice(b"DEL"),
        TextCommand::End => out.extend_from_slice(b"END"),
        TextCommand::Auth { token } => {
            if token.0.is_empty() || token.0.iter().any(|&b| b == b'\n' || b == b'\r') {
                return Err(EncodeError::BadToken);
            }
            out.extend_from_slice(b"AUTH ");
            out.extend_from_slice(&token.0);
        }
    }
    out.push(b'\n');
    Ok(())
}

fn encode_sched(out: &mut Vec<u8>, data: &[u8], queue: &str) -> Result<(), EncodeError> {
    check_queue(queue)?;
    if data.is_empty() {
        return Err(EncodeError::EmptyData);
    }
    if memchr::memchr(b'\n', data).is_some() {
        return Err(EncodeError::LineBreakInData);
    }
    out.extend_from_slice(b"SCHED ");
    out.extend_from_slice(data);
    let implicit =
        queue == limits::DEFAULT_QUEUE && split_queue(data).0.len() == data.len() && data.last() != Some(&b'\r');
    if !implicit {
        out.push(b'@');
        out.extend_from_slice(queue.as_bytes());
    }
    Ok(())
}

fn check_queue(queue: &str) -> Result<(), EncodeError> {
    if valid_queue_name(queue.as_bytes()) {
        Ok(())
    } else {
        Err(EncodeError::InvalidQueueName(queue.to_string()))
    }
}

/// A line from the server, as the client reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerLine {
    /// `WANT? <data>`: the offered task (CR and LF already written as spaces
    /// by the server).
    Want(Vec<u8>),
    /// `NOPE`: no task can be offered now.
    Nope,
    /// `ERR <CODE> <text>`.
    Err {
        /// The code token.
        code: ErrorCode,
        /// The human text (free-form; may be empty).
        text: String,
    },
}

/// A server line the client does not understand.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unexpected server line {line:?}")]
pub struct ServerLineError {
    /// The line, ASCII-escaped and cut to 64 bytes.
    pub line: String,
}

/// Parses one server line: the bytes before the LF (a CR before it is
/// tolerated and dropped).
///
/// # Errors
/// [`ServerLineError`] for anything but `WANT?`, `NOPE` and `ERR` with a
/// known code.
pub fn parse_server_line(line: &[u8]) -> Result<ServerLine, ServerLineError> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if let Some(data) = line.strip_prefix(b"WANT?") {
        return match data {
            [] => Ok(ServerLine::Want(Vec::new())),
            [b' ', data @ ..] => Ok(ServerLine::Want(data.to_vec())),
            _ => Err(bad_line(line)),
        };
    }
    if line == b"NOPE" {
        return Ok(ServerLine::Nope);
    }
    let rest = line.strip_prefix(b"ERR ").ok_or_else(|| bad_line(line))?;
    let (token, text) = match memchr::memchr(b' ', rest) {
        Some(sp) => (&rest[..sp], &rest[sp + 1..]),
        None => (rest, &rest[rest.len()..]),
    };
    let code = ErrorCode::from_token(token).ok_or_else(|| bad_line(line))?;
    Ok(ServerLine::Err { code, text: String::from_utf8_lossy(text).into_owned() })
}

fn bad_line(line: &[u8]) -> ServerLineError {
    ServerLineError { line: line[..line.len().min(64)].escape_ascii().to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::text::parse_command;

    #[test]
    fn server_lines() {
        let mut out = Vec::new();
        assert!(!encode_want(&mut out, b"{ email: \"test@test.de\" }"));
        encode_nope(&mut out);
        encode_err(&mut out, ErrorCode::NoTask, ErrorCode::NoTask.default_text());
        encode_err(&mut out, ErrorCode::Busy, "");
        assert_eq!(
            out,
            b"WANT? { email: \"test@test.de\" }\nNOPE\nERR NO_TASK no task is offered on this connection\nERR BUSY\n"
        );
    }

    #[test]
    fn line_breaks_in_offered_data_become_spaces() {
        let mut out = Vec::new();
        assert!(encode_want(&mut out, b"a\r\nb\rc\n"));
        assert_eq!(out, b"WANT? a  b c \n");
        out.clear();
        encode_err(&mut out, ErrorCode::BadFormat, "x\ny");
        assert_eq!(out, b"ERR BAD_FORMAT x y\n");
    }

    #[test]
    fn server_lines_parse_back() {
        assert_eq!(parse_server_line(b"WANT? a b"), Ok(ServerLine::Want(b"a b".to_vec())));
        assert_eq!(parse_server_line(b"WANT? "), Ok(ServerLine::Want(Vec::new())));
        assert_eq!(parse_server_line(b"NOPE\r"), Ok(ServerLine::Nope));
        let err = ServerLine::Err { code: ErrorCode::Pending, text: "held".into() };
        assert_eq!(parse_server_line(b"ERR PENDING held"), Ok(err));
        let err = ServerLine::Err { code: ErrorCode::Busy, text: String::new() };
        assert_eq!(parse_server_line(b"ERR BUSY"), Ok(err));
        for bad in [&b"ERR NOPE x"[..], b"nope", b"WANT?x", b"OK", b""] {
            assert!(parse_server_line(bad).is_err(), "{bad:?}");
        }
    }

    fn round_trip(command: TextCommand) {
        let mut out = Vec::new();
        encode_command(&mut out, &command).unwrap();
        assert_eq!(out.pop(), Some(b'\n'));
        assert_eq!(parse_command(&out), Some(Ok(command)), "{:?}", out.escape_ascii().to_string());
    }

    #[test]
    fn commands_round_trip() {
        let sched = |d: &[u8], q: &str| TextCommand::Sched { data: d.to_vec(), queue: q.to_string() };
        round_trip(sched(b"test", "default"));
        round_trip(sched(b"test@test.de", "default"));
        round_trip(sched(b"x\r", "default"));
        round_trip(sched(b"a@b@c", "q.1"));
        round_trip(sched(b" \xff ", "default"));
        round_trip(TextCommand::Ask { queue: "EMAILSERVICE".into() });
        round_trip(TextCommand::AskWait { queue: "q".into(), wait_ms: 250 });
        for c in [TextCommand::Ack, TextCommand::Dcl, TextCommand::Del, TextCommand::End] {
            round_trip(c);
        }
        let mut out = Vec::new();
        assert_eq!(encode_command(&mut out, &sched(b"", "q")), Err(EncodeError::EmptyData));
        assert_eq!(encode_command(&mut out, &sched(b"a\nb", "q")), Err(EncodeError::LineBreakInData));
        assert!(encode_command(&mut out, &sched(b"a", "a/b")).is_err());
        assert!(out.is_empty());
    }
}
