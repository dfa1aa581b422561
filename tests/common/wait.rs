//! Poll-until-condition helpers: tests wait for a state, never for a time.

use std::thread;
use std::time::{Duration, Instant};

/// How often [`until`] re-checks its condition.
pub const POLL: Duration = Duration::from_millis(50);

/// Calls `cond` every [`POLL`] until it returns true (→ `true`) or `timeout`
/// has passed (→ `false`). `cond` is always called at least once.
pub fn until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(POLL);
    }
}

/// Like [`until`], but `check` returns `Ok(value)` when done and
/// `Err(reason)` otherwise; on timeout the last reason is returned.
pub fn until_ok<T>(timeout: Duration, mut check: impl FnMut() -> Result<T, String>) -> Result<T, String> {
    let deadline = Instant::now() + timeout;
    loop {
        let why = match check() {
            Ok(value) => return Ok(value),
            Err(why) => why,
        };
        if Instant::now() >= deadline {
            return Err(format!("still not done after {timeout:?}: {why}"));
        }
        thread::sleep(POLL);
    }
}
