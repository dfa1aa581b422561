//! What every target shares: timing of each input (the slowest so far is
//! printed, so a run's log ends with its slowest input).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

static SLOWEST_US: AtomicU64 = AtomicU64::new(0);

/// Runs `f`, printing `slowest input: N µs` whenever an input is slower
/// than every earlier one of this process.
pub fn timed(f: impl FnOnce()) {
    let start = Instant::now();
    f();
    let us = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX);
    if us > SLOWEST_US.fetch_max(us, Ordering::Relaxed) {
        eprintln!("slowest input: {us} µs");
    }
}
