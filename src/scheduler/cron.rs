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
//! * **Strict syntax** (crontab(5)): a field is a comma-separated list of
//!   items, each `*`, a number or a range `a-b` (numbers, or names in the
//!   month and day-of-week fields), optionally followed by `/step`; no item
//!   may be empty (`, * * * *`, `1,,2` and `5,` are refused), a range may
//!   not run backwards and a step is at least 1. croner's extensions (`?`;
//!   `L` and `nW` in the day of month; `nL` and `n#k` in the day of week)
//!   are kept as croner reads them.
//! * **Bounded search**: an expression whose days never come (`0 0 30 2
//!   *`) parses, and [`CronExpr::next_after`] says so at once instead of
//!   searching to croner's year 5000; for every other expression the next
//!   match is at most a few decades away (a 29 February on a given
//!   weekday), found by stepping through the days of matching months only
//!   before croner searches that day.
//!
//! Times are whole seconds (fires are at second 0); "after" is strict.

use chrono::{DateTime, Offset, TimeDelta, TimeZone, Timelike, Utc};
use chrono_tz::Tz;
use croner::Cron;

/// Most time-zone transitions one search may cross before giving up: far
/// more than any real zone has in the years croner searches.
const MAX_SEGMENTS: usize = 1_000;

/// The five fields: name, least and greatest value (Vixie's; day of week
/// 7 is Sunday, like 0), and the names the field takes.
const FIELDS: [(&str, u32, u32, &[&str]); 5] = [
    ("minute", 0, 59, &[]),
    ("hour", 0, 23, &[]),
    ("day of month", 1, 31, &[]),
    ("month", 1, 12, &["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]),
    ("day of week", 0, 7, &["sun", "mon", "tue", "wed", "thu", "fri", "sat"]),
];

/// Years searched for a day that matches: from 2000, 28 years hold every
/// date on every weekday (the calendar repeats every 28 years between 1901
/// and 2099), and 56 years every 29 February on every weekday.
const DAY_SEARCH_YEARS: (i32, i32, i32) = (2000, 2028, 2056);

/// A parsed cron expression with its Vixie flags.
#[derive(Debug, Clone)]
pub struct CronExpr {
    expr: String,
    cron: Cron,
    wild: bool,
    /// Some day matches (some date of some year); when not, the
    /// expression never fires and [`CronExpr::next_after`] says so.
    some_day: bool,
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
        for (index, field) in parts.iter().enumerate() {
            check_field(index, field)?;
        }
        let star = |f: &str| f.starts_with('*') || f.starts_with('?');
        let mut cron = Cron::new(&parts.join(" "));
        if star(parts[2]) || star(parts[4]) {
            cron.with_dom_and_dow();
        }
        let cron = cron.parse().map_err(|e| e.to_string())?;
        let some_day = some_day_matches(&cron);
        Ok(CronExpr { expr: expr.to_string(), cron, wild: star(parts[0]) || star(parts[1]), some_day })
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
        if !self.some_day {
            return Err("never matches again (no day of any year matches)".into());
        }
        let after = after.with_nanosecond(0).unwrap_or(after);
        let after = self.skip_days_that_cannot_match(after, tz);
        if tz == Tz::UTC {
            return self.cron.find_next_occurrence(&after, false).map_err(never);
        }
        if self.wild {
            self.next_wild(after, tz)
        } else {
            self.next_fixed(after, tz)
        }
    }

    /// `after`, or when no day from `after`'s local date up to a later
    /// matching date can fire, the second before that date's first local
    /// instant (module docs, "Bounded search"): croner walks every day in
    /// between; this walks only the days of matching months, so a job that
    /// fires once in 28 years (`0 0 * 2 4#5`) costs hundreds of day checks,
    /// not thousands. Unchanged when that instant does not exist (a
    /// midnight skipped by a clock change) or no such date is near.
    fn skip_days_that_cannot_match(&self, after: DateTime<Utc>, tz: Tz) -> DateTime<Utc> {
        let from = after.with_timezone(&tz).date_naive();
        // Today only while some of its times are still to come.
        let first = if self.may_fire_later_today(after, tz) { Some(from) } else { from.succ_opt() };
        let Some(day) = first.and_then(|first| self.first_matching_day(first)) else { return after };
        if day <= from {
            return after;
        }
        match tz.from_local_datetime(&day.and_time(chrono::NaiveTime::MIN)) {
            chrono::LocalResult::Single(t) | chrono::LocalResult::Ambiguous(t, _) => {
                (t.with_timezone(&Utc) - TimeDelta::seconds(1)).max(after)
            }
            chrono::LocalResult::None => after,
        }
    }

    /// Whether an hour and minute the expression matches is at or after
    /// `after`'s local time of day, or the zone's offset changes within a
    /// day of `after` (a repeated hour may bring earlier times back): when
    /// not, nothing fires later on `after`'s local date. At most 24 hour
    /// checks and one minute search per hour.
    fn may_fire_later_today(&self, after: DateTime<Utc>, tz: Tz) -> bool {
        if next_transition(tz, after, after + TimeDelta::hours(26)).is_some() {
            return true;
        }
        let now = after.with_timezone(&tz).time();
        let pattern = &self.cron.pattern;
        (now.hour()..24).any(|h| {
            let from_minute = if h == now.hour() { now.minute() } else { 0 };
            pattern.hour_match(h).unwrap_or(true)
                && pattern.next_minute_match(from_minute).map_or(true, |m| m.is_some())
        })
    }

    /// The first date from `from` on whose month, day of month and day of
    /// week match, within [`DAY_SEARCH_YEARS`]'s span of years.
    fn first_matching_day(&self, from: chrono::NaiveDate) -> Option<chrono::NaiveDate> {
        use chrono::{Datelike, NaiveDate};
        let pattern = &self.cron.pattern;
        let span = DAY_SEARCH_YEARS.2 - DAY_SEARCH_YEARS.0;
        let (mut year, mut month, mut first) = (from.year(), from.month(), from.day());
        for _ in 0..(span * 12) {
            if pattern.month_match(month).unwrap_or(false) {
                let next_month = if month == 12 { (year + 1, 1) } else { (year, month + 1) };
                let last = NaiveDate::from_ymd_opt(next_month.0, next_month.1, 1)?.pred_opt()?.day();
                for day in first..=last {
                    if pattern.day_match(year, month, day).unwrap_or(false) {
                        return NaiveDate::from_ymd_opt(year, month, day);
                    }
                }
            }
            (first, month) = (1, month % 12 + 1);
            if month == 1 {
                year += 1;
            }
        }
        None
    }

    /// Wildcard jobs: the first instant after `after` whose local time
    /// matches, walking the zone's offset segments (a repeated local time
    /// matches once per pass; a skipped one never).
    fn next_wild(&self, after: DateTime<Utc>, tz: Tz) -> Result<DateTime<Utc>, String> {
        let (mut start, mut inclusive) = (after, false);
        for _ in 0..MAX_SEGMENTS {
            // Segments whose days cannot match are passed without a search.
            start = self.skip_days_that_cannot_match(start, tz);
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

/// Checks field `index` against crontab(5)'s grammar (module docs); the
/// values' meaning is left to croner.
fn check_field(index: usize, field: &str) -> Result<(), String> {
    let (name, min, max, names) = FIELDS[index];
    let bad = |why: &str| Err(format!("{name} field {field:?}: {why}"));
    for item in field.split(',') {
        if item.is_empty() {
            return bad("empty list item");
        }
        let upper = item.to_ascii_uppercase();
        let extension = match index {
            2 => upper == "L" || upper.strip_suffix('W').is_some_and(|n| number(n, min, max).is_some()),
            4 => match upper.split_once('#') {
                Some((day, nth)) => value(day, min, max, names).is_some() && matches!(nth, "1" | "2" | "3" | "4" | "5"),
                None => upper.strip_suffix('L').is_some_and(|day| value(day, min, max, names).is_some()),
            },
            _ => false,
        };
        if extension {
            continue;
        }
        let (range, step) = match item.split_once('/') {
            Some((range, step)) => (range, Some(step)),
            None => (item, None),
        };
        if let Some(step) = step {
            if number(step, 1, u32::from(u8::MAX)).is_none() {
                return bad("a step is a number from 1");
            }
        }
        if range == "*" || (range == "?" && (index == 2 || index == 4)) {
            continue;
        }
        let (low, high) = match range.split_once('-') {
            Some((low, high)) => (value(low, min, max, names), value(high, min, max, names)),
            None => (value(range, min, max, names), Some(max)),
        };
        match (low, high) {
            (Some(low), Some(high)) if low <= high => {}
            (Some(_), Some(_)) => return bad("a range runs from low to high"),
            _ => return bad(&format!("expected *, a number from {min} to {max}, a range or a name")),
        }
    }
    Ok(())
}

/// A decimal number from `min` to `max` (at most 3 digits, so no overflow).
fn number(text: &str, min: u32, max: u32) -> Option<u32> {
    if text.is_empty() || text.len() > 3 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok().filter(|n| (min..=max).contains(n))
}

/// A number, or a name of the field (`jan` is 1, `sun` is 0).
fn value(text: &str, min: u32, max: u32, names: &[&str]) -> Option<u32> {
    let first = u32::from(min == 1);
    let named = names.iter().position(|n| n.eq_ignore_ascii_case(text));
    named.and_then(|i| u32::try_from(i).ok()).map(|i| i + first).or_else(|| number(text, min, max))
}

/// Whether some date matches the month, day-of-month and day-of-week
/// fields (module docs, "Bounded search"): at most 10,227 dates tried, and
/// only for expressions that match no day at all.
fn some_day_matches(cron: &Cron) -> bool {
    use chrono::{Datelike, NaiveDate};
    let (from, every_weekday, every_leap_day) = DAY_SEARCH_YEARS;
    let matches = |y: i32, m: u32, d: u32| {
        cron.pattern.month_match(m).unwrap_or(false) && cron.pattern.day_match(y, m, d).unwrap_or(false)
    };
    let dates = (from..every_weekday).flat_map(|y| {
        let first = NaiveDate::from_ymd_opt(y, 1, 1);
        first.into_iter().flat_map(move |d| d.iter_days().take_while(move |d| d.year() == y))
    });
    let leap_days = (every_weekday..every_leap_day).filter_map(|y| NaiveDate::from_ymd_opt(y, 2, 29));
    dates.chain(leap_days).any(|d| matches(d.year(), d.month(), d.day()))
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
    fn skipping_days_that_cannot_match_changes_no_answer() {
        let berlin: Tz = "Europe/Berlin".parse().expect("zone");
        let rare = CronExpr::parse("0 0 * 2 4#5").expect("parses");
        assert_eq!(rare.next_after(t("2024-01-01T00:00:00Z"), Tz::UTC), Ok(t("2024-02-29T00:00:00Z")));
        assert_eq!(rare.next_after(t("2024-02-29T00:00:00Z"), Tz::UTC), Ok(t("2052-02-29T00:00:00Z")));
        assert_eq!(rare.next_after(t("2024-01-01T00:00:00Z"), berlin), Ok(t("2024-02-28T23:00:00Z")));
        // croner alone (no skipping) gives the same answers in UTC.
        let exprs =
            ["0 0 * 2 4#5", "*/7 3 * 2 6#5", "5 4 29 2 *", "0 12 30W * *", "* 2 13 * 5", "0 0 L 2 *", "0 9 * * 1-5"];
        let starts = ["2024-01-01T00:00:00Z", "2024-02-29T23:59:59Z", "2031-12-31T23:00:00Z", "2099-06-15T12:34:00Z"];
        for e in exprs {
            let c = CronExpr::parse(e).expect("parses");
            for s in starts {
                let plain = c.cron.find_next_occurrence(&t(s), false).map_err(never);
                assert_eq!(c.next_after(t(s), Tz::UTC), plain, "{e} after {s}");
            }
        }
    }

    #[test]
    fn transitions_are_found_to_the_second() {
        let berlin: Tz = "Europe/Berlin".parse().expect("zone");
        let got = next_transition(berlin, t("2024-10-20T00:00:00Z"), t("2024-11-01T00:00:00Z"));
        assert_eq!(got, Some(t("2024-10-27T01:00:00Z")));
        assert_eq!(next_transition(berlin, t("2024-11-01T00:00:00Z"), t("2024-12-01T00:00:00Z")), None);
    }

    #[test]
    fn empty_list_items_and_malformed_fields_are_refused() {
        let bad = [
            ", * * * *",
            "1,,2 * * * *",
            "5, * * * *",
            "* * * * 1,",
            "* * ,1 * *",
            ", , , , ,",
            "*/0 * * * *",
            "*/ * * * *",
            "/5 * * * *",
            "5-1 * * * *",
            "1- * * * *",
            "-1 * * * *",
            "1-2-3 * * * *",
            "* * * jan,,feb *",
            "* * * * mon-",
            "mon * * * *",
            "* * * 13 *",
            "* * * * 8",
            "1000 * * * *",
            "* * ? ? ?",
            "* * 32W * *",
            "* * * * 5#6",
        ];
        for expr in bad {
            assert!(CronExpr::parse(expr).is_err(), "{expr:?} accepted");
        }
        let good = [
            "1,2 * * * *",
            "0 0 * jan-mar mon-fri",
            "0 0 * JAN,Dec Sun",
            "*/5 1-23/2 * * *",
            "5/15 * * * *",
            "0 0 L * *",
            "0 0 15W * *",
            "0 0 * * 5L",
            "0 0 * * 5#2",
            "0 0 ? * *",
            "0 0 * * 0,7",
        ];
        for expr in good {
            let cron = CronExpr::parse(expr).unwrap_or_else(|e| panic!("{expr:?}: {e}"));
            assert!(cron.next_after(t("2024-01-01T00:00:00Z"), Tz::UTC).is_ok(), "{expr:?} never fires");
        }
    }

    /// Issue 10: `, * * * *` used to parse as a minute field matching
    /// nothing, and the next-fire search then ran to the year 5000.
    /// Expressions whose days never come are answered at once; the rarest
    /// days that do come are found.
    #[test]
    fn next_fire_of_pathological_expressions() {
        let from = t("2024-01-02T00:00:00Z");
        for never in ["0 0 30 2 *", "0 0 31 2,4,6,9,11 *", "0 0 30,31 feb *", "* * 31 4 *"] {
            let cron = CronExpr::parse(never).unwrap_or_else(|e| panic!("{never:?}: {e}"));
            let got = cron.next_after(from, Tz::UTC);
            assert!(got.as_ref().is_err_and(|e| e.contains("never matches")), "{never:?}: {got:?}");
            let berlin: Tz = "Europe/Berlin".parse().expect("zone");
            assert!(cron.next_after(from, berlin).is_err(), "{never:?} in Berlin");
        }
        let fires = |expr: &str, tz: Tz, n: usize| {
            let cron = CronExpr::parse(expr).unwrap_or_else(|e| panic!("{expr:?}: {e}"));
            let mut at = from;
            (0..n)
                .map(|_| {
                    at = cron.next_after(at, tz).unwrap_or_else(|e| panic!("{expr:?}: {e}"));
                    at
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(fires("0 0 29 2 *", Tz::UTC, 2), [t("2024-02-29T00:00:00Z"), t("2028-02-29T00:00:00Z")]);
        // Day of month starting with `*` ANDs with the day of week: the 1st
        // or 29th of February that is a Monday.
        assert_eq!(
            fires("0 0 */28 2 1", Tz::UTC, 3),
            [t("2027-02-01T00:00:00Z"), t("2038-02-01T00:00:00Z"), t("2044-02-01T00:00:00Z")]
        );
        let berlin: Tz = "Europe/Berlin".parse().expect("zone");
        assert_eq!(fires("59 23 29 2 *", berlin, 2), [t("2024-02-29T22:59:00Z"), t("2028-02-29T22:59:00Z")]);
        assert_eq!(
            fires("*/30 23 29 2 *", berlin, 3),
            [t("2024-02-29T22:00:00Z"), t("2024-02-29T22:30:00Z"), t("2028-02-29T22:00:00Z")]
        );
        // 100,000 list items: parsed in one pass, matching what they list.
        let minutes = (0..100_000).map(|i| (i % 60 / 15 * 15).to_string()).collect::<Vec<_>>().join(",");
        let cron = CronExpr::parse(&format!("{minutes} 3 * * *")).expect("a long list");
        assert_eq!(cron.next_after(t("2024-01-01T03:20:00Z"), Tz::UTC), Ok(t("2024-01-01T03:30:00Z")));
        let empty_last = format!("{minutes}, 3 * * *");
        assert!(CronExpr::parse(&empty_last).is_err(), "an empty item after 100,000 good ones");
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
