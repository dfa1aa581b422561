//! Rust client libraries for the broker's protocols.

pub mod text;
