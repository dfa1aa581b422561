//! The only code that calls the zmq crate on the router side: the I/O
//! thread, the egress path, the admin thread and router start/stop.

pub mod admin;
pub mod egress;
pub mod io_thread;
pub mod router;

pub use router::{start, start_with, Endpoints, RouterHandle, StartError};
