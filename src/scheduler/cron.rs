//! Cron expressions as Vixie/ISC cron reads them (`man 5 crontab`), and
//! their fire times in a time zone. Pure code over explicit times; the
//! matching of single fields is [`croner`]'s.
//!
//! Rules (each from cron's documentation; EventMQ's croniter and croner's
//! defaults differ where noted):
//! * **Five fields** (minute, hour, day of month, month, day of week), or a
//!   nickname: `@yearly`/`@annually`, `@monthly`, `@weekly`,
//!   `@daily`/`@midnight`, `@hourly`. Six-field (seconds) patterns and
//!   `@reboot` are refused.
//! * **Day of month and day of week** (crontab(5): "If both fields are
//!   restricted (i.e., don't start with `*`), the command will be run when
//!   either field matches the current time"): when either field starts
//!   with `*` the day must match both (so `0 0 */2 * 1` fires on odd days
//!   that are Mondays); when neither does, either one suffices (`0 0 13 *
//!   5`: the 13th and every Friday). croner ORs any two fields that are not
//!   exactly `*`.
//! * **Daylight saving time** (non-UTC zones; Vixie cron's man page,
//!   "special considerations exist when the clock is changed by less than 3
//!   hours"): a **wildcard** job (minute or hour field starting with `*`, or
//!   `@hourly`) follows the local clock as it is: in the repeated hour of an
//!   autumn change it fires again (`0 * * * *` fires every real hour), and
//!   local times a spring change skips never come. A **fixed-time** job
//!   (neither field starts with `*`) fires once per local time: in the
//!   repeated hour only at the first pass, and a time a spring change skips
//!   fires at the first instant after the gap.
//!
//! Times are whole seconds (fires are at second 0); "after" is strict.

use chrono::{DateTime, Offset, TimeDelta, TimeZone, Timelike, Utc};
use chrono_tz::Tz;
use croner::Cron;

/// Most time-zone transitions one search may cross before giving up: far
/// more than any real zone has in the years croner searches.
const MAX_SEGMENTS: usize = 1_000;

/// A parsed cron expression with its Vixie flags.
#[derive(Debug, Clone)]
pub struct CronExpr {
    expr: String,
    cron: Cron,
    wild: bool,
}

impl CronExpr {
    /// Parses a 5-field expression or a nickname (module docs).
    ///
    /// # Errors
    /// The reason, naming the field count or what croner rejected.
    ///
    /// ```
    /// use emq::scheduler::cron::CronExpr;
    /// assert!(CronExpr::parse("*/5 * * * *").is_ok());
    /// assert!(CronExpr::parse("0 0 * * * *").is_err()); // six fields
    /// assert!(CronExpr::parse("@reboot").is_err());
    /// ```
    pub fn parse(expr: &str) -> Result<CronExpr, String> {
        let text = expr.trim();
        let fields = match text.to_ascii_lowercase().as_str() {
            "@yearly" | "@annually" => "0 0 1 1 *".to_string(),
            "@monthly" => "0 0 1 * *".to_string(),
            "@weekly" => "0 0 * * 0".to_string(),
            "@daily" | "@midnight" => "0 0 * * *".to_string(),
            "@hourly" => "0 * * * *".to_string(),
            nick if nick.starts_with('@') => return Err(format!("unknown or unsupported nickname {text:?}")),
            _ => text.to_string(),
        };
        let parts: Vec<&str> = fields.split_whitespace().collect();
        if parts.len() != 5 {
            return Err(format!("{} fields; cron has 5 (minute, hour, day of month, month, day of week)", parts.len()));
        }
        let star = |f: &str| f.starts_with('*') || f.starts_with('?');
        let mut cron = Cron::new(&parts.join(" "));
        if star(parts[2]) || star(parts[4]) {
            cron.with_dom_and_dow();
        }
        let cron = cron.parse().map_err(|e| e.to_string())?;
        Ok(CronExpr { expr: expr.to_string(), cron, wild: star(parts[0]) || star(parts[1]) })
    }

    /// The expression as received.
    pub fn as_str(&self) -> &str {
        &self.expr
    }

    /// Whether the minute or hour field starts with `*` (a wildcard job,
    /// for the DST rules).
    pub fn is_wild(&self) -> bool {
        self.wild
    }

    /// The first fire time strictly after `after`, evaluated in `tz`.
    ///
    /// # Errors
    /// The reason when the expression never matches again (e.g. `0 0 30 2 *`).
    pub fn next_after(&self, after: DateTime<Utc>, tz: Tz) -> Result<DateTime<Utc>, String> {
        let after = after.with_nanosecond(0).unwrap_or(after);
        if tz == Tz::UTC {
            return self.cron.find_next_occurrence(&after, false).map_err(never);
        }
        if self.wild {
            self.next_wild(after, tz)
        } else {
            self.next_fixed(after, tz)
        }
    }

    /// Wildcard jobs: the first instant after `after` whose local time
    /// matches, walking the zone's offset segments (a repeated local time
    /// matches once per pass; a skipped one never).
    fn next_wild(&self, after: DateTime<Utc>, tz: Tz) -> Result<DateTime<Utc>, String> {
        let (mut start, mut inclusive) = (after, false);
        for _ in 0..MAX_SEGMENTS {
            let offset = offset_at(tz, start);
            let local = Utc.from_utc_datetime(&(start.naive_utc() + offset));
            let hit = self.cron.find_next_occurrence(&local, inclusive).map_err(never)?;
            let at = Utc.from_utc_datetime(&(hit.naive_utc() - offset));
            match next_transition(tz, start, at) {
                None => return Ok(at),
                Some(change) => (start, inclusive) = (change, true),
            }
        }
        Err(format!("no match across {MAX_SEGMENTS} time-zone changes"))
    }

    /// Fixed-time jobs: croner's local-time search (a repeated local time
    /// resolves to its first pass, a skipped one to the end of the gap),
    /// skipping results not after `after` (the first pass of a repeated
    /// time already gone).
    fn next_fixed(&self, after: DateTime<Utc>, tz: Tz) -> Result<DateTime<Utc>, String> {
        let mut from = after.with_timezone(&tz);
        for _ in 0..MAX_SEGMENTS {
            let hit = self.cron.find_next_occurrence(&from, false).map_err(never)?;
            if hit.with_timezone(&Utc) > after {
                return Ok(hit.with_timezone(&Utc));
            }
            // Search on from the same local time's later pass.
            let later = hit.naive_local() + TimeDelta::seconds(1);
            from = match tz.from_local_datetime(&later) {
                chrono::LocalResult::Single(t) => t,
                chrono::LocalResult::Ambiguous(_, second) => second,
                chrono::LocalResult::None => return Err(format!("local time {later} does not exist")),
            };
        }
        Err(format!("no match across {MAX_SEGMENTS} searches"))
    }
}

fn never(e: croner::errors::CronError) -> String {
    format!("never matches again ({e})")
}

/// The zone's UTC offset at `t`.
fn offset_at(tz: Tz, t: DateTime<Utc>) -> TimeDelta {
    TimeDelta::seconds(i64::from(tz.offset_from_utc_datetime(&t.naive_utc()).fix().local_minus_utc()))
}

/// The first instant in `(from, to]` where the zone's offset differs from
/// its offset at `from`, to the second: day steps, then a binary search.
fn next_transition(tz: Tz, from: DateTime<Utc>, to: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let base = offset_at(tz, from);
    let mut lo = from;
    loop {
        if lo >= to {
            return None;
        }
        let hi = (lo + TimeDelta::days(1)).min(to);
        if offset_at(tz, hi) != base {
            // offset(lo) == base, offset(hi) != base: narrow to the second
            // (zones change offset on whole seconds).
            let at = |secs: i64| DateTime::from_timestamp(secs, 0).unwrap_or(hi);
            let (mut a, mut b) = (lo.timestamp(), hi.timestamp() + i64::from(hi.timestamp_subsec_nanos() > 0));
            while b - a > 1 {
                let mid = a + (b - a) / 2;
                if offset_at(tz, at(mid)) == base {
                    a = mid;
                } else {
                    b = mid;
                }
            }
            return Some(at(b));
        }
        lo = hi;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).map(|d| d.with_timezone(&Utc)).expect("time")
    }

    #[test]
    fn transitions_are_found_to_the_second() {
        let berlin: Tz = "Europe/Berlin".parse().expect("zone");
        let got = next_transition(berlin, t("2024-10-20T00:00:00Z"), t("2024-11-01T00:00:00Z"));
        assert_eq!(got, Some(t("2024-10-27T01:00:00Z")));
        assert_eq!(next_transition(berlin, t("2024-11-01T00:00:00Z"), t("2024-12-01T00:00:00Z")), None);
    }

    #[test]
    fn flags_follow_the_first_character() {
        let e = CronExpr::parse("*/15 2 * * *").expect("valid");
        assert!(e.is_wild());
        assert!(!CronExpr::parse("30 2 * * *").expect("valid").is_wild());
        assert!(CronExpr::parse("@hourly").expect("valid").is_wild());
        assert!(!CronExpr::parse("@daily").expect("valid").is_wild());
    }
}
