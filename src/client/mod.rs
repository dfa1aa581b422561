//! Rust client and worker library for eMQP (and, from another branch, the
//! text protocol).

pub mod admin;
pub mod body;
pub mod emqp;
mod socket;
pub mod worker;
mod worker_loop;
