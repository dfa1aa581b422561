//! The retry policy (README "Retries and the dead set"): why a delivery of
//! a job came to nothing ([`crate::job::Setback`]), how many such setbacks a job may
//! have before it goes to the dead set ([`allowed_retries`]) and how long a
//! failed job waits before its next try ([`backoff`]). Pure functions: the
//! shard applies them (`src/broker/shard/dead.rs`).

use std::time::Duration;

use crate::job::{Job, MAX_REDELIVERIES_COUNTED};
use crate::protocol::headers;

pub use crate::limits::MAX_RETRIES_HEADER;

const _: () = assert!(MAX_RETRIES_HEADER < MAX_REDELIVERIES_COUNTED);

/// The `retry:N` header of a REQUEST: how many retries the job may have,
/// when present and a whole number (capped at [`MAX_RETRIES_HEADER`]; a
/// malformed value is ignored, as EventMQ's workers ignore a malformed
/// `timeout:N`).
pub fn header_retries(headers: &[u8]) -> Option<u32> {
    let n = headers::whole_number(headers, b"retry")?;
    Some(n.min(u64::from(MAX_RETRIES_HEADER)) as u32)
}

/// How many setbacks `job` may have and still be tried again: its
/// `retry:N` header, else the router's `max_retries` (which the
/// configuration keeps at most [`MAX_RETRIES_HEADER`]). A job whose [`Job::redeliveries`] passes this
/// goes to the dead set.
pub fn allowed_retries(job: &Job, max_retries: u32) -> u32 {
    header_retries(job.frames.headers()).unwrap_or(max_retries.min(MAX_RETRIES_HEADER))
}

/// How long a job waits before try `attempt + 1` after its `attempt`-th
/// setback (1 for the first): `base × 2^(attempt-1)`, at most `max`, less
/// a jitter of up to a quarter drawn from `seed` (the job id, so that jobs
/// failing together spread out while one job's waits are reproducible).
/// With the jitter at most a quarter, each wait is at least 1.5× the one
/// before until `max` is reached: the waits always grow.
pub fn backoff(attempt: u32, base: Duration, max: Duration, seed: u64) -> Duration {
    let doubling = 1u32 << attempt.saturating_sub(1).min(30);
    let full = base.saturating_mul(doubling).min(max);
    let unit = (splitmix64(seed ^ u64::from(attempt).rotate_left(32)) >> 11) as f64 / (1u64 << 53) as f64;
    full.mul_f64(1.0 - unit / 4.0)
}

/// SplitMix64 (Steele, Lea and Flood 2014): one well-mixed word from `x`.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_retry_header_is_a_whole_number_capped() {
        assert_eq!(header_retries(b"reply-requested,retry:2"), Some(2));
        assert_eq!(header_retries(b"retry: 0 ,guarantee"), Some(0));
        assert_eq!(header_retries(b"retry:999999999999999999999"), Some(MAX_RETRIES_HEADER), "past a u64: capped");
        assert_eq!(header_retries(b"retry:1000"), Some(MAX_RETRIES_HEADER));
        for none in [&b""[..], b"retry:-1", b"retry:1.5", b"retry:x", b"retry-count:3", b"retry"] {
            assert_eq!(header_retries(none), None, "{:?}", String::from_utf8_lossy(none));
        }
    }

    #[test]
    fn waits_double_with_at_most_a_quarter_off_and_stop_at_the_max() {
        let (base, max) = (Duration::from_secs(1), Duration::from_secs(60));
        for seed in 0..1_000u64 {
            let waits: Vec<Duration> = (1..=10).map(|a| backoff(a, base, max, seed)).collect();
            for (i, w) in waits.iter().enumerate() {
                let full = base.saturating_mul(1 << i).min(max);
                assert!(*w <= full && *w >= full.mul_f64(0.75), "seed {seed} attempt {}: {w:?}", i + 1);
            }
            for pair in waits.windows(2).take(5) {
                assert!(pair[1] >= pair[0].mul_f64(1.5), "seed {seed}: {pair:?}");
            }
        }
        assert_eq!(backoff(3, base, max, 7), backoff(3, base, max, 7), "reproducible");
        assert!(backoff(200, base, max, 1) <= max, "huge attempts stay at the max");
        assert_eq!(backoff(1, Duration::ZERO, max, 1), Duration::ZERO);
    }
}
