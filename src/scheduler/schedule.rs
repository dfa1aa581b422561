//! One schedule: what a SCHEDULE message defines (docs/emqp.md "SCHEDULE and UNSCHEDULE") and when
//! it fires next.
//!
//! Decisions (each fixes a defect of EventMQ 0.3.13, docs/emqp.md "Differences from EventMQ"):
//! * **Interval jobs** (frame 6 ≥ 1) fire at a fixed rate: each fire moves the next
//!   deadline by exactly one interval. After a stall (the process was stopped,
//!   the machine slept) the overdue job fires **once** and the next deadline
//!   becomes `now + interval`: no catch-up burst (EventMQ burst).
//! * **`interval 0` is rejected** (EventMQ fired it every millisecond). Any negative
//!   interval means "cron job" as in Python; the cron frame must then hold a
//!   valid 5-field expression.
//! * **Cron jobs** (frame 6 < 0) use a standard 5-field expression (minute, hour,
//!   day of month, month, day of week; `@daily`-style nicknames too) evaluated
//!   in the scheduler's time zone (UTC unless configured). When both day of
//!   month and day of week are restricted, a day matching **either** fires
//!   (Vixie cron and croniter semantics). After a stall a cron job fires once,
//!   then at the first cron time after `now`. Cron jobs keep their
//!   queue and honour `run_count` (EventMQ sent later runs to `default` and crashed on a cron `run_count`).
//! * **Daylight saving time** (non-UTC zones only), as croner resolves local
//!   times: a local time skipped by a spring-forward gap fires at the first
//!   valid instant after the gap (e.g. `30 2 * * *` in Europe/Berlin fires at
//!   03:00 CEST on the day of the change); a local time repeated by a
//!   fall-back fires once, at its first (summer-time) occurrence. Minute-level
//!   patterns therefore do not fire during the repeated hour's second pass.
//! * **`run_count:N`** is the total number of REQUESTs, the haste run included
//!   (docs/emqp.md "The scheduler"); `run_count:0` means the job never runs, so the SCHEDULE
//!   only removes any existing job with its key.
//! * **`nohaste`** suppresses the immediate run on SCHEDULE. It and
//!   `run_count` are matched as whole CSV tokens (Python used substrings).

use chrono::{DateTime, TimeDelta, Utc};
use chrono_tz::Tz;
use croner::Cron;

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
    Cron {
        /// The expression as received.
        expr: String,
        /// The parsed expression.
        cron: Box<Cron>,
    },
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
    #[error("frame 6: bad interval {0:?} (seconds ≥ 1, or negative for a cron job)")]
    BadInterval(String),
    /// frame 8 is missing, empty or not a valid 5-field cron expression.
    #[error("frame 8: bad cron expression {expr:?}: {why}")]
    BadCron {
        /// The expression.
        expr: String,
        /// Why it was rejected.
        why: String,
    },
    /// The `run_count:N` header is not a non-negative integer.
    #[error("frame 5: bad run_count in headers {0:?}")]
    BadRunCount(String),
    /// frame 7 cannot be keyed.
    #[error("frame 7: {0}")]
    Body(#[from] KeyError),
}

impl ScheduleError {
    /// The ERROR code token sent back to the router.
    pub fn code(&self) -> &'static str {
        match self {
            ScheduleError::NotUtf8 { .. } => "BAD_ENCODING",
            ScheduleError::BadInterval(_) => "BAD_INTERVAL",
            ScheduleError::BadCron { .. } => "BAD_CRON",
            ScheduleError::BadRunCount(_) => "BAD_HEADERS",
            ScheduleError::Body(_) => "BAD_BODY",
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
            secs @ 1.. if secs as u64 <= limits::SCHEDULER_MAX_INTERVAL_SECS => Kind::Interval { secs: secs as u64 },
            1.. => return Err(ScheduleError::BadInterval(record[2].clone())),
            _ => Kind::Cron { expr: record[4].clone(), cron: Box::new(parse_cron(&record[4])?) },
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

    /// The first fire time strictly after `now` for a new or restored job:
    /// `now + interval`, or the next cron time in `tz`.
    ///
    /// # Errors
    /// [`ScheduleError::BadCron`] when the expression never matches again.
    pub fn first_fire(&self, now: DateTime<Utc>, tz: Tz) -> Result<DateTime<Utc>, ScheduleError> {
        match &self.kind {
            Kind::Interval { secs } => Ok(now + interval(*secs)),
            Kind::Cron { .. } => self.cron_after(now, tz),
        }
    }

    /// The fire time after a fire that was due at `due` and happened at
    /// `now` (`now ≥ due`): fixed rate when on time, `now + interval` after a
    /// stall; for cron, the first cron time after `now`.
    ///
    /// # Errors
    /// [`ScheduleError::BadCron`] when the expression never matches again.
    pub fn next_fire(&self, due: DateTime<Utc>, now: DateTime<Utc>, tz: Tz) -> Result<DateTime<Utc>, ScheduleError> {
        match &self.kind {
            Kind::Interval { secs } => {
                let next = due + interval(*secs);
                Ok(if next > now { next } else { now + interval(*secs) })
            }
            Kind::Cron { .. } => self.cron_after(now, tz),
        }
    }

    fn cron_after(&self, now: DateTime<Utc>, tz: Tz) -> Result<DateTime<Utc>, ScheduleError> {
        let Kind::Cron { expr, cron } = &self.kind else {
            return Err(ScheduleError::BadCron { expr: String::new(), why: "not a cron job".into() });
        };
        cron.find_next_occurrence(&now.with_timezone(&tz), false)
            .map(|t| t.with_timezone(&Utc))
            .map_err(|e| ScheduleError::BadCron { expr: expr.clone(), why: e.to_string() })
    }
}

fn interval(secs: u64) -> TimeDelta {
    TimeDelta::seconds(secs.min(limits::SCHEDULER_MAX_INTERVAL_SECS) as i64)
}

/// Parses a 5-field cron expression (or an `@daily`-style nickname).
///
/// # Errors
/// [`ScheduleError::BadCron`] for an empty, 6-field or invalid expression.
pub fn parse_cron(expr: &str) -> Result<Cron, ScheduleError> {
    let bad = |why: String| ScheduleError::BadCron { expr: expr.to_string(), why };
    if expr.trim().is_empty() {
        return Err(bad("a cron job (negative interval) needs a cron expression".into()));
    }
    Cron::new(expr.trim()).parse().map_err(|e| bad(e.to_string()))
}
