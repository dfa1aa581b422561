//! The process's descriptor limit (`RLIMIT_NOFILE`): every eMQP and text
//! connection costs one descriptor, so the router raises its soft limit to
//! the hard one at start, and the text acceptors refuse text connections
//! before the descriptors left for eMQP and admin run out
//! (`crate::text`, `accept.rs`). A leaf: the settings check against it
//! as well as the front ends.

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

/// The hard descriptor limit: the soft limit the router runs with once it
/// has raised it ([`raise_nofile_limit`]).
///
/// # Errors
/// The OS error of `getrlimit(2)`.
pub fn hard_nofile_limit() -> io::Result<u64> {
    Ok(get()?.rlim_max)
}

/// The lowest descriptor number free now, which is the number of the next
/// descriptor opened (an accepted connection's, say): every one below it
/// is open. `limit` when none is free (`EMFILE`).
///
/// # Errors
/// Opening `/dev/null` failed otherwise.
pub fn lowest_free(limit: u64) -> io::Result<u64> {
    use std::os::fd::AsRawFd;
    match std::fs::File::open("/dev/null") {
        Ok(file) => Ok(u64::try_from(file.as_raw_fd()).unwrap_or(0)),
        Err(e) if e.raw_os_error() == Some(libc::EMFILE) => Ok(limit),
        Err(e) => Err(e),
    }
}

/// Whether the text front end's descriptor settings fit the descriptor
/// limit `limit` with `open` descriptors open (the lowest free one,
/// [`lowest_free`]): a text connection is refused `ERR BUSY too few
/// descriptors left` when its descriptor is `limit - reserved_fds` or
/// above, so at most `limit - reserved_fds - open` connections fit.
///
/// # Errors
/// Why none fits (every text connection would be refused), naming
/// `text_reserved_fds` and the limit: the router does not start. `Ok(Some)`
/// is a warning: fewer than `max_connections` fit (the router starts; the
/// connections past the room get `ERR BUSY`).
pub fn check_text_reserve(
    reserved_fds: usize,
    max_connections: usize,
    limit: u64,
    open: u64,
) -> Result<Option<String>, String> {
    let reserved = reserved_fds as u64;
    let room = limit.saturating_sub(reserved).saturating_sub(open);
    if room == 0 {
        return Err(format!(
            "{reserved} leaves no descriptor for text connections: the descriptor limit (RLIMIT_NOFILE) is \
             {limit} and {open} are open at start, so every text connection would get ERR BUSY too few \
             descriptors left; lower text_reserved_fds or raise the limit (ulimit -n)"
        ));
    }
    Ok((room < max_connections as u64).then(|| {
        format!(
            "text_max_connections ({max_connections}) cannot all be open: the descriptor limit (RLIMIT_NOFILE) \
             of {limit}, less text_reserved_fds ({reserved}) and the {open} descriptors open at start, leaves \
             room for {room} text connections; past them a client gets ERR BUSY too few descriptors left"
        )
    }))
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
    fn the_text_reserve_must_leave_room_for_one_connection() {
        let none = "leaves no descriptor for text connections: the descriptor limit (RLIMIT_NOFILE) is";
        assert_eq!(
            check_text_reserve(30_000, 10_000, 20_000, 40),
            Err(format!(
                "30000 {none} 20000 and 40 are open at start, so every text connection would get ERR BUSY too \
                 few descriptors left; lower text_reserved_fds or raise the limit (ulimit -n)"
            ))
        );
        assert!(check_text_reserve(19_960, 10_000, 20_000, 40).is_err(), "exactly no room");
        assert_eq!(
            check_text_reserve(19_959, 1, 20_000, 40),
            Ok(None),
            "room for one: descriptor 40 is below 20,000 - 19,959"
        );
        assert_eq!(
            check_text_reserve(256, 10_000, 4_096, 60),
            Ok(Some(
                "text_max_connections (10000) cannot all be open: the descriptor limit (RLIMIT_NOFILE) of 4096, \
                 less text_reserved_fds (256) and the 60 descriptors open at start, leaves room for 3780 text \
                 connections; past them a client gets ERR BUSY too few descriptors left"
                    .to_string()
            ))
        );
        assert_eq!(check_text_reserve(256, 3_780, 4_096, 60), Ok(None), "exactly enough room");
    }

    #[test]
    fn the_lowest_free_descriptor_is_above_the_standard_ones() {
        let free = lowest_free(get().unwrap().rlim_max).unwrap();
        assert!(free > 2, "stdin, stdout and stderr are open: {free}");
    }

    #[test]
    fn raising_keeps_the_hard_limit() {
        let hard = get().unwrap().rlim_max;
        assert_eq!(raise_nofile_limit().unwrap(), hard);
        assert_eq!(nofile_limit().unwrap(), hard);
    }
}
