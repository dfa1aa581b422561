//! One schedule: what a SCHEDULE message defines (docs/emqp.md "SCHEDULE and UNSCHEDULE") and when
//! it fires next.
//!
//! Decisions (each fixes a defect of EventMQ 0.3.13, docs/emqp.md "Differences from EventMQ"):
//! * **Interval jobs** (frame 6 ≥ 1) run on the monotonic clock at a fixed rate
//!   ([`super::timetable`] has the clock rules).
//! * **`interval 0` is rejected** (EventMQ fired it every millisecond). Any negative
//!   interval means "cron job" as in Python; the cron frame must then hold a
//!   valid 5-field expression. A positive interval with a cron expression is
//!   refused (`BAD_SCHEDULE`): EventMQ silently ignored the cron.
//! * **Cron jobs** (frame 6 < 0) are read as Vixie/ISC cron reads them
//!   ([`super::cron`]: day of month and day of week, DST) and evaluated in
//!   the scheduler's time zone (UTC unless configured). Cron jobs keep their
//!   queue and honour `run_count` (EventMQ sent later runs to `default` and
//!   crashed on a cron `run_count`).
//! * **`run_count:N`** is the total number of REQUESTs, the haste run included
//!   (docs/emqp.md "The scheduler"); `run_count:0` means the job never runs, so the SCHEDULE
//!   only removes any existing job with its key.
//! * **`nohaste`** suppresses the immediate run on SCHEDULE. It and
//!   `run_count` are matched as whole CSV tokens (Python used substrings).

use super::cron::CronExpr;
use super::key::{key_body, KeyError, KeyedBody, ScheduleKey};
use crate::limits;
use crate::protocol::emqp::ScheduleBody;
use crate::protocol::headers;

/// When a job fires.
#[derive(Debug, Clone)]
pub enum Kind {
    /// Every `secs` seconds (1 ..= [`limits::SCHEDULER_MAX_INTERVAL_SECS`]).
    Interval {
        /// The period in seconds.
        secs: u64,
    },
    /// At each time matching a 5-field cron expression.
    Cron(Box<CronExpr>),
}

/// Why a SCHEDULE could not be accepted. The text names the frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// A frame that must be text is not UTF-8.
    #[error("frame {frame}: {what} is not valid UTF-8")]
    NotUtf8 {
        /// The D-index.
        frame: usize,
        /// What the frame holds.
        what: &'static str,
    },
    /// frame 6 is not an integer, is 0, or is too large.
    #[error(
        "frame 6: bad interval {0:?} (seconds from 1 to 316224000, 10 years of 366 days, or negative for a cron job)"
    )]
    BadInterval(String),
    /// frame 8 is missing, empty or not a valid 5-field cron expression.
    #[error("frame 8: bad cron expression {expr:?}: {why}")]
    BadCron {
        /// The expression.
        expr: String,
        /// Why it was rejected.
        why: String,
    },
    /// frame 6 is an interval and frame 8 a cron expression: which one is meant?
    #[error("frames 6 and 8: both an interval ({interval:?}) and a cron expression ({cron:?}); give one (interval -1 for a cron job)")]
    IntervalAndCron {
        /// frame 6.
        interval: String,
        /// frame 8.
        cron: String,
    },
    /// The `run_count:N` header is not a non-negative integer.
    #[error("frame 5: bad run_count in headers {0:?}")]
    BadRunCount(String),
    /// frame 7 cannot be keyed.
    #[error("frame 7: {0}")]
    Body(#[from] KeyError),
    /// The scheduler holds [`limits::SCHEDULER_MAX_SCHEDULES`] schedules.
    #[error("this scheduler holds {0} schedules, its limit")]
    TooMany(usize),
    /// The store refuses the record (its size).
    #[error("{0}")]
    TooBig(String),
    /// This scheduler may not write its store now (its lease is not
    /// renewed in time, or another scheduler holds its name).
    #[error("not stored: {0}")]
    NotActive(String),
}

impl ScheduleError {
    /// The ERROR code token sent back to the router.
    pub fn code(&self) -> &'static str {
        match self {
            ScheduleError::NotUtf8 { .. } => "BAD_ENCODING",
            ScheduleError::BadInterval(_) => "BAD_INTERVAL",
            ScheduleError::BadCron { .. } => "BAD_CRON",
            ScheduleError::IntervalAndCron { .. } => "BAD_SCHEDULE",
            ScheduleError::BadRunCount(_) => "BAD_HEADERS",
            ScheduleError::Body(_) => "BAD_BODY",
            ScheduleError::TooMany(_) => "BUSY",
            ScheduleError::TooBig(_) => "TOO_BIG",
            ScheduleError::NotActive(_) => "STORE_FAILED",
        }
    }
}

/// A validated SCHEDULE: the five body frames as text plus what they mean.
#[derive(Debug, Clone)]
pub struct Definition {
    /// Frames 4..8 as received: the record EventMQ persists
    /// (docs/emqp.md "The scheduler": queue, headers, interval text, body JSON, cron).
    pub record: [String; 5],
    /// The job key (docs/emqp.md "The scheduler").
    pub key: ScheduleKey,
    /// The REQUEST body to emit (docs/emqp.md "The scheduler").
    pub request_body: String,
    /// Interval or cron.
    pub kind: Kind,
    /// `run_count:N`: total runs; `None` = unlimited.
    pub run_count: Option<u64>,
    /// `nohaste`: no immediate run on SCHEDULE.
    pub nohaste: bool,
}

impl Definition {
    /// Validates a SCHEDULE body (frames 4..8).
    ///
    /// # Errors
    /// [`ScheduleError`] naming the bad frame. A missing cron frame is
    /// treated as empty (only interval jobs can then be valid).
    pub fn from_body(body: &ScheduleBody) -> Result<Definition, ScheduleError> {
        let text = |frame: usize, what: &'static str, b: &[u8]| {
            String::from_utf8(b.to_vec()).map_err(|_| ScheduleError::NotUtf8 { frame, what })
        };
        let record = [
            text(4, "the queue name", &body.queue)?,
            text(5, "the headers", &body.headers)?,
            text(6, "the interval", &body.interval)?,
            text(7, "the job body", &body.body)?,
            text(8, "the cron expression", body.cron.as_deref().unwrap_or_default())?,
        ];
        Definition::from_record(record)
    }

    /// Validates a persisted record `[queue, headers, interval, body, cron]`.
    ///
    /// # Errors
    /// As [`Definition::from_body`].
    pub fn from_record(record: [String; 5]) -> Result<Definition, ScheduleError> {
        let KeyedBody { key, request_body, .. } = key_body(record[3].as_bytes())?;
        let interval: i64 = record[2].trim().parse().map_err(|_| ScheduleError::BadInterval(record[2].clone()))?;
        let kind = match interval {
            0 => return Err(ScheduleError::BadInterval(record[2].clone())),
            1.. if !record[4].trim().is_empty() => {
                return Err(ScheduleError::IntervalAndCron { interval: record[2].clone(), cron: record[4].clone() })
            }
            secs @ 1.. if secs as u64 <= limits::SCHEDULER_MAX_INTERVAL_SECS => Kind::Interval { secs: secs as u64 },
            1.. => return Err(ScheduleError::BadInterval(record[2].clone())),
            _ => Kind::Cron(Box::new(parse_cron(&record[4])?)),
        };
        let hdr = record[1].as_bytes();
        let run_count = match headers::value(hdr, b"run_count") {
            None => None,
            Some(v) => Some(
                std::str::from_utf8(v)
                    .ok()
                    .and_then(|s| s.trim().parse::<u64>().ok())
                    .ok_or_else(|| ScheduleError::BadRunCount(record[1].clone()))?,
            ),
        };
        let nohaste = headers::has(hdr, b"nohaste");
        Ok(Definition { record, key, request_body, kind, run_count, nohaste })
    }

    /// The queue jobs go to (frame 4; cron jobs keep it too).
    pub fn queue(&self) -> &str {
        &self.record[0]
    }

    /// Whether `other` defines the same job: same five frames (queue,
    /// headers, interval, body, cron), compared as received.
    pub fn same_definition(&self, other: &Definition) -> bool {
        self.record == other.record
    }
}

/// The checks a scheduler makes before it takes a SCHEDULE (everything
/// [`Definition::from_body`] checks) or an UNSCHEDULE (that the body has a
/// key). The router runs them too, before it routes the message by the key
/// this returns, so that a message no scheduler would take is refused with
/// the same code and reason however old the scheduler is (an EventMQ
/// scheduler dies on such a message).
///
/// # Errors
/// [`ScheduleError`] naming the bad frame.
pub fn check_schedule(body: &ScheduleBody, unschedule: bool) -> Result<ScheduleKey, ScheduleError> {
    if unschedule {
        Ok(key_body(&body.body)?.key)
    } else {
        Ok(Definition::from_body(body)?.key)
    }
}

/// Parses a 5-field cron expression (or an `@daily`-style nickname).
///
/// # Errors
/// [`ScheduleError::BadCron`] for an empty, 6-field or invalid expression.
pub fn parse_cron(expr: &str) -> Result<CronExpr, ScheduleError> {
    let bad = |why: String| ScheduleError::BadCron { expr: expr.to_string(), why };
    if expr.trim().is_empty() {
        return Err(bad("a cron job (negative interval) needs a cron expression".into()));
    }
    CronExpr::parse(expr).map_err(bad)
}

#[cfg(test)]
mod interval_message_tests {
    use super::*;

    #[test]
    fn a_refused_interval_names_the_accepted_range() {
        let text = ScheduleError::BadInterval("400000000".into()).to_string();
        assert!(text.contains(&format!("from 1 to {}", limits::SCHEDULER_MAX_INTERVAL_SECS)), "{text}");
    }
}
