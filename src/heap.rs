//! Giving freed heap memory back to the OS.
//!
//! libzmq allocates per connection (pipes, encoder and decoder buffers)
//! with the C allocator. After many peers connect and leave, glibc keeps
//! the freed pages of its heaps, so a process's RSS climbs with connection
//! churn although the memory in use does not: emq-pubsub, 40 rounds of 500
//! subscribers connecting and leaving, grew from 18 to 61 MB of RSS while
//! its heap in use (valgrind massif) fell back to about 2 MB after every
//! round. `malloc_trim(0)` returns those free pages (53 → 25 MB after 20
//! such rounds); long-running processes call [`release_free_memory`] now
//! and then.

/// Returns the free pages of every glibc heap to the OS
/// (`malloc_trim(0)`); true when some memory was released. Costs time in
/// proportion to the heap's free chunks, so callers call it from an idle
/// moment or at most every [`crate::limits::HEAP_TRIM_EVERY`]. Does nothing
/// (false) where the C library is not glibc.
pub fn release_free_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim has no preconditions; it takes the
        // allocator's own locks.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}
