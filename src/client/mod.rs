//! Rust client libraries for the broker's protocols: eMQP client, admin
//! client and worker (EventMQ 0.3.13 wire), and the text-protocol client.

pub mod admin;
pub mod body;
pub mod emqp;
mod socket;
pub use socket::{connect_router, connect_router_curve, set_router_options};
pub mod text;
pub mod text_spread;
pub mod text_tls;
pub mod worker;
mod worker_loop;
mod worker_types;
