//! Text-protocol load (docs/text-protocol.md) through the shared [`lines`]
//! driver: producers send `SCHED <body>@<queue>` lines, consumers loop
//! `ASK <queue>` → `WANT? <body>` → `ACK`, backing off after `NOPE`.
//! Producers count `ERR` lines. With `--ask-wait`, consumers long-poll
//! (`ASK <queue> <ms>`) instead of backing off.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use super::body::Tally;
use super::lines::{self, Dialect, Reply};
use super::{BenchError, LoadSettings};
use crate::client::text::TextClientOptions;
use crate::protocol::text::BARRIER_LINE;

/// The text protocol's words (docs/text-protocol.md, "Commands" and "Answers and errors").
#[derive(Debug, Clone, Copy)]
pub struct Text;

impl Dialect for Text {
    fn put(&self, out: &mut Vec<u8>, body: &[u8], queue: &str, _selected: &mut String) {
        out.extend_from_slice(b"SCHED ");
        out.extend_from_slice(body);
        out.push(b'@');
        out.extend_from_slice(queue.as_bytes());
        out.push(b'\n');
    }

    fn producer_error(&self, line: &[u8]) -> bool {
        line.starts_with(b"ERR")
    }

    fn consumer_hello(&self, _queue: &str) -> Vec<u8> {
        Vec::new()
    }

    fn ask(&self, queue: &str, wait: Option<Duration>) -> Vec<u8> {
        match wait {
            Some(wait) => format!("ASK {queue} {}\n", wait.as_millis()).into_bytes(),
            None => format!("ASK {queue}\n").into_bytes(),
        }
    }

    fn reply<'a>(&self, line: &'a [u8]) -> Reply<'a> {
        if let Some(body) = line.strip_prefix(b"WANT? ") {
            Reply::Task { body, ack: b"ACK\n".to_vec() }
        } else if line == b"NOPE" {
            Reply::Empty
        } else {
            Reply::Error
        }
    }

    fn bye(&self) -> &'static [u8] {
        b"END\n"
    }

    fn barrier(&self) -> Option<&'static [u8]> {
        Some(BARRIER)
    }

    fn is_barrier_reply(&self, line: &[u8]) -> bool {
        line.starts_with(b"ERR BAD_FORMAT")
    }
}

/// The pipeline barrier ([`BARRIER_LINE`]): answered `ERR BAD_FORMAT` by
/// the front end itself, in its place after the replies of every SCHED
/// before it (text-protocol.md: replies keep the order of the commands),
/// with no state changed.
const BARRIER: &[u8] = BARRIER_LINE;

/// Runs one text load against `addr` (`HOST:PORT`) over plain TCP;
/// `progress` counts measured tasks received.
///
/// # Errors
/// [`BenchError::TargetDown`] when a connection fails or no task at all
/// reaches a consumer; [`BenchError::Io`] for socket failures.
pub fn run(addr: &str, settings: &LoadSettings, progress: Arc<AtomicU64>) -> Result<Tally, BenchError> {
    run_with(addr, settings, progress, &TextClientOptions::default())
}

/// [`run`] with every connection opened with `link`: TLS against a
/// `text_tls` listener, an `AUTH` token first ([`super::link::open`]).
///
/// # Errors
/// As [`run`]; a failed TLS handshake is [`BenchError::TargetDown`].
pub fn run_with(
    addr: &str,
    settings: &LoadSettings,
    progress: Arc<AtomicU64>,
    link: &TextClientOptions,
) -> Result<Tally, BenchError> {
    lines::run(addr, settings, progress, &Text, link)
}

/// Runs pipelined SCHEDs (producers only, [`super::pipeline`]) against
/// `addr`; `progress` counts measured tasks stored.
///
/// # Errors
/// As [`run`].
pub fn pipeline(addr: &str, settings: &LoadSettings, progress: Arc<AtomicU64>) -> Result<Tally, BenchError> {
    pipeline_with(addr, settings, progress, &TextClientOptions::default())
}

/// [`pipeline`] with every connection opened with `link` (as [`run_with`]).
///
/// # Errors
/// As [`run_with`].
pub fn pipeline_with(
    addr: &str,
    settings: &LoadSettings,
    progress: Arc<AtomicU64>,
    link: &TextClientOptions,
) -> Result<Tally, BenchError> {
    super::pipeline::run(addr, settings, progress, &Text, link)
}
