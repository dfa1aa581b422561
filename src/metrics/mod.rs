//! Counters and latency recording.

pub mod counters;
