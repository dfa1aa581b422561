//! The incremental line decoder (docs/text-protocol.md "Lines").

use std::collections::VecDeque;

use super::command::{parse_command, TextCommand, TextError};
use crate::limits;

/// Bytes in any chunking → commands, in order.
///
/// Lines end with LF; a CR right before the LF is dropped. Complete lines are
/// parsed as soon as [`LineDecoder::feed`] sees them; only the unfinished
/// last line is kept, and never more than `max_line_bytes + 1` bytes of it
/// (the `+ 1` is a CR that may turn out to sit right before the LF). A line
/// longer than the limit yields one [`TextError::TooBig`] as soon as that is
/// known, and the rest of it is dropped as it streams in.
///
/// Iterate (`Iterator::next`) to take the results of what was fed.
///
/// ```
/// use emq::protocol::text::{LineDecoder, TextCommand};
/// let mut d = LineDecoder::new(1024);
/// d.feed(b"SCHED x@q\r\nAS");
/// assert_eq!(d.next(), Some(Ok(TextCommand::Sched { data: b"x".to_vec(), queue: "q".into() })));
/// assert_eq!(d.next(), None);
/// assert!(d.has_partial_line());
/// d.feed(b"K q\n");
/// assert_eq!(d.next(), Some(Ok(TextCommand::Ask { queue: "q".into() })));
/// ```
#[derive(Debug)]
pub struct LineDecoder {
    max_line_bytes: usize,
    /// The unfinished last line (no LF in it).
    partial: Vec<u8>,
    /// In the middle of an over-long line whose TooBig was already reported.
    discarding: bool,
    ready: VecDeque<Result<TextCommand, TextError>>,
}

impl LineDecoder {
    /// A decoder for lines of at most `max_line_bytes` bytes (not counting
    /// the LF and a CR right before it); the default is
    /// [`crate::limits::TEXT_MAX_LINE_BYTES`].
    pub fn new(max_line_bytes: usize) -> LineDecoder {
        LineDecoder { max_line_bytes, partial: Vec::new(), discarding: false, ready: VecDeque::new() }
    }

    /// Takes the next bytes of the stream. Complete lines become results for
    /// the iterator; blank lines are skipped.
    pub fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let lf = memchr::memchr(b'\n', bytes);
            if self.discarding {
                match lf {
                    Some(i) => {
                        self.discarding = false;
                        bytes = &bytes[i + 1..];
                    }
                    None => return,
                }
                continue;
            }
            match lf {
                Some(i) => {
                    self.finish_line(&bytes[..i]);
                    bytes = &bytes[i + 1..];
                }
                None => {
                    self.keep_partial(bytes);
                    return;
                }
            }
        }
    }

    /// Whether part of a line has arrived without its LF (including an
    /// over-long line being discarded). The server closes a connection that
    /// stays in this state for the idle timeout.
    pub fn has_partial_line(&self) -> bool {
        !self.partial.is_empty() || self.discarding
    }

    /// Whether the rest of an over-long line is being dropped as it
    /// arrives: bytes up to its LF are not kept.
    pub fn discarding(&self) -> bool {
        self.discarding
    }

    /// Bytes of the unfinished line held, at most `max_line_bytes + 1`.
    pub fn buffered_bytes(&self) -> usize {
        self.partial.len()
    }

    /// Results waiting to be taken by the iterator.
    pub fn ready_len(&self) -> usize {
        self.ready.len()
    }

    /// The line limit in bytes.
    pub fn max_line_bytes(&self) -> usize {
        self.max_line_bytes
    }

    /// Ends the line made of `self.partial` and `tail` (the bytes before LF).
    fn finish_line(&mut self, tail: &[u8]) {
        let last = tail.last().or(self.partial.last()).copied();
        let len = self.partial.len() + tail.len() - usize::from(last == Some(b'\r'));
        if len > self.max_line_bytes {
            self.clear_partial();
            self.too_big();
            return;
        }
        let parsed = if self.partial.is_empty() {
            parse_command(&tail[..len])
        } else {
            self.partial.extend_from_slice(tail);
            let parsed = parse_command(&self.partial[..len]);
            self.clear_partial();
            parsed
        };
        if let Some(result) = parsed {
            self.ready.push_back(result);
        }
    }

    /// Keeps `bytes` (no LF in them) as the unfinished line, or reports the
    /// line as too big and starts discarding it.
    fn keep_partial(&mut self, bytes: &[u8]) {
        let len = self.partial.len() + bytes.len();
        let last = bytes.last().copied();
        let limit = self.max_line_bytes;
        if len > limit + 1 || (len == limit + 1 && last != Some(b'\r')) {
            self.clear_partial();
            self.discarding = true;
            self.too_big();
        } else {
            self.partial.extend_from_slice(bytes);
        }
    }

    /// Empties the unfinished line, freeing a buffer grown past
    /// [`limits::TEXT_KEEP_BUFFER_BYTES`] (an idle connection that once sent
    /// a big line keeps no big buffer).
    fn clear_partial(&mut self) {
        if self.partial.capacity() > limits::TEXT_KEEP_BUFFER_BYTES {
            self.partial = Vec::new();
        } else {
            self.partial.clear();
        }
    }

    fn too_big(&mut self) {
        self.ready.push_back(Err(TextError::TooBig { max_line_bytes: self.max_line_bytes }));
    }
}

impl Iterator for LineDecoder {
    type Item = Result<TextCommand, TextError>;

    /// The next command or error from the lines fed so far, in order.
    fn next(&mut self) -> Option<Self::Item> {
        self.ready.pop_front()
    }
}

#[cfg(test)]
#[path = "line_tests.rs"]
mod tests;
