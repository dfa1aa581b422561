//! Counters and latency histograms over plain keys: a leaf module that
//! imports only [`crate::ids`] and [`crate::limits`]. Collecting and
//! reporting them is the router's job (src/router).

pub mod counters;
pub mod latency;

/// Gives freed heap memory back to the operating system (glibc's
/// `malloc_trim`), after a large part of the broker's state was freed, so
/// that resident memory falls again. A no-op elsewhere.
pub fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}
