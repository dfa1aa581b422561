//! Counters and latency recording.

pub mod counters;
pub mod latency;
pub mod reporter;
