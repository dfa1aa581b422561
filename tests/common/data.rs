//! Fresh data directories for routers under test, so that no test ever
//! writes into a user's state directory (`$XDG_STATE_HOME/emq-router`, the
//! router's default).
//!
//! [`fresh`] makes `$CARGO_TARGET_TMPDIR/router-data/<pid>-<seq>` (inside
//! `target/`) and remembers it for the calling thread; the test's
//! [`super::watchdog::Watchdog`] removes the directories its thread made
//! when it is dropped, after the test's router (declared later) is gone.

use std::cell::RefCell;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

static SEQ: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static MADE: RefCell<Vec<PathBuf>> = const { RefCell::new(Vec::new()) };
}

/// A new, empty data directory for one router.
pub fn fresh() -> PathBuf {
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let path =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("router-data").join(format!("{}-{seq}", std::process::id()));
    let _ = std::fs::remove_dir_all(&path);
    std::fs::create_dir_all(&path).expect("create a router data dir");
    MADE.with(|m| m.borrow_mut().push(path.clone()));
    path
}

/// Removes the directories [`fresh`] made on this thread (kept when the
/// thread is panicking, so a failed test's log can be read).
pub fn remove_mine() {
    let made = MADE.with(|m| std::mem::take(&mut *m.borrow_mut()));
    for path in made {
        if std::thread::panicking() {
            eprintln!("test failed: kept its router data in {}", path.display());
        } else {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}
