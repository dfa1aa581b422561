//! Cron: parsing never panics, and the next fire of what parses comes
//! strictly after the start time, on a whole minute, in every zone tried.
//!
//! Input: byte 0 picks the zone and start time, the rest is the expression.
#![no_main]

use chrono::{DateTime, Timelike, Utc};
use chrono_tz::Tz;
use emq::scheduler::cron::CronExpr;
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

const ZONES: [Tz; 5] =
    [Tz::UTC, Tz::Europe__Berlin, Tz::America__New_York, Tz::Australia__Lord_Howe, Tz::Asia__Kolkata];
/// Starts: ordinary, just before a spring change in Berlin and New York,
/// in an autumn change, near a leap day.
const STARTS: [i64; 4] = [1_704_067_200, 1_711_846_799, 1_730_595_600, 1_709_164_740];

fuzz_target!(|data: &[u8]| common::timed(|| {
    let Some((&pick, rest)) = data.split_first() else { return };
    let Ok(text) = std::str::from_utf8(rest) else { return };
    let Ok(cron) = CronExpr::parse(text) else { return };
    let tz = ZONES[usize::from(pick) % ZONES.len()];
    let Some(mut at) = DateTime::<Utc>::from_timestamp(STARTS[usize::from(pick / 8) % STARTS.len()], 0) else {
        return;
    };
    for _ in 0..3 {
        let Ok(next) = cron.next_after(at, tz) else { return };
        assert!(next > at, "{text:?} in {tz}: {next} not after {at}");
        assert_eq!(next.second(), 0, "{text:?}: fires at second 0");
        at = next;
    }
}));
