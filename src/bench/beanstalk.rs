//! beanstalkd-protocol load (beanstalkd 1.x `doc/protocol.txt`) through the
//! shared [`lines`] driver, with cycles equivalent to the text mode's:
//!
//! * producer: `use <queue>` when the queue changes (→ `USING <queue>`), then
//!   `put <pri> <delay> <ttr> <bytes>\r\n<body>\r\n` (→ `INSERTED <id>`);
//!   every other reply counts as an error;
//! * consumer: `watch <queue>` and `ignore default` once (→ `WATCHING <n>`),
//!   then `reserve-with-timeout 0` (→ `RESERVED <id> <bytes>\r\n<body>\r\n`,
//!   or `TIMED_OUT`, answered like `NOPE` with the same back-off; with
//!   `--ask-wait`, `reserve-with-timeout <whole seconds>` and no back-off) and
//!   `delete <id>` (→ `DELETED`) sent together with the next reserve.
//!
//! Tubes are named like the queues (`bench-0`, …).

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use super::body::Tally;
use super::lines::{self, Dialect, Reply};
use super::{BenchError, LoadSettings};
use crate::client::text::TextClientOptions;

/// `put` priority: beanstalkd clients' usual default (0 is most urgent).
pub const PUT_PRIORITY: u32 = 1024;
/// `put` time-to-run in seconds: far above any job's stay in the run, so a
/// reserved job is never released to a second consumer.
pub const PUT_TTR_S: u32 = 60;

/// The beanstalkd protocol's words.
#[derive(Debug, Clone, Copy)]
pub struct Beanstalk;

impl Dialect for Beanstalk {
    fn put(&self, out: &mut Vec<u8>, body: &[u8], queue: &str, selected: &mut String) {
        if selected != queue {
            out.extend_from_slice(format!("use {queue}\r\n").as_bytes());
            queue.clone_into(selected);
        }
        out.extend_from_slice(format!("put {PUT_PRIORITY} 0 {PUT_TTR_S} {}\r\n", body.len()).as_bytes());
        out.extend_from_slice(body);
        out.extend_from_slice(b"\r\n");
    }

    fn producer_error(&self, line: &[u8]) -> bool {
        !(line.starts_with(b"INSERTED ") || line.starts_with(b"USING "))
    }

    fn consumer_hello(&self, queue: &str) -> Vec<u8> {
        format!("watch {queue}\r\nignore default\r\n").into_bytes()
    }

    fn ask(&self, _queue: &str, wait: Option<Duration>) -> Vec<u8> {
        // Whole seconds: a wait under a second is rounded up to one.
        let secs = wait.map_or(0, |w| w.as_millis().div_ceil(1000).max(1));
        format!("reserve-with-timeout {secs}\r\n").into_bytes()
    }

    fn reply<'a>(&self, line: &'a [u8]) -> Reply<'a> {
        if let Some(rest) = line.strip_prefix(b"RESERVED ") {
            return match reserved(rest) {
                Some((id, bytes)) => Reply::TaskNext { bytes, ack: format!("delete {id}\r\n").into_bytes() },
                None => Reply::Error,
            };
        }
        match line {
            b"TIMED_OUT" | b"DEADLINE_SOON" => Reply::Empty,
            b"DELETED" => Reply::Other(false),
            _ if line.starts_with(b"WATCHING ") => Reply::Other(false),
            b"NOT_FOUND" | b"NOT_IGNORED" => Reply::Other(true),
            _ => Reply::Error,
        }
    }

    fn bye(&self) -> &'static [u8] {
        b"quit\r\n"
    }
}

/// `<id> <bytes>` of a `RESERVED` line.
fn reserved(rest: &[u8]) -> Option<(u64, usize)> {
    let text = std::str::from_utf8(rest).ok()?;
    let (id, bytes) = text.split_once(' ')?;
    Some((id.parse().ok()?, bytes.parse().ok()?))
}

/// Runs one beanstalkd-protocol load against `addr` (`HOST:PORT`);
/// `progress` counts measured jobs received.
///
/// # Errors
/// [`BenchError::TargetDown`] when a connection fails or no job at all
/// reaches a consumer; [`BenchError::Io`] for socket failures.
pub fn run(addr: &str, settings: &LoadSettings, progress: Arc<AtomicU64>) -> Result<Tally, BenchError> {
    lines::run(addr, settings, progress, &Beanstalk, &TextClientOptions::default())
}

/// Runs pipelined `put`s (producers only, [`super::pipeline`]) against
/// `addr`; `progress` counts measured jobs stored (`INSERTED`).
///
/// # Errors
/// As [`run`].
pub fn pipeline(addr: &str, settings: &LoadSettings, progress: Arc<AtomicU64>) -> Result<Tally, BenchError> {
    super::pipeline::run(addr, settings, progress, &Beanstalk, &TextClientOptions::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_selects_the_tube_once() {
        let (mut out, mut sel) = (Vec::new(), String::new());
        Beanstalk.put(&mut out, b"ab", "q", &mut sel);
        Beanstalk.put(&mut out, b"c", "q", &mut sel);
        assert_eq!(out, b"use q\r\nput 1024 0 60 2\r\nab\r\nput 1024 0 60 1\r\nc\r\n");
    }

    #[test]
    fn replies() {
        let ack = b"delete 7\r\n".to_vec();
        assert_eq!(Beanstalk.reply(b"RESERVED 7 64"), Reply::TaskNext { bytes: 64, ack });
        assert_eq!(Beanstalk.reply(b"RESERVED 7"), Reply::Error);
        assert_eq!(Beanstalk.reply(b"TIMED_OUT"), Reply::Empty);
        assert_eq!(Beanstalk.reply(b"WATCHING 2"), Reply::Other(false));
        assert_eq!(Beanstalk.reply(b"NOT_FOUND"), Reply::Other(true));
        assert_eq!(Beanstalk.reply(b"UNKNOWN_COMMAND"), Reply::Error);
        assert!(!Beanstalk.producer_error(b"INSERTED 3") && Beanstalk.producer_error(b"JOB_TOO_BIG"));
    }
}
