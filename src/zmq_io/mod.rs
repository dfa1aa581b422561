//! The only code that calls the zmq crate on the router side: the I/O
//! thread, the egress path with its wake-up, and socket set-up. Start-up,
//! shutdown and the admin thread are in [`crate::router`].

pub mod curve_binds;
pub mod egress;
pub mod frames;
pub mod io_thread;
pub mod sockets;
