//! A per-test time limit. [`start`] returns a guard; if the guard is not
//! dropped within the limit, the watchdog prints which test hung, kills every
//! child process group still registered with [`super::proc`], unmounts what
//! [`super::mounts`] mounted, and aborts the
//! whole test binary (a hung test must not hang CI; rust-zmq's tests do the
//! same). Dropping the guard (test passed or panicked) disarms it.

use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// Disarms the watchdog when dropped.
pub struct Watchdog {
    done: Arc<(Mutex<bool>, Condvar)>,
}

/// Arms a watchdog for the test `name`: after `limit` the process aborts.
pub fn start(name: &str, limit: Duration) -> Watchdog {
    let done = Arc::new((Mutex::new(false), Condvar::new()));
    let seen = Arc::clone(&done);
    let name = name.to_string();
    thread::Builder::new()
        .name(format!("watchdog-{name}"))
        .spawn(move || guard(&name, limit, &seen))
        .expect("spawn watchdog thread");
    Watchdog { done }
}

fn guard(name: &str, limit: Duration, done: &(Mutex<bool>, Condvar)) {
    let deadline = Instant::now() + limit;
    let (lock, cvar) = done;
    let mut finished = lock.lock().unwrap_or_else(|e| e.into_inner());
    while !*finished {
        let now = Instant::now();
        if now >= deadline {
            eprintln!("watchdog: test {name} exceeded its {limit:?} limit; killing children and aborting");
            super::proc::kill_all_registered();
            super::mounts::unmount_all_registered();
            std::process::abort();
        }
        finished = cvar.wait_timeout(finished, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
    }
}

impl Watchdog {
    /// [`start`] with a limit in seconds.
    pub fn new(name: &str, secs: u64) -> Watchdog {
        start(name, Duration::from_secs(secs))
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        super::data::remove_mine();
        let (lock, cvar) = &*self.done;
        *lock.lock().unwrap_or_else(|e| e.into_inner()) = true;
        cvar.notify_all();
    }
}
