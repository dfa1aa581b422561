//! Counters and latency histograms over plain keys: a leaf module that
//! imports only [`crate::ids`] and [`crate::limits`]. Collecting and
//! reporting them is the router's job (src/router).

pub mod counters;
pub mod latency;
