//! The process's descriptor limit (`RLIMIT_NOFILE`): every text connection
//! costs one descriptor, so the router raises its soft limit to the hard
//! one at start, and the acceptors refuse text connections before the
//! descriptors left for eMQP and admin run out (see `accept.rs`).

use std::io;

/// The soft descriptor limit now.
///
/// # Errors
/// The OS error of `getrlimit(2)`.
pub fn nofile_limit() -> io::Result<u64> {
    Ok(get()?.rlim_cur)
}

/// Raises the soft descriptor limit to the hard limit and logs the figure
/// (the limit before when it changed). Returns the soft limit now in force.
///
/// # Errors
/// The OS error of `getrlimit(2)` or `setrlimit(2)`.
pub fn raise_nofile_limit() -> io::Result<u64> {
    let mut limit = get()?;
    let before = limit.rlim_cur;
    if limit.rlim_cur < limit.rlim_max {
        limit.rlim_cur = limit.rlim_max;
        // SAFETY: setrlimit reads one initialised `rlimit` from a live
        // reference; it has no other preconditions.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    tracing::info!(limit = limit.rlim_cur, before, "descriptor limit (RLIMIT_NOFILE)");
    Ok(limit.rlim_cur)
}

fn get() -> io::Result<libc::rlimit> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one `rlimit` into a live, exclusive reference.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raising_keeps_the_hard_limit() {
        let hard = get().unwrap().rlim_max;
        assert_eq!(raise_nofile_limit().unwrap(), hard);
        assert_eq!(nofile_limit().unwrap(), hard);
    }
}
