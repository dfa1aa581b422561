//! Point 7: cron as cron. A table of expressions and their expected fire
//! times, each row built from cron's documented rules (crontab(5) of
//! Vixie/ISC cron, and its man page's notes on daylight saving time), not
//! from what any library computes.

use chrono::{DateTime, SecondsFormat, Utc};
use chrono_tz::Tz;
use emq::scheduler::cron::CronExpr;

fn t(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).map(|d| d.with_timezone(&Utc)).expect("an RFC 3339 time")
}

/// The next `n` fire times of `expr` in `tz` strictly after `from`.
fn fires(expr: &str, tz: &str, from: &str, n: usize) -> Vec<String> {
    let cron = CronExpr::parse(expr).unwrap_or_else(|e| panic!("{expr}: {e}"));
    let tz: Tz = tz.parse().expect("a time zone");
    let mut at = t(from);
    (0..n)
        .map(|_| {
            at = cron.next_after(at, tz).unwrap_or_else(|e| panic!("{expr} after {at}: {e}"));
            at.to_rfc3339_opts(SecondsFormat::Secs, true)
        })
        .collect()
}

/// `(expression, zone, after, expected fires in UTC, the rule)`.
type Row = (&'static str, &'static str, &'static str, &'static [&'static str], &'static str);

const TABLE: &[Row] = &[
    // crontab(5): "If both fields are restricted (i.e., don't start with *), the command will be run when
    // either field matches the current time." A field starting with `*` (here `*/2`) is not restricted:
    // the day must match both. Jan 1 2024 was a Monday; odd days that are Mondays:
    (
        "0 0 */2 * 1",
        "UTC",
        "2024-01-01T00:00:00Z",
        &[
            "2024-01-15T00:00:00Z",
            "2024-01-29T00:00:00Z",
            "2024-02-05T00:00:00Z",
            "2024-02-19T00:00:00Z",
            "2024-03-11T00:00:00Z",
        ],
        "day of month starting with * ANDs with day of week",
    ),
    // crontab(5)'s own example: "30 4 1,15 * 5 would cause a command to be run at 4:30 am on the 1st and
    // 15th of each month, plus every Friday." March 1 2024 was a Friday.
    (
        "30 4 1,15 * 5",
        "UTC",
        "2024-02-29T12:00:00Z",
        &[
            "2024-03-01T04:30:00Z",
            "2024-03-08T04:30:00Z",
            "2024-03-15T04:30:00Z",
            "2024-03-22T04:30:00Z",
            "2024-03-29T04:30:00Z",
            "2024-04-01T04:30:00Z",
        ],
        "both restricted: either matches",
    ),
    (
        "0 0 13 * 5",
        "UTC",
        "2024-09-01T00:00:00Z",
        &[
            "2024-09-06T00:00:00Z",
            "2024-09-13T00:00:00Z",
            "2024-09-20T00:00:00Z",
            "2024-09-27T00:00:00Z",
            "2024-10-04T00:00:00Z",
            "2024-10-11T00:00:00Z",
            "2024-10-13T00:00:00Z",
        ],
        "the 13th or any Friday",
    ),
    (
        "0 0 1,15 * *",
        "UTC",
        "2024-01-10T00:00:00Z",
        &["2024-01-15T00:00:00Z", "2024-02-01T00:00:00Z"],
        "day of week *: day of month alone",
    ),
    (
        "0 0 * * 1",
        "UTC",
        "2024-01-01T00:00:00Z",
        &["2024-01-08T00:00:00Z", "2024-01-15T00:00:00Z"],
        "day of month *: day of week alone",
    ),
    (
        "0 0 29 2 1",
        "UTC",
        "2024-02-20T00:00:00Z",
        &["2024-02-26T00:00:00Z", "2024-02-29T00:00:00Z", "2025-02-03T00:00:00Z"],
        "Feb 29 or any Monday, in February",
    ),
    // crontab(5) examples: "run at 10 pm on weekdays", "run 23 minutes after midn, 2am, 4am ...",
    // "run at 5 after 4 every sunday".
    ("0 22 * * 1-5", "UTC", "2024-03-01T23:00:00Z", &["2024-03-04T22:00:00Z", "2024-03-05T22:00:00Z"], "weekdays"),
    (
        "23 0-23/2 * * *",
        "UTC",
        "2024-03-01T00:00:00Z",
        &["2024-03-01T00:23:00Z", "2024-03-01T02:23:00Z", "2024-03-01T04:23:00Z"],
        "a range with a step",
    ),
    ("5 4 * * sun", "UTC", "2024-03-01T00:00:00Z", &["2024-03-03T04:05:00Z", "2024-03-10T04:05:00Z"], "day names"),
    (
        "0 0 */10 * *",
        "UTC",
        "2024-01-05T00:00:00Z",
        &["2024-01-11T00:00:00Z", "2024-01-21T00:00:00Z", "2024-01-31T00:00:00Z", "2024-02-01T00:00:00Z"],
        "steps from 1",
    ),
    ("0 12 29 2 *", "UTC", "2025-03-01T00:00:00Z", &["2028-02-29T12:00:00Z", "2032-02-29T12:00:00Z"], "leap days only"),
    ("@monthly", "UTC", "2024-01-31T23:59:59Z", &["2024-02-01T00:00:00Z", "2024-03-01T00:00:00Z"], "nickname"),
    (
        "*/15 * * * *",
        "UTC",
        "2024-01-01T00:07:30Z",
        &["2024-01-01T00:15:00Z", "2024-01-01T00:30:00Z"],
        "strictly after, at second 0",
    ),
    // Vixie cron's man page: "Jobs which are specified with wildcards are run based on the new time
    // immediately" — a wildcard job (minute or hour field starting with *) follows the local clock: at the
    // autumn change (Europe/Berlin, 2024-10-27 01:00Z, 03:00 CEST -> 02:00 CET) the repeated hour runs
    // again, so an hourly job fires every real hour; a spring change's skipped hour never comes.
    (
        "0 * * * *",
        "Europe/Berlin",
        "2024-10-26T22:30:00Z",
        &["2024-10-26T23:00:00Z", "2024-10-27T00:00:00Z", "2024-10-27T01:00:00Z", "2024-10-27T02:00:00Z"],
        "wildcard hour: every real hour through the repeated one",
    ),
    (
        "@hourly",
        "Europe/Berlin",
        "2024-10-26T22:30:00Z",
        &["2024-10-26T23:00:00Z", "2024-10-27T00:00:00Z", "2024-10-27T01:00:00Z", "2024-10-27T02:00:00Z"],
        "@hourly is a wildcard job",
    ),
    (
        "0 * * * *",
        "Europe/Berlin",
        "2024-03-30T23:30:00Z",
        &["2024-03-31T00:00:00Z", "2024-03-31T01:00:00Z", "2024-03-31T02:00:00Z"],
        "wildcard hour: every real hour across the skipped one",
    ),
    (
        "*/20 2 * * *",
        "Europe/Berlin",
        "2024-10-26T23:50:00Z",
        &[
            "2024-10-27T00:00:00Z",
            "2024-10-27T00:20:00Z",
            "2024-10-27T00:40:00Z",
            "2024-10-27T01:00:00Z",
            "2024-10-27T01:20:00Z",
            "2024-10-27T01:40:00Z",
            "2024-10-28T01:00:00Z",
        ],
        "wildcard minute in a fixed hour: both passes of 02:xx",
    ),
    (
        "*/20 2 * * *",
        "Europe/Berlin",
        "2024-03-30T12:00:00Z",
        &["2024-04-01T00:00:00Z", "2024-04-01T00:20:00Z"],
        "wildcard minute: the skipped 02:xx never comes",
    ),
    // "If the time has moved backwards by less than 3 hours, those jobs that fall into the repeated time
    // will not be re-run" and "if the time has moved forwards, those jobs which would have run in the
    // time that was skipped will be run soon after the change": fixed-time jobs run once.
    (
        "30 2 * * *",
        "Europe/Berlin",
        "2024-10-26T12:00:00Z",
        &["2024-10-27T00:30:00Z", "2024-10-28T01:30:00Z"],
        "fixed time: the repeated 02:30 runs once, at its first pass",
    ),
    (
        "30 2 * * *",
        "Europe/Berlin",
        "2024-10-27T01:15:00Z",
        &["2024-10-28T01:30:00Z"],
        "fixed time, asked during the second pass: not again",
    ),
    (
        "30 2 * * *",
        "Europe/Berlin",
        "2024-03-30T12:00:00Z",
        &["2024-03-31T01:00:00Z", "2024-04-01T00:30:00Z"],
        "fixed time: a skipped 02:30 runs right after the gap",
    ),
    (
        "0 3 * * *",
        "Europe/Berlin",
        "2024-10-26T12:00:00Z",
        &["2024-10-27T02:00:00Z", "2024-10-28T02:00:00Z"],
        "03:00 happens once",
    ),
    (
        "30 2 * * *",
        "America/New_York",
        "2024-03-09T12:00:00Z",
        &["2024-03-10T07:00:00Z", "2024-03-11T06:30:00Z"],
        "US spring change: right after the gap",
    ),
    (
        "0 * * * *",
        "America/New_York",
        "2024-11-03T04:30:00Z",
        &["2024-11-03T05:00:00Z", "2024-11-03T06:00:00Z", "2024-11-03T07:00:00Z"],
        "US autumn change: every real hour",
    ),
    (
        "* * 29 2 *",
        "Europe/Berlin",
        "2024-03-01T00:00:00Z",
        &["2028-02-28T23:00:00Z", "2028-02-28T23:01:00Z"],
        "years ahead, in local time",
    ),
];

#[test]
fn cron_table_follows_crontab_5_and_its_dst_rules() {
    let mut wrong = Vec::new();
    for (expr, tz, from, want, rule) in TABLE {
        let got = fires(expr, tz, from, want.len());
        if got != *want {
            wrong.push(format!("{expr} in {tz} after {from} ({rule}):\n  want {want:?}\n  got  {got:?}"));
        }
    }
    assert!(wrong.is_empty(), "{} of {} rows differ:\n{}", wrong.len(), TABLE.len(), wrong.join("\n"));
}

#[test]
fn what_cron_does_not_take_is_refused() {
    for bad in ["", "* * * *", "0 0 * * * *", "@reboot", "@sometimes", "61 * * * *", "* 24 * * *", "* * 32 * *"] {
        assert!(CronExpr::parse(bad).is_err(), "{bad:?} accepted");
    }
    let never = CronExpr::parse("0 0 30 2 *").expect("parses");
    assert!(never.next_after(t("2024-01-01T00:00:00Z"), Tz::UTC).is_err(), "February 30th never comes");
}
